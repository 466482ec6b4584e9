"""A wave overhead measured on a running gateway: its Prometheus scrape turned into ``--wave-overhead``.

The solver's latency of a plan is Σ over its waves of (O + the wave's longest sample / tokens per sample):
O, the *wave overhead*, is what a wave costs before it decodes (queueing, prefill, the network), in units of
one sample's mean decode time. A gateway measures both halves on its streamed waves
(:mod:`isocompute.app.accounting.metrics`): the seconds from a wave's send to its first token, and the
seconds after it against the wave's longest sample's completion tokens. From one scrape, summed over every
label (family, pool):

    overhead_s   = Σ first-token seconds / streamed waves        (isocompute_wave_first_token_seconds _sum / _count)
    s_per_token  = Σ decode seconds / Σ their decode tokens      (isocompute_wave_decode_seconds_sum /
                                                                  isocompute_stream_decode_tokens_total)
    O            = overhead_s / (s_per_token × tokens_per_sample)

``tokens_per_sample`` is the report's latency unit (its table's mean completion tokens per sample). Example:
4 streamed waves with 0.8 s to their first tokens, 6 s of decode over 300 tokens: overhead 0.2 s, 0.02 s per
token; at 50 tokens per sample (1 s) O = 0.2.

:func:`overhead_arg` reads ``--wave-overhead`` (a number, or anything else: a scrape's path, ``-`` for
stdin, or an http(s) URL of a gateway's ``/metrics``); :func:`read_scrape` fetches the text;
:func:`measure` does the arithmetic; :func:`resolve_overhead` both, into sample units and the record
report.json keeps (``wave_overhead_source``).

Ignores: waves not streamed (waiting waves, in-process engines' replays: no first token), and which pool or
plan family a wave ran in (one overhead for the whole scrape).
"""

from __future__ import annotations

import math
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from isocompute.errors import InputError

__all__ = ["MeasuredOverhead", "measure", "overhead_arg", "read_scrape", "resolve_overhead"]

FIRST_TOKEN = "isocompute_wave_first_token_seconds"
DECODE_SECONDS = "isocompute_wave_decode_seconds"
DECODE_TOKENS = "isocompute_stream_decode_tokens_total"
_FIX = ("scrape a gateway's /metrics after it has served parallel-stop waves on a streaming upstream "
        "(vllm-http), or pass --wave-overhead as a number")


@dataclass(frozen=True, slots=True)
class MeasuredOverhead:
    """What a scrape says: seconds to the first token per streamed wave, decode seconds per token, the
    streamed waves and their decode tokens, and where it came from."""

    source: str
    overhead_s: float
    s_per_token: float
    waves: int
    tokens: float

    def in_samples(self, tokens_per_sample: float) -> float:
        """The overhead in units of one sample's decode time (``tokens_per_sample`` tokens)."""
        return self.overhead_s / (self.s_per_token * tokens_per_sample)


def overhead_arg(text: str) -> float | str:
    """``--wave-overhead``'s value: a number (sample units, as typed), else the scrape's path or URL."""
    try:
        return float(text)
    except ValueError:
        return text


def read_scrape(source: str) -> str:
    """The text of a Prometheus scrape: an http(s) URL (fetched), ``-`` (stdin) or a file's path."""
    if source.startswith(("http://", "https://")):
        import httpx

        try:
            r = httpx.get(source, timeout=10.0)
            r.raise_for_status()
        except httpx.HTTPError as e:
            raise InputError(f"could not fetch the metrics scrape {source} ({type(e).__name__}: {e}); check the "
                             "gateway is up and the URL ends in /metrics, or save a scrape to a file.") from None
        return r.text
    if source == "-":
        return sys.stdin.read()
    try:
        return Path(source).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"--wave-overhead {source!r} is neither a number nor a readable metrics scrape "
                         f"({type(e).__name__}: {e}); pass a number of samples per wave, a scrape file "
                         "(curl GATEWAY/metrics > scrape.txt) or the gateway's /metrics URL.") from None


def _sums(text: str, source: str) -> dict[str, float]:
    """Every sample's value summed over its labels, by sample name."""
    from prometheus_client.parser import text_string_to_metric_families

    sums: dict[str, float] = defaultdict(float)
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                sums[s.name] += float(s.value)
    except (ValueError, TypeError, IndexError) as e:
        raise InputError(f"{source} is not a Prometheus text scrape ({e}); save the gateway's /metrics "
                         "as it is (curl GATEWAY/metrics > scrape.txt).") from None
    return sums


def measure(text: str, source: str = "scrape") -> MeasuredOverhead:
    """The overhead a scrape's wave metrics give (module docstring); InputError, saying what to do, when
    it has no streamed waves or no decode time to divide by."""
    sums = _sums(text, source)
    waves = sums.get(f"{FIRST_TOKEN}_count", 0.0)
    if waves <= 0:
        raise InputError(f"{source} has no streamed waves ({FIRST_TOKEN}_count is absent or 0): {_FIX}.")
    tokens = sums.get(DECODE_TOKENS, 0.0)
    decode = sums.get(f"{DECODE_SECONDS}_sum", 0.0)
    if tokens <= 0 or decode <= 0:
        raise InputError(f"{source}'s streamed waves have no decode time to measure a token by ({DECODE_TOKENS} = "
                         f"{tokens:g}, {DECODE_SECONDS}_sum = {decode:g}): {_FIX}.")
    overhead = sums.get(f"{FIRST_TOKEN}_sum", 0.0) / waves
    return MeasuredOverhead(source, overhead, decode / tokens, int(round(waves)), tokens)


def resolve_overhead(value: float | str, tokens_per_sample: float | None) -> tuple[float, dict[str, Any] | None]:
    """``--wave-overhead`` in sample units and, for a scrape, where it came from (report.json's
    ``wave_overhead_source``); a number passes through with None."""
    if not isinstance(value, str):
        return float(value), None
    if tokens_per_sample is None or not math.isfinite(tokens_per_sample) or tokens_per_sample <= 0:
        raise InputError(f"--wave-overhead {value} needs the report's tokens per sample (completion_tokens on its "
                         "table) to turn seconds into samples; re-import the table with token counts, or pass a "
                         "number.")
    m = measure(read_scrape(value), value)
    o = m.in_samples(tokens_per_sample)
    return o, {"scrape": value, "overhead_s": m.overhead_s, "s_per_token": m.s_per_token, "waves": m.waves,
               "decode_tokens": m.tokens, "tokens_per_sample": float(tokens_per_sample), "overhead": o}
