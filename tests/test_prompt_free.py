"""A table whose prompts carry no text (dumps that ship only answers) keeps its budget: every rule of the
never-worse chain mixes two plans by a hash of the prompt, and identical texts used to draw one u for all,
so a mix served everyone the dearer plan (issue: gpt-oss-20b without prompt text spent 15.5 samples at a
budget of 8). Now the j-th repeat of a text within a call hashes with j, and realised costs match."""

from __future__ import annotations

import numpy as np
import pytest

from isocompute.policy.fallback import FIXED_PLAN, UNIFORM
from isocompute.policy.learn.learners import prompt_uniforms
from isocompute.policy.plans.arrays import table_arrays
from isocompute.policy.policy import Policy, PolicyConfig
from isocompute.policy.synthetic import synthetic_records
from isocompute.solver.outcomes import from_records

ACTIONS = (1, 2, 4, 8, 16)


def prompt_free(n: int, seed: int) -> object:
    records = synthetic_records(n, 16, seed=seed, noise=0.4)
    for r in records:
        r["prompt"] = ""
    return from_records(records)


def test_repeated_texts_draw_distinct_uniforms_and_distinct_texts_keep_theirs():
    u = prompt_uniforms([""] * 4000)
    assert len(np.unique(u)) == 4000 and abs(u.mean() - 0.5) < 0.02 and abs((u < 0.25).mean() - 0.25) < 0.02
    texts = [f"prompt {i}" for i in range(50)]
    np.testing.assert_array_equal(prompt_uniforms(texts + texts)[:50], prompt_uniforms(texts))
    assert prompt_uniforms(["a", "b", "a"])[2] != prompt_uniforms(["a"])[0]


@pytest.fixture(scope="module")
def fitted():
    table = prompt_free(600, seed=3)
    config = PolicyConfig(actions=ACTIONS, budget_range=(1.0, 16.0), n_rounds=20, calibration_folds=3,
                          n_components=4, plans=("none@1", "none@2", "none@4", "none@8", "none@16",
                                                 "lead:m=2@1x8", "lead:m=3@1x16"))
    return Policy(config).fit(table), prompt_free(600, seed=4)


@pytest.mark.parametrize("budget", [2.0, 4.0, 8.0, 12.0])
def test_a_prompt_free_table_spends_its_budget(fitted, budget):
    """Held out (a second prompt-free table from the same world): the policy as served, whichever rule of
    its chain serves there, spends within ±5% of the budget; uniform and the fixed plan each do too."""
    policy, held = fitted
    arrays = table_arrays(held, policy.config)
    d = policy.decide(held.prompts, budget)
    realised = arrays.cost[np.arange(len(held)), d.action_index].mean()
    assert realised == pytest.approx(budget, rel=0.05), (d.rule, realised)
    u, _ = policy.prompt_keys(held.prompts)
    for rule in (FIXED_PLAN, UNIFORM):
        a = policy.fallback_actions(rule, u, budget)
        assert arrays.cost[np.arange(len(held)), a].mean() == pytest.approx(budget, rel=0.05), rule


@pytest.mark.parametrize("text", ["", "the same prompt"])
def test_identical_prompts_fit_no_svd_directions_and_raise_no_warning(text):
    """Identical texts leave nothing for the SVD to find: it used to warn (0/0 explained variance)."""
    import warnings

    from isocompute.policy.features.prompt import PromptFeatures

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pf = PromptFeatures(n_components=8).fit([text] * 50)
    assert pf.n_components_ == 0
    assert PromptFeatures(n_components=8).fit([text] * 49 + ["another"]).n_components_ >= 1
