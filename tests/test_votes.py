"""Weighted votes (isocompute.solver.votes): the vote rule against brute force, the vectorised credits against
the scalar rule and against maj@k, DeepConf's filter against np.percentile, and the fit's keep decision on
tables with and without signal in the evidence."""

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isocompute.errors import InputError
from isocompute.solver.estimators import majority_at_k
from isocompute.solver.outcomes import from_records
from isocompute.solver.votes.credits import filter_keep, vote_credits
from isocompute.solver.votes.evidence import draw_subsets, evidence
from isocompute.solver.votes.fit import fit_vote, study
from isocompute.solver.votes.weights import VoteWeights, load_vote, weighted_vote

classes_st = st.lists(st.one_of(st.none(), st.integers(0, 3)), min_size=1, max_size=7)


def brute_winners(classes, weights):
    """Every class whose weight total no other class's exceeds (exact rationals: weights are small ints)."""
    total = {}
    for c, w in zip(classes, weights, strict=True):
        if c is not None:
            total[c] = total.get(c, 0) + w
    return {c for c in total if all(total[c] >= v for v in total.values())}


@given(classes_st, st.data())
@settings(max_examples=200, deadline=None)
def test_weighted_vote_matches_brute_force(classes, data):
    weights = data.draw(st.lists(st.integers(1, 4), min_size=len(classes), max_size=len(classes)))
    got = weighted_vote(classes, weights)
    want = brute_winners(classes, weights)
    assert set(got) == want
    if want:
        assert all(v == pytest.approx(1 / len(want)) for v in got.values())


@given(classes_st)
@settings(max_examples=100, deadline=None)
def test_unit_weights_are_plain_majority(classes):
    counts = {c: classes.count(c) for c in classes if c is not None}
    top = max(counts.values(), default=0)
    assert set(weighted_vote(classes, [1.0] * len(classes))) == {c for c, n in counts.items() if n == top}


def table(rows, conf=None):
    """Records from rows of (class or None, correct, tokens), optional per-sample confidence."""
    recs = []
    for i, row in enumerate(rows):
        samples = [{"answer": None if c is None else str(c), "correct": bool(ok), "completion_tokens": int(t)}
                   for c, ok, t in row]
        if conf is not None:
            for s, v in zip(samples, conf[i], strict=True):  # shifted ≥ 0, as a real confidence is: the
                s["confidence_min_window"] = float(v) + 10.0  # weight reads it standardised, so a shift is moot
        recs.append({"id": f"p{i}", "prompt": f"q{i}", "gold": "0", "samples": samples})
    return from_records(recs)


@given(st.lists(st.lists(st.tuples(st.one_of(st.none(), st.integers(0, 2)), st.booleans(), st.integers(1, 50)),
                         min_size=6, max_size=6), min_size=1, max_size=4), st.integers(1, 6), st.floats(-2, 2))
@settings(max_examples=60, deadline=None)
def test_vectorised_credits_match_the_scalar_vote_on_every_subset(rows, k, beta):
    t = table(rows)
    ev = evidence(t)
    sub = draw_subsets(ev.n, k)
    assert sub.exact and sub.idx.shape[1] == math.comb(6, k)
    w = VoteWeights(beta=beta, typical_tokens=20.0)
    got = vote_credits(ev, sub, w.log_weights(ev.tokens))
    for i, row in enumerate(rows):
        value = {c: np.mean([ok for c2, ok, _ in row if c2 == c]) for c, _, _ in row if c is not None}
        for m, s in enumerate(sub.idx[i]):
            picked = [row[j] for j in s]
            win = weighted_vote([c for c, _, _ in picked], w.weights([tt for _, _, tt in picked]))
            assert got[i, m] == pytest.approx(sum(share * value[c] for c, share in win.items()), abs=1e-12)


@given(st.lists(st.lists(st.tuples(st.one_of(st.none(), st.integers(0, 3)), st.booleans(), st.integers(1, 9)),
                         min_size=7, max_size=7), min_size=1, max_size=5), st.integers(1, 7))
@settings(max_examples=60, deadline=None)
def test_beta_gamma_zero_over_every_subset_is_maj_at_k(rows, k):
    t = table(rows)
    ev = evidence(t)
    sub = draw_subsets(ev.n, k)
    want = majority_at_k(t.answer_codes, t.correct, k)
    plain = VoteWeights(beta=0.0, gamma=0.0, typical_tokens=5.0)
    np.testing.assert_allclose(vote_credits(ev, sub).mean(axis=1), want, atol=1e-12)
    np.testing.assert_allclose(vote_credits(ev, sub, plain.log_weights(ev.tokens)).mean(axis=1), want, atol=1e-12)


@given(st.integers(2, 40), st.sampled_from([10.0, 25.0, 50.0, 75.0, 90.0]), st.integers(0, 10**6))
@settings(max_examples=100, deadline=None)
def test_deepconf_keep_count_is_the_percentile_rule(k, eta, seed):
    conf = np.random.default_rng(seed).permutation(k).astype(float)
    assert filter_keep(k, eta) == int((conf >= np.percentile(conf, 100 - eta)).sum())


def test_deepconf_filter_votes_among_the_most_confident():
    t = table([[(0, True, 5), (0, True, 5), (1, False, 5), (1, False, 5)]], conf=[[0.9, 0.1, 0.2, 0.3]])
    ev = evidence(t)
    assert ev.confidence_field == "confidence_min_window"
    sub = draw_subsets(ev.n, 4)
    assert vote_credits(ev, sub)[0, 0] == 0.5
    assert vote_credits(ev, sub, eta=10, filter_by=ev.confidence)[0, 0] == 1.0
    assert vote_credits(ev, sub, np.log([[1.0, 1, 3, 1]]))[0, 0] == 0.0


def synthetic(P, n, seed, *, long_wrong=True, conf_signal=False):
    """P prompts of n samples; right answers class 0, wrong ones spread over 1–2 with a prompt-level bias
    so majority is often wrong; wrong answers 3× longer when ``long_wrong``, else lengths independent."""
    rng = np.random.default_rng(seed)
    rows, confs = [], []
    for _ in range(P):
        p = rng.uniform(0.25, 0.75)
        ok = rng.random(n) < p
        cls = np.where(ok, 0, np.where(rng.random(n) < 0.85, 1, 2))
        base = rng.lognormal(np.log(200), 0.4, n)
        tok = base * (np.where(ok, 1.0, 3.0) if long_wrong else 1.0)
        rows.append([(int(c), bool(o), int(x)) for c, o, x in zip(cls, ok, tok, strict=True)])
        confs.append(rng.normal(0, 1, n) + (1.5 * ok if conf_signal else 0.0))
    return table(rows, conf=confs)


def test_fit_keeps_shortness_where_wrong_answers_are_long():
    fit = fit_vote(synthetic(300, 16, 1), 4, seed=0, draws=64)
    assert fit.kept and fit.weights.beta > 0 and fit.weights.gamma == 0.0
    assert fit.weighted.vs_majority.low > 0.02
    assert fit.weighted.accuracy > fit.majority.accuracy + 0.02
    assert fit.weights.fit["kept"] and fit.weights.fit["k"] == 4


def test_fit_keeps_plain_majority_where_lengths_carry_nothing():
    fit = fit_vote(synthetic(300, 16, 2, long_wrong=False), 4, seed=0, draws=64)
    assert not fit.kept
    assert fit.weights.is_plain and fit.weights.beta == 0.0 and fit.weights.gamma == 0.0
    assert fit.weights.fit["gain_lower_bound"] <= 0


def test_fit_keeps_confidence_where_it_carries_the_signal():
    t = synthetic(300, 16, 3, long_wrong=False, conf_signal=True)
    fit = fit_vote(t, 4, seed=0, draws=64)
    assert fit.kept and fit.weights.gamma > 0
    assert fit.weights.confidence_field == "confidence_min_window"
    vs = study(t, 4, draws=64)
    deepconf = vs.fixed("deepconf-10", "filter", 10.0)
    assert deepconf.vs_majority.mean > 0  # the most confident sample alone beats majority here


def test_vote_json_round_trips_and_bad_files_say_why(tmp_path):
    fit = fit_vote(synthetic(60, 8, 4), 4, seed=0, draws=16)
    p = fit.weights.save(tmp_path / "vote.json")
    assert load_vote(p) == fit.weights
    (tmp_path / "bad.json").write_text('{"schema": 1, "beta": 1, "delta": 2}')
    with pytest.raises(InputError, match="unknown keys"):
        load_vote(tmp_path / "bad.json")
    with pytest.raises(InputError, match="cannot read"):
        load_vote(tmp_path / "missing.json")
    with pytest.raises(InputError, match="finite"):
        VoteWeights(beta=float("nan"))


def test_draws_are_seeded_and_uniform_over_samples():
    n = np.array([10, 10, 7])
    a, b = draw_subsets(n, 3, draws=4000, seed=5), draw_subsets(n, 3, draws=4000, seed=5)
    assert not a.exact and np.array_equal(a.idx, b.idx)
    assert (a.idx[2] < 7).all() and all(len(set(s)) == 3 for s in a.idx[0][:100])
    freq = np.bincount(a.idx[0].ravel(), minlength=10) / a.idx[0].size
    np.testing.assert_allclose(freq, 0.1, atol=0.01)
    with pytest.raises(InputError, match="at least k samples"):
        draw_subsets(n, 8)


def test_subset_draw_matches_itertools_when_exact():
    sub = draw_subsets(np.array([5, 5]), 2)
    assert [tuple(s) for s in sub.idx[0]] == list(itertools.combinations(range(5), 2))


def test_the_vote_command_reads_confidence_from_the_raw_lines_and_writes_vote_json(tmp_path, capsys):
    import json

    from isocompute.cli import main
    from isocompute.solver.outcomes import read_outcomes

    t = synthetic(200, 12, 6, long_wrong=False, conf_signal=True)
    path = tmp_path / "smol.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in t.records))
    assert evidence(read_outcomes(path)).confidence_field == "confidence_min_window"
    assert main(["vote", str(path), "--k", "4", "--draws", "32", "--out", str(tmp_path / "vote.json")]) == 0
    assert "kept" in capsys.readouterr().out
    vw = load_vote(tmp_path / "vote.json")
    assert vw.gamma > 0 and vw.confidence_field == "confidence_min_window" and vw.fit["k"] == 4
    assert vw.confidence_std == pytest.approx(float(np.nanstd(evidence(t).confidence)), rel=1e-9)


@given(st.lists(st.tuples(st.one_of(st.none(), st.integers(0, 2)), st.booleans()), min_size=6, max_size=6),
       st.integers(1, 6), st.sampled_from([10.0, 50.0, 90.0]), st.integers(0, 10**6))
@settings(max_examples=60, deadline=None)
def test_the_filter_matches_keeping_the_most_confident_by_hand(row, k, eta, seed):
    conf = np.random.default_rng(seed).permutation(6).astype(float)  # distinct confidences
    t = table([[(c, ok, 5) for c, ok in row]], conf=[conf])
    ev = evidence(t)
    sub = draw_subsets(ev.n, k)
    got = vote_credits(ev, sub, eta=eta, filter_by=ev.confidence)[0]
    value = {c: np.mean([ok for c2, ok in row if c2 == c]) for c, _ in row if c is not None}
    for m, s in enumerate(sub.idx[0]):
        kept = sorted(s, key=lambda j: -conf[j])[: filter_keep(k, eta)]
        win = weighted_vote([row[j][0] for j in kept], [1.0] * len(kept))
        assert got[m] == pytest.approx(sum(share * value[c] for c, share in win.items()), abs=1e-12)


def test_a_table_without_lengths_or_confidence_keeps_majority():
    recs = [{"id": f"p{i}", "prompt": "q", "gold": "1",
             "samples": [{"answer": a, "correct": a == "1"} for a in ("1", "2", "2", "1", None, "1")]}
            for i in range(20)]
    fit = fit_vote(from_records(recs), 3, draws=8)
    assert not fit.kept and fit.weights.is_plain and fit.weights.typical_tokens == 1.0
    assert fit.weighted.accuracy == fit.majority.accuracy
    assert fit.majority.accuracy == pytest.approx(majority_at_k(from_records(recs).answer_codes,
                                                                from_records(recs).correct, 3).mean())


def test_no_confidence_fits_length_alone():
    t = synthetic(300, 16, 3, long_wrong=True, conf_signal=True)
    both, alone = fit_vote(t, 4, draws=32), fit_vote(t, 4, draws=32, use_confidence=False)
    assert both.weights.gamma > 0 and alone.weights.gamma == 0.0 and alone.weights.confidence_field is None
    assert alone.kept and alone.weights.beta > 0
    assert alone.weighted.accuracy < both.weighted.accuracy
