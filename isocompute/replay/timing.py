"""The replay's timing: a stated model of a vLLM server's speed, not a measurement of one.

A request for ``n`` samples waits until its ``n`` sequences fit under ``max_seqs`` in flight (vLLM's
``max_num_seqs``; requests queue first-in first-out beyond it, a request of more than ``max_seqs`` runs alone),
then spends ``prefill_s_per_token · prompt_tokens`` seconds on its prompt, then decodes every sequence at the
same rate

    r = min(decode_tps, max_tps / running) / slowdown     tokens per second per sequence,

where ``running`` counts the sequences decoding on the whole server at that moment (``max_tps``: the
server's aggregate ceiling). A sample of ``L`` tokens therefore finishes after ``Σ step / r`` over its
chunks, and the samples of one request finish in length order. Tokens go out ``stream_interval`` at a time
per sequence (vLLM's ``--stream-interval``); each chunk's duration is priced at the rate in force when it
starts. A sequence leaves ``running`` when it finishes or its stream closes.

Worked example: ``decode_tps=50, max_tps=200``: with 2 sequences running each decodes at 50 tok/s; with 8,
at 25 tok/s, so an 8-sample wave of 100-token answers takes 4 s of decode.

Ignores: batching granularity, KV-cache pressure and preemption, prefix caching, the prompt's own length
in the decode rate.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

from isocompute.errors import InputError

__all__ = ["Scheduler", "TimingModel"]


@dataclass(frozen=True)
class TimingModel:
    """The configured speeds (module docstring); ``stream_interval``: tokens per chunk per sequence."""

    prefill_s_per_token: float = 0.0
    decode_tps: float = 50.0
    max_tps: float = 5000.0
    max_seqs: int = 256
    stream_interval: int = 1

    def __post_init__(self) -> None:
        if self.prefill_s_per_token < 0 or self.decode_tps <= 0 or self.max_tps <= 0:
            raise InputError(f"need prefill_s_per_token >= 0 and positive decode_tps and max_tps; got "
                             f"{self.prefill_s_per_token}, {self.decode_tps}, {self.max_tps}")
        if self.max_seqs < 1 or self.stream_interval < 1:
            raise InputError(f"need max_seqs >= 1 and stream_interval >= 1; got {self.max_seqs}, "
                             f"{self.stream_interval}")


class Scheduler:
    """Sequences in flight and requests waiting, under one :class:`TimingModel` (module docstring);
    ``slowdown`` (≥ 1) divides every rate (the ``slow`` fault)."""

    def __init__(self, timing: TimingModel) -> None:
        self.timing = timing
        self.running = 0  # sequences decoding (or prefilling) now
        self.requests_running = 0
        self.slowdown = 1.0
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()

    @property
    def requests_waiting(self) -> int:
        return len(self._waiting)

    def rate(self) -> float:
        """Tokens per second per sequence now."""
        t = self.timing
        return min(t.decode_tps, t.max_tps / max(self.running, 1)) / self.slowdown

    def _fits(self, n: int) -> bool:
        return self.running == 0 or self.running + n <= self.timing.max_seqs

    async def admit(self, n: int) -> None:
        """Wait until ``n`` sequences may run (first-in first-out), then count them running."""
        if not self._waiting and self._fits(n):
            self.running += n
            self.requests_running += 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((n, fut))
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # admitted just as the client left: give the slots back
                self.release(n, request_done=True)
            else:
                self._waiting.remove((n, fut))
                self._wake()
            raise

    def release(self, k: int, *, request_done: bool = False) -> None:
        """``k`` sequences stopped (finished or closed); ``request_done``: their request has none left."""
        self.running -= k
        self.requests_running -= request_done
        self._wake()

    def _wake(self) -> None:
        while self._waiting and self._fits(self._waiting[0][0]):
            n, fut = self._waiting.popleft()
            if fut.done():
                continue
            self.running += n
            self.requests_running += 1
            fut.set_result(None)
