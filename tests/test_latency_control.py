"""Online latency control (the μ controller beside the λ one): realised latency from waves' tokens, a
hand-worked case, drift on a small real fitted policy, clipping at its latency range, and the gateway's
wiring (the response's ``internal_latency_budget`` and ``latency``, the gauge, independent keys, nothing
changed without a latency budget).

The drift tests mirror tests/test_budget_control.py's: the policy is :func:`app_fakes.fit_tokens_policy`
(tokens unit, latency budgets 1–2 sample lengths), live prompts are synthetic arithmetic, and each
prompt's realised latency is the policy's expected latency of the plan it chose times a drift factor
(samples shorter, then longer, than the training table's) and a lognormal noise — traffic whose latency
is systematically below, then above, what the policy expects. Tolerances are the cost controller's: the
mean within 3 % of the budget, the tail after the transient within 5 %, and a fixed ν off by ≥ 10 %.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from app_fakes import completion, make_client

from isocompute.app.accounting.budget_control import BudgetController
from isocompute.app.accounting.latency_control import LatencyController, realised_latency
from isocompute.engines.base import Completion


@pytest.fixture(scope="module")
def tokens_policy():
    from app_fakes import fit_tokens_policy

    return fit_tokens_policy()


@pytest.fixture(scope="module")
def prompts():
    from isocompute.policy.synthetic import synthetic_records

    return [r["prompt"] for r in synthetic_records(2000, 1, seed=7)]


def test_realised_latency_hand_worked():
    # waves of 1 and 2 samples: 30 and (40, 55) tokens, t = 50 → (30 + 55)/50 = 1.7; + 0.1 per wave → 1.9
    assert realised_latency([[30], [40, 55]], 50.0) == pytest.approx(1.7)
    assert realised_latency([[30], [40, 55]], 50.0, overhead=0.1) == pytest.approx(1.9)
    assert realised_latency([[30], []], 50.0, overhead=0.1) == pytest.approx(0.8)  # a wave with nothing back
    assert realised_latency([], 50.0) == 0.0
    with pytest.raises(ValueError, match="tokens_per_sample"):
        realised_latency([[1]], 0.0)


def test_hand_worked_steps():
    ctl = LatencyController(1.5, lo=1.0, hi=2.0, gain=0.1, max_step=0.5)  # step bound s·L = 0.75
    # latency 3: e = (1.5 − 3)/1.5 = −1 → I = 1.5 − 0.1·1.5 = 1.35 = l
    assert ctl.observe(3.0) == pytest.approx(1.35)
    # latency 0.75: e = +0.5 → I = 1.35 + 0.075 = 1.425
    assert ctl.observe(0.75) == pytest.approx(1.425)
    # latency 30 (outlier): e = −19 → I projected to lo = 1; l moves at most 0.75 → 1.0
    assert ctl.observe(30.0) == pytest.approx(1.0) and ctl.state().saturated
    s = ctl.state()
    assert (s.requests, s.mean_cost) == (3, pytest.approx(33.75 / 3))


def _drift(n: int, rng: np.random.Generator, first: float = 0.8, second: float = 1.3) -> np.ndarray:
    """Per prompt: samples ``first``× the training table's length for the first half, ``second``× for the
    second, times lognormal noise (σ 0.3, mean 1)."""
    f = np.where(np.arange(n) < n // 2, first, second)
    return f * rng.lognormal(-0.045, 0.3, size=n)


def test_drift_short_to_long_stays_on_the_latency_budget_where_fixed_nu_drifts(tokens_policy, prompts):
    p, L = tokens_policy, 1.5
    b = 2 * p.tokens_per_sample_
    drift = _drift(len(prompts), np.random.default_rng(3))
    lat = np.array([float(p.decide([q], b, latency_budget=L).expected_latency[0]) for q in prompts])
    fixed = float(np.mean(lat * drift))
    ctl = LatencyController(L, lo=p.latency_.range[0], hi=p.latency_.range[1], gain=0.05)
    got = []
    for q, f in zip(prompts, drift, strict=True):
        r = float(p.decide([q], b, latency_budget=ctl.internal).expected_latency[0]) * f
        got.append(r)
        ctl.observe(r)
    controlled = float(np.mean(got))
    print(f"\nlatency budget {L}: controlled mean {controlled:.3f} sample lengths ({controlled / L - 1:+.2%}); "
          f"fixed ν {fixed:.3f} ({fixed / L - 1:+.2%}); internal at the end {ctl.internal:.3f}")
    assert abs(controlled / L - 1) <= 0.03
    assert abs(fixed / L - 1) >= 0.10
    assert abs(np.mean(got[1200:]) / L - 1) <= 0.05  # the long half on budget too, not the halves cancelling
    assert not ctl.state().saturated


def test_both_controllers_together_keep_tokens_and_latency_on_budget(tokens_policy, prompts):
    """Longer samples cost more tokens *and* wait longer: the λ and μ controllers on one key each keep
    their own mean (tokens realised = the plan's expected tokens × the same drift, here 1× then 1.25×:
    this small policy's latency hardly answers the latency budget at budgets above ~2.3x, so samples
    shorter than the training table's, which push the internal budget up, leave no latency to buy)."""
    p, L = tokens_policy, 1.5
    t = p.tokens_per_sample_
    B = 2 * t
    drift = _drift(len(prompts), np.random.default_rng(4), 1.0, 1.25)
    cost = BudgetController(B, lo=p.budget_range[0], hi=p.budget_range[1], gain=0.05)
    mu = LatencyController(L, lo=1.0, hi=2.0, gain=0.05)
    spent, waited = [], []
    for q, f in zip(prompts, drift, strict=True):
        d = p.decide([q], cost.internal, latency_budget=mu.internal)
        spent.append(float(d.costs[0]) * f)
        waited.append(float(d.expected_latency[0]) * f)
        cost.observe(spent[-1])
        mu.observe(waited[-1])
    tokens, latency = float(np.mean(spent)), float(np.mean(waited))
    print(f"\ntokens {tokens / t:.3f}x of 2x ({tokens / B - 1:+.2%}), latency {latency:.3f} of {L} "
          f"({latency / L - 1:+.2%})")
    assert abs(tokens / B - 1) <= 0.03 and abs(latency / L - 1) <= 0.03


@pytest.mark.parametrize(("L", "factor", "end"), [(1.0, 3.0, "lo"), (2.0, 0.2, "hi")])
def test_out_of_reach_pins_at_the_latency_range_and_says_saturated(tokens_policy, prompts, L, factor, end):
    p = tokens_policy
    lo, hi = p.latency_.range
    ctl = LatencyController(L, lo=lo, hi=hi, gain=0.05)
    for q in prompts[:300]:
        r = float(p.decide([q], 2 * p.tokens_per_sample_, latency_budget=ctl.internal).expected_latency[0])
        ctl.observe(r * factor)
        assert lo <= ctl.internal <= hi
    assert ctl.internal == {"lo": lo, "hi": hi}[end] and ctl.state().saturated


# ---- the gateway ------------------------------------------------------------------------------------------


class LongEngine:
    """Every sample "The answer is 12." with ``tokens`` completion tokens (samples ``tokens / t`` sample
    lengths long); records the calls."""

    name = "long"

    def __init__(self, tokens: int):
        self.tokens, self.calls = tokens, []

    async def generate(self, prompts, n, max_tokens, temperature, seed=None):
        self.calls.append((list(prompts), n))
        return [[Completion("The answer is 12.", 10, self.tokens) for _ in range(n)] for _ in prompts]

    async def aclose(self):
        pass


def test_gateway_reports_realised_latency_and_moves_the_internal_latency_budget(tokens_policy):
    """Samples twice the training table's mean length: each wave waits 2 sample lengths, so the realised
    latency exceeds L = 1.5 and the internal latency budget goes down, step by step as a controller fed
    the reported latencies goes; the gauge shows the last one."""
    p, L = tokens_policy, 1.5
    t = p.tokens_per_sample_
    tokens = round(2 * t)
    with make_client(LongEngine(tokens), policy=p) as c:
        infos = [c.post("/v1/completions", json=completion("What is 12 + 7 * 3?", budget="2x", latency_budget=L)
                        ).json()["isocompute"] for _ in range(12)]
        metrics = c.get("/metrics").text
    replay = LatencyController(L, lo=1.0, hi=2.0, gain=0.05, max_step=0.5)
    for info in infos:
        assert info["latency_budget"] == L
        assert info["latency"] == pytest.approx(info["waves"] * tokens / t)
        assert info["internal_latency_budget"] == pytest.approx(replay.internal)
        replay.observe(info["latency"])
    assert infos[-1]["internal_latency_budget"] < L
    b = float(f"{2 * t:.3g}")  # the key's budget, on pricing's three-digit grid
    key = f'isocompute_internal_latency_budget{{budget_key="anonymous:{b:g}tokens:lat1.5"}}'
    [gauge] = [float(x.rsplit(" ", 1)[1]) for x in metrics.splitlines() if x.startswith(key)]
    assert gauge == pytest.approx(infos[-1]["internal_latency_budget"])  # the last decision's, as for cost
    assert "isocompute_mean_latency{" in metrics


def test_keys_are_independent_and_no_latency_budget_changes_nothing(tokens_policy):
    """Traffic under one latency budget moves neither another latency budget's controller nor anything
    of a request without one: that request's body is the same as on a fresh gateway, with the new fields
    null and the decision the policy's at the plain budget."""
    p, q = tokens_policy, "What is 345 * 12 - 7?"
    plain = {"prompt": [q, "What is 2 + 2?"], "budget": "4x"}
    with make_client(LongEngine(round(2 * p.tokens_per_sample_)), policy=p) as fresh:
        before = fresh.post("/v1/route", json=plain).json()
        before_c = fresh.post("/v1/completions", json=completion(q, budget="4x", seed=1)).json()
    with make_client(LongEngine(round(2 * p.tokens_per_sample_)), policy=p) as c:
        for _ in range(10):
            c.post("/v1/completions", json=completion(q, budget="4x", latency_budget=1.5))
        other = c.post("/v1/route", json={**plain, "latency_budget": 2.0}).json()
        moved = c.post("/v1/route", json={**plain, "latency_budget": 1.5}).json()
        after = c.post("/v1/route", json=plain).json()
        after_c = c.post("/v1/completions", json=completion(q, budget="4x", seed=1)).json()
    assert moved["internal_latency_budget"] < 1.5 and other["internal_latency_budget"] == 2.0
    assert after == before and after["internal_latency_budget"] is None and after["latency_budget"] is None
    assert [d["action"] for d in after["decisions"]] == p.decide(plain["prompt"], 4 * p.tokens_per_sample_
                                                                 ).action_index.tolist()
    for body in (before_c, after_c):  # the id, the time and the wall-clock seconds differ between any two requests
        body.pop("id"), body.pop("created")
        for info in (body["isocompute"], *(ch.get("isocompute") or {} for ch in body["choices"])):
            info.pop("latency_s", None)
            for w in info.get("wave_runs", ()):
                w.pop("seconds", None)
    assert after_c == before_c
    assert after_c["isocompute"]["latency"] is None and after_c["isocompute"]["internal_latency_budget"] is None


def test_control_off_hands_the_latency_budget_itself_and_still_reports(tokens_policy):
    p = tokens_policy
    with make_client(LongEngine(round(2 * p.tokens_per_sample_)), policy=p, budget_control=False) as c:
        infos = [c.post("/v1/completions", json=completion(budget="2x", latency_budget=1.5)).json()["isocompute"]
                 for _ in range(5)]
    assert [i["internal_latency_budget"] for i in infos] == [1.5] * 5
    assert all(i["latency"] is not None and math.isfinite(i["latency"]) and i["latency"] > 1.5 for i in infos)


def test_an_evicted_key_loses_its_latency_controller_too(tokens_policy):
    """The λ bank's eviction drops the key's μ controller: the key comes back with a fresh one."""
    p = tokens_policy
    with make_client(LongEngine(round(2 * p.tokens_per_sample_)), policy=p, control_max_keys=1) as c:
        def post(L):
            return c.post("/v1/completions", json=completion(budget="2x", latency_budget=L)).json()["isocompute"]

        moved = [post(1.5) for _ in range(4)][-1]
        post(2.0)  # evicts the key of 1.5
        back = post(1.5)
        metrics = c.get("/metrics").text
    assert moved["internal_latency_budget"] < 1.5 and back["internal_latency_budget"] == 1.5
    assert ":lat2" not in metrics and metrics.count("isocompute_internal_latency_budget{") == 1
