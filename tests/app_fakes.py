"""Small fakes that isolate the gateway's room in its unit tests (STYLE 14): a policy implementing the
ServingPolicy contract (its decisions carry plans, as the real Decision does), an engine with scripted
completions and failures, and a TestClient factory."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from isocompute.app.main import create_app
from isocompute.app.settings import Settings
from isocompute.engines.base import Completion
from isocompute.solver.plans.plan import Plan, parse_plan

ACTIONS = (1, 2, 4, 8, 16)


@dataclass(frozen=True, eq=False)
class FakeDecision:
    """A decision in the shape of :class:`isocompute.policy.decision.Decision` (the fields the gateway's
    :class:`~isocompute.app.serving_policy.PolicyDecision` contract reads)."""

    k: np.ndarray
    action_index: np.ndarray
    plans: tuple[Plan, ...]
    costs: np.ndarray
    expected_cost: float
    lam: float | None = None
    expected_samples: np.ndarray | None = None
    expected_waves: np.ndarray | None = None
    rule: str = "learned"
    rule_evidence: dict | None = None
    model_actions: tuple = ()
    latency_budget: float | None = None
    expected_latency: np.ndarray | None = None


def decision(plans, *, lam=None, extra_cost=0.0, rule="learned", evidence=None) -> FakeDecision:
    """The decision for ``plans`` (Plan objects): k = their maximum samples, expected samples = k · 0.75,
    cost = expected samples + ``extra_cost`` (what a probe would add)."""
    plans = tuple(plans)
    k = np.array([p.max_samples for p in plans])
    samples = 0.75 * k
    costs = samples + extra_cost
    return FakeDecision(k=k, action_index=np.arange(len(plans)), plans=plans, costs=costs,
                        expected_cost=float(costs.mean()), lam=lam, expected_samples=samples,
                        expected_waves=np.array([p.n_waves * 0.5 for p in plans]), rule=rule, rule_evidence=evidence)


class FakePolicy:
    """k = the largest action ≤ 2·budget for prompts containing "hard", else the largest ≤ budget/2, run
    as the one-wave plan ``none@k`` — or, with ``plan``, that plan (a name) for every prompt.

    Implements :class:`isocompute.app.serving_policy.ServingPolicy` (a samples policy, no probe, no extras);
    ``reads`` is what ``needs_features`` answers, ``rule`` the rule its decisions report.
    """

    budget_range = (1.0, 16.0)
    cost_unit = "samples"
    probe = None
    feature_extras = ()
    feature_cost = 0.0
    sample_flops = None
    models = ()
    tokens_per_sample = None
    latency_range = None

    def __init__(self, plan: str | None = None, *, reads: bool = True, rule: str = "learned") -> None:
        self.calls: list[tuple[list[str], float]] = []
        self.plan, self.reads, self.rule = plan, reads, rule
        # the most samples any of its plans draws (sizes quota reservations, as a fitted policy's does)
        self.max_plan_samples = (max(ACTIONS) if plan is None else
                                 (parse_plan(plan) if isinstance(plan, str) else plan).max_samples)

    def extra_flops(self, texts):
        return [0.0] * len(texts)

    def needs_features(self, budget):
        return self.reads

    def decide(self, prompts, budget, *, probe=None):
        self.calls.append((list(prompts), float(budget)))
        if self.plan is not None:
            plans = [parse_plan(self.plan) if isinstance(self.plan, str) else self.plan] * len(prompts)
        else:
            ks = [max([a for a in ACTIONS if a <= max(2 * budget if "hard" in p else budget / 2, 1)])
                  for p in prompts]
            plans = [Plan((k,)) for k in ks]
        d = decision(plans, lam=0.01 * budget, rule=self.rule,
                     evidence={"rule": self.rule, "budget": float(budget), "reason": "a fake's"})
        if self.plan is None:  # the one-wave actions of ACTIONS, costing k, as before plans
            d = FakeDecision(k=d.k, action_index=np.array([ACTIONS.index(k) for k in d.k]), plans=d.plans,
                             costs=d.k.astype(float), expected_cost=float(d.k.mean()), lam=d.lam,
                             expected_samples=d.k.astype(float), expected_waves=np.ones(len(d.k)), rule=d.rule,
                             rule_evidence=d.rule_evidence)
        return d


class FakeEngine:
    """Answers sample j of every prompt with ``script[j % len(script)]`` (``script`` may be a dict: prompt →
    its script) — j counted within the call, or
    across a prompt's calls with ``continuing`` (a plan's waves then walk down the script); records
    (prompts, n) and the seed per call.

    ``lengths``: completion tokens of sample j (``lengths[j % len(lengths)]``; 5 for every sample without),
    so a parallel-stop wave's replay (engines.base.replay_finishes) finishes them in that order.

    Failures: ``fail`` is raised, and ``delay`` slept, by request calls number ``fail_after`` / ``slow_after``
    (0-based) and later — so a plan's first wave can succeed and a later one fail or hang.
    """

    name = "fake"

    def __init__(self, script=("The answer is 12.",), *, drop: int = 0, fail: Exception | None = None,
                 delay: float = 0.0, wrong_count: bool = False, continuing: bool = False, fail_after: int = 0,
                 slow_after: int = 0, lengths=(5,)):
        self.script, self.drop, self.fail, self.delay, self.wrong_count = script, drop, fail, delay, wrong_count
        self.continuing, self.fail_after, self.slow_after = continuing, fail_after, slow_after
        self.lengths = tuple(lengths)
        self.all_calls: list[tuple[list[str], int]] = []
        self.seeds: list[int | None] = []  # per request call
        self.drawn: dict[str, int] = {}  # samples handed out per prompt (continuing)
        self.cancelled: list[list[str]] = []  # prompts of the calls cancelled while in flight
        self.closed = False

    @property
    def calls(self):
        """Calls made for requests (the readiness probe's "1 + 1 =" left out)."""
        return [c for c in self.all_calls if c[0] != ["1 + 1 ="]]

    async def generate(self, prompts, n, max_tokens, temperature, seed=None):
        self.all_calls.append((list(prompts), n))
        index = -1 if list(prompts) == ["1 + 1 ="] else len(self.calls) - 1  # among request calls; -1: readiness
        if index >= 0:
            self.seeds.append(seed)
        if self.delay and self._from(index, self.slow_after):
            try:
                await asyncio.sleep(self.delay)
            except asyncio.CancelledError:
                self.cancelled.append(list(prompts))
                raise
        if self.fail is not None and self._from(index, self.fail_after):
            raise self.fail
        out = []
        for p in prompts:
            script = self.script[p] if isinstance(self.script, dict) else self.script
            start = self.drawn.get(p, 0) if self.continuing else 0
            m = max(n - self.drop, 0)
            out.append([Completion(script[(start + j) % len(script)], 10, self.lengths[(start + j) % len(self.lengths)])
                        for j in range(m)])
            self.drawn[p] = start + m
        return out[:-1] if self.wrong_count else out

    @staticmethod
    def _from(index, after):
        """Call ``index`` is at or past ``after`` (readiness calls follow the first request call's fate)."""
        return index >= after or (index < 0 and after == 0)

    async def aclose(self):
        self.closed = True


def make_client(engine=None, policy=None, **settings):
    s = Settings(**{"upstream_timeout_s": 2.0, "ready_probe_timeout_s": 1.0, **settings})
    app = create_app(s, policy=policy or FakePolicy(), engine=engine or FakeEngine())
    return TestClient(app, raise_server_exceptions=False)


def completion(prompt="What is 5 + 7?", **extra):
    return {"model": "isocompute", "prompt": prompt, **extra}


def serve_in_thread(app, port: int):
    """Run ``app`` on uvicorn at 127.0.0.1:``port`` in a thread until it answers /health; returns stop()."""
    import uvicorn

    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.05)

    def stop():
        srv.should_exit = True
        thread.join(timeout=30)

    return stop


def fit_tokens_policy():
    """A small real policy in the tokens unit with latency budgets: fitted on a synthetic outcome table (every
    sample has completion_tokens) over the default+parallel plan menu, budgets 1x–8x one sample's mean tokens
    and latency budgets 1–2 sample lengths (a few seconds)."""
    from isocompute.policy.latency import tokens_per_sample
    from isocompute.policy.plans.menu import resolve_plans
    from isocompute.policy.policy import Policy, PolicyConfig
    from isocompute.policy.synthetic import synthetic_records
    from isocompute.solver.outcomes import from_records

    actions = (1, 2, 4, 8)
    table = from_records(synthetic_records(120, 8, seed=0))
    t = tokens_per_sample(table)
    menu = tuple(p.name for p in resolve_plans("default+parallel", actions))
    return Policy(PolicyConfig(actions=actions, plans=menu, cost_unit="tokens", budget_range=(t, 8 * t), n_rounds=8,
                               calibration_folds=2, n_components=4, latency_range=(1.0, 2.0), seed=1)).fit(table)


def assert_hanging_up_cancels(app, engine, what: str, *, prompt: str = "bye") -> None:
    """Serve ``app`` on uvicorn, send a completion of ``prompt`` and hang up after 0.5 s: the engine call in
    flight is cancelled within 3 s (``what`` names it in the failure)."""
    from isocompute.engines.vllm_server import free_port

    port = free_port()
    stop = serve_in_thread(app, port)
    try:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=completion(prompt, budget=4), timeout=0.5)
        t0 = time.monotonic()
        while [prompt] not in engine.cancelled:
            assert time.monotonic() - t0 < 3.0, f"{what} was not cancelled"
            time.sleep(0.02)
        time.sleep(0.2)
    finally:
        stop()
