"""What every importer yields, and reading a JSON or JSONL dump with errors that name file and line.

A :class:`RawRecord` is one prompt of someone else's dump before grading: its text, its gold answer and
its samples (extracted answers, or completions to extract them from), with the optional token counts
and scores, plus where it came from (``where``: ``"dump.json, line 12"``) for every later message.

:func:`iter_json` reads both layouts users have: JSONL (one object per line; blank lines skipped) and
a JSON array of objects (the whole file, as in MoT's ``*.json``), giving the line on which each record
starts. Ignores: compression, encodings other than UTF-8, JSON objects that wrap the array (select it
with a field path in the generic importer instead).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from isocompute.errors import InputError

__all__ = ["RawRecord", "iter_json", "malformed"]


@dataclass(slots=True)
class RawRecord:
    """One prompt of an external dump, before grading.

    ``answers`` are the extracted answers (None or "" = no answer); when the dump has none, they are
    extracted from ``completions`` (full texts) with :func:`isocompute.tasks.answers.extract.extract_answer`.
    When both are given, ``completions`` only serve to count completion tokens with a tokenizer.
    ``gold`` is None when the dump's gold could not be read (the importer says why in
    ``gold_problem``); such a record is reported and left out, never graded wrong. ``completion_tokens``,
    ``scores``, ``logprob_mean`` and ``confidence_min_window`` are per sample (same length as the samples)
    or None.
    """

    id: str
    prompt: str
    gold: str | None
    task: str
    where: str
    answers: list[str | None] | None = None
    completions: list[str] | None = None
    completion_tokens: list[int | None] | None = None
    scores: list[float | None] | None = None
    logprob_mean: list[float | None] | None = None
    confidence_min_window: list[float | None] | None = None
    prompt_tokens: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    gold_problem: str | None = None
    reference: str | None = None

    @property
    def n_samples(self) -> int:
        return len(self.answers if self.answers is not None else self.completions or [])

    def check_lengths(self) -> None:
        """Per-sample lists must all have one entry per sample; the error says both lengths."""
        n = self.n_samples
        if n == 0:
            raise malformed(self.where, "no samples", "every prompt needs at least one sample")
        for name in ("answers", "completions", "completion_tokens", "scores", "logprob_mean",
                     "confidence_min_window"):
            values = getattr(self, name)
            if values is not None and len(values) != n:
                what = "answers" if self.answers is not None else "completions"
                raise malformed(self.where, f"{name} has {len(values)} entries but {what} has {n}",
                                "give one entry per sample in every per-sample list")


def malformed(where: str, what: str, fix: str) -> InputError:
    """The one shape of an import error: location, what is wrong, what to do."""
    return InputError(f"{where}: {what}; {fix}")


def _read_text(path: Path) -> str:
    if not path.is_file():
        raise InputError(f"{path} does not exist; pass the path of the dump to import.")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text ({e}); re-save the dump as UTF-8 JSON or JSONL.") from None


def iter_json(path: str | Path) -> Iterator[tuple[str, Any]]:
    """``(where, record)`` for each record of a JSONL file or a JSON array file, in file order.

    ``where`` is ``"<path>, line <n>"`` (the line on which the record starts). A record that is not
    valid JSON is an :class:`InputError` naming its line.
    """
    p = Path(path)
    text = _read_text(p)
    start = len(text) - len(text.lstrip())
    if text[start:start + 1] == "[":
        yield from _iter_array(p, text, start)
        return
    decoder = json.JSONDecoder()
    found = False
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line or line.isspace():
            continue
        try:
            obj, end = decoder.raw_decode(line, len(line) - len(line.lstrip()))
        except json.JSONDecodeError as e:
            raise malformed(f"{p}, line {lineno}", f"bad JSON ({e.msg} at column {e.colno})",
                            "fix or remove that line (each line of a JSONL dump is one JSON object)") from None
        if line[end:].strip():
            raise malformed(f"{p}, line {lineno}", f"extra text after the JSON object at column {end + 1}",
                            "put one JSON object per line")
        found = True
        yield f"{p}, line {lineno}", obj
    if not found:
        raise InputError(f"{p}: no records; the file is empty.")


def _iter_array(p: Path, text: str, start: int) -> Iterator[tuple[str, Any]]:
    """Elements of a top-level JSON array, decoded one by one so each knows its line."""
    decoder = json.JSONDecoder()
    i, line, counted = start + 1, 1, 0
    n = len(text)
    found = False
    while True:
        while i < n and text[i] in " \t\r\n":
            i += 1
        if i < n and text[i] == "]":
            break
        line += text.count("\n", counted, i)
        counted = i
        try:
            obj, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError as e:
            raise malformed(f"{p}, line {e.lineno}", f"bad JSON ({e.msg} at column {e.colno})",
                            "fix that record of the JSON array") from None
        found = True
        yield f"{p}, line {line}", obj
        while i < n and text[i] in " \t\r\n":
            i += 1
        if i < n and text[i] == ",":
            i += 1
        elif i < n and text[i] == "]":
            break
        else:
            where = f"{p}, line {line + text.count(chr(10), counted, i)}"
            raise malformed(where, f"expected ',' or ']' after the record of line {line}",
                            "fix the JSON array's punctuation")
    if not found:
        raise InputError(f"{p}: the JSON array is empty; there is nothing to import.")
