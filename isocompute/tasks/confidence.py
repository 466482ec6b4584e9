"""A sample's confidence from its tokens' log-probabilities (DeepConf, Fu et al. 2025): ``logprob_mean`` and
``confidence_min_window``, the optional per-sample evidence of outcome tables.

* token confidence ``C_i = −(1/k) Σ_{j=1..k} log P_i(j)`` over the ``k`` highest log-probabilities at position
  ``i`` — ``k`` is the number of top logprobs asked for (``--logprobs K``, default 5). vLLM's completions API
  may add the sampled token to a position's top-``k`` when it is not among them (``k + 1`` entries): only the
  ``k`` highest count, so every position averages the same number of terms. A peaked position (one token
  near probability 1, the rest near 0) has a high C_i; a flat one a low C_i.
* window (group) confidence: the mean of ``C_i`` over ``window`` consecutive tokens;
  ``confidence_min_window`` is the lowest such mean over every window position (sliding by one token). A
  sample shorter than the window has one window, the whole sample. DeepConf uses 2048; ours are short
  (arith and GSM8K answers of 20–300 tokens), so :data:`DEFAULT_WINDOW` = 2048 makes it the mean
  confidence of the whole sample unless ``--confidence-window`` asks for less.
* ``logprob_mean``: the mean log-probability of the sampled tokens (≤ 0).

Worked example (k = 2, window = 2): top log-probabilities ``[[-0.1, -2.3], [-1.0, -1.2], [-0.2, -3.0]]``
give C = [1.2, 1.1, 1.6], windows [1.15, 1.35], so ``confidence_min_window`` = 1.15; sampled-token
log-probabilities ``[-0.1, -1.2, -0.2]`` give ``logprob_mean`` = −0.5.

Which distribution: the model's own (raw logits, before temperature), as vLLM's default
``logprobs_mode="raw_logprobs"`` returns them; the transformers engine reads its raw logits the same way
(:func:`stats_from_logits`), so both engines give the same numbers for the same tokens.

Ignores: where the log-probabilities come from (the engines), and what the numbers predict (the policy).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["DEFAULT_TOP_K", "DEFAULT_WINDOW", "SampleConfidence", "sample_confidence", "stats_from_logits"]

DEFAULT_TOP_K = 5
DEFAULT_WINDOW = 2048

SampleConfidence = tuple[float, float]  # (logprob_mean, confidence_min_window)


def sample_confidence(token_logprobs: Sequence[float], top_logprobs: Sequence[Sequence[float]], *,
                      k: int = DEFAULT_TOP_K, window: int = DEFAULT_WINDOW) -> SampleConfidence | None:
    """``(logprob_mean, confidence_min_window)`` of one sample (module docstring), None for an empty one.

    ``token_logprobs[i]``: the sampled token's log-probability at position ``i``; ``top_logprobs[i]``: the
    top log-probabilities there (any order, at least ``k`` of them; more are cut to the ``k`` highest).

    >>> sample_confidence([-0.1, -1.2, -0.2], [[-0.1, -2.3], [-1.0, -1.2], [-0.2, -3.0]], k=2, window=2)
    (-0.5, 1.15)
    """
    if k < 1 or window < 1:
        raise ValueError(f"need k >= 1 and window >= 1; got k={k}, window={window}")
    if len(token_logprobs) != len(top_logprobs):
        raise ValueError(f"{len(token_logprobs)} sampled-token logprobs but {len(top_logprobs)} positions of "
                         "top logprobs; they must be the same positions")
    if not token_logprobs:
        return None
    if min(map(len, top_logprobs)) < k:
        raise ValueError(f"a position has fewer than k={k} top logprobs; ask the engine for at least {k}")
    top = np.asarray([sorted(row, reverse=True)[:k] for row in top_logprobs], dtype=np.float64)
    return _stats(np.asarray(token_logprobs, dtype=np.float64), -top.mean(axis=1), window)


def stats_from_logits(logits: np.ndarray, tokens: Sequence[int], *, k: int = DEFAULT_TOP_K,
                      window: int = DEFAULT_WINDOW) -> SampleConfidence | None:
    """The same figures from a sample's raw logits, ``(steps, vocab)``, and its sampled ``tokens`` (the
    first ``len(tokens)`` steps count; later ones are padding): log-softmax per step, then the top ``k``."""
    m = len(tokens)
    if m == 0:
        return None
    x = np.asarray(logits[:m], dtype=np.float64)
    x = x - x.max(axis=1, keepdims=True)
    logp = x - np.log(np.exp(x).sum(axis=1, keepdims=True))
    top = -np.sort(-logp, axis=1)[:, :k] if k < logp.shape[1] else logp
    return _stats(logp[np.arange(m), np.asarray(tokens)], -top.mean(axis=1), window)


def _stats(sampled: np.ndarray, conf: np.ndarray, window: int) -> SampleConfidence:
    """Mean of ``sampled`` and the lowest mean of ``conf`` over sliding windows (one window if shorter)."""
    w = min(window, conf.size)
    c = np.concatenate([[0.0], np.cumsum(conf)])
    means = (c[w:] - c[:-w]) / w
    # A cumulative sum's rounding can push a window mean a hair below 0 or above the true value; clamp
    # to the range every mean of non-negative numbers lies in.
    low = float(min(max(means.min(), conf.min()), conf.max()))
    return min(float(sampled.mean()), 0.0), max(low, 0.0)
