"""Cost tables C[i, a]: the compute one request for prompt i costs under action a (k_a samples).

Three units:

* ``"samples"`` — C[i, a] = k_a. Needs no token counts; the budget is then "mean samples per request".
* ``"tokens"`` — the expected completion tokens generated, C[i, a] = k_a · m̄_i (k_a of the prompt's
  samples drawn at random: each brings m̄_i tokens in expectation). A budget in tokens may be written as a
  multiple of the table's mean completion tokens per sample (``4x``: :func:`token_multiple_of`).
* ``"flops"`` — the expected analytic FLOPs (:mod:`isocompute.flops.analytic`) of a request with k_a
  samples of prompt i:

      C[i, a] = P_i · (1 if prefix_sharing else k_a) + k_a · D_i,
      P_i = prefill(p_i),   D_i = decode(p_i, m̄_i)  (closed form over the m̄_i − 1 decode steps)

  where p_i is the prompt's token count and m̄_i its mean completion length over the sampled outcomes.
  k_a = 0 (abstain) costs nothing. Plugging in the mean length is exact for the matmul part and, by
  Jensen, understates the quadratic attention part by 2·L·d_attn·Var(m) per sample — a fraction of a
  percent at realistic lengths.

Example (``ModelFlops(body_params=10, head_params=0, n_layers=1, d_attn=1, n_params=10)``, p = 5,
m̄ = 3, k = 2, prefix sharing): P = 2·10·5 + 4·5·5 = 200, D = 92 (see ``decode_flops``), C = 200 + 2·92
= 384; without sharing C = 2·200 + 2·92 = 584.

Everything is vectorised over prompts; N = 1,000,000 prompts × a handful of actions takes well under a
second. Ignored: per-sample variation in completion length (only the mean enters), queueing, batching.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from isocompute.errors import InputError
from isocompute.flops import ModelFlops, decode_flops, prefill_flops

CostUnit = Literal["samples", "tokens", "flops"]

_MISSING_TOKENS = (
    "cost unit 'flops' needs token counts: the outcome table needs prompt_tokens and completion_tokens "
    "on every row (or use --cost-unit samples)"
)


def _actions(actions: Sequence[int]) -> np.ndarray:
    k = np.asarray(actions)
    if k.ndim != 1 or k.size == 0 or not np.issubdtype(k.dtype, np.integer) or (k < 0).any():
        raise InputError(
            f"actions must be a non-empty list of sample counts k >= 0 (integers); got {list(actions)!r}."
        )
    return k.astype(np.float64)


def _tokens(values: ArrayLike | None, name: str, n: int | None) -> np.ndarray:
    if values is None:
        raise InputError(f"{_MISSING_TOKENS}; {name} is missing.")
    try:
        x = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(f"{_MISSING_TOKENS}; {name} has non-numeric entries.") from None
    if x.ndim != 1 or (n is not None and x.shape[0] != n):
        raise InputError(
            f"{name} must be a 1-D array with one entry per prompt (expected {n}); got shape {x.shape}."
        )
    bad = ~np.isfinite(x) | (x < 0)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise InputError(
            f"{_MISSING_TOKENS}; {name} has {int(bad.sum())} missing or negative value(s) (first at row "
            f"{first}: {x[first]})."
        )
    return x


def cost_table(
    prompt_tokens: ArrayLike | None,
    mean_completion_tokens: ArrayLike | None,
    actions: Sequence[int],
    *,
    unit: CostUnit,
    model: ModelFlops | None = None,
    prefix_sharing: bool = True,
) -> np.ndarray:
    """C[i, a] (float64, shape (N, A)) for N prompts and the action list ``actions`` (sample counts k_a).

    ``prompt_tokens`` and ``mean_completion_tokens`` are (N,) arrays; with ``unit="samples"`` only their
    length is used (pass either; at least one fixes N). ``model`` is required for ``unit="flops"``
    (``isocompute.flops.load_model_flops(config_path)``).
    """
    k = _actions(actions)
    if unit == "samples":
        ref = prompt_tokens if prompt_tokens is not None else mean_completion_tokens
        if ref is None:
            raise InputError(
                "cost_table needs the number of prompts: pass prompt_tokens or mean_completion_tokens "
                "(any (N,) array) even with unit='samples'."
            )
        n = np.shape(ref)[0] if np.ndim(ref) == 1 else -1
        if n < 0:
            raise InputError(f"token arrays must be 1-D (one entry per prompt); got shape {np.shape(ref)}.")
        return np.broadcast_to(k, (n, k.size)).copy()
    if unit == "tokens":
        if mean_completion_tokens is None or np.isnan(np.asarray(mean_completion_tokens, dtype=np.float64)).any():
            raise InputError("cost unit 'tokens' needs completion_tokens on every sample of the outcome table "
                             "(or use --cost-unit samples).")
        m = np.asarray(mean_completion_tokens, dtype=np.float64)
        return m[:, None] * k[None, :]
    if unit != "flops":
        raise InputError(f"unknown cost unit {unit!r}; use 'samples', 'tokens' or 'flops'.")
    if model is None:
        raise InputError(
            "cost unit 'flops' needs the policy model's FLOP shape: pass "
            "model=isocompute.flops.load_model_flops('<model dir or config.json>') (or --model-config)."
        )
    p = _tokens(prompt_tokens, "prompt_tokens", None)
    m = _tokens(mean_completion_tokens, "mean_completion_tokens", p.shape[0])
    prefill = np.asarray(prefill_flops(model, p))[:, None]
    decode = np.asarray(decode_flops(model, p, m))[:, None]
    prefills = (k > 0).astype(np.float64) if prefix_sharing else k
    return prefill * prefills[None, :] + decode * k[None, :]


def token_multiple_of(mean_completion_tokens: ArrayLike) -> float:
    """One sample's mean completion tokens over a table (prompts weighted equally): what a budget of ``1x``
    is in the tokens unit. InputError when the table has no token counts."""
    m = np.asarray(mean_completion_tokens, dtype=np.float64)
    if m.size == 0 or np.isnan(m).all():
        raise InputError("a budget written as a multiple (e.g. 4x) needs completion_tokens in the outcome table.")
    return float(np.nanmean(m))

