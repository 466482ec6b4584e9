"""Outcome tables: the graded samples of every calibration prompt, read, validated, written and viewed.

Format, schema version 1 — JSONL, one JSON object per line, one line per prompt::

    {"id": "gsm8k-17", "prompt": "…", "gold": "18", "prompt_tokens": 91,
     "samples": [{"answer": "18", "correct": true, "completion_tokens": 143, "score": 0.82}, …],
     "meta": {"task": "gsm8k", "model": "…", "temperature": 0.7}}

Fields (required unless marked optional):

* ``id`` — non-empty string, unique in the file.
* ``prompt`` — the text given to the model.
* ``gold`` — reference final answer (a JSON number is read as its string).
* ``samples`` — non-empty list, one object per sampled completion:

  * ``answer`` — the extracted final answer, ``null`` when none could be extracted (a JSON number
    is read as its string), kept raw.
  * ``class`` (optional) — the answer's equivalence class (:mod:`isocompute.tasks.answers.equivalence`): an
    integer, dense within the record (``0 … G−1``), ``null`` exactly when ``answer`` is null; equal
    answer strings share a class. A record gives ``class`` on every sample or on none. Majority votes
    count classes where given, else equal strings (so tables written before classes read as before).
  * ``correct`` — ``true``/``false``, the grader's verdict on this sample.
  * ``completion_tokens`` (optional) — generated tokens, integer ≥ 0.
  * ``score`` (optional) — verifier / reward-model score, a finite number (needed for best-of-k).
  * ``logprob_mean`` (optional) — mean log-probability of the sample's tokens, a finite number ≤ 0.
  * ``confidence_min_window`` (optional) — DeepConf's lowest window confidence (mean over a sliding window
    of tokens of −mean top-k log-probability; :mod:`isocompute.tasks.confidence`), a finite number ≥ 0.
    Both are written by ``isocompute sample --logprobs K`` and kept by ``import`` where a dump has them;
    :attr:`OutcomeTable.logprob_mean` and :attr:`OutcomeTable.confidence_min_window` are their views.

* ``prompt_tokens`` (optional) — prompt length in tokens, integer ≥ 0.
* ``meta`` (optional) — free-form object (task, model, temperature, …).

Unknown keys are kept in :attr:`OutcomeTable.records` and otherwise ignored. Prompts may have different
numbers of samples (a *ragged* table); the vectorised views are then padded and :attr:`OutcomeTable.mask`
marks the real entries. Blank lines are skipped. A line counts as written only once its newline is:
:class:`OutcomeWriter` flushes one complete line per record, and on reopening drops a partial last
line left by an interrupted run, so resuming neither loses nor duplicates finished prompts.

Where it lives: this module reads files (:func:`read_outcomes`, :func:`from_qwen_cot_table`); records
are :mod:`~isocompute.solver.outcome_records`, validation :mod:`~isocompute.solver.outcome_checks`, the
table and its views :mod:`~isocompute.solver.outcome_table`, writing
:mod:`~isocompute.solver.outcome_writer`. Their public names are importable from here too.

This module ignores how answers were extracted or graded (``isocompute.tasks``) and what the utilities
are (:mod:`isocompute.solver.estimators`).
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from isocompute.errors import InputError
from isocompute.solver.outcome_checks import _FIX, NULL_CODE
from isocompute.solver.outcome_records import OutcomeRecord, Sample, record_to_dict, record_to_json
from isocompute.solver.outcome_table import PAD_CODE, OutcomeTable, _build, from_records
from isocompute.solver.outcome_writer import OutcomeWriter, completed_ids

__all__ = [
    "NULL_CODE", "PAD_CODE", "SCHEMA_VERSION", "OutcomeRecord", "OutcomeTable", "OutcomeWriter", "Sample",
    "completed_ids", "from_qwen_cot_table", "from_records", "read_outcomes", "record_to_dict", "record_to_json",
]

SCHEMA_VERSION = 1


# --------------------------------------------------------------------------------------------- readers


def read_outcomes(path: str | os.PathLike[str]) -> OutcomeTable:
    """Read and validate an outcome table (JSONL, schema version 1).

    Raises :class:`InputError` naming the file, the line and what is wrong: bad JSON, a missing or
    duplicate id (both lines named), empty samples, ``correct`` not a bool, a negative token count, …
    """
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise InputError(f"outcome table {p} does not exist; create it with `isocompute sample` "
                         "or pass the path of an existing .jsonl table.") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{p} is not UTF-8 text ({e}); re-save it as UTF-8 JSONL.") from None

    def items() -> Iterable[tuple[Any, Callable[[], str]]]:
        # split on "\n" only: str.splitlines() would also split on U+2028 inside JSON strings.
        for lineno, line in enumerate(text.split("\n"), start=1):
            if not line or line.isspace():  # isspace stops at the first character; strip() would copy
                continue
            where = lambda lineno=lineno: f"{p}, line {lineno}"  # noqa: E731
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                hint = " (the last line looks cut off: was a sampling run interrupted? resume it)" \
                    if not text.endswith("\n") and lineno == text.count("\n") + 1 else ""
                raise InputError(f"{where()}: bad JSON: {e.msg} at column {e.colno}{hint}. {_FIX}") from None
            yield obj, where

    # Parsing creates ~N·n small dicts and no cycles: the cyclic GC's repeated passes over them would
    # cost ~20% of the read, so it is paused meanwhile.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _build(items(), str(p), hashlib.sha256(data).hexdigest())
    finally:
        if was_enabled:
            gc.enable()


def from_qwen_cot_table(path: str | os.PathLike[str]) -> OutcomeTable:
    """Convert a Qwen2.5-Math evaluation dump (``qwen_math_cot_*.jsonl``) into an outcome table.

    Each input line has ``idx``, ``question``, ``gt`` and per-sample lists ``pred`` (extracted answer),
    ``score`` (bool: graded correct) and ``pred_score`` (``[[reward]]``, a reward-model score). They map
    to ``id = "qwen-<idx>"``, prompt, gold, and samples with answer = pred, correct = score,
    score = pred_score[j][0]. An empty pred becomes a null answer.
    """
    p = Path(path)
    out = []
    with p.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                preds, verdicts = r["pred"], r["score"]
                rewards = r.get("pred_score") or [None] * len(preds)
                samples = [
                    {"answer": a if a != "" else None, "correct": c,
                     **({"score": float(s[0] if isinstance(s, list) else s)} if s is not None else {})}
                    for a, c, s in zip(preds, verdicts, rewards, strict=True)
                ]
                out.append({"id": f"qwen-{r['idx']}", "prompt": r["question"], "gold": r["gt"],
                            "samples": samples, "meta": {"level": r.get("level")}})
            except (json.JSONDecodeError, KeyError, TypeError, ValueError, IndexError) as e:
                raise InputError(f"{p}, line {lineno}: not a Qwen CoT evaluation record "
                                 f"({type(e).__name__}: {e}); expected idx, question, gt, pred, score.") from None
    table = from_records(out, source=str(p))
    return dataclasses.replace(table, sha256=hashlib.sha256(p.read_bytes()).hexdigest())
