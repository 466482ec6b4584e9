"""Any JSONL or JSON-array dump, with a field mapping: where each record keeps its question, gold and samples.

The mapping names, for each of our fields, a *path* into a record: keys joined by ``.``, and ``[]`` after
a key to take that field of every element of a list. For an eval-harness log like::

    {"doc_id": 7, "doc": {"problem": "What is 2+2?", "answer": "4"},
     "resps": [{"text": "2+2 = \\\\boxed{4}", "n_tokens": 12}, {"text": "It is 5", "n_tokens": 4}]}

the mapping ``id=doc_id question=doc.problem gold=doc.answer completions=resps[].text
completion_tokens=resps[].n_tokens`` gives one prompt with two samples, whose answers are extracted from
the completions. Given by ``--field KEY=PATH`` flags or a JSON mapping file (``{"question": "doc.problem",
…}``; flags win).

| key | required | what the path must reach |
|---|---|---|
| ``question`` | yes | the prompt text (a string) |
| ``gold`` | no | the reference answer (a string or a number); a record without one (no ``gold`` key, or null) is imported ungraded |
| ``answers`` / ``completions`` | one or both | a list of extracted answers (strings, numbers or null) / of completion texts (answers are extracted from them when ``answers`` is absent; with both, they are only counted for tokens) |
| ``completion_tokens`` | no | a list of integers ≥ 0, one per sample |
| ``scores`` | no | a list of numbers, one per sample (verifier scores for best-of-k) |
| ``logprob_mean`` | no | a list of numbers ≤ 0 (or null), one per sample: mean token log-probability |
| ``confidence_min_window`` | no | a list of numbers ≥ 0 (or null), one per sample: DeepConf's lowest window confidence (:mod:`isocompute.tasks.confidence`) |
| ``prompt_tokens`` | no | an integer ≥ 0 |
| ``id`` | no | a string or integer; default ``<file stem>-<index>`` |
| ``task`` | no | the record's task or answer kind (else ``--task``) |
| ``meta`` | no | an object, copied into the table's ``meta`` |

Unmapped keys default to a field of the same name (``question``, ``gold``, ``answers``, …), optional
ones only used when present; a path the user gave must exist in every record. Ignores: every other
field of the record.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from isocompute.errors import InputError
from isocompute.tasks.importers.records import RawRecord, iter_json, malformed

__all__ = ["FIELDS", "load_mapping", "read_generic"]

FIELDS = ("id", "question", "gold", "answers", "completions", "completion_tokens", "scores",
          "logprob_mean", "confidence_min_window", "prompt_tokens", "task", "meta")
_ABSENT = object()


def load_mapping(path: str | Path | None, fields: list[str] | None) -> dict[str, str]:
    """The user's mapping: a JSON file's ``{key: path}`` updated by ``KEY=PATH`` flags; keys checked."""
    mapping: dict[str, str] = {}
    if path is not None:
        p = Path(path)
        try:
            loaded = json.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise InputError(f"mapping file {p} does not exist; pass a JSON object like "
                             '{"question": "problem", "gold": "answer", "answers": "preds"}.') from None
        except json.JSONDecodeError as e:
            raise InputError(f"mapping file {p}: bad JSON ({e.msg} at line {e.lineno}); it must be one "
                             "JSON object of field paths.") from None
        if not isinstance(loaded, dict) or not all(isinstance(v, str) for v in loaded.values()):
            raise InputError(f"mapping file {p} must be a JSON object of strings, like "
                             '{"question": "problem", "answers": "samples[].answer"}.')
        mapping.update(loaded)
    for item in fields or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise InputError(f"--field takes KEY=PATH, like question=doc.problem; you passed {item!r}.")
        mapping[key.strip()] = value.strip()
    unknown = sorted(set(mapping) - set(FIELDS))
    if unknown:
        raise InputError(f"unknown mapping key(s) {unknown}; the keys are {', '.join(FIELDS)}.")
    return mapping


def _walk(obj: Any, path: str) -> Any:
    """The value at ``path`` (module docstring), or ``_ABSENT`` when a key is missing."""
    parts = path.split(".")
    return _walk_parts(obj, parts)


def _walk_parts(obj: Any, parts: list[str]) -> Any:
    for i, part in enumerate(parts):
        each = part.endswith("[]")
        key = part[:-2] if each else part
        if key:
            if not isinstance(obj, dict) or key not in obj:
                return _ABSENT
            obj = obj[key]
        if each:
            if not isinstance(obj, list):
                return _ABSENT
            rest = parts[i + 1:]
            return [_walk_parts(x, rest) if rest else x for x in obj]
    return obj


def _get(rec: Any, mapping: Mapping[str, str], key: str, where: str) -> Any:
    path = mapping.get(key, key)
    value = _walk(rec, path)
    missing = value is _ABSENT or (isinstance(value, list) and any(v is _ABSENT for v in value))
    if missing:
        if key in mapping:  # an unmapped gold that is absent: traffic, imported ungraded
            raise malformed(where, f"the mapped {key} path {path!r} is missing from this record",
                            f"fix the mapping (--field {key}=PATH) or the record")
        return None
    return value


def _check_list(value: Any, key: str, ok: Any, what: str, where: str) -> list | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise malformed(where, f"{key} must be a list of {what}, got {type(value).__name__}",
                        f"map {key} to a per-sample list")
    bad = next((v for v in value if not ok(v)), _ABSENT)
    if bad is not _ABSENT:
        raise malformed(where, f"{key} must be a list of {what}; it holds {bad!r}", f"fix {key} in the record")
    return value


def _is_count(v: Any) -> bool:
    return type(v) is int and v >= 0


def _is_score(v: Any) -> bool:
    return v is None or (type(v) in (int, float) and math.isfinite(v))


def _is_logprob(v: Any) -> bool:
    return v is None or (type(v) in (int, float) and math.isfinite(v) and v <= 0)


def _is_confidence(v: Any) -> bool:
    return v is None or (type(v) in (int, float) and math.isfinite(v) and v >= 0)


def read_generic(path: str | Path, *, mapping: Mapping[str, str], task: str | None) -> Iterator[RawRecord]:
    """The dump's records in file order, mapped (module docstring)."""
    stem = Path(path).stem
    for index, (where, rec) in enumerate(iter_json(path)):
        if type(rec) is not dict:
            raise malformed(where, f"expected a JSON object, got {type(rec).__name__}",
                            "each record must be one JSON object")
        question = _get(rec, mapping, "question", where)
        if not isinstance(question, str) or not question.strip():
            raise malformed(where, f"no question (path {mapping.get('question', 'question')!r} gave {question!r})",
                            "map it with --field question=PATH")
        gold = _get(rec, mapping, "gold", where)
        answers = _check_list(_get(rec, mapping, "answers", where), "answers",
                              lambda v: v is None or type(v) in (str, int, float), "strings, numbers or null", where)
        completions = _check_list(_get(rec, mapping, "completions", where), "completions",
                                  lambda v: isinstance(v, str), "strings", where)
        if answers is None and completions is None:
            raise malformed(where, "no samples: neither answers nor completions found",
                            "map one with --field answers=PATH or --field completions=PATH")
        rid = _get(rec, mapping, "id", where)
        if rid is not None and (type(rid) not in (str, int) or str(rid) == ""):
            raise malformed(where, f"id must be a non-empty string or an integer, got {rid!r}", "fix the id field")
        rec_task = _get(rec, mapping, "task", where)
        if rec_task is None and task is None:
            raise malformed(where, "no task: the record has none and --task was not given",
                            "pass --task (e.g. math, gsm8k, date) or map a per-record task with --field task=PATH")
        prompt_tokens = _get(rec, mapping, "prompt_tokens", where)
        if prompt_tokens is not None and not _is_count(prompt_tokens):
            raise malformed(where, f"prompt_tokens must be an integer >= 0, got {prompt_tokens!r}",
                            "fix or unmap prompt_tokens")
        meta = _get(rec, mapping, "meta", where)
        if meta is not None and not isinstance(meta, dict):
            raise malformed(where, f"meta must be an object, got {type(meta).__name__}", "fix or unmap meta")
        gold_ok = type(gold) is str and gold.strip() or type(gold) in (int, float) and math.isfinite(gold)
        record = RawRecord(
            id=str(rid) if rid is not None else f"{stem}-{index}",
            prompt=question,
            gold=str(gold).strip() if gold_ok else None,
            gold_problem=None if gold_ok or gold is None else f"the gold answer is {gold!r}",  # None: ungraded
            task=str(rec_task or task),
            where=where,
            answers=None if answers is None else [None if a is None else str(a) for a in answers],
            completions=completions,
            completion_tokens=_check_list(_get(rec, mapping, "completion_tokens", where), "completion_tokens",
                                          _is_count, "integers >= 0", where),
            scores=_check_list(_get(rec, mapping, "scores", where), "scores", _is_score, "finite numbers", where),
            logprob_mean=_check_list(_get(rec, mapping, "logprob_mean", where), "logprob_mean", _is_logprob,
                                     "finite numbers <= 0 or null", where),
            confidence_min_window=_check_list(_get(rec, mapping, "confidence_min_window", where),
                                              "confidence_min_window", _is_confidence,
                                              "finite numbers >= 0 or null", where),
            prompt_tokens=prompt_tokens,
            meta={"index": index, **(meta or {})},
        )
        record.check_lengths()
        yield record
