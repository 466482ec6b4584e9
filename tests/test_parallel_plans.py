"""Parallel-stop waves: the grammar, the online method, short-m@k's rule, and the estimators of utility,
samples, tokens generated and latency against brute force over ALL sample orders and, inside
parallel-stop waves, ALL finish orders of equal-length samples (each equally likely: ties are broken
uniformly at random), the plan played through Plan.on_finish — the online runner's path."""

import functools
import itertools
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import isocompute.solver.plans.waves as waves_module
from isocompute.errors import InputError
from isocompute.solver.outcomes import PAD_CODE
from isocompute.solver.plans.estimates import TOKENS, estimate_plans
from isocompute.solver.plans.latency import order_stat_means
from isocompute.solver.plans.plan import (
    PARALLEL,
    WAIT,
    Plan,
    default_plans,
    parallel_plans,
    parse_plan,
    parse_waves,
    plan_family,
    schedule_name,
)
from isocompute.solver.plans.rules import FirstRule, parse_rule
from isocompute.solver.plans.waves import simulate_waves

WAITING = ["none@3", "lead:m=2@1x5", "lead:m=2@2,3", "window:w=2@2x2,1", "beta:p=0.75@1x2,3",
           "dirichlet:p=0.6,top=3@2,1,2", "bayes:B=2,alpha=0.5,top=3@1,2,2", "first:m=2@1x4"]
PARALLEL_STOP = ["none@4s", "lead:m=2@5s", "lead:m=1@2s,3s", "window:w=2@4s", "beta:p=0.7@3s,2s",
                 "dirichlet:p=0.6,top=3@5s", "bayes:B=2,alpha=0.5,top=3@2sx2", "first:m=3@5s", "first:m=1@4s"]
MIXED = ["lead:m=2@1,4s", "beta:p=0.75@2s,3", "window:w=2@2,3s", "first:m=2@1,3s"]
ALL = WAITING + PARALLEL_STOP + MIXED
TABLES = [  # (answer codes, correct, lengths): nulls, ties in length, a non-integer table, a unanimous one
    ([0, 1, 0, -1, 2, 0], [1, 0, 1, 0, 0, 1], [3, 5, 5, 2, 5, 3]),
    ([0, 0, 1, 1, -1], [0, 0, 1, 1, 0], [4, 4, 4, 1, 4]),
    ([1, 0, 2, 0, 1, 0], [0, 1, 0, 1, 0, 1], [10, 2.5, 7, 2.5, 10, 6]),
    ([0, 0, 0, 0, 0], [1, 1, 1, 1, 1], [1, 2, 3, 4, 5]),
]
QUANTITIES = ("utility", "samples", "waves", "tokens", "latency", "fired", "finished")


# --------------------------------------------------------------------------------------------- brute force


def credit(answers, correct, finished):
    votes = {}
    for i in finished:
        if answers[i] is not None:
            votes.setdefault(answers[i], []).append(i)
    if not votes:
        return Fraction(0)
    top = max(map(len, votes.values()))
    win = [v for v in votes.values() if len(v) == top]
    return sum(Fraction(sum(bool(correct[i]) for i in v), len(v)) for v in win) / len(win)


def finish_orders(wave, lengths):
    """Every order in which a parallel-stop wave's samples can finish: by length, ties in any order."""
    groups = [list(g) for _, g in itertools.groupby(sorted(wave, key=lambda i: lengths[i]), key=lambda i: lengths[i])]
    return [tuple(itertools.chain(*c)) for c in itertools.product(*(itertools.permutations(g) for g in groups))]


def play(plan, answers, correct, lengths, wave_orders, stop_at):
    """One order through Plan.on_finish: (utility, samples started, waves, tokens generated, latency,
    fired, the finished samples' tokens)."""
    finished, tokens, latency, started = [], 0.0, 0.0, 0
    for wave, order in enumerate(wave_orders):
        started += len(order)
        for i, s in enumerate(order):
            finished.append(s)
            step = stop_at(tuple(answers[x] for x in finished), i < len(order) - 1)
            if step.stop or step.reason == "continue":
                break
        last = lengths[order[i]]
        tokens += sum(lengths[x] for x in order[: i + 1]) + sum(min(lengths[x], last) for x in order[i + 1:])
        latency += last if plan.parallel[wave] else max(lengths[x] for x in order)
        if step.stop:
            return (credit(answers, correct, finished), started, wave + 1, tokens, latency, step.reason == "rule",
                    sum(lengths[x] for x in finished))
    raise AssertionError("a plan always stops")


def brute(codes, correct, lengths, plan):
    """Expectations over all n! orders and, per order, all finish orders of the parallel-stop waves:
    QUANTITIES and their fired parts E[X·1{fired}] (index 7…)."""
    answers = [None if c < 0 else int(c) for c in codes]

    @functools.cache
    def stop_at(seq, running):
        return plan.on_finish(list(seq), running=running)

    total = np.zeros(2 * len(QUANTITIES))
    perms = list(itertools.permutations(range(len(codes))))
    for perm in perms:
        segments, lo = [], 0
        for w, par in zip(plan.waves, plan.parallel, strict=True):
            segments.append(finish_orders(perm[lo:lo + w], lengths) if par else [perm[lo:lo + w]])
            lo += w
        combos = list(itertools.product(*segments))
        for combo in combos:
            x = np.array(play(plan, answers, correct, lengths, combo, stop_at), dtype=float)
            total += np.concatenate([x, x * x[5]]) / len(combos)
    return total / len(perms)


def engine_inputs(codes, correct, lengths):
    codes = np.array([codes])
    G = int(codes.max()) + 1
    values = np.array([[np.mean([c for k, c in zip(codes[0], correct, strict=True) if k == g]) for g in range(G)]])
    L = np.array([lengths], dtype=float)
    return codes, values, L, L[:, :, None]


# --------------------------------------------------------------------------------------------- estimators


@pytest.mark.parametrize("lattice_max", [24, 2])  # 2: the sorted-counts path of long plans
@pytest.mark.parametrize("table", TABLES, ids=["ties", "heavy-ties", "non-integer", "unanimous"])
def test_engine_on_all_orders_equals_brute_force(table, lattice_max, monkeypatch):
    monkeypatch.setattr(waves_module, "LATTICE_MAX", lattice_max)
    codes, correct, lengths = table
    plans = [parse_plan(n) for n in ALL]
    labels, values, L, chans = engine_inputs(codes, correct, lengths)
    orders = np.array(list(itertools.permutations(range(len(codes)))))[None]
    est = simulate_waves(labels, values, L, chans, plans, orders=orders, split=True)
    keys = ("u", "s", "w", "gen", "lat", "f", "fin")
    for j, plan in enumerate(plans):
        want = brute(codes, correct, lengths, plan)
        got = [est.mean[k][0, j] for k in keys] + [est.mean["ch"][0, j, 0]] + \
              [est.mean[k][0, j] for k in ("fu", "fs", "fw", "fgen", "flat", "f", "ffin")]
        np.testing.assert_allclose(got, [*want[:7], want[6], *want[7:]], rtol=1e-12, atol=1e-12, err_msg=plan.name)
    lean = simulate_waves(labels, values, L, chans[:, :, :0], plans, orders=orders, split=True,
                          wants=[("s", "gen", "lat", "gap", "fdef")] * len(plans))  # no credit: counts skipped if they can be
    for key in ("s", "gen", "lat", "gap", "fdef"):
        np.testing.assert_array_equal(lean.mean[key], est.mean[key], err_msg=key)
    assert not lean.mean["u"].any()


def padded(tables):
    n = max(len(t[0]) for t in tables)
    pad = lambda xs, v: [list(x) + [v] * (n - len(x)) for x in xs]  # noqa: E731
    return (np.array(pad([t[0] for t in tables], PAD_CODE)), np.array(pad([t[1] for t in tables], False), bool),
            np.array(pad([t[2] for t in tables], 0.0), float))


def test_estimates_equal_brute_force_exactly_or_within_their_standard_errors():
    codes, correct, lengths = padded(TABLES)
    est = estimate_plans(codes, correct, ALL, channels={TOKENS: lengths}, split=True, n_orders=4000, seed=11)
    for i, (c, r, L) in enumerate(TABLES):
        for j, plan in enumerate(est.plans):
            want = brute(c, r, L, plan)
            f = est.fired
            got = np.array([est.utility[i, j], est.samples[i, j], est.waves[i, j], est.generated_tokens[i, j],
                            est.latency[i, j], f.prob[i, j], est.channels[TOKENS][i, j], f.utility[i, j],
                            f.samples[i, j], f.waves[i, j], f.generated_tokens[i, j], f.latency[i, j], f.prob[i, j],
                            f.channels[TOKENS][i, j]])
            se = np.array([est.utility_se[i, j], est.samples_se[i, j], est.waves_se[i, j],
                           est.generated_tokens_se[i, j], est.latency_se[i, j], f.prob_se[i, j],
                           est.channels_se[TOKENS][i, j], f.utility_se[i, j], f.samples_se[i, j], f.waves_se[i, j],
                           f.generated_tokens_se[i, j], f.latency_se[i, j], f.prob_se[i, j],
                           f.channels_se[TOKENS][i, j]])
            exact = se == 0
            np.testing.assert_allclose(got[exact], want[exact], rtol=1e-10, atol=1e-10, err_msg=f"{plan.name} {i}")
            z = (got[~exact] - want[~exact]) / se[~exact]
            assert np.all(np.abs(z) < 5), (plan.name, i, got, want, se)


def test_which_estimates_are_exact():
    codes, correct, lengths = padded(TABLES)
    est = estimate_plans(codes, correct, ALL, channels={TOKENS: lengths}, n_orders=50)
    by = dict(zip(est.names, zip(est.method, est.latency_method, strict=True), strict=True))
    assert by["lead:m=2@1x5"] == ("exact", "exact")  # single-sample waves after the first: latency = tokens
    assert by["lead:m=2@2,3"] == ("exact", "monte-carlo")  # a later wave of 3: its max is Monte Carlo
    assert by["none@4s"] == ("exact", "exact") and by["none@3"] == ("exact", "exact")
    assert by["first:m=3@5s"] == ("monte-carlo", "exact")  # short-m@k: tokens and latency by order statistics
    assert by["lead:m=2@5s"] == ("monte-carlo", "monte-carlo")
    j = est.names.index("lead:m=2@1x5")
    assert np.all(est.latency_se[:, j] == 0) and np.all(est.generated_tokens_se[:, j] == 0)


def test_hand_worked_example_of_the_plan_docstring():
    # (a, 300), (b, 120), (a, 200), (a, 900), a correct: they finish b, a, a, a whatever the order
    codes, correct, lengths = [[0, 1, 0, 0]], [[True, False, True, True]], [[300, 120, 200, 900]]
    est = estimate_plans(codes, correct, ["lead:m=2@4s", "lead:m=1@4s", "first:m=3@4s"], channels={TOKENS: lengths})
    np.testing.assert_allclose(est.utility[0], [1, 0, 1])
    np.testing.assert_allclose(est.generated_tokens[0], [1520, 480, 920])
    np.testing.assert_allclose(est.latency[0], [900, 120, 300])
    np.testing.assert_allclose(est.samples[0], [4, 4, 4])
    np.testing.assert_allclose(est.channels[TOKENS][0], [1520, 120, 620])  # the finished samples' tokens
    assert np.all(est.utility_se == 0) and np.all(est.latency_se == 0)  # one finish order: no spread
    np.testing.assert_allclose(est.total_latency(50.0)[0], [950, 170, 350])


def test_order_statistics_worked_example():
    L = np.array([[2, 3, 3, 5, 5, 5, np.nan]])
    assert order_stat_means(L, 2, 2)[0] == pytest.approx(69 / 15)
    assert order_stat_means(L, 2, 1)[0] == pytest.approx(46 / 15)
    subsets = list(itertools.combinations([2, 3, 3, 5, 5, 5], 4))
    for i in range(1, 5):
        assert order_stat_means(L, 4, i)[0] == pytest.approx(np.mean([sorted(s)[i - 1] for s in subsets]))


def test_waiting_plans_keep_every_existing_output_and_gain_tokens_and_latency():
    rng = np.random.default_rng(5)
    codes = rng.integers(-1, 4, size=(40, 20))
    correct = rng.random((40, 20)) < 0.5
    lengths = rng.integers(1, 30, size=(40, 20)).astype(float)
    plans = default_plans()
    old = estimate_plans(codes, correct, plans, channels={"t": lengths}, split=True)
    new = estimate_plans(codes, correct, plans, channels={"t": lengths, TOKENS: lengths}, split=True)
    assert old.method == new.method and old.generated_tokens is None and old.latency is None
    for a, b in ((old.utility, new.utility), (old.samples, new.samples), (old.waves, new.waves),
                 (old.channels["t"], new.channels["t"]), (old.channels["t"], new.tokens),
                 (old.fired.prob, new.fired.prob), (old.fired.utility, new.fired.utility)):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-13)
    assert np.array_equal(new.tokens, new.channels[TOKENS])  # waiting plans: every drawn sample's tokens
    assert np.all(new.latency <= new.generated_tokens + 1e-9) and np.all(new.latency > 0)
    j = new.names.index("none@16")
    np.testing.assert_allclose(new.latency[:, j], order_stat_means(lengths, 16, 16))


def test_parallel_stop_never_costs_more_than_waiting_for_the_same_wave():
    rng = np.random.default_rng(2)
    codes = rng.integers(-1, 3, size=(30, 16))
    lengths = rng.integers(1, 50, size=(30, 16)).astype(float)
    names = [f"{r}@{k}{s}" for r in ("lead:m=2", "beta:p=0.9", "first:m=3") for k in (4, 8) for s in ("", "s")]
    est = estimate_plans(codes, codes == 0, names, channels={TOKENS: lengths}, n_orders=200)
    for j in range(0, len(names), 2):  # waiting (exact), then parallel-stop (Monte Carlo: a few SEs' slack)
        assert np.all(est.samples[:, j] == est.samples[:, j + 1])
        for x, se in ((est.generated_tokens, est.generated_tokens_se), (est.latency, est.latency_se)):
            assert np.all(x[:, j + 1] <= x[:, j] + 4 * se[:, j + 1] + 1e-9)
        assert np.all(est.latency[:, j + 1] <= est.generated_tokens[:, j + 1] + 1e-9)


def test_subsets_and_unknown_lengths():
    codes, correct, lengths = padded(TABLES)
    lengths[1, 0] = np.nan
    est = estimate_plans(codes, correct, ["lead:m=2@5s", "lead:m=2@1x5"], channels={TOKENS: lengths}, split=True)
    assert np.all(np.isnan(est.utility[1, 0])) and np.isnan(est.latency[1]).all() and np.isnan(est.tokens[1]).all()
    assert np.isfinite(est.utility[1, 1]) and np.isfinite(est.latency[[0, 2, 3]]).all()
    sub = est.subset([3, 0])
    assert np.array_equal(sub.latency, est.latency[[3, 0]]) and sub.latency_method == est.latency_method
    assert np.array_equal(sub.fired.latency, est.fired.latency[[3, 0]])


@pytest.mark.parametrize(("call", "match"), [
    (lambda: estimate_plans([[0, 1, 0]], [[1, 0, 1]], ["lead:m=2@3s"]), "stops mid-wave.*completion_tokens"),
    (lambda: estimate_plans([[0, 1, 0]], [[1, 0, 1]], ["lead:m=2@3s"], channels={TOKENS: [[1, 2, 3]]},
                            method="exact"), "only Monte Carlo"),
    (lambda: estimate_plans([[0, 1, 0]], [[1, 0, 1]], ["none@3"]).total_latency(), "no latency"),
])
def test_estimator_errors(call, match):
    with pytest.raises(InputError, match=match):
        call()


# --------------------------------------------------------------------------------------------- grammar


def test_names_of_parallel_stop_plans():
    assert parse_plan("lead:m=2@8s") == Plan((8,), parse_rule("lead:m=2"), (PARALLEL,))
    assert parse_plan("lead:m=2@4s,8s").modes == (PARALLEL, PARALLEL)
    assert parse_plan("beta:p=0.9@4sx2").waves == (4, 4) and parse_plan("beta:p=0.9@4sx2").name == "beta:p=0.9@4sx2"
    mixed = parse_plan("lead:m=2@1x2,4s,8")
    assert mixed.waves == (1, 1, 4, 8) and mixed.parallel == (False, False, True, False)
    assert mixed.name == "lead:m=2@1x2,4s,8" and parse_plan("first:m=3@8s").rule == FirstRule(3)
    assert parse_plan("none@4") == Plan((4,)) and Plan((4,)).modes == (WAIT,)
    assert all(parse_plan(p.name) == p and p.modes == (WAIT,) * p.n_waves for p in default_plans())
    assert parse_plan("lead:m=2@4s,8s").capped(max_samples=6).name == "lead:m=2@4s,2s"


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 9), st.booleans()), min_size=1, max_size=10))
def test_schedules_with_modes_round_trip(items):
    waves = tuple(w for w, _ in items)
    modes = tuple(PARALLEL if p else WAIT for _, p in items)
    assert parse_waves(schedule_name(waves, modes)) == (waves, modes)


def test_parallel_menu():
    plans = parallel_plans()
    names = [p.name for p in plans]
    assert len(names) == len(set(names)) == 31 and all(parse_plan(n) == p for n, p in zip(names, plans, strict=True))
    assert all(all(p.parallel) and p.stops_in_wave for p in plans) and max(p.max_samples for p in plans) == 16
    assert {p.rule.kind for p in plans} == {"lead", "window", "beta", "dirichlet", "bayes", "first"}
    assert {p.n_waves for p in plans} == {1, 2, 3} and "first:m=3@8s" in names and "lead:m=2@2s,4s,8s" in names
    assert len(default_plans()) == 30 and not any(any(p.parallel) for p in default_plans())
    assert [p.name for p in plan_family("window", w=2, k_max=(4, 8), mode="parallel-stop")] == \
        ["window:w=2@4s", "window:w=2@8s"]


def test_on_finish_worked_examples():
    plan = parse_plan("lead:m=2@3s,4")
    assert plan.on_finish(["a"], running=True).reason == "running"
    fired = plan.on_finish(["a", "a"], running=True)  # the parallel-stop wave stops at its second finish
    assert fired.stop and fired.reason == "rule" and fired.waves_done == 1 and fired.decision.most_common == "a"
    end = plan.on_finish(["a", "b", "c"], running=False)  # the wave's last finish is a step
    assert end == plan.step(["a", "b", "c"]) and end.reason == "continue" and end.next_wave == 4
    waiting = plan.on_finish(list("abcaa"), running=True)  # a waiting wave is not checked mid-way
    assert not waiting.stop and waiting.reason == "running" and waiting.waves_done == 1 and waiting.decision.stop
    assert plan.on_finish(list("abcaaab"), running=False).reason == "rule"
    with pytest.raises(InputError, match="none can be running"):
        plan.on_finish(list("abcaaab"), running=True)


def test_first_rule_counts_nulls_and_stops_without_votes():
    rule = parse_rule("first:m=2")
    assert rule.name == "first:m=2" and not rule.should_stop([None]).stop
    d = rule.should_stop([None, None])
    assert d.stop and d.most_common is None and d.prob == 2
    assert rule.should_stop(["a", None, "b"]).stop


@pytest.mark.parametrize(("text", "match"), [
    ("lead:m=2@4q", "not N or NxCOUNT"),
    ("lead:m=2@s4", "not N or NxCOUNT"),
    ("lead:m=2@4ss", "Ns or NsxCOUNT"),
    ("first:m=0@4s", "m must be an integer >= 1"),
])
def test_grammar_errors(text, match):
    with pytest.raises(InputError, match=match):
        parse_plan(text)


def test_plan_errors():
    with pytest.raises(InputError, match="one mode per wave"):
        Plan((4, 4), parse_rule("lead"), (PARALLEL,))
    with pytest.raises(InputError, match="mode must be"):
        plan_family("lead", mode="eager")


def test_long_plans_and_the_sorted_counts_path_agree_with_the_lattice_path(monkeypatch):
    rng = np.random.default_rng(8)
    codes = rng.integers(-1, 5, size=(25, 30))
    lengths = rng.integers(1, 40, size=(25, 30)).astype(float)
    names = ["lead:m=2@1x2,2,4,8", "window:w=3@3x5,1", "lead:m=2@1x26", "lead:m=2@8s", "bayes:B=5@26s",
             "first:m=3@4s,8s", "beta:p=0.9@2s,4s,8s,12"]
    kw = dict(channels={TOKENS: lengths}, split=True, n_orders=30, seed=4)
    fast = estimate_plans(codes, codes == 1, names, **kw)
    monkeypatch.setattr(waves_module, "LATTICE_MAX", 1)  # every walk sorts the counts
    slow = estimate_plans(codes, codes == 1, names, **kw)
    for a, b in ((fast.utility, slow.utility), (fast.latency, slow.latency), (fast.tokens, slow.tokens),
                 (fast.fired.prob, slow.fired.prob), (fast.fired.latency, slow.fired.latency)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-9)
    assert np.all(fast.latency <= fast.tokens + 1e-9) and np.all(fast.latency_se[:, 3:] > 0)
