"""Empirical-Bayes label shrinkage: the worked example, fixed points, per-task groups, and its use in fit and CV."""

import numpy as np
import pytest

from isocompute.policy.learn.shrinkage import sampling_variance, shrink_utilities
from isocompute.policy.policy import Policy, PolicyConfig
from isocompute.policy.synthetic import synthetic_records
from isocompute.solver.estimators import utilities
from isocompute.solver.outcomes import from_records


def test_worked_example():
    """Mean 0.5, spread 0.09, mean sampling variance 0.01 → τ² = 0.08; U = 0.9 with σ² = 0.02 → 0.82."""
    U = np.array([[0.9], [0.1], [0.2], [0.8]])
    assert U.mean() == pytest.approx(0.5) and U.var() == pytest.approx(0.125)
    var = np.array([[0.02], [0.02], [0.03], [0.033]])  # mean 0.02575: τ² = 0.125 − 0.02575 = 0.09925
    out = shrink_utilities(U, var)
    w = 0.09925 / (0.09925 + 0.02)
    assert out[0, 0] == pytest.approx(0.5 + w * 0.4)
    # the module docstring's numbers: τ² = 0.08, σ² = 0.02 → w = 0.8
    assert 0.5 + 0.08 / (0.08 + 0.02) * 0.4 == pytest.approx(0.82)


def test_exact_rows_keep_their_values_and_groups_shrink_apart():
    U = np.array([[1.0, 1.0], [0.4, 0.6], [0.0, 0.0], [0.5, 0.7]])
    var = np.array([[0.0, 0.0], [0.02, 0.02], [0.0, 0.0], [0.02, 0.01]])
    out = shrink_utilities(U, var)
    np.testing.assert_array_equal(out[[0, 2]], U[[0, 2]])  # σ² = 0: nothing to shrink
    assert np.abs(out[1] - U[:, :].mean(axis=0)).sum() < np.abs(U[1] - U.mean(axis=0)).sum()
    g = shrink_utilities(U, var, ["a", "a", "b", "b"])
    for rows in ([0, 1], [2, 3]):  # each task toward its own mean, from its own prompts only
        np.testing.assert_allclose(g[rows], shrink_utilities(U[rows], var[rows]))
    np.testing.assert_array_equal(g[[0, 2]], U[[0, 2]])
    assert not np.allclose(g[1], out[1])


def test_sampling_variance_is_zero_for_unanimous_prompts():
    recs = synthetic_records(30, 8, seed=2, noise=0.3)
    recs[0]["samples"] = [dict(s, answer=recs[0]["gold"], correct=True) for s in recs[0]["samples"]]
    table = from_records(recs)
    var = sampling_variance(table, (1, 2, 4), "majority", reps=10, seed=0)
    assert var.shape == (30, 3) and (var >= 0).all() and (var[0] == 0).all()
    assert var[1:].sum() > 0


def test_fit_trains_on_shrunk_labels_and_cv_shrinks_each_training_part():
    from isocompute.evaluation.evaluate import cross_validate
    from isocompute.solver.costs import cost_table

    table = from_records(synthetic_records(120, 8, seed=3, noise=0.5))
    cfg = dict(actions=(1, 2, 4, 8), budget_range=(1.0, 8.0), n_rounds=10, n_budget_grid=9, calibration_folds=2,
               n_components=4)
    raw = Policy(PolicyConfig(**cfg)).fit(table)
    eb = Policy(PolicyConfig(**cfg, shrinkage="eb")).fit(table)
    assert eb.config.shrinkage == "eb"
    a_raw, a_eb = raw.decide(table.prompts, 3.0, learner="utility"), eb.decide(table.prompts, 3.0, learner="utility")
    assert not np.array_equal(a_raw.lam, a_eb.lam) or not np.array_equal(a_raw.k, a_eb.k)
    U = utilities(table, cfg["actions"], "majority")
    C = cost_table(table.prompt_tokens, None, cfg["actions"], unit="samples")
    with pytest.raises(Exception, match="label_var"):
        cross_validate(table.prompts, U, C, PolicyConfig(**cfg, shrinkage="eb"), [3.0], folds=3, seeds=(0,))
    var = sampling_variance(table, cfg["actions"], "majority", reps=10)
    ev = cross_validate(table.prompts, U, C, PolicyConfig(**cfg, shrinkage="eb"), [3.0], folds=3, seeds=(0,),
                        label_var=var)
    assert np.isfinite(ev.utility[0, 1]).all()
