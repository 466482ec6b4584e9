"""Benchmark ``isocompute sample --engine vllm-http`` against raw requests to the same vLLM server.

Baseline (``raw``): the very requests ``sample`` sends — same chat-templated prompts, ``n``, seeds
(``derive_seed(seed, id)``), ``return_token_ids`` — posted with a bare ``httpx.AsyncClient`` under the
same concurrency, doing nothing with the answers. ``sample`` additionally checks readiness, loads the
tokenizer, grades every completion and writes the outcome table. Both arms produce the same completion
tokens (checked), so sample/raw is the ratio of wall times; the target is ≥ 0.9. Arms alternate (ABBA)
over ``--repeats`` rounds after a warm-up; printed: the median ratio, the pooled ratio (total raw time /
total sample time) and the spread. On a shared 2-core machine single rounds swing by 2×: trust the
median of many rounds, and the CPU seconds per arm (server process tree + client), which do not swing
with other people's load and show what ``sample`` itself adds.
Then the transformers engine's tokens/s for n = 1, 4, 16 (bench_engine.py's measurement).

    .venv/bin/python bench/bench_sample.py [--model DIR] [--upstream URL --server-pid PID] [--prompts 256] [--n 8]
        [--max-tokens 96] [--concurrency 64] [--repeats 6] [--skip-transformers]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from bench_engine import bench_transformers, process_tree_cpu, raw_httpx, tiny_model

from isocompute.engines.vllm_server import start_vllm_server
from isocompute.stages.sample import SampleConfig, derive_seed, make_formatter, sample_async
from isocompute.tasks.registry import load_task


def sample_bodies(cfg: SampleConfig, model: str, tokenizer) -> list[dict]:
    fmt = make_formatter(cfg.prompt_format, tokenizer)
    return [
        {"model": model, "prompt": fmt(p.prompt), "n": cfg.n, "max_tokens": cfg.max_tokens,
         "temperature": cfg.temperature, "seed": derive_seed(cfg.seed, p.id), "return_token_ids": True}
        for p in load_task(cfg.task, cfg.data, cfg.limit, cfg.data_seed)
    ]


async def bench(url: str, model_dir: Path, args: argparse.Namespace, workdir: Path,
                server_pid: int | None) -> None:
    from transformers import AutoTokenizer

    def cfg(i: int) -> SampleConfig:
        return SampleConfig(task="arith", out=workdir / f"outcomes-{i}.jsonl", engine="vllm-http",
                            upstreams=[url], limit=args.prompts, n=args.n, max_tokens=args.max_tokens,
                            temperature=1.0, seed=0, concurrency=args.concurrency, progress=False)

    bodies = sample_bodies(cfg(0), str(model_dir), AutoTokenizer.from_pretrained(model_dir))
    await raw_httpx(url, bodies, args.concurrency)  # warm-up: both arms then find a warm prefix cache
    print(f"sample --engine vllm-http vs raw httpx: {args.prompts} arith prompts × n={args.n}, "
          f"max_tokens={args.max_tokens}, concurrency={args.concurrency}, {url}")
    ratios: list[float] = []
    cpu_ratios: list[float] = []
    raw_total = sample_total = 0.0
    for r in range(args.repeats):
        # ABBA order: whichever arm runs second in a round cannot be systematically favoured
        if r % 2 == 0:
            c0, v0 = time.process_time(), process_tree_cpu(server_pid)
            raw_tok, raw_dt = await raw_httpx(url, bodies, args.concurrency)
            raw_cpu, raw_srv = time.process_time() - c0, process_tree_cpu(server_pid) - v0
        t0, c0, v0 = time.perf_counter(), time.process_time(), process_tree_cpu(server_pid)
        res = await sample_async(cfg(r + 1))
        s_dt, s_cpu = time.perf_counter() - t0, time.process_time() - c0
        s_srv = process_tree_cpu(server_pid) - v0
        if r % 2 == 1:
            c0, v0 = time.process_time(), process_tree_cpu(server_pid)
            raw_tok, raw_dt = await raw_httpx(url, bodies, args.concurrency)
            raw_cpu, raw_srv = time.process_time() - c0, process_tree_cpu(server_pid) - v0
        if res.completion_tokens != raw_tok:
            raise SystemExit(f"token totals differ (raw {raw_tok}, sample {res.completion_tokens}): "
                             "the two arms did not send the same requests")
        ratios.append(raw_dt / s_dt)
        if server_pid is not None:
            cpu_ratios.append((raw_srv + raw_cpu) / (s_srv + s_cpu))
        print(f"  round {r + 1}: raw {raw_tok / raw_dt:7.1f} tok/s ({raw_dt:5.1f} s; CPU server {raw_srv:5.1f} s "
              f"+ client {raw_cpu:4.2f} s), sample {res.completion_tokens / s_dt:7.1f} tok/s ({s_dt:5.1f} s; "
              f"CPU server {s_srv:5.1f} s + client {s_cpu:4.2f} s), sample/raw = {ratios[-1]:.3f}")
        raw_total += raw_dt
        sample_total += s_dt
    med = statistics.median(ratios)
    print(f"  median sample/raw = {med:.3f} (target >= 0.9: {'met' if med >= 0.9 else 'NOT met'}); "
          f"pooled over rounds = {raw_total / sample_total:.3f}; spread {min(ratios):.2f}..{max(ratios):.2f}")
    if cpu_ratios:
        print(f"  CPU-work ratio raw/sample (server + client CPU seconds; 1.0 = sample adds no work): median "
              f"{statistics.median(cpu_ratios):.3f}, spread {min(cpu_ratios):.2f}..{max(cpu_ratios):.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="model directory (default: a fresh random tiny model)")
    ap.add_argument("--upstream", help="a running vLLM server on --model (default: start one from .venv-vllm)")
    ap.add_argument("--server-pid", type=int, help="PID of the --upstream server, to count its CPU seconds")
    # 256 prompts: sample's one-off setup (tokenizer load, readiness probe, task generation, ~0.3 s) is
    # then a few percent of a run, as in real runs of thousands of prompts; at 64 it was ~8%.
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--threads", type=int, default=None, help="torch threads for the transformers engine")
    ap.add_argument("--skip-transformers", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        model_dir = tiny_model(args.model, workdir)
        server = None if args.upstream else start_vllm_server(model_dir, log=workdir / "vllm.log")
        try:
            if server is not None:
                asyncio.run(server.wait_ready(timeout=600))
            pid = server.pid if server is not None else args.server_pid
            asyncio.run(bench(args.upstream or server.url, model_dir, args, workdir, pid))
        finally:
            if server is not None:
                server.stop()
        if not args.skip_transformers:
            bench_transformers(model_dir, 16, args.max_tokens, args.threads)


if __name__ == "__main__":
    main()
