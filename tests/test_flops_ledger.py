"""RACE convention and FlopLedger: hand-worked cases, agreement with the analytic functions, invariants."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from isocompute.errors import InputError
from isocompute.flops import (
    FlopBreakdown,
    FlopLedger,
    ModelFlops,
    RaceConvention,
    lora_update_flops,
    race_flops,
    request_flops,
    reward_flops,
    train_flops,
)

POLICY = ModelFlops(body_params=800, head_params=200, n_layers=2, d_attn=16, n_params=1_200)
REWARD = ModelFlops(body_params=300, head_params=2, n_layers=1, d_attn=8, n_params=400)


def test_race_hand_worked():
    b = race_flops(1.5e9, rollout_tokens=1e6, update_tokens=1e6, n_lora=1.5e7)
    assert b.rollout == 3e15 and b.reward == 0
    assert b.update == pytest.approx(6 * 1.5e9 * (0.85 + 0.15 * 0.01) * 1e6)
    assert b.rho == pytest.approx(7.6635 / 10.6635)


def test_race_reward_folded_into_rollout_reproduces_the_papers_formula():
    n, r, t = 3e9, 7e9, 2e5
    b = race_flops(n, rollout_tokens=t, update_tokens=t, reward_params=r)
    assert b.rollout + b.reward == 2 * (n + r) * t  # F_rollout = c_fwd·(N + R)·T_rollout


def test_race_full_finetune_is_6nt_and_a_is_configurable():
    conv = RaceConvention(a=0.5)
    assert conv.update(1e9, 10) == 6e10
    assert conv.f_eff(100, 20) == pytest.approx(0.5 + 0.5 * 0.2)
    assert RaceConvention().f_eff(100, 100) == pytest.approx(1.0)


@given(st.floats(0, 1), st.floats(1, 1e12), st.floats(0, 1))
def test_f_eff_between_a_and_one(a, n, share):
    f = RaceConvention(a=a).f_eff(n, n * share)
    assert a - 1e-12 <= f <= 1 + 1e-12


def test_empty_breakdown_rho_is_nan():
    assert math.isnan(FlopBreakdown().rho)


def make_ledger() -> FlopLedger:
    led = FlopLedger()
    led.add_rollout(POLICY, 100, [50, 70])
    led.add_rollout(POLICY, 30, [10, 10, 5], prefix_sharing=False)
    led.add_reward(REWARD, 100, [50, 70])
    led.add_update(POLICY, [150, 170], n_lora=60)
    led.add_update(POLICY, [40])
    return led


def test_ledger_agrees_with_analytic_and_race_functions():
    led = make_ledger()
    rollout = request_flops(POLICY, 100, [50, 70]) + request_flops(POLICY, 30, [10, 10, 5], prefix_sharing=False)
    update = lora_update_flops(POLICY, 150, 60) + lora_update_flops(POLICY, 170, 60) + train_flops(POLICY, 40)
    reward = reward_flops(REWARD, 100, 50) + reward_flops(REWARD, 100, 70)
    assert led.analytic == FlopBreakdown(rollout, update, reward)
    assert led.rho == pytest.approx(update / (rollout + update + reward))
    # tokens: prompt prefilled once with sharing, three times without
    assert (led.prompt_tokens, led.completion_tokens) == (100 + 3 * 30, 120 + 25)
    assert (led.update_tokens, led.reward_tokens, led.requests, led.samples) == (360, 320, 2, 5)
    conv = RaceConvention()
    assert led.race.rollout == 2 * 1_200 * (100 + 120 + 90 + 25)
    assert led.race.update == pytest.approx(conv.update(1_200, 320, 60) + conv.update(1_200, 40))
    assert led.race.reward == 2 * 400 * 320
    assert led.race_rho == pytest.approx(led.race.update / led.race.total)


def test_ledger_returns_what_it_charged_and_ignores_empty_requests():
    led = FlopLedger()
    assert led.add_rollout(POLICY, 10, [3]) == request_flops(POLICY, 10, [3])
    assert led.add_rollout(POLICY, 10, []) == 0.0
    assert led.requests == 1


def test_merge_is_the_sum_and_order_free():
    a, b = make_ledger(), FlopLedger()
    b.add_rollout(POLICY, 7, [1, 2, 3])
    ab, ba = a.merge(b), b.merge(a)
    assert ab.analytic.total == pytest.approx(a.analytic.total + b.analytic.total)
    assert ab.samples == ba.samples == a.samples + 3 and ab.requests == a.requests + 1
    assert ab.analytic.rollout == pytest.approx(ba.analytic.rollout)
    assert a.merge(FlopLedger()).to_dict() == a.to_dict()


def test_json_round_trip(tmp_path):
    led = make_ledger()
    path = tmp_path / "sub" / "ledger.json"
    led.save(path)
    assert FlopLedger.load(path) == led
    assert json.loads(path.read_text())["schema_version"] == 1
    assert not [p for p in path.parent.iterdir() if p.name != "ledger.json"]  # no temp file left


def test_round_trip_keeps_the_convention(tmp_path):
    led = FlopLedger(convention=RaceConvention(a=0.7))
    led.add_update(POLICY, [10], n_lora=5)
    led.save(tmp_path / "l.json")
    assert FlopLedger.load(tmp_path / "l.json").convention.a == 0.7


def _bad_file(tmp_path, text):
    p = tmp_path / "bad.json"
    p.write_text(text)
    return p


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda d: RaceConvention(a=1.5), r"must lie in \[0, 1\]"),
        (lambda d: RaceConvention(c_bwd=0), "must be positive"),
        (lambda d: RaceConvention().f_eff(10, 11), "0 <= N_LoRA <= N"),
        (lambda d: FlopLedger().merge(FlopLedger(convention=RaceConvention(a=0.5))), "different RACE conventions"),
        (lambda d: FlopLedger.load(d / "missing.json"), "cannot read FLOP ledger"),
        (lambda d: FlopLedger.load(_bad_file(d, '{"schema_version": 1')), "not valid JSON"),
        (lambda d: FlopLedger.load(_bad_file(d, '{"schema_version": 9}')), "schema version 1 \\(found 9\\)"),
        (lambda d: FlopLedger.load(_bad_file(d, '{"schema_version": 1, "tokens": {}}')), "malformed field"),
        (lambda d: FlopLedger.from_dict({**FlopLedger().to_dict(), "race": {"rollout": -1, "update": 0,
                                                                             "reward": 0}}), "cannot be negative"),
        (lambda d: FlopBreakdown.from_dict({"rollout": "x"}), "numeric 'rollout'"),
    ],
)
def test_errors(tmp_path, call, match):
    with pytest.raises(InputError, match=match):
        call(tmp_path)
