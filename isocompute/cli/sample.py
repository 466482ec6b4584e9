"""``isocompute sample``: run a model n times on every prompt of a task, grade each answer, write the
outcome table.

The options are :class:`isocompute.stages.sample.SampleConfig`'s fields (argparse generated from them);
the work is :func:`isocompute.stages.sample.sample`. This module prints one line about the run (with
``--logprobs``, also its tokens priced at :data:`isocompute.flops.logprobs.LOGPROB_COST_FACTOR`).
"""

from __future__ import annotations

import argparse
from typing import Any

from isocompute.stages.options import add_arguments, from_namespace
from isocompute.stages.sample import SampleConfig


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "sample",
        help="sample n completions per prompt, grade them, write an outcome table (resumable)",
        description="Sample n completions per prompt of a task, grade every answer and write the outcome "
        "table (JSONL, one flushed line per prompt). Interrupted? Rerun the same command: finished prompts "
        "are kept and skipped.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_arguments(p, SampleConfig)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from isocompute.stages.sample import sample

    res = sample(from_namespace(SampleConfig, args))
    print(
        f"wrote {res.written} prompts to {res.out} ({res.skipped} already there, {res.total} in the task); "
        f"{res.completion_tokens} completion tokens in {res.seconds:.1f} s "
        f"({res.completion_tokens_per_s:.0f} tok/s); accuracy {res.accuracy:.3f}"
        + (f"; with logprobs={res.logprobs} priced as {res.priced_tokens:.0f} tokens" if res.logprobs else "")
    )
    return 0
