"""``isocompute train``: post-training stages, one sub-subcommand each.

``isocompute train sft --task arith --out runs/tiny-sft`` trains the tiny embedded model from scratch
(:mod:`isocompute.training.sft`). Another stage adds itself by writing ``_register_<name>(stages)`` and
listing it in :data:`STAGES`.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any


def config_defaults(cls: type) -> SimpleNamespace:
    """A config dataclass's field defaults, without constructing it: ``__post_init__`` may import
    transformers (seconds), and ``isocompute --help`` must stay fast."""
    return SimpleNamespace(**{f.name: f.default for f in dataclasses.fields(cls)
                              if f.default is not dataclasses.MISSING})


def _register_sft(stages: Any) -> None:
    from isocompute.training.sft import SFTConfig  # light: the module imports torch only inside functions

    d = config_defaults(SFTConfig)
    p = stages.add_parser("sft", help="supervised training of the tiny model from scratch (CPU, minutes)",
                          description="Train the tiny embedded model on arith reference solutions; writes a "
                                      "Hugging Face model directory with manifest.json and train_log.jsonl.")
    p.add_argument("--task", default=d.task, choices=["arith"], help="training task (default: %(default)s)")
    p.add_argument("--out", required=True, help="output model directory, written atomically")
    p.add_argument("--steps", type=int, default=d.steps, help="optimiser steps (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="problems per step (default: %(default)s)")
    p.add_argument("--lr", type=float, default=d.lr, help="peak learning rate (default: %(default)s)")
    p.add_argument("--seed", type=int, default=d.seed, help="init/data seed (default: %(default)s)")
    p.add_argument("--threads", type=int, default=d.threads, help="torch CPU threads (default: %(default)s)")
    p.add_argument("--layers", type=int, default=d.num_layers, help="decoder layers (default: %(default)s)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(func=_run_sft)


def _run_sft(args: argparse.Namespace) -> int:
    from isocompute.training.sft import SFTConfig, train_sft

    cfg = SFTConfig(task=args.task, steps=args.steps, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                    threads=args.threads, num_layers=args.layers)
    result = train_sft(cfg, args.out, progress=not args.no_progress)
    print(f"wrote {result.out_dir}: {result.n_parameters:,} parameters, {result.steps} steps in "
          f"{result.seconds:.0f} s, loss {result.first_loss:.3f} -> {result.final_loss:.3f}")
    return 0


def _register_grpo(stages: Any) -> None:
    from isocompute.cli.train_grpo import register_stage  # compute-aligned GRPO (isocompute.training.grpo)

    register_stage(stages)


STAGES: tuple[Callable[[Any], None], ...] = (_register_sft, _register_grpo)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("train", help="post-train a model (sft, ...)",
                                   description="Post-training stages for the embedded tiny model.")
    stages = parser.add_subparsers(dest="stage", metavar="STAGE", required=True)
    for add in STAGES:
        add(stages)
