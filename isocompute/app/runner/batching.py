"""Request batching for in-process engines: concurrent requests share one ``generate`` call.

The in-process transformers engine runs one ``generate`` at a time (a lock around the model) but
batches all rows of a call, so 50 queued one-prompt requests cost ~50 model calls when sent one by one
and a handful when merged. :class:`BatchingEngine` wraps such an engine: requests that arrive while a
call is running wait in a queue keyed by ``(n, max_tokens, temperature)``; when the engine is free, the
key holding the oldest waiting request sends its waiting requests (up to ``max_rows`` rows = prompts × n)
as ONE call and each gets its own slice of the result. Picking by the oldest request, not by key
order, keeps a busy key from starving the others. An idle engine dispatches at once, so a lone request waits for nothing.

Worked example: requests A (1 prompt, n=4), B (2 prompts, n=4) and C (1 prompt, n=2) queue during a
call; next call: ``generate([a, b1, b2], n=4)`` (12 rows), then ``generate([c], n=2)``.

Requests with a ``seed`` bypass the queue: a seed fixes the random stream of a whole call, so merging
would make a seeded request's samples depend on its neighbours. Errors of a merged call reach every
request in it. vLLM upstreams batch continuously by themselves and are not wrapped.

Ignores: splitting a request larger than ``max_rows`` (it goes alone).
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field
from typing import Any

from isocompute.engines.base import Completion, Engine


@dataclass
class _Pending:
    seq: int
    prompts: list[str]
    future: asyncio.Future[list[list[Completion]]] = field(repr=False)


class BatchingEngine:
    """An :class:`~isocompute.engines.base.Engine` that merges concurrent unseeded requests (see module doc).

    ``calls`` counts the calls made to the wrapped engine (for tests and metrics).
    """

    def __init__(self, engine: Engine, *, max_rows: int = 64):
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1; got {max_rows}")
        self.engine = engine
        self.name = engine.name
        self.max_rows = max_rows
        self.calls = 0
        self._queue: dict[tuple[int, int, float], list[_Pending]] = {}
        self._seq = itertools.count()
        self._worker: asyncio.Task[None] | None = None

    def __getattr__(self, item: str) -> object:
        # tokenizer, model_config() etc. of the wrapped engine stay visible to the gateway.
        return getattr(self.engine, item)

    async def generate(
        self, prompts: list[str], n: int, max_tokens: int, temperature: float, seed: int | None = None
    ) -> list[list[Completion]]:
        if seed is not None or not prompts:
            self.calls += 1
            return await self.engine.generate(prompts, n, max_tokens, temperature, seed)
        fut: asyncio.Future[list[list[Completion]]] = asyncio.get_running_loop().create_future()
        key = (n, max_tokens, float(temperature))
        self._queue.setdefault(key, []).append(_Pending(next(self._seq), list(prompts), fut))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain())
        return await fut

    async def _drain(self) -> None:
        while self._queue:
            key, waiting = min(self._queue.items(), key=lambda kv: kv[1][0].seq)
            n = key[0]
            batch, rows = [], 0
            while waiting and (not batch or rows + len(waiting[0].prompts) * n <= self.max_rows):
                p = waiting.pop(0)
                if p.future.cancelled():  # the client went away (timeout); skip its rows
                    continue
                batch.append(p)
                rows += len(p.prompts) * n
            if not waiting:
                del self._queue[key]
            if not batch:
                continue
            self.calls += 1
            call = asyncio.ensure_future(self.engine.generate([q for p in batch for q in p.prompts], n, key[1], key[2],
                                                              None))

            def gone(_: object, batch: list[_Pending] = batch, call: asyncio.Future[Any] = call) -> None:
                if all(p.future.cancelled() for p in batch):
                    call.cancel()  # every merged request went away: the engine stops at its next decode step

            for p in batch:
                p.future.add_done_callback(gone)
            try:
                out = await call
            except asyncio.CancelledError:
                if asyncio.current_task().cancelling():  # type: ignore[union-attr]
                    raise  # this worker is being closed
                continue
            except Exception as e:  # every merged request fails the same way
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(e)
                continue
            start = 0
            for p in batch:
                if not p.future.done():
                    p.future.set_result(out[start:start + len(p.prompts)])
                start += len(p.prompts)

    async def aclose(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
        await self.engine.aclose()
