"""What the gateway writes to its log about a client: never a credential, never a raw control character,
never an unbounded string.

* **credentials** — a query parameter whose *decoded* name looks like a credential (:func:`is_credential`:
  ``api_key``, ``api%5Fkey``, ``x-api-key``, ``openai_api_key``, ``bearer``, ``auth``, ``api_token``,
  ``secret``, ``password``, ``api_key[]`` …) has its value replaced by ``[redacted]`` in uvicorn's access log
  (:class:`RedactQueryKeys`), and such a request is refused (``auth.refuse_query_key``); a ``Bearer`` token
  in any logged value is blanked too (:class:`SafeLog`), so an ``Authorization`` header that reaches a log
  line or a trace exported through the log never shows its key;
* **control characters** — every string argument of a log record from the gateway's loggers (and the
  access log's path) is escaped (:func:`loggable`: ``\\n`` → ``\\x0a``, ESC → ``\\x1b``, U+2028 → ``\\u2028``),
  so a client cannot forge a log line, move the cursor or recolour a terminal;
* **length** — each such argument is cut to :data:`MAX_ARG_CHARS` characters (``…(+N chars)`` says how many
  were dropped): a 3 MB field name costs a few hundred bytes of log, not 3 MB.

Worked example: the unknown field ``"x\\nINFO: forged"`` is logged as ``ignoring unknown request fields:
x\\x0aINFO: forged`` — one line.

Ignores: what other libraries log on their own loggers (none of them log request data at INFO).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from urllib.parse import unquote_plus

__all__ = ["MAX_ARG_CHARS", "RedactQueryKeys", "SafeLog", "install_log_hygiene", "is_credential", "loggable",
           "redact_query"]

MAX_ARG_CHARS = 512
# credential-like parameter names, matched on the decoded, lower-cased name with separators dropped
_CREDENTIAL = re.compile(r"key|token|secret|passw|pwd|auth|bearer|credential|session|signature|cookie|jwt")
_SEPARATORS = re.compile(r"[^a-z0-9]")
# C0/C1 controls, DEL, line/paragraph separators and bidi overrides: what can forge or garble a log line
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_BEARER = re.compile(r"(?i)(bearer\s+)[^\s,;'\"]+")


def is_credential(name: str) -> bool:
    """Whether a query parameter's name (percent-encoded or not) looks like it carries a credential."""
    return bool(_CREDENTIAL.search(_SEPARATORS.sub("", unquote_plus(name).lower())))


def loggable(text: str, limit: int = MAX_ARG_CHARS) -> str:
    """``text`` with its control characters escaped and cut to ``limit`` characters."""
    cut = len(text) - limit
    if cut > 0:
        text = text[:limit]
    text = _CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}" if ord(m[0]) < 0x100 else f"\\u{ord(m[0]):04x}", text)
    return f"{text}…(+{cut} chars)" if cut > 0 else text


def redact_query(query: str) -> str:
    """``query`` (a raw query string) with every credential-like parameter's value ``[redacted]``."""
    parts = []
    for part in re.split(r"[&;]", query):
        name, sep, value = part.partition("=")
        parts.append(f"{name}=[redacted]" if is_credential(name) or (not sep and is_credential(part)) else part)
    return "&".join(parts)


def _clean(arg: object) -> object:
    return loggable(_BEARER.sub(r"\1[redacted]", arg)) if isinstance(arg, str) else arg


class SafeLog(logging.Filter):
    """Escapes and bounds every string argument of a record (:func:`loggable`) and blanks ``Bearer`` tokens;
    the message template is the gateway's own and left alone."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(_clean(a) for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: _clean(v) for k, v in record.args.items()}
        return True


class RedactQueryKeys(SafeLog):
    """uvicorn's access-log lines (their third argument is the request's path with its query string):
    credential-like query parameters ``[redacted]`` (:func:`redact_query`), then :class:`SafeLog`."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str) and "?" in args[2]:
            path, _, query = args[2].partition("?")
            record.args = (*args[:2], f"{path}?{redact_query(query)}", *args[3:])
        return super().filter(record)


def install_log_hygiene(loggers: Iterable[str] = ("isocompute.app", "isocompute.gateway", "uvicorn.error")) -> None:
    """Install :class:`RedactQueryKeys` on uvicorn's access logger and :class:`SafeLog` on ``loggers`` (once)."""
    for name, kind in (("uvicorn.access", RedactQueryKeys), *((n, SafeLog) for n in loggers)):
        logger = logging.getLogger(name)
        if not any(type(f) is kind for f in logger.filters):
            logger.addFilter(kind())
