"""Sample confidence (isocompute.tasks.confidence) against a brute-force reading of its definition."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isocompute.tasks.confidence import sample_confidence, stats_from_logits


def brute(token_logprobs, top_logprobs, k, window):
    """The definition, loop by loop: C_i over the k highest, every window of `window` tokens (or the whole
    sample when it is shorter), the lowest window mean; the mean sampled logprob."""
    conf = []
    for row in top_logprobs:
        best = sorted(row, reverse=True)[:k]
        conf.append(-sum(best) / k)
    w = min(window, len(conf))
    lows = [sum(conf[s:s + w]) / w for s in range(len(conf) - w + 1)]
    return sum(token_logprobs) / len(token_logprobs), min(lows)


logprob = st.floats(min_value=-30.0, max_value=0.0, allow_nan=False)


@st.composite
def samples(draw):
    k = draw(st.integers(1, 6))
    m = draw(st.integers(1, 40))
    tops = [draw(st.lists(logprob, min_size=k, max_size=k + 1)) for _ in range(m)]
    sampled = [draw(logprob) for _ in range(m)]
    return sampled, tops, k, draw(st.integers(1, 50))


@settings(max_examples=300, deadline=None)
@given(samples())
def test_matches_the_brute_force_definition(case):
    sampled, tops, k, window = case
    lp, conf = sample_confidence(sampled, tops, k=k, window=window)
    want_lp, want_conf = brute(sampled, tops, k, window)
    assert lp == pytest.approx(want_lp, abs=1e-9)
    assert conf == pytest.approx(want_conf, abs=1e-9)
    assert lp <= 0 and conf >= 0


def test_the_worked_example_and_a_short_sample_takes_one_window():
    lp, conf = sample_confidence([-0.1, -1.2, -0.2], [[-0.1, -2.3], [-1.0, -1.2], [-0.2, -3.0]], k=2, window=2)
    assert (lp, conf) == (pytest.approx(-0.5), pytest.approx(1.15))
    # window longer than the sample: the mean of C over the whole sample, (1.2 + 1.1 + 1.6) / 3
    assert sample_confidence([-0.1, -1.2, -0.2], [[-0.1, -2.3], [-1.0, -1.2], [-0.2, -3.0]], k=2,
                             window=2048)[1] == pytest.approx(1.3)


def test_a_k_plus_one_th_entry_is_cut_and_order_does_not_matter():
    # vLLM adds the sampled token when it is outside the top k: the lowest of k + 1 entries does not count
    assert sample_confidence([-5.0], [[-5.0, -0.5, -1.5]], k=2) == sample_confidence([-5.0], [[-1.5, -0.5]], k=2)


def test_empty_and_malformed_inputs():
    assert sample_confidence([], [], k=5) is None
    with pytest.raises(ValueError, match="same positions"):
        sample_confidence([-0.1], [], k=1)
    with pytest.raises(ValueError, match="fewer than k=3"):
        sample_confidence([-0.1], [[-0.1, -2.0]], k=3)
    with pytest.raises(ValueError, match="window >= 1"):
        sample_confidence([-0.1], [[-0.1]], k=1, window=0)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 12), st.integers(1, 8), st.integers(0, 2**31 - 1))
def test_from_logits_equals_the_logprob_route(steps, k, seed):
    rng = np.random.default_rng(seed)
    vocab = 10
    logits = rng.normal(scale=4.0, size=(steps + 3, vocab))  # 3 padding steps after the sample
    tokens = rng.integers(0, vocab, size=steps).tolist()
    logp = logits[:steps] - np.log(np.exp(logits[:steps]).sum(axis=1, keepdims=True))
    want = sample_confidence(logp[np.arange(steps), tokens].tolist(), logp.tolist(), k=min(k, vocab), window=4)
    got = stats_from_logits(logits, tokens, k=min(k, vocab), window=4)
    assert got[0] == pytest.approx(want[0], abs=1e-9) and got[1] == pytest.approx(want[1], abs=1e-9)
    assert stats_from_logits(logits, [], k=k) is None


def test_a_peaked_sample_is_more_confident_than_a_flat_one():
    peaked = np.array([[10.0, 0.0, 0.0, 0.0, 0.0, 0.0]] * 4)
    flat = np.zeros((4, 6))
    lp_p, c_p = stats_from_logits(peaked, [0] * 4, k=5)
    lp_f, c_f = stats_from_logits(flat, [0] * 4, k=5)
    assert c_p > c_f and lp_p > lp_f
    assert c_f == pytest.approx(math.log(6)) and lp_f == pytest.approx(-math.log(6))
