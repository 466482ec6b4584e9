"""Load test: 200 concurrent clients send 2,000 requests to the gateway on the in-process tiny engine.

The gateway runs as ``isocompute serve --engine transformers`` in its own process (so its memory is
measured alone). Every client loops over requests until the shared total is reached; requests mix
chat and completion calls over synthetic arithmetic prompts at budget 4. Reported: status codes (the
target is zero 5xx), p50/p99/max latency, throughput, and the gateway's RSS sampled after every 10 % of
the requests — "flat" means the RSS after the warm-up tenth and at the end differ by < 10 %.

Baseline, in the same run: the same number of single requests sent one at a time (concurrency 1) on a
short prefix, so the p99 under load can be read against the unloaded latency.

    .venv/bin/python bench/load_gateway.py [--clients 200] [--requests 2000] [--max-tokens 8]
                                           [--policy DIR] [--model DIR] [--check]

Loopback only; bounded loops (every client stops at the shared request count).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gateway import small_policy, start_gateway, stop, tiny_model, wait_ready  # noqa: E402


def rss_mib(pid: int) -> float:
    """Resident set of ``pid`` and its children's threads (Linux /proc), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def bodies(n: int, max_tokens: int) -> list[tuple[str, dict]]:
    from isocompute.policy.synthetic import synthetic_records

    out = []
    for i, r in enumerate(synthetic_records(n, 1, seed=11)):
        if i % 2:
            out.append(("/v1/chat/completions", {"model": "isocompute", "max_tokens": max_tokens, "budget": 4,
                                                  "messages": [{"role": "user", "content": r["prompt"]}]}))
        else:
            out.append(("/v1/completions", {"model": "isocompute", "prompt": r["prompt"] + "\n",
                                            "max_tokens": max_tokens, "budget": 4}))
    return out


async def run_load(url: str, work: list[tuple[str, dict]], clients: int, pid: int
                   ) -> tuple[float, list[float], Counter, list[tuple[int, float]]]:
    queue = list(reversed(work))
    lat: list[float] = []
    codes: Counter = Counter()
    rss: list[tuple[int, float]] = [(0, rss_mib(pid))]
    step = max(len(work) // 10, 1)
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:

        async def worker() -> None:
            while queue:
                path, body = queue.pop()
                t0 = time.perf_counter()
                try:
                    r = await client.post(path, json=body)
                    codes[r.status_code] += 1
                except httpx.HTTPError as e:
                    codes[type(e).__name__] += 1
                lat.append(time.perf_counter() - t0)
                if len(lat) % step == 0:
                    rss.append((len(lat), rss_mib(pid)))

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        return time.perf_counter() - t0, lat, codes, rss


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--baseline", type=int, default=40, help="requests at concurrency 1 before the load")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--max-samples", type=int, default=8, help="server-wide cap on k")
    ap.add_argument("--policy", type=Path)
    ap.add_argument("--model", type=Path)
    ap.add_argument("--check", action="store_true", help="exit 1 on any 5xx or RSS growth ≥ 10 %")
    args = ap.parse_args()

    from isocompute.engines.vllm_server import free_port

    work_dir = Path(tempfile.mkdtemp(prefix="load-gateway-"))
    model = args.model or tiny_model(work_dir)
    policy = args.policy or small_policy(work_dir)
    port = free_port()
    log = work_dir / "gateway.log"
    gw = start_gateway(policy, port, log, model=model,
                       env={"ISOCOMPUTE_MAX_SAMPLES": str(args.max_samples), "ISOCOMPUTE_UPSTREAM_TIMEOUT_S": "600"})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, gw, log)
        work = bodies(args.requests + args.baseline, args.max_tokens)
        _, base_lat, base_codes, _ = asyncio.run(run_load(url, work[: args.baseline], 1, gw.pid))
        wall, lat, codes, rss = asyncio.run(run_load(url, work[args.baseline:], args.clients, gw.pid))
    finally:
        stop(gw)

    five = sum(v for k, v in codes.items() if not isinstance(k, int) or k >= 500)
    ms = np.asarray(lat) * 1e3
    print(f"{args.requests} requests, {args.clients} concurrent clients, max_tokens {args.max_tokens}, "
          f"k ≤ {args.max_samples}, in-process tiny engine (load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs)")
    print(f"status codes: {dict(codes)}   5xx/transport errors: {five}")
    print(f"latency under load: p50 {np.percentile(ms, 50):.0f} ms, p99 {np.percentile(ms, 99):.0f} ms, "
          f"max {ms.max():.0f} ms; throughput {len(lat) / wall:.1f} req/s over {wall:.1f} s")
    b = np.asarray(base_lat) * 1e3
    print(f"baseline (concurrency 1, {len(b)} requests, codes {dict(base_codes)}): p50 {np.percentile(b, 50):.0f} ms, "
          f"p99 {np.percentile(b, 99):.0f} ms")
    print("gateway RSS (MiB) by requests done: " + ", ".join(f"{n}:{m:.0f}" for n, m in rss))
    warm = rss[1][1] if len(rss) > 1 else rss[0][1]
    growth = rss[-1][1] / warm - 1
    print(f"RSS growth after the warm-up tenth: {growth:+.1%}  (flat: < 10 %)")
    ok = five == 0 and growth < 0.10
    print("targets:", "met" if ok else "MISSED")
    return 0 if ok or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
