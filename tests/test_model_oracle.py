"""The oracle over multi-model actions (model, plan, cascade, ensemble) with the unchanged solver: equal to
the LP optimum (scipy HiGHS), budget met, choices mapped back to actions; and the single-model baselines
(uniform maj@k at a FLOP budget, best fixed plan per model, best fixed cascade) with their edge cases."""

import numpy as np
import pytest
from scipy.optimize import linprog

from isocompute.errors import BudgetError
from isocompute.evaluation.model_baselines import (
    best_fixed,
    best_single_model,
    uniform_at_budget,
    uniform_columns,
)
from isocompute.flops import ModelFlops
from isocompute.solver.models.actions import MenuConfig, default_actions
from isocompute.solver.models.estimates import estimate_actions, oracle
from isocompute.solver.models.tables import join_tables
from isocompute.solver.outcomes import from_records
from isocompute.tasks.answers.class_alignment import align_answers

FLOPS = {"A": ModelFlops.from_active_params(1.0), "B": ModelFlops.from_active_params(5.0)}


def menu(n_prompts=12, seed=0):
    rng = np.random.default_rng(seed)
    tables = {}
    for name, p_right in (("A", 0.45), ("B", 0.7)):
        recs = []
        for i in range(n_prompts):
            ans = [("a" if r < p_right else ("b", "c", None)[int(r * 10) % 3]) for r in rng.random(8)]
            recs.append({"id": f"p{i}", "prompt": f"q{i}", "gold": "a", "meta": {"task": "exact"},
                         "samples": [{"answer": a, "correct": a == "a", "completion_tokens": int(t)}
                                     for a, t in zip(ans, rng.integers(5, 50, 8), strict=True)]})
        tables[name] = from_records(recs)
    mt = join_tables(tables)
    mt = mt.with_classes(align_answers(mt.answers(), "exact", golds=mt.golds).classes)
    cfg = MenuConfig(plans=("none@1", "none@2", "none@4", "none@8", "lead:m=2@1x4", "lead:m=2@1x8"),
                     cascade_first=("lead:m=2@2", "lead:m=2@1x4"), cascade_last=("none@1", "none@2", "none@4"),
                     weighted_first=("lead:m=2@2",), weighted_last=("none@1", "none@2"), ensemble_k=(1, 2, 4),
                     weights=(0.5, 1.0, 2.0), n_orders=64)
    return estimate_actions(mt, FLOPS, default_actions(["A", "B"], cfg), n_orders=64)


def lp_optimum(U, C, budget):
    N, A = U.shape
    res = linprog(-U.ravel() / N, A_ub=C.ravel()[None] / N, b_ub=[budget],
                  A_eq=np.kron(np.eye(N), np.ones(A)), b_eq=np.ones(N), bounds=(0, 1), method="highs")
    assert res.status == 0
    return -res.fun


def test_oracle_equals_the_lp_optimum_and_meets_the_budget():
    est = menu()
    assert {a.kind for a in est.actions} == {"single", "cascade", "ensemble"}
    C = est.cost
    lo, hi = C.min(axis=1).mean(), C.max(axis=1).mean()
    binding = 0
    for budget in np.linspace(lo, hi, 7)[1:-1]:
        orc = oracle(est, budget)
        assert orc.accuracy == pytest.approx(lp_optimum(est.utility, C, budget), abs=1e-9)
        if orc.binding:
            assert orc.mean_cost == pytest.approx(budget, rel=1e-9)
        else:  # not binding: every prompt's best action fits
            assert orc.mean_cost < budget and orc.accuracy == pytest.approx(est.utility.max(axis=1).mean())
        binding += orc.binding
        np.testing.assert_allclose(orc.probs.sum(axis=1), 1.0)
        # per-prompt values come from the menu's own columns
        np.testing.assert_allclose(orc.utility, (orc.probs * est.utility).sum(axis=1))
    assert binding >= 2
    top = oracle(est, 10 * hi)  # above every choice: the budget does not bind
    assert top.accuracy == pytest.approx(est.utility.max(axis=1).mean())
    with pytest.raises(BudgetError):
        oracle(est, 0.5 * lo)


def test_oracle_value_is_monotone_in_the_budget():
    est = menu(seed=1)
    lo, hi = est.cost.min(axis=1).mean(), est.cost.max(axis=1).mean()
    acc = [oracle(est, b).accuracy for b in np.linspace(lo, hi, 9)]
    assert all(b >= a - 1e-12 for a, b in zip(acc, acc[1:], strict=False))


def test_uniform_at_budget_mixes_adjacent_k():
    est = menu()
    ks, cols = uniform_columns(est, "A")
    assert ks.tolist() == [1, 2, 4, 8]
    mean = est.cost[:, cols].mean(axis=0)
    mid = (mean[1] + mean[2]) / 2
    u = uniform_at_budget(est, "A", mid)
    assert u.mean_cost == pytest.approx(mid) and u.accuracy == pytest.approx(est.utility[:, cols[1:3]].mean())
    assert uniform_at_budget(est, "A", mean[0] * 0.5) is None and uniform_at_budget(est, "A", mean[-1] * 2) is None
    at_k = uniform_at_budget(est, "B", est.cost[:, uniform_columns(est, "B")[1][0]].mean())
    assert at_k.accuracy == pytest.approx(est.utility[:, uniform_columns(est, "B")[1][0]].mean())


def test_fixed_baselines_are_held_out_and_budget_matched():
    est = menu(n_prompts=30, seed=2)
    budget = float(est.cost[:, est.columns(model="B")].mean(axis=0).min() * 1.5)
    best, per = best_single_model(est, budget, folds=5, seed=0)
    assert set(per) == {"A", "B"} and best is max((h for h in per.values() if h), key=lambda h: h.accuracy)
    assert best.mean_cost == pytest.approx(budget, rel=0.25)
    cas = best_fixed(est, est.columns(kind="cascade"), budget, method="fixed cascade")
    assert cas is not None and len(cas.choices) == 5 and all(">" in c for c in cas.choices)
    # every prompt is scored by a choice made without it: the utilities are a mix of its own columns
    U = est.utility[:, est.columns(kind="cascade")]
    assert ((cas.utility >= U.min(axis=1) - 1e-12) & (cas.utility <= U.max(axis=1) + 1e-12)).all()
    assert best_fixed(est, est.columns(model="B"), 1e-9) is None  # below B's cheapest plan


def test_best_fixed_equals_cross_validate_fixed_plan():
    from isocompute.policy.plans.fixed import cross_validate_fixed_plan

    est = menu(n_prompts=30, seed=3)
    cols = est.columns(kind=("cascade", "ensemble"))
    for budget in np.quantile(est.cost[:, cols].mean(axis=0), [0.1, 0.4, 0.8]):
        mine = best_fixed(est, cols, budget, folds=5, seed=1)
        ref = cross_validate_fixed_plan(est.utility[:, cols], est.cost[:, cols], budget, folds=5, seed=1)
        np.testing.assert_allclose(mine.utility, ref.utility, atol=1e-12)
        np.testing.assert_allclose(mine.cost, ref.cost, rtol=1e-12)
