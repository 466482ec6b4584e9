"""Compare two artifact directories file by file: payloads byte for byte, manifests as JSON without
``created_at`` (and, for a report, without the paths and checksums that name the run's own directories).

    python scripts/compare_artifacts.py BEFORE_DIR AFTER_DIR [--ignore-key KEY ...]

Exit 0 when every file matches, 1 otherwise (each difference printed). Used to check that a refactor left
a stage's output unchanged: run the stage before and after on the same inputs and seeds, then compare.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def strip(obj: Any, keys: set[str]) -> Any:
    if isinstance(obj, dict):
        return {k: strip(v, keys) for k, v in obj.items() if k not in keys}
    if isinstance(obj, list):
        return [strip(v, keys) for v in obj]
    return obj


def compare(before: Path, after: Path, keys: set[str]) -> list[str]:
    names = sorted({p.relative_to(before) for p in before.rglob("*") if p.is_file()}
                   | {p.relative_to(after) for p in after.rglob("*") if p.is_file()})
    problems = []
    for name in names:
        a, b = before / name, after / name
        if not a.is_file() or not b.is_file():
            problems.append(f"{name}: only in {'after' if b.is_file() else 'before'}")
        elif name.suffix == ".json" and (name.name == "manifest.json" or keys - {"created_at"}):
            if strip(json.loads(a.read_text()), keys) != strip(json.loads(b.read_text()), keys):
                problems.append(f"{name}: JSON differs")
        elif a.read_bytes() != b.read_bytes():
            problems.append(f"{name}: bytes differ")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--ignore-key", action="append", default=[], help="a JSON key to drop before comparing")
    args = ap.parse_args(argv)
    problems = compare(args.before, args.after, {"created_at", *args.ignore_key})
    for p in problems:
        print(p)
    n = len([p for p in args.before.rglob("*") if p.is_file()])
    print(f"{n} files in {args.before}: {'all equal' if not problems else f'{len(problems)} differ'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
