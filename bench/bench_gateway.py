"""Gateway overhead against a direct vLLM call (k = 1), and the policy's decision latency.

Baseline, in the same run: the same greedy completion requests (temperature 0, so both paths generate
exactly the same tokens) sent straight to the vLLM server, alternating direct and gateway phases so
drift in the machine's load hits both alike. The gateway runs as ``isocompute serve --upstream`` in its
own process, with ``max_samples: 1`` so every request is one sample (k = 1).

Targets: throughput through the gateway ≥ 0.95 × direct at concurrency 16 and the gateway process's CPU
per request ≤ 2 ms there (issue 21; its CPU read from ``/proc`` over the measured phases), p50 added
latency ≤ 3 ms at concurrency 1, ``Policy.decide`` for one prompt ≤ 1 ms at p99 (issue 5).

Also in-process, with an instant upstream: the gateway's CPU per request (k = 1, above ``GET /health``)
and per wave of a plan — the same request with the policy's plan replaced by ``none@1x4`` (four waves
of one sample, no rule: the gateway's work between waves — the vote over answer classes and the rule —
three more times), ``(CPU(4 waves) − CPU(1 wave)) / 3``.

    .venv/bin/python bench/bench_gateway.py [--requests 960] [--rounds 6] [--concurrency 16] [--max-tokens 16]
                                            [--policy DIR] [--model DIR] [--check]

Without ``--model`` the tiny model is saved with random weights; without ``--policy`` a small policy is
fitted on synthetic arithmetic outcomes. Needs the vLLM environment (``make vllm-env``). Loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
PROMPTS = [f"What is {a} + {b}?\n" for a, b in zip(range(10, 90, 7), range(3, 300, 23), strict=False)]


def tiny_model(out: Path) -> Path:
    from isocompute.training.tiny import save_tiny

    return save_tiny(out / "tiny", seed=0)


def small_policy(out: Path) -> Path:
    from isocompute.policy.policy import Policy
    from isocompute.policy.synthetic import synthetic_records
    from isocompute.solver.outcomes import from_records

    table = from_records(synthetic_records(500, 16, seed=0))
    return Policy(learner="utility", n_rounds=40, n_components=8).fit(table).save(out / "policy")


def decision_latency(policy_dir: Path, n: int = 2000) -> dict[str, float]:
    """p50/p99 ms of ``Policy.decide`` on one prompt at a time, after 100 warm-up calls: wall time, and the
    thread's CPU time (what the decision itself costs, without preemption by other processes)."""
    from isocompute.policy.policy import Policy
    from isocompute.policy.synthetic import synthetic_records

    policy = Policy.load(policy_dir)
    prompts = [r["prompt"] for r in synthetic_records(n, 1, seed=3)]
    for p in prompts[:100]:
        policy.decide([p], 4.0)
    wall, cpu = [], []
    for p in prompts:
        t0, c0 = time.perf_counter(), time.thread_time()
        policy.decide([p], 4.0)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    pct = {f"{name}_p{q}": float(np.percentile(v, q) * 1e3) for name, v in (("wall", wall), ("cpu", cpu))
           for q in (50, 99)}
    return pct


class InstantEngine:
    """An upstream that answers at once (one fixed sample per prompt): isolates the gateway's own work."""

    name = "instant"

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    async def generate(self, prompts, n, max_tokens, temperature, seed=None):
        from isocompute.engines.base import Completion

        return [[Completion("The answer is 42.", 12, 6) for _ in range(n)] for _ in prompts]

    async def aclose(self):
        pass


class FourWaves:
    """The fitted policy, its every decision's plan replaced by ``none@1x4`` (four waves of one sample)."""

    def __init__(self, policy):
        from isocompute.app.serving_policy import as_serving_policy

        self.inner = as_serving_policy(policy)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def decide(self, texts, budget, *, probe=None):
        import dataclasses

        from isocompute.solver.plans.plan import parse_plan

        d = self.inner.decide(texts, budget, probe=probe)
        return dataclasses.replace(d, plans=(parse_plan("none@1x4"),) * len(texts), k=np.full(len(texts), 4))


def inprocess_overhead(policy_dir: Path, n: int = 400, *, waves: bool = False) -> dict[str, float]:
    """Per-request wall and CPU ms of POST /v1/completions (k = 1) through the whole ASGI app with an
    instant upstream, minus the same for GET /health (client, transport and middleware: the floor);
    with ``waves`` also a request whose plan is ``none@1x4`` (``plan4_*``)."""
    from isocompute.app.main import create_app
    from isocompute.app.settings import Settings
    from isocompute.policy.policy import Policy
    from isocompute.training.tiny import build_tokenizer

    policy = Policy.load(policy_dir)
    app = create_app(Settings(), policy=policy, engine=InstantEngine(build_tokenizer()))
    body = {"model": "isocompute", "prompt": PROMPTS[0], "max_tokens": 16, "budget": 2.0, "max_samples": 1}
    wave_app = (create_app(Settings(), policy=FourWaves(policy), engine=InstantEngine(build_tokenizer()))
                if waves else None)

    async def go() -> dict[str, float]:
        async with contextlib.AsyncExitStack() as stack:
            clients = {}
            for name, a in (("gw", app), ("waves", wave_app)):
                if a is not None:
                    await stack.enter_async_context(a.router.lifespan_context(a))
                    clients[name] = await stack.enter_async_context(
                        httpx.AsyncClient(transport=httpx.ASGITransport(app=a), base_url="http://gw"))
            calls = [("health", lambda: clients["gw"].get("/health")),
                     ("completion", lambda: clients["gw"].post("/v1/completions", json=body))]
            if waves:  # max_samples 4 lets the four waves of one through the cap
                calls.append(("plan4", lambda: clients["waves"].post("/v1/completions",
                                                                     json={**body, "max_samples": 4})))
            out = {}
            for name, call in calls:
                for _ in range(50):
                    await call()
                walls, cpu0 = [], time.process_time()
                for _ in range(n):
                    t0 = time.perf_counter()
                    r = await call()
                    walls.append(time.perf_counter() - t0)
                    assert r.status_code == 200, r.text
                out[f"{name}_cpu"] = (time.process_time() - cpu0) / n * 1e3
                out[f"{name}_p50"] = float(np.percentile(walls, 50) * 1e3)
            return out

    return asyncio.run(go())


def start_gateway(policy: Path | None, port: int, log: Path, *, upstream: str | list[str] | None = None,
                  model: Path | None = None, env: dict[str, str] | None = None,
                  action: str | None = None) -> subprocess.Popen:
    """``isocompute serve`` on ``policy``, or with ``action`` one fixed plan ``m/PLAN`` on the pool ``m`` at
    ``upstream`` (the chat template and FLOPs of ``model``)."""
    cmd = [sys.executable, "-m", "isocompute", "serve", "--port", str(port), "--log-level", "warning"]
    if action is not None:
        cmd += ["--upstream", f"m={upstream}", "--model", f"m={model}", "--action", action]
        upstream = model = None
    else:
        cmd += ["--policy", str(policy)]
    if upstream:
        for u in [upstream] if isinstance(upstream, str) else upstream:
            cmd += ["--upstream", u]
    elif action is None:
        cmd += ["--engine", "transformers"]
    if model:
        cmd += ["--model", str(model)]
    with open(log, "ab") as fh:
        return subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, **(env or {})}, cwd=REPO, start_new_session=True)


def wait_ready(url: str, proc: subprocess.Popen, log: Path, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"gateway exited with {proc.returncode}; log {log}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/ready", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"gateway at {url} not ready after {timeout:.0f} s; log {log}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        import signal

        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def process_cpu_split(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds the process ``pid`` has used so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / os.sysconf("SC_CLK_TCK"), int(fields[12]) / os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) the process ``pid`` has used so far (Linux ``/proc``)."""
    return sum(process_cpu_split(pid))


def gateway_times(url: str) -> tuple[float, float, float]:
    """(requests, Σ request seconds, Σ upstream seconds) of /v1/completions from the gateway's /metrics."""
    count = total = upstream = 0.0
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith('isocompute_request_latency_seconds_count{route="/v1/completions"}'):
            count = float(line.split()[-1])
        elif line.startswith('isocompute_request_latency_seconds_sum{route="/v1/completions"}'):
            total = float(line.split()[-1])
        elif line.startswith("isocompute_upstream_latency_seconds_sum"):  # one line per pool: summed
            upstream += float(line.split()[-1])
    return count, total, upstream


async def phase(url: str, bodies: list[dict], concurrency: int) -> tuple[float, list[float], list[int]]:
    """Send ``bodies`` to ``url`` with ``concurrency`` workers; (wall s, latencies s, status codes)."""
    lat: list[float] = []
    codes: list[int] = []
    queue = list(reversed(bodies))
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:

        async def worker() -> None:
            while queue:
                body = queue.pop()
                t0 = time.perf_counter()
                r = await client.post(url, json=body)
                lat.append(time.perf_counter() - t0)
                codes.append(r.status_code)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - t0, lat, codes


async def compare(direct_url: str, gateway_url: str, model_name: str, args: argparse.Namespace) -> dict:
    per_phase = args.requests // (2 * args.rounds)
    direct_body = [{"model": model_name, "prompt": PROMPTS[i % len(PROMPTS)], "n": 1, "max_tokens": args.max_tokens,
                    "temperature": 0.0, "return_token_ids": True} for i in range(per_phase)]
    gw_body = [{"model": "isocompute", "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": args.max_tokens,
                "temperature": 0.0, "budget": 2.0, "max_samples": 1} for i in range(per_phase)]
    # Warm both paths (connections, caches) before measuring.
    await phase(direct_url, direct_body[: args.concurrency], args.concurrency)
    await phase(gateway_url, gw_body[: args.concurrency], args.concurrency)
    res = {"direct": ([], [], []), "gateway": ([], [], [])}
    for _ in range(args.rounds):
        for name, url, bodies in (("direct", direct_url, direct_body), ("gateway", gateway_url, gw_body)):
            wall, lat, codes = await phase(url, bodies, args.concurrency)
            res[name][0].append(wall)
            res[name][1].extend(lat)
            res[name][2].extend(codes)
    return res


def round_ratio_ci(res: dict, level: float = 0.95) -> tuple[float, float, float]:
    """Geometric mean of the per-round throughput ratios gateway / direct and its Student-t interval (on
    the log scale): each round's two phases ran back to back, so a round's ratio is paired against the
    machine's load at the time."""
    from scipy import stats

    walls = {k: np.asarray(v[0]) for k, v in res.items()}
    r = np.log(walls["direct"] / walls["gateway"])  # same requests per phase: throughput ratio = 1 / wall ratio
    half = stats.t.ppf(0.5 + level / 2, len(r) - 1) * r.std(ddof=1) / np.sqrt(len(r)) if len(r) > 1 else 0.0
    return float(np.exp(r.mean())), float(np.exp(r.mean() - half)), float(np.exp(r.mean() + half))


def stream_cost(srv_url: str, model: Path, work: Path, args: argparse.Namespace) -> dict[str, float]:
    """Gateway process CPU per request at k = 1 for one sample sent as a waiting wave (``none@1``: one
    non-streamed completions call) and as a streamed one (``first:m=1@1s``: the same sample as an SSE stream,
    one chunk per decoded token) — what streaming the waves that never stop early would cost."""
    from isocompute.engines.vllm_server import free_port

    out = {}
    bodies = [{"model": "isocompute", "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": args.max_tokens,
               "temperature": 0.0, "budget": 1.0} for i in range(args.requests // 4)]
    for name, plan in (("wait", "m/none@1"), ("stream", "m/first:m=1@1s")):
        port = free_port()
        gw = start_gateway(None, port, work / f"gateway-{name}.log", upstream=srv_url, model=model, action=plan)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(url, gw, work / f"gateway-{name}.log")
            asyncio.run(phase(f"{url}/v1/completions", bodies[: args.concurrency], args.concurrency))
            cpu0 = process_cpu(gw.pid)
            _, _, codes = asyncio.run(phase(f"{url}/v1/completions", bodies, args.concurrency))
            out[name] = (process_cpu(gw.pid) - cpu0) / len(bodies) * 1e3
            assert set(codes) == {200}, sorted(set(codes))
        finally:
            stop(gw)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=960, help="total measured requests (both paths)")
    ap.add_argument("--rounds", type=int, default=6, help="alternating direct/gateway phases per path")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--sequential", type=int, default=60, help="requests per path at concurrency 1")
    ap.add_argument("--policy", type=Path)
    ap.add_argument("--model", type=Path)
    ap.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = ap.parse_args()

    from isocompute.engines.vllm_server import find_vllm_python, free_port, start_vllm_server

    work = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    model = args.model or tiny_model(work)
    policy = args.policy or small_policy(work)
    dec = decision_latency(policy)
    p99_dec = dec["wall_p99"]
    print(f"policy decision (1 prompt): wall p50 {dec['wall_p50']:.3f} ms, p99 {dec['wall_p99']:.3f} ms; "
          f"thread CPU p50 {dec['cpu_p50']:.3f} ms, p99 {dec['cpu_p99']:.3f} ms  (target p99 ≤ 1 ms; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
    ov = inprocess_overhead(policy, waves=True)
    print(f"gateway work per request (in-process, instant upstream, k=1): CPU {ov['completion_cpu']:.2f} ms "
          f"vs {ov['health_cpu']:.2f} ms for GET /health → added {ov['completion_cpu'] - ov['health_cpu']:.2f} ms "
          f"CPU; wall p50 added {ov['completion_p50'] - ov['health_p50']:.2f} ms")
    print(f"gateway work per wave (plan none@1x4 vs one wave): CPU "
          f"{(ov['plan4_cpu'] - ov['completion_cpu']) / 3:.3f} ms per extra wave "
          f"({ov['plan4_cpu']:.2f} vs {ov['completion_cpu']:.2f} ms per request)")
    if find_vllm_python() is None:
        print("no vLLM environment (.venv-vllm): run `make vllm-env` for the gateway-overhead part")
        return 1 if args.check else 0

    srv = start_vllm_server(model, log=work / "vllm.log")
    gw = None
    try:
        asyncio.run(srv.wait_ready(timeout=600))
        port = free_port()
        gw = start_gateway(policy, port, work / "gateway.log", upstream=srv.url, model=model)
        gw_url = f"http://127.0.0.1:{port}"
        wait_ready(gw_url, gw, work / "gateway.log")
        served = httpx.get(f"{srv.url}/v1/models").json()["data"][0]["id"]
        before, cpu0 = gateway_times(gw_url), process_cpu_split(gw.pid)
        res = asyncio.run(compare(f"{srv.url}/v1/completions", f"{gw_url}/v1/completions", served, args))
        after, cpu1 = gateway_times(gw_url), process_cpu_split(gw.pid)
        streamed = stream_cost(srv.url, model, work, args)
        seq = asyncio.run(compare(f"{srv.url}/v1/completions", f"{gw_url}/v1/completions", served,
                                  argparse.Namespace(**{**vars(args), "concurrency": 1, "rounds": 2,
                                                        "requests": args.sequential})))
    finally:
        if gw is not None:
            stop(gw)
        srv.stop()

    ok = True
    for name in ("direct", "gateway"):
        bad = [c for c in res[name][2] if c != 200]
        if bad:
            print(f"{name}: {len(bad)} non-200 answers: {sorted(set(bad))}")
            ok = False
    n = len(res["direct"][1])
    per = n / args.rounds
    thr = {k: len(v[1]) / sum(v[0]) for k, v in res.items()}
    p50 = {k: float(np.percentile(v[1], 50) * 1e3) for k, v in res.items()}
    p99 = {k: float(np.percentile(v[1], 99) * 1e3) for k, v in res.items()}
    ratio = thr["gateway"] / thr["direct"]
    geo, lo, hi = round_ratio_ci(res)
    print("per round req/s, direct / gateway: " + ", ".join(
        f"{per / d:.1f}/{per / g:.1f}" for d, g in zip(res["direct"][0], res["gateway"][0], strict=True)))
    added = p50["gateway"] - p50["direct"]
    print(f"k=1, concurrency {args.concurrency}, {n} requests per path, max_tokens {args.max_tokens}, greedy")
    print(f"direct vLLM : {thr['direct']:.1f} req/s, p50 {p50['direct']:.2f} ms, p99 {p99['direct']:.2f} ms")
    print(f"via gateway : {thr['gateway']:.1f} req/s, p50 {p50['gateway']:.2f} ms, p99 {p99['gateway']:.2f} ms")
    print(f"throughput ratio gateway/direct = {ratio:.3f}; per round, geometric mean {geo:.3f} [95% CI {lo:.3f}, "
          f"{hi:.3f}] over {args.rounds} paired rounds  (target ≥ 0.95)")
    print(f"p50 added latency at concurrency {args.concurrency} = {added:.2f} ms (queueing; the target is at 1)")
    n_gw = after[0] - before[0]
    inside = ((after[1] - before[1]) - (after[2] - before[2])) / max(n_gw, 1) * 1e3
    print(f"inside the gateway (request time − upstream call, from its /metrics): mean {inside:.2f} ms "
          f"over {n_gw:.0f} requests")
    user, system = ((b - a) / max(n_gw, 1) * 1e3 for a, b in zip(cpu0, cpu1, strict=True))
    gw_cpu = user + system
    print(f"gateway process CPU per request (vllm-http upstream, k=1, concurrency {args.concurrency}): "
          f"{gw_cpu:.2f} ms = {user:.2f} user + {system:.2f} kernel (sockets)  (target ≤ 2 ms)")
    print(f"one sample per request as a waiting wave (none@1) vs streamed (first:m=1@1s), max_tokens "
          f"{args.max_tokens}: gateway CPU {streamed['wait']:.2f} vs {streamed['stream']:.2f} ms per request "
          f"({streamed['stream'] / streamed['wait']:.2f}x)")
    s50 = {k: float(np.percentile(v[1], 50) * 1e3) for k, v in seq.items()}
    added1 = s50["gateway"] - s50["direct"]
    print(f"concurrency 1: p50 direct {s50['direct']:.2f} ms, via gateway {s50['gateway']:.2f} ms, "
          f"added {added1:.2f} ms  (target ≤ 3 ms)")
    ok &= ratio >= 0.95 and gw_cpu <= 2.0 and added1 <= 3.0 and p99_dec <= 1.0
    print("targets:", "met" if ok else "MISSED")
    return 0 if ok or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
