"""The imitation ceiling from bootstrap redraws of each prompt's samples (policy.label_noise)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isocompute.errors import InputError
from isocompute.policy.learn.label_noise import oracle_label_agreement, resampled_utilities
from isocompute.policy.synthetic import synthetic_records
from isocompute.solver.estimators import utilities
from isocompute.solver.outcomes import from_records

ACTIONS = (1, 2, 4)


def _record(i: int, answers: list[str | None], gold: str = "1") -> dict:
    return {"id": f"p{i}", "prompt": f"q{i}", "gold": gold,
            "samples": [{"answer": a, "correct": a == gold} for a in answers]}


def _costs(U: np.ndarray) -> np.ndarray:
    return np.broadcast_to(np.asarray(ACTIONS, float), U.shape).copy()


def test_prompts_whose_samples_all_agree_never_change_label():
    # every sample right, every sample the same wrong answer: any redraw is the same table
    table = from_records([_record(0, ["1"] * 4), _record(1, ["2"] * 4), _record(2, ["1"] * 4)])
    U = utilities(table, ACTIONS, "majority")
    rng = np.random.default_rng(0)
    np.testing.assert_array_equal(resampled_utilities(table, ACTIONS, "majority", rng), U)
    out = oracle_label_agreement(table, U, _costs(U), ACTIONS, "majority", [1.0, 2.0], reps=5)
    assert out["ceiling"] == [1.0, 1.0] and out["agreement"] == [1.0, 1.0]


def test_hand_worked_flip():
    """One prompt, 4 samples, 1 right and 3 distinct wrong; pass@k with actions 1, 2, 4 at budget 4 (any
    action affordable, the oracle takes the cheapest best). A redraw holds c' ~ Binomial(4, 1/4) correct:
    c' = 0 → all utilities 0 → k = 1; c' = 1 or 2 → only pass@4 = 1 → k = 4; c' = 3 → pass@2 = 1 → k = 2;
    c' = 4 → k = 1. P(k = 4) = 4·(1/4)(3/4)^3 + 6·(1/4)^2(3/4)^2 = 0.6328, the original label's share and
    the mode."""
    table = from_records([_record(0, ["1", "2", "3", "4"])])
    U = utilities(table, ACTIONS, "pass")
    C = _costs(U)
    out = oracle_label_agreement(table, U, C, ACTIONS, "pass", [4.0], reps=4000, seed=1)
    p4 = 4 * 0.25 * 0.75**3 + 6 * 0.25**2 * 0.75**2
    assert out["agreement"][0] == pytest.approx(p4, abs=0.025)
    assert out["ceiling"][0] == pytest.approx(p4, abs=0.025)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), budget=st.floats(1.0, 4.0))
def test_ceiling_is_at_least_agreement_and_both_are_shares(seed, budget):
    table = from_records(synthetic_records(30, 4, seed=seed, noise=0.3))
    U = utilities(table, ACTIONS, "majority")
    out = oracle_label_agreement(table, U, _costs(U), ACTIONS, "majority", [budget], reps=6, seed=seed)
    assert 0.0 <= out["agreement"][0] <= out["ceiling"][0] + 1e-12 <= 1.0 + 1e-12


def test_redraw_keeps_sample_counts_and_pass_matches_binomial_mean():
    table = from_records([_record(0, ["1", "1", "2", None])])
    rng = np.random.default_rng(3)
    draws = np.array([resampled_utilities(table, (1,), "pass", rng)[0, 0] for _ in range(4000)])
    assert draws.mean() == pytest.approx(0.5, abs=0.02)  # E[c'/n] = c/n for a bootstrap redraw


def test_bad_arguments():
    table = from_records([_record(0, ["1", "2"])])
    U = utilities(table, (1, 2), "majority")
    with pytest.raises(InputError, match="reps must be"):
        oracle_label_agreement(table, U, np.ones_like(U), (1, 2), "majority", [1.0], reps=0)
    with pytest.raises(InputError, match="unknown strategy"):
        resampled_utilities(table, (1, 2), "vote", np.random.default_rng(0))
