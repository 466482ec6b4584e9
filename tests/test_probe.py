"""The probe feature end to end: entropy of a greedy answer on the real tiny model (against a hand
computation from its logits), its FLOP cost, the policy with a probe column (cost added to every action,
calibration, errors, artifact round trip), cross-validation, and the gateway's accounting of the call.

The vllm-http probe is checked against a small in-memory OpenAI server (httpx.MockTransport) answering
with known top-k log-probabilities: it tests the parsing and the top-k estimate, not vLLM itself.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import numpy as np
import pytest

from isocompute.engines.probe import (
    ProbeResult,
    entropy_from_logits,
    probe_cost,
    probe_entropy,
    probe_flops,
    topk_entropy,
)
from isocompute.engines.transformers_engine import apply_chat_template
from isocompute.errors import BudgetError, EngineUnavailable, InputError
from isocompute.flops import ModelFlops, decode_flops, prefill_flops, request_flops
from isocompute.policy.policy import Policy, PolicyConfig, ProbeSpec
from isocompute.policy.synthetic import synthetic_records
from isocompute.solver.estimators import utilities
from isocompute.solver.outcomes import from_records

ACTIONS = (1, 2, 4, 8)
# fallback=(): these tests exercise the learned rule itself (the never-worse chain: test_policy_fallback.py)
SMALL = dict(actions=ACTIONS, n_rounds=10, n_budget_grid=17, calibration_folds=2, n_components=4, fallback=())
COST = 0.5  # declared probe cost in samples


@pytest.fixture(scope="module")
def table():
    return from_records(synthetic_records(160, 8, seed=0, noise=0.3))


@pytest.fixture(scope="module")
def probe_values(engine, table):
    texts = [apply_chat_template(engine.tokenizer, p) for p in table.prompts]
    return asyncio.run(probe_entropy(engine, texts, 4)).values


@pytest.fixture(scope="module")
def policy(table, probe_values):
    spec = ProbeSpec(max_tokens=4, cost=COST, prompt_format="chat", model="tiny")
    cfg = PolicyConfig(**SMALL, budget_range=(1.0 + COST, 8.0), learner="utility", probe=spec)
    return Policy(cfg).fit(table, probe=probe_values)


# ------------------------------------------------------------------------------------------------ maths


def test_entropy_worked_example_and_top_k():
    # uniform over 4 (log 4) and one-hot (0): mean 0.693 nats, the module docstring's example
    h = entropy_from_logits(np.array([[0.0, 0.0, 0.0, 0.0], [0.0, -np.inf, -np.inf, -np.inf]]))
    assert h == pytest.approx([np.log(4), 0.0])
    assert h.mean() == pytest.approx(0.6931, abs=1e-4)
    # top-k renormalised: q = (2/3, 1/3) from p = (1/2, 1/4); all of the vocabulary → exact
    assert topk_entropy(np.log([0.5, 0.25])) == pytest.approx(-(2 / 3) * np.log(2 / 3) - (1 / 3) * np.log(1 / 3))
    z = np.random.default_rng(0).normal(size=50)
    logp = z - np.log(np.exp(z).sum())
    assert topk_entropy(logp) == pytest.approx(float(entropy_from_logits(z)))
    assert topk_entropy(np.sort(logp)[-1:]) == 0.0


def test_probe_cost_hand_worked():
    toy = ModelFlops(10, 0, 1, 1, 10)  # body 10, no head, 1 layer, d_attn 1
    # probe m = 3 after p = 5: prefill 2·10·5 + 4·25 = 200, decode 2·10·2 + 4·(2·5 + 3) = 92
    assert probe_flops(toy, [5], [3]).tolist() == [292.0]
    # one sample of m̄ = 9: 200 + 2·10·8 + 4·(8·5 + 36) = 664 → 292 / 664 samples
    assert probe_cost(toy, [5], [3], unit="samples", mean_completion_tokens=[9]) == pytest.approx(292 / 664)
    assert probe_cost(toy, [5, 7], [3, 3], unit="flops") == pytest.approx(
        float(np.mean(prefill_flops(toy, np.array([5, 7])) + decode_flops(toy, np.array([5, 7]), 3))))
    # a probe as long as the samples costs exactly one sample
    assert probe_cost(toy, [5, 9], [4, 6], unit="samples", mean_completion_tokens=[4, 6]) == pytest.approx(1.0)


# ---------------------------------------------------------------------------------------------- engines


def test_greedy_entropy_equals_hand_computation_from_logits(engine):
    """Two greedy tokens by plain forward passes (no generate, no KV cache): H̄ = (H(p_1) + H(p_2)) / 2."""
    import torch

    prompt = apply_chat_template(engine.tokenizer, "What is 12 + 30?")
    ids = engine.tokenizer(prompt, return_tensors="pt")["input_ids"]
    hs = []
    with torch.inference_mode():
        for _ in range(2):
            logp = torch.log_softmax(engine.model(ids).logits[0, -1].double(), dim=-1)
            hs.append(float(-(logp.exp() * logp).sum()))
            nxt = int(logp.argmax())
            if nxt in engine.eos_ids:
                break
            ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    res = asyncio.run(probe_entropy(engine, [prompt], max_tokens=2))
    assert res.method == "exact"
    assert res.completion_tokens.tolist() == [len(hs)]
    assert res.prompt_tokens.tolist() == [int(engine.tokenizer(prompt, return_tensors="pt")["input_ids"].shape[1])]
    assert res.values[0] == pytest.approx(np.mean(hs), rel=1e-4)


def test_probe_is_per_prompt_in_a_padded_batch(engine):
    prompts = [apply_chat_template(engine.tokenizer, p) for p in ("1+1=", "What is 123 * 456 - 789?", "7 * 6")]
    batch = asyncio.run(probe_entropy(engine, prompts, 3))
    alone = ProbeResult.concat([asyncio.run(probe_entropy(engine, [p], 3)) for p in prompts])
    assert batch.values == pytest.approx(alone.values, rel=1e-4, abs=1e-6)
    assert batch.prompt_tokens.tolist() == alone.prompt_tokens.tolist()
    assert (batch.values >= 0).all() and (batch.values <= np.log(106) + 1e-9).all()


def test_vllm_http_probe_reads_top_logprobs():
    from isocompute.engines.vllm_http import VLLMHTTPEngine

    seen = []
    steps = [{"a": np.log(0.5), "b": np.log(0.25)}, {"c": 0.0}]  # H = 0.6365 (renormalised), 0

    async def server(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "tiny"}]})
        body = json.loads(request.content)
        seen.append(body)
        lp = {"tokens": ["a", "c"], "token_logprobs": [np.log(0.5), 0.0], "top_logprobs": steps}
        return httpx.Response(200, json={"choices": [{"index": 0, "text": "ac", "logprobs": lp}],
                                         "usage": {"prompt_tokens": 7, "completion_tokens": 2}})

    async def go():
        eng = VLLMHTTPEngine(["http://up:1"], transport=httpx.MockTransport(server))
        try:
            return await probe_entropy(eng, ["x", "y"], 2)
        finally:
            await eng.aclose()

    res = asyncio.run(go())
    assert res.method == "top20"
    assert res.values == pytest.approx([topk_entropy(list(steps[0].values())) / 2] * 2)
    assert res.completion_tokens.tolist() == [2, 2] and res.prompt_tokens.tolist() == [7, 7]
    assert all(b["logprobs"] == 20 and b["temperature"] == 0.0 and b["model"] == "tiny" for b in seen)


@pytest.mark.parametrize(
    ("engine_", "max_tokens", "error", "match"),
    [
        ("tf", 0, InputError, "max_tokens >= 1"),
        ("other", 4, EngineUnavailable, "cannot run the entropy probe; serve a probe policy with"),
    ],
)
def test_probe_engine_errors(engine, engine_, max_tokens, error, match):
    eng = engine if engine_ == "tf" else type("Fake", (), {"name": "fake"})()
    with pytest.raises(error, match=match):
        asyncio.run(probe_entropy(eng, ["1+1="], max_tokens))


# ----------------------------------------------------------------------------------------------- policy


def test_policy_with_probe_adds_its_cost_and_round_trips(policy, table, probe_values, tmp_path):
    assert policy.action_costs_ == pytest.approx(np.asarray(ACTIONS) + COST)
    assert policy.feature_names[-1] == "probe_greedy_entropy"
    assert policy.features(table.prompts, probe_values).shape[1] == len(policy.features_.feature_names_) + 1
    d = policy.decide(table.prompts, 4.0, probe=probe_values)
    assert d.probe_cost == COST
    assert d.costs == pytest.approx(d.k + COST)
    assert d.expected_cost == pytest.approx(d.k.mean() + COST)
    # matched on the batch, the spend including the probe is the budget, up to one prompt's step
    b = policy.decide(table.prompts, 4.0, probe=probe_values, match="batch")
    assert abs(b.expected_cost - 4.0) <= (ACTIONS[-1] - ACTIONS[0]) / len(table) + 1e-9

    policy.save(tmp_path / "pol", extra_files={"probe.json": b"{}"})
    meta = json.loads((tmp_path / "pol" / "policy.json").read_text())
    assert meta["probe"] == {"name": "greedy_entropy", "max_tokens": 4, "cost": COST, "prompt_format": "chat",
                             "model": "tiny", "flops": None}
    loaded = Policy.load(tmp_path / "pol")
    assert loaded.config == policy.config
    assert (tmp_path / "pol" / "probe.json").is_file()
    assert (loaded.decide(table.prompts, 4.0, probe=probe_values).k == d.k).all()


def test_an_informative_probe_column_drives_decisions(table):
    """The column reaches the learners: with a probe that knows each prompt's 1-sample accuracy, the
    trees split on it and shuffling its values changes the decisions."""
    signal = utilities(table, ACTIONS, "majority")[:, 0]
    pol = Policy(PolicyConfig(**SMALL, budget_range=(1.0 + COST, 8.0), learner="utility",
                              probe=ProbeSpec(cost=COST))).fit(table, probe=signal)
    used = [m.booster_.feature_importance("split")[len(pol.feature_names) - 1] for m in pol.learners_["utility"].models]
    assert min(used) > 0
    d = pol.decide(table.prompts, 4.0, probe=signal)
    shuffled = pol.decide(table.prompts, 4.0, probe=np.random.default_rng(0).permutation(signal))
    assert (shuffled.k != d.k).mean() > 0.1


def test_config_saved_before_the_probe_loads_without_one():
    d = PolicyConfig(**SMALL, budget_range=(1.0, 8.0)).to_dict()
    del d["probe"]
    assert PolicyConfig.from_dict(d).probe is None
    with_probe = PolicyConfig(**SMALL, budget_range=(1.5, 8.0), probe=ProbeSpec(cost=0.5))
    assert PolicyConfig.from_dict(json.loads(json.dumps(with_probe.to_dict()))) == with_probe


def _fit_without_probe(table, probe_values):
    return Policy(PolicyConfig(**SMALL, budget_range=(1.0 + COST, 8.0), probe=ProbeSpec(cost=COST))).fit(table)


def _range_ignores_probe(table, probe_values):
    cfg = PolicyConfig(**SMALL, budget_range=(1.0, 8.0), probe=ProbeSpec(cost=COST))
    return Policy(cfg).fit(table, probe=probe_values)


def _values_for_plain_policy(table, probe_values):
    return Policy(PolicyConfig(**SMALL, budget_range=(1.0, 8.0))).fit(table, probe=probe_values)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda pol, t, v: pol.decide(t.prompts, 4.0), InputError, "uses the probe feature 'greedy_entropy'"),
        (lambda pol, t, v: pol.decide(t.prompts, 4.0, probe=v[:-1]), InputError, r"one number per prompt, shape \(160,\)"),
        (lambda pol, t, v: pol.decide(t.prompts, 4.0, probe=np.where(np.arange(v.size) == 3, np.nan, v)), InputError,
         "must be finite"),
        (lambda pol, t, v: pol.decide(t.prompts, 1.2, probe=v), BudgetError, r"\[1\.5, 8\].*probe's 0\.5"),
        (lambda pol, t, v: _fit_without_probe(t, v), InputError, "pass probe= one value per prompt"),
        (lambda pol, t, v: _range_ignores_probe(t, v), BudgetError, r"\[1\.5, 8\.5\].*includes the probe's 0\.5"),
        (lambda pol, t, v: _values_for_plain_policy(t, v), InputError, "has no probe feature"),
        (lambda pol, t, v: ProbeSpec(max_tokens=0), InputError, "max_tokens must be an integer"),
        (lambda pol, t, v: ProbeSpec(cost=-1.0), InputError, "cost must be a finite number"),
        (lambda pol, t, v: ProbeSpec(name="logit_lens"), InputError, "unknown probe"),
        (lambda pol, t, v: ProbeSpec(prompt_format="raw"), InputError, "chat or plain"),
    ],
)
def test_probe_errors(policy, table, probe_values, call, error, match):
    with pytest.raises(error, match=match):
        call(policy, table, probe_values)


@pytest.mark.slow
def test_cross_validation_charges_the_learned_policy_only(table, probe_values):
    from isocompute.evaluation.evaluate import METHODS, cross_validate
    from isocompute.solver.costs import cost_table

    cfg = PolicyConfig(**SMALL, budget_range=(1.0 + COST, 8.0), learner="utility", probe=ProbeSpec(cost=COST))
    U = utilities(table, ACTIONS, "majority")
    C = cost_table(table.prompt_tokens, table.mean_completion_tokens, ACTIONS, unit="samples")
    ev = cross_validate(table.prompts, U, C, cfg, [4.0], folds=2, seeds=(0,), probe=probe_values)
    m = {name: j for j, name in enumerate(METHODS)}
    learned = ev.cost[0, m["learned"], 0]
    a = ev.learned_actions[0, 0]
    assert learned == pytest.approx(np.asarray(ACTIONS)[a] + COST)  # every prompt pays the probe
    assert ev.cost[0, m["uniform"], 0].mean() == pytest.approx(4.0)  # the baseline spends it all on samples
    assert ev.cost[0, m["learned_batch"], 0].mean() == pytest.approx(4.0, abs=(ACTIONS[-1] - 1) / 80 + 1e-9)
    with pytest.raises(InputError, match="exactly when the configuration has a probe"):
        cross_validate(table.prompts, U, C, cfg, [4.0], folds=2, seeds=(0,))


# ---------------------------------------------------------------------------------------------- gateway


@pytest.mark.slow
def test_gateway_counts_the_probe_in_the_request(tiny_dir, engine, policy, tmp_path):
    from fastapi.testclient import TestClient

    from isocompute.app.main import create_app
    from isocompute.app.settings import Settings
    from isocompute.flops import load_model_flops

    s = Settings(model_dir=tiny_dir, max_samples=8, default_max_tokens=4, max_tokens_limit=8,
                 upstream_timeout_s=60, ready_probe_timeout_s=5)
    question = "What is 47 + 385 * 6?"
    with TestClient(create_app(s, policy=policy, engine=engine)) as client:
        r = client.post("/v1/completions", json={"model": "isocompute", "prompt": question, "budget": 4, "max_tokens": 4, "seed": 1})
        assert r.status_code == 200, r.text
        route = client.post("/v1/route", json={"model": "isocompute", "prompt": question, "budget": 4})
        assert route.status_code == 200, route.text
        controllers = list(client.app.state.gateway.controllers._items.values())
    info = r.json()["isocompute"]
    shown = apply_chat_template(engine.tokenizer, question)
    expected = asyncio.run(probe_entropy(engine, [shown], 4))
    model = load_model_flops(tiny_dir)
    pf = float(probe_flops(model, expected.prompt_tokens, expected.completion_tokens)[0])
    assert info["probe"]["name"] == "greedy_entropy"
    assert info["probe"]["value"] == pytest.approx(float(expected.values[0]), rel=1e-5)
    assert info["probe"]["tokens"] == int(expected.completion_tokens[0])
    assert info["probe"]["cost"] == COST and info["probe"]["flops"] == pytest.approx(pf)
    k = info["k"]
    assert info["expected_cost"] == pytest.approx(k + COST)  # the decision priced the probe in
    assert route.json()["decisions"][0]["expected_cost"] == pytest.approx(route.json()["decisions"][0]["k"] + COST)
    # FLOPs: the k samples (one shared prefill) plus the probe call
    usage = r.json()["usage"]
    assert usage["flops"] == pytest.approx(info["flops"])
    if usage["completion_tokens"] == 4 * k:  # every sample ran to max_tokens (no early eos): known lengths
        assert info["flops"] == pytest.approx(request_flops(model, usage["prompt_tokens"], [4] * k) + pf, rel=1e-12)
    else:
        assert info["flops"] > pf + request_flops(model, usage["prompt_tokens"], [1] * k)
    # the budget controller was charged the k samples plus the probe (the dry run charges nothing)
    assert len(controllers) == 1 and controllers[0].state().requests == 1
    assert controllers[0].state().mean_cost == pytest.approx(k + COST)


# ------------------------------------------------------------------------------------------------ CLI


@pytest.mark.slow
def test_cli_fit_and_report_with_probe(tiny_dir, tmp_path, capsys):
    from isocompute.cli import main
    from isocompute.policy.synthetic import write_synthetic_outcomes

    table = write_synthetic_outcomes(tmp_path / "t.jsonl", 80, 8, seed=3, noise=0.3)
    flags = ["--actions", "1,2,4,8", "--n-rounds", "5", "--svd-components", "2", "--calibration-folds", "2",
             "--probe-model", str(tiny_dir), "--probe-tokens", "3"]
    assert main(["fit", str(table), "--out", str(tmp_path / "pol"), *flags]) == 0
    assert "computed with" in capsys.readouterr().out
    pol = Policy.load(tmp_path / "pol")
    spec = pol.config.probe
    assert spec.max_tokens == 3 and spec.prompt_format == "chat" and spec.model == str(tiny_dir)
    assert 0 < spec.cost < 1 and spec.flops > 0  # 3 greedy tokens cost less than one full sample
    assert pol.budget_range[0] == pytest.approx(1 + spec.cost, abs=0.01)  # default range: the probe included
    cached = np.load(tmp_path / "pol" / "probe.npy")
    assert cached.shape == (80, 3) and (cached[:, 2] <= 3).all()
    # refit into the same directory: the cache answers, the model is not called again
    assert main(["fit", str(table), "--out", str(tmp_path / "pol"), *flags]) == 0
    assert "cached in" in capsys.readouterr().out
    assert main(["report", str(table), "--policy", str(tmp_path / "pol"), "--out", str(tmp_path / "rep"),
                 "--folds", "2", "--seeds", "1", "--budgets", "2,4", "--bootstrap", "50", "--label-reps", "5"]) == 0
    rep = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert rep["probe"]["cost"] == spec.cost and rep["probe"]["source"].startswith("cached in")
    assert "Probe feature" in (tmp_path / "rep" / "report.md").read_text()
    e4 = next(e for e in rep["budgets"] if e["budget"] == 4.0)
    assert e4["methods"]["uniform"]["cost"] == pytest.approx(4.0)
