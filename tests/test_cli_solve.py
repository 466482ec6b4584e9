"""``isocompute solve`` end to end on a small synthetic outcome table: the artifact, its numbers checked
against scipy's LP, the frontier files, the JSON summary (also through the installed console script),
and the error table (exit 2, a message with the fix, nothing written)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import linprog

from isocompute.artifacts import load_manifest, sha256_file
from isocompute.cli import main
from isocompute.stages.parsing import parse_actions, parse_budgets

N_PROMPTS, N_SAMPLES = 40, 16
QWEN_TINY = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 64,
             "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": 512, "tie_word_embeddings": True}


@pytest.fixture
def table(tmp_path):
    """Prompts of varied difficulty: the right answer "42" with probability p, else one of 3 wrong ones."""
    rng = np.random.default_rng(0)
    path = tmp_path / "outcomes.jsonl"
    with path.open("w") as f:
        for i in range(N_PROMPTS):
            p = rng.beta(0.7, 0.7)
            samples = []
            for _ in range(N_SAMPLES):
                ok = bool(rng.random() < p)
                samples.append({"answer": "42" if ok else str(rng.integers(0, 3)), "correct": ok,
                                "completion_tokens": int(rng.integers(20, 200))})
            f.write(json.dumps({"id": f"q{i}", "prompt": f"question {i}", "gold": "42",
                                "prompt_tokens": int(rng.integers(10, 60)), "samples": samples}) + "\n")
    return path


def lp_value(U, C, budget):
    """LP optimum by HiGHS, posed in sums with O(1) costs (mean-form coefficients U/N can fall below
    HiGHS's 1e-7 dual tolerance)."""
    n, a = U.shape
    scale = max(float(np.abs(C).max()), 1e-12)
    res = linprog(-U.ravel(), A_ub=C.ravel()[None] / scale, b_ub=[n * budget / scale],
                  A_eq=np.kron(np.eye(n), np.ones(a)), b_eq=np.ones(n), bounds=(0, 1), method="highs")
    assert res.status == 0, res.message
    return -res.fun / n


def read_solution(out):
    return [json.loads(line) for line in (out / "solution.jsonl").read_text().splitlines()]


def test_writes_a_verified_solution_artifact(table, tmp_path, capsys):
    out = tmp_path / "sol"
    assert main(["solve", str(table), "--actions", "1,2,4,8,16", "--strategy", "majority", "--budget", "4",
                 "--plans", "none", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "λ*" in printed and "uniform k" in printed

    manifest = load_manifest(out, kind="solution", schema_version=1)
    assert manifest["inputs"]["outcomes"] == sha256_file(table)
    assert manifest["params"]["budget"] == 4 and manifest["params"]["actions"] == [1, 2, 4, 8, 16]
    summary = json.loads((out / "summary.json").read_text())
    rows = read_solution(out)
    assert [r["id"] for r in rows] == [f"q{i}" for i in range(N_PROMPTS)]

    U = np.array([r["utilities"] for r in rows])
    C = np.array([r["costs"] for r in rows])
    assert (C == [1, 2, 4, 8, 16]).all()
    # expected cost and utility recomputed from the per-prompt lines: the budget, and the LP optimum
    exp_cost = sum(r["p"] * r["k"] + r.get("p_hi", 0) * r.get("k_hi", 0) for r in rows) / N_PROMPTS
    exp_util = sum(r["p"] * r["utilities"][r["action"]] + r.get("p_hi", 0) * r["utilities"][r.get("action_hi", 0)]
                   for r in rows) / N_PROMPTS
    assert exp_cost == pytest.approx(4.0, rel=1e-9) and summary["mean_cost"] == pytest.approx(4.0, rel=1e-9)
    assert exp_util == pytest.approx(summary["mean_utility"], rel=1e-9)
    assert summary["mean_utility"] == pytest.approx(lp_value(U, C, 4.0), rel=1e-9)
    assert all(r["k"] == [1, 2, 4, 8, 16][r["action"]] for r in rows)
    assert summary["n_mixed"] == sum("k_hi" in r for r in rows)
    assert sum(summary["k_share"].values()) == pytest.approx(1.0)
    uniform4 = next(u for u in summary["uniform"] if u["k"] == 4)
    assert uniform4["mean_utility"] == pytest.approx(U[:, 2].mean())
    assert summary["mean_utility"] >= uniform4["mean_utility"]  # the oracle beats uniform k at equal cost


def test_plans_solution_is_the_lp_optimum_over_plan_columns(table, tmp_path, capsys):
    """The default: plans as actions. Adaptive plans' costs differ per prompt, the solver takes each
    prompt's columns in its own cost order, and the answer is still the LP optimum (HiGHS)."""
    from isocompute.solver.plans.plan import parse_plan

    out = tmp_path / "sol"
    assert main(["solve", str(table), "--budget", "3", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "plans (" in printed and "expected samples / waves" in printed
    summary = json.loads((out / "summary.json").read_text())
    rows = read_solution(out)
    U = np.array([r["utilities"] for r in rows])
    C = np.array([r["costs"] for r in rows])
    names = summary["plans"]
    assert U.shape == (N_PROMPTS, len(names)) and len(names) > 30 and "lead:m=2@1x16" in names
    assert not (np.diff(C, axis=1) >= 0).all()  # some prompt's columns are not in cost order
    assert summary["mean_utility"] == pytest.approx(lp_value(U, C, 3.0), rel=1e-9)
    exp_cost = sum(r["p"] * C[i, r["action"]] + r.get("p_hi", 0) * C[i, r.get("action_hi", 0)]
                   for i, r in enumerate(rows)) / N_PROMPTS
    assert exp_cost == pytest.approx(3.0, rel=1e-9)
    for r in rows:
        assert r["plan"] == names[r["action"]] and r["k"] == parse_plan(r["plan"]).max_samples
    assert sum(summary["plan_share"].values()) == pytest.approx(1.0)
    assert 1.0 <= summary["expected_waves"] <= summary["expected_samples"] == pytest.approx(3.0, rel=1e-9)
    uniform4 = next(u for u in summary["uniform"] if u["k"] == 4)
    assert uniform4["plan"] == "none@4" and uniform4["mean_cost"] == pytest.approx(4.0)


def test_json_frontier_and_plot(table, tmp_path, capsys):
    out = tmp_path / "sol"
    assert main(["solve", str(table), "--budget", "4", "--budgets", "1:16:0.5", "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert {"budget", "lambda", "mean_cost", "mean_utility", "n_prompts"} <= set(summary)
    assert summary["n_prompts"] == N_PROMPTS and summary["budget"] == 4.0

    front = json.loads((out / "frontier.json").read_text())
    assert front["budgets"] == [1 + 0.5 * i for i in range(31)]
    util = np.array(front["utility"])
    assert (np.diff(util) >= -1e-12).all()
    assert util[front["budgets"].index(4.0)] == pytest.approx(summary["mean_utility"], rel=1e-9)
    assert front["lambda"][front["budgets"].index(4.0)] == pytest.approx(summary["lambda"], rel=1e-9)
    bp = front["breakpoints"]
    assert bp["cost"][0] == pytest.approx(1.0) and len(bp["cost"]) == len(bp["utility"]) == len(bp["lambda"])
    assert [u["k"] for u in front["uniform"]] == [1, 2, 4, 8, 16]
    assert (out / "frontier.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "frontier.png" in load_manifest(out, kind="solution", schema_version=1)["files"]


def test_flops_costs_with_model_config(table, tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(QWEN_TINY))
    out = tmp_path / "sol"
    args = ["solve", str(table), "--actions", "1,4,16", "--strategy", "pass", "--cost-unit", "flops",
            "--model-config", str(config), "--out", str(out), "--json"]
    assert main(args + ["--budget", "1e15"]) == 2  # far outside: the error names the range in FLOPs
    err = capsys.readouterr().err
    lo, hi = (float(x) for x in err.split("feasible range [")[1].split("]")[0].split(", "))
    assert 0 < lo < hi < 1e15 and not out.exists()

    budget = (lo + hi) / 3
    assert main(args + ["--budget", repr(budget)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["mean_cost"] == pytest.approx(budget, rel=1e-9)
    assert summary["feasible_range"] == pytest.approx([lo, hi], rel=1e-5)
    manifest = load_manifest(out, kind="solution", schema_version=1)
    assert manifest["inputs"]["model_config"] == sha256_file(config)
    rows = read_solution(out)
    costs = np.array([r["costs"] for r in rows])
    assert (np.diff(costs, axis=1) > 0).all() and (costs[:, 2] > 4 * costs[:, 1] * 0.9).all()


def test_flops_model_config_from_the_table_meta(table, tmp_path, capsys):
    """`isocompute sample` stores the model's config.json in every line's meta; solve uses it by default."""
    with_meta = tmp_path / "with_meta.jsonl"
    lines = [json.loads(line) for line in table.read_text().splitlines()]
    with_meta.write_text("".join(json.dumps({**r, "meta": {"model_config": QWEN_TINY}}) + "\n" for r in lines))
    config = tmp_path / "config.json"
    config.write_text(json.dumps(QWEN_TINY))
    base = ["solve", "--actions", "1,4", "--cost-unit", "flops", "--json"]
    assert main([*base, str(with_meta), "--budget", "1", "--out", str(tmp_path / "a")]) == 2  # 1 FLOP: too low
    budget = repr(2 * float(capsys.readouterr().err.split("feasible range [")[1].split(",")[0]))
    assert main([*base, str(with_meta), "--budget", budget, "--out", str(tmp_path / "a")]) == 0
    from_meta = json.loads(capsys.readouterr().out)
    assert main([*base, str(table), "--budget", budget, "--model-config", str(config),
                 "--out", str(tmp_path / "b")]) == 0
    from_flag = json.loads(capsys.readouterr().out)
    assert from_meta["feasible_range"] == from_flag["feasible_range"]
    assert from_meta["mean_utility"] == from_flag["mean_utility"]


def test_deterministic_rounding_stays_within_budget(table, tmp_path, capsys):
    out = tmp_path / "sol"
    assert main(["solve", str(table), "--budget", "3.3", "--rounding", "deterministic", "--out", str(out),
                 "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    rows = read_solution(out)
    assert not any("k_hi" in r for r in rows) and summary["n_mixed"] == 0
    # plans (the default): a prompt's cost is its chosen plan's expected samples, not k
    assert sum(r["costs"][r["action"]] for r in rows) / N_PROMPTS == pytest.approx(summary["mean_cost"])
    assert summary["mean_cost"] <= 3.3 and summary["mean_utility"] <= summary["lp_utility"]
    assert main(["solve", str(table), "--budget", "3.3", "--rounding", "deterministic", "--plans", "none",
                 "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    rows = read_solution(out)
    assert sum(r["k"] for r in rows) / N_PROMPTS == pytest.approx(summary["mean_cost"])
    assert summary["mean_cost"] <= 3.3 and summary["mean_utility"] <= summary["lp_utility"]


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--actions", "1,4,32", "--budget", "4"], r"action k=32 is infeasible.*only 16 samples"),
        (["--budget", "20"], r"budget 20 is outside the feasible range \[1, 16\]"),
        (["--budget", "0.5"], r"budget 0.5 is outside the feasible range \[1, 16\]"),
        (["--budget", "4", "--budgets", "1:32:1"], r"budget 17 is outside the feasible range \[1, 16\]"),
        (["--actions", "1,two", "--budget", "4"], "comma list of sample counts"),
        (["--actions", "0,2", "--budget", "1"], "k ≥ 1"),
        (["--budget", "4", "--budgets", "4:1:1"], "start:stop:step"),
        (["--budget", "4", "--cost-unit", "flops"], "pass --model-config PATH"),
        (["--budget", "4", "--model-config", "x.json"], "only matters with --cost-unit flops"),
        (["--budget", "4", "--strategy", "best_of"], "needs a verifier score"),
    ],
)
def test_errors_say_what_is_wrong_and_write_nothing(table, tmp_path, capsys, args, match):
    out = tmp_path / "sol"
    assert main(["solve", str(table), "--out", str(out), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("isocompute solve: error:")
    assert re.search(match, err), err
    assert not out.exists() and not list(tmp_path.glob(".sol*"))


def test_failed_rerun_keeps_the_previous_artifact(table, tmp_path, capsys):
    out = tmp_path / "sol"
    assert main(["solve", str(table), "--budget", "4", "--out", str(out)]) == 0
    before = (out / "summary.json").read_text()
    assert main(["solve", str(table), "--budget", "99", "--out", str(out)]) == 2
    assert (out / "summary.json").read_text() == before
    load_manifest(out, kind="solution", schema_version=1)


def test_missing_table(tmp_path, capsys):
    assert main(["solve", str(tmp_path / "nope.jsonl"), "--budget", "4", "--out", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.slow  # a fresh interpreter: seconds of imports on a loaded 2-core machine
def test_installed_console_script(table, tmp_path):
    exe = Path(sys.executable).parent / "isocompute"
    if not exe.exists():
        pytest.skip("the isocompute console script is not installed in this environment")
    proc = subprocess.run([str(exe), "solve", str(table), "--actions", "1,2,4,8,16", "--strategy", "majority",
                           "--budget", "4", "--out", str(tmp_path / "sol"), "--json"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["budget"] == 4.0 and summary["n_prompts"] == N_PROMPTS
    assert summary["mean_cost"] == pytest.approx(4.0, rel=1e-9) and summary["lambda"] > 0


@pytest.mark.parametrize(
    ("text", "expect"),
    [("1:2:0.5", [1.0, 1.5, 2.0]), ("1:16:0.5", [1 + 0.5 * i for i in range(31)]), ("4,1,2", [4.0, 1.0, 2.0]),
     ("0.1:0.3:0.1", [0.1, 0.2, 0.30000000000000004])],
)
def test_parse_budgets(text, expect):
    assert parse_budgets(text) == pytest.approx(expect)


def test_parse_actions_sorts_and_dedupes():
    assert parse_actions("8, 1,2,2,4") == [1, 2, 4, 8]
