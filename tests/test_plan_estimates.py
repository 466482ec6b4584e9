"""Plan estimators: a hand-worked prompt, brute force over ALL sample orders (playing the plan through
Plan.step, the gateway's path), today's maj@k U-statistics for one-wave plans, Monte Carlo within its
standard errors, the solver's LP optimum on plan columns, FLOP costs per request, invariants, errors."""

import functools
import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from isocompute.errors import InputError
from isocompute.flops import ModelFlops, prefill_flops, request_flops
from isocompute.solver.allocate import allocate
from isocompute.solver.estimators import majority_at_k
from isocompute.solver.outcomes import PAD_CODE, from_records
from isocompute.solver.plans.estimates import by_cost, estimate_plans, estimate_table
from isocompute.solver.plans.plan import default_plans, parse_plan, plan_family

MIXED = ["none@3", "lead:m=2@1x5", "lead:m=1@1x3", "window:w=2@1x5", "window:w=2@2x2,1", "window:w=3@3,1,1",
         "beta:p=0.75@1x5", "dirichlet:p=0.6,top=3@1x5", "bayes:B=2,alpha=0.5,top=3@1x2,2,1", "lead:m=2@2,3"]


def brute(codes, correct, tokens, plan):
    """Exact expectations over all n! orders: (utility, samples, waves, tokens), by playing the plan."""
    n = len(codes)
    answers = [None if c < 0 else int(c) for c in codes]

    @functools.cache
    def stop_point(labels):  # where the plan stops depends on the answer sequence only
        for K in plan.boundaries:
            step = plan.step(list(labels[:K]))
            if step.stop:
                return K, step.waves_done
        raise AssertionError("a plan always stops at its last wave")

    @functools.cache
    def value(drawn):  # majority credit and tokens of a set of drawn samples
        votes = {}
        for i in drawn:
            if answers[i] is not None:
                votes.setdefault(answers[i], []).append(i)
        u = Fraction(0)
        if votes:
            top = max(map(len, votes.values()))
            win = [v for v in votes.values() if len(v) == top]
            u = sum(Fraction(sum(bool(correct[i]) for i in v), len(v)) for v in win) / len(win)
        return float(u), sum(tokens[i] for i in drawn)

    us, ks, ws, ts = [], [], [], []
    for perm in itertools.permutations(range(n)):
        K, waves = stop_point(tuple(answers[i] for i in perm[: plan.max_samples]))
        u, t = value(tuple(sorted(perm[:K])))
        us.append(u), ks.append(K), ws.append(waves), ts.append(t)
    count = len(us)
    return math.fsum(us) / count, sum(ks) / count, sum(ws) / count, math.fsum(ts) / count


def check_against_brute(codes, correct, tokens, plans):
    est = estimate_plans(np.array([codes]), np.array([correct]), plans, channels={"t": np.array([tokens], float)})
    for j, plan in enumerate(est.plans):
        want = brute(codes, correct, tokens, plan)
        got = (est.utility[0, j], est.samples[0, j], est.waves[0, j], est.channels["t"][0, j])
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=plan.name)
        assert est.method[j] == "exact" and est.utility_se[0, j] == 0


def test_hand_worked_prompt():
    # [a, a, b], a correct: lead 2 stops after two agreeing samples (2 of 6 orders), else a wins 2-1
    est = estimate_plans([[0, 0, 1]], [[True, True, False]], ["lead:m=2@1x3", "none@2", "none@3"])
    np.testing.assert_allclose(est.utility[0], [1, 2 / 3, 1])
    np.testing.assert_allclose(est.samples[0], [8 / 3, 2, 3])
    np.testing.assert_allclose(est.waves[0], [8 / 3, 1, 1])


@pytest.mark.parametrize(("codes", "correct"), [
    ([0, 0, 1, 1, 2, -1, 0, 3], [1, 1, 0, 0, 0, 0, 1, 0]),      # n = 8: 40,320 orders, nulls, singletons
    ([0, 1, 2, 3, 4, 5, 0], [1, 0, 0, 0, 0, 0, 1]),              # many classes
    ([-1, -1, 0, -1, 0, 1, 1], [0, 0, 1, 0, 1, 0, 0]),           # mostly null
    ([0, 0, 0, 1, 0, 0, 0, 1], [1, 0, 1, 1, 1, 1, 1, 0]),        # inconsistent grading within a class
])
def test_equals_all_orders_fixed_cases(codes, correct):
    tokens = [float(10 + 7 * i) for i in range(len(codes))]
    n = len(codes)
    check_against_brute(codes, [bool(c) for c in correct], tokens, MIXED + [f"lead:m=3@1x{n}", f"window:w=3@1x{n}"])


rules = st.sampled_from(["none", "lead:m=1", "lead:m=2", "lead:m=3", "window:w=1", "window:w=2", "window:w=3",
                         "beta:p=0.7", "beta:p=0.9", "dirichlet:p=0.55,top=3", "dirichlet:p=0.7,top=2",
                         "bayes:B=1,alpha=0.3,top=3", "bayes:B=4,alpha=1,top=2", "boinf:B=3,alpha=0.3",
                         "boinf:B=10,alpha=1"])
tables = st.integers(1, 6).flatmap(lambda n: st.tuples(
    st.lists(st.integers(-1, 3), min_size=n, max_size=n),
    st.lists(st.booleans(), min_size=n, max_size=n),
    st.lists(st.integers(1, 50), min_size=n, max_size=n),
    st.lists(st.tuples(rules, st.lists(st.integers(1, 3), min_size=1, max_size=4)), min_size=1, max_size=3),
))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tables, st.booleans())
def test_equals_all_orders_random(table, consistent):
    codes, correct, tokens, specs = table
    if consistent:
        correct = [c == 0 for c in codes]
    n = len(codes)
    plans = []
    for rule, waves in specs:
        waves = [w for w in itertools.accumulate(waves) if w <= n]
        if waves:  # cumulative sums that fit, back to wave sizes
            sizes = [b - a for a, b in zip([0, *waves], waves, strict=False)]
            plans.append(f"{rule}@{','.join(map(str, sizes))}")
    check_against_brute(codes, correct, [float(t) for t in tokens], plans or [f"none@{n}"])


def test_one_wave_plan_is_todays_majority_at_k():
    rng = np.random.default_rng(3)
    codes = rng.integers(-1, 6, (300, 48))
    codes[rng.random(300) < 0.3] = np.where(rng.random(48) < 0.8, 0, 1)  # near-unanimous prompts too
    correct = rng.random((300, 48)) < 0.4
    ks = [1, 2, 3, 4, 6, 8, 12, 16]
    est = estimate_plans(codes, correct, [f"none@{k}" for k in ks])
    np.testing.assert_allclose(est.utility, majority_at_k(codes, correct, ks), rtol=0, atol=1e-12)
    np.testing.assert_allclose(est.samples, np.broadcast_to(ks, est.samples.shape), rtol=1e-13)


def test_ragged_rows_equal_row_by_row():
    rng = np.random.default_rng(5)
    lengths = [6, 10, 8, 10, 7]
    codes = np.full((5, 10), PAD_CODE)
    correct = np.zeros((5, 10), bool)
    for i, n in enumerate(lengths):
        codes[i, :n] = rng.integers(-1, 3, n)
        correct[i, :n] = codes[i, :n] == 0
    plans = ["lead:m=2@1x6", "window:w=2@2x3", "bayes@1x2,2,2"]
    est = estimate_plans(codes, correct, plans)
    for i, n in enumerate(lengths):
        one = estimate_plans(codes[i, :n], correct[i, :n], plans)
        np.testing.assert_allclose(est.utility[i], one.utility[0], atol=1e-14)
        np.testing.assert_allclose(est.samples[i], one.samples[0], atol=1e-14)


def random_codes(rng, n_prompts, n):
    """LLM-like prompts: a main (correct) answer with a per-prompt share, a few recurring wrong ones,
    one-off answers, 5% nulls."""
    share = rng.beta(0.8, 0.8, (n_prompts, 1))
    codes = np.where(rng.random((n_prompts, n)) < share, 0, rng.integers(1, 4, (n_prompts, n)))
    codes = np.where(rng.random((n_prompts, n)) < 0.1, 4 + np.arange(n), codes)
    codes = np.where(rng.random((n_prompts, n)) < 0.05, -1, codes)
    return codes, codes == 0


def test_monte_carlo_within_three_standard_errors():
    rng = np.random.default_rng(11)
    codes, correct = random_codes(rng, 80, 24)
    tokens = rng.integers(20, 400, codes.shape).astype(float)
    plans = ["lead:m=2@1x12", "window:w=2@2x6", "beta:p=0.9@1x2,2,4,4", "bayes:B=10,alpha=0.3,top=3@1x12", "none@5"]
    kw = dict(channels={"t": tokens})
    exact = estimate_plans(codes, correct, plans, **kw)
    mc = estimate_plans(codes, correct, plans, method="monte-carlo", n_orders=300, seed=4, **kw)
    assert mc.method == ("monte-carlo",) * 5 and mc.n_orders == 300
    for name in ("utility", "samples", "waves"):
        e, m, se = getattr(exact, name), getattr(mc, name), getattr(mc, name + "_se")
        z = (m - e) / np.where(se > 0, se, np.inf)
        assert (np.abs(z) > 3).mean() <= 0.02, name
        spread = np.sqrt((se**2).sum(0)) / len(e)  # SE of the mean over prompts
        assert (np.abs((m - e).mean(0)) <= 3 * spread + 1e-12).all(), (name, (m - e).mean(0) / spread)
    z = (mc.channels["t"] - exact.channels["t"]) / np.maximum(mc.channels_se["t"], 1e-300)
    assert (np.abs(z) > 3).mean() <= 0.02
    again = estimate_plans(codes, correct, plans, method="monte-carlo", n_orders=300, seed=4, **kw)
    np.testing.assert_array_equal(again.utility, mc.utility)  # a fixed seed reproduces


def test_auto_uses_monte_carlo_only_beyond_the_exact_limit():
    rng = np.random.default_rng(2)
    codes, correct = random_codes(rng, 20, 32)
    est = estimate_plans(codes, correct, ["lead:m=2@1x8", "lead:m=2@1x30"], exact_max_samples=24, n_orders=50)
    assert est.method == ("exact", "monte-carlo")
    assert (est.utility_se[:, 0] == 0).all() and (est.utility_se[:, 1] > 0).any()


def test_lp_optimum_on_plan_columns():
    """The unchanged solver prices plans: sorted by each prompt's expected cost, allocate() reaches the
    LP optimum of scipy's HiGHS (which needs no sorting) at several budgets."""
    rng = np.random.default_rng(8)
    codes, correct = random_codes(rng, 40, 16)
    est = estimate_plans(codes, correct, default_plans())
    U, C = est.utility, est.samples
    sorted_ = by_cost(U, C)
    n, a = U.shape
    for budget in np.linspace(C.min(axis=1).mean(), C.max(axis=1).mean(), 6):
        res = allocate(sorted_.utility, sorted_.cost, budget)
        chosen = sorted_.plans_of(res.actions)
        assert U[np.arange(n), chosen].mean() == pytest.approx(
            sorted_.utility[np.arange(n), res.actions].mean(), abs=1e-15)
        lp = linprog(-U.ravel(), A_ub=C.ravel()[None] / 16, b_ub=[n * budget / 16], A_eq=np.kron(np.eye(n), np.ones(a)),
                     b_eq=np.ones(n), bounds=(0, 1), method="highs")
        assert lp.status == 0
        assert res.mean_utility == pytest.approx(-lp.fun / n, rel=1e-9)


def flops_brute(model, plan, tokens, answers, *, caching):
    """Mean FLOPs over all orders, request by request: a wave is one request of n = wave size (its
    prompt prefilled once); with prefix caching only the first request prefills the prompt."""
    total, count = 0.0, 0
    for perm in itertools.permutations(range(len(answers))):
        drawn = 0
        for size in plan.waves:
            wave = [tokens[i] for i in perm[drawn:drawn + size]]
            total += request_flops(model, 17, wave) - (prefill_flops(model, 17) if caching and drawn else 0.0)
            drawn += size
            if plan.step([answers[i] for i in perm[:drawn]]).stop:
                break
        count += 1
    return total / count


def test_flops_per_request_equal_brute_force():
    model = ModelFlops(body_params=1000, head_params=100, n_layers=2, d_attn=16, n_params=1100)
    codes, correct = [0, 1, 0, -1, 0, 1], [True, False, True, False, True, False]
    tokens = [30, 5, 41, 12, 28, 9]
    table = from_records([{"id": "q", "prompt": "p", "gold": "x", "prompt_tokens": 17, "samples": [
        {"answer": None if c < 0 else str(c), "correct": k, "completion_tokens": t}
        for c, k, t in zip(codes, correct, tokens, strict=True)]}])
    plans = ["lead:m=2@1x2,2,2", "none@4", "window:w=2@2x3"]
    est = estimate_table(table, plans, model=model)
    answers = [None if c < 0 else c for c in codes]
    for caching in (True, False):
        cost = est.cost("flops", model=model, prefix_caching=caching)
        for j, name in enumerate(plans):
            want = flops_brute(model, parse_plan(name), tokens, answers, caching=caching)
            assert cost[0, j] == pytest.approx(want, rel=1e-12), (name, caching)
    np.testing.assert_allclose(est.cost("tokens"), est.tokens)
    np.testing.assert_allclose(est.cost("samples"), est.samples)


def test_invariants_and_inputs_untouched():
    rng = np.random.default_rng(4)
    codes, correct = random_codes(rng, 50, 20)
    before = codes.copy(), correct.copy()
    plans = default_plans()
    est = estimate_plans(codes, correct, plans)
    assert np.array_equal(codes, before[0]) and np.array_equal(correct, before[1])
    assert ((est.utility >= -1e-12) & (est.utility <= 1 + 1e-12)).all()
    for j, p in enumerate(est.plans):
        assert (est.samples[:, j] >= p.waves[0] - 1e-9).all() and (est.samples[:, j] <= p.max_samples + 1e-9).all()
        assert (est.waves[:, j] >= 1 - 1e-9).all() and (est.waves[:, j] <= p.n_waves + 1e-9).all()
    # a stricter lead never stops sooner
    lead = estimate_plans(codes, correct, plan_family("lead", m=[1, 2, 3, 4], k_max=12))
    assert (np.diff(lead.samples, axis=1) >= -1e-12).all()
    # a prompt whose every sample agrees stops at the rule's first chance
    una = estimate_plans(np.zeros((1, 10), int), np.ones((1, 10), bool), ["lead:m=2@1x10", "window:w=3@3x3"])
    np.testing.assert_allclose(una.samples[0], [2, 3]) and np.testing.assert_allclose(una.utility[0], [1, 1])


def test_subset_is_the_estimate_of_the_rows():
    rng = np.random.default_rng(9)
    codes, correct = random_codes(rng, 30, 12)
    est = estimate_plans(codes, correct, ["lead:m=2@1x8", "none@2"], channels={"t": np.ones(codes.shape)})
    rows = [3, 0, 17]
    part = est.subset(rows)
    again = estimate_plans(codes[rows], correct[rows], ["lead:m=2@1x8", "none@2"], channels={"t": np.ones((3, 12))})
    np.testing.assert_allclose(part.utility, again.utility, atol=1e-15)
    np.testing.assert_allclose(part.channels["t"], again.channels["t"], atol=1e-13)
    assert part.names == est.names and est.subset(np.arange(30) < 5).utility.shape == (5, 2)


def test_unknown_tokens_stay_unknown_per_prompt():
    tokens = np.array([[10.0, 20, 30, 40], [5, np.nan, 5, 5]])
    est = estimate_plans([[0, 0, 1, 1], [0, 1, 0, 0]], np.ones((2, 4), bool), ["lead:m=2@1x4"], channels={"t": tokens})
    assert np.isfinite(est.channels["t"][0, 0]) and np.isnan(est.channels["t"][1, 0])


@pytest.mark.parametrize(("call", "match"), [
    (lambda: estimate_plans([[0, 1, 0]], [[1, 0, 1]], ["none@4"]), r"draws up to 4 samples but prompt row 0 has only 3"),
    (lambda: estimate_plans([[0, 1, 0]], [[1, 0, 1]], []), "at least one plan"),
    (lambda: estimate_plans([[0, 1, 0]], [[1, 0, 1]], ["none@2"], method="magic"), "method must be"),
    (lambda: estimate_plans(np.zeros((1, 30), int), np.ones((1, 30), bool), ["none@30"], method="exact"),
     "beyond the exact method's 24"),
    (lambda: estimate_plans([[0, 1, 0]], [[1, 0]], ["none@2"]), "must have the same shape"),
    (lambda: estimate_plans([[0, 1, 0]], [[1, 0, 1]], ["none@2"], channels={"t": [[1, 2]]}), "one value per sample"),
    (lambda: estimate_plans([[0, 1, 0]], [[1, 0, 1]], ["none@2"]).tokens, "no completion-token channel"),
    (lambda: estimate_plans([[0, 1, 0]], [[1, 0, 1]], ["none@2"]).cost("flops"), "FLOP costs need"),
    (lambda: estimate_plans([[0, 1, 0]], [[1, 0, 1]], ["none@2"]).cost("joules"), "unknown cost unit"),
])
def test_errors(call, match):
    with pytest.raises(InputError, match=match):
        call()
