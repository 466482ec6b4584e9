"""Writing outcome tables: one flushed line per record, and resuming after an interrupted run.

A line counts as written only once its newline is: :class:`OutcomeWriter` writes each record's line in
one call and flushes it, and on reopening cuts a partial last line off, so resuming neither loses nor
duplicates finished prompts; :func:`completed_ids` lists the ids already written.

Ignores: reading a table back (:func:`isocompute.solver.outcomes.read_outcomes`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from isocompute.errors import InputError
from isocompute.solver.outcome_records import OutcomeRecord, record_to_json

__all__ = ["OutcomeWriter", "completed_ids", "merge_shards"]


def _complete_prefix(path: Path) -> tuple[set[str], int]:
    """Ids on the complete (newline-terminated) lines of ``path`` and the byte length of those lines."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return set(), 0
    end = data.rfind(b"\n") + 1
    ids: set[str] = set()
    for lineno, line in enumerate(data[:end].split(b"\n")[:-1], start=1):
        if not line.strip():
            continue
        try:
            rid = json.loads(line)["id"]
        except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError):
            raise InputError(f"{path}, line {lineno}: a complete line that is not an outcome record; the "
                             "file is damaged beyond an interrupted last line. Fix or delete that line.") from None
        ids.add(rid)
    return ids, end


def completed_ids(path: str | os.PathLike[str]) -> set[str]:
    """Ids already written to ``path`` (empty if it does not exist). A truncated last line — one without
    its newline, left by an interrupted run — is not counted: that prompt is not finished."""
    return _complete_prefix(Path(path))[0]


class OutcomeWriter:
    """Append records to an outcome table, one flushed line each; reopening resumes.

    On open, a partial last line (an interrupted write) is cut off, and :attr:`completed` holds the ids
    already present so the sampler can skip them. Writing an id that is already present raises.

    >>> with OutcomeWriter("outcomes.jsonl") as w:            # doctest: +SKIP
    ...     for problem in problems:
    ...         if problem.id not in w.completed:
    ...             w.write(OutcomeRecord(problem.id, problem.prompt, problem.gold, samples))
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.completed: set[str] = set()
        self._f: Any = None

    def open(self) -> OutcomeWriter:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.completed, end = _complete_prefix(self.path)
        if self.path.exists() and self.path.stat().st_size > end:
            with self.path.open("r+b") as f:
                f.truncate(end)
        self._f = self.path.open("a", encoding="utf-8")
        return self

    def write(self, record: OutcomeRecord | Mapping[str, Any]) -> None:
        if self._f is None:
            raise RuntimeError("OutcomeWriter is not open; use it as a context manager or call open().")
        line = record_to_json(record)
        rid = record.id if isinstance(record, OutcomeRecord) else record["id"]
        if rid in self.completed:
            raise InputError(f"{self.path} already holds a record with id {rid!r}; skip ids in "
                             "`writer.completed` when resuming.")
        self._f.write(line + "\n")  # one write per line, so a crash leaves at most one partial line
        self._f.flush()
        self.completed.add(rid)

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None

    def __enter__(self) -> OutcomeWriter:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()


def merge_shards(shards: list[Path], out: Path, order: list[str]) -> int:
    """Concatenate shard tables into ``out`` with the records in ``order`` (problem ids); written to a
    temporary file and renamed, so ``out`` is either whole or absent. Returns the records written."""
    lines: dict[str, bytes] = {}
    for path in shards:
        for line in path.read_bytes().splitlines(keepends=True):
            if line.strip():
                lines[json.loads(line)["id"]] = line
    missing = [pid for pid in order if pid not in lines]
    if missing:
        raise InputError(f"the shard tables lack {len(missing)} of {len(order)} prompts (e.g. {missing[0]!r}); "
                         "run the missing shards again (sample resumes) before merging")
    tmp = out.with_name(out.name + ".merging")
    tmp.write_bytes(b"".join(lines[pid] for pid in order))
    tmp.replace(out)
    return len(order)
