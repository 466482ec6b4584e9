"""Small fakes that isolate the gateway's room in its unit tests (STYLE 14): a policy implementing the
ServingPolicy contract, an engine with scripted completions and failures, and a TestClient factory."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import numpy as np
from fastapi.testclient import TestClient

from isocompute.app.main import create_app
from isocompute.app.settings import Settings
from isocompute.engines.base import Completion
from isocompute.policy.policy import Decision

ACTIONS = (1, 2, 4, 8, 16)


class FakePolicy:
    """k = the largest action ≤ 2·budget for prompts containing "hard", else the largest ≤ budget/2.

    Implements :class:`isocompute.app.serving_policy.ServingPolicy` (a samples policy, no probe, no extras).
    """

    budget_range = (1.0, 16.0)
    cost_unit = "samples"
    probe = None
    feature_extras = ()
    feature_cost = 0.0
    sample_flops = None

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], float]] = []

    def extra_flops(self, texts):
        return [0.0] * len(texts)

    def decide(self, prompts, budget, *, probe=None):
        self.calls.append((list(prompts), float(budget)))
        ks = []
        for p in prompts:
            target = 2 * budget if "hard" in p else budget / 2
            ks.append(max([a for a in ACTIONS if a <= max(target, 1)]))
        a = np.array([ACTIONS.index(k) for k in ks])
        costs = np.array(ks, dtype=float)
        return Decision(k=np.array(ks), action_index=a, budget=budget, learner="utility", internal_budget=None,
                        lam=0.01 * budget, costs=costs, expected_cost=float(costs.mean()), cost_unit="samples")


class FakeEngine:
    """Answers sample j of every prompt with ``script[j % len(script)]``; records (prompts, n) per call."""

    name = "fake"

    def __init__(self, script=("The answer is 12.",), *, drop: int = 0, fail: Exception | None = None,
                 delay: float = 0.0, wrong_count: bool = False):
        self.script, self.drop, self.fail, self.delay, self.wrong_count = script, drop, fail, delay, wrong_count
        self.all_calls: list[tuple[list[str], int]] = []
        self.cancelled: list[list[str]] = []  # prompts of the calls cancelled while in flight
        self.closed = False

    @property
    def calls(self):
        """Calls made for requests (the readiness probe's "1 + 1 =" left out)."""
        return [c for c in self.all_calls if c[0] != ["1 + 1 ="]]

    async def generate(self, prompts, n, max_tokens, temperature, seed=None):
        self.all_calls.append((list(prompts), n))
        if self.delay:
            try:
                await asyncio.sleep(self.delay)
            except asyncio.CancelledError:
                self.cancelled.append(list(prompts))
                raise
        if self.fail is not None:
            raise self.fail
        out = [[Completion(self.script[j % len(self.script)], 10, 5) for j in range(max(n - self.drop, 0))]
               for _ in prompts]
        return out[:-1] if self.wrong_count else out

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
