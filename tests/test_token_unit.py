"""The tokens cost unit: a k-sample action costs k × the prompt's mean completion tokens, plans cost the
tokens they are expected to generate, and a budget may be written as a multiple of one sample's mean
tokens on the table (``4x``) — only in that unit, and all budgets of a run alike."""

from __future__ import annotations

import numpy as np
import pytest

from isocompute.errors import InputError
from isocompute.solver.costs import cost_table, token_multiple_of
from isocompute.stages.parsing import (
    Multiple,
    parse_budget,
    parse_budget_range,
    parse_budgets,
    resolve_budgets,
)


def test_k_samples_cost_k_times_the_mean_tokens():
    m = np.array([100.0, 250.0])
    np.testing.assert_allclose(cost_table(None, m, (1, 2, 4), unit="tokens"), [[100, 200, 400], [250, 500, 1000]])
    with pytest.raises(InputError, match="needs completion_tokens"):
        cost_table(np.array([3, 4]), None, (1, 2), unit="tokens")
    assert token_multiple_of(m) == 175.0


def test_budgets_as_multiples_parse_and_resolve():
    lo, hi = parse_budget_range("1x:16x")
    assert isinstance(lo, Multiple) and (float(lo), float(hi)) == (1.0, 16.0)
    assert [float(b) for b in parse_budgets("1x:3x:1x")] == [1.0, 2.0, 3.0]
    assert resolve_budgets([parse_budget("4x")], "tokens", 300.0) == [1200.0]
    assert resolve_budgets(parse_budget_range("300:4800"), "tokens", 300.0) == [300.0, 4800.0]


@pytest.mark.parametrize("values, unit, match", [
    (["4x"], "samples", "add --cost-unit tokens"),
    (["1x", "16"], "tokens", "every budget as a multiple"),
])
def test_multiples_are_refused_with_the_fix(values, unit, match):
    parsed = [parse_budget(v) for v in values]
    with pytest.raises(InputError, match=match):
        resolve_budgets(parsed, unit, 300.0)


def test_a_bad_multiple_says_what_to_write():
    with pytest.raises(InputError, match="e.g. 4x"):
        parse_budget("fourx")
    with pytest.raises(InputError, match="1x:16x"):
        parse_budget_range("1x:")


def test_plan_costs_in_tokens_are_the_expected_tokens_drawn():
    from isocompute.policy.plans.arrays import plan_arrays
    from isocompute.solver.outcomes import from_records
    from isocompute.solver.plans.plan import parse_plan

    records = [{"id": "a", "prompt": "p", "gold": "1", "samples": [
        {"answer": "1", "correct": True, "completion_tokens": 10},
        {"answer": "1", "correct": True, "completion_tokens": 30},
        {"answer": "2", "correct": False, "completion_tokens": 50}]}]
    arr = plan_arrays(from_records(records), [parse_plan("none@2"), parse_plan("lead:m=2@1x3")], cost_unit="tokens")
    # none@2: two of three samples, 2 × mean 30 = 60 tokens. lead:m=2@1x3 over the 6 orders: the two agreeing
    # samples first (2 orders) stop at 10 + 30 = 40 tokens, the other 4 orders draw all three (90): not
    # 8/3 × 30 = 80, because which samples are drawn depends on what they answer — (2·40 + 4·90)/6 = 73⅓.
    np.testing.assert_allclose(arr.cost[0], [60.0, 220.0 / 3])
