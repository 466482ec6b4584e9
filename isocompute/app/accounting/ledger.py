"""Charging what a routed prompt spent: its costs, the metrics, its budget key's controller and gauges.

Once a prompt's action (a single-model plan is a one-stage action) has run and been voted on, the
gateway's runner (:mod:`isocompute.app.runner.answers`) hands it here — :meth:`Ledger.book`, one call per
prompt, which

* measures it (:func:`stage_costs`): per stage, the prompt's tokens (each model reads the prompt), its
  samples' completion tokens and their FLOPs on that stage's model (:func:`plan_flops`: every decode
  step, and the prompt's prefill once per plan when the upstream caches prefixes across requests —
  vLLM's automatic prefix caching — else once per wave, each wave being one request whose samples share
  one prefill); unknown FLOPs when one stage's model has no config;
* counts it (:meth:`Ledger.count`): the samples it drew, its waves and why it stopped
  (``isocompute_k_chosen``, ``isocompute_samples_total``, ``isocompute_waves``,
  ``isocompute_plan_stops_total``);
* adds its probe call's and extra features' FLOPs (:meth:`Ledger.paid_flops`) to ``isocompute_flops_total``
  — the figure ``usage.flops`` reports;
* charges its cost, in the request's unit, to the key's
  :class:`~isocompute.app.accounting.budget_control.BudgetController` (:meth:`Ledger.charge`), then
  exports the key's gauges (:meth:`Ledger.export`);
* under a latency budget, observes its realised latency (sample lengths, from each wave's completion
  tokens: :func:`~isocompute.app.accounting.latency_control.realised_latency`) on the key's
  :class:`~isocompute.app.accounting.latency_control.LatencyController` (:meth:`Ledger.time`).

The cost charged for prompt i, with ``d`` samples drawn, ``m`` the completion tokens its samples
generated (those that came back, failed and aborted ones included: what the upstream reported) and
``c_probe``, ``c_extra`` the costs of its probe call and extra features in the request's unit (0 when the
serving rule did not read them; :meth:`BudgetPlan.charge`: a tokens budget pays the probe's generated
tokens)::

    samples budget:  cost = d + c_probe + c_extra
    tokens budget:   cost = m' + c_probe + c_extra               (m' = m, a wave that asked logprobs × 1.07)
    FLOP budget:     cost = usage.flops                          (measured; probe and extras included)
                     cost = d · F_sample + c_probe + c_extra     (no FLOP model: the request's conversion)

Worked example: a 4-sample budget whose prompt drew waves 1, 1, 4 (d = 6) after a probe of declared cost
0.5 charges 6.5 — the samples drawn, not the plan's maximum. A non-finite cost is not charged. FLOPs:
waves 1, 1, 2 with 10 prompt tokens and completions of 5, 6, 5, 7 tokens → with prefix caching
``prefill(10) + Σ decode``; without it ``3 · prefill(10) + Σ decode``.

Logprobs: a wave whose request asked for the tokens' logprobs (``WaveRecord.logprobs``: a parallel-stop wave
whose rule reads confidence, :mod:`isocompute.app.runner.parallel_wave`) decodes slower, so a tokens budget
is charged its tokens at :data:`isocompute.flops.logprobs.LOGPROB_COST_FACTOR` (:func:`priced_tokens_of`);
the usage reported and the FLOPs are its real tokens' (logprobs add no matmul).

Ignores: which pool drew the samples (the controller keeps one budget per key across models).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from isocompute.app.accounting.budget_control import ControllerBank
from isocompute.app.accounting.metrics import Metrics
from isocompute.app.routing import Routing
from isocompute.app.runner.action_run import ActionRun
from isocompute.app.runner.plan_run import PlanRun

__all__ = ["Bill", "Ledger", "StageCost", "plan_flops", "priced_tokens_of", "stage_costs", "wave_tokens"]


def wave_tokens(run: PlanRun) -> list[list[int]]:
    """Per wave of ``run``, the completion tokens of its samples that came back."""
    waves, start = [], 0
    for n in run.wave_sizes:
        waves.append([c.completion_tokens for c in run.samples[start:start + n] if c is not None])
        start += n
    return waves


def priced_tokens_of(run: PlanRun) -> float:
    """``run``'s completion tokens as a tokens budget pays them: each wave's at the logprob cost factor when
    it asked for logprobs (module docstring), else as they are."""
    from isocompute.flops.logprobs import priced_tokens

    return float(sum(priced_tokens(sum(w), rec.logprobs) for w, rec in zip(wave_tokens(run), run.wave_runs, strict=True)))


def plan_flops(model: Any, prompt_tokens: int, run: PlanRun, *, prefix_caching: bool) -> float:
    """FLOPs of ``run``'s samples that came back (module docstring)."""
    from isocompute.flops import request_flops

    waves = wave_tokens(run)
    if prefix_caching:
        return float(request_flops(model, prompt_tokens, [m for w in waves for m in w]))
    return float(sum(request_flops(model, prompt_tokens, w) for w in waves))


@dataclass(frozen=True, slots=True)
class StageCost:
    """What one stage of an action spent: its prompt's tokens (each model reads the prompt), its samples'
    completion tokens, and their FLOPs on that stage's model (None without its config)."""

    prompt_tokens: int
    completion_tokens: int
    flops: float | None


def stage_costs(run: ActionRun, model_flops: Mapping[str, Any], *, prefix_caching: bool) -> list[StageCost]:
    """Each stage's :class:`StageCost`: :func:`plan_flops` of its waves on ``model_flops[its model]``."""
    out = []
    for st in run.stages:
        got = [c for c in st.run.samples if c is not None]
        p = max((c.prompt_tokens for c in got), default=0)
        mf = model_flops.get(st.model)
        out.append(StageCost(p, sum(c.completion_tokens for c in got),
                             None if mf is None else plan_flops(mf, p, st.run, prefix_caching=prefix_caching)))
    return out


@dataclass(frozen=True, slots=True)
class Bill:
    """What :meth:`Ledger.book` charged for one prompt: prompt and completion tokens summed over the
    stages, its FLOPs (probe and extras included; None when a stage's are unknown), each stage's own
    FLOPs, and its realised latency (None without a latency budget)."""

    prompt_tokens: int
    completion_tokens: int
    flops: float | None
    stage_flops: list[float | None]
    latency: float | None


class Ledger:
    """The gateway's metrics and controller bank, booked per prompt (module docstring)."""

    def __init__(self, metrics: Metrics, controllers: ControllerBank, model_flops: Mapping[str, Any], *,
                 prefix_caching: bool) -> None:
        self.metrics = metrics
        self.controllers = controllers
        self.model_flops = model_flops  # model (pool) name → its FLOP model, None without a config
        self.prefix_caching = prefix_caching

    def book(self, run: ActionRun, routing: Routing, i: int) -> Bill:
        """Measure, count, charge and time prompt ``i``'s ``run`` (module docstring)."""
        costs = stage_costs(run, self.model_flops, prefix_caching=self.prefix_caching)
        stage_flops = [c.flops for c in costs]
        known = [f for f in stage_flops if f is not None]
        flops = self.paid_flops(routing, i, sum(known)) if len(known) == len(costs) else None
        self.count(run.drawn, len(run.wave_sizes), run.stopped)
        completion_tokens = sum(c.completion_tokens for c in costs)
        self.metrics.completion_tokens.inc(completion_tokens)
        self.charge(routing, i, run.drawn, flops, sum(priced_tokens_of(st.run) for st in run.stages))
        latency = self.time(routing, [w for st in run.stages for w in wave_tokens(st.run)])
        return Bill(sum(c.prompt_tokens for c in costs), completion_tokens, flops, stage_flops, latency)

    def generated(self, routing: Routing, runs: list[ActionRun]) -> tuple[int, float | None]:
        """What a request generated, for its key's spend quota: the completion tokens of every sample that
        came back (failed and aborted ones included) plus its probe call's, and their FLOPs with the probe's
        and extra features' (None when one is unknown). ``runs``: every prompt's (empty when none came back)."""
        pr, fe = routing.probe, routing.features
        tokens = sum(c.completion_tokens for r in runs for st in r.stages for c in st.run.samples if c is not None)
        parts: list[float | None] = [c.flops for r in runs
                                     for c in stage_costs(r, self.model_flops, prefix_caching=self.prefix_caching)]
        if pr is not None:
            tokens += sum(pr.tokens)
            parts += pr.flops
        if fe is not None:
            parts += fe.flops
        known = [f for f in parts if f is not None]
        return tokens, float(sum(known)) if len(known) == len(parts) else None

    def count(self, drawn: int, waves: int, stopped: str) -> None:
        m = self.metrics
        m.k.observe(drawn)
        m.samples.inc(drawn)
        m.waves.observe(waves)
        m.stops.labels(stopped).inc()

    def paid_flops(self, routing: Routing, i: int, flops: float) -> float:
        """``flops`` of the samples plus the prompt's probe call and extra features; counted in the metric."""
        pr, fe = routing.probe, routing.features
        if pr is not None and pr.flops[i] is not None:
            flops += float(pr.flops[i])  # type: ignore[arg-type]
        if fe is not None:
            flops += fe.flops[i]
        self.metrics.flops.inc(flops)
        return flops

    def charge(self, routing: Routing, i: int, drawn: int, flops: float | None, tokens: float) -> None:
        """Charge the key's controller what prompt ``i`` cost, in the request's unit (module docstring):
        ``drawn`` samples, ``tokens`` their completion tokens (priced: :func:`priced_tokens_of`), ``flops``
        their FLOPs (None: unknown)."""
        plan, pr, fe = routing.plan, routing.probe, routing.features
        paid = (0.0 if pr is None else pr.costs[i]) + (0.0 if fe is None else fe.costs[i])
        if plan.unit == "samples":
            cost = float(drawn) + paid
        elif plan.unit == "tokens":
            cost = float(tokens) + paid
        else:
            cost = flops if flops is not None else plan.in_request_unit(float(drawn), "samples") + paid
        if not math.isfinite(cost):
            return
        routing.controller.observe(cost)
        self.export(routing)

    def time(self, routing: Routing, waves: list[list[int]]) -> float | None:
        """The prompt's realised latency from its waves' completion tokens, observed by the key's latency
        controller and exported; None without a latency budget (nothing is observed then)."""
        lr = routing.latency_control
        latency = None if lr is None else lr.realised(waves)
        if lr is None or latency is None or not math.isfinite(latency):
            return latency
        lr.controller.observe(latency)
        self.export(routing)
        return latency

    def export(self, routing: Routing) -> None:
        """The key's gauges — unless its controller was evicted while the request awaited (then its labels
        were removed, and re-creating them would grow the label set without bound)."""
        plan = routing.plan
        if not self.controllers.holds(plan.key, routing.controller):
            return
        if routing.lam is not None:
            self.metrics.lam.labels(plan.label).set(routing.lam)
        self.metrics.internal_budget.labels(plan.label).set(routing.controller.internal)  # after charging
        self.metrics.budget_target.labels(plan.label).set(plan.budget)
        st = routing.controller.state()
        if st.mean_cost is not None:
            self.metrics.mean_cost.labels(plan.label).set(st.mean_cost)
        if routing.latency_control is not None:
            self.metrics.internal_latency_budget.labels(plan.label).set(routing.latency_control.internal)
            lat = routing.latency_control.controller.state().mean_cost
            if lat is not None:
                self.metrics.mean_latency.labels(plan.label).set(lat)
