"""One real tiny GRPO run per allocator: the trainer updates on the allocator's groups (pilot rollouts reused
by Pilot-Commit), and every generated rollout, pilot and discarded ones included, reaches the ledgers."""

import numpy as np
import pytest

from isocompute.training import grpo

pytest.importorskip("trl")


def digit_only(tokenizer) -> dict:
    """Digit-only sampling: 1-token completions of single-digit golds are right ~1 time in 10 even for a
    random-init model, so pilots find prompts with a learning signal (as in tests/test_grpo.py)."""
    return {"suppress_tokens": sorted(i for t, i in tokenizer.get_vocab().items() if t not in set("0123456789"))}


@pytest.mark.slow
@pytest.mark.parametrize("allocation", ["pilot-commit", "dynamic", "pilot-commit+screen"])
def test_tiny_run_with_allocator(tmp_path, allocation):
    from datasets import Dataset

    from isocompute.training.grpo_trainer import AlignedGRPOTrainer

    class Recording(AlignedGRPOTrainer):
        batches: list = []

        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            self.batches.append(out["advantages"].clone().numpy())
            return out

    cfg = grpo.AlignedGRPOConfig(objective="mean", num_generations=4, prompts_per_step=3, steps=2, lr=1e-2,
                                 max_completion_length=1, n_problems=40, mix={1: 1.0}, mask_truncated=False,
                                 allocation=allocation.removesuffix("+screen"), screen=allocation.endswith("+screen"),
                                 n_pilot=2, pool_size=6, max_rounds=3)
    model, tok = grpo.load_base(None)
    args = cfg.trl_args(tmp_path)
    args.generation_kwargs = digit_only(tok)
    problems = cfg.problems()
    dataset = Dataset.from_list(grpo.problem_rows(problems))
    trainer = Recording(model, args, dataset, objective=cfg.objective, processing_class=tok,
                        allocator=cfg.allocator(len(dataset), [p.prompt for p in problems]))
    trainer.train()

    rl = trainer.rollout_ledger
    assert rl.steps >= 2 and len(Recording.batches) == 2
    used = sum(b.size for b in Recording.batches)
    assert rl.used == used and all(b.size % 4 == 0 and 0 < b.size <= 12 for b in Recording.batches)
    assert trainer.ledger.samples == rl.total > rl.used  # pilots / dropped groups are paid for
    if allocation.startswith("pilot-commit"):
        assert rl.generated["pilot"] >= 2 * 6 and rl.generated["commit"] == used // 2
    else:
        assert rl.generated["dynamic"] == rl.total
        # GRPO advantages vanish exactly on all-same groups: DAPO kept only informative ones
        assert all(np.abs(b.reshape(-1, 4)).max(axis=1).min() > 0 for b in Recording.batches)
    logged = [e for e in trainer.state.log_history if "alloc/generated" in e]
    assert logged and all(e["rollouts"] >= e["rollouts/used"] for e in logged)
    if allocation.endswith("+screen"):  # the screen saw every pilot (it needs 32 labels before it judges)
        assert trainer.allocator.screen.n_labels == rl.generated["pilot"] // 2
        assert all("alloc/skipped" in e for e in logged)
