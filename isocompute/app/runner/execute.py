"""Running upstream calls within a request's deadline, with every failure mapped to 502/503/504.

:func:`run_wave` draws one wave: for each distinct wave size n, the prompts with that n go upstream
together in ONE ``engine.generate(prompts, n, …)`` call, so the engine shares each prompt's prefix across
its n samples. A plan's waves are a loop over it (:mod:`isocompute.app.runner.plan_run`).

Every await on an upstream goes through :meth:`Backend.call`: one :class:`Deadline` per request (set
when the request arrives; the probe call and the waves share it, so no request outlives it; the engine
sees it too, in ``engines.base.REQUEST_DEADLINE``, so an upstream that stops answering is counted as
slow by its circuit breaker instead of merely cancelled) and one mapping of failures:

===============================  ======  ===================================================
the upstream call …              status  error
===============================  ======  ===================================================
ran past the request's deadline  504     ``UpstreamTimeout``
found every upstream down        503     ``CircuitOpen`` (``Retry-After``: the next probe)
was unavailable / refused        503     ``EngineUnavailable``
answered unusably / misconfig.   502     ``UpstreamBadResponse`` / ``UpstreamMisconfigured``
raised anything else             502     ``UpstreamBadResponse`` (traceback in the log)
rejected the caller's input      400     ``InputError`` (e.g. vLLM's context-length check)
===============================  ======  ===================================================

A client that disconnects cancels the request's task (see ``routes``), and with it the awaits here and
the engine's HTTP requests (``gather_or_cancel``): no upstream keeps generating for nobody.

The in-process transformers engine stops a cancelled call at its next decode step (its thread cannot be killed).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TypeVar

from isocompute.app.accounting.metrics import Metrics
from isocompute.app.errors import UpstreamTimeout
from isocompute.app.readiness import UpstreamHealth
from isocompute.engines.base import (
    REQUEST_DEADLINE,
    CircuitOpen,
    Completion,
    Engine,
    UpstreamBadResponse,
    UpstreamMisconfigured,
    gather_or_cancel,
)
from isocompute.errors import EngineUnavailable, InputError

__all__ = ["GENERATED", "Backend", "Deadline", "Meter", "run_wave"]

log = logging.getLogger("isocompute.app")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Deadline:
    """When a request must be answered by: ``seconds`` after it arrived (``time.monotonic()`` clock)."""

    at: float
    seconds: float

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(time.monotonic() + seconds, seconds)

    def remaining(self) -> float:
        return max(0.0, self.at - time.monotonic())


@dataclass(slots=True)
class Meter:
    """A request's spend so far, for its quota when it is cancelled (a disconnect): the completion tokens of
    the calls that came back, and the most the calls still in flight may generate (their samples ×
    ``max_tokens``)."""

    done: int = 0
    inflight: int = 0


# the running request's meter (set by accounting.spend for a key with quotas; None otherwise)
GENERATED: ContextVar[Meter | None] = ContextVar("isocompute_generated", default=None)


@dataclass(frozen=True, slots=True)
class Backend:
    """The engine a gateway calls, with the bookkeeping of every call (metrics, readiness); ``pool`` is
    the model pool it serves, the ``pool`` label of its upstream metrics."""

    engine: Engine
    metrics: Metrics
    health: UpstreamHealth
    pool: str = "default"  # pools.POOL_LABEL (pools imports this module)

    async def call(self, aw: Awaitable[T], *, deadline: Deadline, what: str) -> T:
        """Await ``aw`` (an upstream call) by ``deadline``; map its failure (module table)."""
        name = self.engine.name
        token = REQUEST_DEADLINE.set(deadline.at)  # the task wait_for makes copies this context
        try:
            out = await asyncio.wait_for(aw, timeout=deadline.remaining())
        except TimeoutError:
            self.metrics.upstream_errors.labels("timeout", self.pool).inc()
            raise UpstreamTimeout(f"{what} to {name} did not answer within {deadline.seconds:g} s, the request's deadline; "
                                  "retry later, lower max_tokens or budget, or raise upstream_timeout_s") from None
        except InputError:
            raise  # the upstream refused the caller's input (400): the caller's to fix
        except EngineUnavailable as e:
            self.metrics.upstream_errors.labels(_kind(e), self.pool).inc()
            self.health.failed(e)
            raise
        except Exception as e:  # an engine's own failure (a bug, a driver error) is still the upstream's, not a 500
            log.exception("%s to %s raised", what, name)
            self.metrics.upstream_errors.labels("bad_response", self.pool).inc()
            err = UpstreamBadResponse(f"{what} to {name} failed ({type(e).__name__}: {e}); the server log has "
                                      "the traceback")
            self.health.failed(err)
            raise err from e
        finally:
            REQUEST_DEADLINE.reset(token)
        self.health.answered()
        return out


def _kind(e: EngineUnavailable) -> str:
    if isinstance(e, UpstreamMisconfigured):
        return "misconfigured"
    if isinstance(e, UpstreamBadResponse):
        return "bad_response"
    return "circuit_open" if isinstance(e, CircuitOpen) else "unavailable"


async def run_wave(engine: Engine, prompts: list[str], ns: list[int], *, max_tokens: int, temperature: float,
                   seed: int | None, logprobs: int | None = None) -> list[list[Completion]]:
    """Draw ``ns[i]`` samples of ``prompts[i]``: one ``generate`` call per distinct n, concurrently (each
    with ``logprobs=K`` when given: the completions then carry their confidence).

    Raises :class:`UpstreamBadResponse` when a call returns the wrong number of results.
    """
    groups: dict[int, list[int]] = {}
    for i, n in enumerate(ns):
        groups.setdefault(n, []).append(i)
    extra = {} if logprobs is None else {"logprobs": logprobs}
    outs = await gather_or_cancel([engine.generate([prompts[i] for i in idx], n, max_tokens, temperature, seed,
                                                   **extra)
                                   for n, idx in groups.items()])
    results: list[list[Completion]] = [[] for _ in prompts]
    for idx, out in zip(groups.values(), outs, strict=True):
        if not isinstance(out, list) or len(out) != len(idx):
            got = len(out) if isinstance(out, list) else type(out).__name__
            raise UpstreamBadResponse(f"upstream {engine.name} returned {got} results for {len(idx)} prompts; "
                                      "check the upstream server")
        for i, comps in zip(idx, out, strict=True):
            results[i] = list(comps)
    return results
