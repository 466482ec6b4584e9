"""Plans: stable names and their parser, schedules, stepping through waves as the gateway will, caps,
families and errors."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isocompute.errors import InputError
from isocompute.solver.plans.plan import (
    Plan,
    default_plans,
    parse_plan,
    parse_schedule,
    plan_family,
    schedule_name,
    schedule_waves,
)
from isocompute.solver.plans.rules import LeadRule, NoRule


def test_default_menu_has_thirty_plans_with_unique_round_tripping_names():
    plans = default_plans()
    names = [p.name for p in plans]
    assert len(plans) == 30 and len(set(names)) == 30
    assert all(parse_plan(n) == p and parse_plan(n).name == n for n, p in zip(names, plans, strict=True))
    assert max(p.max_samples for p in plans) == 16
    assert "none@4" in names and "lead:m=2@1x16" in names and "window:w=3@3x5,1" in names


def test_uniform_is_the_one_wave_plan_without_rule():
    p = parse_plan("none@4")
    assert p == Plan((4,), NoRule()) and p.n_waves == 1 and p.boundaries == (4,)
    assert [q.name for q in plan_family("uniform", k=[1, 2])] == ["none@1", "none@2"]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=12))
def test_schedule_names_round_trip(waves):
    assert parse_schedule(schedule_name(waves)) == tuple(waves)


def test_schedule_examples():
    assert schedule_name((1, 1, 2, 4, 8)) == "1x2,2,4,8"
    assert schedule_waves("doubling", 16) == (1, 1, 2, 4, 8)
    assert schedule_waves("doubling", 6) == (1, 1, 2, 2)
    assert schedule_waves(3, 8) == (3, 3, 2)
    assert schedule_waves("window", 16, parse_plan("window:w=4@4").rule) == (4, 4, 4, 4)
    for k in range(1, 40):
        assert sum(schedule_waves("doubling", k)) == k


def test_step_worked_example():
    plan = parse_plan("lead:m=2@1x2,2,4,8")
    first = plan.step(["a"])
    assert not first.stop and first.reason == "continue" and first.next_wave == 1 and first.waves_done == 1
    assert plan.step(["a", "a"]).reason == "rule"
    split = plan.step(["a", "b"])
    assert not split.stop and split.next_wave == 2
    done = plan.step(list("abaa"))
    assert done.stop and done.reason == "rule" and done.waves_done == 3 and done.decision.most_common == "a"
    end = plan.step(list("abababababababab"))
    assert end.stop and end.reason == "plan_end" and end.next_wave is None
    with pytest.raises(InputError, match=r"after \[1, 2, 4, 8, 16\] samples, not after 3"):
        plan.step(["a", "b", "c"])


def test_capped_plans():
    plan = parse_plan("lead:m=2@1x2,2,4,8")
    assert plan.capped(max_samples=5).name == "lead:m=2@1x2,2,1"
    assert plan.capped(max_waves=3).name == "lead:m=2@1x2,2"
    assert plan.capped(max_samples=100, max_waves=100) == plan
    assert plan.capped(max_samples=1).name == "lead:m=2@1"


def test_family_grid():
    plans = plan_family("lead", m=[2, 3], k_max=[4, 8])
    assert [p.name for p in plans] == ["lead:m=2@1x4", "lead:m=2@1x8", "lead:m=3@1x4", "lead:m=3@1x8"]
    assert [p.name for p in plan_family("window", w=2, k_max=6)] == ["window:w=2@2x3"]
    assert plan_family("bayes", B=[3], alpha=[1.0], k_max=4)[0].name == "bayes:B=3,alpha=1,top=5@1x4"
    assert plan_family("lead", m=2, schedule="doubling")[0].rule == LeadRule(2)


@pytest.mark.parametrize(("call", "match"), [
    (lambda: parse_plan("lead:m=2"), "a plan is RULE@SCHEDULE"),
    (lambda: parse_plan("lead:m=2@"), "a plan is RULE@SCHEDULE"),
    (lambda: parse_plan("lead:m=2@1xq"), "not N or NxCOUNT"),
    (lambda: parse_plan("vote@4"), "unknown stopping rule 'vote'"),
    (lambda: parse_plan("none@0"), "waves of >= 1 samples"),
    (lambda: parse_plan("none@600x2"), "at most 1000 samples"),
    (lambda: Plan((2,), "lead"), "must be a StoppingRule"),
    (lambda: plan_family("greedy"), "unknown plan family 'greedy'"),
    (lambda: plan_family("lead", p=[0.9]), "has no parameter 'p'"),
    (lambda: plan_family("lead", schedule="window"), "schedule 'window' needs the window rule"),
    (lambda: schedule_waves("zigzag", 4), "unknown schedule 'zigzag'"),
    (lambda: parse_plan("none@4").capped(max_samples=0), "max_samples must be an integer >= 1"),
])
def test_errors(call, match):
    with pytest.raises(InputError, match=match):
        call()
