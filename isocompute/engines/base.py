"""The generation protocol every back-end implements.

``generate(prompts, n, max_tokens, temperature, seed)`` returns, for each prompt, ``n`` completions with
their text and token counts. Prompts are plain strings (already chat-templated where needed); an engine
that shares the prompt prefix across the ``n`` samples reports ``prompt_tokens`` once per prompt.
Engines are async so the gateway can serve many requests on one event loop; CPU-bound engines run their
work in a thread.

``generate(…, logprobs=K, confidence_window=W)`` also asks for the ``K`` top log-probabilities of every
generated token and sets each completion's ``logprob_mean`` and ``confidence_min_window`` from them
(:mod:`isocompute.tasks.confidence`, window ``W`` tokens); off (``logprobs=None``) by default.

``probe_entropy(prompts, max_tokens)`` is the policy's probe feature, one greedy answer per prompt and its
mean token entropy (:mod:`isocompute.engines.probe`); each back-end computes it its own way.

A caller's deadline reaches the engine in :data:`REQUEST_DEADLINE` (a context variable, so the protocol's
signature does not change). Failures an engine raises are :class:`~isocompute.errors.EngineUnavailable`
or one of its subclasses here, so the gateway can tell a caller *why* (and map each to an HTTP status in
one table): :class:`CircuitOpen` (every upstream is known down; fail fast, come back after
``retry_after`` s), :class:`UpstreamBadResponse` (it answered with something unusable) and
:class:`UpstreamMisconfigured` (it answered, but says the *server* is set up wrong, e.g. it does not
serve the model asked for).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from isocompute.errors import EngineUnavailable, InputError
from isocompute.tasks.confidence import DEFAULT_WINDOW

if TYPE_CHECKING:
    from isocompute.engines.probe import ProbeResult


@dataclass(frozen=True, slots=True)
class Completion:
    """One sampled completion.

    ``finish_reason`` follows OpenAI: ``"stop"`` (an end token or stop string) or ``"length"``
    (``max_tokens`` reached); ``"abort"`` marks a sample of a streamed wave stopped before it finished
    (:func:`stream_wave`): its text and tokens are what it had generated then.

    ``logprob_mean`` and ``confidence_min_window`` (:mod:`isocompute.tasks.confidence`) are set when the
    call asked for them (``generate(…, logprobs=K)``), else None.
    """

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str = "stop"
    logprob_mean: float | None = None
    confidence_min_window: float | None = None


REQUEST_DEADLINE: ContextVar[float | None] = ContextVar("isocompute_request_deadline", default=None)
"""When the caller needs the answer by (``time.monotonic()`` seconds), or None. A caller with a deadline
(the gateway) sets it around its call; an engine that waits on the network ends each wait a little before
it, so the engine sees — and counts against that upstream — a timeout that would otherwise only cancel it.
Engines that ignore it are bounded by the caller's own cancellation."""


class CircuitOpen(EngineUnavailable):
    """Every upstream is cooling down after failures: the request was not sent. ``retry_after``: seconds
    until the next upstream is probed again."""

    def __init__(self, message: str, retry_after: float):
        super().__init__(message)
        self.retry_after = retry_after


class UpstreamBadResponse(EngineUnavailable):
    """The upstream answered, but with nothing usable (not JSON, missing fields, wrong number of results)."""


class UpstreamMisconfigured(UpstreamBadResponse):
    """The upstream refuses what this server is configured to ask (an unknown model name, a missing API
    key): an operator's fix, not the caller's; the message says which setting to change."""


def check_generate_args(n: int, max_tokens: int, temperature: float, logprobs: int | None = None,
                        confidence_window: int = DEFAULT_WINDOW) -> None:
    """Every engine's argument check, so a bad request fails the same way on every back-end."""
    if n < 1 or max_tokens < 1 or temperature < 0:
        raise InputError(
            f"need n >= 1, max_tokens >= 1 and temperature >= 0; got n={n}, "
            f"max_tokens={max_tokens}, temperature={temperature}"
        )
    if (logprobs is not None and not 1 <= logprobs <= 20) or confidence_window < 1:
        raise InputError(f"need 1 <= logprobs <= 20 (top log-probabilities per token; vLLM's default cap is "
                         f"20) and confidence_window >= 1; got logprobs={logprobs}, "
                         f"confidence_window={confidence_window}")


async def gather_or_cancel(aws: list[Awaitable[Any]]) -> list[Any]:
    """``asyncio.gather`` that cancels the others when one fails, so no orphaned request keeps a server busy
    for an answer nobody will read."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        raise


@runtime_checkable
class Engine(Protocol):
    """A generation back-end. ``name`` identifies it in logs, outcome tables and metrics."""

    name: str

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
        """Return ``len(prompts)`` lists of ``n`` completions each, in prompt order (with their confidence
        when ``logprobs`` is given; module docstring).

        Raises :class:`isocompute.errors.EngineUnavailable` when the back-end cannot serve.
        """
        ...

    async def aclose(self) -> None:
        """Release connections, threads or model memory."""
        ...

    async def probe_entropy(self, prompts: list[str], max_tokens: int) -> ProbeResult:
        """Mean per-token entropy of one greedy answer of at most ``max_tokens`` tokens per prompt, with
        the calls' token counts (:mod:`isocompute.engines.probe` defines it; call it through
        :func:`isocompute.engines.probe.probe_entropy`, which checks the arguments).

        Raises :class:`isocompute.errors.EngineUnavailable` when the back-end cannot serve it.
        """
        ...


OnFinish = Callable[[int, Completion], Awaitable[bool]]
"""Called as each sample of a streamed wave finishes, with its index in the wave and its completion;
returns whether to stop the wave (abort the samples still decoding)."""


@dataclass(frozen=True, slots=True)
class WaveStream:
    """One prompt's streamed wave: ``completions`` in index order (the aborted ones with
    ``finish_reason == "abort"`` and the tokens generated until the stop), the finished indices in
    finish order, and whether ``on_finish`` stopped it (False: every sample finished).

    ``first_token_s``: seconds from when the wave's request was sent to its first streamed chunk with
    content (None where nothing was streamed: a wave generated whole and replayed). ``saved_tokens``: the
    tokens the stop saved against letting the wave finish, where known (a replayed wave: its full lengths
    exist; 0 when it was not stopped), None where not (a real stream's aborted samples never finished)."""

    completions: list[Completion]
    finish_order: list[int]
    stopped: bool
    first_token_s: float | None = None
    saved_tokens: int | None = None

    @property
    def aborted(self) -> int:
        return sum(c.finish_reason == "abort" for c in self.completions)

    @property
    def tokens(self) -> int:
        return sum(c.completion_tokens for c in self.completions)


async def replay_finishes(comps: list[Completion], on_finish: OnFinish) -> WaveStream:
    """A wave generated whole, replayed as if its samples had decoded in lock-step: they finish in order
    of their completion tokens (ties by index); when ``on_finish`` says stop after a sample of L tokens,
    each sample not yet finished is aborted at ``min(its tokens, L)`` tokens with empty text (it would
    have had L tokens then, or finished at L in the same step as the stopper; its partial text is not
    known here and never votes). Exact for lock-step decoding; an approximation of a real server's
    interleaving. ``saved_tokens``: Σ (full length − aborted length) over the aborted samples."""
    order = sorted(range(len(comps)), key=lambda j: (comps[j].completion_tokens, j))
    out = list(comps)
    for pos, j in enumerate(order):
        if await on_finish(j, comps[j]) and pos + 1 < len(order):
            at = comps[j].completion_tokens
            for r in order[pos + 1:]:
                c = comps[r]
                out[r] = Completion("", c.prompt_tokens, min(c.completion_tokens, at), "abort")
            saved = sum(comps[r].completion_tokens - out[r].completion_tokens for r in order[pos + 1:])
            return WaveStream(out, order[: pos + 1], True, saved_tokens=saved)
    return WaveStream(out, order, False, saved_tokens=0)


async def stream_wave(engine: Engine, prompt: str, n: int, max_tokens: int, temperature: float,
                      seed: int | None, on_finish: OnFinish, *, logprobs: int | None = None,
                      confidence_window: int = DEFAULT_WINDOW) -> WaveStream:
    """``n`` samples of ``prompt``, ``on_finish`` called as each finishes, the rest aborted when it says
    stop: the engine's own ``stream_wave`` where it has one (vllm-http streams and closes the request;
    the transformers engine stops its batch mid-decode), else ``generate`` and :func:`replay_finishes`.

    ``logprobs=K``: each finished sample carries its ``logprob_mean`` and ``confidence_min_window``
    (window ``confidence_window``), as ``generate(…, logprobs=K)`` gives them; aborted samples carry none.
    Off (None) by default: the call is then exactly the one without these arguments."""
    own = getattr(engine, "stream_wave", None)
    conf: dict[str, Any] = ({} if logprobs is None
                            else {"logprobs": logprobs, "confidence_window": confidence_window})
    if own is not None:
        return await own(prompt, n, max_tokens, temperature, seed, on_finish, **conf)
    [comps] = await engine.generate([prompt], n, max_tokens, temperature, seed, **conf)
    return await replay_finishes(list(comps), on_finish)
