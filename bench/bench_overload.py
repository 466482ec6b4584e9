"""Overload: a burst of clients against ``isocompute serve`` on the in-process tiny engine, with admission control
(``max_inflight``, ``queue_timeout_s``) and without it (the baseline: both set so high that nothing is shed), in
the same run (issue 35, finding 3).

Every client sends one completion at budget 4 and gives up after ``--client-timeout`` seconds. Reported per gateway:
status codes, client timeouts, p50/p99 latency of the answered (200) requests and of the shed (503) ones, and the
worst ``/health`` latency seen while the burst ran (polled every 0.25 s); then the ratios admission / baseline.

    .venv/bin/python bench/bench_overload.py [--clients 100] [--max-inflight 8] [--queue-timeout 5]
                                             [--client-timeout 60] [--max-tokens 64]

Loopback only; each gateway is stopped after its burst. Timings on a shared machine are noisy: compare within a run.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gateway import small_policy, start_gateway, stop, tiny_model, wait_ready  # noqa: E402

from isocompute.engines.vllm_server import free_port  # noqa: E402


async def burst(url: str, clients: int, timeout: float, max_tokens: int) -> dict[str, object]:
    out: list[tuple[str, float]] = []
    health: list[float] = []
    done = asyncio.Event()

    async def one(c: httpx.AsyncClient, i: int) -> None:
        t0 = time.perf_counter()
        try:
            r = await c.post(f"{url}/v1/completions", timeout=timeout, json={
                "model": "isocompute", "prompt": f"What is {i} + {i % 7}?", "budget": 4, "max_tokens": max_tokens})
            out.append((str(r.status_code), time.perf_counter() - t0))
        except httpx.TimeoutException:
            out.append(("timeout", time.perf_counter() - t0))

    async def watch(c: httpx.AsyncClient) -> None:
        while not done.is_set():
            t0 = time.perf_counter()
            try:
                await c.get(f"{url}/health", timeout=30)
            except httpx.TransportError:
                pass
            health.append(time.perf_counter() - t0)
            await asyncio.sleep(0.25)

    limits = httpx.Limits(max_connections=clients + 10, max_keepalive_connections=clients + 10)
    async with httpx.AsyncClient(limits=limits) as c, httpx.AsyncClient() as h:
        watcher = asyncio.create_task(watch(h))
        await asyncio.gather(*(one(c, i) for i in range(clients)))
        done.set()
        await watcher
    codes = Counter(s for s, _ in out)

    def pct(status: str, q: float) -> float:
        xs = [t for s, t in out if s == status]
        return float(np.percentile(xs, q)) if xs else float("nan")

    return {"codes": dict(codes), "ok_p50": pct("200", 50), "ok_p99": pct("200", 99), "shed_p99": pct("503", 99),
            "health_max": max(health or [float("nan")])}


def run_one(name: str, policy: Path, model: Path, env: dict[str, str], args: argparse.Namespace,
            tmp: Path) -> dict[str, object]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp / f"{name}.log"
    proc = start_gateway(policy, port, log, model=model, env=env)
    try:
        wait_ready(url, proc, log)
        res = asyncio.run(burst(url, args.clients, args.client_timeout, args.max_tokens))
    finally:
        stop(proc)
    print(f"{name:>10}: codes {res['codes']}  200 p50 {res['ok_p50']:.2f} s p99 {res['ok_p99']:.2f} s  "
          f"503 p99 {res['shed_p99']:.2f} s  /health worst {res['health_max']:.3f} s", flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--max-inflight", type=int, default=8)
    ap.add_argument("--queue-timeout", type=float, default=5.0)
    ap.add_argument("--client-timeout", type=float, default=60.0)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        model, policy = tiny_model(tmp), small_policy(tmp)
        base = run_one("baseline", policy, model, {"ISOCOMPUTE_MAX_INFLIGHT": "100000",
                                                   "ISOCOMPUTE_QUEUE_TIMEOUT_S": "100000"}, args, tmp)
        adm = run_one("admission", policy, model, {"ISOCOMPUTE_MAX_INFLIGHT": str(args.max_inflight),
                                                   "ISOCOMPUTE_QUEUE_TIMEOUT_S": str(args.queue_timeout)}, args, tmp)
    for key in ("ok_p99", "health_max"):
        print(f"{key}: admission / baseline = {adm[key] / base[key]:.2f}")  # type: ignore[operator]
    print(f"client timeouts: baseline {base['codes'].get('timeout', 0)}, "  # type: ignore[union-attr]
          f"admission {adm['codes'].get('timeout', 0)}")  # type: ignore[union-attr]


if __name__ == "__main__":
    main()
