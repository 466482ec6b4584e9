"""Real data: Qwen2.5-Math CoT on 100 MATH problems × 8 samples, with the shipped pred and score fields.

The shipped grading is the ground truth here (answer = pred, correct = score); the reference values
(maj@8 = 0.925 with fractional tie credit, pass@8 = 0.96) are what the dump's own per-prompt votes give.
"""

from pathlib import Path

import numpy as np
import pytest

from isocompute.solver.estimators import utilities
from isocompute.solver.outcomes import from_qwen_cot_table

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "qwen_math_cot_100.jsonl"

pytestmark = [
    pytest.mark.data,
    pytest.mark.skipif(not DATA.is_file(), reason=f"{DATA} is absent (shared data not mounted)"),
]


@pytest.fixture(scope="module")
def table():
    return from_qwen_cot_table(DATA)


def test_shape_and_fields(table):
    assert len(table) == 100 and table.n_max == 8 and not table.is_ragged
    assert table.has_scores, "pred_score (reward model) becomes the verifier score"
    assert table.ids[0] == "qwen-0" and table.golds[0] == "420"


def test_reference_maj8_and_pass8(table):
    u_maj = utilities(table, [8], "majority").mean()
    u_pass = utilities(table, [8], "pass").mean()
    assert u_maj == pytest.approx(0.925, abs=0.005)
    assert u_pass == pytest.approx(0.96, abs=0.005)


def test_curves_are_consistent(table):
    ks = [1, 2, 4, 8]
    curves = {s: utilities(table, ks, s) for s in ("pass", "majority", "best_of")}
    acc1 = table.n_correct / table.n_samples
    for u in curves.values():  # with one sample every strategy is the sample's correctness
        np.testing.assert_allclose(u[:, 0], acc1, atol=1e-14)
    assert (np.diff(curves["pass"].mean(0)) > 0).all()
    assert (curves["majority"] <= curves["pass"] + 1e-12).all()
    assert (curves["best_of"] <= curves["pass"] + 1e-12).all()
