"""Optional API keys: stored hashed, each with a maximum budget and a request rate (token bucket).

Keys are never stored in clear: a record holds the sha256 hex digest of the key, and a request's
``Authorization: Bearer KEY`` is hashed and looked up. Records come from a JSON file (``api_keys_file``)
and/or inline settings (``ISOCOMPUTE_API_KEYS``)::

    {"keys": [{"name": "team-a", "sha256": "<hex of sha256(key)>", "max_budget": 8,
               "rate_per_s": 5, "burst": 10, "admin": false}]}

(a bare JSON list of records works too). ``max_budget`` caps the budget in samples a key may ask for (a
permission: not what it spends — spend quotas, ``tokens_per_window``/``window_s``, ``tokens_per_day`` and
``flops_per_day``, count what its requests generate: :mod:`isocompute.app.accounting.quotas`);
``rate_per_s``/``burst`` configure its token bucket (``burst`` defaults to ``max(1, rate_per_s)``). Admin
actions (``POST /admin/reload``) need a record with ``"admin": true`` or the key whose digest is
``admin_key_sha256``. With no record configured the gateway is open and every caller is ``anonymous``
(admin actions then need ``admin_key_sha256``; with neither they are refused).

Token bucket: capacity ``burst``, refilled at ``rate_per_s`` tokens per second; a request takes one
token. Worked example: rate 2/s, burst 2 → two requests pass at t = 0, a third at t = 0 waits 0.5 s
(``Retry-After: 1`` rounded up), one more passes at t = 0.5.

Ignores: key rotation (edit the file and restart or reload).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from isocompute.app.accounting.logs import is_credential, loggable
from isocompute.app.accounting.quotas import QuotaLimits
from isocompute.app.errors import AuthError, PermissionDenied, RateLimited
from isocompute.errors import InputError


def hash_key(key: str) -> str:
    """sha256 hex digest of an API key, the only form in which keys are stored."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


class ApiKeyRecord(BaseModel):
    """One API key as stored: its name, digest and limits."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    sha256: str
    max_budget: float | None = Field(None, gt=0, allow_inf_nan=False)
    rate_per_s: float | None = Field(None, gt=0, allow_inf_nan=False)
    burst: float | None = Field(None, ge=1, allow_inf_nan=False)
    admin: bool = False
    tokens_per_window: int | None = Field(None, gt=0)
    window_s: float = Field(3600.0, ge=1, allow_inf_nan=False)
    tokens_per_day: int | None = Field(None, gt=0)
    flops_per_day: float | None = Field(None, gt=0, allow_inf_nan=False)

    def quota(self) -> QuotaLimits | None:
        """The key's spend quotas, None when it has none."""
        q = QuotaLimits(self.tokens_per_window, self.window_s, self.tokens_per_day, self.flops_per_day)
        return q if q.any else None

    @field_validator("sha256")
    @classmethod
    def _hex64(cls, v: str) -> str:
        v = v.lower()
        if len(v) != 64 or any(c not in "0123456789abcdef" for c in v):
            raise ValueError("sha256 must be the 64-character hex digest of the key (sha256sum), not the key")
        return v


def load_key_file(path: str | Path) -> list[ApiKeyRecord]:
    """Records from a JSON key file (``{"keys": [...]}`` or a list). Raises :class:`InputError`."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise InputError(f"cannot read API key file {path}: {e.strerror or e}; fix api_keys_file") from None
    except json.JSONDecodeError as e:
        raise InputError(f"API key file {path} is not valid JSON ({e}); fix the file") from None
    items = data.get("keys") if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise InputError(f"API key file {path} must hold a list of records or {{\"keys\": [...]}}")
    try:
        return [ApiKeyRecord.model_validate(r) for r in items]
    except ValidationError as e:
        raise InputError(f"API key file {path} has an invalid record: {e.errors()[0]['msg']}; fix it") from None


class TokenBucket:
    """``rate`` tokens per second up to ``burst``; ``take()`` returns 0 when a token was taken, else the
    seconds until one is available (nothing taken). ``clock`` is injectable for tests."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic):
        if not (rate > 0 and burst >= 1):
            raise ValueError(f"need rate > 0 and burst >= 1; got rate={rate}, burst={burst}")
        self.rate, self.burst, self._clock = float(rate), float(burst), clock
        self.tokens = float(burst)
        self._last = clock()

    def take(self) -> float:
        now = self._clock()
        self.tokens = min(self.burst, self.tokens + (now - self._last) * self.rate)
        self._last = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


@dataclass
class Principal:
    """Who is calling: the key's name (``anonymous`` when auth is off) and its limits."""

    name: str
    max_budget: float | None = None
    admin: bool = False
    bucket: TokenBucket | None = field(default=None, repr=False)
    quota: QuotaLimits | None = None

    def check_rate(self) -> None:
        if self.bucket is not None:
            wait = self.bucket.take()
            if wait > 0:
                raise RateLimited(
                    f"rate limit of {self.bucket.rate:g} requests/s for key {self.name!r} exceeded; "
                    f"retry after {math.ceil(wait)} s or ask for a higher rate",
                    retry_after=wait,
                )

    def check_budget(self, budget_samples: float) -> None:
        if self.max_budget is not None and budget_samples > self.max_budget:
            raise PermissionDenied(
                f"budget {budget_samples:g} samples exceeds the maximum {self.max_budget:g} for key "
                f"{self.name!r}; send budget <= {self.max_budget:g}"
            )


ANONYMOUS = "anonymous"


class KeyStore:
    """Looks up bearer tokens by digest; one :class:`Principal` (with its bucket) per record."""

    def __init__(self, records: Iterable[ApiKeyRecord], *, admin_sha256: str | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self._by_digest: dict[str, Principal] = {}
        for r in records:
            if r.sha256 in self._by_digest:
                raise InputError(f"API key record {r.name!r} repeats the digest of another record; remove one")
            bucket = None
            if r.rate_per_s is not None:
                bucket = TokenBucket(r.rate_per_s, r.burst or max(1.0, r.rate_per_s), clock)
            self._by_digest[r.sha256] = Principal(r.name, r.max_budget, r.admin, bucket, r.quota())
        self._admin = admin_sha256
        self._anonymous = Principal(ANONYMOUS)

    @property
    def enabled(self) -> bool:
        return bool(self._by_digest)

    def authenticate(self, authorization: str | None) -> Principal:
        """The caller behind an ``Authorization`` header; anonymous when auth is off."""
        if not self.enabled:
            return self._anonymous
        token = _bearer(authorization)
        if token is None:
            raise AuthError("missing API key; send the header `Authorization: Bearer YOUR_KEY`")
        p = self._by_digest.get(hash_key(token))
        if p is None:
            raise AuthError("unknown API key; check the key or ask the operator to add its sha256 digest")
        return p

    def authorize_admin(self, authorization: str | None) -> str:
        """The admin's name, or raise 401/403."""
        token = _bearer(authorization)
        if token is None:
            raise AuthError("admin actions need `Authorization: Bearer ADMIN_KEY`")
        digest = hash_key(token)
        if self._admin is not None and digest == self._admin:
            return "admin"
        p = self._by_digest.get(digest)
        if p is not None and p.admin:
            return p.name
        if p is None and not (self._admin is None and not self.enabled):
            raise AuthError("unknown admin key; send the key whose sha256 is admin_key_sha256")
        raise PermissionDenied(
            "this key may not perform admin actions; use a key with \"admin\": true or set admin_key_sha256"
        )


def _bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def refuse_query_key(query: Iterable[str]) -> None:
    """401 when a request carries a credential-like parameter in its URL (``?api_key=…``, ``?api%5Fkey=…``,
    ``?x-api-key=…``: :func:`~isocompute.app.accounting.logs.is_credential` on the decoded name), whatever
    else it carries: keys go in the Authorization header only, since URLs end up in access logs, proxies and
    browser history."""
    sent = sorted(k for k in query if is_credential(k))
    if sent:
        raise AuthError(f"a credential in the URL (?{loggable(sent[0], 64)}=…) is never accepted; send the header "
                        "`Authorization: Bearer YOUR_KEY` instead, and rotate that key: URLs are logged by proxies")
