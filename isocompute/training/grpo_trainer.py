"""The TRL ``GRPOTrainer`` subclass of compute-aligned GRPO (see :mod:`isocompute.training.grpo` for the
maths, the reward columns and the FLOP ledger).

This module imports TRL, torch and accelerate; :mod:`isocompute.training.grpo` (config, rewards, run
function) does not, and imports this module only where a trainer is built, so ``isocompute --help`` and
the config checks stay fast. The TRL methods overridden here are pinned in
:data:`isocompute.training.grpo.TRL_HOOKS` and checked whenever a trainer is built.

Ignores: multi-turn tool use, multimodal prompts, more than one process with an allocator.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from accelerate.utils import gather_object
from trl import GRPOTrainer

from isocompute.errors import IsoComputeError
from isocompute.flops import FlopLedger, ModelFlops, RaceConvention
from isocompute.tasks.answers.extract import extract_answer, normalize_answer
from isocompute.training.allocation import AllocationStep, Allocator, Group, RolloutLedger
from isocompute.training.grpo_rewards import (
    TRL_VERSION,
    aligned,
    check_trainer_args,
    check_trl_contract,
    completion_text,
    correct,
    step_check_score,
)
from isocompute.training.rewards import Objective, answer_codes, group_advantages, group_metrics

__all__ = ["AlignedGRPOTrainer"]

_GENERATE_ARITY = 8  # prompt_ids, completion_ids, tool_mask, completions, logprobs, extra, images, tool_images


class AlignedGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` with compute-aligned advantages and a FLOP ledger (see :mod:`isocompute.training.grpo`).

    ``objective``: an :class:`Objective` or its spelling (``"maj@8"``). ``verifier``: a TRL reward
    function giving bon@k its scores (default :func:`step_check_score`). ``race``: the RACE constants
    of the ledger. The other arguments are ``GRPOTrainer``'s; ``reward_funcs`` is built here, and
    ``args.reward_weights`` is set to weight only the aligned column.
    """

    def __init__(self, model: Any, args: Any, train_dataset: Any, *, objective: Objective | str,
                 processing_class: Any = None, verifier: Callable[..., list[float]] | None = None,
                 peft_config: Any = None, race: RaceConvention | None = None,
                 allocator: Allocator | None = None, **kwargs: Any) -> None:
        check_trl_contract(GRPOTrainer)  # an upgrade that renamed a hook fails here, loudly
        self.objective = Objective.parse(objective) if isinstance(objective, str) else objective
        self.allocator = allocator
        self._pending: list[Any] | None = None
        funcs: list[Any] = [correct]
        if self.objective.needs_scores:
            funcs.append(verifier or step_check_score)
        funcs.append(aligned)
        check_trainer_args(args, self.objective, allocator)
        args.reward_weights = [0.0] * (len(funcs) - 1) + [1.0]
        super().__init__(model=model, reward_funcs=funcs, args=args, train_dataset=train_dataset,
                         processing_class=processing_class, peft_config=peft_config, **kwargs)
        base = self.accelerator.unwrap_model(self.model)
        config = base.get_base_model().config if hasattr(base, "get_base_model") else base.config
        self.policy_flops = ModelFlops.from_config(config)
        trainable = sum(p.numel() for p in base.parameters() if p.requires_grad)
        self.n_lora: int | None = trainable if hasattr(base, "peft_config") else None
        self.ledger = FlopLedger(convention=race or RaceConvention())
        self.rollout_ledger = RolloutLedger(self.policy_flops, self.ledger, prefix_sharing=bool(self.use_vllm))
        if args.disable_tqdm:  # no progress bar means quiet: the log lands in state.log_history anyway
            from transformers.trainer_callback import PrinterCallback

            self.remove_callback(PrinterCallback)
        if args.beta != 0.0 or args.num_iterations != 1:
            warnings.warn("the FLOP ledger does not charge the extra no-grad forward passes of beta > 0 or "
                          "num_iterations > 1; keep beta=0 and num_iterations=1 for an exact ledger.",
                          stacklevel=2)

    # -- rollouts -----------------------------------------------------------------------------
    def _generate(self, prompts: list) -> tuple:
        if self._pending is not None:  # rollouts the allocator already generated (pilot + commit)
            ids, completion_ids, completions = (list(x) for x in zip(*self._pending, strict=True))
            return ids, completion_ids, None, completions, None, {}, None, []
        out = super()._generate(prompts)
        if len(out) != _GENERATE_ARITY:
            raise IsoComputeError(f"TRL's _generate returned {len(out)} values, not {_GENERATE_ARITY}; "
                                  f"install trl=={TRL_VERSION}.")
        if self.model.training:
            self._charge_rollouts(out[0], out[1])
        return out

    def _charge_rollouts(self, prompt_ids: Sequence[Sequence[int]],
                         completion_ids: Sequence[Sequence[int]]) -> None:
        """One request per group: a run of at most n identical consecutive prompts (two groups of the
        same prompt text may follow each other)."""
        start, n = 0, self.num_generations
        self.rollout_ledger.steps += 1
        for j in range(1, len(prompt_ids) + 1):
            if j == len(prompt_ids) or j - start == n or list(prompt_ids[j]) != list(prompt_ids[start]):
                self.rollout_ledger.charge_request(len(prompt_ids[start]),
                                                   [len(c) for c in completion_ids[start:j]], "uniform")
                self.rollout_ledger.used += j - start
                start = j

    # -- allocation ---------------------------------------------------------------------------
    def _generate_and_score_completions(self, inputs):
        if self.allocator is None or not self.model.training:
            return super()._generate_and_score_completions(inputs)
        step = self._allocate()
        rows = [dict(self.train_dataset[g.prompt]) for g in step.groups for _ in range(g.size)]
        self._pending = [r for g in step.groups for r in g.rollouts]
        try:
            return super()._generate_and_score_completions(rows)
        finally:
            self._pending = None

    def _allocate(self, tries: int = 3) -> AllocationStep:
        for _ in range(tries):
            step = self.allocator.step(self._rollout, self.rollout_ledger)
            m = self._metrics["train"]
            m["alloc/generated"].append(float(step.generated))
            m["alloc/groups"].append(float(len(step.groups)))
            m["alloc/evicted"].append(float(len(step.evicted)))
            m["alloc/deferred"].append(float(len(step.deferred)))
            m["alloc/fallback"].append(float(step.fallback))
            m["alloc/skipped"].append(float(step.skipped))
            if step.groups:
                return step
        raise IsoComputeError(
            f"the {type(self.allocator).__name__} found no prompt to train on in {tries} tries: every prompt "
            "is evicted or deferred. Use more training problems (n_problems), a shorter staleness, or a mix "
            "of difficulties the model partly solves.")

    def _rollout(self, prompt_indices: Sequence[int], m: int) -> list[Group]:
        """Generate and grade ``m`` rollouts of each prompt (the allocators' ``rollout`` callback)."""
        rows = [self.train_dataset[i] for i in prompt_indices]
        flat = [r for r in rows for _ in range(m)]
        out = super()._generate([r["prompt"] for r in flat])
        prompt_ids, completion_ids, completions = out[0], out[1], out[3]
        ok = correct([], completions, gold=[r["gold"] for r in flat], task=[r["task"] for r in flat])
        groups = []
        for a, i in enumerate(prompt_indices):
            sl = slice(a * m, (a + 1) * m)
            groups.append(Group(int(i), np.asarray(ok[sl]) > 0.5,
                                list(zip(prompt_ids[sl], completion_ids[sl], completions[sl], strict=True)),
                                len(prompt_ids[a * m]), [len(c) for c in completion_ids[sl]]))
        return groups

    # -- rewards ------------------------------------------------------------------------------
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        mode = "train" if self.model.training else "eval"
        G = self.num_generations if mode == "train" else self.num_generations_eval
        texts = gather_object([completion_text(c) for c in completions])
        answers = [extract_answer(t) for t in texts]
        answers = [normalize_answer(a) if a is not None else None for a in answers]
        ok = (rewards[:, 0].detach().cpu().numpy() > 0.5).reshape(-1, G)
        codes = answer_codes(np.asarray(answers, dtype=object).reshape(-1, G).tolist())
        metrics = group_metrics(ok, codes, self.objective.k)
        m = self._metrics[mode]
        m["objective/correct"].append(metrics.correct)
        m[f"objective/pass@{metrics.k}"].append(metrics.pass_at_k)
        m[f"objective/maj@{metrics.k}"].append(metrics.maj_at_k)
        if G < self.objective.min_generations():  # evaluation with few samples: nothing to train
            rewards[:, -1] = 0.0
            return rewards
        scores = rewards[:, 1].detach().cpu().numpy().reshape(-1, G) if self.objective.needs_scores else None
        adv = group_advantages(self.objective, ok, codes=codes, scores=scores)
        m["objective/advantage_abs"].append(float(np.abs(adv).mean()))
        m["objective/zero_groups"].append(float((np.abs(adv).max(axis=1) < 1e-12).mean()))
        rewards[:, -1] = torch.as_tensor(adv.ravel(), dtype=rewards.dtype, device=rewards.device)
        return rewards

    # -- updates ------------------------------------------------------------------------------
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if model.training:
            lengths = (inputs["prompt_mask"].sum(1) + inputs["completion_mask"].sum(1)).tolist()
            self.ledger.add_update(self.policy_flops, lengths, n_lora=self.n_lora)
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def log(self, logs, start_time=None):
        if self.ledger.samples:
            logs = {**logs, "rollouts": float(self.ledger.samples), "rollouts/used": float(self.rollout_ledger.used),
                    "flops/total": self.ledger.analytic.total,
                    "flops/rollout": self.ledger.analytic.rollout, "flops/update": self.ledger.analytic.update,
                    "flops/rho": self.ledger.rho, "flops/race_rho": self.ledger.race_rho}
        return super().log(logs, start_time)
