"""Online budget control: a hand-worked case, invariants, agreement with bisection, and the drift test.

The drift test simulates a Lagrangian policy on arith-like traffic: each question has a per-sample
accuracy ``p`` (easy levels high, hard levels low), actions are k ∈ {1, 2, 4, 8, 16} samples with
majority-vote utility ``U(p, k) = P(Bin(k, p) > k/2) + ½·P(Bin(k, p) = k/2)`` and cost k, and the policy
maps a budget to λ through a calibration table fitted on *mixed* training traffic, exactly as the real
policy does. Live traffic then shifts from easy to hard.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import binom

from isocompute.app.accounting.budget_control import BudgetController, ControllerBank

KS = np.array([1, 2, 4, 8, 16])


def utility(p: np.ndarray) -> np.ndarray:
    """U[i, a]: majority-vote accuracy of k = KS[a] samples at per-sample accuracy p[i]."""
    p = np.asarray(p, dtype=float)[:, None]
    return binom.sf(KS // 2, KS, p) + 0.5 * np.where(KS % 2 == 0, binom.pmf(KS // 2, KS, p), 0.0)


def calibrate(u_train: np.ndarray, budget: float) -> float:
    """λ whose oracle mean cost on training utilities is ``budget`` (bisection; cost falls as λ rises)."""
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        if KS[np.argmax(u_train - mid * KS, axis=1)].mean() > budget:
            lo = mid
        else:
            hi = mid
    return hi


class SimPolicy:
    """Budget → λ from a calibration table on training traffic; then the per-prompt oracle rule.

    ``decide`` takes the question's utility row (precomputed, so the loop stays fast).
    """

    def __init__(self, p_train: np.ndarray, grid: np.ndarray):
        self.grid = grid
        u_train = utility(p_train)
        self.lams = np.array([calibrate(u_train, b) for b in grid])

    def decide(self, u_row: np.ndarray, budget: float) -> int:
        lam = float(np.interp(budget, self.grid, self.lams))
        return int(KS[np.argmax(u_row - lam * KS)])


def arith_traffic(rng: np.random.Generator, levels: list[int], n: int) -> np.ndarray:
    """Per-sample accuracy of arith-like questions: level 1 (easy) … 5 (hard)."""
    centre = {1: 0.95, 2: 0.85, 3: 0.7, 4: 0.58, 5: 0.45}
    lv = rng.choice(levels, size=n)
    return np.clip(np.array([centre[v] for v in lv]) + rng.uniform(-0.07, 0.07, size=n), 0.01, 0.99)


def test_hand_worked_steps():
    ctl = BudgetController(4.0, lo=1.0, hi=16.0, gain=0.1, max_step=0.5)  # step bound s·B = 2
    # cost 8: e = (4 − 8)/4 = −1 → I = 4 + 0.1·4·(−1) = 3.6; b follows: 3.6
    assert ctl.observe(8) == pytest.approx(3.6)
    # cost 2: e = +0.5 → I = 3.8 = b
    assert ctl.observe(2) == pytest.approx(3.8)
    assert ctl.state().saturated is False
    # cost 100 (outlier): e = −24 → I = 3.8 − 9.6 → projected to lo = 1; b moves by at most 2 → 1.8
    assert ctl.observe(100) == pytest.approx(1.8)
    assert ctl.integral == pytest.approx(1.0) and ctl.state().saturated is True
    # cost 4: e = 0 → I stays 1; b catches up: 1.0
    assert ctl.observe(4) == pytest.approx(1.0)
    s = ctl.state()
    assert (s.requests, s.mean_cost) == (4, pytest.approx(114 / 4))


@settings(max_examples=200, deadline=None)
@given(
    target=st.floats(0.5, 50),
    gain=st.floats(0.001, 0.5),
    max_step=st.floats(0.01, 10),
    costs=st.lists(st.floats(0, 100), min_size=1, max_size=200),
)
def test_invariants(target, gain, max_step, costs):
    # Invariant 1: the internal budget never leaves [lo, hi] and moves at most s·B per request.
    lo, hi = target / 4, target * 4
    ctl = BudgetController(target, lo=lo, hi=hi, gain=gain, max_step=max_step)
    prev = ctl.internal
    for c in costs:
        b = ctl.observe(c)
        assert lo - 1e-12 <= b <= hi + 1e-12
        assert abs(b - prev) <= max_step * target * (1 + 1e-12)
        prev = b
    # Invariant 2: while unsaturated, Σ e_t = (I_T − I_0) / (η·B) exactly, whatever the step bound.
    free = BudgetController(target, lo=-math.inf, hi=math.inf, gain=gain, max_step=max_step)
    for c in costs:
        free.observe(c)
    sum_err = sum((target - c) / target for c in costs)
    assert sum_err == pytest.approx((free.integral - target) / (gain * target), rel=1e-9, abs=1e-6)


def test_converges_to_bisection_budget_on_stationary_traffic():
    """On stationary hard traffic the controller settles where bisection says the budget must be."""
    rng = np.random.default_rng(0)
    grid = np.linspace(1, 16, 61)
    policy = SimPolicy(arith_traffic(rng, [1, 2, 3, 4, 5], 4000), grid)
    hard = utility(arith_traffic(rng, [3, 4, 5], 6000))
    # Independent answer: the internal budget whose mean cost on this traffic is 4 (bisection on b).
    lo, hi = 1.0, 16.0
    for _ in range(30):
        mid = (lo + hi) / 2
        cost = np.mean([policy.decide(u, mid) for u in hard[:2000]])
        lo, hi = (mid, hi) if cost < 4 else (lo, mid)
    ctl = BudgetController(4.0, lo=1.0, hi=16.0, gain=0.05)
    tail = []
    for i, u in enumerate(hard):
        ctl.observe(policy.decide(u, ctl.internal))
        if i >= 3000:
            tail.append(ctl.internal)
    assert ctl.internal != 4.0
    assert np.mean(tail) == pytest.approx((lo + hi) / 2, abs=0.5)


def test_drift_easy_to_hard_stays_on_budget_where_fixed_lambda_drifts():
    rng = np.random.default_rng(1)
    budget = 4.0
    grid = np.linspace(1, 16, 61)
    policy = SimPolicy(arith_traffic(rng, [1, 2, 3, 4, 5], 4000), grid)
    traffic = utility(np.concatenate([arith_traffic(rng, [1, 2], 1000), arith_traffic(rng, [3, 4], 1000)]))

    fixed = np.mean([policy.decide(u, budget) for u in traffic])
    ctl = BudgetController(budget, lo=grid[0], hi=grid[-1], gain=0.05)
    spent = []
    for u in traffic:
        k = policy.decide(u, ctl.internal)
        spent.append(k)
        ctl.observe(k)
    controlled = float(np.mean(spent))
    print(f"\nbudget {budget}: controlled mean {controlled:.3f} samples/request "
          f"({controlled / budget - 1:+.2%}); fixed λ {fixed:.3f} ({fixed / budget - 1:+.2%})")
    assert abs(controlled / budget - 1) <= 0.03
    assert abs(fixed / budget - 1) >= 0.10
    # Each half is on budget too once the transient is spent (not just the two halves cancelling).
    assert abs(np.mean(spent[1200:]) / budget - 1) <= 0.05


def test_bank_is_lru_bounded_and_reports_evictions():
    evicted = []
    bank = ControllerBank(max_keys=2, on_evict=evicted.append)

    def make(t):
        return lambda: BudgetController(t, lo=1, hi=16)

    a = bank.get(("k", 4.0), make(4.0))
    bank.get(("k", 8.0), make(8.0))
    assert bank.get(("k", 4.0), make(4.0)) is a  # a becomes most recent
    bank.get(("k", 2.0), make(2.0))
    assert evicted == [("k", 8.0)] and len(bank) == 2
    bank.drop(("k", 2.0))  # dropped by its owner: no eviction callback
    bank.drop(("k", 99.0))  # not kept: nothing happens
    assert len(bank) == 1 and evicted == [("k", 8.0)] and not bank.holds(("k", 2.0), a)
    bank.clear()
    assert len(bank) == 0 and set(evicted) == {("k", 8.0), ("k", 4.0)}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"target": -1.0}, "positive finite"),
        ({"target": math.nan}, "positive finite"),
        ({"target": 4.0, "lo": 5.0, "hi": 1.0}, "lo <= hi"),
        ({"target": 4.0, "gain": 0.0}, "gain and max_step must be positive"),
        ({"target": 4.0, "initial": 0.0}, "initial internal budget"),
    ],
)
def test_bad_parameters(kwargs, match):
    args = {"lo": 1.0, "hi": 16.0, **kwargs}
    target = args.pop("target")
    with pytest.raises(ValueError, match=match):
        BudgetController(target, **args)


def test_bad_cost():
    with pytest.raises(ValueError, match="finite non-negative"):
        BudgetController(4.0, lo=1, hi=16).observe(math.nan)


def test_foreign_unit_budget_converges_from_a_wrong_conversion():
    """A FLOP budget: the controller measures error in FLOPs but moves an internal budget in samples.

    Each sample costs 1,000 FLOPs, so B = 4,000 FLOPs needs a mean of 4 samples; the gateway's first
    conversion guessed 2 samples (S = 2). The policy here spends exactly round(b) samples.
    """
    ctl = BudgetController(4000.0, lo=1, hi=16, gain=0.05, initial=2.0)
    spent = []
    for _ in range(2000):
        k = round(ctl.internal)
        spent.append(1000.0 * k)
        ctl.observe(1000.0 * k)
    assert np.mean(spent) == pytest.approx(4000, rel=0.03)
    assert np.mean(spent[500:]) == pytest.approx(4000, rel=0.01)
