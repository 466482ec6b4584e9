"""The replay server: vLLM's OpenAI API answered from recorded samples — a SIMULATOR whose seconds are its
configured timing model's (:mod:`isocompute.replay.timing`), not a measurement of any GPU.

Routes: ``GET /health``, ``GET /v1/models``, ``GET /metrics`` (vLLM's names: ``vllm:num_requests_running``,
``vllm:num_requests_waiting``, ``vllm:generation_tokens_total``, ``vllm:prompt_tokens_total``,
``vllm:request_success_total{finished_reason}``), ``POST /v1/completions`` and ``POST /v1/chat/completions``
(``n``, ``seed``, ``max_tokens``, ``temperature``, ``stream``, ``stream_options``, ``logprobs``,
``return_token_ids``; other fields are accepted and ignored), and ``/admin/faults``
(:mod:`isocompute.replay.faults`). A prompt is matched to a row by its text, its id, or the longest row
prompt it contains (a chat rendered in a template); an unknown prompt is a 400 — except a request for one
token, which gets one filler token whatever its prompt (the gateway's readiness check sends ``"1"``; one
token is no recorded sample). A closed stream stops its samples at once (aiohttp cancels the handler).

Ignores: several prompts in one request, ``echo``, stop strings, ``best_of``, tools.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from isocompute.errors import InputError
from isocompute.replay.faults import Faults, parse_header
from isocompute.replay.replies import Draws, Seq, chat_chunk, completion_chunk, usage_chunk
from isocompute.replay.table import ReplayRow, ReplaySample, ReplayTable
from isocompute.replay.timing import Scheduler, TimingModel

__all__ = ["ReplayServer"]

_ONE_TOKEN = ReplayRow("-", "", 1, (ReplaySample(1, ""),))


class Dropped(Exception):
    """The ``drop`` fault: cut the connection without ending the stream."""


class ReplayServer:
    """One replay server on ``host:port`` over ``table`` with ``timing`` (module docstring); ``start`` and
    ``stop`` it inside a running event loop."""

    def __init__(self, table: ReplayTable, timing: TimingModel, *, host: str = "127.0.0.1", port: int = 8001,
                 max_model_len: int = 131072) -> None:
        self.table, self.timing, self.host, self.port = table, timing, host, port
        self.max_model_len = max_model_len
        self.sched = Scheduler(timing)
        self.faults = Faults()
        self.draws = Draws()
        self.generation_tokens = 0
        self.prompt_tokens = 0
        self.success: Counter[str] = Counter()
        self.app = web.Application(client_max_size=16 * 2**20)
        self.app.add_routes([web.get("/health", self.health), web.get("/v1/models", self.models),
                             web.get("/metrics", self.metrics), web.post("/v1/completions", self.completions),
                             web.post("/v1/chat/completions", self.chat), web.get("/admin/faults", self.get_faults),
                             web.post("/admin/faults", self.set_faults), web.delete("/admin/faults", self.clear_faults)])
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._refusing: asyncio.Task[None] | None = None

    # ---- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        await self._listen()

    async def _listen(self) -> None:
        assert self._runner is not None
        self._site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await self._site.start()

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if self._refusing is not None:
            self._refusing.cancel()
        if runner is not None:
            await runner.cleanup()

    async def refuse(self, seconds: float) -> None:
        """Stop listening for ``seconds`` (new connections are refused; kept-alive ones are closed, and a request
        on one still open is cut), then listen again."""
        if self._site is not None:
            await self._site.stop()
            self._site = None
        if self._runner is not None and self._runner.server is not None:
            for conn in list(self._runner.server.connections):
                conn.close()
        try:
            await asyncio.sleep(seconds)
        finally:
            if self._runner is not None and self._site is None:
                await self._listen()

    # ---- small routes ---------------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def models(self, request: web.Request) -> web.Response:
        m = self.table.model
        return web.json_response({"object": "list", "data": [{
            "id": m, "object": "model", "created": 0, "owned_by": "isocompute-replay (simulator)", "root": m,
            "parent": None, "max_model_len": self.max_model_len}]})

    async def metrics(self, request: web.Request) -> web.Response:
        lab = f'model_name="{self.table.model}"'
        lines = ["# HELP isocompute_replay_simulator 1: this server replays recorded samples on a timing model.",
                 "# TYPE isocompute_replay_simulator gauge", "isocompute_replay_simulator 1",
                 "# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{{{lab}}} {self.sched.requests_running}",
                 "# TYPE vllm:num_requests_waiting gauge", f"vllm:num_requests_waiting{{{lab}}} {self.sched.requests_waiting}",
                 "# TYPE vllm:generation_tokens_total counter", f"vllm:generation_tokens_total{{{lab}}} {self.generation_tokens}",
                 "# TYPE vllm:prompt_tokens_total counter", f"vllm:prompt_tokens_total{{{lab}}} {self.prompt_tokens}",
                 "# TYPE vllm:request_success_total counter"]
        lines += [f'vllm:request_success_total{{finished_reason="{r}",{lab}}} {self.success[r]}'
                  for r in ("stop", "length", "abort")]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def get_faults(self, request: web.Request) -> web.Response:
        return web.json_response(self.faults.to_dict())

    async def set_faults(self, request: web.Request) -> web.Response:
        try:
            data = await request.json()
            if not isinstance(data, dict):
                raise InputError("the body must be a JSON object of faults, e.g. {\"status\": 503}")
            faults = Faults.from_mapping(data, where="POST /admin/faults")
        except (InputError, ValueError) as e:
            return _error(400, str(e))
        self.faults = faults
        self.sched.slowdown = faults.slowdown
        refuse_s, faults.refuse_s = faults.refuse_s, 0.0  # a one-off: done once it is scheduled
        if refuse_s:
            self._refusing = asyncio.get_running_loop().create_task(self.refuse(refuse_s))
        return web.json_response(self.faults.to_dict())

    async def clear_faults(self, request: web.Request) -> web.Response:
        if self._refusing is not None and not self._refusing.done():
            self._refusing.cancel()  # listen again now
            await asyncio.gather(self._refusing, return_exceptions=True)
        self.faults = Faults()
        self.sched.slowdown = 1.0
        return web.json_response(self.faults.to_dict())

    # ---- generation -----------------------------------------------------------------------------

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        if self._site is None and request.transport is not None:  # refusing: cut a kept-alive connection too
            request.transport.abort()
            raise web.HTTPServiceUnavailable(text="replay fault: refusing connections")
        try:
            body = await request.json()
            ask = _Ask.parse(body, chat=chat, model=self.table.model)
            header = request.headers.get("x-replay-fault")
            fault = parse_header(header) if header else self.faults.take()
        except json.JSONDecodeError:
            return _error(400, "the body is not JSON; send a JSON object (OpenAI's completions request)")
        except _NotFound as e:
            return _error(404, str(e), "NotFoundError")
        except InputError as e:
            return _error(400, str(e))
        if fault is not None and fault.status:
            return _error(fault.status, f"replay fault: HTTP {fault.status} on request", "ReplayFault")
        row = self.table.find(ask.prompt)
        if row is None and ask.max_tokens == 1:
            row = _ONE_TOKEN
        if row is None:
            return _error(400, f"prompt not in the replay's tables (first 80 characters: {ask.prompt[:80]!r}); send "
                          "a prompt of the outcome tables it serves (or a row's id)")
        samples = self.draws.draw(row, ask.n, ask.seed, ask.temperature)
        if ask.logprobs is not None and any(s.confidence is None or s.logprob_mean is None for s in samples):
            return _error(400, f"row {row.id!r} has no recorded confidence (logprob_mean, confidence_min_window); "
                          "ask without logprobs, or replay a table sampled with --logprobs")
        seqs = [Seq(j, s, ask.max_tokens) for j, s in enumerate(samples)]
        self.prompt_tokens += row.prompt_tokens
        if ask.stream:
            return await self._stream(request, ask, seqs, row.prompt_tokens, fault)
        return await self._whole(ask, seqs, row.prompt_tokens, fault)

    async def _decode(self, seqs: list[Seq], prompt_tokens: int, fault: Faults | None
                      ) -> AsyncIterator[list[tuple[Seq, int, int]]]:
        """Each step's ``(seq, start, k)`` runs of tokens, at the timing model's pace (module docstring of
        :mod:`isocompute.replay.timing`); the fault's stall or drop after ``after_tokens``."""
        sched, interval = self.sched, self.timing.stream_interval
        await sched.admit(len(seqs))
        left = list(seqs)
        stalled = False
        try:
            if self.timing.prefill_s_per_token:
                await asyncio.sleep(self.timing.prefill_s_per_token * prompt_tokens)
            while left:
                pos = left[0].pos
                if fault is not None and pos >= fault.after_tokens:
                    if fault.drop:
                        raise Dropped
                    if fault.stall_s and not stalled:
                        stalled = True
                        await asyncio.sleep(fault.stall_s)
                step = min(interval, min(s.length for s in left) - pos)
                if fault is not None and pos < fault.after_tokens:
                    step = min(step, fault.after_tokens - pos)
                await asyncio.sleep(step / sched.rate())
                for s in left:
                    s.pos += step
                self.generation_tokens += step * len(left)
                done = sum(s.pos == s.length for s in left)
                if done:  # the step's finishes go last: a client that stops at one has every other's tokens
                    out = [(s, pos, step) for s in left if s.pos < s.length]
                    out += [(s, pos, step) for s in left if s.pos == s.length]
                    left = out[: len(left) - done]
                    left = [s for s, _, _ in left]
                    sched.release(done)
                else:
                    out = [(s, pos, step) for s in left]
                yield out
        finally:
            sched.release(len(left), request_done=True)

    async def _stream(self, request: web.Request, ask: _Ask, seqs: list[Seq], prompt_tokens: int,
                      fault: Faults | None) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        head = {"id": f"{'chatcmpl' if ask.chat else 'cmpl'}-{uuid.uuid4().hex}",
                "object": "chat.completion.chunk" if ask.chat else "text_completion", "created": int(time.time()),
                "model": self.table.model}
        usage = ask.continuous_usage
        finished = False
        try:
            async for runs in self._decode(seqs, prompt_tokens, fault):
                if ask.chat:
                    events = [chat_chunk(head, s, a, k, prompt_tokens=prompt_tokens, usage=usage) for s, a, k in runs]
                else:
                    events = [completion_chunk(head, s, a, k, prompt_tokens=prompt_tokens, usage=usage,
                                               ids=ask.token_ids, logprobs=ask.logprobs) for s, a, k in runs]
                await resp.write("".join(events).encode())
            finished = True
        except Dropped:
            if request.transport is not None:
                request.transport.abort()
            self.success["abort"] += 1
            return resp
        finally:
            if not finished:
                self.success["abort"] += 0 if fault is not None and fault.drop else 1
        tail = usage_chunk(head, prompt_tokens, sum(s.length for s in seqs)) if ask.include_usage else ""
        await resp.write(f"{tail}data: [DONE]\n\n".encode())
        self.success["length" if any(s.finish == "length" for s in seqs) else "stop"] += 1
        await resp.write_eof()
        return resp

    async def _whole(self, ask: _Ask, seqs: list[Seq], prompt_tokens: int, fault: Faults | None) -> web.Response:
        texts: list[list[str]] = [[] for _ in seqs]
        try:
            async for runs in self._decode(seqs, prompt_tokens, fault):
                for s, a, k in runs:
                    texts[s.index].append(s.text(a, k))
        except Dropped:
            self.success["abort"] += 1
            raise web.HTTPInternalServerError(text="replay fault: dropped") from None
        except asyncio.CancelledError:
            self.success["abort"] += 1
            raise
        self.success["length" if any(s.finish == "length" for s in seqs) else "stop"] += 1
        completion = sum(s.length for s in seqs)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                 "total_tokens": prompt_tokens + completion}
        base = {"id": f"cmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": self.table.model, "usage": usage}
        if ask.chat:
            return web.json_response({**base, "object": "chat.completion", "choices": [
                {"index": s.index, "message": {"role": "assistant", "content": "".join(texts[s.index])},
                 "logprobs": None, "finish_reason": s.finish} for s in seqs]})
        choices = []
        for s in seqs:
            c: dict[str, Any] = {"index": s.index, "text": "".join(texts[s.index]), "finish_reason": s.finish,
                                 "stop_reason": None,
                                 "logprobs": None if ask.logprobs is None else s.logprobs(s.length, ask.logprobs)}
            if ask.token_ids:
                c["token_ids"] = [1] * s.length
            choices.append(c)
        return web.json_response({**base, "object": "text_completion", "choices": choices})


class _NotFound(InputError):
    pass


class _Ask:
    """A generation request's fields, checked (vLLM's defaults where one is missing)."""

    __slots__ = ("chat", "continuous_usage", "include_usage", "logprobs", "max_tokens", "n", "prompt", "seed",
                 "stream", "temperature", "token_ids")

    @classmethod
    def parse(cls, body: Any, *, chat: bool, model: str) -> _Ask:
        if not isinstance(body, dict):
            raise InputError("the body must be a JSON object (OpenAI's completions request)")
        if body.get("model") not in (None, model):
            raise _NotFound(f"The model `{body.get('model')}` does not exist; this replay serves `{model}`")
        a = cls()
        a.chat = chat
        a.prompt = _prompt_text(body, chat)
        a.n = _int(body.get("n", 1), "n", 1)
        mt = body.get("max_completion_tokens", body.get("max_tokens")) if chat else body.get("max_tokens", 16)
        a.max_tokens = None if mt is None else _int(mt, "max_tokens", 1)
        a.temperature = float(body.get("temperature", 1.0) if body.get("temperature") is not None else 1.0)
        a.seed = None if body.get("seed") is None else _int(body["seed"], "seed", None)
        a.stream = bool(body.get("stream", False))
        opts = body.get("stream_options") or {}
        a.include_usage = bool(opts.get("include_usage"))
        a.continuous_usage = bool(opts.get("continuous_usage_stats"))
        lp = body.get("logprobs")
        if chat and lp:
            raise InputError("logprobs on /v1/chat/completions are not replayed; ask /v1/completions")
        a.logprobs = None if lp is None or chat else _int(lp, "logprobs", 0)
        a.token_ids = bool(body.get("return_token_ids", False))
        return a


def _int(v: Any, name: str, least: int | None) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or (least is not None and v < least):
        raise InputError(f"{name} must be an integer{'' if least is None else f' >= {least}'}; got {v!r}")
    return v


def _prompt_text(body: dict[str, Any], chat: bool) -> str:
    if chat:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise InputError("messages must be a non-empty list of {role, content}")
        users = [m.get("content") for m in msgs if isinstance(m, dict) and m.get("role") == "user"]
        text = users[-1] if users else msgs[-1].get("content") if isinstance(msgs[-1], dict) else None
        if isinstance(text, list):
            text = "".join(p.get("text", "") for p in text if isinstance(p, dict))
        if not isinstance(text, str):
            raise InputError("the last user message has no text content")
        return text
    p = body.get("prompt")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str):
        p = p[0]
    if not isinstance(p, str):
        raise InputError("prompt must be one string (the replay answers one prompt per request)")
    return p


def _error(status: int, message: str, kind: str = "BadRequestError") -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "param": None, "code": status},
                              "object": "error", "message": message, "type": kind, "code": status}, status=status)
