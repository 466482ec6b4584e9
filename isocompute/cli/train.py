"""``isocompute train``: post-training stages, one sub-subcommand each.

``isocompute train sft --task arith --out runs/tiny-sft`` trains the tiny embedded model from scratch
(:mod:`isocompute.training.sft`); ``isocompute train grpo --objective maj@8 --base runs/tiny-sft --out
runs/tiny-maj8`` post-trains it with compute-aligned GRPO (:mod:`isocompute.training.grpo`). Another stage
adds itself by writing ``_register_<name>(stages)`` and listing it in :data:`STAGES`.
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
    """``isocompute train grpo``: compute-aligned GRPO of a model on arith (:mod:`isocompute.training.grpo`)."""
    from isocompute.training.grpo import AlignedGRPOConfig  # light: TRL is imported inside train_grpo

    d = config_defaults(AlignedGRPOConfig)
    p = stages.add_parser(
        "grpo", help="GRPO aligned with a test-time metric (maj@k, pass@k, bon@k, mean)",
        description="GRPO post-training with compute-aligned advantages and a FLOP ledger; writes a servable "
                    "model directory with ledger.json, train_log.jsonl and manifest.json. Options are documented "
                    "in isocompute.training.grpo.AlignedGRPOConfig.")
    p.add_argument("--objective", default=d.objective, help="mean, pass@K, maj@K or bon@K (default: %(default)s)")
    p.add_argument("--base", default=None, help="model directory to start from (default: random-init tiny model)")
    p.add_argument("--out", required=True, help="output model directory, written atomically")
    p.add_argument("--steps", type=int, default=d.steps, help="updates M (default: %(default)s)")
    p.add_argument("--num-generations", type=int, default=d.num_generations,
                   help="rollouts per prompt n, ≥ k + 1 (default: %(default)s)")
    p.add_argument("--prompts-per-step", type=int, default=d.prompts_per_step,
                   help="prompts per update B_p (default: %(default)s)")
    p.add_argument("--lr", type=float, default=d.lr, help="learning rate (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=d.temperature, help="sampling temperature")
    p.add_argument("--max-completion-length", type=int, default=d.max_completion_length,
                   help="max generated tokens (default: %(default)s)")
    p.add_argument("--lora-rank", type=int, default=d.lora_rank, help="0 = full fine-tuning, r > 0 = LoRA rank r")
    p.add_argument("--race-a", type=float, default=d.race_a, help="RACE frozen-backbone share a (default: %(default)s)")
    p.add_argument("--problems", type=int, default=d.n_problems, help="training pool size (default: %(default)s)")
    p.add_argument("--seed", type=int, default=d.seed, help="problems/sampling seed (default: %(default)s)")
    p.add_argument("--threads", type=int, default=d.threads, help="torch CPU threads (default: %(default)s)")
    p.add_argument("--allocation", default=d.allocation, choices=["none", "uniform", "dynamic", "pilot-commit"],
                   help="rollout allocation: none (TRL's sampler), uniform, dynamic (DAPO), pilot-commit")
    p.add_argument("--n-pilot", type=int, default=d.n_pilot, help="Pilot-Commit pilot rollouts (0 = n // 2)")
    p.add_argument("--pool-size", type=int, default=d.pool_size, help="Pilot-Commit pool per step (0 = 2·B_p)")
    p.add_argument("--screen", action="store_true",
                   help="Pilot-Commit: skip prompts whose text looks like prompts whose pilots were wasted "
                        "(a LightGBM screen learned from the pilots; training/screen.py)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(func=_run_grpo)


def _run_grpo(args: argparse.Namespace) -> int:
    from isocompute.training.grpo import AlignedGRPOConfig, train_grpo

    cfg = AlignedGRPOConfig(objective=args.objective, num_generations=args.num_generations,
                            prompts_per_step=args.prompts_per_step, steps=args.steps, lr=args.lr,
                            temperature=args.temperature, max_completion_length=args.max_completion_length,
                            lora_rank=args.lora_rank, race_a=args.race_a, n_problems=args.problems,
                            seed=args.seed, threads=args.threads, allocation=args.allocation,
                            n_pilot=args.n_pilot, pool_size=args.pool_size, screen=args.screen)
    result = train_grpo(cfg, args.out, base=args.base, progress=not args.no_progress)
    led = result.ledger
    correct = [e["objective/correct"] for e in result.log if "objective/correct" in e]
    span = max(1, len(correct) // 4)
    print(f"wrote {result.out_dir}: {result.steps} steps, {led.samples:,} rollouts in {result.seconds:.0f} s; "
          f"FLOPs {led.analytic.total:.3e} (rollout {led.analytic.rollout:.3e}, update {led.analytic.update:.3e}), "
          f"rho {led.rho:.3f} (RACE {led.race_rho:.3f}); training-batch correctness "
          f"{sum(correct[:span]) / span:.3f} (first quarter) -> {sum(correct[-span:]) / span:.3f} (last quarter)")
    used = [e["rollouts/used"] for e in result.log if "rollouts/used" in e]
    if cfg.allocation != "none" and used:
        line = f"allocation {cfg.allocation}: {used[-1]:,.0f} of {led.samples:,} rollouts reached an update"
        if cfg.screen:  # log_every = 1 by default: one entry per step
            skipped = sum(e.get("alloc/skipped", 0.0) for e in result.log)
            line += f"; the screen skipped {skipped:,.0f} candidate prompts without a rollout"
        print(line)
    return 0


STAGES: tuple[Callable[[Any], None], ...] = (_register_sft, _register_grpo)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("train", help="post-train a model (sft, ...)",
                                   description="Post-training stages for the embedded tiny model.")
    stages = parser.add_subparsers(dest="stage", metavar="STAGE", required=True)
    for add in STAGES:
        add(stages)
