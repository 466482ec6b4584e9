"""Rollout allocation logic against a simulated Bernoulli per-prompt success model (each prompt i is
solved with probability p[i]; the allocators only see graded groups), plus exact bookkeeping cases."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isocompute.errors import InputError
from isocompute.flops import FlopLedger, ModelFlops, request_flops
from isocompute.training.allocation import (
    DynamicSamplingAllocator,
    Group,
    PilotCommitAllocator,
    PromptStream,
    RolloutLedger,
    UniformAllocator,
    make_allocator,
)


class Bernoulli:
    """rollout(prompts, m): m Bernoulli(p[i]) outcomes per prompt; every call is logged."""

    def __init__(self, p, seed=0, prompt_tokens=10, completion_tokens=5):
        self.p = np.asarray(p, dtype=float)
        self.rng = np.random.default_rng(seed)
        self.calls = []
        self.pt, self.ct = prompt_tokens, completion_tokens

    def __call__(self, prompts, m):
        self.calls.append((list(prompts), m))
        out = []
        for i in prompts:
            c = self.rng.random(m) < self.p[i]
            handles = [("rollout", len(self.calls), i, j) for j in range(m)]
            out.append(Group(i, c, handles, self.pt, [self.ct] * m))
        return out


# ------------------------------------------------------------------ uniform and DAPO


def test_uniform_uses_every_rollout():
    sim, led = Bernoulli(np.full(50, 0.5)), RolloutLedger()
    alloc = UniformAllocator(50, group_size=6, prompts_per_step=4, seed=1)
    for _ in range(5):
        step = alloc.step(sim, led)
        assert [g.size for g in step.groups] == [6] * 4 and step.generated == 24
        assert len({g.prompt for g in step.groups}) == 4
    assert led.total == led.used == 5 * 24 and led.generated["uniform"] == 120


def test_dynamic_sampling_keeps_only_informative_groups_and_pays_for_all():
    p = np.array([0.0, 1.0] * 20 + [0.5] * 10)
    sim, led = Bernoulli(p, seed=2), RolloutLedger()
    alloc = DynamicSamplingAllocator(len(p), group_size=4, prompts_per_step=3, max_rounds=10, seed=2)
    for _ in range(6):
        step = alloc.step(sim, led)
        assert all(g.informative and g.size == 4 for g in step.groups)
        assert len(step.groups) == 3 or step.rounds == 10
        assert step.generated == step.rounds * 3 * 4  # each round samples a full batch
    assert led.total == led.generated["dynamic"] > led.used == 6 * 3 * 4


def test_dynamic_sampling_falls_back_to_its_last_batch_after_max_rounds():
    sim, led = Bernoulli(np.array([0.0, 1.0] * 5)), RolloutLedger()
    step = DynamicSamplingAllocator(10, group_size=3, prompts_per_step=2, max_rounds=3).step(sim, led)
    assert step.fallback and step.rounds == 3 and step.generated == led.total == 3 * 2 * 3
    assert [g.size for g in step.groups] == [3, 3] and not any(g.informative for g in step.groups)
    assert [g.prompt for g in step.groups] == sim.calls[-1][0] and led.used == 6


# ------------------------------------------------------------------ Pilot-Commit


def test_pilot_commit_bookkeeping_worked_example():
    # module docstring: pool 8, n_p = 4, n_c = 4, B_p = 4; prompts 0..2 half right, the rest all right or wrong.
    class Fixed(Bernoulli):
        def __call__(self, prompts, m):
            self.calls.append((list(prompts), m))
            pattern = {0: [1, 0], 1: [0, 1], 2: [1, 1, 0, 0]}
            return [Group(i, np.resize(pattern.get(i, [i % 2]), m), [(len(self.calls), i, j) for j in range(m)],
                          10, [5] * m) for i in prompts]

    sim, led = Fixed(None), RolloutLedger()
    alloc = PilotCommitAllocator(8, n_pilot=4, n_commit=4, pool_size=8, prompts_per_step=4, seed=0)
    step = alloc.step(sim, led)
    assert led.generated["pilot"] == 32 and led.generated["commit"] == 12 and step.generated == 44
    assert sorted(g.prompt for g in step.groups) == [0, 1, 2] and led.used == 24
    assert sorted(step.evicted) == [3, 5, 7] and sorted(step.deferred) == [4, 6]
    for g in step.groups:  # the pilot's 4 rollouts come first, then the 4 committed ones
        assert g.size == 8 and [h[0] for h in g.rollouts] == [1] * 4 + [2] * 4
    assert sim.calls[1] == ([g.prompt for g in step.groups], 4)


def test_pilot_commit_evicts_solved_and_defers_hopeless_with_staleness():
    p = np.array([1.0] * 5 + [0.0] * 5 + [0.5] * 30)
    sim, led = Bernoulli(p, seed=3), RolloutLedger()
    alloc = PilotCommitAllocator(len(p), n_pilot=4, n_commit=2, pool_size=10, prompts_per_step=3, staleness=3,
                                 p_lo=0.2, p_hi=0.2, seed=3)
    piloted_at: dict[int, list[int]] = {}
    for t in range(30):
        n_calls = len(sim.calls)
        step = alloc.step(sim, led)
        for prompts, m in sim.calls[n_calls:]:
            if m == 4:
                for i in prompts:
                    piloted_at.setdefault(i, []).append(t)
        for g in step.groups:
            assert g.size == 6 and 0.2 <= g.correct[:4].mean() <= 0.8  # survivors' pilot accuracy is in the band
    for i in range(5):  # solved: piloted once, then evicted for good
        assert len(piloted_at.get(i, [])) <= 1 and (i in alloc.evicted or i not in piloted_at)
    for i in range(5, 10):  # hopeless: never re-piloted within the staleness window
        times = piloted_at.get(i, [])
        assert all(b - a > 3 for a, b in zip(times, times[1:], strict=False))
        assert len(times) >= 2  # ... but it does come back
    assert led.total == led.generated["pilot"] + led.generated["commit"]


def test_pilot_commit_prefers_informative_survivors_and_pilots_again_when_none_survive():
    class Fixed(Bernoulli):
        def __call__(self, prompts, m):
            self.calls.append((list(prompts), m))
            acc = {0: [1, 1, 1, 0], 1: [1, 1, 0, 0], 2: [1, 0, 0, 0]}
            return [Group(i, acc.get(i, [0, 0, 0, 0])[:m] if m == 4 else [1] * m, [None] * m) for i in prompts]

    alloc = PilotCommitAllocator(3, n_pilot=4, n_commit=1, pool_size=3, prompts_per_step=1, p_lo=0.2, p_hi=0.2)
    step = alloc.step(Fixed(None), RolloutLedger())
    assert [g.prompt for g in step.groups] == [1]  # p̂ = 1/2 beats 1/4 and 3/4

    sim = Bernoulli(np.array([0.0] * 4 + [0.5] * 4))
    alloc = PilotCommitAllocator(8, n_pilot=2, n_commit=2, pool_size=4, prompts_per_step=2, max_rounds=5, seed=7)
    alloc.stream._order = np.arange(8)  # hopeless prompts first
    step = alloc.step(sim, RolloutLedger())
    assert step.rounds >= 2 and sim.calls[0][0] == [0, 1, 2, 3] and set(sim.calls[1][0]) == {4, 5, 6, 7}
    assert not step.fallback


def test_pilot_commit_falls_back_to_committing_when_nothing_survives():
    sim, led = Bernoulli(np.zeros(12)), RolloutLedger()
    alloc = PilotCommitAllocator(12, n_pilot=2, n_commit=3, pool_size=4, prompts_per_step=2, max_rounds=2)
    step = alloc.step(sim, led)
    assert step.fallback and step.rounds == 2 and [g.size for g in step.groups] == [5, 5]
    assert {g.prompt for g in step.groups} <= set(sim.calls[1][0])  # the last round's pilots
    assert led.generated["pilot"] == 2 * 4 * 2 and led.generated["commit"] == 2 * 3
    assert len(step.deferred) == 8  # still deferred: the fallback does not change their bookkeeping


def expected_cost_per_informative_group_uniform(p, n):
    q = np.mean(1 - p**n - (1 - p) ** n)
    return n / q


def test_pilot_commit_spends_fewer_rollouts_per_informative_group_than_uniform():
    # 80 % of prompts are saturated (40 % always right, 40 % never): uniform wastes most groups.
    rng = np.random.default_rng(0)
    p = rng.permutation(np.r_[np.ones(4000), np.zeros(4000), np.full(2000, 0.5)])
    n = 8
    costs = {}
    for name in ("uniform", "dynamic", "pilot-commit"):
        sim, led = Bernoulli(p, seed=1), RolloutLedger()
        alloc = make_allocator(name, len(p), group_size=n, prompts_per_step=8, seed=1, **(
            {"max_rounds": 8} if name == "dynamic" else {"pool_size": 16, "staleness": 1000} if name == "pilot-commit"
            else {}))
        informative = 0
        for _ in range(600):
            informative += sum(g.informative for g in alloc.step(sim, led).groups)
        costs[name] = led.total / informative
    # uniform's exact expectation: n / P(group informative) = 8 / (0.2·(1 − 2·0.5⁸)) ≈ 40.3
    assert costs["uniform"] == pytest.approx(expected_cost_per_informative_group_uniform(p, n), rel=0.1)
    assert costs["pilot-commit"] < costs["uniform"] / 1.3
    assert costs["pilot-commit"] < costs["dynamic"]


# ------------------------------------------------------------------ ledger and stream


def test_rollout_ledger_charges_flops_per_group():
    policy = ModelFlops.from_params(1_000_000, n_layers=2, d_attn=64)
    led = RolloutLedger(policy)
    led.charge([Group(0, [1, 0, 1], [None] * 3, 12, [4, 5, 6]), Group(1, [0], [None], 7, [3])], "pilot")
    want = request_flops(policy, 12, [4, 5, 6], prefix_sharing=False) + request_flops(policy, 7, [3],
                                                                                        prefix_sharing=False)
    assert led.flops.analytic.rollout == pytest.approx(want)
    assert led.flops.samples == led.total == 4 and led.flops.requests == 2
    d = led.to_dict()
    assert d["generated"]["pilot"] == 4 and d["total"] == 4
    assert FlopLedger.from_dict(d["flops"]).analytic.rollout == pytest.approx(want)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 30), count=st.integers(1, 40), seed=st.integers(0, 9))
def test_prompt_stream_takes_distinct_eligible_prompts(n, count, seed):
    s = PromptStream(n, seed)
    got = s.take(count, lambda i: i % 3 != 0)
    assert len(set(got)) == len(got) and all(i % 3 != 0 for i in got)
    assert len(got) == min(count, sum(i % 3 != 0 for i in range(n)))
    firsts = [PromptStream(n, seed).take(n) for _ in range(2)]
    assert firsts[0] == firsts[1] and sorted(firsts[0]) == list(range(n))  # seeded permutation


def test_group_join():
    g = Group(3, [1, 0], ["a", "b"], 5, [1, 2]).extend(Group(3, [1], ["c"], 5, [3]))
    assert g.correct.tolist() == [True, False, True] and g.rollouts == ["a", "b", "c"]
    assert g.completion_tokens == [1, 2, 3] and g.informative and math.isclose(g.accuracy, 2 / 3)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: make_allocator("greedy", 5, group_size=4, prompts_per_step=2), "unknown allocator"),
        (lambda: make_allocator("pilot-commit", 5, group_size=4, prompts_per_step=2, n_pilot=5), "n_pilot must"),
        (lambda: UniformAllocator(5, group_size=0, prompts_per_step=2), "group_size must be ≥ 1"),
        (lambda: PilotCommitAllocator(5, n_pilot=2, n_commit=2, pool_size=4, prompts_per_step=2, p_lo=0.6,
                                      p_hi=0.6), "p_lo ≤ 1 − p_hi"),
        (lambda: PilotCommitAllocator(5, n_pilot=2, n_commit=-1, pool_size=4, prompts_per_step=2), "n_commit"),
        (lambda: PromptStream(0), "prompt pool is empty"),
        (lambda: RolloutLedger().charge([Group(0, [1])], "refill"), "unknown rollout phase"),
        (lambda: Group(0, [1]).extend(Group(1, [0])), "cannot join"),
    ],
)
def test_errors(make, match):
    with pytest.raises(InputError, match=match):
        make()
