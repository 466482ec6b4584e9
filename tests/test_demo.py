"""``isocompute demo`` chains the ordinary subcommands: which stages it runs, and the embedded checkpoint it starts
from unless told to train (the whole loop runs end to end in test_docker's first-start test)."""

from __future__ import annotations

import json

import pytest

from isocompute.cli import demo


@pytest.fixture
def invoked(monkeypatch):
    """The stages' argv in order; each 'succeeds' by writing the marker the demo checks (the subcommands
    themselves have their own tests)."""
    calls: list[list[str]] = []

    def fake(commands, argv):
        calls.append(argv)
        out = argv[argv.index("--out") + 1]
        from pathlib import Path

        if argv[0] == "sample":
            Path(out).write_text("".join(json.dumps({"id": f"p{i}"}) + "\n" for i in range(20)))
        else:
            Path(out).mkdir(parents=True, exist_ok=True)
            (Path(out) / "manifest.json").write_text("{}")
        return 0

    monkeypatch.setattr(demo, "_invoke", fake)
    return calls


def run(tmp_path, *extra):
    import argparse

    parser = argparse.ArgumentParser()
    demo.register(parser.add_subparsers())
    args = parser.parse_args(["demo", "--out", str(tmp_path), "--prompts", "20", "--workers", "1", *extra])
    return demo.run(args, {})


def test_the_default_demo_starts_from_the_embedded_checkpoint_and_says_so(tmp_path, invoked, capsys):
    assert run(tmp_path) == 0
    assert [a[0] for a in invoked] == ["sample", "solve", "fit", "report"]
    assert (tmp_path / "tiny-sft" / "model.safetensors").is_file()
    assert "shortened — copied the embedded checkpoint" in capsys.readouterr().out
    invoked.clear()
    assert run(tmp_path) == 0 and invoked == []  # everything done: a second run redoes nothing


@pytest.mark.parametrize("extra, steps", [(["--train"], None), (["--sft-steps", "3"], "3"), (["--seed", "1"], None)])
def test_train_sft_steps_or_another_seed_train_from_scratch(tmp_path, invoked, extra, steps):
    assert run(tmp_path, *extra) == 0
    sft = invoked[0]
    assert sft[:2] == ["train", "sft"] and (steps is None) == ("--steps" not in sft)
    if steps:
        assert sft[sft.index("--steps") + 1] == steps


# ---- stopping the sample shards with the demo --------------------------------------------------------

SHARDS = """
import os, signal, subprocess, sys, time
from isocompute.cli import demo

real_popen, mode = subprocess.Popen, sys.argv[1]

def popen(*a, **kw):  # 'starting': the signal lands while a shard starts (after its exec, before it is known)
    p = real_popen(*a, **kw)
    print(p.pid, flush=True)
    if mode == "starting":
        os.kill(os.getpid(), signal.SIGTERM)
    return p

subprocess.Popen = popen
sleeper = [sys.executable, "-c", "import subprocess, sys, time; "
           "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"]
with demo._shards_stopped_with_the_demo() as start:
    procs = [start(sleeper, dict(os.environ)) for _ in range(2)]
    print("waiting", flush=True)
    procs[0].wait()
"""


def _group_alive(pgid: int) -> bool:
    import os

    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


@pytest.mark.parametrize("mode", ["waiting", "starting"])
def test_sigterm_stops_the_shards_and_their_children_at_once(mode):
    """SIGTERM while the demo waits on a shard (it used to wait 10 s there, on the Popen's own lock) or
    while a shard starts (the signal is acted on once the shard is known): the demo dies by the signal
    within a second, and every shard's process group with it."""
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-c", SHARDS, mode], stdout=subprocess.PIPE, text=True)
    try:
        pgids = [int(proc.stdout.readline())]
        t0 = time.monotonic()
        if mode == "waiting":
            pgids.append(int(proc.stdout.readline()))
            assert proc.stdout.readline() == "waiting\n"
            time.sleep(0.5)  # the demo is in procs[0].wait()
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == -signal.SIGTERM
        assert time.monotonic() - t0 < 2
        assert proc.stdout.read() == ""  # 'starting': it went no further than the first shard
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.monotonic() + 5
    while any(_group_alive(g) for g in pgids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_group_alive(g) for g in pgids), "a shard or its child outlived the demo"
