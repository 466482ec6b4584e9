"""Booking what a routed prompt spent: the metrics, its budget key's controller and the key's gauges.

Once a prompt's plan (or multi-model action) has run and been voted on, the gateway books it here
(:class:`Ledger`, one per gateway):

* :meth:`Ledger.count`: the samples it drew, its waves and why it stopped (``isocompute_k_chosen``,
  ``isocompute_samples_total``, ``isocompute_waves``, ``isocompute_plan_stops_total``);
* :meth:`Ledger.paid_flops`: the FLOPs of its samples plus its probe call's and extra features' FLOPs,
  added to ``isocompute_flops_total`` — the figure ``usage.flops`` reports;
* :meth:`Ledger.charge`: its cost, in the request's unit, observed by the key's
  :class:`~isocompute.app.accounting.budget_control.BudgetController`, then :meth:`Ledger.export` of the key's gauges;
* :meth:`Ledger.time`: under a latency budget, its realised latency (sample lengths, from each wave's
  completion tokens: :func:`~isocompute.app.accounting.latency_control.realised_latency`), observed by the
  key's :class:`~isocompute.app.accounting.latency_control.LatencyController`.

The cost charged for prompt i, with ``d`` samples drawn, ``m`` the completion tokens its samples
generated (those that came back, failed ones included: what the upstream reported) and ``c_probe``,
``c_extra`` the costs of its probe call and extra features in the request's unit (0 when the serving
rule did not read them; :meth:`BudgetPlan.charge`: a tokens budget pays the probe's generated tokens)::

    samples budget:  cost = d + c_probe + c_extra
    tokens budget:   cost = m + c_probe + c_extra
    FLOP budget:     cost = usage.flops                          (measured; probe and extras included)
                     cost = d · F_sample + c_probe + c_extra     (no FLOP model: the request's conversion)

Worked example: a 4-sample budget whose prompt drew waves 1, 1, 4 (d = 6) after a probe of declared cost
0.5 charges 6.5 — the samples drawn, not the plan's maximum. A non-finite cost is not charged.

Ignores: which pool drew the samples (the controller keeps one budget per key across models).
"""

from __future__ import annotations

import math

from isocompute.app.accounting.budget_control import ControllerBank
from isocompute.app.accounting.metrics import Metrics
from isocompute.app.routing import Routing

__all__ = ["Ledger"]


class Ledger:
    """The gateway's metrics and controller bank, booked per prompt (module docstring)."""

    def __init__(self, metrics: Metrics, controllers: ControllerBank) -> None:
        self.metrics = metrics
        self.controllers = controllers

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

    def charge(self, routing: Routing, i: int, drawn: int, flops: float | None, tokens: int) -> None:
        """Charge the key's controller what prompt ``i`` cost, in the request's unit (module docstring):
        ``drawn`` samples, ``tokens`` their completion tokens, ``flops`` their FLOPs (None: unknown)."""
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
        self.metrics.internal_budget.labels(plan.label).set(routing.internal_budget)
        st = routing.controller.state()
        if st.mean_cost is not None:
            self.metrics.mean_cost.labels(plan.label).set(st.mean_cost)
        if routing.latency_control is not None:
            self.metrics.internal_latency_budget.labels(plan.label).set(routing.latency_control.internal)
            lat = routing.latency_control.controller.state().mean_cost
            if lat is not None:
                self.metrics.mean_latency.labels(plan.label).set(lat)
