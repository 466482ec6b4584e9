"""Faults a replay server plays on request, so that fault tests at scale need no real server to misbehave.

Set for the whole server with ``POST /admin/faults`` (a JSON object of the fields below; ``DELETE`` clears,
``GET`` shows) or for one request with the header ``x-replay-fault: key=value,key=value``:

============== ================================================================================
``stall_s``      the stream sends nothing for this many seconds after ``after_tokens`` tokens (per sequence)
``slowdown``     every rate divided by this factor (≥ 1) while set (server-wide only)
``drop``         true: the connection is cut (no end of stream) after ``after_tokens`` tokens
``status``       completions requests are answered with this HTTP status (e.g. 503) at once
``refuse_s``     the server stops listening for this many seconds (or until DELETE): connections are refused (server-wide only)
``requests``     the fault applies to the next this-many completions requests, then clears (default: all)
============== ================================================================================

Ignores: partial writes inside a chunk, latency on the connect itself.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from isocompute.errors import InputError

__all__ = ["Faults", "parse_header"]


@dataclass
class Faults:
    """The faults in force (module docstring); all off by default."""

    stall_s: float = 0.0
    slowdown: float = 1.0
    drop: bool = False
    status: int = 0
    refuse_s: float = 0.0
    after_tokens: int = 0
    requests: int | None = None

    @classmethod
    def from_mapping(cls, data: dict[str, Any], *, where: str) -> Faults:
        """Checked faults from ``data``; an unknown key or a bad value is an InputError naming ``where``."""
        known = {f.name: f.type for f in fields(cls)}
        extra = set(data) - set(known)
        if extra:
            raise InputError(f"{where}: unknown fault {sorted(extra)}; use {', '.join(known)}")
        try:
            out = cls(**{k: _coerce(k, v) for k, v in data.items()})
        except (TypeError, ValueError) as e:
            raise InputError(f"{where}: {e}") from None
        if out.stall_s < 0 or out.slowdown < 1 or out.refuse_s < 0 or out.after_tokens < 0:
            raise InputError(f"{where}: need stall_s >= 0, slowdown >= 1, refuse_s >= 0, after_tokens >= 0")
        if out.status and not 400 <= out.status <= 599:
            raise InputError(f"{where}: status must be an HTTP error status (400-599); got {out.status}")
        if out.requests is not None and out.requests < 1:
            raise InputError(f"{where}: requests must be >= 1 (or left out for every request)")
        return out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def any_stream_fault(self) -> bool:
        return bool(self.stall_s or self.drop)

    def take(self) -> Faults | None:
        """The faults one request gets, counting it against ``requests``; None when nothing is in force."""
        if not (self.stall_s or self.drop or self.status):
            return None
        if self.requests is not None:
            if self.requests <= 0:
                return None
            self.requests -= 1
        return self


def _coerce(key: str, value: Any) -> Any:
    if key == "drop":
        if isinstance(value, str):
            if value.lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"drop must be true or false; got {value!r}")
            return value.lower() in ("true", "1")
        return bool(value)
    if key in ("status", "after_tokens", "requests"):
        return None if value is None else int(value)
    return float(value)


def parse_header(value: str) -> Faults:
    """Faults from an ``x-replay-fault`` header (``stall_s=2,after_tokens=10``); server-wide keys refused."""
    pairs: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in value.split(","))):
        key, sep, v = part.partition("=")
        if not sep:
            raise InputError(f"x-replay-fault: {part!r} is not key=value; e.g. 'stall_s=2,after_tokens=10'")
        pairs[key.strip()] = v.strip()
    if "refuse_s" in pairs or "slowdown" in pairs:
        raise InputError("x-replay-fault: refuse_s and slowdown act on the whole server; set them with "
                         "POST /admin/faults")
    return Faults.from_mapping(pairs, where="x-replay-fault")
