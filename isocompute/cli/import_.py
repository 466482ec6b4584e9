"""``isocompute import FORMAT SRC... --out TABLE.jsonl``: samples a user already has → an outcome table.

The options are :class:`isocompute.stages.import_.ImportConfig`'s fields (argparse generated from them);
the work is :func:`isocompute.stages.import_.import_samples`. This module prints what the table holds:
prompts, samples, accuracy and majority votes by class and by string, the answers merged into classes,
and the records left out.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from isocompute.stages.import_ import ImportConfig
from isocompute.stages.options import add_arguments, from_namespace


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "import",
        help="import samples you already have (JSONL/JSON dumps) into an outcome table, graded (resumable)",
        description="Read external sample dumps, grade every answer with its task's rule, merge equivalent "
        "answers into classes and write an outcome table. Interrupted? Rerun the same command.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_arguments(p, ImportConfig)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from isocompute.stages.import_ import import_samples

    res = import_samples(from_namespace(ImportConfig, args))
    if res.written == 0 and res.skipped == res.prompts:
        print(f"{res.out} is already imported from these sources ({res.prompts} prompts); nothing to do.")
    else:
        print(f"wrote {res.out}: {res.prompts} prompts ({res.written} now, {res.skipped} resumed), "
              f"{res.samples} samples in {res.seconds:.1f} s ({res.cpu_seconds:.1f} s CPU in this process)")
    four = "" if res.maj4_by_class is None else \
        f"maj@4 {res.maj4_by_class:.4f} by class ({res.maj4_by_string:.4f} by string); "
    print(f"per-sample accuracy {res.accuracy:.4f}{'' if res.target == 'gold' else ' (consensus)'}; {four}maj@n {res.maj_by_class:.4f} by class "
          f"({res.maj_by_string:.4f} by string)")
    print(f"answers: {res.distinct_answers} distinct strings in {res.classes} classes; "
          f"{res.merged_prompts} prompts had equivalent strings merged")
    for line in res.examples:
        print(f"  e.g. {line}")
    if res.references:
        print(f"joined problem file: {res.references - res.disagree} of {res.references} of its answers agree "
              "with the dump's golds")
    if res.timed_out:
        print(f"warning: {res.timed_out} math-verify parse(s) or comparison(s) timed out (answers kept apart; "
              "against the gold: incorrect)", file=sys.stderr)
    if res.unreadable:
        print(f"warning: {len(res.unreadable)} record(s) left out, their gold answer cannot be graded against:",
              file=sys.stderr)
        for u in res.unreadable[:20]:
            print(f"  {u['id']} ({u['where']}): {u['why']}", file=sys.stderr)
    print(f"manifest: {res.manifest}")
    return 0
