"""bench/bench_imitation_ceiling.py: its arith metadata is the generator's, and it runs end to end."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from isocompute.errors import InputError
from isocompute.tasks import arith

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import bench_imitation_ceiling as bench  # noqa: E402


def test_metadata_is_the_generators_for_any_seed_and_order():
    ids = ["arith-1-5", "arith-0-2", "arith-1-0"]
    meta = bench.generator_metadata(ids)
    for row, (seed, index) in zip(meta, [(1, 5), (0, 2), (1, 0)], strict=True):
        p = arith.generate(index + 1, seed)[index]
        assert row[: len(bench.META)].tolist() == [float(p.meta[k]) for k in bench.META]
        assert row[-1] == float("*" in p.meta["expression"])


def test_a_table_that_is_not_arith_is_a_clear_error():
    with pytest.raises(InputError, match="arith-<seed>-<index>"):
        bench.generator_metadata(["gsm8k-17"])


def test_runs_on_a_small_arith_table(tmp_path, capsys):
    # correctness follows the difficulty level, so the labels are learnable in part
    rng = np.random.default_rng(0)
    lines = []
    for p in arith.generate(60, 1):
        q = {1: 0.9, 2: 0.6, 3: 0.3, 4: 0.1, 5: 0.0}[p.meta["difficulty"]]
        ok = rng.random(8) < q
        samples = [{"answer": p.gold if c else str(int(rng.integers(0, 3))), "correct": bool(c)} for c in ok]
        lines.append(json.dumps({"id": p.id, "prompt": p.prompt, "gold": p.gold, "samples": samples}))
    table = tmp_path / "t.jsonl"
    table.write_text("\n".join(lines) + "\n")
    assert bench.main([str(table), "--actions", "1,2,4,8", "--budgets", "2", "--seeds", "1",
                       "--label-reps", "2"]) == 0
    row = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("2 |")]
    assert len(row) == 1
    cells = [float(c) for c in row[0].split("|")]
    assert 1.0 <= cells[1] <= 2.0 + 1e-9  # the oracle spends at most the budget
    assert all(0.0 <= c <= 1.0 for c in cells[2:])
