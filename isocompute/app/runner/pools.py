"""Model pools: the engines a gateway samples from, one per model name, each with its own model facts.

A **pool** is one engine — a :class:`~isocompute.engines.vllm_http.VLLMHTTPEngine` over that model's
vLLM servers (load-balanced, failed over and circuit-broken across them), or an in-process engine —
with its own :class:`~isocompute.app.runner.execute.Backend` (so its failures and readiness are its own), its
tokenizer (chat template, prompt length), its FLOP model (``usage.flops``) and its context length:

==========================================  =====================================================
flags                                       pools
==========================================  =====================================================
``--upstream URL … --model DIR``            the one pool of a single-model gateway (as before)
``--upstream tiny-s=URL --upstream tiny-l=URL --model tiny-s=DIR``
                                            ``tiny-s`` (chat template and FLOPs from DIR) and
                                            ``tiny-l`` (facts from the checkpoint vLLM says it serves)
``--engine transformers --model a=DIR1 --model b=DIR2``
                                            two in-process pools
==========================================  =====================================================

The **default pool** — where a single-model policy's plans and a probe run — is the bare one when there
is one, else the first named pool. ``GET /ready`` is ready when every pool answers
(:class:`PoolsHealth`). :func:`missing_pools_message` is the error for a model no pool serves (start-up
refuses such a policy; a request meeting one gets 503). :func:`check_context` refuses a prompt too long
for a pool's model (400): prompt tokens + ``max_tokens`` must fit its context length, e.g. 30 + 8 > 32.

Ignores: moving a model between pools at run time (restart the gateway), and pools sharing servers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from isocompute.app.accounting.metrics import Metrics
from isocompute.app.readiness import UpstreamHealth
from isocompute.app.runner.execute import Backend
from isocompute.engines.base import Engine
from isocompute.errors import InputError

__all__ = ["DEFAULT", "POOL_LABEL", "ModelPool", "Pool", "PoolsHealth", "check_context", "missing_pools", "missing_pools_message"]

DEFAULT = ""  # the bare pool's name
POOL_LABEL = "default"  # the bare pool's name in the metrics' ``pool`` label and in messages


@dataclass(frozen=True, slots=True)
class ModelPool:
    """What the start-up found for one model: its engine, tokenizer, FLOP model and context length."""

    engine: Engine
    tokenizer: Any = None
    model_flops: Any = None
    context_limit: int | None = None


@dataclass(frozen=True, slots=True)
class Pool:
    """A pool in use: its model name (``DEFAULT`` for the bare pool), facts and backend."""

    name: str
    engine: Engine
    backend: Backend
    tokenizer: Any
    model_flops: Any
    context_limit: int | None

    @property
    def health(self) -> UpstreamHealth:
        return self.backend.health

    @classmethod
    def of(cls, name: str, facts: ModelPool, metrics: Metrics, backend: Backend | None = None) -> Pool:
        backend = backend or Backend(facts.engine, metrics, UpstreamHealth(), name or POOL_LABEL)
        return cls(name, facts.engine, backend, facts.tokenizer, facts.model_flops, facts.context_limit)


class PoolsHealth:
    """Readiness of several pools: ``ok`` when every one answers; ``detail`` names the first that does not
    (a pool listed under two names — the default pool is one of the named ones — is checked once, under
    the name listed first)."""

    def __init__(self, pools: Mapping[str, Pool]) -> None:
        self._pools = pools

    def _healths(self) -> list[tuple[str, UpstreamHealth]]:
        seen: dict[int, tuple[str, UpstreamHealth]] = {}
        for name, p in self._pools.items():
            seen.setdefault(id(p.health), (name or POOL_LABEL, p.health))
        return list(seen.values())

    @property
    def ok(self) -> bool:
        return all(h.ok for _, h in self._healths())

    @property
    def detail(self) -> str | None:
        for name, h in self._healths():
            if not h.ok:
                return f"model pool {name!r}: {h.detail}"
        return None


def missing_pools(models: Iterable[str], pools: Mapping[str, Any]) -> list[str]:
    """The models of ``models`` with no named pool, in order of first appearance."""
    return list(dict.fromkeys(m for m in models if m not in pools))


def missing_pools_message(missing: list[str], pools: Mapping[str, Any], what: str = "the policy's actions") -> str:
    have = ", ".join(sorted(n for n in pools if n != DEFAULT)) or "none"
    upstreams = " ".join(f"--upstream {m}=URL" for m in missing)
    dirs = " ".join(f"--model {m}=DIR" for m in missing)
    return (f"no pool for model(s) {', '.join(missing)}, used by {what} (named pools here: {have}); start the "
            f"gateway with {upstreams} (a vLLM server serving each) or {dirs} (in-process)")


def check_context(counts: Sequence[int], max_tokens: int, limit: int, *, model: str = DEFAULT,
                  index: Sequence[int] | None = None) -> None:
    """Raise :class:`InputError` (400) for the first prompt whose ``counts`` tokens plus ``max_tokens`` exceed
    ``limit``, the context length of pool ``model``'s model; ``index``: the prompts' numbers in the request."""
    for i, n in zip(range(len(counts)) if index is None else index, counts, strict=True):
        if n + max_tokens > limit:
            tokens, whose = ("", "the model's") if model == DEFAULT else (f" for model {model!r}", f"{model!r}'s")
            raise InputError(f"prompt {i} has {n} tokens{tokens}; with max_tokens={max_tokens} that exceeds "
                             f"{whose} context of {limit} tokens; shorten the prompt or lower max_tokens")
