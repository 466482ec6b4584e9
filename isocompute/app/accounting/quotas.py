"""Spend quotas per API key: the completion tokens (and FLOPs) a key's requests actually generated, over time.

A key's record (:class:`~isocompute.app.accounting.auth.ApiKeyRecord`) may set ``tokens_per_window`` (a
rolling window of ``window_s`` seconds, default 3600), ``tokens_per_day`` and ``flops_per_day`` (the UTC
day). Before a request starts — after pricing, before any upstream call — :meth:`Quotas.admit` reserves its
worst case: ``P · (cap · max_tokens + probe_tokens)`` completion tokens for ``P`` prompts of at most ``cap``
samples each (``probe_tokens``: the policy's probe's ``max_tokens``, 0 without one), and ``P · cap · F`` FLOPs
(``F``: one sample of ``max_tokens`` on the largest model). When that exceeds what is left, ``cap`` is lowered
to the most samples per prompt that fit; when not even one fits, it is refused (429 — 403 past the whole quota; ``Retry-After``
the seconds until enough frees up: the rolling window's oldest spend leaving it, or the next UTC midnight).
After the request the reservation is settled to what it generated (:meth:`Hold.settle`); a request cancelled
by its client's disconnect settles to what came back plus the worst case of its calls in flight
(:mod:`isocompute.app.accounting.spend`). ``cap`` is the largest plan the policy serves, within the request's caps.

Worked example: ``tokens_per_window = 1000``, 32 prompts, ``max_tokens = 16``, cap 16 → worst case 8192 > 1000,
so the cap becomes ``⌊1000 / (32 · 16)⌋ = 1``; if they generate 5 tokens each, 160 are charged and 840 left;
the next such request fits ``⌊840 / 512⌋ = 1`` sample per prompt, and once less than 512 are left it is
refused until the first charge leaves the window.

Stores: :class:`MemoryStore` (one gateway process; exact rolling window) and :class:`RedisStore` (gateway
replicas sharing keys; the window kept as ``BUCKETS`` time buckets, so spend leaves it in steps of
``window_s / 60``; reservation atomic in one Lua script, reads with MGET). An unreachable Redis fails
closed: requests of keys with quotas are refused with 503 (:class:`~isocompute.errors.EngineUnavailable`).

Ignores: prompt tokens (only generated tokens are counted) and the probe's and extra features' FLOPs in the
worst case (they are charged after the request).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from isocompute.app.errors import PermissionDenied, RateLimited
from isocompute.errors import EngineUnavailable, InputError

__all__ = ["BUCKETS", "Hold", "MemoryStore", "QuotaLimits", "Quotas", "RedisStore", "Remaining", "Snapshot",
           "open_store"]

DAY_S = 86_400.0
BUCKETS = 60  # a Redis window's time buckets
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class QuotaLimits:
    """A key's quotas (None: not limited)."""

    tokens_per_window: int | None = None
    window_s: float = 3600.0
    tokens_per_day: int | None = None
    flops_per_day: float | None = None

    @property
    def any(self) -> bool:
        return not (self.tokens_per_window is None and self.tokens_per_day is None and self.flops_per_day is None)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A key's spend now: the rolling window's charges as (time it leaves the window, tokens), oldest first;
    the UTC day's tokens and FLOPs."""

    window: list[tuple[float, float]]
    day_tokens: float
    day_flops: float

    @property
    def window_tokens(self) -> float:
        return sum(a for _, a in self.window)


def next_midnight(now: float) -> float:
    return (math.floor(now / DAY_S) + 1) * DAY_S


@dataclass(frozen=True, slots=True)
class Remaining:
    """What a key has left (None where it has no such quota) and the seconds until some spend next frees up
    (the window's oldest charge leaving it, or the next UTC midnight)."""

    tokens: float | None
    tokens_day: float | None
    flops_day: float | None
    reset_s: float

    @classmethod
    def of(cls, snap: Snapshot, limits: QuotaLimits, now: float) -> Remaining:
        resets = [next_midnight(now) - now] if limits.tokens_per_day or limits.flops_per_day else []
        if limits.tokens_per_window is not None:
            resets.append(snap.window[0][0] - now if snap.window else limits.window_s)
        left = (None if limits.tokens_per_window is None else max(0.0, limits.tokens_per_window - snap.window_tokens),
                None if limits.tokens_per_day is None else max(0.0, limits.tokens_per_day - snap.day_tokens),
                None if limits.flops_per_day is None else max(0.0, limits.flops_per_day - snap.day_flops))
        return cls(*left, reset_s=max(0.0, min(resets)))

    def headers(self) -> dict[str, str]:
        """``X-Quota-Remaining-Tokens`` (rolling window), ``-Tokens-Day``, ``-Flops-Day``, ``X-Quota-Reset-Seconds``."""
        out = {}
        for name, v in (("Tokens", self.tokens), ("Tokens-Day", self.tokens_day), ("Flops-Day", self.flops_day)):
            if v is not None:
                out[f"X-Quota-Remaining-{name}"] = f"{v:.0f}" if name != "Flops-Day" else f"{v:.6g}"
        out["X-Quota-Reset-Seconds"] = str(math.ceil(self.reset_s))
        return out


class QuotaStore(Protocol):
    """Where spend is kept: read a key's :class:`Snapshot`; ``reserve`` tokens/FLOPs atomically when they
    fit every quota (a reference for :meth:`settle`) or None; ``settle`` adds deltas to a reservation."""

    url: str

    async def read(self, name: str, limits: QuotaLimits, now: float) -> Snapshot: ...

    async def reserve(self, name: str, limits: QuotaLimits, tokens: int, flops: float, now: float) -> Any | None: ...

    async def settle(self, ref: Any, tokens: int, flops: float) -> None: ...

    async def aclose(self) -> None: ...


def fits(snap: Snapshot, limits: QuotaLimits, tokens: float, flops: float) -> bool:
    return ((limits.tokens_per_window is None or snap.window_tokens + tokens <= limits.tokens_per_window)
            and (limits.tokens_per_day is None or snap.day_tokens + tokens <= limits.tokens_per_day)
            and (limits.flops_per_day is None or snap.day_flops + flops <= limits.flops_per_day))


class MemoryStore:
    """Spend in this process: per key its window's charges ``[time, tokens]`` and its day's totals."""

    url = "memory"

    def __init__(self) -> None:
        self._window: dict[tuple[str, float], deque[list[float]]] = {}
        self._day: dict[str, list[float]] = {}  # name → [day, tokens, flops]

    def _snap(self, name: str, limits: QuotaLimits, now: float) -> tuple[Snapshot, deque[list[float]], list[float]]:
        w = self._window.setdefault((name, limits.window_s), deque())
        while w and w[0][0] + limits.window_s <= now:
            w.popleft()
        day = math.floor(now / DAY_S)
        d = self._day.get(name)
        if d is None or d[0] != day:
            d = self._day[name] = [day, 0.0, 0.0]
        return Snapshot([(t + limits.window_s, a) for t, a in w], d[1], d[2]), w, d

    async def read(self, name: str, limits: QuotaLimits, now: float) -> Snapshot:
        return self._snap(name, limits, now)[0]

    async def reserve(self, name: str, limits: QuotaLimits, tokens: int, flops: float, now: float) -> Any | None:
        snap, w, d = self._snap(name, limits, now)
        if not fits(snap, limits, tokens, flops):
            return None
        event = [now, float(tokens)]
        if limits.tokens_per_window is not None:
            w.append(event)
        d[1] += tokens
        d[2] += flops
        return event, d

    async def settle(self, ref: Any, tokens: int, flops: float) -> None:
        event, d = ref
        event[1] = max(0.0, event[1] + tokens)  # a charge already out of the window changes nothing
        d[1] = max(0.0, d[1] + tokens)  # a day already over: its record is gone from the store
        d[2] = max(0.0, d[2] + flops)

    async def aclose(self) -> None:
        pass


# KEYS: the window's BUCKETS buckets (oldest first; none without a window quota), the day's tokens, the day's
# FLOPs. ARGV: number of buckets, window / day / FLOP limits (-1: none), tokens, FLOPs, bucket and day TTLs.
RESERVE = """
local n = tonumber(ARGV[1])
local wl, dl, fl = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local t, f = tonumber(ARGV[5]), tonumber(ARGV[6])
local used = 0
if n > 0 then
  local vals = redis.call('MGET', unpack(KEYS, 1, n))
  for i = 1, n do used = used + (tonumber(vals[i]) or 0) end
end
local dused = tonumber(redis.call('GET', KEYS[n + 1]) or '0')
local fused = tonumber(redis.call('GET', KEYS[n + 2]) or '0')
if (wl >= 0 and used + t > wl) or (dl >= 0 and dused + t > dl) or (fl >= 0 and fused + f > fl) then return 0 end
if n > 0 then redis.call('INCRBY', KEYS[n], t); redis.call('EXPIRE', KEYS[n], ARGV[7]) end
if dl >= 0 then redis.call('INCRBY', KEYS[n + 1], t); redis.call('EXPIRE', KEYS[n + 1], ARGV[8]) end
if fl >= 0 then redis.call('INCRBYFLOAT', KEYS[n + 2], ARGV[6]); redis.call('EXPIRE', KEYS[n + 2], ARGV[8]) end
return 1
"""
# KEYS: the keys a reservation went to; ARGV: per key its delta and 'i' (INCRBY) or 'f' (INCRBYFLOAT). A key
# that expired meanwhile is left alone (the spend has left its window or day).
SETTLE = """
for i, k in ipairs(KEYS) do
  if redis.call('EXISTS', k) == 1 then
    if ARGV[2 * i] == 'f' then redis.call('INCRBYFLOAT', k, ARGV[2 * i - 1])
    else redis.call('INCRBY', k, ARGV[2 * i - 1]) end
  end
end
return 1
"""


class RedisStore:
    """Spend in Redis, shared by every gateway pointed at ``url`` (``redis://host:port/db``): per key and
    window ``BUCKETS`` integer buckets of ``window_s / BUCKETS`` seconds each (``EXPIRE``d after the window),
    the day's tokens and FLOPs; keys ``isocompute:quota:{name}:…`` (one hash slot per key name)."""

    def __init__(self, url: str, *, timeout_s: float = 2.0, prefix: str = "isocompute:quota:") -> None:
        import redis.asyncio as aioredis

        self.url, self.prefix = url, prefix
        self.client = aioredis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self._reserve = self.client.register_script(RESERVE)
        self._settle = self.client.register_script(SETTLE)

    def _keys(self, name: str, limits: QuotaLimits, now: float) -> tuple[list[str], list[float], str, str]:
        base = f"{self.prefix}{{{name}}}:"
        day = math.floor(now / DAY_S)
        buckets, leaves = [], []
        if limits.tokens_per_window is not None:
            width = limits.window_s / BUCKETS
            cur = math.floor(now / width)
            idx = range(cur - BUCKETS + 1, cur + 1)
            buckets = [f"{base}w{limits.window_s:g}:{i}" for i in idx]
            leaves = [(i + BUCKETS) * width for i in idx]
        return buckets, leaves, f"{base}d:{day}", f"{base}f:{day}"

    async def read(self, name: str, limits: QuotaLimits, now: float) -> Snapshot:
        buckets, leaves, dkey, fkey = self._keys(name, limits, now)
        vals = await self.client.mget([*buckets, dkey, fkey])
        window = [(t, float(v)) for t, v in zip(leaves, vals[:len(buckets)], strict=True) if v is not None and float(v)]
        return Snapshot(window, float(vals[-2] or 0), float(vals[-1] or 0))

    async def reserve(self, name: str, limits: QuotaLimits, tokens: int, flops: float, now: float) -> Any | None:
        buckets, _, dkey, fkey = self._keys(name, limits, now)
        lim = [-1 if v is None else v for v in (limits.tokens_per_window, limits.tokens_per_day, limits.flops_per_day)]
        ttl = math.ceil(limits.window_s + limits.window_s / BUCKETS) + 60
        ok = await self._reserve(keys=[*buckets, dkey, fkey],
                                 args=[len(buckets), *map(repr, lim), int(tokens), repr(float(flops)), ttl,
                                       int(2 * DAY_S)])
        if not int(ok):
            return None
        ref = [(buckets[-1], "i")] if buckets else []
        if limits.tokens_per_day is not None:
            ref.append((dkey, "i"))
        if limits.flops_per_day is not None:
            ref.append((fkey, "f"))
        return ref

    async def settle(self, ref: Any, tokens: int, flops: float) -> None:
        args: list[Any] = []
        for _, kind in ref:
            args += [repr(float(flops)), "f"] if kind == "f" else [int(tokens), "i"]
        if ref:
            await self._settle(keys=[k for k, _ in ref], args=args)

    async def aclose(self) -> None:
        await self.client.aclose()


def open_store(url: str) -> QuotaStore:
    """The store a ``quota_store`` setting names: ``memory`` or a ``redis://`` / ``rediss://`` / ``unix://`` URL."""
    if url == "memory":
        return MemoryStore()
    if url.startswith(("redis://", "rediss://", "unix://")):
        return RedisStore(url)
    raise InputError(f"quota_store {url!r}: send 'memory' or a Redis URL such as redis://127.0.0.1:6379/0")


@dataclass
class Hold:
    """A request's reservation: the samples per prompt it may draw (``cap``), what it reserved, and what the
    key had left before it (``before``) and after it was settled (``after``)."""

    quotas: Quotas
    name: str
    limits: QuotaLimits
    cap: int
    tokens: int
    flops: float
    ref: Any
    before: Remaining
    after: Remaining | None = None
    settled: bool = field(default=False)

    async def settle(self, tokens: int, flops: float | None) -> None:
        """Charge what the request generated instead of its reservation (once)."""
        if self.settled:
            return
        self.settled = True
        df = 0.0 if flops is None or not math.isfinite(flops) else flops - self.flops
        await self.quotas.guard(self.quotas.store.settle(self.ref, int(tokens) - self.tokens, df))
        now = self.quotas.clock()
        self.after = Remaining.of(await self.quotas.guard(self.quotas.store.read(self.name, self.limits, now)),
                                  self.limits, now)

    def headers(self) -> dict[str, str]:
        """The quota headers: after the request when settled, else before it (a stream's, sent first)."""
        return (self.after or self.before).headers()


class Quotas:
    """The gateway's quota logic over one store (module docstring); ``clock``: wall-clock seconds (UTC days)."""

    def __init__(self, store: QuotaStore, clock: Callable[[], float] = time.time) -> None:
        self.store, self.clock = store, clock
        self.errors = 0  # calls to the store that failed (isocompute_quota_store_errors_total)

    async def guard(self, work: Awaitable[T]) -> T:
        """``work``, or 503 when the store cannot be reached (fail closed)."""
        if isinstance(self.store, MemoryStore):
            return await work
        from redis.exceptions import RedisError

        try:
            return await work
        except (RedisError, OSError) as e:
            self.errors += 1
            raise EngineUnavailable(
                f"the quota store {self.store.url} cannot be reached ({type(e).__name__}: {e}); requests of keys "
                "with spend quotas are refused until it is back — check the Redis server") from None

    async def admit(self, name: str, limits: QuotaLimits, *, prompts: int, max_tokens: int, cap: int,
                    probe_tokens: int = 0, sample_flops: float | None = None) -> Hold:
        """Reserve the request's worst case with ``cap`` lowered to fit (module docstring), or raise 429."""
        if limits.flops_per_day is not None and sample_flops is None:
            raise EngineUnavailable(f"key {name!r} has a flops_per_day quota and this gateway cannot count FLOPs "
                                    "(no model config); start it with --model DIR")
        f1 = sample_flops or 0.0
        for _ in range(5):  # a reservation raced by another request's: read again and refit
            now = self.clock()
            snap = await self.guard(self.store.read(name, limits, now))
            before = Remaining.of(snap, limits, now)
            fit = self.fit(before, prompts=prompts, max_tokens=max_tokens, cap=cap, probe_tokens=probe_tokens,
                           sample_flops=f1)
            if fit < 1:
                raise self.refusal(name, limits, snap, now, prompts * (max_tokens + probe_tokens), prompts * f1)
            tokens, flops = prompts * (fit * max_tokens + probe_tokens), prompts * fit * f1
            ref = await self.guard(self.store.reserve(name, limits, tokens, flops, now))
            if ref is not None:
                return Hold(self, name, limits, fit, tokens, flops, ref, before)
        raise RateLimited(f"the spend quota of key {name!r} is contended; retry shortly", retry_after=1.0)

    @staticmethod
    def fit(left: Remaining, *, prompts: int, max_tokens: int, cap: int, probe_tokens: int,
            sample_flops: float) -> int:
        """The most samples per prompt (≤ ``cap``) whose worst case fits what is left."""
        k = cap
        for rem in (left.tokens, left.tokens_day):
            if rem is not None:
                k = min(k, math.floor((rem - prompts * probe_tokens) / (prompts * max_tokens)))
        if left.flops_day is not None and sample_flops > 0:
            k = min(k, math.floor(left.flops_day / (prompts * sample_flops)))
        return k

    def refusal(self, name: str, limits: QuotaLimits, snap: Snapshot, now: float, need: float,
                need_flops: float) -> RateLimited | PermissionDenied:
        """429 naming the quota that refuses, when it frees enough up (``Retry-After``), how to fit sooner, and
        the ``X-Quota-*`` headers; a request that needs more than the whole quota can never be served as sent:
        403, no ``Retry-After``."""
        waits: list[tuple[str, float, float]] = []  # (what, seconds, limit)
        lim = limits.tokens_per_window
        if lim is not None and snap.window_tokens + need > lim:
            over, wait = snap.window_tokens + need - lim, limits.window_s
            for leave, amount in snap.window:
                over -= amount
                if over <= 0:
                    wait = leave - now
                    break
            waits.append((f"{lim} completion tokens per {limits.window_s:g} s", wait, lim))
        midnight = next_midnight(now) - now
        if limits.tokens_per_day is not None and snap.day_tokens + need > limits.tokens_per_day:
            waits.append((f"{limits.tokens_per_day} completion tokens per UTC day", midnight, limits.tokens_per_day))
        if limits.flops_per_day is not None and snap.day_flops + need_flops > limits.flops_per_day:
            waits.append((f"{limits.flops_per_day:g} FLOPs per UTC day", midnight, float("inf")))
        what, wait, _ = max(waits or [("a quota", 1.0, float("inf"))], key=lambda w: w[1])
        headers = Remaining.of(snap, limits, now).headers()
        too_big = [(w, lim) for w, _, lim in waits if need > lim]
        if too_big:
            err = PermissionDenied(
                f"this request needs at least {need:.0f} completion tokens (prompts × max_tokens) for one sample per "
                f"prompt, more than the whole spend quota of key {name!r} ({too_big[0][0]}): it can never be "
                "served as sent; lower max_tokens or send fewer prompts")
            err.headers = headers  # type: ignore[attr-defined]
            return err
        headers["X-Quota-Reset-Seconds"] = str(math.ceil(max(wait, 1.0)))
        return RateLimited(f"spend quota of key {name!r} ({what}) exhausted: this request needs at least {need:.0f} "
                           f"completion tokens (prompts × max_tokens) for one sample per prompt; lower max_tokens, "
                           f"send fewer prompts, or retry after {math.ceil(max(wait, 0.0))} s",
                           retry_after=max(wait, 1.0), headers=headers)
