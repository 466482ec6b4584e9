"""Running a replay server: in this process until a signal (:func:`serve_forever`, what ``isocompute replay``
does), or as a child process that tests and benches start and stop (:func:`start_replay`).

Ignores: TLS, several worker processes (one event loop serves thousands of streams; the timing model, not
the host's CPU, is meant to set the pace — check the host keeps up with :func:`lag_note` in benches).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from isocompute.errors import EngineUnavailable
from isocompute.replay.server import ReplayServer
from isocompute.replay.table import ReplayTable
from isocompute.replay.timing import TimingModel

__all__ = ["ReplayProcess", "ReplayThread", "replay_process", "serve_forever", "start_replay"]


def serve_forever(table: ReplayTable, timing: TimingModel, *, host: str, port: int) -> None:
    """Serve ``table`` on ``host:port`` until SIGINT or SIGTERM."""

    async def main() -> None:
        server = ReplayServer(table, timing, host=host, port=port)
        await server.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        sys.stderr.write(f"isocompute replay (a simulator: seconds from its timing model {timing}) serving {len(table.rows)} "
              f"prompts as model {table.model!r} on http://{host}:{port}"
              + (f"; {table.inexact} of {table.answers} answers do not read back exactly" if table.inexact else "") + "\n")
        sys.stderr.flush()
        await stop.wait()
        await server.stop()

    asyncio.run(main())


class ReplayProcess:
    """A replay server in a child process (its own process group): ``url``, ``process``, :meth:`stop`."""

    def __init__(self, url: str, process: subprocess.Popen[bytes]) -> None:
        self.url, self.process = url, process

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_replay(tables: Sequence[str | Path], port: int, *, log: Path | None = None, timeout: float = 30.0,
                 **timing: str | float | int) -> ReplayProcess:
    """``isocompute replay TABLES --port PORT`` in a child process (a new session, so a test may signal its
    group), returned once ``/health`` answers; ``timing``: the command's flags as keywords (``decode_tps=5000``, ``model="name"``…).
    Raises EngineUnavailable (with its log) when it does not come up within ``timeout``."""
    cmd = [sys.executable, "-m", "isocompute", "replay", *map(str, tables), "--port", str(port)]
    for k, v in timing.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    out = open(log, "wb") if log is not None else subprocess.DEVNULL  # noqa: SIM115 (the child owns it)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parents[2]),
                                                                       os.environ.get("PYTHONPATH", "")]))}
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                return ReplayProcess(f"http://127.0.0.1:{port}", proc)
        time.sleep(0.1)
    proc.kill()
    proc.wait()
    tail = log.read_text(errors="replace")[-2000:] if log is not None and log.exists() else ""
    raise EngineUnavailable(f"the replay server on port {port} did not come up within {timeout:.0f} s "
                            f"(exit {proc.returncode}): {tail}")


@contextlib.contextmanager
def replay_process(tables: Sequence[str | Path], port: int, **kw: Any) -> Iterator[ReplayProcess]:
    """:func:`start_replay` as a context manager; stopped on exit."""
    rp = start_replay(tables, port, **kw)  # type: ignore[arg-type]
    try:
        yield rp
    finally:
        rp.stop()


class ReplayThread:
    """A replay server on its own event loop in a daemon thread of this process (tests: no child to start);
    ``server`` is the :class:`ReplayServer` (touch it only through its HTTP API or :meth:`call`)."""

    def __init__(self, table: ReplayTable, timing: TimingModel, port: int) -> None:
        import threading

        self.server = ReplayServer(table, timing, port=port)
        self.url = f"http://127.0.0.1:{port}"
        self.loop = asyncio.new_event_loop()
        started = threading.Event()

        def main() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(self.server.start())
            started.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=main, daemon=True)
        self.thread.start()
        if not started.wait(30):
            raise EngineUnavailable(f"the replay thread on port {port} did not start within 30 s")

    def call(self, fn: Any) -> Any:
        """Run ``fn(server)`` on the server's loop (a coroutine's result is awaited) and return its result."""
        async def go() -> Any:
            out = fn(self.server)
            return await out if asyncio.iscoroutine(out) else out
        return asyncio.run_coroutine_threadsafe(go(), self.loop).result(30)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
