"""The TRL hook contract: the pinned version and the signatures of the GRPOTrainer methods we override."""

import inspect
import re
from pathlib import Path

import pytest

from isocompute.errors import IsoComputeError
from isocompute.training.grpo import TRL_HOOKS, TRL_VERSION, check_trl_contract

trl = pytest.importorskip("trl")


def test_installed_trl_is_the_pinned_one():
    assert trl.__version__ == TRL_VERSION
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert re.search(rf'"trl=={re.escape(TRL_VERSION)}"', pyproject), "pyproject must pin trl exactly"


@pytest.mark.parametrize("name", sorted(TRL_HOOKS))
def test_hook_signatures(name):
    from trl import GRPOTrainer

    fn = getattr(GRPOTrainer, name)
    assert tuple(inspect.signature(fn).parameters) == TRL_HOOKS[name]


def test_rewards_arrive_gathered_and_group_contiguous():
    """The override relies on `_calculate_rewards` returning the gathered (B·G, funcs) matrix that
    `_generate_and_score_completions` then views as (-1, num_generations)."""
    from trl import GRPOTrainer

    calc = inspect.getsource(GRPOTrainer._calculate_rewards)
    assert "rewards_per_func = gather(rewards_per_func)" in calc
    assert "return rewards_per_func" in calc
    score = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    assert "rewards_per_func = self._calculate_rewards(inputs, prompts, completions, completion_ids_list)" in score
    assert "rewards.view(-1, num_generations)" in score
    assert "prompt_ids_list," in score and ") = self._generate(prompts)" in score


def test_contract_check_fails_loudly_on_a_moved_hook():
    from trl import GRPOTrainer

    class Moved(GRPOTrainer):
        def _calculate_rewards(self, inputs, prompts, completions):  # a reshaped hook
            return None

    check_trl_contract(GRPOTrainer)
    with pytest.raises(IsoComputeError, match=r"pip install trl==1\.16\.0"):
        check_trl_contract(Moved)
    with pytest.raises(IsoComputeError, match="has parameters None"):
        check_trl_contract(type("Bare", (), {}))


def test_building_the_trainer_checks_the_contract(monkeypatch):
    """The subclass is an ordinary module-level class now; the check runs when a trainer is built."""
    from trl import GRPOTrainer

    from isocompute.training.grpo_trainer import AlignedGRPOTrainer

    assert issubclass(AlignedGRPOTrainer, GRPOTrainer) and AlignedGRPOTrainer.__module__.endswith("grpo_trainer")
    monkeypatch.setattr(GRPOTrainer, "_generate", lambda self, prompts, images: None)  # a reshaped hook
    with pytest.raises(IsoComputeError, match=r"GRPOTrainer._generate has parameters .*grpo_trainer.py"):
        AlignedGRPOTrainer(None, None, None, objective="mean")
