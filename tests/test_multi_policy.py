"""The multi-model policy: ``fit``, ``solve`` and ``report`` with ``--outcomes NAME=TABLE`` on two small
synthetic models and on the tiny world's two real tiny models; the Decision's ``model_actions``, the
model pin and the artifact round trip; the menu pruning and the single-model rule; and the errors."""

import json
import re

import numpy as np
import pytest

from isocompute.cli import main
from isocompute.errors import InputError
from isocompute.policy.loading import load_policy
from isocompute.policy.multi.menu import hull_columns, prune_menu
from isocompute.policy.multi.policy import SINGLE_MODEL, ActionView, MultiPolicy, single_model_choice
from isocompute.policy.policy import Policy
from isocompute.solver.models.actions import parse_action

N = 48


def write_table(path, *, seed, skill, tokens, n=N, k=8, drop=None):
    """n arith-like prompts × k samples; prompt i's difficulty is shared by both models (seed 123), the
    model's ``skill`` scales its accuracy; one wrong answer in three from a fixed pool (split votes)."""
    rng = np.random.default_rng(seed)
    diff = np.random.default_rng(123).uniform(0, 1, n)
    with path.open("w") as f:
        for i in range(n):
            if i == drop:
                continue
            p = float(np.clip((1 - diff[i]) * skill + 0.1, 0.05, 0.95))
            samples = [{"answer": str(i) if ok else str(int(rng.integers(100, 103))), "correct": ok,
                        "completion_tokens": int(rng.integers(tokens // 2, 2 * tokens))}
                       for ok in (rng.random(k) < p).tolist()]
            f.write(json.dumps({"id": f"q{i}", "prompt": f"what is {i} {'hard ' * int(diff[i] * 5)}?", "gold": str(i),
                                "samples": samples, "meta": {"task": "arith", "answer_kind": "number"}}) + "\n")
    return path


def without_actions(args):
    """``report`` reads the menu's --actions from the policy."""
    i = args.index("--actions")
    return args[:i] + args[i + 2:]


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("two_models")
    small = write_table(root / "small.jsonl", seed=1, skill=0.6, tokens=40)
    large = write_table(root / "large.jsonl", seed=2, skill=0.9, tokens=80)
    args = ["--outcomes", f"small={small}", "--outcomes", f"large={large}", "--model-params", "small=1e8",
            "--model-params", "large=1e9", "--actions", "1,2,4,8", "--orders", "50"]
    return root, args


@pytest.fixture(scope="module")
def fitted(two_models):
    root, args = two_models
    out = root / "policy"
    assert main(["fit", *args, "--out", str(out), "--max-actions", "20"]) == 0
    return out


def test_fit_writes_a_multi_model_policy_that_loads_back(fitted, two_models):
    policy = load_policy(fitted)
    assert isinstance(policy, MultiPolicy) and policy.models == ("small", "large")
    meta = json.loads((fitted / "policy.json").read_text())
    assert meta["plans"] == [a.name for a in policy.model_actions] == list(policy.config.model_actions)
    assert [parse_action(n) for n in meta["plans"]] == list(policy.model_actions)
    assert 4 <= len(policy.plans) <= 24 and meta["training_data"]["menu_actions"] > 100
    lo, hi = policy.budget_range
    prompts = ["what is 3 hard hard ?", "what is 7 ?", "what is 11 hard ?"]
    for b in np.geomspace(lo, hi, 6):
        d = policy.decide(prompts, b)
        assert d.plans == () and len(d.model_actions) == 3 and d.cost_unit == "flops"
        assert [a.name for a in d.model_actions] == [policy.model_actions[j].name for j in d.action_index]
        assert d.k.tolist() == [sum(a.max_samples.values()) for a in d.model_actions]
        assert d.rule in ("learned", "fixed_plan", SINGLE_MODEL)
        if d.rule == SINGLE_MODEL:  # the best single model's fixed plan: every prompt on one model
            assert len({a.models for a in d.model_actions}) == 1
        again = load_policy(fitted).decide(prompts, b)
        assert [a.name for a in again.model_actions] == [a.name for a in d.model_actions]


def test_model_pin_restricts_every_stage_to_that_model(fitted):
    policy = load_policy(fitted)
    lo, hi = policy.budget_range
    for model in policy.models:
        for b in (lo, np.sqrt(lo * hi), hi):
            d = policy.decide(["what is 5 ?", "what is 9 hard ?"], b, model=model)
            assert d.rule == SINGLE_MODEL and all(a.models == (model,) for a in d.model_actions)
            assert model in d.rule_evidence["why"]
    with pytest.raises(InputError, match=r"unknown model 'nope'; this policy serves small, large"):
        policy.decide(["x"], lo, model="nope")


def test_a_single_model_policy_names_no_models_and_refuses_a_pin(two_models):
    from isocompute.solver.outcomes import read_outcomes

    table = read_outcomes(two_models[0] / "small.jsonl")
    policy = Policy(actions=(1, 2, 4, 8), budget_range=(1.0, 8.0), learner="classifier", n_rounds=5).fit(table)
    assert policy.models == ()
    with pytest.raises(InputError, match="cannot be pinned"):
        policy.decide(["a"], 2.0, model="small")


def test_solve_names_the_oracle_action_per_prompt(two_models, capsys):
    root, args = two_models
    out = root / "solution"
    assert main(["solve", *args, "--budget", "1e11", "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["mean_cost"] <= 1e11 * (1 + 1e-9) and summary["models"] == ["small", "large"]
    assert abs(sum(summary["kind_share"].values()) - 1) < 1e-9
    rows = [json.loads(line) for line in (out / "solution.jsonl").read_text().splitlines()]
    assert len(rows) == N and all(parse_action(r["action"]).name == r["action"] for r in rows)
    assert np.mean([r["cost"] for r in rows]) == pytest.approx(summary["mean_cost"], rel=1e-9)


def test_report_scores_every_method_and_model(fitted, two_models):
    root, args = two_models
    out = root / "report"
    assert main(["report", *without_actions(args), "--policy", str(fitted), "--out", str(out), "--folds", "3", "--seeds", "1",
                 "--n-budgets", "4", "--bootstrap", "200"]) == 0
    rep = json.loads((out / "report.json").read_text())
    assert (out / "accuracy_flops.png").stat().st_size > 0 and "Several models" in (out / "report.md").read_text()
    assert len(rep["budgets"]) == 4 and {r["model"] for r in rep["reach"]} == {"small", "large"}
    for e in rep["budgets"]:
        m = e["methods"]
        assert {"oracle", "learned", "best_single", "fixed_cascade", "uniform small", "uniform large"} <= set(m)
        assert m["oracle"]["accuracy"] >= max(x["accuracy"] for k, x in m.items()
                                              if x is not None and k.startswith("uniform")) - 1e-9
        assert abs(sum(m["learned"]["rules"].values()) - 1) < 1e-9
        lo, hi = e["gain_vs_best_single"]["ci95"]
        assert lo <= e["gain_vs_best_single"]["relative"] <= hi + 1e-12


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--outcomes", "small=MISSING"], r"missing from some table.*small lacks 1"),
        (["--model-params", "huge=1e9"], r"no --outcomes names; the models are small, large"),
        (["--positional"], "either one outcome table"),
        (["--no-params"], r"model large has no cost.*--model-params large=ACTIVE_PARAMS"),
        (["--one"], "at least twice"),
    ],
)
def test_errors_say_what_to_fix(two_models, tmp_path, capsys, extra, match):
    root, args = two_models
    args = list(args)
    if extra[0] == "--outcomes":
        short = write_table(tmp_path / "short.jsonl", seed=1, skill=0.6, tokens=40, drop=5)
        args[1] = f"small={short}"
    elif extra == ["--positional"]:
        args = [str(root / "small.jsonl"), *args]
    elif extra == ["--no-params"]:
        i = args.index("large=1e9")
        args = args[:i - 1] + args[i + 1:]
    elif extra == ["--one"]:
        args = args[:2] + ["--model-params", "small=1e8"]
    else:
        args += extra
    out = tmp_path / "p"
    assert main(["fit", *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert re.search(match, err, re.S), err
    assert not out.exists()


def test_hull_and_pruning_worked_example():
    # module docstring: a (1, 0.5), b (2, 0.6), c (2, 0.55), d (4, 0.6) → hull a, b
    assert hull_columns(np.array([0.5, 0.6, 0.55, 0.6]), np.array([1.0, 2.0, 2.0, 4.0])).tolist() == [0, 1]
    # a point below the chord between its neighbours is not a vertex
    assert hull_columns(np.array([0.0, 0.4, 1.0]), np.array([0.0, 1.0, 2.0])).tolist() == [0, 2]
    assert hull_columns(np.array([0.0, 0.6, 1.0]), np.array([0.0, 1.0, 2.0])).tolist() == [0, 1, 2]


def test_single_model_choice_is_each_models_best_fixed_plan():
    U = np.array([[0.5, 0.7, 0.6, 0.9], [0.5, 0.7, 0.6, 0.9]])
    C = np.array([[1.0, 2.0, 10.0, 20.0], [1.0, 2.0, 10.0, 20.0]])
    cols = {"A": np.array([0, 1]), "B": np.array([2, 3])}
    m, ch = single_model_choice(U, C, cols, 2.0)
    assert m == "A" and (ch.lo, ch.hi) == (1, 1)  # B's cheapest plan costs 10: no candidate at 2
    m, ch = single_model_choice(U, C, cols, 15.0)
    assert m == "B" and {ch.lo, ch.hi} == {2, 3} and ch.mix == pytest.approx(0.5)
    m, ch = single_model_choice(U, C, cols, 0.5)  # below everything: the cheapest model's cheapest plan
    assert m == "A" and (ch.lo, ch.hi, ch.mix) == (0, 0, 0.0)


def test_action_view_counts_stages():
    v = ActionView(parse_action("small/none@2 + large/none@4 [w=1,2]"))
    assert (v.max_samples, v.n_waves, v.waves[0]) == (6, 2, 6)  # an ensemble always draws everything
    v = ActionView(parse_action("small/lead:m=2@1x4 > large/none@2"))
    assert (v.max_samples, v.n_waves, v.waves[0]) == (6, 5, 1)


def test_prune_keeps_the_hull_and_each_models_plans(two_models):
    from isocompute.solver.outcomes import read_outcomes
    from isocompute.stages.inputs import menu_config, model_estimates

    root, _ = two_models
    me = model_estimates({n: read_outcomes(root / f"{n}.jsonl") for n in ("small", "large")},
                         params={"small": 1e8, "large": 1e9}, menu=menu_config(None, (1, 2, 4, 8), 50))
    est = me.estimates
    keep = prune_menu(est, me.models, max_actions=12)
    u, c = est.utility.mean(axis=0), est.cost.mean(axis=0)
    assert set(hull_columns(u, c).tolist()) <= set(keep.tolist())
    for m in me.models:
        assert any(est.actions[j].models == (m,) for j in keep)
        assert {f"{m}/none@{k}" for k in (1, 2, 4, 8)} <= {est.actions[j].name for j in keep}


@pytest.mark.slow
def test_tiny_world_fit_and_report(tiny_world, tmp_path):
    """The issue's CI-sized tiny world: two real tiny models (FLOPs from their own configs, via the tables'
    meta), fitted and reported with the same commands as the MATH-500 bench."""
    args = []
    for name, (_, path) in tiny_world.items():
        args += ["--outcomes", f"{name}={path}"]
    args += ["--actions", "1,2,4,8", "--orders", "50"]
    pol = tmp_path / "policy"
    assert main(["fit", *args, "--out", str(pol), "--max-actions", "16"]) == 0
    policy = load_policy(pol)
    assert policy.models == ("tiny-s", "tiny-l")
    out = tmp_path / "report"
    assert main(["report", *without_actions(args), "--policy", str(pol), "--out", str(out), "--folds", "4", "--seeds", "1",
                 "--n-budgets", "3", "--bootstrap", "200"]) == 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["models"] == ["tiny-s", "tiny-l"] and not rep["completion_only"]
    assert all(e["methods"]["learned"]["cost"] > 0 for e in rep["budgets"])


def test_escalate_gives_the_dearer_action_to_the_prompts_the_score_ranks_first():
    from isocompute.policy.learn.crossfit import crossfit_folds
    from isocompute.policy.multi.escalate import HeadroomScore
    from isocompute.policy.plans.fixed import FixedPlanChoice

    rng = np.random.default_rng(0)
    n = 300
    hard = rng.random(n) < 0.3  # the dearer action helps exactly the hard prompts, which the feature shows
    X = np.column_stack([hard + 0.1 * rng.standard_normal(n), rng.standard_normal(n)])
    U = np.column_stack([np.where(hard, 0.2, 1.0), np.ones(n)])
    C = np.column_stack([np.ones(n), np.full(n, 3.0)])
    folds = crossfit_folds(n, 3, 0)
    score = HeadroomScore(n_rounds=20, min_data_in_leaf=5).fit(X, U, C, folds, rng.random(n))
    assert (score.base_, score.top_) == (0, 1)
    budgets = [1.0, 1.6, 2.0, 3.0]
    esc = score.oof_scores(U, C, folds, budgets)
    from isocompute.policy.plans.fixed_rule import fixed_plan_scores

    fixed = fixed_plan_scores(U, C, folds, budgets)
    assert esc[0].mean() == pytest.approx(fixed[0].mean())  # no mix at the cheapest budget: the same action
    assert esc[1].mean() > fixed[1].mean() + 0.1  # a share 0.3 of the dearer action, on the hard prompts
    assert esc[3].mean() == pytest.approx(1.0)
    choice = FixedPlanChoice(0, 1, 0.3, 1.6, 1.6, 0.0)
    g = np.array([0.9, 0.1, 0.5])
    assert HeadroomScore.actions(g, choice, 0.4).tolist() == [1, 0, 1]
    assert HeadroomScore.actions(g, FixedPlanChoice(1, 1, 0.0, 3, 3, 1), 0.4).tolist() == [1, 1, 1]


def test_the_gateway_adapter_serves_a_multi_model_policy(fitted):
    from isocompute.app.serving_policy import FittedPolicy, ServingPolicy, as_serving_policy

    sp = as_serving_policy(load_policy(fitted))
    assert isinstance(sp, FittedPolicy) and isinstance(sp, ServingPolicy)
    assert sp.models == ("small", "large") and sp.cost_unit == "flops"
    lo, hi = sp.budget_range
    d = sp.decide(["what is 4 ?", "what is 8 hard ?"], np.sqrt(lo * hi), model="small")
    assert all(a.models == ("small",) for a in d.model_actions) and d.plans == ()


def test_a_fitted_multi_model_policy_serves_end_to_end_on_the_tiny_world(tiny_world, tmp_path):
    """The README's loop on the tiny world: ``fit --outcomes tiny-s=… --outcomes tiny-l=…``, then the gateway
    with an in-process pool per model (``serve --policy P --model tiny-s=DIR --model tiny-l=DIR``) runs the
    policy's chosen action; the stages it reports are on the policy's models, ``usage.flops`` sums them, and
    a request's ``model`` pins one model."""
    from fastapi.testclient import TestClient

    from isocompute.app.main import create_app
    from isocompute.app.settings import Settings

    args = []
    for name, (_, path) in tiny_world.items():
        args += ["--outcomes", f"{name}={path}"]
    pol = tmp_path / "policy"
    assert main(["fit", *args, "--actions", "1,2,4", "--orders", "50", "--out", str(pol), "--max-actions", "12"]) == 0
    policy = load_policy(pol)
    lo, hi = policy.budget_range
    dirs = {name: d for name, (d, _) in tiny_world.items()}
    s = Settings(engine="transformers", model_dirs=dirs, policy_dir=pol, default_max_tokens=4, max_tokens_limit=8,
                 upstream_timeout_s=60, ready_probe_timeout_s=30)
    chat = {"max_tokens": 4, "temperature": 1.0, "seed": 3, "budget": float(np.sqrt(lo * hi)), "budget_unit": "flops",
            "messages": [{"role": "user", "content": "What is 2 + 3?"}]}
    with TestClient(create_app(s)) as c:
        r = c.post("/v1/chat/completions", json={"model": "isocompute", **chat})
        pinned = c.post("/v1/chat/completions", json={"model": "tiny-l", **chat})
        unknown = c.post("/v1/chat/completions", json={"model": "tiny-xl", **chat})
    assert r.status_code == 200, r.text
    info, usage = r.json()["isocompute"], r.json()["usage"]
    action = parse_action(info["model_action"])
    assert info["stages"] and [st["model"] for st in info["stages"]] == list(action.models)[:len(info["stages"])]
    assert set(action.models) <= {"tiny-s", "tiny-l"}
    assert usage["flops"] == pytest.approx(sum(st["flops"] for st in info["stages"]))
    assert sum(st["samples"] for st in info["stages"]) >= 1
    assert pinned.status_code == 200, pinned.text
    assert {st["model"] for st in pinned.json()["isocompute"]["stages"]} == {"tiny-l"}
    assert unknown.status_code == 400 and "tiny-s" in unknown.text and "tiny-l" in unknown.text
