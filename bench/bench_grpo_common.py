"""Shared pieces of the GRPO benchmarks: a training run that records a held-out accuracy curve against
cumulative rollouts and FLOPs and stops at a rollout or FLOP budget, and target-crossing interpolation.

Used by ``bench/bench_grpo_allocation.py`` and ``bench/bench_grpo_aligned.py``; not a benchmark itself.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from isocompute.artifacts import atomic_write_text
from isocompute.flops.race import RaceConvention
from isocompute.tasks import arith
from isocompute.tasks.base import Problem
from isocompute.training.evaluation import evaluate, reference_probability
from isocompute.training.grpo import AlignedGRPOConfig, load_base, lora_config, problem_rows
from isocompute.training.grpo_trainer import AlignedGRPOTrainer

HELD_OUT_SEED = 7  # arith seed of held-out problems (training uses 2,000,000 + seed)


def parse_mix(text: str) -> dict[int, float]:
    """``"1:1,2:0.5"`` → {1: 1.0, 2: 0.5}."""
    return {int(k): float(v) for k, v in (part.split(":") for part in text.split(",") if part)}


def held_out(n: int, seed: int = HELD_OUT_SEED, mix: dict[int, float] | None = None) -> list[Problem]:
    return arith.generate(n, seed, mix=mix)


@dataclass
class Curve:
    """Held-out accuracy after each evaluated step, with the cumulative rollouts and FLOPs spent so far."""

    points: list[dict[str, float]] = field(default_factory=list)
    seconds: float = 0.0
    ledger: dict[str, Any] = field(default_factory=dict)
    rollouts: dict[str, Any] = field(default_factory=dict)
    zero_groups: float = float("nan")  # mean share of update groups whose advantages are all zero

    def xs(self, key: str) -> np.ndarray:
        return np.array([p[key] for p in self.points], dtype=float)


def smooth(y: np.ndarray, width: int = 3) -> np.ndarray:
    """Centred moving average (shrinking at the ends), so one noisy evaluation does not decide a crossing.

    >>> smooth(np.array([0.0, 3.0, 0.0, 3.0])).tolist()
    [1.5, 1.0, 2.0, 1.5]
    """
    h = width // 2
    return np.array([y[max(0, i - h): i + h + 1].mean() for i in range(len(y))])


def crossing(x: np.ndarray, y: np.ndarray, target: float) -> float:
    """First x at which y reaches ``target`` (linear interpolation between points); NaN if never.

    >>> crossing(np.array([0, 10, 20.]), np.array([0.2, 0.4, 0.6]), 0.5)
    15.0
    """
    above = np.flatnonzero(y >= target)
    if above.size == 0:
        return float("nan")
    j = int(above[0])
    if j == 0:
        return float(x[0])
    t = (target - y[j - 1]) / (y[j] - y[j - 1])
    return float(x[j - 1] + t * (x[j] - x[j - 1]))


def run_curve(cfg: AlignedGRPOConfig, *, base: str | None, problems: list[Problem], eval_every: int,
              stop_rollouts: float | None = None, stop_flops: float | None = None, eval_n: int = 1,
              temperature: float = 0.0, max_new_tokens: int = 64, keep_model: bool = False,
              eval_seed: int = 0, sample_every: int | None = None, sample_problems: int | None = None,
              start_accuracy: float | None = None, ref: bool = True, label: str | None = None) -> tuple[Curve, Any]:
    """Train per ``cfg`` (its ``steps`` is an upper bound; ``lora_rank`` > 0 trains LoRA adapters) until
    the rollout or FLOP budget is spent, measuring held-out metrics at the start and every ``eval_every``
    steps (``label``: print a progress line at each):

    * ``ref``: the exact probability that a temperature-1 sample is the reference solution
      (:func:`reference_probability`, no sampling noise, one forward pass per problem; the tiny model's
      solutions follow the reference, a pretrained model's do not — ``ref=False`` skips it, NaN);
    * ``accuracy``: mean correctness of ``eval_n`` samples per problem (greedy by default) on the first
      ``sample_problems`` problems (all by default), at steps that are multiples of ``sample_every`` and
      at the end (``sample_every`` None: at every measured step; elsewhere NaN). ``start_accuracy``
      replaces the sampling at step 0, for callers that start many runs from the same base.

    The evaluation's sampling seed is the same for every run (common random numbers): runs differ only by
    their training."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback

    torch.set_num_threads(cfg.threads)
    model, tok = load_base(base, seed=cfg.seed)
    train_problems = cfg.problems()
    dataset = Dataset.from_list(problem_rows(train_problems))
    curve = Curve()
    prompts = [p.prompt for p in problems]
    references = [arith.solution_for(p) for p in problems]
    sampled = problems[:sample_problems] if sample_problems else problems

    def measure(trainer: Any, step: int, last: bool = False) -> None:
        acc = float("nan")
        if step == 0 and start_accuracy is not None:
            acc = start_accuracy
        elif last or sample_every is None or step % sample_every == 0:
            acc = evaluate(trainer.model, tok, sampled, n=eval_n, ks=(1,), temperature=temperature,
                           max_new_tokens=max_new_tokens, seed=eval_seed).accuracy
        p_ref = float(reference_probability(trainer.model, tok, prompts, references).mean()) if ref else float("nan")
        curve.points.append({"step": step, "rollouts": trainer.rollout_ledger.total,
                             "used": trainer.rollout_ledger.used, "flops": trainer.ledger.analytic.total,
                             "race_flops": trainer.ledger.race.total, "ref": p_ref, "accuracy": acc,
                             "seconds": time.monotonic() - start})
        if label is not None:
            print(f"  {label} step {step}: {trainer.rollout_ledger.total:.0f} rollouts, "
                  f"{trainer.ledger.analytic.total:.3e} FLOPs (rho {trainer.ledger.rho:.3f}, RACE {trainer.ledger.race_rho:.3f}), accuracy {acc:.3f}, "
                  f"ref {p_ref:.4f}, {time.monotonic() - start:.0f} s", flush=True)

    class Recorder(TrainerCallback):
        trainer: Any = None

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
            tr = self.trainer
            spent = (stop_rollouts is not None and tr.rollout_ledger.total >= stop_rollouts) or (
                stop_flops is not None and tr.ledger.analytic.total >= stop_flops)
            last = spent or state.global_step >= state.max_steps
            if state.global_step % eval_every == 0 or last:
                measure(tr, state.global_step, last)
            if spent:
                control.should_training_stop = True
            return control

    rec = Recorder()
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-grpo-") as scratch:
        trainer = AlignedGRPOTrainer(model, cfg.trl_args(scratch), dataset, objective=cfg.objective,
                                     processing_class=tok, race=RaceConvention(a=cfg.race_a),
                                     peft_config=lora_config(cfg.lora_rank) if cfg.lora_rank else None,
                                     allocator=cfg.allocator(len(dataset), [p.prompt for p in train_problems]),
                                     callbacks=[rec])
        rec.trainer = trainer
        measure(trainer, 0)
        trainer.train()
    curve.seconds = time.monotonic() - start
    curve.ledger = trainer.ledger.to_dict()
    curve.rollouts = trainer.rollout_ledger.to_dict()
    zero = [e["objective/zero_groups"] for e in trainer.state.log_history if "objective/zero_groups" in e]
    curve.zero_groups = float(np.mean(zero)) if zero else float("nan")
    if not keep_model:
        return curve, None
    trained = trainer.accelerator.unwrap_model(trainer.model)
    if hasattr(trained, "merge_and_unload"):  # LoRA: the adapters merged, as `isocompute train grpo` saves
        trained = trained.merge_and_unload()
    return curve, (trained, tok)


def cached(out_dir: Path | None, name: str, compute: Callable[[], dict]) -> dict:
    """``compute()``, kept as ``out_dir/name.json`` (written atomically) and read back from there when it
    exists; ``out_dir`` None: computed, not kept."""
    if out_dir is None:
        return compute()
    path = out_dir / f"{name}.json"
    if path.exists():
        print(f"{name}: kept from {path}", flush=True)
        return json.loads(path.read_text())
    atomic_write_text(path, json.dumps(compute(), default=float) + "\n")
    return json.loads(path.read_text())
