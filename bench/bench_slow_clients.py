"""Slow clients: many sockets that each send half a request line and wait, against ``isocompute serve`` on the
in-process tiny engine (issue 35, finding 2).

Opens ``--sockets`` connections from this one address, each sending ``POST /v1/chat/completions HTTP/1.1\\r\\nHost:
x\\r\\nContent-Ty`` and nothing more; then reports the gateway's open file descriptors, whether (and how fast)
``/health`` answers while they are held, and how many the server has closed after ``--hold`` seconds. Run it once
per code base to compare (the baseline is the code before issue 35: ``--repo`` at a checkout of it)::

    .venv/bin/python bench/bench_slow_clients.py [--sockets 3000] [--hold 15] [--repo DIR]

Loopback only; every socket is closed at the end, the gateway stopped.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gateway import small_policy, stop, tiny_model, wait_ready  # noqa: E402

from isocompute.engines.vllm_server import free_port  # noqa: E402

PARTIAL = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Ty"


def closed(s: socket.socket) -> bool:
    """The server closed ``s`` (EOF after whatever it wrote, or a reset); ``select`` cannot take fds ≥ 1024."""
    s.setblocking(False)
    try:
        while s.recv(4096):
            pass
        return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def health_s(url: str) -> float | None:
    t0 = time.perf_counter()
    try:
        httpx.get(f"{url}/health", timeout=10).raise_for_status()
    except httpx.HTTPError:
        return None
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sockets", type=int, default=3000)
    ap.add_argument("--hold", type=float, default=15.0, help="seconds to wait before counting the closed ones")
    ap.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        model, policy = tiny_model(tmp), small_policy(tmp)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        log = tmp / "gateway.log"
        cmd = [sys.executable, "-m", "isocompute", "serve", "--policy", str(policy), "--engine", "transformers",
               "--model", str(model), "--port", str(port), "--log-level", "warning"]
        with open(log, "ab") as fh:
            proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=args.repo, start_new_session=True,
                                    env={**os.environ, "PYTHONPATH": str(args.repo)})
        socks: list[socket.socket] = []
        try:
            wait_ready(url, proc, log)
            fds0 = len(os.listdir(f"/proc/{proc.pid}/fd"))
            t0 = time.perf_counter()
            for _ in range(args.sockets):
                s = socket.create_connection(("127.0.0.1", port), timeout=10)
                s.sendall(PARTIAL)
                socks.append(s)
            opened_s = time.perf_counter() - t0
            time.sleep(1.0)
            fds = len(os.listdir(f"/proc/{proc.pid}/fd"))
            h = [health_s(url) for _ in range(5)]
            early = sum(map(closed, socks))
            time.sleep(args.hold)
            gone = sum(map(closed, socks))
            alive = proc.poll() is None
        finally:
            for s in socks:
                s.close()
            stop(proc)
    ok = [x for x in h if x is not None]
    print(f"repo {args.repo}: {args.sockets} half-sent sockets opened in {opened_s:.1f} s; gateway fds {fds0} → {fds}; "
          f"/health {len(ok)}/5 answered (worst {max(ok) if ok else float('nan'):.3f} s); "
          f"closed by the server at once {early}, after {args.hold:g} s more {gone}/{args.sockets}; "
          f"gateway {'alive' if alive else 'dead'}")


if __name__ == "__main__":
    main()
