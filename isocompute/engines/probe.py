"""The probe feature: mean per-token entropy of one short greedy answer, and what that call costs.

One cheap model call per prompt: decode greedily for at most ``max_tokens`` tokens and average the
entropy of the model's next-token distribution over the generated positions,

    H̄(x) = (1/m) Σ_{t=1..m} H(p_t),   H(p) = − Σ_v p_v log p_v  (nats),

where p_t = softmax(logits_t) are the model's raw next-token probabilities (temperature 1, before any
logits processor) at generated position t, and m ≤ max_tokens counts the generated tokens up to and
including the first end-of-sequence token (the engines' ``completion_tokens`` convention). A model
unsure how to start its answer has a high H̄; the policy uses it as one extra feature column
(:class:`isocompute.policy.policy.ProbeSpec`).

Worked example: two generated tokens whose distributions over a 4-token vocabulary are uniform
(H = log 4 = 1.386) and one-hot (H = 0) give H̄ = 0.693 nats.

Back-ends: each engine implements the protocol's ``probe_entropy(prompts, max_tokens)`` method
(:class:`isocompute.engines.base.Engine`) with the helpers here; :func:`probe_entropy` checks the
arguments and calls it:

* ``transformers`` — exact: ``model.generate(do_sample=False, output_logits=True)`` returns every
  step's full logits, under the engine's lock, so a probe never interleaves with a generation on the
  same model.
* ``vllm-http`` — estimated from ``/v1/completions`` with ``"logprobs": 20`` (vLLM's default cap,
  ``max_logprobs``): the top-k log-probabilities ℓ_1…ℓ_k of each step are renormalised,
  q_j = e^{ℓ_j} / Σ_i e^{ℓ_i}, and Ĥ = − Σ_j q_j log q_j (:func:`topk_entropy`). Exact when the top k
  hold all the mass; otherwise the unseen tail is dropped, which biases Ĥ low (the tail's own spread is
  lost) — by little when the top 20 hold nearly all the mass, as they usually do for a greedy answer.
  The OpenAI format keys ``top_logprobs`` by token *text*, so two tokens that decode to the same string
  collapse into one entry (rare; byte-fallback pieces). ``finish_reason`` aside, the server's
  ``token_logprobs`` list gives m (:func:`completion_logprobs_entropy`).
* ``vllm`` (in-process) — the same top-k estimate from ``SamplingParams(logprobs=20)`` (keyed by token
  id, so nothing collapses).

Cost (:func:`probe_flops`, :func:`probe_cost`): the probe is its own request before the sampling
request, so it pays a full prefill of the prompt plus m − 1 decode steps
(:mod:`isocompute.flops.analytic`); the prefix is counted as *not* shared with the samples that follow
(exact for the transformers engine, which has no prefix cache; an overcount under vLLM's automatic
prefix caching, which would reuse the probe's prefill). In ``samples`` units its cost is
Σ_i probe_i / Σ_i sample_i, the probe's FLOPs over those of one sample of mean completion length m̄_i
(one prefill + its decode), summed over prompts so a budget in samples still means the same FLOPs.

Ignores: stop strings, chat templating (callers pass the text the model sees), and the probe's answer
text itself (a greedy answer could double as a sample; it is not reused).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from isocompute.errors import EngineUnavailable, InputError
from isocompute.flops import ModelFlops, decode_flops, prefill_flops

__all__ = ["PROBE_NAME", "TOP_LOGPROBS", "ProbeResult", "completion_logprobs_entropy", "entropy_from_logits",
           "mean_entropy", "probe_cost", "probe_entropy", "probe_flops", "run_probe", "topk_entropy"]

PROBE_NAME = "greedy_entropy"
TOP_LOGPROBS = 20  # vLLM's default max_logprobs


@dataclass(frozen=True, eq=False)
class ProbeResult:
    """Per prompt: ``values`` mean token entropy (nats), ``prompt_tokens`` and ``completion_tokens`` of the
    greedy call (what its cost is measured from); ``method``: ``exact`` or ``top20`` (renormalised top-k)."""

    values: np.ndarray
    prompt_tokens: np.ndarray
    completion_tokens: np.ndarray
    method: str

    @staticmethod
    def of(values: Sequence[float], prompt_tokens: Sequence[int], completion_tokens: Sequence[int],
           method: str) -> ProbeResult:
        """From per-prompt lists (float64 values, int64 token counts)."""
        return ProbeResult(np.asarray(values, dtype=np.float64), np.asarray(prompt_tokens, dtype=np.int64),
                           np.asarray(completion_tokens, dtype=np.int64), method)

    @staticmethod
    def concat(parts: Sequence[ProbeResult]) -> ProbeResult:
        if not parts:
            return ProbeResult(np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64), "exact")
        return ProbeResult(np.concatenate([p.values for p in parts]),
                           np.concatenate([p.prompt_tokens for p in parts]),
                           np.concatenate([p.completion_tokens for p in parts]), parts[0].method)


# ------------------------------------------------------------------------------------------------ maths


def entropy_from_logits(logits: ArrayLike) -> np.ndarray:
    """H(softmax(z)) in nats over the last axis, stable for large or −inf logits.

    >>> round(float(entropy_from_logits([0.0, 0.0, 0.0, 0.0])), 4)  # uniform over 4: log 4
    1.3863
    >>> float(entropy_from_logits([0.0, -np.inf]))
    0.0
    """
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    p = np.exp(logp)
    return -(p * np.where(p > 0, logp, 0.0)).sum(axis=-1)


def topk_entropy(logprobs: ArrayLike) -> float:
    """Entropy of the renormalised top-k distribution from k log-probabilities (see the module doc).

    >>> round(topk_entropy([np.log(0.5), np.log(0.25)]), 4)  # q = (2/3, 1/3)
    0.6365
    """
    lp = np.asarray(logprobs, dtype=np.float64)
    lp = lp[np.isfinite(lp)]
    if lp.size == 0:
        return 0.0
    return float(entropy_from_logits(lp))


def mean_entropy(step_entropy: Sequence[float]) -> float:
    """H̄: the mean of the generated positions' entropies, 0 for an empty answer.

    >>> mean_entropy([np.log(4), 0.0]), mean_entropy([])  # the module docstring's worked example
    (0.6931471805599453, 0.0)
    """
    return float(np.mean(step_entropy)) if len(step_entropy) else 0.0


def completion_logprobs_entropy(data: Mapping[str, Any]) -> tuple[float, int, int]:
    """(mean top-k entropy, generated tokens, prompt tokens) of one OpenAI ``/v1/completions`` answer
    asked with ``"logprobs": k`` (see the module docstring)."""
    try:
        choice = (data.get("choices") or [])[0]
        top = choice["logprobs"]["top_logprobs"]
    except (IndexError, KeyError, TypeError):
        raise EngineUnavailable("the upstream answered without logprobs; the probe needs an OpenAI-compatible "
                                "completions server that supports \"logprobs\" (vLLM does)") from None
    steps = [topk_entropy(list(d.values())) for d in top if d]
    prompt_tokens = int((data.get("usage") or {}).get("prompt_tokens", 0))
    return mean_entropy(steps), len(top), prompt_tokens


# ------------------------------------------------------------------------------------------------- cost


def probe_flops(model: ModelFlops, prompt_tokens: ArrayLike, probe_tokens: ArrayLike) -> np.ndarray:
    """FLOPs of each probe call: its own prefill plus m − 1 decode steps (prefix not shared).

    >>> probe_flops(ModelFlops(10, 0, 1, 1, 10), [5], [3]).tolist()  # 200 + 92 (see solver.costs)
    [292.0]
    """
    p = np.asarray(prompt_tokens, dtype=np.float64)
    m = np.asarray(probe_tokens, dtype=np.float64)
    return np.asarray(prefill_flops(model, p) + decode_flops(model, p, m), dtype=np.float64).reshape(p.shape)


def probe_cost(model: ModelFlops, prompt_tokens: ArrayLike, probe_tokens: ArrayLike, *, unit: str,
               mean_completion_tokens: ArrayLike | None = None, sample_model: ModelFlops | None = None,
               sample_prompt_tokens: ArrayLike | None = None) -> float:
    """The probe's declared cost per prompt: its mean FLOPs (``unit="flops"``) or, in ``samples``, its
    FLOPs over those of one sample, summed over the prompts (see the module docstring).

    ``model``/``prompt_tokens``/``probe_tokens``: the probe model and each probe call's token counts.
    One sample is a prefill of ``sample_prompt_tokens`` (default ``prompt_tokens``) plus the decode of
    ``mean_completion_tokens`` on ``sample_model`` (default ``model``; the probe may be a smaller model).

    Example (toy model ``ModelFlops(10, 0, 1, 1, 10)``, p = 5): a probe of m = 3 tokens costs 200 + 92 =
    292 FLOPs; a sample of m̄ = 9 costs 200 + 2·10·8 + 4·(8·5 + 36) = 664; the probe costs 0.44 samples.
    """
    probe = probe_flops(model, prompt_tokens, probe_tokens)
    if unit == "flops":
        return float(probe.mean())
    if unit != "samples":
        raise InputError(f"unknown cost unit {unit!r}; use samples or flops.")
    if mean_completion_tokens is None:
        raise InputError("a probe cost in samples needs the samples' mean completion tokens (the outcome table's "
                         "completion_tokens); or declare the cost yourself (--probe-cost).")
    p = prompt_tokens if sample_prompt_tokens is None else sample_prompt_tokens
    one = probe_flops(sample_model or model, p, mean_completion_tokens)
    return float(probe.sum() / one.sum())


# ---------------------------------------------------------------------------------------------- engines


async def probe_entropy(engine: Any, prompts: Sequence[str], max_tokens: int = 8) -> ProbeResult:
    """Mean token entropy of a greedy answer of at most ``max_tokens`` tokens, per prompt (module doc),
    from the engine's own ``probe_entropy`` method.

    ``prompts`` are the texts the model sees (chat-templated where the model samples that way).
    Raises :class:`EngineUnavailable` for an engine that cannot run it (saying which can).
    """
    if max_tokens < 1:
        raise InputError(f"the probe needs max_tokens >= 1; you passed {max_tokens}.")
    prompts = list(prompts)
    if not prompts:
        return ProbeResult.concat([])
    method = getattr(engine, "probe_entropy", None)  # an engine from elsewhere may not implement it
    if method is None:
        raise EngineUnavailable(f"engine {getattr(engine, 'name', type(engine).__name__)!r} cannot run the entropy "
                                "probe; serve a probe policy with the transformers, vllm-http or vllm engine, or a "
                                "policy fitted without --probe-model.")
    return await method(prompts, max_tokens)


def run_probe(engine: Any, prompts: Sequence[str], max_tokens: int = 8, *, chunk: int = 256,
              progress: bool = False) -> ProbeResult:
    """:func:`probe_entropy` over many prompts in chunks, from synchronous code, with a progress bar."""
    from tqdm.auto import tqdm

    prompts = list(prompts)

    async def go() -> ProbeResult:
        parts = []
        with tqdm(total=len(prompts), desc="probe: greedy entropy", unit="prompt", disable=not progress) as bar:
            for s in range(0, len(prompts), chunk):
                parts.append(await probe_entropy(engine, prompts[s:s + chunk], max_tokens))
                bar.update(len(prompts[s:s + chunk]))
        return ProbeResult.concat(parts)

    return asyncio.run(go())
