"""The Pilot-Commit screen (training/screen.py) against the simulated Bernoulli prompts of
test_allocation: it learns from pilots which prompt texts never survive and stops piloting them."""

import numpy as np
import pytest

from isocompute.errors import InputError
from isocompute.training.allocation import PilotCommitAllocator, RolloutLedger
from isocompute.training.grpo import AlignedGRPOConfig
from isocompute.training.screen import PromptScreen
from tests.test_allocation import Bernoulli


def _pool(n_each=1000, seed=0):
    """One-digit sums solved half the time, three-digit products never: told apart by their text."""
    rng = np.random.default_rng(seed)
    easy = [f"What is {a} + {b}?" for a, b in rng.integers(0, 10, (n_each, 2))]
    hard = [f"What is {a} * {b} - {c}?" for a, b, c in rng.integers(100, 1000, (n_each, 3))]
    order = rng.permutation(2 * n_each)
    texts = np.array(easy + hard, dtype=object)[order].tolist()
    p = np.r_[np.full(n_each, 0.5), np.zeros(n_each)][order]
    return texts, p


def _run(texts, p, screen, steps=60):
    sim, led = Bernoulli(p, seed=3), RolloutLedger()
    alloc = PilotCommitAllocator(len(p), n_pilot=3, n_commit=5, pool_size=16, prompts_per_step=8, seed=3,
                                 screen=screen)
    skipped = informative = 0
    late_hard = late = 0
    for t in range(steps):
        step = alloc.step(sim, led)
        skipped += step.skipped
        informative += sum(g.informative for g in step.groups)
        if t >= steps // 2:  # which prompts the pilots went to, once the screen has learned
            piloted = [i for prompts, m in sim.calls[-(step.rounds + 1):] if m == 3 for i in prompts]
            late += len(piloted)
            late_hard += int(np.sum(p[piloted] == 0))
    return led, informative, skipped, late_hard / max(late, 1)


def test_the_screen_stops_piloting_prompts_like_the_hopeless_ones():
    texts, p = _pool()
    screen = PromptScreen(texts, min_survival=0.2, explore=0.1, seed=0)
    led_s, inf_s, skipped, hard_share_s = _run(texts, p, screen)
    led_0, inf_0, _, hard_share_0 = _run(texts, p, None)
    assert screen.fits > 0 and skipped > 0
    # unscreened, half the pilots go to hopeless prompts; screened, little more than the explore share
    assert hard_share_0 == pytest.approx(0.5, abs=0.1)
    assert hard_share_s < 0.2
    # so each informative group costs fewer rollouts, pilots included
    assert led_s.total / inf_s < 0.8 * led_0.total / inf_0
    # it learned the texts: hopeless prompts score low, the others high
    assert screen.survival_[p == 0].mean() < 0.2 < 0.6 < screen.survival_[p > 0].mean()


def test_unfitted_screen_admits_everything_and_refits_only_with_both_kinds():
    texts, p = _pool(20)
    screen = PromptScreen(texts, refit_every=1, min_labels=4)
    assert all(screen.admits(i) for i in range(len(texts))) and screen.skipped == 0
    screen.observe([0, 1, 2, 3], [False] * 4)  # one kind only: nothing to learn
    assert screen.survival_ is None and screen.fits == 0
    screen.observe([4, 5], [True, True])
    assert screen.fits == 1 and screen.survival_.shape == (len(texts),)


def test_explore_one_admits_everything_and_explore_zero_trusts_the_model():
    texts, p = _pool(50)
    for explore, admitted in ((1.0, True), (0.0, False)):
        screen = PromptScreen(texts, explore=explore, min_survival=1.0)
        screen.survival_ = np.zeros(len(texts))  # as if fitted: nothing survives
        assert all(screen.admits(i) == admitted for i in range(len(texts)))


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: PromptScreen([]), "needs the prompt pool"),
        (lambda: PromptScreen(["1 + 1"], min_survival=1.5), "must be in \\[0, 1\\]"),
        (lambda: PromptScreen(["1 + 1"], refit_every=0), "refit_every must be ≥ 1"),
        (lambda: PromptScreen(["1 + 1"]).observe([0, 1], [True]), "one verdict per prompt"),
        (lambda: PilotCommitAllocator(3, n_pilot=2, n_commit=2, pool_size=2, prompts_per_step=1,
                                      screen=PromptScreen(["1 + 1"] * 2)), "holds 2 prompts but the pool has 3"),
        (lambda: AlignedGRPOConfig(objective="mean", allocation="uniform", screen=True), "pilot-commit' only"),
        (lambda: AlignedGRPOConfig(objective="mean", allocation="pilot-commit", screen=True, screen_explore=2.0),
         "must be in \\[0, 1\\]"),
        (lambda: AlignedGRPOConfig(objective="mean", allocation="pilot-commit", screen=True, n_problems=4
                                   ).allocator(4), "needs the texts of the training prompts"),
    ],
)
def test_errors(make, match):
    with pytest.raises(InputError, match=match):
        make()
