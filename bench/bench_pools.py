"""The gateway's own CPU for a 2-stage cascade across two model pools, against a 1-stage plan.

In-process, with instant upstreams (every sample answers at once), so only the gateway's work is timed:
CPU ms per ``POST /v1/completions`` above ``GET /health`` (client, transport, middleware: the floor).
Every variant draws 2 samples in 2 upstream calls:

* **baseline** — a single-model policy's plan ``none@1x2`` on the one pool (the path before pools);
* **1-stage action** — the action ``a/none@1x2`` through the multi-model path (:mod:`isocompute.app.runner.action_run`);
* **2-stage cascade** — ``a/none@1 > b/none@1`` on two pools (stage a's plan has no rule, so it always
  runs out and escalates to b).

Blocks of ``--requests`` requests per variant are interleaved ``--blocks`` times (so load drift hits
them alike); the script prints each variant's mean CPU ms with a 95% t-interval over blocks, and the
ratios to the baseline.

    .venv/bin/python bench/bench_pools.py [--requests 200] [--blocks 6]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import time

import httpx
import numpy as np
from scipy import stats

BODY = {"model": "isocompute", "prompt": "What is 12 + 30?\n", "max_tokens": 16, "budget": 2.0}


class InstantEngine:
    """An upstream that answers at once (one fixed sample per prompt), with a tiny model's config (FLOPs)."""

    name = "instant"

    async def generate(self, prompts, n, max_tokens, temperature, seed=None):
        from isocompute.engines.base import Completion

        return [[Completion("The answer is 42.", 12, 6) for _ in range(n)] for _ in prompts]

    def model_config(self):
        return {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                "intermediate_size": 128, "vocab_size": 100}

    async def aclose(self):
        pass


def policies():
    """(name, policy, engines) of each variant."""
    from isocompute.app.fixed_action import FixedActionPolicy
    from isocompute.flops import load_model_flops
    from isocompute.solver.models.actions import parse_action

    flops = {m: load_model_flops(InstantEngine().model_config()) for m in ("a", "b")}

    class OnePlan(FixedActionPolicy):  # the single-model path: plans, no model actions
        def decide(self, texts, budget, *, probe=None, model=None):
            return dataclasses.replace(super().decide(texts, budget), model_actions=())

    one = parse_action("a/none@1x2")
    plain = OnePlan(one, flops)
    plain.models = ()  # a single-model policy
    return [("baseline: plan none@1x2", plain, None),
            ("1-stage action a/none@1x2", FixedActionPolicy(one, flops), {"a": InstantEngine()}),
            ("2-stage cascade a/none@1 > b/none@1", FixedActionPolicy(parse_action("a/none@1 > b/none@1"), flops),
             {"a": InstantEngine(), "b": InstantEngine()})]


async def measure(requests: int, blocks: int) -> dict[str, list[float]]:
    from isocompute.app.main import create_app
    from isocompute.app.settings import Settings

    out: dict[str, list[float]] = {}
    async with contextlib.AsyncExitStack() as stack:
        clients = {}
        for name, policy, engines in policies():
            app = create_app(Settings(), policy=policy, engine=None if engines else InstantEngine(), engines=engines)
            await stack.enter_async_context(app.router.lifespan_context(app))
            clients[name] = await stack.enter_async_context(
                httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw"))
        first = next(iter(clients.values()))
        calls = {"health": lambda c=first: c.get("/health")}
        for name, c in clients.items():
            calls[name] = lambda c=c: c.post("/v1/completions", json=BODY)
        for call in calls.values():  # warm-up
            for _ in range(50):
                r = await call()
                assert r.status_code == 200, r.text
        for _ in range(blocks):
            for name, call in calls.items():
                c0 = time.process_time()
                for _ in range(requests):
                    await call()
                out.setdefault(name, []).append((time.process_time() - c0) / requests * 1e3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--blocks", type=int, default=6)
    args = ap.parse_args()
    res = asyncio.run(measure(args.requests, args.blocks))
    health = np.array(res.pop("health"))
    above = {name: np.array(v) - health for name, v in res.items()}
    base_name = next(iter(above))
    base = above[base_name]

    def ci(x: np.ndarray) -> tuple[float, float]:
        h = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x))
        return float(x.mean() - h), float(x.mean() + h)

    print(f"CPU ms per request above GET /health ({health.mean():.3f} ms), {args.blocks} blocks × "
          f"{args.requests} requests, 95% t-intervals over blocks")
    for name, x in above.items():
        lo, hi = ci(x)
        r = x / base
        rlo, rhi = ci(r)
        extra = "" if name == base_name else f"   ratio to baseline {r.mean():.2f} [{rlo:.2f}, {rhi:.2f}]"
        print(f"  {name:40s} {x.mean():.3f} ms [{lo:.3f}, {hi:.3f}]{extra}")


if __name__ == "__main__":
    main()
