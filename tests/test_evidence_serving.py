"""Evidence-aware plans served: the policy wrapper, its artifact, the CLI, and the gateway running the learned
continuation at each finish of a parallel-stop wave with the evidence the runner saw.

The evidence model is fitted for real (LightGBM heads on walks of a synthetic table); where a test needs the
chain to keep the evidence rule at a budget, it sets that entry by hand (the synthetic table is too small for
the bootstrap to keep it) — the heads, features and runner are the real ones.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from app_fakes import FakeEngine, completion, fit_tokens_policy, make_client

from isocompute.cli import main
from isocompute.policy.evidence.features import NAMES
from isocompute.policy.evidence.model import EvidenceModel, fit_evidence
from isocompute.policy.evidence.serving import EVIDENCE_FILE, EvidencePolicy
from isocompute.policy.loading import load_policy
from isocompute.policy.synthetic import synthetic_records
from isocompute.solver.outcomes import from_records

WAVES = (2, 4)


@pytest.fixture(scope="module")
def table():
    recs = synthetic_records(120, 8, seed=0)
    return from_records(recs), recs


@pytest.fixture(scope="module")
def policy():
    return fit_tokens_policy()


@pytest.fixture(scope="module")
def fitted(table):
    return fit_evidence(table[0], WAVES, folds=2, draws=4, eval_draws=4, seed=0)


def kept(model: EvidenceModel, lam: float, mu: float = 0.0) -> EvidenceModel:
    """The model with its no-latency entries from the middle of the grid on set to serve the evidence rule."""
    rows = [e for e in model.entries if e.latency_budget is None]
    mid = rows[len(rows) // 2].budget
    entries = [dataclasses.replace(e, rule="evidence", lam=lam, mu=mu, price=0, gain=0.01, gain_low=0.001)
               if e.latency_budget is None and e.budget >= mid else e for e in model.entries]
    return dataclasses.replace(model, entries=entries)


def test_fitted_model_has_a_chain_entry_per_budget_and_level(fitted):
    levels = {e.latency_budget for e in fitted.entries}
    assert None in levels and len(levels) >= 2
    assert {e.rule for e in fitted.entries} <= {"evidence", "fixed_plan"}
    for e in fitted.entries:
        assert abs(sum(e.fixed_weights) - 1) < 1e-9 and all(0 <= j < len(fitted.menu) for j in e.fixed_plans)
    assert fitted.values is not None and fitted.values.utility.shape[0] == 120


def test_decide_serves_the_evidence_plan_where_the_chain_keeps_it_and_the_policy_elsewhere(policy, fitted):
    model = kept(fitted, lam=5.0)
    ep = EvidencePolicy(policy, model)
    top = max(e.budget for e in model.entries) * model.unit
    d = ep.decide(["What is 2 + 3?", "What is 7 * 8?"], min(top, policy.budget_range[1]))
    assert d.rule == "evidence" and d.plan_names[0].startswith("evidence:lam=5") and d.plan_names[0].endswith("@2s,4s")
    assert d.rule_evidence["rule"] == "evidence" and d.rule_evidence["gain_lower_bound"] == 0.001
    assert list(d.k) == [6, 6] and d.costs.shape == (2,)
    low = min(e.budget for e in model.entries) * model.unit
    base = policy.decide(["What is 2 + 3?"], max(low, policy.budget_range[0]))
    d2 = ep.decide(["What is 2 + 3?"], max(low, policy.budget_range[0]))
    assert d2.rule == base.rule and d2.plan_names == base.plan_names


def test_artifact_round_trip_loads_as_an_evidence_policy(policy, fitted, tmp_path):
    ep = EvidencePolicy(policy, kept(fitted, lam=5.0))
    ep.save(tmp_path / "pol")
    assert (tmp_path / "pol" / EVIDENCE_FILE).exists()
    back = load_policy(tmp_path / "pol")
    assert isinstance(back, EvidencePolicy) and back.evidence.waves == WAVES
    b = policy.budget_range[1]
    assert back.decide(["What is 9 - 4?"], b).plan_names == ep.decide(["What is 9 - 4?"], b).plan_names
    x = np.random.default_rng(0).random((5, len(NAMES)))
    for key, bst in ep.evidence.heads.boosters.items():
        assert np.allclose(bst.predict(x), back.evidence.heads.boosters[key].predict(x))


def test_a_samples_unit_policy_is_refused(fitted):
    class Cfg:
        cost_unit = "samples"

    class P:
        config = Cfg()

    with pytest.raises(Exception, match="--cost-unit tokens"):
        EvidencePolicy(P(), fitted)


def answer_at_the_top_budget(policy, ep: EvidencePolicy, engine: FakeEngine) -> dict:
    """One completion served by ``ep`` on ``engine`` at the evidence grid's top budget: its isocompute object."""
    budget = min(max(e.budget for e in ep.evidence.entries) * ep.evidence.unit, policy.budget_range[1])
    with make_client(engine=engine, policy=ep, budget_control=False) as client:
        r = client.post("/v1/completions", json=completion("What is 2 + 3?", budget=budget, budget_unit="tokens"))
    assert r.status_code == 200, r.text
    return r.json()["isocompute"]


def test_gateway_runs_the_learned_continuation_with_the_runners_evidence(policy, fitted):
    ep = EvidencePolicy(policy, kept(fitted, lam=50.0))  # a huge token price: stop at the first finish
    engine = FakeEngine(("The answer is 5.", "The answer is 5.", "The answer is 6.", "The answer is 5."),
                        lengths=(40, 25, 60, 90))
    info = answer_at_the_top_budget(policy, ep, engine)
    assert info["plan"].startswith("evidence:") and info["rule"] == "evidence"
    ev = info["evidence"]
    assert ev["decision"] == "stop" and ev["score"] <= 0
    assert ev["features"]["finished"] == 1 and ev["features"]["running"] == 1  # the first of the wave of 2
    assert ev["features"]["log_now"] == pytest.approx(np.log(25 / ep.evidence.unit), abs=1e-3)
    assert {c["horizon"] for c in ev["continuations"]} == {"next_1", "wave_end", "plan_end"}
    runs = info["wave_runs"]
    assert len(runs) == 1 and runs[0]["ended"] == "rule" and runs[0]["finished"] == 1


def test_gateway_goes_on_while_continuing_pays(policy, fitted):
    ep = EvidencePolicy(policy, kept(fitted, lam=-1.0, mu=0.0))  # tokens pay: every continuation scores > 0
    engine = FakeEngine(("The answer is 5.", "The answer is 6."), lengths=(30, 50))
    info = answer_at_the_top_budget(policy, ep, engine)
    assert info["evidence"]["decision"] == "continue"
    assert info["wave_sizes"] == [2, 4] and info["k"] == 6  # both waves ran to the plan's end
    assert info["stopped"] == "plan_end"


def test_cli_fits_evidence_into_a_policy(policy, table, tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in table[1]))
    policy.save(tmp_path / "pol")
    rc = main(["evidence", str(path), "--policy", str(tmp_path / "pol"), "--out", str(tmp_path / "pol2"),
               "--waves", "2,4", "--folds", "2", "--draws", "4"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "evidence plans (2s,4s)" in out and "latency ≤" in out
    assert isinstance(load_policy(tmp_path / "pol2"), EvidencePolicy)
    assert main(["evidence", str(path), "--policy", str(tmp_path / "pol"), "--out", str(tmp_path / "p3"),
                 "--waves", "two"]) == 2


def test_evidence_block_rows_markdown_and_plot(table, tmp_path):
    from isocompute.evaluation.evidence_report import evidence_block, evidence_markdown, plot_calibration

    t = table[0]
    L = t.completion_tokens[t.mask]
    menu = ["none@1", "none@2", "none@4", "none@8", "lead:m=2@1x8", "lead:m=2@4s", "first:m=1@4s"]
    block = evidence_block(t, WAVES, menu, unit=float(np.median(L)), per_sample=float(np.mean(L)), draws=4,
                           eval_draws=4, folds=2, budgets_x=(2.0, 3.0), latencies=(None, 1.0))
    assert len(block["rows"]) == 4 and block["reach"] is None  # the menu has no none@16
    for r in block["rows"]:
        assert r["folds"] == 2 and 0 <= r["evidence_folds"] <= 2
        lo, hi = r["vs_cv"][1], r["vs_cv"][2]
        assert lo <= r["vs_cv"][0] <= hi
        if r["evidence_folds"] == 0:  # the fixed plan served in every fold: the chain is the CV fixed plan
            assert r["vs_cv"][0] == 0 and r["accuracy"] == r["cv_accuracy"]
        if r["latency_budget"] is not None:
            assert r["cv_latency"] <= r["latency_budget"] * 1.2
    assert block["calibration"] and sum(c["n"] for c in block["calibration"]) > 0
    md = evidence_markdown(block, "— synthetic")
    assert md.count("\n| ") == 5 and "Evidence-aware plans — synthetic" in md
    plot_calibration(block, tmp_path / "cal.png")
    assert (tmp_path / "cal.png").stat().st_size > 1000


def test_report_on_an_evidence_policy_has_the_evidence_block(policy, fitted, table, tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in table[1]))
    EvidencePolicy(policy, fitted).save(tmp_path / "pol")
    rc = main(["report", str(path), "--policy", str(tmp_path / "pol"), "--out", str(tmp_path / "rep"), "--folds", "2",
               "--seeds", "1", "--bootstrap", "200", "--budgets", "40,80"])
    assert rc == 0
    rep = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert rep["evidence"]["waves"] == list(WAVES) and rep["evidence"]["rows"]
    assert "Evidence-aware plans" in (tmp_path / "rep" / "report.md").read_text()
    assert (tmp_path / "rep" / "calibration.png").exists()
