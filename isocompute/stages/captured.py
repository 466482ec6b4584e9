"""Captured traffic read back: the gateway's shards (:mod:`isocompute.app.runner.capture`) → one outcome table.

:func:`read_shards` reads every ``capture-*.jsonl`` of a directory in name order. A line counts only when it
is whole: a shard's last line without its newline (the one being written when the gateway died) is named
and skipped, and so is a line that does not parse (named with its shard and number) — never the rest of
the shard. :func:`captured_table` merges the rows of one prompt (equal text, or equal salted hash) into one
record whose samples are all of theirs, re-classified together with the answer kind the gateway voted
with (:func:`isocompute.tasks.answers.equivalence.classify`), so the consensus target
(:mod:`isocompute.solver.votes.consensus`) takes the plurality of every sample drawn for the prompt.

Ignores: what the table is fitted into (:mod:`isocompute.stages.refit`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from isocompute.errors import InputError

__all__ = ["Shards", "captured_table", "read_shards"]

SHARD_GLOB = "capture-*.jsonl"


@dataclass
class Shards:
    """Rows read from a capture directory, the shards read, and each line skipped (shard, line, why)."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    skipped: list[tuple[str, int, str]] = field(default_factory=list)

    def notes(self) -> list[str]:
        return [f"{name}, line {n}: {why}: skipped" for name, n, why in self.skipped]


def read_shards(directory: str | Path) -> Shards:
    """Every whole line of every shard of ``directory`` (module docstring)."""
    d = Path(directory)
    if not d.is_dir():
        raise InputError(f"capture directory {d} does not exist; start the gateway with --capture {d} --explore "
                         "SHARE and send it traffic first.")
    out = Shards(files=sorted(d.glob(SHARD_GLOB)))
    for path in out.files:
        data = path.read_bytes()
        lines = data.split(b"\n")
        for n, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            if n == len(lines):  # no newline after it: torn by a crash mid-write
                out.skipped.append((path.name, n, f"torn last line ({len(line)} bytes without its newline)"))
                continue
            try:
                row = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                out.skipped.append((path.name, n, f"not a JSON line ({e})"))
                continue
            if not isinstance(row, dict) or not isinstance(row.get("samples"), list) or "prompt" not in row:
                out.skipped.append((path.name, n, "not a captured row (needs prompt and samples)"))
                continue
            out.rows.append(row)
    return out


def captured_table(rows: list[dict[str, Any]], *, grader: Any = None) -> Any:
    """The rows as one outcome table: one record per prompt, every sample of its rows, classes recomputed
    over them all (module docstring); ``meta`` keeps the first row's and ``rows`` how many were merged."""
    from isocompute.solver.outcomes import from_records
    from isocompute.tasks.answers.equivalence import classify

    if not rows:
        raise InputError("no captured rows to fit on: send the gateway traffic with --explore SHARE > 0 first.")
    by_prompt: dict[str, dict[str, Any]] = {}
    for r in rows:
        rec = by_prompt.get(r["prompt"])
        if rec is None:
            rec = by_prompt[r["prompt"]] = {"id": f"c{len(by_prompt)}", "prompt": r["prompt"], "samples": [],
                                            "meta": {**(r.get("meta") or {}), "rows": 0}}
            if r.get("prompt_tokens") is not None:
                rec["prompt_tokens"] = int(r["prompt_tokens"])
        rec["meta"]["rows"] += 1
        rec["samples"] += [{k: v for k, v in s.items() if k not in ("class", "finish")} for s in r["samples"]]
    records = list(by_prompt.values())
    kinds = {str(r["meta"].get("answer_kind") or "number") for r in records}
    for kind in kinds:
        mine = [r for r in records if str(r["meta"].get("answer_kind") or "number") == kind]
        res = classify([[s["answer"] for s in r["samples"]] for r in mine], kind, grader=grader)
        for r, cls in zip(mine, res.classes, strict=True):
            for s, c in zip(r["samples"], cls, strict=True):
                s["class"] = c
    return from_records(records, source="captured rows")
