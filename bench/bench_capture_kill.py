"""Nothing lost: a capturing gateway killed under load (SIGKILL, then SIGTERM), its shards read back and refitted.

Starts ``isocompute serve`` (no policy: the cold start; ``--capture DIR --explore 1``: every prompt drawn in
full) on a tiny local checkpoint (transformers engine, CPU), keeps ``--clients`` requests in flight, scrapes
``isocompute_capture_lines_total`` — the rows acknowledged as written — every 0.2 s, and after ``--seconds``
kills it. Then reads the shards (``isocompute.stages.captured.read_shards``) and checks that every
acknowledged row is there: rows read ≥ the last count scraped before the signal (rows are only appended, so
the count is what was acknowledged by then), at most one torn line after SIGKILL and none after SIGTERM (the
drain lets the draws in flight finish and closes the shard). A second gateway then captures into the same
directory and is stopped with SIGTERM; finally ``isocompute refit`` reads everything (and says what it skipped).

    PYTHONPATH=. python bench/bench_capture_kill.py [--seconds 20] [--clients 8]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from isocompute.engines.vllm_server import free_port
from isocompute.stages.captured import read_shards

REPO = Path(__file__).resolve().parents[1]


def run_gateway(model: Path, cap: Path, seconds: float, clients: int, sig: int, log: Path) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "isocompute", "serve", "--engine", "transformers", "--model", str(model),
           "--capture", str(cap), "--explore", "1", "--capture-prompts", "--port", str(port), "--log-level", "warning"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "ISOCOMPUTE_CAPTURE_SAMPLES": "16",
           "ISOCOMPUTE_DEFAULT_MAX_TOKENS": "12", "ISOCOMPUTE_DRAIN_TIMEOUT_S": "60"}
    with open(log, "ab") as fh:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"the gateway exited: {log.read_text()[-2000:]}")
        time.sleep(0.3)
    stop = threading.Event()
    sent = [0]

    def client(c: int) -> None:
        i = 0
        with httpx.Client(timeout=60) as cl:
            while not stop.is_set():
                try:
                    cl.post(url + "/v1/completions", json={"model": "isocompute", "prompt": f"What is {c} + {i}?",
                                                           "budget": "4x", "max_tokens": 12})
                    sent[0] += 1
                except httpx.HTTPError:
                    pass
                i += 1

    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(clients)]
    for t in threads:
        t.start()
    acked, t_end = 0, time.monotonic() + seconds
    while time.monotonic() < t_end:
        try:
            m = re.search(r"^isocompute_capture_lines_total (\S+)$", httpx.get(url + "/metrics", timeout=2).text, re.M)
            acked = int(float(m.group(1))) if m else acked
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    os.killpg(proc.pid, sig) if sig == signal.SIGKILL else proc.send_signal(sig)
    code = proc.wait(timeout=120)
    stop.set()
    return {"signal": signal.Signals(sig).name, "acked_before_signal": acked, "requests": sent[0], "exit": code}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--clients", type=int, default=8)
    args = ap.parse_args(argv)
    from isocompute.training.tiny import save_tiny

    work = Path(tempfile.mkdtemp(prefix="isocompute-capture-kill-"))
    model = save_tiny(work / "model", seed=0)
    cap, log = work / "capture", work / "gateway.log"
    ok = True
    before = 0
    for sig in (signal.SIGKILL, signal.SIGTERM):
        r = run_gateway(Path(model), cap, args.seconds, args.clients, sig, log)
        got = read_shards(cap)
        new = len(got.rows) - before
        torn = [s for s in got.skipped if "torn" in s[2]]
        good = new >= r["acked_before_signal"] and (len(torn) <= 1 if sig == signal.SIGKILL else not got.skipped)
        ok &= good
        print(f"{r['signal']}: {r['requests']} requests answered, {r['acked_before_signal']} rows acknowledged by the "
              f"last scrape before the signal, {new} read back, {len(got.skipped)} line(s) skipped "
              f"{got.notes()} exit {r['exit']} → {'OK' if good else 'LOST ROWS'}")
        before = len(got.rows)
    res = subprocess.run([sys.executable, "-m", "isocompute", "refit", str(cap), "--out", str(work / "policy"),
                          "--actions", "1,2,4,8,16"], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                         capture_output=True, text=True)
    print(f"refit (exit {res.returncode}):\n{res.stdout}{res.stderr[-1500:]}")
    print("nothing lost" if ok else "MISS: rows lost")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
