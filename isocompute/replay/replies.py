"""What a replay request draws and how its tokens read on the wire, in vLLM's shapes.

:class:`Draws` picks a request's ``n`` samples from its row: without replacement (a fresh permutation of the
row's samples each time they run out), seeded by the request's ``seed`` (no seed: a fresh draw), and across
the waves of one gateway plan, whose seeds it recognises; greedy (``temperature == 0``) repeats the row's
first sample. :class:`Seq` is one sample as
served: its length cut to ``max_tokens`` (``finish_reason: length``, no answer) and the text of any run of
its tokens. :func:`completion_chunk`, :func:`chat_chunk` and :func:`usage_chunk` are vLLM's SSE chunks
(``text_completion`` / ``chat.completion.chunk``; ``usage`` on every chunk with
``stream_options.continuous_usage_stats``, one last choice-less chunk with ``include_usage``).

Logprobs (``"logprobs": K``): each token's sampled log-probability is the sample's recorded
``logprob_mean`` and its ``K`` top log-probabilities are all ``−confidence_min_window``, so the gateway's
:func:`isocompute.tasks.confidence.sample_confidence` reads back exactly the recorded pair.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import OrderedDict
from typing import Any

from isocompute.replay.table import FILLER, FIRST_FILLER, ReplayRow, ReplaySample

__all__ = ["Draws", "Seq", "chat_chunk", "completion_chunk", "usage_chunk", "wave_seed"]

_IDS: dict[int, list[int]] = {}


def wave_seed(seed: int, wave: int) -> int:
    """The seed the gateway gives wave ``wave`` ≥ 1 of a request with ``seed``: ``blake2b(f"{seed}/{wave}") mod
    2³¹`` (:func:`isocompute.app.runner.plan_run.wave_seed`; a test holds the two equal)."""
    digest = hashlib.blake2b(f"{seed}/{wave}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % 2**31


class Draws:
    """Each request's draw of its row's samples (module docstring). A plan's later waves continue its first
    wave's draw: a request whose ``seed`` is a wave seed (:func:`wave_seed`, waves 1 … ``waves``) of an earlier
    request on the same row takes the next samples of that request's permutation, so the waves of one plan
    draw without replacement across waves, as the report's estimators do. ``keep`` bounds the requests
    remembered (oldest forgotten first)."""

    def __init__(self, waves: int = 64, keep: int = 200_000) -> None:
        self.waves, self.keep = waves, keep
        self._next: OrderedDict[tuple[str, int], list[Any]] = OrderedDict()

    def draw(self, row: ReplayRow, n: int, seed: int | None, temperature: float) -> list[ReplaySample]:
        """``n`` of ``row``'s samples."""
        if temperature == 0:
            return [row.samples[0]] * n
        if seed is None:
            return _take([random.Random(), [], 0], row, n)
        state = self._next.pop((row.id, seed), None)
        if state is None:  # a first wave: a fresh seeded permutation, its later waves' seeds registered
            state = [random.Random(f"{seed}/{row.id}"), [], 0]
            for w in range(1, self.waves + 1):
                self._next[(row.id, wave_seed(seed, w))] = state
            while len(self._next) > self.keep:
                self._next.popitem(last=False)
        return _take(state, row, n)


def _take(state: list[Any], row: ReplayRow, n: int) -> list[ReplaySample]:
    """The next ``n`` samples of ``state`` = [rng, permutation, position] (a new permutation when it runs out)."""
    rng, perm, pos = state
    out: list[ReplaySample] = []
    while len(out) < n:
        if pos == len(perm):
            perm[:] = rng.sample(row.samples, len(row.samples))
            pos = 0
        k = min(n - len(out), len(perm) - pos)
        out += perm[pos:pos + k]
        pos += k
    state[2] = pos
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
        """The text of tokens ``start … start + k − 1`` (module docstring of :mod:`isocompute.replay.table`); a
        recorded sample of 0 tokens streams its answer (if any) as one empty-token chunk."""
        if k == 0:
            return self.sample.answer_text if self.finish == "stop" else ""
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
