"""Importers of external sample dumps: someone else's samples in, outcome-table lines out.

| format | module | layout |
|---|---|---|
| ``jsonl`` | :mod:`~isocompute.tasks.importers.generic` | any JSONL / JSON array, with a field mapping |
| ``boinf`` | :mod:`~isocompute.tasks.importers.boinf` | BoInf's MATH-500 answer lists + a problem file |
| ``mot`` | :mod:`~isocompute.tasks.importers.mot` | MoT's Llama-2 GSM8K / Date result lists |

Each format module reads its files into :class:`~isocompute.tasks.importers.records.RawRecord` (errors
name file and line); :func:`~isocompute.tasks.importers.grade.grade_records` extracts, merges into
classes and grades them. ``isocompute import`` (:mod:`isocompute.stages.import_`) writes the table.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from isocompute.errors import InputError
from isocompute.tasks.importers.records import RawRecord

FORMATS = ("jsonl", "boinf", "mot")

__all__ = ["FORMATS", "RawRecord", "read_source"]


def read_source(fmt: str, path: str | Path, *, task: str | None = None, problems: str | Path | None = None,
                mapping: dict[str, str] | None = None, question_field: str = "problem") -> Iterator[RawRecord]:
    """The raw records of one source file in format ``fmt`` (see the table above for what each needs)."""
    if fmt == "jsonl":
        from isocompute.tasks.importers.generic import read_generic

        return read_generic(path, mapping=mapping or {}, task=task)
    if fmt == "boinf":
        if problems is None:
            raise InputError("format boinf has no problem text: pass --problems FILE, the problem set the dump "
                             "indexes (for MATH-500, ../shared/data/math500_test.jsonl).")
        from isocompute.tasks.importers.boinf import read_boinf

        return read_boinf(path, problems=problems, task=task or "math", question_field=question_field)
    if fmt == "mot":
        from isocompute.tasks.importers.mot import read_mot

        return read_mot(path, task=task)
    raise InputError(f"unknown import format {fmt!r}; choose one of {', '.join(FORMATS)}.")


def describe(**options: Any) -> dict[str, Any]:
    """The options that shape a format's output, as recorded in the manifest (None values dropped)."""
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in options.items() if v is not None}
