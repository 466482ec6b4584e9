"""The report's tokens and latency per method (isocompute.evaluation.channels): present with token counts,
checked against a direct computation, absent without, and nothing else moves; ``--wave-overhead`` adds
O × waves to every row's latency (baselines too), ``--decode-speed`` gives it in seconds; the
accuracy-vs-cost plot gets a latency panel with token counts."""

import json
from math import comb

import numpy as np
import pytest

from isocompute.cli import main
from isocompute.evaluation.baselines import FixedBaselines, baseline_plans
from isocompute.evaluation.evaluate import cross_validate, summarise
from isocompute.evaluation.report_plans import accuracy_cost_figure
from isocompute.policy.plans.arrays import plan_arrays, table_arrays
from isocompute.policy.plans.menu import resolve_plans
from isocompute.policy.policy import PolicyConfig
from isocompute.policy.synthetic import synthetic_records
from isocompute.solver.outcomes import from_records

ACTIONS = (1, 2, 4, 8)
FIT_FLAGS = ["--actions", "1,2,4,8", "--budgets", "1:8", "--n-rounds", "10", "--svd-components", "4",
             "--calibration-folds", "2", "--plans", "lead:m=2@1x8,window:w=3@3x2,2"]
REPORT_FLAGS = ["--folds", "3", "--seeds", "1", "--budgets", "1,2,4,8", "--bootstrap", "100"]
OVERHEAD, SPEED = 0.5, 40.0  # one sample's mean length per wave; decode tokens per second


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
    assert main(["report", "--policy", str(d / "pol-timed"), str(train), "--out", str(d / "rep-over"),
                 "--wave-overhead", str(OVERHEAD), "--decode-speed", str(SPEED), *REPORT_FLAGS]) == 0
    out["over"] = d / "rep-over"
    out.update({"pol-bare": d / "pol-bare", "bare-table": bare, "pol-timed": d / "pol-timed", "table": train})
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
    scored = ~np.isnan(timed.utility)  # every method scored (a menu without parallel-stop plans has no such rows)
    assert scored[:, :8].all() and not np.isnan(timed.tokens[scored]).any() and not np.isnan(timed.latency[scored]).any()
    assert np.isnan(timed.tokens[~scored]).all()
    s0, s1 = summarise(plain, n_boot=100), summarise(timed, n_boot=100)
    for e0, e1 in zip(s0["budgets"], s1["budgets"], strict=True):
        for name, row in e1["methods"].items():
            assert {k: v for k, v in row.items() if k not in ("tokens", "latency")} == e0["methods"][name]
    strip = [{k: v for k, v in e.items() if k not in ("methods", "learners")} for e in s1["budgets"]]
    assert strip == [{k: v for k, v in e.items() if k not in ("methods", "learners")} for e in s0["budgets"]]


@pytest.mark.slow
def test_wave_overhead_adds_o_times_waves_to_every_row_and_decode_speed_gives_seconds(reports):
    _, out = reports
    base = json.loads((out["timed"] / "report.json").read_text())
    over = json.loads((out["over"] / "report.json").read_text())
    unit = base["latency_unit_tokens"]
    assert base["wave_overhead"] == 0.0 and "decode_speed" not in base
    assert over["wave_overhead"] == OVERHEAD and over["decode_speed"] == SPEED
    assert over["latency_unit_tokens"] == pytest.approx(unit)
    seen = set()
    for e0, e1 in zip(base["budgets"], over["budgets"], strict=True):
        assert set(e0["methods"]) == set(e1["methods"])
        for name, r0 in e0["methods"].items():
            r1 = e1["methods"][name]
            assert "latency_s" not in r0
            for k in ("accuracy", "cost", "waves", "tokens"):  # the overhead moves latency only
                assert r1[k] == r0[k], (name, k)
            assert r1["latency"] == pytest.approx(r0["latency"] + OVERHEAD * r0["waves"], rel=1e-12), name
            assert r1["latency_s"] == pytest.approx(r1["latency"] * unit / SPEED, rel=1e-12), name
            seen.add(name)
        uni = e1["methods"]["uniform"]  # none@k: one wave, so decode latency + O exactly
        assert uni["waves"] == pytest.approx(1.0) and uni["latency"] == pytest.approx(
            e0["methods"]["uniform"]["latency"] + OVERHEAD)
    assert {"oracle", "learned", "uniform", "fixed_best", "fixed_lead"} <= seen  # fixed-plan baselines too
    assert any(r["waves"] > 1.5 for e in over["budgets"] for r in e["methods"].values())  # O × waves is not O
    md = (out["over"] / "report.md").read_text()
    assert f"plus {OVERHEAD:g} per expected wave" in md and f"at {SPEED:g} decode tokens per second" in md
    assert "| tokens | latency | latency (s) | gain vs uniform |" in md
    lat_s = over["budgets"][0]["methods"]["uniform"]["latency_s"]
    assert f" {lat_s:.4g} |" in md
    manifest = json.loads((out["over"] / "manifest.json").read_text())
    assert manifest["params"]["wave_overhead"] == OVERHEAD and manifest["params"]["decode_speed"] == SPEED


@pytest.mark.slow
@pytest.mark.parametrize(("argv", "table", "message"), [
    (["--wave-overhead", "-1"], "table", "--wave-overhead must be a finite number ≥ 0"),
    (["--wave-overhead", "nan"], "table", "--wave-overhead must be a finite number ≥ 0"),
    (["--wave-overhead", "inf"], "table", "--wave-overhead must be a finite number ≥ 0"),
    (["--decode-speed", "0"], "table", "--decode-speed must be a finite number of tokens per second > 0"),
    (["--decode-speed", "-40"], "table", "--decode-speed must be a finite number of tokens per second > 0"),
    (["--decode-speed", "inf"], "table", "--decode-speed must be a finite number of tokens per second > 0"),
    (["--wave-overhead", "0.5"], "bare-table", "needs completion_tokens on every sample"),
    (["--decode-speed", "40"], "bare-table", "needs completion_tokens on every sample"),
])
def test_bad_wave_overhead_or_decode_speed(reports, tmp_path, capsys, argv, table, message):
    _, out = reports
    pol = out["pol-bare" if table == "bare-table" else "pol-timed"]
    dest = tmp_path / "rep"
    assert main(["report", "--policy", str(pol), str(out[table]), "--out", str(dest), *REPORT_FLAGS, *argv]) == 2
    assert message in capsys.readouterr().err
    assert not dest.exists()


@pytest.mark.slow
def test_bare_table_without_overhead_still_reports(reports):
    """O = 0 and no --decode-speed on a table without token counts: no error, no latency keys."""
    _, out = reports
    rep = json.loads((out["bare"] / "report.json").read_text())
    assert "wave_overhead" not in rep and "decode_speed" not in rep


def _axes(rep: dict) -> list:
    fig = accuracy_cost_figure(rep)
    return [ax for ax in fig.axes if ax.get_xlabel()]


@pytest.mark.slow
def test_accuracy_cost_plot_has_a_latency_panel_with_token_counts(reports):
    _, out = reports
    for name in ("timed", "over", "bare", "hold"):
        assert (out[name] / "accuracy_cost.png").read_bytes()[:4] == b"\x89PNG"
    timed = json.loads((out["timed"] / "report.json").read_text())
    ax_tok, ax_lat = _axes(timed)
    assert ax_tok.get_xlabel().startswith("realised tokens") and ax_tok.get_xscale() == "log"
    assert ax_lat.get_xlabel().startswith("latency (× one sample's mean length")
    labels = [ln.get_label() for ln in ax_tok.get_lines()]
    assert labels == [ln.get_label() for ln in ax_lat.get_lines()] and "policy as served" in labels
    assert {t.get_text() for t in ax_tok.get_legend().get_texts()} == set(labels)
    served = ax_lat.get_lines()[labels.index("policy as served")]
    np.testing.assert_allclose(served.get_xdata(), [e["methods"]["learned"]["latency"] for e in timed["budgets"]])
    over = json.loads((out["over"] / "report.json").read_text())
    _, ax_s = _axes(over)
    assert ax_s.get_xlabel().startswith(f"latency (s per prompt at {SPEED:g} tokens/s, overhead {OVERHEAD:g} per wave)")
    served = ax_s.get_lines()[labels.index("policy as served")]
    np.testing.assert_allclose(served.get_xdata(), [e["methods"]["learned"]["latency_s"] for e in over["budgets"]])
    bare = json.loads((out["bare"] / "report.json").read_text())
    (ax,) = _axes(bare)
    assert ax.get_xlabel() == f"realised cost (mean {bare['cost_unit']} per prompt)"
    np.testing.assert_allclose(ax.get_lines()[labels.index("policy as served")].get_xdata(),
                               [e["methods"]["learned"]["cost"] for e in bare["budgets"]])


def test_accuracy_cost_figure_on_a_hand_built_report():
    """Two methods at two budgets: one panel without tokens, two with; a method lacking tokens leaves the
    latency panels (plotted methods must have both axes' values)."""
    def row(acc, cost, **kw):
        return {"accuracy": acc, "cost": cost, "ci95": [acc, acc], **kw}

    rep = {"cost_unit": "samples", "n_prompts": 10, "budgets": [
        {"budget": b, "methods": {"uniform": row(0.5 + 0.1 * b, b), "learned": row(0.6 + 0.1 * b, b)}}
        for b in (1.0, 2.0)]}
    (ax,) = _axes(rep)
    assert [ln.get_label() for ln in ax.get_lines()] == ["policy as served", "uniform maj@k"]
    for e in rep["budgets"]:
        b = e["budget"]
        e["methods"]["uniform"].update(tokens=100.0 * b, latency=1.0 + 0.3 * b)
        e["methods"]["learned"].update(tokens=90.0 * b, latency=0.9 + 0.3 * b)
    rep["latency_unit_tokens"] = 100.0
    ax_tok, ax_lat = _axes(rep)
    np.testing.assert_allclose(ax_tok.get_lines()[1].get_xdata(), [100.0, 200.0])
    np.testing.assert_allclose(ax_lat.get_lines()[0].get_xdata(), [1.2, 1.5])
    assert ax_lat.get_xlabel() == "latency (× one sample's mean length, 100 tokens)"
    del rep["budgets"][1]["methods"]["learned"]["tokens"]
    ax_tok, _ = _axes(rep)
    assert [ln.get_label() for ln in ax_tok.get_lines()] == ["uniform maj@k"]


def test_a_multi_model_report_refuses_latency_options(tmp_path, capsys):
    """Several models' report has no latency: the options fail before any table is read."""
    argv = ["report", "--outcomes", f"a={tmp_path / 'a.jsonl'}", "--outcomes", f"b={tmp_path / 'b.jsonl'}",
            "--policy", str(tmp_path / "pol"), "--out", str(tmp_path / "rep")]
    for extra in (["--wave-overhead", "0.5"], ["--decode-speed", "40"]):
        assert main([*argv, *extra]) == 2
        assert "a multi-model report has no latency; drop --wave-overhead and --decode-speed" in capsys.readouterr().err
    assert not (tmp_path / "rep").exists()
