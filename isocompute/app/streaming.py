"""A generation request's response: OpenAI's JSON body, or with ``stream: true`` its server-sent events, the
answer sent once the vote is decided; and the race of a request's work against its client's disconnect.

A streamed request is validated, priced and routed before the stream opens (a refusal is an ordinary JSON
4xx); then :func:`answer_events` runs the request's waves and, while they run, keeps the connection alive
with an SSE comment (``: keep-alive``) every ``stream_keepalive_s`` — OpenAI's clients and every SSE parser
skip comments, and proxies do not time the connection out. When the vote is decided the answer goes out in
OpenAI's chunk format:

======================  ===========================================================================
chat                    a ``chat.completion.chunk`` with ``delta.role``, one with the answer's
                        ``delta.content``, one with ``finish_reason`` and the ``isocompute`` object
completions             one ``text_completion`` chunk per prompt (its text, ``finish_reason`` and the
                        choice's ``isocompute``); the last also carries the top-level ``isocompute``
``include_usage``       (``stream_options``) every chunk has ``usage: null`` and a last chunk with no
                        choices carries the usage, ``flops`` included
end                     ``data: [DONE]``
======================  ===========================================================================

A failure after the stream opened (the upstream gone mid-request, the deadline) is one ``data:`` event
``{"error": {...}}`` in OpenAI's error shape, then ``[DONE]``. A client that disconnects — seen at once,
not at the next write — cancels the request's task, and with it every upstream call in flight (a
parallel-stop wave's stream is closed: vLLM aborts it).

Worked example (chat, include_usage)::

    : keep-alive
    data: {"object":"chat.completion.chunk",…,"choices":[{"index":0,"delta":{"role":"assistant","content":""},…}],"usage":null}
    data: {…,"choices":[{"index":0,"delta":{"content":"The answer is 12."},…}],"usage":null}
    data: {…,"choices":[{"index":0,"delta":{},"finish_reason":"stop",…}],"usage":null,"isocompute":{…}}
    data: {…,"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":10,"total_tokens":20,"flops":…}}
    data: [DONE]

Ignores: streaming the samples' tokens as they decode (the answer exists only once the vote is decided).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Literal, TypeVar

from starlette.requests import Request

from isocompute.app.errors import ClientDisconnected, classify, error_body
from isocompute.app.runner.answer import Answer
from isocompute.app.schemas import (
    ChatChoice,
    ChatCompletionResponse,
    ChatMessageOut,
    CompletionChoice,
    CompletionResponse,
    Usage,
)
from isocompute.errors import IsoComputeError

__all__ = ["DONE", "KEEPALIVE", "answer_events", "chat_response", "completion_response", "head", "unless_disconnected",
           "usage_of", "wait_disconnect"]

T = TypeVar("T")

KEEPALIVE = b": keep-alive\n\n"
DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


def usage_of(answers: Sequence[Answer]) -> dict[str, Any]:
    """The request's usage: tokens summed over its prompts, FLOPs when every prompt's are known."""
    p = sum(a.prompt_tokens for a in answers)
    c = sum(a.completion_tokens for a in answers)
    flops = None if any(a.flops is None for a in answers) else sum(a.flops or 0.0 for a in answers)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c, "flops": flops}


async def wait_disconnect(receive: Callable[[], Awaitable[dict[str, Any]]]) -> None:
    """Returns when the client has gone (the request body was read, so the next message is the disconnect)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """``work``'s result, unless the client disconnects first: then ``work`` is cancelled (its upstream
    calls with it) and :class:`ClientDisconnected` raised (499 in the log; nobody reads the answer) — the
    pattern of vLLM's ``with_cancellation``.

    ``work`` runs in this task — only the watcher is a task of its own, which on a disconnect cancels this
    one — so a request pays no extra scheduling hop when its work is done.
    """
    me = asyncio.current_task()
    assert me is not None
    done = False

    def on_disconnect(watch: asyncio.Future[None]) -> None:
        if not done and not watch.cancelled():
            me.cancel()

    watch = asyncio.ensure_future(wait_disconnect(request.receive))
    watch.add_done_callback(on_disconnect)
    try:
        return await work
    except asyncio.CancelledError:
        if not (watch.done() and not watch.cancelled()):
            raise  # cancelled for another reason (shutdown): let it go
        me.uncancel()
        raise ClientDisconnected("the client closed the connection; its upstream work was cancelled") from None
    finally:
        done = True
        watch.cancel()


def head(kind: Literal["chat", "text"], model: str) -> dict[str, Any]:
    """The fields every chunk of a response starts with: a new id, the object type, created, model."""
    if kind == "chat":
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk", "created": int(time.time()),
                "model": model}
    return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()), "model": model}


def chat_response(h: dict[str, Any], answers: list[Answer]) -> ChatCompletionResponse:
    """A chat's JSON response: one assistant message, the aggregated answer."""
    [a] = answers
    return ChatCompletionResponse(
        id=h["id"], created=h["created"], model=h["model"],
        choices=[ChatChoice(index=0, message=ChatMessageOut(content=a.text), finish_reason=a.finish_reason)],
        usage=Usage(**usage_of(answers)), isocompute=a.info)


def completion_response(h: dict[str, Any], answers: list[Answer]) -> CompletionResponse:
    """A completion's JSON response: one aggregated choice per prompt."""
    return CompletionResponse(
        id=h["id"], created=h["created"], model=h["model"],
        choices=[CompletionChoice(index=i, text=a.text, finish_reason=a.finish_reason, isocompute=a.info)
                 for i, a in enumerate(answers)],
        usage=Usage(**usage_of(answers)), isocompute=answers[0].info)


def _info(a: Answer) -> dict[str, Any]:
    return a.info.model_dump(mode="json", by_alias=True)


def _chunks(kind: Literal["chat", "text"], answers: list[Answer], head: dict[str, Any],
            usage: bool) -> list[dict[str, Any]]:
    """The answer's chunks, in order (module docstring)."""
    extra = {"usage": None} if usage else {}
    if kind == "chat":
        [a] = answers
        choice = {"index": 0, "logprobs": None, "finish_reason": None}
        out = [{**head, "choices": [{**choice, "delta": {"role": "assistant", "content": ""}}], **extra},
               {**head, "choices": [{**choice, "delta": {"content": a.text}}], **extra},
               {**head, "choices": [{**choice, "delta": {}, "finish_reason": a.finish_reason}], **extra,
                "isocompute": _info(a)}]
    else:
        out = [{**head, "choices": [{"index": i, "text": a.text, "logprobs": None, "finish_reason": a.finish_reason,
                                     "isocompute": _info(a)}], **extra} for i, a in enumerate(answers)]
        out[-1]["isocompute"] = _info(answers[0])
    if usage:
        out.append({**head, "choices": [], "usage": usage_of(answers)})
    return out


async def answer_events(work: Awaitable[list[Answer]], receive: Callable[[], Awaitable[dict[str, Any]]], *,
                        kind: Literal["chat", "text"], head: dict[str, Any], include_usage: bool,
                        keepalive_s: float) -> AsyncIterator[bytes]:
    """The SSE stream of one request (module docstring): ``work`` the request's answers, ``head`` the
    fields every chunk starts with (id, object, created, model)."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(wait_disconnect(receive))
    try:
        while not task.done():
            await asyncio.wait({task, gone}, timeout=keepalive_s, return_when=asyncio.FIRST_COMPLETED)
            if gone.done():
                return  # nobody reads on: the finally cancels the upstream work
            if not task.done():
                yield KEEPALIVE
        try:
            answers = task.result()
        except IsoComputeError as e:
            status, type_, code = classify(e)
            yield _event(error_body(str(e), type_, code=code or str(status)))
            yield DONE
            return
        for chunk in _chunks(kind, answers, head, include_usage):
            yield _event(chunk)
        yield DONE
    finally:
        for t in (task, gone):
            if not t.done():
                t.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
