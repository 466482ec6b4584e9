"""Circuit breaking for one upstream: a bounded, jittered exponential cooldown and a half-open probe.

States, as in a proxy's outlier detection (Envoy) or the classic circuit breaker::

    closed ──a request fails──▶ open ──cooldown over──▶ half-open: one probe in flight
      ▲                          ▲                            │
      │                          └──── the probe fails ───────┤ (level + 1)
      └──────────────────────────── the probe answers ────────┘ (level reset to 0)

Only a closed upstream gets traffic; while it is open the caller fails fast (nothing is sent), and the
probe — one small real request, sent by the engine, not by a client — decides when traffic goes back.
Cooldown after the ℓ-th consecutive failed probe (ℓ = 0 when a closed upstream first fails)::

    cooldown(ℓ) = min(cap, base · 2^min(ℓ, MAX_LEVEL)) · (1 + u) / 2,    u ~ U[0, 1)

The exponent is capped, so no arithmetic on the request path grows with the length of an outage, and the
jitter in [½, 1) keeps several gateways from probing a restarted server in lock-step. Worked example:
``base = 0.5 s``, ``cap = 5 s``, ``u → 1``: cooldowns 0.5, 1, 2, 4, 5, 5, … s; one answered probe and the
next failure waits 0.5 s again.

Epochs: the requests in flight when an upstream dies fail together, and only the first is news. A request
records :attr:`Breaker.epoch` when it is sent; :meth:`Breaker.trip` counts its failure only while the
breaker is still closed in that epoch (the epoch moves on every change of state), so 32 simultaneous
failures open it once, at ℓ = 0.

Hard and soft failures: a refused or reset connection (or none within the connect timeout) is *hard* —
:meth:`Breaker.trip` opens the breaker at once. An HTTP 5xx answer or a request that got no answer in time
is *soft* — the server is there and may answer the next one; one long generation is not an outage — so
:meth:`Breaker.strike` opens it only after ``threshold`` of them in a row (a success clears the strikes).

:class:`UpstreamPool` holds one :class:`Breaker` per upstream and does the balancing around them: the
best closed upstream (fewest outstanding requests, round-robin among ties), fail-fast when none is
closed, and the probe task that runs while one is open. How to probe is the engine's (a callable). When
an upstream's connection fails (it died), the requests still waiting on it are *abandoned* — cancelled
and retried on a closed one, when there is one — instead of each waiting out its own timeout: a server
killed with a request queued on a socket it no longer serves would otherwise hold that request until its
deadline. When it *refuses* a connection — nothing listens there any more — they are abandoned even when
no other upstream is closed (their retry then fails fast): a server that stops listening does not answer
what it had either (vLLM on SIGTERM closes its socket and leaves the requests in flight unanswered, their
connections open). Such a server is not always sent a new request that would find out (the balancer
prefers upstreams with fewer requests waiting, and a drained one piles them up), so while requests wait
on an upstream a *watch* (the engine's ``listening`` callable: one TCP connect) asks every
``watch_interval`` seconds whether anything still listens there; a refusal counts as a refused request.

A server can also listen and answer nothing (a wedged engine, one starved of its CPU or GPU). The watch
calls it *stalled* when it answered nothing for ``stall_s`` s, its oldest request waited as long, and
another closed upstream can take the work (idle, or answering within ``stall_s``). It is then sent one
1-token request (``stall_check``, within ``stall_s``): answered, it is slow, not stuck, and left alone for
``stall_s``; not, it is opened and its requests are abandoned to the others. A busy vLLM batches the
check in with its running requests, so only a server that decodes nothing fails it. With one upstream,
or every upstream quiet, nothing moves: there is nowhere better to send the work.

Ignores: error-rate windows over time (consecutive counts only), hedged requests (a second copy of a
slow request elsewhere: a budget pays for every sample, and a stalled upstream's requests are moved,
not copied); :class:`Breaker` ignores the clock — callers pass ``now``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from isocompute.engines.base import CircuitOpen, UpstreamMisconfigured

__all__ = ["MAX_LEVEL", "Breaker", "Upstream", "UpstreamPool", "cooldown_s"]

log = logging.getLogger("isocompute.engines")

MAX_LEVEL = 30  # 2^30 · base is past any sensible cap; the cap is what bounds the wait
MAX_COUNT = 1_000_000  # consecutive failures reported in status are counted up to here, then held
WATCH_INTERVAL_S = 1.0  # while requests wait on an upstream: how often the watch asks whether it still listens

State = Literal["closed", "open", "half_open"]


def cooldown_s(level: int, *, base: float, cap: float, u: float) -> float:
    """Seconds to keep an upstream open after its ``level``-th consecutive failed probe (module docstring).

    >>> [cooldown_s(lvl, base=0.5, cap=5.0, u=1.0) for lvl in range(6)]
    [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    >>> cooldown_s(10**9, base=0.5, cap=5.0, u=0.0)  # any level: bounded, no overflow
    2.5
    """
    return min(cap, base * 2.0 ** min(max(level, 0), MAX_LEVEL)) * (1.0 + min(max(u, 0.0), 1.0)) / 2.0


class Breaker:
    """The circuit state of one upstream (see the module docstring); times are ``time.monotonic()`` s.

    ``base``/``cap``: the first and the largest cooldown; ``rng``: the jitter's source in [0, 1).
    """

    def __init__(self, *, base: float, cap: float, rng: Callable[[], float] = random.random) -> None:
        if not (base > 0 and cap > 0):
            raise ValueError(f"cooldowns must be positive; got base={base}, cap={cap}")
        self.base, self.cap, self._rng = float(base), float(cap), rng
        self.state: State = "closed"
        self.level = 0
        self.failures = 0  # consecutive, for status (bounded by MAX_COUNT)
        self.strikes = 0  # consecutive soft failures while closed
        self.reopen_at = 0.0
        self.epoch = 0

    @property
    def closed(self) -> bool:
        return self.state == "closed"

    def probe_due(self, now: float) -> bool:
        """Open and past its cooldown: time to send the probe."""
        return self.state == "open" and now >= self.reopen_at

    def retry_after(self, now: float) -> float:
        """Seconds until the next probe is sent (0 while one is in flight or it is closed)."""
        return max(0.0, self.reopen_at - now) if self.state == "open" else 0.0

    def trip(self, *, now: float, epoch: int) -> bool:
        """A request sent in ``epoch`` failed. Open the breaker when that is news; True when it opened."""
        if self.state != "closed" or epoch != self.epoch:
            return False
        self._open(now, 0)
        return True

    def strike(self, *, now: float, epoch: int, threshold: int) -> bool:
        """A soft failure of a request sent in ``epoch``; opens the breaker at the ``threshold``-th in a row."""
        if self.state != "closed" or epoch != self.epoch:
            return False
        self.strikes += 1
        if self.strikes < threshold:
            return False
        self._open(now, 0)
        return True

    def begin_probe(self) -> None:
        self.state = "half_open"
        self.epoch += 1

    def probe_failed(self, *, now: float) -> None:
        if self.state == "half_open":  # else a request's success closed it meanwhile: that answer stands
            self._open(now, min(self.level + 1, MAX_LEVEL))

    def succeeded(self) -> None:
        """A request or the probe was answered: close, and forget the failures."""
        if self.state != "closed":
            self.epoch += 1
        self.state, self.level, self.failures, self.strikes = "closed", 0, 0, 0

    def _open(self, now: float, level: int) -> None:
        self.state, self.level, self.strikes = "open", level, 0
        self.failures = min(self.failures + 1, MAX_COUNT)
        self.reopen_at = now + cooldown_s(level, base=self.base, cap=self.cap, u=self._rng())
        self.epoch += 1


@dataclass
class Upstream:
    """One server and what the balancer knows about it."""

    url: str
    breaker: Breaker
    outstanding: int = 0
    last_error: str = ""
    misconfigured: bool = False  # its last failure said this server's settings are wrong, not that it is down
    served: int = 0
    recovery: asyncio.Task[None] | None = field(default=None, repr=False)
    watch: asyncio.Task[None] | None = field(default=None, repr=False)  # does it still listen? (module docstring)
    inflight: dict[asyncio.Task[Any], float] = field(default_factory=dict, repr=False)  # tasks awaiting it → sent at
    abandoned: set[asyncio.Task[Any]] = field(default_factory=set, repr=False)  # … told to retry elsewhere
    last_answer: float = field(default_factory=time.monotonic)  # its last answer, or stream chunk, or check

    @property
    def failures(self) -> int:
        """Consecutive failures (bounded; 0 after a success)."""
        return self.breaker.failures

    def is_up(self, now: float | None = None) -> bool:
        """Closed: it gets traffic. An open or half-open upstream gets none until its probe is answered."""
        return self.breaker.closed


class UpstreamPool:
    """The upstreams behind one engine, each with its breaker (see the module docstring).

    ``probe(upstream)`` makes one small real request and raises on any failure; it runs in a task per open
    upstream, inside the running event loop (:meth:`aclose` cancels them). ``hint`` ends the message of
    a fail-fast error (how to start a server). ``listening(upstream)``: False when nothing listens at its
    address any more; ``stall_check(upstream, timeout)`` one small real request to an upstream that looks
    stalled after ``stall_s`` s, raising when unanswered. Neither: no watch (module docstring).
    """

    def __init__(self, urls: list[str], *, cooldown: float, max_cooldown: float, errors_to_trip: int,
                 probe: Callable[[Upstream], Awaitable[None]], hint: str,
                 listening: Callable[[Upstream], Awaitable[bool]] | None = None,
                 watch_interval: float = WATCH_INTERVAL_S, stall_s: float | None = None,
                 stall_check: Callable[[Upstream, float], Awaitable[Any]] | None = None) -> None:
        if stall_s is not None and stall_s <= 0:
            raise ValueError(f"stall_s must be positive (or None: no stall check); got {stall_s}")
        self.upstreams = [Upstream(u, Breaker(base=cooldown, cap=max_cooldown)) for u in urls]
        self.errors_to_trip = errors_to_trip
        self._probe = probe
        self._hint = hint
        self._listening = listening
        self.watch_interval = watch_interval
        self.stall_s = stall_s if stall_check is not None else None
        self._stall_check = stall_check
        self._rr = itertools.count()

    def ordered(self) -> list[Upstream]:
        """Best first: closed ones by fewest outstanding (round-robin among ties), then the others by the
        end of their cooldown."""
        shift = next(self._rr)
        k = len(self.upstreams)
        order = [self.upstreams[(shift + i) % k] for i in range(k)]
        closed = sorted((u for u in order if u.breaker.closed), key=lambda u: u.outstanding)
        other = sorted((u for u in order if not u.breaker.closed), key=lambda u: u.breaker.reopen_at)
        return closed + other

    def pick(self) -> Upstream:
        """The best closed upstream; when there is none, fail fast (see :meth:`fail_fast`)."""
        best = self.ordered()[0]
        if not best.breaker.closed:
            self.fail_fast()
        return best

    def fail_fast(self) -> None:
        """Raise :class:`CircuitOpen` — or :class:`UpstreamMisconfigured` when every upstream's last
        failure was a misconfiguration — when no upstream is closed; return otherwise."""
        if any(u.breaker.closed for u in self.upstreams):
            return
        detail = "; ".join(f"{u.url}: {u.last_error or 'no answer yet'}" for u in self.upstreams)
        if all(u.misconfigured for u in self.upstreams):
            raise UpstreamMisconfigured(f"every upstream refuses what this gateway asks ({detail})")
        wait = min(u.breaker.retry_after(time.monotonic()) for u in self.upstreams)
        raise CircuitOpen(f"every upstream is down ({detail}); the next probe goes out in {wait:.1f} s; "
                          f"{self._hint}", retry_after=wait)

    def sent(self, up: Upstream) -> int:
        """The current task now awaits ``up``'s answer; returns the breaker's epoch to pass to :meth:`failed`."""
        up.outstanding += 1
        task = asyncio.current_task()
        if task is not None:
            up.inflight[task] = time.monotonic()
            watched = self._listening is not None or self.stall_s is not None
            if watched and (up.watch is None or up.watch.done()):
                up.watch = asyncio.get_running_loop().create_task(self._watch(up))
        return up.breaker.epoch

    def settled(self, up: Upstream) -> None:
        """The current task's request to ``up`` is over (answered, failed or abandoned)."""
        up.outstanding -= 1
        task = asyncio.current_task()
        up.inflight.pop(task, None)  # type: ignore[arg-type]
        up.abandoned.discard(task)  # type: ignore[arg-type]

    def was_abandoned(self, up: Upstream) -> bool:
        """Whether the CancelledError the current task just got came from :meth:`failed` abandoning its
        request to ``up`` (then it is taken back, and the caller retries), not from the caller's caller."""
        task = asyncio.current_task()
        if task not in up.abandoned:
            return False
        up.abandoned.discard(task)  # type: ignore[arg-type]
        task.uncancel()  # type: ignore[union-attr]
        return not task.cancelling()  # type: ignore[union-attr]  # cancelled by its caller too: let that win

    def failed(self, up: Upstream, error: str, epoch: int, *, hard: bool = True, abandon: bool = False,
               refused: bool = False, misconfigured: bool = False) -> None:
        """A request sent to ``up`` in ``epoch`` failed: open it (and start its probe) when that is news.
        With ``abandon`` (its connection failed) and another upstream closed, the requests still waiting on
        ``up`` are abandoned; with ``refused`` (nothing listens there) always, news or not (module docstring)."""
        up.last_error = error
        now = time.monotonic()
        opened = (up.breaker.trip(now=now, epoch=epoch) if hard or refused else
                  up.breaker.strike(now=now, epoch=epoch, threshold=self.errors_to_trip))
        if refused and up.inflight.keys() - {asyncio.current_task()}:
            log.warning("upstream %s refuses new connections (%s): its %d request(s) in flight go elsewhere or "
                        "fail now", up.url, error, len(up.inflight.keys() - {asyncio.current_task()}))
            self._abandon(up)
        if not opened:
            return
        up.misconfigured = misconfigured
        log.warning("upstream %s failed (%s); no traffic until it answers a probe in %.2g s", up.url, error,
                    up.breaker.retry_after(now))
        if up.recovery is None or up.recovery.done():
            up.recovery = asyncio.get_running_loop().create_task(self._recover(up))
        if abandon and any(u.breaker.closed for u in self.upstreams):
            self._abandon(up)

    @staticmethod
    def _abandon(up: Upstream) -> None:
        """Cancel the requests waiting on ``up`` (but the current task's), marked so they retry."""
        me = asyncio.current_task()
        for task in up.inflight.keys() - {me}:  # type: ignore[operator]
            if task not in up.abandoned:
                up.abandoned.add(task)
                task.cancel()

    async def _watch(self, up: Upstream) -> None:
        """While requests wait on ``up``: every ``watch_interval`` s, does anything still listen there? A
        refusal abandons them (:meth:`failed` with ``refused``); a slow or failed check says nothing. Then,
        with a stall check, is it stalled (module docstring)?"""
        while up.inflight:
            await asyncio.sleep(self.watch_interval)
            if not up.inflight:
                return
            if self._listening is not None:
                try:
                    listening = await self._listening(up)
                except Exception:  # a timeout or a network error: slow is not gone
                    listening = True
                if not listening:
                    self.failed(up, "it refuses new connections (shut down or shutting down)", up.breaker.epoch,
                                refused=True)
                    continue
            if self.looks_stalled(up, time.monotonic()):
                await self._check_stall(up)

    def looks_stalled(self, up: Upstream, now: float) -> bool:
        """Whether ``up`` is to get a stall check (module docstring)."""
        if (self.stall_s is None or not up.breaker.closed or not up.inflight
                or now - min(up.inflight.values()) < self.stall_s or now - up.last_answer < self.stall_s):
            return False
        return any(v is not up and v.breaker.closed and (v.outstanding == 0 or now - v.last_answer < self.stall_s)
                   for v in self.upstreams)

    async def _check_stall(self, up: Upstream) -> None:
        """One real request to ``up`` within ``stall_s``: answered, it is slow (left alone for ``stall_s``);
        not, it is opened and its waiting requests go to the others."""
        assert self._stall_check is not None and self.stall_s is not None
        epoch, waited = up.breaker.epoch, time.monotonic() - up.last_answer
        try:
            await self._stall_check(up, self.stall_s)
        except Exception as e:  # a CancelledError (the pool closing) is no Exception: it ends the watch
            log.warning("upstream %s answered nothing for %.1f s and not a 1-token check within %.3g s (%s): "
                        "stalled; its %d waiting request(s) go elsewhere", up.url, waited, self.stall_s,
                        type(e).__name__, len(up.inflight))
            self.failed(up, f"stalled: no answer for {waited:.1f} s, nor to a 1-token check within "
                            f"{self.stall_s:.3g} s", epoch, abandon=True)
            return
        up.last_answer = time.monotonic()

    @staticmethod
    def answered(up: Upstream) -> None:
        """``up`` answered a request or the probe: close it and forget its failures."""
        if not up.breaker.closed:
            log.info("upstream %s answers again; traffic resumes", up.url)
        up.last_answer = time.monotonic()
        up.breaker.succeeded()
        up.last_error, up.misconfigured = "", False

    async def _recover(self, up: Upstream) -> None:
        """Probe an open upstream after each cooldown until it answers (the half-open state)."""
        while not up.breaker.closed:
            await asyncio.sleep(up.breaker.retry_after(time.monotonic()))
            if not up.breaker.probe_due(time.monotonic()):
                continue  # a request's answer closed it meanwhile (the loop ends), or not due yet
            up.breaker.begin_probe()
            try:
                await self._probe(up)
            except Exception as e:  # the prober must outlive any failure, or the upstream stays shut
                up.last_error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
                up.misconfigured = isinstance(e, UpstreamMisconfigured)
                up.breaker.probe_failed(now=time.monotonic())
                continue
            self.answered(up)

    def status(self) -> list[dict[str, Any]]:
        """Per upstream: url, up, state, seconds until its next probe, outstanding, consecutive failures,
        served, last error, misconfigured."""
        now = time.monotonic()
        return [
            {
                "url": u.url,
                "up": u.is_up(now),
                "state": u.breaker.state,
                "retry_after": round(u.breaker.retry_after(now), 3),
                "outstanding": u.outstanding,
                "failures": u.failures,
                "served": u.served,
                "last_error": u.last_error,
                "misconfigured": u.misconfigured,
            }
            for u in self.upstreams
        ]

    async def aclose(self) -> None:
        """Stop the probe and watch tasks."""
        tasks = [t for u in self.upstreams for t in (u.recovery, u.watch) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
