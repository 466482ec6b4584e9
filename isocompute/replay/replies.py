"""What a replay request draws and how its tokens read on the wire, in vLLM's shapes.

:func:`draw` picks a request's ``n`` samples from its row: without replacement within the request (a fresh
permutation of the row's samples each time they run out), seeded by the request's ``seed`` (no seed: a
fresh draw); greedy (``temperature == 0``) repeats the row's first sample. :class:`Seq` is one sample as
served: its length cut to ``max_tokens`` (``finish_reason: length``, no answer) and the text of any run of
its tokens. :func:`completion_chunk`, :func:`chat_chunk` and :func:`usage_chunk` are vLLM's SSE chunks
(``text_completion`` / ``chat.completion.chunk``; ``usage`` on every chunk with
``stream_options.continuous_usage_stats``, one last choice-less chunk with ``include_usage``).

Logprobs (``"logprobs": K``): each token's sampled log-probability is the sample's recorded
``logprob_mean`` and its ``K`` top log-probabilities are all ``−confidence_min_window``, so the gateway's
:func:`isocompute.tasks.confidence.sample_confidence` reads back exactly the recorded pair.
"""

from __future__ import annotations

import json
import random
from typing import Any

from isocompute.replay.table import FILLER, FIRST_FILLER, ReplayRow, ReplaySample

__all__ = ["Seq", "chat_chunk", "completion_chunk", "draw", "usage_chunk"]

_IDS: dict[int, list[int]] = {}


def draw(row: ReplayRow, n: int, seed: int | None, temperature: float) -> list[ReplaySample]:
    """``n`` of ``row``'s samples (module docstring)."""
    if temperature == 0:
        return [row.samples[0]] * n
    rng = random.Random(f"{seed}/{row.id}") if seed is not None else random.Random()
    out: list[ReplaySample] = []
    while len(out) < n:
        out += rng.sample(row.samples, min(len(row.samples), n - len(out)))
    return out


class Seq:
    """One sample as served: ``length`` tokens (cut to ``max_tokens``), ``pos`` streamed so far."""

    __slots__ = ("finish", "index", "length", "pos", "sample")

    def __init__(self, index: int, sample: ReplaySample, max_tokens: int | None) -> None:
        self.index = index
        self.sample = sample
        cut = max_tokens is not None and sample.tokens > max_tokens
        self.length = max_tokens if cut and max_tokens is not None else sample.tokens
        self.finish = "length" if cut else "stop"
        self.pos = 0

    def text(self, start: int, k: int) -> str:
        """The text of tokens ``start … start + k − 1`` (module docstring of :mod:`isocompute.replay.table`)."""
        parts = FIRST_FILLER + FILLER * (k - 1) if start == 0 else FILLER * k
        if start + k == self.length and self.finish == "stop" and self.sample.answer_text:
            parts = parts[: -len(FILLER)] + self.sample.answer_text if k > 1 or start else self.sample.answer_text
        return parts

    def logprobs(self, k: int, top: int) -> dict[str, Any]:
        lp, conf = self.sample.logprob_mean, self.sample.confidence
        tops = {f"token_id:{i}": -(conf or 0.0) for i in range(top)}
        return {"tokens": ["token_id:1"] * k, "token_logprobs": [lp] * k, "top_logprobs": [tops] * k,
                "text_offset": [0] * k}


def token_ids(k: int) -> list[int]:
    ids = _IDS.get(k)
    if ids is None:
        ids = _IDS[k] = [1] * k
    return ids


def completion_chunk(head: dict[str, Any], seq: Seq, start: int, k: int, *, prompt_tokens: int, usage: bool,
                     ids: bool, logprobs: int | None) -> str:
    """One ``text_completion`` SSE event: ``seq``'s tokens ``start … start + k − 1``."""
    done = start + k == seq.length
    choice: dict[str, Any] = {"index": seq.index, "text": seq.text(start, k),
                              "logprobs": None if logprobs is None else seq.logprobs(k, logprobs),
                              "finish_reason": seq.finish if done else None, "stop_reason": None}
    if ids:
        choice["token_ids"] = token_ids(k)
    chunk = {**head, "choices": [choice]}
    if usage:
        chunk["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": start + k,
                          "total_tokens": prompt_tokens + start + k}
    return f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n"


def chat_chunk(head: dict[str, Any], seq: Seq, start: int, k: int, *, prompt_tokens: int, usage: bool) -> str:
    """One ``chat.completion.chunk`` SSE event (the role on each choice's first delta)."""
    done = start + k == seq.length
    delta = {"role": "assistant", "content": seq.text(start, k)} if start == 0 else {"content": seq.text(start, k)}
    chunk: dict[str, Any] = {**head, "choices": [{"index": seq.index, "delta": delta, "logprobs": None,
                                                 "finish_reason": seq.finish if done else None}]}
    if usage:
        chunk["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": start + k,
                          "total_tokens": prompt_tokens + start + k}
    return f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n"


def usage_chunk(head: dict[str, Any], prompt_tokens: int, completion_tokens: int) -> str:
    """The last, choice-less chunk of a stream asked with ``include_usage``."""
    chunk = {**head, "choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                                              "total_tokens": prompt_tokens + completion_tokens}}
    return f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n"
