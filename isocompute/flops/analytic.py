"""Analytic FLOPs of prefill, decode, updates (full and LoRA) and reward-model passes.

What is counted (a multiply-add is 2 FLOPs, as in ``torch.utils.flop_counter``):

* every matrix multiply a token passes through: 2·N_matmul per token forward, where N_matmul is the
  decoder blocks' projection weights plus the output head (``lm_head`` d·V, counted even when tied);
* attention's two context-dependent products, QK^T and AV: 2·2·n_layers·ctx·d_attn per query token.
  A block of T query tokens on top of ``past`` cached tokens attends to ctx = past + T keys each —
  dense kernels (eager, SDPA's math path) compute the masked half too, so a prefill costs
  4·L·d_attn·T², not the causal ideal T(T+1)/2 (Kaplan et al. 2020 and Chinchilla count it the same way);
* backward: twice the forward for every matmul whose weight and input both need gradients (6N per
  token for full fine-tuning: forward 2N + backward 4N), attention's backward twice its forward.

What is ignored: norms, activations, softmax, rotary embeddings, residual adds, bias adds, the embedding
lookup (and its gradient), sampling, the loss, optimizer steps, sliding-window attention limits,
activation recomputation under gradient checkpointing, and padding. These are all O(d) per token,
a few percent of a small model at most, and none of them is a matmul.

Sampling: the prefill's last-position logits give the first completion token, so a completion of m
tokens after a p-token prompt costs one prefill (lm_head on the last position only) and m − 1 decode
steps, step j feeding one token with context p + j keys (j = 1 … m − 1). In closed form:

    decode(p, m) = 2·N_matmul·s + 4·L·d_attn·(s·p + s(s+1)/2),   s = max(m − 1, 0)

which is exactly what ``transformers`` ``generate`` with a KV cache executes. With n samples of one
prompt and prefix sharing (vLLM's ``n``, automatic prefix caching) the prompt is prefilled once;
without it, n times — the difference is exactly (n − 1)·prefill(p).

Worked example, the tiny Llama of the tests (d=64, 2 layers, 4 heads of 24, 2 KV heads, d_ff=96,
V=128: body 73,728, head 8,192, d_attn 96), a 16-token forward with logits at every position:

    2·(73,728 + 8,192)·16 + 4·2·96·16·16 = 2,621,440 + 196,608 = 2,818,048 FLOPs

All functions broadcast over numpy arrays of token counts (real-valued counts are fine: the formulas
are polynomials) and return a float for scalar inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from isocompute.errors import InputError
from isocompute.flops.model import ModelFlops

Logits = Literal["all", "last"]


def _out(x: np.ndarray) -> float | np.ndarray:
    return float(x) if np.ndim(x) == 0 else x


def _f64(x: ArrayLike) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def attention_flops(model: ModelFlops, tokens: ArrayLike, past: ArrayLike = 0) -> float | np.ndarray:
    """QK^T and AV of ``tokens`` queries over ``past + tokens`` keys: 4·L·d_attn·T·(past + T)."""
    t, c = _f64(tokens), _f64(past)
    return _out(4.0 * model.n_layers * model.d_attn * t * (c + t))


def forward_flops(
    model: ModelFlops, tokens: ArrayLike, past: ArrayLike = 0, *, logits: Logits = "all"
) -> float | np.ndarray:
    """One forward pass of ``tokens`` new tokens after ``past`` cached ones.

    ``logits="all"`` applies the head at every position (training, scoring); ``"last"`` once (a
    sampler's prefill, or ``logits_to_keep=1``).

    F = 2·body·T + 2·head·(T or 1) + 4·L·d_attn·T·(past + T)
    """
    if logits not in ("all", "last"):
        raise InputError(f"logits must be 'all' or 'last'; got {logits!r}.")
    t = _f64(tokens)
    head_tokens = t if logits == "all" else np.minimum(t, 1.0)
    mm = 2.0 * (model.body_params * t + model.head_params * head_tokens)
    return _out(mm + _f64(attention_flops(model, t, past)))


def prefill_flops(model: ModelFlops, prompt_tokens: ArrayLike) -> float | np.ndarray:
    """A sampler's prefill of a p-token prompt: head on the last position only."""
    return forward_flops(model, prompt_tokens, 0, logits="last")


def decode_flops(
    model: ModelFlops, prompt_tokens: ArrayLike, completion_tokens: ArrayLike
) -> float | np.ndarray:
    """All decode steps of one m-token completion after a p-token prompt (closed form, see module doc).

    >>> from isocompute.flops.model import ModelFlops
    >>> decode_flops(ModelFlops(10, 0, 1, 1, 10), 5, 3)  # s=2: 2·10·2 + 4·(2·5 + 3) = 92
    92.0
    """
    p = _f64(prompt_tokens)
    s = np.maximum(_f64(completion_tokens) - 1.0, 0.0)
    mm = 2.0 * model.matmul_params * s
    attn = 4.0 * model.n_layers * model.d_attn * (s * p + s * (s + 1.0) / 2.0)
    return _out(mm + attn)


def request_flops(
    model: ModelFlops,
    prompt_tokens: int,
    completion_tokens: Sequence[int],
    *,
    prefix_sharing: bool = True,
) -> float:
    """One request with n = len(completion_tokens) samples of the same prompt.

    prefill once (``prefix_sharing``) or n times, plus each completion's decode steps. No samples
    means no request: 0.
    """
    m = _f64(list(completion_tokens))
    if m.size == 0:
        return 0.0
    prefills = 1 if prefix_sharing else m.size
    return float(prefills * prefill_flops(model, prompt_tokens) + np.sum(decode_flops(model, prompt_tokens, m)))


def train_flops(model: ModelFlops, sequence_tokens: ArrayLike) -> float | np.ndarray:
    """Full fine-tuning step on one sequence of T tokens, all weights trainable: forward + backward.

    = 3 · forward(T, logits at every position) = 6·N_matmul·T + 12·L·d_attn·T².
    """
    return _out(3.0 * _f64(forward_flops(model, sequence_tokens, 0, logits="all")))


def lora_update_flops(model: ModelFlops, sequence_tokens: ArrayLike, n_lora: int) -> float | np.ndarray:
    """LoRA step on one sequence of T tokens with the base frozen and ``n_lora`` adapter weights.

    Forward 2·N_matmul·T, activation gradients through every frozen matmul 2·N_matmul·T (no weight
    gradients), attention 3× its forward (QK^T and AV have no weights: both operands need gradients,
    as in full fine-tuning), and the adapters 6·N_LoRA·T:

        F = 4·N_matmul·T + 3·attention(T) + 6·N_LoRA·T = 2·forward(T) + attention(T) + 6·N_LoRA·T

    Assumes activation gradients reach the first block (an adapter there and an embedding output that
    requires grad, as peft arranges under gradient checkpointing). Otherwise the first block's frozen
    projections (and their adapters' A matrices) skip their input gradient: this overstates by
    2·T·(that block's Q, K, V weights + rank·d per adapted Q, K, V), under 1/n_layers of the
    activation backward.
    """
    if n_lora < 0:
        raise InputError(f"n_lora must be >= 0; got {n_lora}.")
    t = _f64(sequence_tokens)
    fwd = _f64(forward_flops(model, t, 0, logits="all"))
    return _out(2.0 * fwd + _f64(attention_flops(model, t)) + 6.0 * n_lora * t)


def reward_flops(
    reward_model: ModelFlops,
    prompt_tokens: ArrayLike,
    completion_tokens: ArrayLike,
    *,
    logits: Logits = "all",
) -> float | np.ndarray:
    """A reward / verifier model's forward pass over prompt + completion (one sequence, no cache).

    ``logits="all"`` matches scoring heads applied at every position (Qwen2 reward and process reward
    models); pass ``"last"`` for a head read at the final token only.
    """
    return forward_flops(reward_model, _f64(prompt_tokens) + _f64(completion_tokens), 0, logits=logits)
