"""The gateway at GPU scale over replay upstreams: requests/s, gateway CPU per request and per streamed token,
the latency it adds, event-loop lag and memory per request in flight, at several concurrencies.

Set-up: ``--upstreams`` ``isocompute replay`` servers (a SIMULATOR: recorded lengths and answers, a modelled
clock) on one outcome table, each with ``--max-tps`` aggregate tokens/s (GPU-like: 5,000), ``--decode-tps``
per sequence and ``--max-seqs`` in flight; one ``isocompute serve --action m/PLAN`` in front (default
``lead:m=2@8s``: an 8-sample parallel-stop wave stopped when one answer leads by 2); an aiohttp client keeping
C requests in flight for ``--seconds`` after ``--warmup`` seconds, at each C of ``--concurrency``.

Measured over each window (after a warm-up of ``max(--warmup, C × --warmup-per-request)`` s): requests finished
in it per second; the gateway process's CPU seconds (user + system, /proc) per request and per streamed token
(tokens: the replays' ``vllm:generation_tokens_total`` over the window — what they streamed to the gateway;
chunks: tokens / ``--stream-interval``); added latency per request = the client's
wall time − the gateway's own measure of its waves' upstream time (``latency_s``), p50/p99; event-loop lag =
the time ``GET /health`` takes (a probe every 50 ms), p50/p99; memory per request in flight = (gateway RSS
under load − idle RSS) / C; non-200 answers. The named baseline in the same run: the same client sending the
same waves straight to one replay (n = 8 streamed to the end, no gateway) — its CPU is not the gateway's, so it
prices the client and replays, and its requests/s is the ceiling this machine reaches without a gateway.

    python bench/bench_gateway_scale.py /work/tables/gsm8k_tok.jsonl --concurrency 64,256,1024 --seconds 20

Ignores: TLS, auth, policies with features (a fixed action decides in microseconds), several gateway processes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import aiohttp
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from bench_gateway import stop, wait_ready  # noqa: E402

from isocompute.engines.vllm_server import free_port  # noqa: E402
from isocompute.replay.process import start_replay  # noqa: E402


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def health_lag(session: aiohttp.ClientSession, url: str, stop_at: float, out: list[float]) -> None:
    while time.monotonic() < stop_at:
        t0 = time.perf_counter()
        try:
            async with session.get(f"{url}/health") as r:
                await r.read()
            out.append(time.perf_counter() - t0)
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.05)


async def drive(url: str, prompts: list[str], concurrency: int, warmup: float, seconds: float, *,
                direct_model: str | None = None, n: int = 8) -> dict:
    """C workers, each sending one request after another; records those sent after the warm-up and finished
    before the window's end."""
    t_start = time.monotonic()
    t_begin, t_end = t_start + warmup, t_start + warmup + seconds
    recs: list[dict] = []
    lag: list[float] = []
    conn = aiohttp.TCPConnector(limit=concurrency + 8)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as s:
        async def worker(w: int) -> None:
            rng = random.Random(w)
            while time.monotonic() < t_end:
                p = rng.choice(prompts)
                t0 = time.monotonic()
                if direct_model is None:
                    body = {"model": "isocompute", "prompt": p, "seed": rng.randrange(1 << 30), "temperature": 1.0}
                    async with s.post(f"{url}/v1/completions", json=body) as r:
                        status, data = r.status, (await r.json() if r.status == 200 else await r.text())
                else:  # the baseline: the wave straight to the replay, streamed to the end
                    body = {"model": direct_model, "prompt": p, "n": n, "stream": True, "return_token_ids": True,
                            "max_tokens": 131072, "seed": rng.randrange(1 << 30),
                            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
                    async with s.post(f"{url}/v1/completions", json=body) as r:
                        status = r.status
                        async for _ in r.content:
                            pass
                        data = None
                t1 = time.monotonic()
                if t_begin <= t1 <= t_end:  # finished inside the window
                    rec = {"status": status, "wall": t1 - t0}
                    if direct_model is None and status == 200:
                        rec["tokens"] = data["usage"]["completion_tokens"]
                        rec["upstream_s"] = data["isocompute"].get("latency_s") or 0.0
                    recs.append(rec)
        lag_task = asyncio.ensure_future(health_lag(s, url, t_end, lag))
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        await lag_task
    return {"records": recs, "lag": lag, "window": (t_begin, t_end)}


def pct(xs: list[float], q: float) -> float | None:
    return float(np.percentile(xs, q)) if xs else None


def generated(replays: list[str]) -> float:
    """The replays' ``vllm:generation_tokens_total``, summed: the tokens streamed to the gateway."""
    total = 0.0
    for url in replays:
        for line in urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode().splitlines():
            if line.startswith("vllm:generation_tokens_total"):
                total += float(line.rsplit(" ", 1)[1])
    return total


def run_level(gw_url: str, gw_pid: int, prompts: list[str], c: int, replays: list[str],
              args: argparse.Namespace) -> dict:
    idle = rss_mb(gw_pid)
    cpu = {}
    peak = [idle]
    warmup = max(args.warmup, c * args.warmup_per_request)

    async def go() -> dict:
        async def sample_cpu() -> None:
            await asyncio.sleep(warmup)
            cpu["t0"], cpu["c0"], cpu["g0"] = time.monotonic(), cpu_seconds(gw_pid), generated(replays)
            while time.monotonic() < cpu["t0"] + args.seconds:
                await asyncio.sleep(0.5)
                peak.append(rss_mb(gw_pid))
            cpu["t1"], cpu["c1"], cpu["g1"] = time.monotonic(), cpu_seconds(gw_pid), generated(replays)
        out, _ = await asyncio.gather(drive(gw_url, prompts, c, warmup, args.seconds), sample_cpu())
        return out
    out = asyncio.run(go())
    recs = out["records"]
    ok = [r for r in recs if r["status"] == 200]
    tokens = cpu["g1"] - cpu["g0"]  # streamed in the window (decoded upstream; a stop's last step may be unread)
    gcpu = cpu["c1"] - cpu["c0"]
    added = [r["wall"] - r["upstream_s"] for r in ok]
    return {"concurrency": c, "requests": len(recs), "errors": len(recs) - len(ok),
            "statuses": sorted({r["status"] for r in recs}), "req_per_s": len(ok) / args.seconds,
            "tokens_per_s": tokens / args.seconds, "gateway_cpu_share": gcpu / (cpu["t1"] - cpu["t0"]),
            "cpu_ms_per_request": 1e3 * gcpu / max(len(ok), 1), "cpu_us_per_token": 1e6 * gcpu / max(tokens, 1),
            "cpu_us_per_chunk": 1e6 * gcpu / max(tokens / args.stream_interval, 1),
            "added_ms_p50": 1e3 * (pct(added, 50) or 0), "added_ms_p99": 1e3 * (pct(added, 99) or 0),
            "wall_s_p50": pct([r["wall"] for r in ok], 50), "lag_ms_p50": 1e3 * (pct(out["lag"], 50) or 0),
            "lag_ms_p99": 1e3 * (pct(out["lag"], 99) or 0), "rss_idle_mb": idle, "rss_peak_mb": max(peak),
            "kb_per_request_in_flight": 1024 * (max(peak) - idle) / c}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("table", type=Path)
    ap.add_argument("--out", type=Path, default=Path("/tmp/gwscale"))
    ap.add_argument("--concurrency", default="64,256,1024")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--warmup-per-request", type=float, default=0.04,
                    help="warm-up seconds per request in flight (the longest of the two): a level reaches its "
                         "steady state before its window")
    ap.add_argument("--upstreams", type=int, default=4)
    ap.add_argument("--max-tps", type=float, default=5000.0)
    ap.add_argument("--decode-tps", type=float, default=100.0)
    ap.add_argument("--max-seqs", type=int, default=256)
    ap.add_argument("--stream-interval", type=int, default=1)
    ap.add_argument("--plan", default="lead:m=2@8s")
    ap.add_argument("--upstream-max-concurrency", type=int, default=256,
                    help="the gateway's upstream_max_concurrency (waves in flight to the pool; its default is 64)")
    ap.add_argument("--baseline", action="store_true", help="also drive one replay directly (the baseline)")
    ap.add_argument("--profile", action="store_true", help="run the gateway under pyinstrument (report in --out)")
    ap.add_argument("--py-spy", action="store_true", help="sample the gateway with py-spy during the first level "
                                                          "(a flame graph and top functions in --out; pip install py-spy)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    prompts = [json.loads(x)["prompt"] for x in args.table.read_text().splitlines() if x.strip()]
    timing = {"max_tps": args.max_tps, "decode_tps": args.decode_tps, "max_seqs": args.max_seqs,
              "stream_interval": args.stream_interval, "model": "m"}
    reps = [start_replay([args.table], free_port(), log=args.out / f"replay{i}.log", **timing)
            for i in range(args.upstreams)]
    port = free_port()
    env = {"ISOCOMPUTE_DEFAULT_MAX_TOKENS": "131072", "ISOCOMPUTE_MAX_TOKENS_LIMIT": "131072",
           "ISOCOMPUTE_UPSTREAM_TIMEOUT_S": "600", "ISOCOMPUTE_MAX_PROMPT_CHARS": "200000",
           "ISOCOMPUTE_UPSTREAM_MAX_CONCURRENCY": str(args.upstream_max_concurrency)}
    log = args.out / "gateway.log"
    cmd = [sys.executable, "-m", "isocompute", "serve", "--port", str(port), "--log-level", "warning",
           "--action", f"m/{args.plan}", *[f"--upstream=m={r.url}" for r in reps]]
    if args.profile:  # pyinstrument writes its report when the gateway exits (SIGTERM: drain, then exit 0)
        cmd[1:3] = ["-m", "pyinstrument", "-r", "text", "-o", str(args.out / "profile.txt"), "-m", "isocompute"]
    with open(log, "ab") as fh:
        gw = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              env={**os.environ, **env}, cwd=REPO, start_new_session=True)
    results = []
    try:
        wait_ready(f"http://127.0.0.1:{port}", gw, log)
        for c in map(int, args.concurrency.split(",")):
            spy = None
            if args.py_spy:
                spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(gw.pid),
                                        "--format", "raw", "-o", str(args.out / f"pyspy-{c}.txt"), "--duration",
                                        str(int(args.warmup + args.seconds)), "--rate", "200"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            res = run_level(f"http://127.0.0.1:{port}", gw.pid, prompts, c, [r.url for r in reps], args)
            if spy is not None:
                spy.wait(60)
            results.append(res)
            print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in res.items()}), flush=True)
        if args.baseline:
            for c in map(int, args.concurrency.split(",")):
                out = asyncio.run(drive(reps[0].url, prompts, c, args.warmup, args.seconds, direct_model="m"))
                ok = [r for r in out["records"] if r["status"] == 200]
                base = {"baseline_direct_one_replay": c, "req_per_s": len(ok) / args.seconds,
                        "wall_s_p50": pct([r["wall"] for r in ok], 50), "errors": len(out["records"]) - len(ok)}
                results.append(base)
                print(json.dumps(base), flush=True)
    finally:
        stop(gw)
        for r in reps:
            r.stop()
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
