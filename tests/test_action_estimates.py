"""Multi-model actions: the hand-worked examples of model_actions' docstring, brute force over ALL orders of
every model's samples (playing each stage through Plan.step, the gateway's path, and voting with exact
fractions) for singles, cascades of two and three models with either vote and ensembles, Monte Carlo
within its standard errors, hypothesis properties, action names, weight fitting and errors."""

import functools
import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from isocompute.errors import InputError
from isocompute.flops import ModelFlops
from isocompute.solver.models.actions import Action, MenuConfig, Stage, default_actions, parse_action
from isocompute.solver.models.estimates import estimate_actions, fit_vote_weights, models_by_cost
from isocompute.solver.models.tables import join_tables
from isocompute.solver.outcomes import from_records
from isocompute.solver.plans.estimates import estimate_plans
from isocompute.solver.plans.plan import parse_plan
from isocompute.tasks.answers.class_alignment import align_answers

GOLD = "a"


def joined(answers_by_model, tokens_by_model=None, aligned=True):
    """answers_by_model: {name: [[answers of prompt 0], …]} (None = null); 'a' is correct."""
    tables = {}
    for name, rows in answers_by_model.items():
        toks = (tokens_by_model or {}).get(name)
        tables[name] = from_records([{
            "id": f"p{i}", "prompt": f"q{i}", "gold": GOLD, "meta": {"task": "exact"},
            "samples": [{"answer": a, "correct": a == GOLD,
                         "completion_tokens": (toks[i][j] if toks else 10)} for j, a in enumerate(row)]}
            for i, row in enumerate(rows)])
    mt = join_tables(tables)
    if aligned:
        mt = mt.with_classes(align_answers(mt.answers(), "exact", golds=mt.golds).classes)
    return mt


FLOPS = {"A": ModelFlops.from_active_params(1.0), "B": ModelFlops.from_active_params(10.0),
         "C": ModelFlops.from_active_params(100.0)}


def brute(answers, tokens, action, flops_per_token):
    """Exact expectations over all orders of every model's samples: utility, per-model samples and FLOPs."""
    models = action.models

    @functools.cache
    def run(orders):  # orders: per stage, the answer sequence (with token counts) in drawn order
        drawn = []
        for s, stage in enumerate(action.stages):
            seq = orders[s]
            for K in stage.plan.boundaries:
                step = stage.plan.step([a for a, _ in seq[:K]])
                if step.stop:
                    break
            drawn.append(seq[:K])
            if step.reason == "rule":
                break
        if action.vote == "all":
            weights = [Fraction(w).limit_denominator(10**6) for w in action.weights] or [Fraction(1)]
            voted = [(a, weights[s]) for s, d in enumerate(drawn) for a, _ in d]
        else:
            voted = [(a, Fraction(1)) for a, _ in drawn[-1]]
        score = {}
        for a, w in voted:
            if a is not None:
                score[a] = score.get(a, 0) + w
        u = Fraction(0)
        if score:
            top = max(score.values())
            win = [a for a, v in score.items() if v == top]
            u = Fraction(sum(a == GOLD for a in win), len(win))
        samples = [len(d) for d in drawn] + [0] * (len(models) - len(drawn))
        fl = [sum(t for _, t in d) * 2 * flops_per_token[models[s]] for s, d in enumerate(drawn)]
        return u, tuple(samples), tuple(fl + [0] * (len(models) - len(drawn)))

    per_model = [list(zip(answers[m], tokens[m], strict=True)) for m in models]
    tot_u, tot_s, tot_f, count = Fraction(0), np.zeros(len(models)), np.zeros(len(models)), 0
    for orders in itertools.product(*(itertools.permutations(x) for x in per_model)):
        u, s, f = run(tuple(tuple(o[: st.plan.max_samples]) for o, st in zip(orders, action.stages, strict=True)))
        tot_u += u
        tot_s += s
        tot_f += f
        count += 1
    return float(tot_u / count), tot_s / count, tot_f / count


CASES = [
    {"A": ["a", "a", "b"], "B": ["b", "b", "a", "b"]},
    {"A": ["a", "b", None, "c", "a"], "B": ["a", "a", "b", None]},
    {"A": ["b", "b", "a", "a", "c", "b"], "B": ["a", "b", "a", "a"]},
    {"A": [None, None, "a", "b"], "B": ["c", "c", "a", None, "a"]},
]
ACTIONS = [
    "A/none@2", "B/lead:m=2@1x3", "A/lead:m=2@2 > B/none@1", "A/lead:m=2@1x3 > B/lead:m=2@1x3",
    "A/window:w=2@1x3 > B/none@2", "A/beta:p=0.75@1x3 > B/none@3", "A/lead:m=1@1x2 > B/none@1",
    "A/none@2 > B/none@2",  # the first stage never fires: always both, vote over B's
    "A/lead:m=2@2 > B/none@1 [w=1,4]", "A/lead:m=2@1x3 > B/none@2 [w=1,0.5]", "A/none@2 + B/none@2 [w=1,1]",
    "A/none@1 + B/none@3 [w=1,2]", "A/none@3 + B/lead:m=2@1x3 [w=1,1]",
]


def test_docstring_examples():
    mt = joined({"A": [CASES[0]["A"]], "B": [CASES[0]["B"]]})
    est = estimate_actions(mt, FLOPS, ACTIONS[2:3] + ["A/none@2 + B/none@2 [w=1,1]"], n_orders=2000)
    assert est.utility[0, 0] == pytest.approx(1 / 2, abs=1e-15) and est.method[0] == "exact"
    np.testing.assert_allclose(est.samples[0, 0], [2, 2 / 3])
    assert abs(est.utility[0, 1] - 5 / 12) < 3 * est.utility_se[0, 1] + 1e-12 and est.method[1] == "monte-carlo"
    # FLOPs: 2 · active per completion token (10 tokens a sample, prompt unknown)
    assert est.cost[0, 0] == pytest.approx(2 * 20 * 1 + 2 / 3 * 20 * 10) and est.completion_only == {"A": True, "B": True}


@pytest.mark.parametrize("case", CASES)
def test_every_action_against_brute_force_over_all_orders(case):
    rng = np.random.default_rng(len(case["A"]))
    tokens = {m: rng.integers(1, 30, len(v)).tolist() for m, v in case.items()}
    mt = joined({m: [v] for m, v in case.items()}, {m: [t] for m, t in tokens.items()})
    est = estimate_actions(mt, FLOPS, ACTIONS, n_orders=3000, seed=1)
    zs = []
    for j, name in enumerate(est.names):
        want_u, want_s, want_f = brute(case, tokens, est.actions[j], {"A": 1.0, "B": 10.0})
        cols = [mt.names.index(m) for m in est.actions[j].models]
        np.testing.assert_allclose(est.samples[0, j, cols], want_s, rtol=1e-12, atol=1e-12, err_msg=name)
        # decode(0, m + 1) = 2·N·m per sample
        np.testing.assert_allclose(est.flops[0, j, cols], want_f, rtol=1e-12, atol=1e-9, err_msg=name)
        if est.method[j] == "exact":
            assert est.utility[0, j] == pytest.approx(want_u, abs=1e-12), name
            assert est.utility_se[0, j] == 0
        else:
            se = est.utility_se[0, j]
            zs.append(abs(est.utility[0, j] - want_u) / se if se > 0 else 0.0)
            assert se == 0 or abs(est.utility[0, j] - want_u) < 4.5 * se, name
            if se == 0:
                assert est.utility[0, j] == pytest.approx(want_u, abs=1e-12), name
    assert np.mean(np.array(zs) < 3) >= 0.8


def test_three_model_cascades_against_brute_force():
    case = {"A": ["a", "b", "b"], "B": ["b", "a", None], "C": ["a", "a", "c"]}
    mt = joined({m: [v] for m, v in case.items()})
    tokens = {m: [10] * 3 for m in case}
    acts = ["A/lead:m=2@1x3 > B/lead:m=2@2 > C/none@1", "A/lead:m=2@2 > B/lead:m=2@1x3 > C/none@2",
            "A/lead:m=2@2 > B/lead:m=2@2 > C/none@1 [w=1,2,3]", "A/none@1 + B/none@1 + C/none@1 [w=1,1,1]"]
    est = estimate_actions(mt, FLOPS, acts, n_orders=4000, seed=2)
    for j, a in enumerate(est.actions):
        want_u, want_s, _ = brute(case, tokens, a, {"A": 1.0, "B": 10.0, "C": 100.0})
        np.testing.assert_allclose(est.samples[0, j], want_s, rtol=1e-12, atol=1e-12)
        tol = 1e-12 if est.method[j] == "exact" else 4.5 * est.utility_se[0, j] + 1e-12
        assert abs(est.utility[0, j] - want_u) <= tol, a.name


def test_monte_carlo_last_vote_within_three_standard_errors_of_exact():
    rng = np.random.default_rng(5)
    A = [[("a", "b", "c", None)[k] for k in rng.integers(0, 4, 12)] for _ in range(40)]
    B = [[("a", "b", None)[k] for k in rng.integers(0, 3, 10)] for _ in range(40)]
    mt = joined({"A": A, "B": B})
    acts = ["A/lead:m=2@1x4 > B/none@2", "A/lead:m=3@1x2,2,4 > B/lead:m=2@1x4", "A/window:w=2@2x3 > B/none@1"]
    ex = estimate_actions(mt, FLOPS, acts)
    mc = estimate_actions(mt, FLOPS, acts, method="monte-carlo", n_orders=400, seed=3)
    assert ex.method == ("exact",) * 3 and mc.method == ("monte-carlo",) * 3
    se = mc.utility_se
    z = np.abs(mc.utility - ex.utility)[se > 0] / se[se > 0]
    assert z.size > 20 and np.mean(z < 3) > 0.97 and (z < 5).all()
    np.testing.assert_array_equal(mc.cost, ex.cost)  # costs are exact either way


def test_single_model_columns_equal_plan_estimates():
    rng = np.random.default_rng(0)
    A = [[("a", "b", None)[k] for k in rng.integers(0, 3, 16)] for _ in range(20)]
    mt = joined({"A": A, "B": A})
    plans = ["none@1", "none@4", "lead:m=2@1x8", "bayes:B=10,alpha=0.3,top=5@1x2,2,4,8"]
    est = estimate_actions(mt, FLOPS, [f"B/{p}" for p in plans])
    pe = estimate_plans(mt.codes["B"], mt.tables["B"].correct, plans)
    np.testing.assert_allclose(est.utility, pe.utility, atol=1e-15)
    np.testing.assert_allclose(est.samples[:, :, 1], pe.samples, atol=1e-15)
    np.testing.assert_allclose(est.waves, pe.waves, atol=1e-15)
    assert (est.samples[:, :, 0] == 0).all()


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(["a", "b", "c", None]), min_size=3, max_size=4),
       st.lists(st.sampled_from(["a", "b", None]), min_size=3, max_size=4), st.data())
def test_property_against_brute_force(a_answers, b_answers, data):
    name = data.draw(st.sampled_from(ACTIONS[2:8]))  # the exact (last-vote) cascades
    case = {"A": a_answers, "B": b_answers}
    mt = joined({m: [v] for m, v in case.items()})
    est = estimate_actions(mt, FLOPS, [name])
    want_u, want_s, _ = brute(case, {m: [10] * len(v) for m, v in case.items()}, est.actions[0], {"A": 1.0, "B": 10.0})
    assert est.utility[0, 0] == pytest.approx(want_u, abs=1e-12)
    np.testing.assert_allclose(est.samples[0, 0], want_s, atol=1e-12)
    # invariants: utility in [0, 1]; a cascade costs at least its first stage and at most both stages in full
    assert -1e-12 <= est.utility[0, 0] <= 1 + 1e-12
    a = est.actions[0]
    assert est.samples[0, 0, 0] <= a.stages[0].plan.max_samples and est.samples[0, 0, 1] <= a.stages[1].plan.max_samples


def test_action_names_round_trip_and_kinds():
    for name in ACTIONS + ["A/lead:m=2@2 > B/lead:m=2@2 > C/none@1 [w=1,2,0.5]"]:
        a = parse_action(name)
        assert a.name == name and parse_action(a.name) == a
    assert parse_action("A/none@2").kind == "single"
    assert parse_action("A/none@2 + B/none@2 [w=1,1]").kind == "ensemble"
    assert parse_action("A/lead:m=2@2 > B/none@2 [w=1,1]").kind == "cascade"
    assert parse_action("A/none@2 > B/none@2").kind == "cascade"


@pytest.mark.parametrize(("name", "match"), [
    ("A/none@2 > A/none@2", "each model at most once"),
    ("A/none@2 > B/none@2 [w=1]", "one positive weight per stage"),
    ("A/none@2 > B/none@2 [w=1,-1]", "one positive weight per stage"),
    ("A/lead:m=2@2 + B/none@2 [w=1,1]", "bad ensemble"),
    ("A/none@2 + B/none@2", "bad ensemble"),
    ("A/none@2 + B/none@2 > C/none@1", "not both"),
    ("A:none@2", "bad stage"),
    ("A/none@2 [w=x]", "bad weights"),
    ("A/none@2 [w=1]", "weights apply only"),
])
def test_bad_action_names(name, match):
    with pytest.raises(InputError, match=match):
        parse_action(name)


def test_estimate_errors():
    mt = joined({"A": [["a", "b", "a"]], "B": [["a", "a", "b"]]})
    raw = joined({"A": [["a", "b", "a"]], "B": [["a", "a", "b"]]}, aligned=False)
    with pytest.raises(InputError, match="need answer classes aligned"):
        estimate_actions(raw, FLOPS, ["A/none@1 + B/none@1 [w=1,1]"])
    assert estimate_actions(raw, FLOPS, ["A/lead:m=2@2 > B/none@1"]).method == ("exact",)  # own votes: no need
    with pytest.raises(InputError, match="not among the joined models"):
        estimate_actions(mt, FLOPS, ["Z/none@1"])
    with pytest.raises(InputError, match="no FLOP shape"):
        estimate_actions(mt, {"A": FLOPS["A"]}, ["B/none@1"])
    with pytest.raises(InputError, match="has only 3"):
        estimate_actions(mt, FLOPS, ["A/none@4"])
    with pytest.raises(InputError, match="at least one action"):
        estimate_actions(mt, FLOPS, [])


def test_fit_vote_weights_picks_the_training_best_and_prefers_equal_on_ties():
    # prompt 0: A votes a b b, B votes a: w = 1/2 → b (0), 1 → a tie (1/2), 2 → a (1); prompt 1 is indifferent
    mt = joined({"A": [["a", "b", "b"], ["a", "a", "a"]], "B": [["a", "a"], ["a", "a"]]})
    acts = [Action((Stage("A", parse_plan("none@3")), Stage("B", parse_plan("none@1"))), "all", (1.0, w))
            for w in (0.5, 1.0, 2.0)] + [parse_action("A/none@1")]
    est = estimate_actions(mt, FLOPS, acts, n_orders=50)
    np.testing.assert_allclose(est.utility[0, :3], [0, 0.5, 1])
    fitted = fit_vote_weights(est)
    assert [a.name for a in fitted.actions] == ["A/none@3 + B/none@1 [w=1,2]", "A/none@1"]
    tie = fit_vote_weights(est, rows=[1])  # every weight scores 1 on prompt 1
    assert tie.actions[0].weights == (1.0, 1.0)


def test_default_menu_and_cost_order():
    mt = joined({"A": [["a"] * 16, ["b"] * 16], "B": [["a"] * 16, ["a"] * 16]})
    order = models_by_cost(mt, {"A": FLOPS["B"], "B": FLOPS["A"]})
    assert order == ["B", "A"]
    acts = default_actions(order, MenuConfig())
    kinds = {k: sum(a.kind == k for a in acts) for k in ("single", "cascade", "ensemble")}
    assert kinds["single"] == 60 and kinds["ensemble"] == 16 * 5 and kinds["cascade"] == 28 * 30 + 5 * 4 * 5
    assert all(a.models[0] == "B" for a in acts if len(a.stages) > 1)  # cheap first
    with pytest.raises(InputError, match="must name two or more"):
        default_actions(order, MenuConfig(chains=(("B",),)))
    with pytest.raises(InputError, match="n_orders"):
        MenuConfig(n_orders=1)
    assert math.isfinite(sum(a.max_samples["B"] for a in acts if "B" in a.models))


def test_weighted_votes_stay_in_range_and_are_noiseless_where_answers_agree():
    rng = np.random.default_rng(11)
    A = [["a"] * 8] + [[("a", "b", None)[k] for k in rng.integers(0, 3, 8)] for _ in range(15)]
    B = [["a"] * 6] + [[("a", "c")[k] for k in rng.integers(0, 2, 6)] for _ in range(15)]
    mt = joined({"A": A, "B": B})
    acts = [f"A/lead:m=2@1x4 > B/none@{k} [w=1,{w}]" for k in (1, 2, 4) for w in (0.5, 2)] + \
           [f"A/none@{k} + B/none@2 [w=1,3]" for k in (1, 4)]
    est = estimate_actions(mt, FLOPS, acts, n_orders=30, seed=4)
    assert (est.utility >= -1e-12).all() and (est.utility <= 1 + 1e-12).all()
    np.testing.assert_allclose(est.utility[0], 1.0, atol=1e-12)
    np.testing.assert_array_equal(est.utility_se[0], 0.0)
