"""Capture: the seeded choice of explored prompts, private rotated bounded shards, a crash that loses at most
the line being written, and the gateway drawing an explored prompt in full after its answer, charging the
exploration to the key's controller, unchanged for the client, never for a key that opted out."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from app_fakes import FakeEngine, FakePolicy, completion, make_client

from isocompute.app.accounting.auth import ApiKeyRecord
from isocompute.app.accounting.budget_control import BudgetController
from isocompute.app.runner.capture import ShardWriter, explored
from isocompute.policy.cold_start import ColdStartPolicy
from isocompute.stages.captured import captured_table, read_shards

ROOT = Path(__file__).resolve().parents[1]


def test_the_explored_share_is_seeded_reproducible_and_near_its_share():
    picks = [explored(0.05, 7, f"prompt {i}", None, i) for i in range(20_000)]
    assert abs(sum(picks) / len(picks) - 0.05) < 0.006
    assert picks == [explored(0.05, 7, f"prompt {i}", None, i) for i in range(20_000)]
    assert picks != [explored(0.05, 8, f"prompt {i}", None, i) for i in range(20_000)]
    # a request's own seed replaces the count: the same request is explored the same way wherever it comes
    assert explored(0.5, 1, "x", 42, 1) == explored(0.5, 1, "x", 42, 999)
    assert not any(explored(0.0, 1, "x", None, i) for i in range(100))


def test_shards_are_private_rotated_bounded_and_hash_prompts(tmp_path):
    w = ShardWriter(tmp_path / "cap", max_bytes=1 << 20)  # shards of 128 KiB
    row = {"prompt": "p", "samples": [{"answer": "1", "completion_tokens": 3}], "pad": "x" * 4000}
    for i in range(400):  # ~1.6 MB: rotates, and deletes the oldest past 1 MiB
        w.write({**row, "i": i})
    w.close()
    d = tmp_path / "cap"
    shards = sorted(d.glob("capture-*.jsonl"))
    assert len(shards) > 1 and os.stat(d).st_mode & 0o777 == 0o700
    assert all(os.stat(p).st_mode & 0o777 == 0o600 for p in [*shards, d / ".salt"])
    assert sum(p.stat().st_size for p in shards) <= (1 << 20) + w.shard_bytes
    got = read_shards(d)
    assert not got.skipped and [r["i"] for r in got.rows] == list(range(400 - len(got.rows), 400))
    # the salted hash: stable for the directory, not the plain digest, different under another salt
    key = w.prompt_key("What is 2+2?")
    assert key == ShardWriter(d, max_bytes=1 << 20).prompt_key("What is 2+2?")
    assert key != "hash:" + hashlib.blake2b(b"What is 2+2?", digest_size=16).hexdigest()
    assert key != ShardWriter(tmp_path / "other", max_bytes=1 << 20).prompt_key("What is 2+2?")


def test_the_reader_names_and_skips_a_torn_last_line_and_keeps_the_shard(tmp_path):
    w = ShardWriter(tmp_path, max_bytes=1 << 20)
    for i in range(3):
        w.write({"prompt": "p", "samples": [{"answer": str(i)}]})
    w.close()
    with open(w.path, "ab") as f:
        f.write(b'{"prompt": "p", "samp')  # the line a crash cut
    got = read_shards(tmp_path)
    assert [r["samples"][0]["answer"] for r in got.rows] == ["0", "1", "2"]
    assert len(got.skipped) == 1 and "torn last line" in got.notes()[0] and w.path.name in got.notes()[0]


WRITER = """
import sys
from isocompute.app.runner.capture import ShardWriter
w = ShardWriter(sys.argv[1], max_bytes=1 << 22)
i = 0
while True:
    w.write({"prompt": "p", "samples": [{"answer": str(i)}] * 50, "i": i})
    print(i, flush=True)  # acknowledged: the write returned
    i += 1
"""


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_killed_writer_loses_no_acknowledged_line(tmp_path, sig):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env)
    acked = []
    deadline = time.monotonic() + 60
    while len(acked) < 300 and time.monotonic() < deadline:
        acked.append(int(p.stdout.readline()))
    p.send_signal(sig)
    acked += [int(x) for x in p.stdout.read().split()]  # what it acknowledged before it died
    p.wait(timeout=30)
    got = read_shards(tmp_path)
    seen = {r["i"] for r in got.rows}
    assert len(acked) >= 300 and set(acked) <= seen
    assert len(got.skipped) <= 1  # at most the line being written


def test_the_controller_counts_exploration_in_the_mean_not_as_requests():
    c = BudgetController(4.0, lo=1.0, hi=16.0)
    c.observe(4.0)
    before = c.integral
    c.charge(10.0)  # 2.5 budgets of exploration: in the mean now, in the correction over the next requests
    assert c.requests == 1 and c.state().mean_cost == 14.0 and c.explored == 10.0 and c.integral == before
    c.observe(4.0)
    assert c.integral == pytest.approx(before - 0.05 * 4.0 * 4.0 / 4.0)  # as if it had cost 4 + 4 (a target)
    c.observe(4.0), c.observe(4.0)
    assert c.pending == 0.0 and c.integral == pytest.approx(before - 0.05 * 4.0 * 10.0 / 4.0)
    with pytest.raises(ValueError, match="finite non-negative"):
        c.charge(-1.0)


def test_an_explored_prompt_is_answered_as_usual_then_drawn_in_full(tmp_path):
    script = ["The answer is 12.", "The answer is 12.", "The answer is 13."]
    with make_client(FakeEngine(script), FakePolicy("lead:m=2@1x4")) as c:
        plain = c.post("/v1/completions", json=completion(seed=5)).json()
    cap = tmp_path / "cap"
    with make_client(FakeEngine(script), FakePolicy("lead:m=2@1x4"), capture_dir=cap, explore=1.0,
                     capture_samples=6, capture_prompts=True) as c:
        r = c.post("/v1/completions", json=completion(seed=5)).json()
        assert r["choices"][0]["text"] == plain["choices"][0]["text"]
        info = r["isocompute"]
        assert info["explore"] == {"samples": 6, "share": 1.0} and info["k"] == plain["isocompute"]["k"]
        assert info["plan"] == plain["isocompute"]["plan"]
        deadline = time.monotonic() + 10
        while c.app.state.gateway.capture.tasks and time.monotonic() < deadline:
            time.sleep(0.02)
        [ctl] = list(c.app.state.gateway.controllers._items.values())
        metrics = c.get("/metrics").text
    assert "isocompute_explore_samples_total 6.0" in metrics and "isocompute_capture_lines_total 1.0" in metrics
    assert 'isocompute_explore_cost_total{unit="samples"} 6.0' in metrics
    assert ctl.explored == 6.0 and ctl.requests == 1
    got = read_shards(cap)
    [row] = got.rows
    assert row["prompt"] == "What is 5 + 7?" and len(row["samples"]) == 6
    assert [s["finish"] for s in row["samples"]] == list(range(6))
    assert [s["answer"] for s in row["samples"]] == ["12", "12", "13", "12", "12", "13"]
    assert [s["class"] for s in row["samples"]] == [0, 0, 1, 0, 0, 1]
    assert row["meta"]["plan"] == "lead:m=2@1x4" and row["meta"]["served"]["answer"] == "12"
    table = captured_table(got.rows + got.rows)  # the same prompt twice: one record of both rows' samples
    assert len(table) == 1 and int(table.n_samples[0]) == 12 and not table.has_gold


def test_a_key_that_opted_out_and_a_hashed_prompt(tmp_path):
    keys = [ApiKeyRecord(name="private", sha256=hashlib.sha256(b"k1").hexdigest(), capture=False),
            ApiKeyRecord(name="open", sha256=hashlib.sha256(b"k2").hexdigest())]
    cap = tmp_path / "cap"
    with make_client(FakeEngine(), FakePolicy("none@2"), capture_dir=cap, explore=1.0, capture_samples=3,
                     api_keys=keys) as c:
        a = c.post("/v1/completions", json=completion(), headers={"Authorization": "Bearer k1"}).json()
        b = c.post("/v1/completions", json=completion(), headers={"Authorization": "Bearer k2"}).json()
    assert a["isocompute"]["explore"] is None and b["isocompute"]["explore"] == {"samples": 3, "share": 1.0}
    [row] = read_shards(cap).rows  # flushed on drain (the client's exit ran the lifespan's shutdown)
    assert row["prompt"].startswith("hash:") and "5 + 7" not in json.dumps(row)


def test_the_mean_budget_holds_with_exploration_on(tmp_path):
    """A tokens budget of 4x with 10% of prompts drawn in full (16 samples each, ~1.6x a request on average):
    the controller charges the exploration, so served + explored tokens per request meet the budget."""
    script = ["The answer is 12.", "The answer is 13.", "The answer is 12.", "The answer is 14."]
    with make_client(FakeEngine(script, lengths=(4, 9, 6, 5, 7)), None, capture_dir=tmp_path / "cap", explore=0.1,
                     cold_start_sample_tokens=6.0) as c:
        c.app.state.gateway.replace_policy(ColdStartPolicy(6.0))  # what a gateway without a policy serves
        for i in range(600):
            assert c.post("/v1/completions", json=completion(f"q{i}", budget="4x", seed=i)).status_code == 200
        gw = c.app.state.gateway
        deadline = time.monotonic() + 10
        while gw.capture.tasks and time.monotonic() < deadline:
            time.sleep(0.02)
        [ctl] = list(gw.controllers._items.values())
    assert 0.05 < ctl.explored / ctl.spent < 0.6  # exploration is a real share of the spend
    assert ctl.spent / ctl.requests == pytest.approx(4 * 6.0, rel=0.05)
