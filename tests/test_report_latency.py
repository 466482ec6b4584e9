"""The report's tokens and latency per method (isocompute.evaluation.channels): present with token counts,
checked against a direct computation, absent without, and nothing else moves."""

import json
from math import comb

import numpy as np
import pytest

from isocompute.cli import main
from isocompute.evaluation.baselines import FixedBaselines, baseline_plans
from isocompute.evaluation.evaluate import cross_validate, summarise
from isocompute.policy.plans.arrays import plan_arrays, table_arrays
from isocompute.policy.plans.menu import resolve_plans
from isocompute.policy.policy import PolicyConfig
from isocompute.policy.synthetic import synthetic_records
from isocompute.solver.outcomes import from_records

ACTIONS = (1, 2, 4, 8)
FIT_FLAGS = ["--actions", "1,2,4,8", "--budgets", "1:8", "--n-rounds", "10", "--svd-components", "4",
             "--calibration-folds", "2", "--plans", "lead:m=2@1x8,window:w=3@3x2,2"]
REPORT_FLAGS = ["--folds", "3", "--seeds", "1", "--budgets", "1,2,4,8", "--bootstrap", "100"]


def _records(n: int, seed: int, tokens: bool = True) -> list[dict]:
    """Synthetic records with deterministic completion lengths (30 + 7·((3i + 5j) mod 11) for prompt i,
    sample j), or none at all."""
    recs = synthetic_records(n, 8, seed=seed, noise=0.3)
    for i, r in enumerate(recs):
        for j, s in enumerate(r["samples"]):
            if tokens:
                s["completion_tokens"] = 30 + 7 * ((3 * i + 5 * j) % 11)
            else:
                s.pop("completion_tokens", None)
    return recs


def _write(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def _expected_max(lengths: np.ndarray, k: int) -> float:
    """E[max of k of the lengths drawn without replacement]: P(max = l_(j)) = C(j−1, k−1) / C(n, k)."""
    s = np.sort(lengths)
    n = s.size
    return float(sum(comb(j - 1, k - 1) * s[j - 1] for j in range(k, n + 1)) / comb(n, k))


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    d = tmp_path_factory.mktemp("latency")
    recs = _records(60, seed=3)
    train = _write(d / "train.jsonl", recs)
    bare = _write(d / "bare.jsonl", _records(60, seed=3, tokens=False))
    other = _write(d / "other.jsonl", _records(30, seed=8))
    out = {}
    for name, table in (("timed", train), ("bare", bare)):
        assert main(["fit", str(table), "--out", str(d / f"pol-{name}"), *FIT_FLAGS]) == 0
        assert main(["report", "--policy", str(d / f"pol-{name}"), str(table), "--out", str(d / f"rep-{name}"),
                     *REPORT_FLAGS]) == 0
        out[name] = d / f"rep-{name}"
    assert main(["report", "--policy", str(d / "pol-timed"), str(other), "--out", str(d / "rep-hold"), "--holdout",
                 "--budgets", "1,2,4,8", "--bootstrap", "100"]) == 0
    out["hold"] = d / "rep-hold"
    return recs, out


@pytest.mark.slow
def test_every_method_row_has_tokens_and_latency(reports):
    recs, out = reports
    rep = json.loads((out["timed"] / "report.json").read_text())
    lengths = [np.array([s["completion_tokens"] for s in r["samples"]], float) for r in recs]
    unit = float(np.mean([x.mean() for x in lengths]))
    assert rep["latency_unit_tokens"] == pytest.approx(unit)
    for e in rep["budgets"]:
        for name, row in e["methods"].items():
            assert {"tokens", "latency", "waves", "cost"} <= set(row), name
            assert row["tokens"] > 0 and row["latency"] > 0
        uni = e["methods"]["uniform"]
        k = int(e["budget"])  # the budgets are the ladder's k: uniform plays none@k everywhere
        assert uni["tokens"] == pytest.approx(k * unit)
        expect = np.mean([_expected_max(x, k) for x in lengths]) / unit
        assert uni["latency"] == pytest.approx(expect)
        if k == 1:  # none@1: one sample's mean length per prompt, averaged, over the unit
            assert uni["latency"] == pytest.approx(np.mean([x.mean() for x in lengths]) / unit) == pytest.approx(1.0)
        # latency ≤ tokens / unit (waiting is at most the tokens generated) and ≥ the longest wave's share
        for row in e["methods"].values():
            assert row["latency"] <= row["tokens"] / unit + 1e-9
    md = (out["timed"] / "report.md").read_text()
    assert "| method | accuracy [95% CI] | cost | waves | tokens | latency | gain vs uniform |" in md
    assert f"({rep['latency_unit_tokens']:.6g} tokens), with no per-wave overhead" in md
    hold = json.loads((out["hold"] / "report.json").read_text())
    assert "latency_unit_tokens" in hold
    assert all({"tokens", "latency"} <= set(r) for e in hold["budgets"] for r in e["methods"].values())


@pytest.mark.slow
def test_a_table_without_token_counts_has_no_tokens_or_latency(reports):
    _, out = reports
    rep = json.loads((out["bare"] / "report.json").read_text())
    assert "latency_unit_tokens" not in rep
    assert all("tokens" not in r and "latency" not in r and "waves" in r
               for e in rep["budgets"] for r in e["methods"].values())
    md = (out["bare"] / "report.md").read_text()
    assert "| method | accuracy [95% CI] | cost | waves | gain vs uniform |" in md and "| tokens |" not in md


def test_channels_add_keys_and_move_nothing():
    """cross_validate with tokens and latency: the same Evaluation and summary as without, plus the two."""
    table = from_records(_records(48, seed=11))
    cfg = PolicyConfig(actions=ACTIONS, budget_range=(1.0, 8.0), n_rounds=5, n_budget_grid=9, calibration_folds=2,
                       n_components=4, plans=tuple(p.name for p in resolve_plans("lead:m=2@1x8", ACTIONS)))
    arr = table_arrays(table, cfg)
    plans, cols = baseline_plans(resolve_plans("lead:m=2@1x8", ACTIONS), ACTIONS)
    b = plan_arrays(table, plans)
    kw = dict(folds=3, seeds=(0,), samples=arr.samples, waves=arr.waves)
    plain = cross_validate(table.prompts, arr.utility, arr.cost, cfg, [2.0, 4.0],
                           baselines=FixedBaselines(plans, b.utility, b.cost, b.waves, cols), **kw)
    timed = cross_validate(table.prompts, arr.utility, arr.cost, cfg, [2.0, 4.0], tokens=arr.tokens,
                           latency=arr.latency / 10.0,
                           baselines=FixedBaselines(plans, b.utility, b.cost, b.waves, cols,
                                                    {"tokens": b.tokens, "latency": b.latency / 10.0}), **kw)
    assert plain.tokens is None and plain.latency is None
    for f in ("utility", "cost", "waves", "oracle_actions", "learned_actions", "gap"):
        np.testing.assert_array_equal(getattr(plain, f), getattr(timed, f))
    assert not np.isnan(timed.tokens).any() and not np.isnan(timed.latency).any()  # every method, baselines too
    s0, s1 = summarise(plain, n_boot=100), summarise(timed, n_boot=100)
    for e0, e1 in zip(s0["budgets"], s1["budgets"], strict=True):
        for name, row in e1["methods"].items():
            assert {k: v for k, v in row.items() if k not in ("tokens", "latency")} == e0["methods"][name]
    strip = [{k: v for k, v in e.items() if k not in ("methods", "learners")} for e in s1["budgets"]]
    assert strip == [{k: v for k, v in e.items() if k not in ("methods", "learners")} for e in s0["budgets"]]
