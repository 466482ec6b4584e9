"""The recorded samples a replay server answers from: outcome tables indexed by prompt text and id, each
sample's text synthesised from its recorded length and answer.

A sample of ``L`` recorded completion tokens streams ``L`` tokens: ``L − 1`` filler tokens (``" step"``; the
first one ``" step on"``, so that no filler text reads as an answer) and a last one that carries the recorded
answer in the task's format — ``\\boxed{a}`` for math, ``#### a`` for GSM8K, ``The answer is a.`` otherwise —
so the gateway's own extraction (:func:`isocompute.tasks.answers.extract.extract_answer`) reads back what the
model answered. Where the task's format does not read back exactly (``May 2, 2021`` after "The answer is"
yields ``2``), ``\\boxed{a}`` and the bare answer are tried; an answer no format reads back exactly (a
trailing ``\\`` or ``.`` that extraction normalises away) streams in the task's format and is counted in
:attr:`ReplayTable.inexact`. A sample with no answer streams filler only. Token ids are placeholders (one per
token, so ``len(token_ids)`` is the recorded count); the text is not the model's text.

Prompt tokens: the row's ``prompt_tokens`` when the table has it, else ``ceil(characters / 4)`` (stated: the
replay has no tokenizer). Ignores: the recorded ``score``, the table's gold (the replay serves what the model
said, right or wrong).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from isocompute.errors import InputError
from isocompute.tasks.answers.extract import extract_answer

__all__ = ["FILLER", "FIRST_FILLER", "ReplayRow", "ReplaySample", "ReplayTable", "answer_text", "load_tables"]

FILLER = " step"
FIRST_FILLER = " step on"


@dataclass(frozen=True, slots=True)
class ReplaySample:
    """One recorded sample: its completion tokens, the text its last token carries (``""``: no answer) and its
    recorded confidence (None where the table has none)."""

    tokens: int
    answer_text: str
    logprob_mean: float | None = None
    confidence: float | None = None


@dataclass(frozen=True, slots=True)
class ReplayRow:
    id: str
    prompt: str
    prompt_tokens: int
    samples: tuple[ReplaySample, ...]


def answer_text(task: str, answer: str) -> tuple[str, bool]:
    """The last token's text for ``answer`` under ``task`` and whether extraction reads it back exactly
    (module docstring).

    >>> answer_text("gsm8k", "18")
    ('\\n#### 18', True)
    >>> answer_text("date", "May 2, 2021")
    ('\\n\\n\\\\boxed{May 2, 2021}', True)
    """
    first = {"math": f"\n\n\\boxed{{{answer}}}", "math500": f"\n\n\\boxed{{{answer}}}",
             "gsm8k": f"\n#### {answer}"}.get(task, f"\nThe answer is {answer}.")
    for text in (first, f"\n\n\\boxed{{{answer}}}", f"\n{answer}"):
        if extract_answer(FIRST_FILLER + text) == answer:
            return text, True
    return first, False


@dataclass
class ReplayTable:
    """Rows of one or more outcome tables: by prompt text (:meth:`find`) and by id. ``inexact``: answers no
    format reads back exactly (module docstring)."""

    rows: dict[str, ReplayRow] = field(default_factory=dict)
    by_id: dict[str, ReplayRow] = field(default_factory=dict)
    model: str = "replay"
    inexact: int = 0
    answers: int = 0

    def find(self, prompt: str) -> ReplayRow | None:
        """The row whose prompt is ``prompt`` (or whose id it is); else the row with the longest prompt that
        ``prompt`` contains (a chat-templated prompt wraps the question); None when none."""
        row = self.rows.get(prompt) or self.by_id.get(prompt.strip())
        if row is not None:
            return row
        best = None
        for text, r in self.rows.items():
            if text in prompt and (best is None or len(text) > len(best.prompt)):
                best = r
        return best


def _sample(s: dict, task: str, where: str, table: ReplayTable) -> ReplaySample:
    tokens = s.get("completion_tokens")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise InputError(f"{where}: a sample without an integer completion_tokens >= 0 ({tokens!r}); the replay "
                         "streams recorded lengths: import the table with token counts (--tokenizer)")
    text = ""
    if s.get("answer") is not None:
        text, exact = answer_text(task, str(s["answer"]))
        table.answers += 1
        table.inexact += not exact
    lp, conf = s.get("logprob_mean"), s.get("confidence_min_window")
    return ReplaySample(tokens, text, None if lp is None else float(lp), None if conf is None else float(conf))


def load_tables(paths: Sequence[str | Path], model: str | None = None) -> ReplayTable:
    """Every row of the outcome tables at ``paths``; a prompt in two tables is refused (serve two models from
    two replay servers). ``model``: the name ``/v1/models`` lists (default: the first row's ``meta.model``,
    else the first file's stem)."""
    if not paths:
        raise InputError("no outcome table given; pass e.g. `isocompute replay runs/table.jsonl --port 8001`")
    table = ReplayTable()
    first_model = None
    for path in map(Path, paths):
        if not path.is_file():
            raise InputError(f"outcome table {path} does not exist; pass the JSONL an `isocompute sample` or "
                             "`isocompute import` wrote")
        with path.open(encoding="utf-8") as f:
            for i, line in enumerate(f, 1):
                if not line.strip():
                    continue
                where = f"{path}:{i}"
                try:
                    r = json.loads(line)
                    meta = r.get("meta") or {}
                    prompt, rid, samples = str(r["prompt"]), str(r["id"]), r["samples"]
                except (ValueError, KeyError, TypeError, AttributeError) as e:
                    raise InputError(f"{where} is not an outcome-table row ({e!r}); each line needs id, prompt "
                                     "and samples") from None
                if not samples:
                    raise InputError(f"{where}: row {rid!r} has no samples; drop it or sample it first")
                if prompt in table.rows:
                    raise InputError(f"{where}: prompt of row {rid!r} is already served (row "
                                     f"{table.rows[prompt].id!r}); serve each model's table from its own replay")
                first_model = first_model or meta.get("model") or path.stem
                task = str(meta.get("task") or "")
                pt = r.get("prompt_tokens")
                row = ReplayRow(rid, prompt, int(pt) if pt else math.ceil(len(prompt) / 4),
                                tuple(_sample(s, task, where, table) for s in samples))
                table.rows[prompt] = row
                table.by_id[rid] = row
    if not table.rows:
        raise InputError(f"the outcome tables {', '.join(map(str, paths))} hold no rows")
    table.model = model or str(first_model)
    return table
