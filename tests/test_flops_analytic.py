"""Analytic FLOP formulas: hand-worked cases, brute-force sums, invariants (hypothesis)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isocompute.errors import InputError
from isocompute.flops import (
    ModelFlops,
    attention_flops,
    decode_flops,
    forward_flops,
    lora_update_flops,
    prefill_flops,
    request_flops,
    reward_flops,
    train_flops,
)

# the tiny Llama of test_flops_counter: body 73,728, head 8,192, 2 layers, d_attn 96
TINY = ModelFlops(body_params=73_728, head_params=8_192, n_layers=2, d_attn=96, n_params=90_432)
TOY = ModelFlops(body_params=10, head_params=0, n_layers=1, d_attn=1, n_params=10)

tokens = st.integers(min_value=0, max_value=5_000)
models = st.builds(
    ModelFlops,
    body_params=st.integers(1, 10**10),
    head_params=st.integers(0, 10**9),
    n_layers=st.integers(0, 100),
    d_attn=st.integers(0, 16_384),
    n_params=st.just(1),
)


def test_hand_worked_forward():
    assert forward_flops(TINY, 16) == 2_621_440 + 196_608 == 2_818_048
    assert forward_flops(TINY, 16, logits="last") == 2 * 73_728 * 16 + 2 * 8_192 + 196_608
    assert attention_flops(TINY, 1, 16) == 4 * 2 * 96 * 17


def test_hand_worked_decode_and_request():
    # p=5, m=3: two decode steps with contexts 6 and 7
    assert decode_flops(TOY, 5, 3) == (2 * 10 + 4 * 6) + (2 * 10 + 4 * 7) == 92
    assert prefill_flops(TOY, 5) == 2 * 10 * 5 + 4 * 5 * 5 == 200
    assert request_flops(TOY, 5, [3, 3]) == 200 + 2 * 92
    assert request_flops(TOY, 5, [3, 3], prefix_sharing=False) == 2 * 200 + 2 * 92
    assert request_flops(TOY, 5, []) == 0.0


def test_hand_worked_updates_and_reward():
    assert train_flops(TOY, 4) == 3 * (2 * 10 * 4 + 4 * 16) == 432
    # frozen base: 2·fwd + one more attention for the backward through QK^T/AV, adapters 6·N_LoRA·T
    assert lora_update_flops(TOY, 4, 3) == 2 * 144 + 64 + 6 * 3 * 4 == 424
    assert reward_flops(TOY, 5, 3) == forward_flops(TOY, 8) == 2 * 10 * 8 + 4 * 64


def test_single_token_completion_needs_no_decode_step():
    assert decode_flops(TINY, 100, 1) == 0.0 == decode_flops(TINY, 100, 0)


@given(models, tokens, st.integers(0, 2_000))
def test_decode_closed_form_equals_brute_force_sum(model, p, m):
    steps = sum(forward_flops(model, 1, p + j - 1) for j in range(1, m))
    assert decode_flops(model, p, m) == pytest.approx(steps, rel=1e-12)


@settings(max_examples=50)
@given(models, tokens, tokens, st.integers(1, 100))
def test_monotone_in_context(model, t, past, extra):
    assert forward_flops(model, t, past + extra) >= forward_flops(model, t, past)
    assert forward_flops(model, t + extra, past) > forward_flops(model, t, past)
    assert decode_flops(model, t + extra, past) >= decode_flops(model, t, past)
    assert decode_flops(model, t, past + extra + 1) > decode_flops(model, t, past + 1)


@given(models, tokens, st.lists(st.integers(0, 3_000), min_size=1, max_size=16))
def test_prefix_sharing_saves_exactly_n_minus_one_prefills(model, p, completions):
    n = len(completions)
    shared = request_flops(model, p, completions, prefix_sharing=True)
    unshared = request_flops(model, p, completions, prefix_sharing=False)
    assert unshared - shared == pytest.approx((n - 1) * prefill_flops(model, p), rel=1e-9, abs=1e-6)
    # and a request is its prefill plus each completion's decode, in any order
    assert shared == pytest.approx(request_flops(model, p, completions[::-1]), rel=1e-12)


@given(models, st.integers(1, 5_000), st.integers(0, 10**8))
def test_update_costs_order(model, t, n_lora):
    fwd = forward_flops(model, t)
    assert train_flops(model, t) == pytest.approx(3 * fwd, rel=1e-12)
    lora = lora_update_flops(model, t, n_lora)
    assert lora >= 2 * fwd
    if 6 * n_lora < 2 * model.matmul_params:  # adapters cheaper than the base's weight gradients
        assert lora < train_flops(model, t)


def test_vectorised_equals_scalar():
    p = np.array([0, 1, 17, 300])
    m = np.array([5, 0, 2.5, 1000])
    vec = decode_flops(TINY, p, m)
    assert isinstance(vec, np.ndarray) and vec.dtype == np.float64
    assert vec.tolist() == [decode_flops(TINY, int(a), float(b)) for a, b in zip(p, m, strict=True)]
    assert isinstance(prefill_flops(TINY, 3), float)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: forward_flops(TINY, 3, logits="first"), "logits must be 'all' or 'last'"),
        (lambda: lora_update_flops(TINY, 3, -1), "n_lora must be >= 0"),
    ],
)
def test_errors(call, match):
    with pytest.raises(InputError, match=match):
        call()
