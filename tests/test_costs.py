"""Solver cost tables: hand-worked case, agreement with per-request FLOPs, invariants, errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from isocompute.errors import InputError
from isocompute.flops import ModelFlops, load_model_flops, prefill_flops, request_flops
from isocompute.solver.costs import cost_table

TOY = ModelFlops(body_params=10, head_params=0, n_layers=1, d_attn=1, n_params=10)
QWEN = load_model_flops({"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
                         "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
                         "vocab_size": 151936, "tie_word_embeddings": True})
ACTIONS = [0, 1, 2, 4, 8]


def test_hand_worked():
    c = cost_table(np.array([5]), np.array([3.0]), [2], unit="flops", model=TOY)
    assert c.tolist() == [[384.0]]  # prefill 200 + 2 × decode 92
    c = cost_table(np.array([5]), np.array([3.0]), [2], unit="flops", model=TOY, prefix_sharing=False)
    assert c.tolist() == [[584.0]]


def test_samples_unit_is_k_and_needs_no_tokens():
    c = cost_table(np.zeros(3), None, ACTIONS, unit="samples")
    assert c.dtype == np.float64 and c.shape == (3, 5)
    assert (c == np.array(ACTIONS, dtype=float)).all()
    assert cost_table(None, np.ones(2), [1, 3], unit="samples").tolist() == [[1, 3], [1, 3]]


@pytest.mark.parametrize("sharing", [True, False])
def test_agrees_with_request_flops_row_by_row(sharing):
    rng = np.random.default_rng(0)
    p = rng.integers(1, 2_000, size=40)
    m = rng.integers(1, 4_000, size=40)
    c = cost_table(p, m, ACTIONS, unit="flops", model=QWEN, prefix_sharing=sharing)
    brute = [[request_flops(QWEN, int(pi), [int(mi)] * k, prefix_sharing=sharing) for k in ACTIONS]
             for pi, mi in zip(p, m, strict=True)]
    np.testing.assert_allclose(c, np.array(brute), rtol=1e-12)


finite_tokens = hnp.arrays(np.float64, st.integers(1, 30), elements=st.floats(0, 1e5))


@given(finite_tokens, st.data())
def test_invariants(p, data):
    m = data.draw(hnp.arrays(np.float64, p.shape, elements=st.floats(0, 1e5)))
    p0, m0 = p.copy(), m.copy()
    shared = cost_table(p, m, ACTIONS, unit="flops", model=QWEN)
    unshared = cost_table(p, m, ACTIONS, unit="flops", model=QWEN, prefix_sharing=False)
    assert (p == p0).all() and (m == m0).all()  # inputs not mutated
    assert shared.shape == (p.size, len(ACTIONS)) and (shared[:, 0] == 0).all()
    steps = np.diff(shared, axis=1)
    # more samples cost more; with prefix sharing a ≤1-token completion needs no decode step, so is free
    assert (steps >= 0).all() and (steps[m > 1] > 0).all()
    k = np.array(ACTIONS, dtype=float)
    saved = np.maximum(k - 1, 0)[None, :] * np.asarray(prefill_flops(QWEN, p))[:, None]
    np.testing.assert_allclose(unshared - shared, saved, rtol=1e-9, atol=1e-12 * unshared.max())


def test_a_million_prompts_vectorised():
    n = 1_000_000
    rng = np.random.default_rng(1)
    c = cost_table(rng.integers(10, 500, n), rng.uniform(1, 2_000, n), [1, 2, 4, 8, 16], unit="flops",
                   model=QWEN)
    assert c.shape == (n, 5) and np.isfinite(c).all()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(prompt_tokens=None), "needs prompt_tokens and completion_tokens.*--cost-unit samples"),
        (dict(mean_completion_tokens=None), "mean_completion_tokens is missing"),
        (dict(mean_completion_tokens=np.array([1.0, np.nan])), r"1 missing or negative value\(s\) \(first at row 1"),
        (dict(prompt_tokens=np.array([-1, 3])), "missing or negative"),
        (dict(prompt_tokens=np.array(["a", "b"])), "non-numeric"),
        (dict(mean_completion_tokens=np.ones(3)), r"one entry per prompt \(expected 2\)"),
        (dict(model=None), "load_model_flops"),
        (dict(unit="dollars"), "unknown cost unit 'dollars'"),
        (dict(actions=[]), "non-empty list of sample counts"),
        (dict(actions=[1, -2]), "k >= 0"),
        (dict(actions=[1.5]), "integers"),
        (dict(unit="samples", prompt_tokens=None, mean_completion_tokens=None), "number of prompts"),
        (dict(unit="samples", prompt_tokens=np.ones((2, 2))), "must be 1-D"),
    ],
)
def test_errors(kwargs, match):
    args = dict(prompt_tokens=np.array([10, 20]), mean_completion_tokens=np.array([5.0, 6.0]), actions=[1, 2],
                unit="flops", model=TOY)
    args.update(kwargs)
    with pytest.raises(InputError, match=match):
        cost_table(args.pop("prompt_tokens"), args.pop("mean_completion_tokens"), args.pop("actions"), **args)
