"""The tiny world end to end: two real tiny models of different size (trained and sampled for real on the
same arith prompts), their tables joined and aligned, FLOPs from each model's own config, the menu of
single plans, cascades and ensembles estimated, and the oracle over it solved at several budgets."""

from dataclasses import replace

import numpy as np
import pytest

from isocompute.evaluation.model_baselines import best_fixed, best_single_model, uniform_at_budget
from isocompute.flops import load_model_flops
from isocompute.solver.models.actions import MenuConfig
from isocompute.solver.models.costs import resolve_model_flops
from isocompute.solver.models.estimates import estimate_menu, models_by_cost, oracle
from isocompute.solver.models.tables import join_tables
from isocompute.solver.outcomes import read_outcomes
from isocompute.tasks.answers.class_alignment import align_answers

pytestmark = pytest.mark.slow

PLANS = ("none@1", "none@2", "none@4", "none@8", "lead:m=1@1x4", "lead:m=2@1x4", "lead:m=2@1x8",
         "window:w=2@2x4", "beta:p=0.9@1x8")


def test_two_tiny_models_through_actions_and_the_oracle(tiny_world):
    tables = {name: read_outcomes(path) for name, (_, path) in tiny_world.items()}
    mt = join_tables(tables)
    assert len(mt) == 16 and mt.kind == "arith"
    mt = mt.with_classes(align_answers(mt.answers(), mt.kind, golds=mt.golds).classes)
    assert mt.mixed_classes() == 0  # arith's verdicts agree with the union's classes
    flops = resolve_model_flops(mt)  # each table's meta.model_config, as `sample` wrote it
    assert flops["tiny-l"] == replace(load_model_flops(tiny_world["tiny-l"][0]), name="tiny-l")
    assert models_by_cost(mt, flops) == ["tiny-s", "tiny-l"]
    cfg = MenuConfig(plans=PLANS, weighted_last=("none@1", "none@2", "none@4"), n_orders=50)
    est = estimate_menu(mt, flops, cfg)
    assert {a.kind for a in est.actions} == {"single", "cascade", "ensemble"}
    assert not any(est.completion_only.values())  # sampled tables carry prompt token counts
    assert (est.utility >= -1e-12).all() and (est.utility <= 1 + 1e-12).all()
    # a cascade costs the small model's plan plus, when it ran out, the large one's
    j = est.index("tiny-s/lead:m=2@1x4 > tiny-l/none@2")
    small, large = est.index("tiny-s/lead:m=2@1x4"), est.index("tiny-l/none@2")
    escalate = est.samples[:, j, 1] / 2
    np.testing.assert_allclose(est.cost[:, j], est.cost[:, small] + escalate * est.cost[:, large], rtol=1e-12)
    lo, hi = est.cost.min(axis=1).mean(), est.cost.max(axis=1).mean()
    prev = -1.0
    for budget in np.geomspace(lo * 1.01, hi, 5):
        orc = oracle(est, budget)
        assert orc.mean_cost <= budget * (1 + 1e-9) and orc.accuracy >= prev - 1e-12
        prev = orc.accuracy
        for name in mt.names:  # the oracle is never below a model's uniform maj@k at the same FLOPs
            uni = uniform_at_budget(est, name, budget)
            assert uni is None or orc.accuracy >= uni.accuracy - 1e-12
    mid = float(np.sqrt(lo * hi))
    best, per = best_single_model(est, mid, folds=4)
    cas = best_fixed(est, est.columns(kind="cascade"), mid, folds=4)
    assert best is not None and cas is not None and set(per) == set(mt.names)
