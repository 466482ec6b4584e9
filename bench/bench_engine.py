"""Benchmark the generation engines on the tiny model (completion tokens per second).

1. transformers engine, in process: n = 1, 4, 16 samples for each of ``--prompts`` prompts (rows =
   prompts × n go through ``model.generate`` in micro-batches of 64). Baseline in the same run: n = 1,
   so the n = 4 / 16 lines print how much batching the n samples buys per token.
2. vllm-http engine vs the same requests sent straight to vLLM with raw httpx at the same concurrency
   (named baseline ``raw``): prints both throughputs and engine/raw (1.0 = no overhead). Needs a vLLM
   server: ``--upstream URL``, or without it one is started from .venv-vllm (``make vllm-env``).

Request bodies are identical in both arms (same prompts, seeds, ``return_token_ids``), so the completion
token totals must agree — checked. Arms alternate over ``--repeats`` rounds after a warm-up; the median
ratio is printed.

    .venv/bin/python bench/bench_engine.py [--model DIR] [--prompts 16] [--max-tokens 64] [--threads 1]
        [--skip-vllm] [--upstream URL] [--http-prompts 64] [--http-n 8] [--concurrency 32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from isocompute.engines.transformers_engine import TransformersEngine
from isocompute.engines.vllm_http import VLLMHTTPEngine
from isocompute.engines.vllm_server import start_vllm_server
from isocompute.tasks.arith import generate as arith_problems


def process_tree_cpu(pid: int | None) -> float:
    """CPU seconds (user + system) used so far by ``pid`` and its descendants (0.0 when unknown).

    Wall time on a shared machine swings with other people's load; the CPU a server spends on the same
    requests does not, so it is the steadier measure of how much work each arm made it do."""
    if pid is None:
        return 0.0
    tick = os.sysconf("SC_CLK_TCK")
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, IndexError, ValueError):
            continue
    return total


def tiny_model(model: str | None, workdir: Path) -> Path:
    if model:
        return Path(model)
    from isocompute.training.tiny import save_tiny

    return save_tiny(workdir / "tiny", seed=0)


def prompts_for(k: int) -> list[str]:
    return [p.prompt + "\n" for p in arith_problems(k, seed=0)]


def bench_transformers(model_dir: Path, n_prompts: int, max_tokens: int, threads: int | None) -> None:
    import torch

    eng = TransformersEngine(model_dir, threads=threads)
    prompts = prompts_for(n_prompts)
    eng.generate_sync(prompts[:2], 2, 8, 1.0, seed=0)  # warm-up
    print(f"transformers engine, tiny model, {n_prompts} prompts, max_tokens={max_tokens}, "
          f"torch threads={threads or torch.get_num_threads()}")
    base = None
    for n in (1, 4, 16):
        t0 = time.perf_counter()
        out = eng.generate_sync(prompts, n, max_tokens, 1.0, seed=0)
        dt = time.perf_counter() - t0
        tokens = sum(c.completion_tokens for o in out for c in o)
        rate = tokens / dt
        base = base or rate
        print(f"  n={n:>2}: {tokens:>6} completion tokens in {dt:6.2f} s = {rate:8.1f} tok/s "
              f"({rate / base:.2f}x n=1)")


def request_bodies(model: str, prompts: list[str], n: int, max_tokens: int, seed: int) -> list[dict]:
    """Exactly what VLLMHTTPEngine.generate(prompts, n, max_tokens, 1.0, seed) sends."""
    return [
        {"model": model, "prompt": p, "n": n, "max_tokens": max_tokens, "temperature": 1.0,
         "seed": seed + i * n, "return_token_ids": True}
        for i, p in enumerate(prompts)
    ]


async def raw_httpx(url: str, bodies: list[dict], concurrency: int) -> tuple[int, float]:
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency + 2, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=5.0), limits=limits) as client:

        async def one(body: dict) -> int:
            async with sem:
                r = await client.post(f"{url}/v1/completions", json=body)
                r.raise_for_status()
                return int(r.json()["usage"]["completion_tokens"])

        t0 = time.perf_counter()
        tokens = sum(await asyncio.gather(*(one(b) for b in bodies)))
        return tokens, time.perf_counter() - t0


async def via_engine(url: str, prompts: list[str], n: int, max_tokens: int, seed: int,
                     concurrency: int) -> tuple[int, float]:
    eng = VLLMHTTPEngine([url], max_concurrency=concurrency)
    try:
        await eng.wait_ready(timeout=60)
        t0 = time.perf_counter()
        out = await eng.generate(prompts, n, max_tokens, 1.0, seed=seed)
        dt = time.perf_counter() - t0
        return sum(c.completion_tokens for o in out for c in o), dt
    finally:
        await eng.aclose()


async def bench_http(url: str, n_prompts: int, n: int, max_tokens: int, concurrency: int, repeats: int) -> None:
    async with httpx.AsyncClient(timeout=30) as c:
        model = (await c.get(f"{url}/v1/models")).json()["data"][0]["id"]
    prompts = prompts_for(n_prompts)
    bodies = request_bodies(model, prompts, n, max_tokens, seed=0)
    await raw_httpx(url, bodies[:concurrency], concurrency)  # warm-up (and prefix cache) for both arms
    print(f"vllm-http engine vs raw httpx: {n_prompts} prompts × n={n}, max_tokens={max_tokens}, "
          f"concurrency={concurrency}, {url}")
    ratios = []
    for r in range(repeats):
        raw_tok, raw_dt = await raw_httpx(url, bodies, concurrency)
        eng_tok, eng_dt = await via_engine(url, prompts, n, max_tokens, 0, concurrency)
        if raw_tok != eng_tok:
            raise SystemExit(f"token totals differ (raw {raw_tok}, engine {eng_tok}): requests not identical")
        ratios.append((eng_tok / eng_dt) / (raw_tok / raw_dt))
        print(f"  round {r + 1}: raw {raw_tok / raw_dt:8.1f} tok/s, engine {eng_tok / eng_dt:8.1f} tok/s, "
              f"engine/raw = {ratios[-1]:.3f}")
    print(f"  median engine/raw = {statistics.median(ratios):.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="model directory (default: a fresh random tiny model)")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None, help="torch threads for the transformers engine")
    ap.add_argument("--skip-transformers", action="store_true")
    ap.add_argument("--skip-vllm", action="store_true")
    ap.add_argument("--upstream", help="a running vLLM server (default: start one from .venv-vllm)")
    ap.add_argument("--http-prompts", type=int, default=64)
    ap.add_argument("--http-n", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = tiny_model(args.model, Path(tmp))
        if not args.skip_transformers:
            bench_transformers(model_dir, args.prompts, args.max_tokens, args.threads)
        if args.skip_vllm:
            return
        server = None if args.upstream else start_vllm_server(model_dir, log=Path(tmp) / "vllm.log")
        try:
            if server is not None:
                asyncio.run(server.wait_ready(timeout=600))
            url = args.upstream or server.url
            asyncio.run(bench_http(url, args.http_prompts, args.http_n, args.max_tokens, args.concurrency,
                                   args.repeats))
        finally:
            if server is not None:
                server.stop()


if __name__ == "__main__":
    main()
