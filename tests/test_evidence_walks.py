"""isocompute.policy.evidence: walks against brute force over every sample order (and the solver's own
estimates of a lead rule), walk_features against state_features (the gateway's path), the continuation
labels' horizons, the chain's LP and price choice against brute force, the evidence rule through
Plan.on_finish with tiny fitted heads, and the EvidenceModel's JSON and budget lookups."""

from __future__ import annotations

import itertools
import json
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import isocompute.policy.evidence.continuation as continuation
from isocompute.errors import InputError
from isocompute.policy.evidence.chain import ChainEntry, best_fixed_mix, chain_entry, choose_price
from isocompute.policy.evidence.continuation import HORIZONS, Heads, continuation_labels
from isocompute.policy.evidence.crossfit import Values, predict_walks, train_heads
from isocompute.policy.evidence.features import NAMES, state_features, walk_features
from isocompute.policy.evidence.model import EvidenceModel
from isocompute.policy.evidence.rule import EvidenceRule
from isocompute.policy.evidence.walks import walk
from isocompute.solver.outcome_table import from_records
from isocompute.solver.plans.estimates import estimate_table
from isocompute.solver.plans.plan import PARALLEL, Plan

SCHEDULES = [(2,), (1, 2), (2, 2), (3,), (1, 1, 1)]


# --------------------------------------------------------------------------------------------- brute force


def credit(codes, class_correct):
    """Majority credit of the votes ``codes`` (−1 null): share of right classes among the tied leaders."""
    votes = {}
    for c in codes:
        if c >= 0:
            votes[c] = votes.get(c, 0) + 1
    if not votes:
        return Fraction(0)
    top = max(votes.values())
    lead = [c for c, v in votes.items() if v == top]
    return Fraction(sum(bool(class_correct.get(c, False)) for c in lead), len(lead))


def exact_checkpoints(codes, correct, lengths, waves, unit):
    """Exact expectations (utility, tokens, latency) per check point over all n! orders: the order fills the
    waves, each wave finishes in stable length order. Independent of walks.py's vectorised code."""
    n, M = len(codes), sum(waves)
    class_correct = {}
    for c, y in zip(codes, correct, strict=True):
        if c >= 0:
            class_correct[c] = class_correct.get(c, False) or bool(y)
    sums = np.zeros((3, M), dtype=object)
    sums[:] = Fraction(0)
    count = 0
    for perm in itertools.permutations(range(n)):
        finished, done_latency, start = [], Fraction(0), 0
        for w in waves:
            wave = sorted(perm[start:start + w], key=lambda i: lengths[i])  # stable: ties in perm order
            for k, s in enumerate(wave):
                finished.append(s)
                Ls = Fraction(lengths[s]) / unit
                t = len(finished) - 1
                running = w - k - 1
                tok = sum(Fraction(lengths[i]) / unit for i in finished) + running * Ls
                sums[0, t] += credit([codes[i] for i in finished], class_correct)
                sums[1, t] += tok
                sums[2, t] += done_latency + Ls
            done_latency += Fraction(lengths[wave[-1]]) / unit
            start += w
        count += 1
    return np.array([[float(x / count) for x in row] for row in sums])


@st.composite
def prompts(draw):
    waves = draw(st.sampled_from(SCHEDULES))
    n = draw(st.integers(sum(waves), 5))
    codes = draw(st.lists(st.integers(-1, 2), min_size=n, max_size=n))
    right = draw(st.integers(0, 2))
    correct = [c == right for c in codes]
    lengths = draw(st.lists(st.integers(1, 6), min_size=n, max_size=n))  # small ints: ties in length
    return codes, correct, lengths, waves


@settings(max_examples=25, deadline=None)
@given(prompts(), st.integers(0, 2**16))
def test_walk_means_match_exact_enumeration_of_orders(prompt, seed):
    codes, correct, lengths, waves = prompt
    unit, draws = 2.0, 3000
    w = walk([codes], [correct], [lengths], np.array([len(codes)]), waves, unit=unit, draws=draws, seed=seed)
    exact = exact_checkpoints(codes, correct, lengths, waves, unit)
    for q, got in enumerate((w.utility, w.tokens, w.latency)):
        mean, se = got.mean(axis=0), got.std(axis=0, ddof=1) / math.sqrt(draws)
        assert np.all(np.abs(mean - exact[q]) <= 5 * se + 1e-9), (q, mean, exact[q], se)
    # per draw: the bookkeeping the docstring promises
    M = sum(waves)
    bounds = np.cumsum((0,) + waves)
    assert w.wave.tolist() == np.repeat(np.arange(len(waves)), waves).tolist()
    assert w.running.tolist() == [int(bounds[w.wave[t] + 1] - t - 1) for t in range(M)]
    assert np.allclose(w.lengths * unit, np.asarray(lengths, dtype=float)[w.order])
    assert np.array_equal(w.codes, np.asarray(codes)[w.order])
    assert all(len(set(row)) == M for row in w.order.tolist())  # without replacement
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        assert np.all(np.diff(w.lengths[:, a:b], axis=1) >= 0)


def test_walk_docstring_worked_example():
    w = walk([[0, 1, 0, 0]], [[1, 0, 1, 1]], [[300, 120, 200, 900]], np.array([4]), (4,), unit=100, draws=5, seed=3)
    for d in range(5):
        assert w.order[d].tolist() == [1, 2, 0, 3]
        assert np.allclose(w.tokens[d], (4.8, 7.2, 9.2, 15.2))
        assert np.allclose(w.latency[d], (1.2, 2, 3, 9))
        assert np.allclose(w.utility[d], (0, 0.5, 1, 1))
    assert w.running.tolist() == [3, 2, 1, 0] and w.unit == 100.0


def test_walk_padding_and_errors():
    # a ragged pair: the second prompt has 3 samples, padded with codes < −1 and NaN lengths
    codes = [[0, 1, 0, 1], [1, 0, 0, -2]]
    lengths = [[1, 2, 3, 4], [5, 6, 7, np.nan]]
    w = walk(codes, [[1, 0, 1, 0], [0, 1, 1, 0]], lengths, np.array([4, 3]), (3,), unit=1.0, draws=200, seed=0)
    assert np.all(w.order[w.prompt == 1] < 3)
    assert np.isfinite(w.tokens).all()
    with pytest.raises(InputError, match="at least 4 samples"):
        walk(codes, [[1, 0, 1, 0], [0, 1, 1, 0]], lengths, np.array([4, 3]), (4,), unit=1.0, draws=2, seed=0)
    with pytest.raises(InputError, match="completion_tokens"):
        walk([[0, 1]], [[1, 0]], [[1, np.nan]], np.array([2]), (2,), unit=1.0, draws=2, seed=0)


# --------------------------------------------------------------------------------------------- vs the solver


def _table(seed, N=6, n=6):
    rng = np.random.default_rng(seed)
    recs = []
    for i in range(N):
        ans = rng.choice(["x", "y", "z", None], size=n, p=[0.45, 0.3, 0.15, 0.1])
        recs.append({"id": f"p{i}", "prompt": f"q{i}", "gold": "x", "samples": [
            {"answer": a, "correct": a == "x", "completion_tokens": int(rng.integers(1, 12))} for a in ans]})
    return from_records(recs)


@pytest.mark.parametrize("seed", [0, 1])
def test_lead_rule_on_walks_matches_estimate_table(seed):
    table = _table(seed)
    m, waves, unit, draws = 2, (4,), 3.0, 4000
    est = estimate_table(table, ["lead:m=2@4s"], n_orders=4000, seed=seed)
    w = walk(table.answer_codes, table.correct, table.completion_tokens, table.n_samples, waves, unit=unit,
             draws=draws, seed=seed + 11)
    srt = np.sort(w.counts(), axis=-1)
    lead = srt[..., -1] - (srt[..., -2] if srt.shape[-1] > 1 else 0)
    stop = lead >= m
    stop[:, -1] = True
    t = stop.argmax(axis=1)
    r = np.arange(t.size)
    for got, ref, ref_se in ((w.utility[r, t], est.utility[:, 0], est.utility_se[:, 0]),
                             (w.tokens[r, t] * unit, est.generated_tokens[:, 0], est.generated_tokens_se[:, 0]),
                             (w.latency[r, t] * unit, est.latency[:, 0], est.latency_se[:, 0])):
        per = got.reshape(len(table), draws)
        se = np.sqrt(per.var(axis=1, ddof=1) / draws + ref_se ** 2)
        assert np.all(np.abs(per.mean(axis=1) - ref) <= 5 * se + 1e-9), (per.mean(axis=1), ref, se)


# --------------------------------------------------------------------------------------------- features


def _state_rows(w, d, unit, conf=None):
    """state_features at every check point of walk row d, fed as the gateway would (tokens, not units)."""
    names = [f"c{g}" for g in range(10)]  # sorted by str in code order, as state_features sorts
    out = []
    for t in range(w.n_checks):
        classes = [None if c < 0 else names[c] for c in w.codes[d, :t + 1]]
        confidence = None if conf is None else [None if np.isnan(x) else float(x) for x in conf[d, :t + 1]]
        out.append(state_features(classes, list(w.lengths[d, :t + 1] * unit), running=int(w.running[t]),
                                  wave=int(w.wave[t]), tokens=float(w.tokens[d, t] * unit),
                                  latency=float(w.latency[d, t] * unit), unit=unit, confidence=confidence))
    return np.array(out)


@settings(max_examples=40, deadline=None)
@given(prompts(), st.integers(0, 2**16), st.sampled_from(["none", "some", "all"]))
def test_state_features_equal_walk_features(prompt, seed, conf_kind):
    codes, correct, lengths, waves = prompt
    unit = 3.0
    w = walk([codes], [correct], [lengths], np.array([len(codes)]), waves, unit=unit, draws=6, seed=seed)
    conf = None
    if conf_kind != "none":
        rng = np.random.default_rng(seed)
        per_sample = rng.uniform(-2, 0, len(codes))
        if conf_kind == "some":
            per_sample[rng.random(len(codes)) < 0.3] = np.nan
        conf = per_sample[w.order]
    X = walk_features(w, conf)
    assert X.shape == (6, sum(waves), len(NAMES))
    for d in range(6):
        got = _state_rows(w, d, unit, conf)
        np.testing.assert_allclose(got, X[d], rtol=1e-12, atol=1e-12, equal_nan=True)


def test_conf_leader_before_any_confidence_matches():
    w = walk([[0, 0, 1]], [[1, 1, 0]], [[1, 2, 3]], np.array([3]), (3,), unit=1.0, draws=1, seed=0)
    conf = np.array([[np.nan, -1.0, -0.5]])  # the first finisher (length 1) has none
    X = walk_features(w, conf)
    got = _state_rows(w, 0, 1.0, conf)
    np.testing.assert_allclose(got, X[0], equal_nan=True)


def test_features_worked_example_tie_break_and_nulls():
    col = {k: i for i, k in enumerate(NAMES)}
    x = state_features(["a", "a"], [120, 200], running=2, wave=0, tokens=720, latency=200, unit=100)
    assert x[col["finished"]] == 2 and x[col["running"]] == 2 and x[col["top1"]] == 2 and x[col["margin"]] == 2
    assert x[col["share"]] == 1 and x[col["first_leads"]] == 1 and x[col["last_leads"]] == 1
    assert x[col["log_now"]] == pytest.approx(math.log(2)) and x[col["log_first"]] == pytest.approx(math.log(1.2))
    assert x[col["since_first"]] == pytest.approx(0.8) and math.isnan(x[col["log_other"]])
    assert x[col["tokens"]] == pytest.approx(7.2) and x[col["latency"]] == pytest.approx(2.0)
    assert math.isnan(x[col["conf_leader"]]) and math.isnan(x[col["conf_min"]])
    # tie on votes: the leader is the class with the shorter mean log length ("b" here though "a" came first)
    x = state_features(["a", "b", None], [300, 100, 50], running=0, wave=1, tokens=450, latency=300, unit=100,
                       confidence=[-1.0, -0.5, None])
    assert x[col["top1"]] == 1 and x[col["top2"]] == 1 and x[col["margin"]] == 0 and x[col["nulls"]] == 1
    assert x[col["classes"]] == 2 and x[col["share"]] == 0.5
    assert x[col["first_leads"]] == 0 and x[col["last_leads"]] == 0  # the last finisher has no answer
    assert x[col["log_leader"]] == pytest.approx(0.0)  # b: length 1 unit
    assert x[col["log_other"]] == pytest.approx((math.log(3) + math.log(0.5)) / 2)  # a and the null
    assert x[col["conf_leader"]] == pytest.approx(-0.5) and x[col["conf_min"]] == pytest.approx(-1.0)
    # nothing but nulls: no leader, share 0
    x = state_features([None], [100], running=1, wave=0, tokens=200, latency=100, unit=100)
    assert x[col["top1"]] == 0 and x[col["share"]] == 0 and x[col["first_leads"]] == 0
    assert math.isnan(x[col["log_leader"]]) and x[col["log_other"]] == pytest.approx(0.0)


# --------------------------------------------------------------------------------------------- continuation


def test_continuation_label_horizons_on_schedule_2_3():
    rng = np.random.default_rng(0)
    codes = rng.integers(-1, 3, (3, 7))
    lengths = rng.integers(1, 9, (3, 7)).astype(float)
    w = walk(codes, codes == 0, lengths, np.array([7, 7, 7]), (2, 3), unit=2.0, draws=4, seed=1)
    assert w.running.tolist() == [1, 0, 2, 1, 0]
    ends = {1: [1, 2, 3, 4, 4], -1: [1, 4, 4, 4, 4], 0: [4, 4, 4, 4, 4], 2: [2, 3, 4, 4, 4]}
    horizons = (1, -1, 0, 2)
    lab = continuation_labels(w, horizons)
    for name, x in (("gain", w.utility), ("tokens", w.tokens), ("latency", w.latency)):
        assert lab[name].shape == (12, 5, 4)
        for h, K in enumerate(horizons):
            assert np.array_equal(lab[name][:, :, h], x[:, ends[K]] - x), (name, K)
    assert np.all(lab["tokens"] >= -1e-12) and np.all(lab["latency"] >= -1e-12)
    assert np.all(lab["gain"][:, -1] == 0)


# --------------------------------------------------------------------------------------------- chain


def brute_mix(U, T, L, t_max, l_max):
    """Best mixture value by enumerating LP vertices: single plans, pairs on an active budget, and (with a
    latency budget) triples with both budgets active."""
    u, tt, ll = U.mean(axis=0), T.mean(axis=0), L.mean(axis=0)
    eps = 1e-9

    def ok(p, idx):
        return tt[idx] @ p <= t_max + 1e-7 and (l_max is None or ll[idx] @ p <= l_max + 1e-7)

    best = None
    P = len(u)
    cands = []
    for j in range(P):
        cands.append(([j], np.array([1.0])))
    for i, j in itertools.combinations(range(P), 2):
        for c, b in ((tt, t_max), (ll, l_max)):
            if b is None or abs(c[i] - c[j]) < eps:
                continue
            a = (b - c[j]) / (c[i] - c[j])
            if -eps <= a <= 1 + eps:
                a = min(max(a, 0.0), 1.0)
                cands.append(([i, j], np.array([a, 1 - a])))
    if l_max is not None:
        for idx in itertools.combinations(range(P), 3):
            A = np.vstack([np.ones(3), tt[list(idx)], ll[list(idx)]])
            if abs(np.linalg.det(A)) < 1e-12:
                continue
            p = np.linalg.solve(A, [1.0, t_max, l_max])
            if np.all(p >= -1e-9):
                cands.append((list(idx), np.clip(p, 0, None)))
    for idx, p in cands:
        if ok(p, idx):
            v = float(u[idx] @ p)
            best = v if best is None else max(best, v)
    return best


@st.composite
def instances(draw):
    N = draw(st.integers(1, 4))
    P = draw(st.integers(1, 5))
    vals = st.integers(0, 20)
    U = np.array(draw(st.lists(st.lists(vals, min_size=P, max_size=P), min_size=N, max_size=N))) / 20
    T = 1 + np.array(draw(st.lists(st.lists(vals, min_size=P, max_size=P), min_size=N, max_size=N))) / 4
    L = 0.5 + np.array(draw(st.lists(st.lists(vals, min_size=P, max_size=P), min_size=N, max_size=N))) / 8
    t_max = draw(st.integers(4, 28)) / 4
    l_max = draw(st.one_of(st.none(), st.integers(4, 24).map(lambda x: x / 8)))
    return U, T, L, t_max, l_max


@settings(max_examples=150, deadline=None)
@given(instances())
def test_best_fixed_mix_matches_brute_force(inst):
    U, T, L, t_max, l_max = inst
    got = best_fixed_mix(U, T, L, t_max, l_max)
    ref = brute_mix(U, T, L, t_max, l_max)
    if ref is None:
        assert got is None
        return
    assert got is not None
    plans, w = got
    assert np.all(w > 0) and w.sum() == pytest.approx(1.0)
    assert (T[:, plans] @ w).mean() <= t_max + 1e-6
    if l_max is not None:
        assert (L[:, plans] @ w).mean() <= l_max + 1e-6
    assert (U[:, plans] @ w).mean() == pytest.approx(ref, abs=1e-7)


@settings(max_examples=100, deadline=None)
@given(instances())
def test_choose_price_is_best_within_both_budgets(inst):
    U, T, L, budget, lat = inst
    j = choose_price(U, T, L, budget, lat)
    ok = [k for k in range(U.shape[1]) if T[:, k].mean() <= budget and (lat is None or L[:, k].mean() <= lat)]
    if not ok:
        assert j is None
        return
    assert j in ok
    assert U[:, j].mean() == max(U[:, k].mean() for k in ok)


def _values(U, T, L, prices):
    return Values(tuple(prices), U, T, L, (np.zeros(0), np.zeros(0)))


def test_chain_entry_keeps_evidence_only_when_it_clearly_dominates():
    rng = np.random.default_rng(0)
    N = 60
    FU = np.stack([rng.uniform(0.3, 0.6, N), rng.uniform(0.5, 0.9, N), rng.uniform(0.9, 1.0, N)], axis=1)
    FT = np.stack([np.full(N, 1.0), np.full(N, 2.0), np.full(N, 8.0)], axis=1)
    FL = np.stack([np.full(N, 1.0), np.full(N, 1.0), np.full(N, 3.0)], axis=1)
    fixed = (FU, FT, FL)
    prices = [(0.02, 0.0), (0.01, 0.0), (0.001, 0.0)]
    # the learned rule at price 1 plays exactly the fixed plan 1 (equal), price 2 is over budget
    LU = np.stack([FU[:, 0], FU[:, 1], FU[:, 2]], axis=1)
    LT = FT.copy()
    LL = FL.copy()
    e = chain_entry(_values(LU, LT, LL, prices), fixed, 2.0, None, seed=1)
    assert e.rule == "fixed_plan" and e.price is None and e.lam is None
    assert e.fixed_plans == (1,) and e.fixed_weights == (1.0,)
    assert e.gain == pytest.approx(0.0) and e.gain_low <= 0
    assert e.utility == pytest.approx(FU[:, 1].mean()) and e.tokens == pytest.approx(2.0) and e.prompts == N
    # learned +0.1 ± 0.02 per prompt at the same tokens and latency: kept
    LU2 = LU.copy()
    LU2[:, 1] += 0.1 + rng.uniform(-0.02, 0.02, N)
    e = chain_entry(_values(LU2, LT, LL, prices), fixed, 2.0, None, seed=1)
    assert e.rule == "evidence" and e.price == 1 and (e.lam, e.mu) == (0.01, 0.0)
    assert e.gain == pytest.approx(0.1, abs=0.01) and e.gain_low > 0.05
    assert e.utility == pytest.approx(LU2[:, 1].mean()) and e.tokens == pytest.approx(2.0)
    assert e.fixed_plans == (1,)  # the rival
    # a latency budget the learned prices all miss: the fixed plan serves, no gain measured
    e = chain_entry(_values(LU2, LT, LL + 5.0, prices), fixed, 2.0, 1.5, seed=1)
    assert e.rule == "fixed_plan" and e.gain is None and e.gain_low is None and e.latency_budget == 1.5
    # a budget no fixed plan fits: the cheapest fixed plan is the fallback
    e = chain_entry(_values(LU2, LT, LL, prices), fixed, 0.5, None, seed=1)
    assert e.rule == "fixed_plan" and e.fixed_plans == (0,)
    assert ChainEntry.from_dict(json.loads(json.dumps(e.to_dict()))) == e


# --------------------------------------------------------------------------------------------- rule and heads


def _synthetic_walk(seed=0, N=40, n=8, waves=(2, 2), draws=12, unit=5.0):
    """Right answers (class 0) short and common, wrong ones long: more samples help on average."""
    rng = np.random.default_rng(seed)
    codes = np.where(rng.random((N, n)) < 0.55, 0, rng.integers(1, 4, (N, n)))
    codes[rng.random((N, n)) < 0.05] = -1
    lengths = np.where(codes == 0, rng.integers(2, 6, (N, n)), rng.integers(4, 12, (N, n))).astype(float)
    return walk(codes, codes == 0, lengths, np.full(N, n), waves, unit=unit, draws=draws, seed=seed)


@pytest.fixture(scope="module")
def heads():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(continuation, "ROUNDS", 5)
        w = _synthetic_walk()
        return train_heads(w, seed=0), w


EVIDENCE = {"lengths": [15.0], "running": 1, "wave": 0, "tokens": 30.0, "latency": 15.0}


def test_evidence_rule_stops_at_a_huge_price_and_continues_at_zero(heads):
    h, _ = heads
    unit = 5.0
    dear = EvidenceRule(1e6, 1e6, unit, h)
    d = dear.should_stop_given(["a"], EVIDENCE)
    assert d.stop and d.most_common == "a" and d.detail["decision"] == "stop"
    assert set(d.detail) == {"features", "continuations", "score", "decision"}
    assert [c["horizon"] for c in d.detail["continuations"]] == ["next_1", "wave_end", "plan_end"]
    assert d.detail["features"]["finished"] == 1 and d.detail["features"]["running"] == 1
    assert d.detail["features"]["tokens"] == pytest.approx(6.0)
    x = state_features(["a"], [15.0], running=1, wave=0, tokens=30.0, latency=15.0, unit=unit)
    pred = h.predict(x[None, :])
    assert np.all(pred["tokens"] > 0)  # so a huge λ makes every score negative
    score = float((pred["gain"][0] - 1e6 * pred["tokens"][0] - 1e6 * pred["latency"][0]).max())
    assert d.prob == pytest.approx(score) and d.detail["score"] == pytest.approx(round(score, 6))
    free = EvidenceRule(0.0, 0.0, unit, h)
    assert pred["gain"][0].max() > 0  # the synthetic walk rewards more samples
    d = free.should_stop_given(["a"], EVIDENCE)
    assert not d.stop and d.detail["decision"] == "continue" and d.prob == pytest.approx(pred["gain"][0].max())
    # predictions reported in tokens (unit × units)
    for c, g, t in zip(d.detail["continuations"], pred["gain"][0], pred["tokens"][0], strict=True):
        assert c["gain"] == pytest.approx(round(float(g), 5)) and c["tokens"] == pytest.approx(round(float(t) * unit, 1))
    # no leader (only nulls) or no heads: never stops
    assert not dear.should_stop_given([None], EVIDENCE).stop
    assert not EvidenceRule(1e6, 0.0, unit, None).should_stop_given(["a"], EVIDENCE).stop


def test_plan_on_finish_with_the_evidence_rule(heads):
    h, _ = heads
    plan = Plan((2, 2), EvidenceRule(1e6, 0.0, 5.0, h), (PARALLEL, PARALLEL))
    step = plan.on_finish(["a"], running=True, evidence=EVIDENCE)
    assert step.reason == "rule" and step.stop and step.decision.detail["decision"] == "stop"
    # without evidence the rule never stops early: the plan runs on to its end
    assert plan.on_finish(["a"], running=True).reason == "running"
    assert plan.on_finish(["a", "a"], running=False).reason == "continue"
    assert plan.on_finish(["a", "a", "a"], running=True).reason == "running"
    assert plan.on_finish(["a", "a", "a", "a"], running=False).reason == "plan_end"
    cheap = Plan((2, 2), EvidenceRule(0.0, 0.0, 5.0, h), (PARALLEL, PARALLEL))
    assert cheap.on_finish(["a"], running=True, evidence=EVIDENCE).reason == "running"


def test_heads_round_trip_and_stop_points(heads):
    h, w = heads
    X = walk_features(w).reshape(-1, len(NAMES))
    back = Heads.from_dict(json.loads(json.dumps(h.to_dict())))
    assert back.horizons == h.horizons == HORIZONS and back.seed == h.seed
    p0, p1 = h.predict(X), back.predict(X)
    for k in ("gain", "tokens", "latency"):
        assert p0[k].shape == (X.shape[0], len(HORIZONS))
        assert np.array_equal(p0[k], p1[k])
    assert h.predict(X[:0])["gain"].shape == (0, len(HORIZONS))
    pred = predict_walks(h, w)
    t = continuation.stop_points(continuation.scores(pred, 1e6, 0.0))
    assert np.all(t == 0)  # every score negative: stop at the first finish
    t = continuation.stop_points(np.ones((3, 4)))
    assert t.tolist() == [3, 3, 3]  # the last finish always stops


def test_continuation_docstring_worked_example():
    pred = {"gain": np.array([[0.02, 0.03, 0.03, 0.04]]), "tokens": np.array([[1.0, 2, 3, 9]]),
            "latency": np.array([[0.2, 0.4, 0.5, 1.5]])}
    assert continuation.scores(pred, 0.01, 0.0)[0] == pytest.approx(0.01)
    assert continuation.scores(pred, 0.02, 0.0)[0] <= 0


# --------------------------------------------------------------------------------------------- model


def _entry(budget, lv, rule, lam=None):
    return ChainEntry(budget, lv, rule, 0 if rule == "evidence" else None, lam, 0.0 if lam is not None else None,
                      budget * 0.9, 1.0, 0.8, (1, 2), (0.25, 0.75), 0.01, 0.002, 0.95, 40)


def test_evidence_model_json_and_entry_at(heads):
    h, _ = heads
    unit, per_sample = 100.0, 120.0
    lv = {0.75: 0.75 * per_sample / unit, 1.0: 1.0 * per_sample / unit}  # levels in units, as fit_evidence stores
    entries = [_entry(b, None, "evidence" if b == 2 else "fixed_plan", 0.004 if b == 2 else None) for b in (1, 2, 4)]
    entries += [_entry(b, lv[0.75], "fixed_plan") for b in (1, 2)]
    entries += [_entry(b, lv[1.0], "evidence", 0.01) for b in (2, 3)]
    model = EvidenceModel((2, 2), unit, per_sample, h, entries, ("lead:m=2@4s", "none@1"), 0.9)
    # budgets: the largest grid budget ≤ the request (tokens / unit); None below the grid
    assert model.entry_at(99) is None
    assert model.entry_at(100).budget == 1 and model.entry_at(250).budget == 2
    assert model.entry_at(400).budget == 4 and model.entry_at(1e6).budget == 4
    # latency in mean sample lengths: the largest level ≤ the request's
    assert model.entry_at(250, 0.5) is None
    e = model.entry_at(250, 0.8)
    assert e.latency_budget == pytest.approx(lv[0.75]) and e.budget == 2
    e = model.entry_at(350, 1.0)
    assert e.latency_budget == pytest.approx(lv[1.0]) and e.budget == 3
    assert model.entry_at(350, 50.0).latency_budget == pytest.approx(lv[1.0])
    assert model.entry_at(150, 1.0) is None  # that level's grid starts at 2
    plan, e = model.plan_at(250)
    assert e.rule == "evidence" and isinstance(plan.rule, EvidenceRule)
    assert plan.rule.lam == 0.004 and plan.rule.unit == unit and plan.waves == (2, 2) and plan.parallel == (True, True)
    assert model.plan_at(450) == (None, model.entry_at(450))
    assert model.plan_at(10) == (None, None)
    # JSON round trip
    back = EvidenceModel.from_dict(json.loads(json.dumps(model.to_dict())))
    assert (back.waves, back.unit, back.tokens_per_sample, back.menu, back.level) == (
        model.waves, model.unit, model.tokens_per_sample, model.menu, model.level)
    assert back.entries == model.entries
    X = walk_features(heads[1])[:3, 0]
    assert np.array_equal(back.heads.predict(X)["gain"], h.predict(X)["gain"])
    for b, lat in ((250, None), (350, 1.0), (99, None), (250, 0.8)):
        assert back.entry_at(b, lat) == model.entry_at(b, lat)
    bad = model.to_dict() | {"schema": 99}
    with pytest.raises(InputError, match="schema"):
        EvidenceModel.from_dict(bad)
