"""Compute-aligned GRPO on Hugging Face TRL: the config, the reward functions and the run function; the
``GRPOTrainer`` subclass itself is :class:`isocompute.training.grpo_trainer.AlignedGRPOTrainer`, imported
only where a trainer is built (it imports TRL and torch, which ``isocompute --help`` should not pay).

``AlignedGRPOTrainer`` trains for a test-time metric (``mean``, ``pass@k``, ``maj@k``, ``bon@k``,
:mod:`isocompute.training.rewards`) instead of single-sample reward. Rewards reach TRL's
``_calculate_rewards`` gathered over processes and group-contiguous (each prompt's n rollouts in a row);
there we replace the last reward column with the advantages n·(U − U₋ⱼ). The reward functions are

    correct (weight 0)  — 1.0 when :func:`isocompute.tasks.grading.grade` accepts the completion;
    verifier (weight 0) — only for bon@k: a score per completion (default :func:`step_check_score`);
    aligned (weight 1)  — a placeholder the override fills with the transformed reward.

So TRL logs raw correctness (``rewards/correct/mean``) apart from the transformed reward
(``rewards/aligned/mean``, ≈ 0: advantages sum to zero per group), and ``objective/correct``,
``objective/pass@k``, ``objective/maj@k`` are the batch's exact U-statistics. Because the transformed
rewards sum to zero within a group, TRL's group-mean subtraction leaves them unchanged; std scaling
would bias the gradient, so ``scale_rewards`` must be ``"none"`` (``loss_type="dr_grpo"`` keeps the
token sum unbiased too).

Every run keeps a :class:`isocompute.flops.FlopLedger` (analytic and RACE, ρ): rollouts charged as
generated (no prefix sharing with transformers ``generate``, shared with vLLM), updates per trained
sequence (prompt + completion), LoRA through peft with N_LoRA = the adapters' trainable weights.
Ignored by the ledger: evaluation, the no-grad forward passes TRL adds for old log-probs
(``num_iterations > 1``) and for the KL reference (``beta > 0``; a warning says so).

The TRL methods the trainer overrides are pinned in :data:`TRL_HOOKS` and checked when one is built
(and by ``tests/test_grpo_contract.py``), so an upgrade that renames or reshapes them fails loudly.
Ignores: multi-turn tool use, multimodal prompts.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from isocompute.errors import InputError
from isocompute.flops import FlopLedger, RaceConvention
from isocompute.tasks import arith
from isocompute.tasks.base import Problem
from isocompute.training.allocation import (
    ALLOCATORS,
    Allocator,
    make_allocator,
)
from isocompute.training.grpo_rewards import (  # noqa: F401  (re-exported: the reward functions TRL calls)
    TRL_HOOKS,
    TRL_VERSION,
    aligned,
    check_trainer_args,
    check_trl_contract,
    completion_text,
    correct,
    problem_rows,
    step_check_score,
)
from isocompute.training.rewards import Objective
from isocompute.training.screen import PromptScreen, check_screen_options

KIND = "grpo"
SCHEMA_VERSION = 1
GRPO_SEED_OFFSET = 2_000_000  # training problems; SFT uses 1_000_000 + seed, evaluation small seeds


# ------------------------------------------------------------------------------------------- runs


@dataclass(frozen=True)
class AlignedGRPOConfig:
    """One GRPO run on arith; each option is documented here only.

    ``objective``: metric to train for (``mean``, ``pass@k``, ``maj@k``, ``bon@k``). ``num_generations``
    (n): rollouts per prompt, ≥ k + 1. ``prompts_per_step`` (B_p) and ``steps`` (M): prompts per update
    and updates, so a run generates n·B_p·M rollouts. ``lr``: constant AdamW learning rate (default 2e-5:
    from the tiny SFT model, one step at 1e-3 took batch correctness from 0.28 to 0.03 and 1e-4 lowered
    held-out accuracy, while 2e-5 raised it — ``bench/bench_grpo_allocation.py``; Adam moves every weight by
    about lr per step whatever the gradient's signal-to-noise, and GRPO gradients are mostly noise).
    ``temperature``/``max_completion_length``: sampling. ``lora_rank``: 0 trains every weight, r > 0 trains
    peft LoRA adapters of rank r (alpha 2r) on all projections, merged into the saved model.
    ``race_a``: RACE's frozen-backbone share a. ``n_problems``/``mix``: the training pool (arith seed
    ``GRPO_SEED_OFFSET + seed``, difficulty weights). ``seed``: problems, sampling, shuffling.
    ``mask_truncated``: leave completions that hit ``max_completion_length`` without EOS out of the loss
    (DAPO; without it, the tiny model at lr 1e-3 learned to ramble to the limit and its accuracy collapsed).
    ``threads``: torch CPU threads (default 1: the tiny model gains nothing from more, and on a busy
    machine OpenMP threads spin-waiting on each other made a GRPO step 5–20× slower). ``log_every``:
    steps between log lines.
    ``allocation``: ``"none"`` (TRL's own sampler: uniform GRPO) or an allocator of
    :mod:`isocompute.training.allocation` (``uniform``, ``dynamic``, ``pilot-commit``); its options
    ``n_pilot`` (n_p, 0 = n // 2), ``pool_size`` (0 = 2·B_p), ``p_lo``/``p_hi`` (kept pilot accuracy
    [p_lo, 1 − p_hi]), ``staleness`` (steps a hopeless prompt is deferred) and ``max_rounds`` (pilot or
    refill rounds per step); ``screen`` adds a learned :class:`~isocompute.training.screen.PromptScreen`
    to Pilot-Commit (pilot only prompts whose predicted survival is ≥ ``screen_min_survival``, plus a
    share ``screen_explore`` of the others).
    """

    objective: str = "maj@8"
    num_generations: int = 12
    prompts_per_step: int = 4
    steps: int = 40
    lr: float = 2e-5
    temperature: float = 1.0
    max_completion_length: int = 96
    lora_rank: int = 0
    mask_truncated: bool = True
    race_a: float = 0.85
    n_problems: int = 2000
    mix: Mapping[int, float] | None = None
    seed: int = 0
    threads: int = 1
    log_every: int = 1
    allocation: str = "none"
    n_pilot: int = 0
    pool_size: int = 0
    p_lo: float = 0.1
    p_hi: float = 0.1
    staleness: int = 5
    max_rounds: int = 2
    screen: bool = False
    screen_min_survival: float = 0.2
    screen_explore: float = 0.1

    def __post_init__(self) -> None:
        obj = Objective.parse(self.objective)
        if self.screen and self.allocation != "pilot-commit":
            raise InputError(f"screen works with allocation 'pilot-commit' only; you asked for {self.allocation!r}.")
        check_screen_options(self.screen_min_survival, self.screen_explore)
        if self.allocation != "none":
            self.allocator(self.n_problems, check_only=True)  # raises on bad allocation options
        if self.num_generations < obj.min_generations():
            raise InputError(f"{obj.name} needs num_generations ≥ {obj.min_generations()} (k + 1 rollouts per prompt "
                             f"for the leave-one-out baseline); you passed {self.num_generations}.")
        for name in ("prompts_per_step", "steps", "max_completion_length", "n_problems", "threads", "log_every"):
            if getattr(self, name) < 1:
                raise InputError(f"{name} must be ≥ 1; you passed {getattr(self, name)}.")
        if not self.lr > 0 or not self.temperature > 0:
            raise InputError(f"lr and temperature must be > 0; you passed lr={self.lr}, "
                             f"temperature={self.temperature}.")
        if self.lora_rank < 0:
            raise InputError(f"lora_rank must be ≥ 0 (0 = full fine-tuning); you passed {self.lora_rank}.")
        RaceConvention(a=self.race_a)  # raises on a outside [0, 1]

    def trl_args(self, output_dir: str | Path, *, progress: bool = False) -> Any:
        """TRL ``GRPOConfig`` for this run (no checkpoints, no reporting, constant learning rate)."""
        from trl import GRPOConfig

        return GRPOConfig(
            output_dir=str(output_dir), per_device_train_batch_size=self.prompts_per_step * self.num_generations,
            gradient_accumulation_steps=1, num_generations=self.num_generations, max_steps=self.steps,
            learning_rate=self.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
            max_completion_length=self.max_completion_length, temperature=self.temperature, top_k=0, top_p=1.0,
            scale_rewards="none", loss_type="dr_grpo", beta=0.0, num_iterations=1, seed=self.seed,
            logging_steps=self.log_every, report_to=[], save_strategy="no", disable_tqdm=not progress,
            bf16=False, fp16=False, dataloader_num_workers=0, remove_unused_columns=False, log_completions=False,
            mask_truncated_completions=self.mask_truncated,
            # TRL's default (checkpointing on), said under transformers' name: the old one is deprecated
            activation_checkpointing=True,
            dataloader_pin_memory=False,  # CPU: pinned memory needs an accelerator (torch warns otherwise)
        )

    def problems(self) -> list[Problem]:
        return arith.generate(self.n_problems, GRPO_SEED_OFFSET + self.seed, mix=self.mix)

    def allocator(self, n_prompts: int, prompts: Sequence[str] | None = None, *,
                  check_only: bool = False) -> Allocator | None:
        """The rollout allocator of ``allocation`` over ``n_prompts`` prompts (None for ``"none"``);
        ``prompts``, their texts, are needed by the screen only (``check_only``: validate the options
        without building a screen)."""
        if self.allocation == "none":
            return None
        if self.allocation not in ALLOCATORS:
            raise InputError(f"unknown allocation {self.allocation!r}; use 'none' or one of {', '.join(ALLOCATORS)}.")
        options: dict[str, Any] = {"max_rounds": self.max_rounds}
        if self.allocation == "pilot-commit":
            options.update(p_lo=self.p_lo, p_hi=self.p_hi, staleness=self.staleness,
                           n_pilot=self.n_pilot or None, pool_size=self.pool_size or None)
            if self.screen and not check_only:
                if prompts is None or len(prompts) != n_prompts:
                    raise InputError("the Pilot-Commit screen needs the texts of the training prompts; pass "
                                     "prompts= (one per training prompt).")
                options["screen"] = PromptScreen(prompts, min_survival=self.screen_min_survival,
                                                 explore=self.screen_explore, seed=self.seed)
        elif self.allocation == "uniform":
            options = {}
        return make_allocator(self.allocation, n_prompts, group_size=self.num_generations,
                              prompts_per_step=self.prompts_per_step, seed=self.seed, **options)


@dataclass
class GRPOResult:
    """What :func:`train_grpo` did: where the model is, its FLOP ledger, the log, timing."""

    out_dir: Path
    steps: int
    ledger: FlopLedger
    seconds: float
    log: list[dict[str, Any]] = field(default_factory=list)

    def last(self, key: str) -> float:
        """The last logged value of ``key`` (NaN if never logged)."""
        vals = [e[key] for e in self.log if key in e]
        return float(vals[-1]) if vals else float("nan")


def lora_config(rank: int) -> Any:
    """peft ``LoraConfig`` of rank r on every attention and MLP projection (alpha = 2r, no dropout)."""
    from peft import LoraConfig

    return LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])


def load_base(base: str | Path | None, *, seed: int = 0) -> tuple[Any, Any]:
    """``(model, tokenizer)`` from a model directory, or the random-init tiny model when ``base`` is None."""
    from isocompute.training import tiny

    if base is None:
        return tiny.build_model(seed=seed), tiny.build_tokenizer()
    path = Path(base)
    if not (path / "config.json").is_file():
        raise InputError(f"base model {path} has no config.json; pass a model directory, e.g. the output of "
                         "`isocompute train sft --task arith --out runs/tiny-sft`.")
    model, tokenizer = tiny.load_tiny(path)
    return model.train(), tokenizer


def save_model(model: Any, tokenizer: Any, out: Path) -> None:
    """Save a servable Hugging Face directory; the tiny model keeps its vLLM-portable configs."""
    from isocompute.training import tiny

    if getattr(tokenizer, "chat_template", None) == tiny.CHAT_TEMPLATE:
        tiny.save_tiny(out, model, tokenizer)
    else:
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)


def train_grpo(cfg: AlignedGRPOConfig, out_dir: str | Path, *, base: str | Path | None = None,
               progress: bool = False, trainer_kwargs: Mapping[str, Any] | None = None) -> GRPOResult:
    """Run compute-aligned GRPO per ``cfg`` from ``base`` and write the ``grpo`` artifact to ``out_dir``:
    a servable model directory, ``ledger.json`` (:class:`FlopLedger`) and ``train_log.jsonl``."""
    import torch
    from datasets import Dataset

    from isocompute.artifacts import artifact_writer, sha256_file

    torch.set_num_threads(cfg.threads)
    model, tokenizer = load_base(base, seed=cfg.seed)
    problems = cfg.problems()
    dataset = Dataset.from_list(problem_rows(problems))
    from isocompute.training.grpo_trainer import AlignedGRPOTrainer
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="isocompute-grpo-") as scratch:
        trainer = AlignedGRPOTrainer(model, cfg.trl_args(scratch, progress=progress), dataset, objective=cfg.objective,
                              processing_class=tokenizer, race=RaceConvention(a=cfg.race_a),
                              peft_config=lora_config(cfg.lora_rank) if cfg.lora_rank else None,
                              allocator=cfg.allocator(len(dataset), [p.prompt for p in problems]),
                              **dict(trainer_kwargs or {}))
        trainer.train()
    seconds = time.monotonic() - start
    trained = trainer.accelerator.unwrap_model(trainer.model)
    if hasattr(trained, "merge_and_unload"):
        trained = trained.merge_and_unload()
    trained.eval()
    log = [dict(e) for e in trainer.state.log_history]
    inputs = {}
    if base is not None:
        weights = sorted(Path(base).glob("*.safetensors"))
        inputs = {f"base/{p.name}": sha256_file(p) for p in weights}
    params = {**asdict(cfg), "mix": {str(k): w for k, w in (cfg.mix or arith.DEFAULT_MIX).items()},
              "base": str(base) if base is not None else None, "trl_version": _trl_version(),
              "n_lora": trainer.n_lora}
    with artifact_writer(out_dir, kind=KIND, schema_version=SCHEMA_VERSION, inputs=inputs, params=params) as tmp:
        save_model(trained, tokenizer, tmp)
        trainer.ledger.save(tmp / "ledger.json")
        (tmp / "rollouts.json").write_text(json.dumps(trainer.rollout_ledger.to_dict(), indent=2) + "\n")
        (tmp / "train_log.jsonl").write_text("".join(json.dumps(e) + "\n" for e in log))
    return GRPOResult(out_dir=Path(out_dir), steps=int(trainer.state.global_step), ledger=trainer.ledger,
                      seconds=seconds, log=log)


def _trl_version() -> str:
    import trl

    return str(trl.__version__)
