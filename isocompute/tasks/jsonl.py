"""Reading a public dataset's JSONL file with errors that name the line.

Used by the GSM8K and MATH loaders. Blank lines are skipped; everything else must be a JSON object
holding the required fields. Ignores: compression, remote URLs, other encodings than UTF-8.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from isocompute.errors import InputError


def read_records(path: str | Path, *, required: Iterable[str], what: str) -> list[tuple[int, dict[str, Any]]]:
    """``[(line_number, record), ...]`` for the non-blank lines of ``path`` (1-based line numbers).

    ``what`` names the dataset in error messages, e.g. ``"GSM8K"``.
    """
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{what} file {str(p)!r} does not exist; pass the path of its JSONL file.")
    required = tuple(required)
    out: list[tuple[int, dict[str, Any]]] = []
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{p}: not UTF-8 text ({e}); pass the {what} JSONL file itself.") from e
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{p}:{lineno}: not valid JSON ({e.msg}); fix or remove that line.") from e
        if not isinstance(record, dict):
            raise InputError(
                f"{p}:{lineno}: expected a JSON object, got {type(record).__name__}; each line must be one "
                f"{what} record."
            )
        missing = [k for k in required if not isinstance(record.get(k), str) or not record[k].strip()]
        if missing:
            raise InputError(
                f"{p}:{lineno}: missing or empty field(s) {missing}; a {what} line needs {list(required)}."
            )
        out.append((lineno, record))
    if not out:
        raise InputError(f"{p}: no {what} records found; the file is empty.")
    return out
