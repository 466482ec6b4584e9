"""Prometheus metrics of one gateway app, in the app's own registry (two apps in one process never clash).

=====================================  =========  ====================================================
metric                                 kind       labels / meaning
=====================================  =========  ====================================================
isocompute_requests_total              counter    route, status: requests answered
isocompute_request_latency_seconds     histogram  route: wall time from request to response
isocompute_upstream_latency_seconds    histogram  pool: one wave's sampling call
isocompute_policy_decision_seconds     histogram  ``Policy.decide`` inside a request
isocompute_k_chosen                    histogram  samples drawn per prompt, all waves of its plan
isocompute_samples_total               counter    samples requested upstream
isocompute_waves                       histogram  waves (upstream calls) per prompt's plan
isocompute_plan_stops_total            counter    reason (rule, plan_end, cap, deadline, upstream_error)
isocompute_flops_total                 counter    FLOPs spent (prefill once + every decode)
isocompute_aborted_samples_total       counter    pool: samples of parallel-stop waves aborted by the rule
isocompute_waves_stopped_total         counter    pool: parallel-stop waves the rule stopped mid-wave
isocompute_wave_latency_seconds        histogram  family, mode, pool: one wave from its request's send to its end
isocompute_wave_first_token_seconds    histogram  family, pool: a streamed wave's send to its first token
isocompute_wave_decode_seconds         histogram  family, pool: a streamed wave's seconds after its first token
isocompute_wave_decode_tokens_total    counter    family, pool: every wave's longest sample's completion tokens
isocompute_stream_decode_tokens_total  counter    family, pool: the same, of the streamed waves only (those in
                                                  the first-token and decode-seconds histograms)
isocompute_aborted_tokens_saved_total  counter    pool: tokens a stop saved against letting the wave finish,
                                                  where known (replayed waves; not a real stream's)
isocompute_plan_latency_seconds        histogram  family, pool: a prompt's plan, its first wave's send to its stop
isocompute_lambda                      gauge      budget_key: λ of the last decision
isocompute_internal_budget             gauge      budget_key: the controller's internal budget
isocompute_mean_cost                   gauge      budget_key: realised mean cost per request
isocompute_internal_latency_budget     gauge      budget_key: the latency controller's internal latency budget
                                                  (sample lengths; keys with a latency budget only)
isocompute_mean_latency                gauge      budget_key: realised mean latency per prompt (sample lengths)
isocompute_upstream_errors_total       counter    kind (timeout, circuit_open, unavailable, misconfigured,
                                                  bad_response, partial), pool
isocompute_requests_inflight           gauge      generation requests holding an admission slot (``max_inflight``)
isocompute_queue_depth                 gauge      generation requests waiting for a slot
isocompute_requests_shed_total         counter    requests refused 503 after ``queue_timeout_s`` (admission)
isocompute_connections_closed_total    counter    reason (header_timeout, body_timeout, client_limit,
                                                  total_limit): connections the guard closed
isocompute_completion_tokens_total     counter    completion tokens generated for answered prompts (aborted
                                                  samples' partial tokens included)
isocompute_budget_target               gauge      budget_key: the mean cost per prompt the key asked for, in
                                                  its unit (beside ``isocompute_mean_cost``)
isocompute_upstream_up                 gauge      pool: 1 while the pool's upstream answers real requests
                                                  (what ``/ready`` reads), else 0 — read at scrape time
isocompute_upstream_circuit            gauge      pool, upstream, state (closed, open, half_open): 1 for the
                                                  state each HTTP upstream's breaker is in — scrape time
isocompute_draining                    gauge      1 from SIGTERM until the process exits
isocompute_drain_seconds               gauge      seconds since the drain began (0 when not draining)
isocompute_quota_store_errors_total    counter    calls to the shared quota store (Redis) that failed
=====================================  =========  ====================================================

``budget_key`` is ``"<key name>:<budget><unit>"`` (e.g. ``anonymous:4samples``), with ``:max<cap>`` when
the request's cap on samples is below the server's (``anonymous:4samples:max2``; greedy requests are
capped at 1) and ``:waves<cap>`` when its cap on waves is; labels of keys the controller bank evicts are removed and never set again by a request
still in flight, so the label set stays bounded by ``control_max_keys``. ``pool`` is the model pool the
upstream call went to (:mod:`isocompute.app.runner.pools`): its model name, ``default`` for the bare pool — a
set fixed at start-up. A multi-model answer that lost samples in two pools counts ``partial`` once in each.
``family`` is the plan's stopping-rule kind (``none``, ``lead``, ``window``, ``beta``, ``dirichlet``,
``bayes``, ``boinf``, ``first``: a fixed set) and ``mode`` the wave's (``wait``, ``parallel-stop``).

The wave metrics make a gateway's measured wave overhead exact arithmetic on one scrape
(:mod:`isocompute.evaluation.wave_overhead`, ``isocompute report --wave-overhead SCRAPE``): seconds per wave
= first-token ``_sum / _count``; seconds per decode token = decode-seconds ``_sum`` / the streamed waves'
decode tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
DECISION_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05)
K_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
CIRCUIT_STATES = ("closed", "open", "half_open")
STOP_REASONS = ("rule", "plan_end", "cap", "deadline", "upstream_error")
UPSTREAM_ERROR_KINDS = ("timeout", "circuit_open", "unavailable", "misconfigured", "bad_response", "partial")


@dataclass
class GatewayState:
    """What the scrape-time collector reads (:meth:`Metrics.watch_state`): per pool whether it answers and
    its HTTP upstreams' breaker states (``{pool: [(url, state), …]}``), the drain, the quota store's errors."""

    upstream_up: dict[str, bool] = field(default_factory=dict)
    circuits: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    drain_seconds: float | None = None  # None: not draining
    quota_store_errors: int = 0


class _StateCollector:
    """Reads a :class:`GatewayState` at each scrape: state that lives elsewhere is never copied or stale."""

    def __init__(self, read: Callable[[], GatewayState]) -> None:
        self.read = read

    def describe(self) -> list[Any]:
        return []  # no samples at registration: the state is read at each scrape only

    def collect(self) -> Any:
        st = self.read()
        up = GaugeMetricFamily("isocompute_upstream_up", "1 while the pool's upstream answers real requests",
                               labels=["pool"])
        for pool, ok in st.upstream_up.items():
            up.add_metric([pool], 1.0 if ok else 0.0)
        circuit = GaugeMetricFamily("isocompute_upstream_circuit", "1 for the state each upstream's breaker is in",
                                    labels=["pool", "upstream", "state"])
        for pool, ups in st.circuits.items():
            for url, state in ups:
                for s in CIRCUIT_STATES:
                    circuit.add_metric([pool, url, s], 1.0 if s == state else 0.0)
        yield up
        yield circuit
        yield GaugeMetricFamily("isocompute_draining", "1 from SIGTERM until exit",
                                value=0.0 if st.drain_seconds is None else 1.0)
        yield GaugeMetricFamily("isocompute_drain_seconds", "Seconds since the drain began",
                                value=st.drain_seconds or 0.0)
        yield CounterMetricFamily("isocompute_quota_store_errors", "Failed calls to the shared quota store",
                                  value=st.quota_store_errors)


class Metrics:
    """The gateway's collectors, registered in a fresh :class:`CollectorRegistry`."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("isocompute_requests", "Requests answered", ["route", "status"], registry=r)
        self.latency = Histogram("isocompute_request_latency_seconds", "Request wall time", ["route"],
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.upstream_latency = Histogram("isocompute_upstream_latency_seconds", "Upstream call wall time",
                                          ["pool"], buckets=LATENCY_BUCKETS, registry=r)
        self.decision = Histogram("isocompute_policy_decision_seconds", "Policy.decide wall time",
                                  buckets=DECISION_BUCKETS, registry=r)
        self.k = Histogram("isocompute_k_chosen", "Samples drawn per prompt (all waves)", buckets=K_BUCKETS,
                           registry=r)
        self.samples = Counter("isocompute_samples", "Samples requested upstream", registry=r)
        self.waves = Histogram("isocompute_waves", "Waves (upstream calls) per prompt's plan", buckets=K_BUCKETS,
                               registry=r)
        self.stops = Counter("isocompute_plan_stops", "Plans stopped, by reason", ["reason"], registry=r)
        self.flops = Counter("isocompute_flops", "FLOPs spent upstream", registry=r)
        self.aborted_samples = Counter("isocompute_aborted_samples", "Samples aborted when a parallel-stop "
                                       "wave's rule fired", ["pool"], registry=r)
        self.waves_stopped = Counter("isocompute_waves_stopped", "Parallel-stop waves stopped mid-wave",
                                     ["pool"], registry=r)
        self.lam = Gauge("isocompute_lambda", "λ of the last decision", ["budget_key"], registry=r)
        self.internal_budget = Gauge("isocompute_internal_budget", "Controller's internal budget",
                                     ["budget_key"], registry=r)
        self.mean_cost = Gauge("isocompute_mean_cost", "Realised mean cost per request", ["budget_key"],
                               registry=r)
        self.internal_latency_budget = Gauge("isocompute_internal_latency_budget",
                                             "Latency controller's internal latency budget (sample lengths)",
                                             ["budget_key"], registry=r)
        self.mean_latency = Gauge("isocompute_mean_latency", "Realised mean latency per prompt (sample lengths)",
                                  ["budget_key"], registry=r)
        self.upstream_errors = Counter("isocompute_upstream_errors", "Upstream failures", ["kind", "pool"],
                                       registry=r)
        # admission control and the connection guard (accounting.admission)
        self.inflight = Gauge("isocompute_requests_inflight", "Generation requests holding a slot", registry=r)
        self.queue_depth = Gauge("isocompute_queue_depth", "Generation requests waiting for a slot", registry=r)
        self.shed = Counter("isocompute_requests_shed", "Requests refused 503 by admission control", registry=r)
        self.connections_closed = Counter("isocompute_connections_closed", "Connections the guard closed",
                                          ["reason"], registry=r)
        self.completion_tokens = Counter("isocompute_completion_tokens", "Completion tokens generated for "
                                         "answered prompts", registry=r)
        self.budget_target = Gauge("isocompute_budget_target", "Mean cost per prompt the key asked for, in its "
                                   "unit", ["budget_key"], registry=r)
        self._wave_collectors(r)

    def initialise(self, pools: list[str]) -> None:
        """Create every fixed label set at 0 (the stop reasons, and per pool its error kinds and abort
        counters), so a dashboard's rate of something that has not happened yet reads 0, not "no data"."""
        for reason in STOP_REASONS:
            self.stops.labels(reason)
        for pool in pools:
            for kind in UPSTREAM_ERROR_KINDS:
                self.upstream_errors.labels(kind, pool)
            for c in (self.aborted_samples, self.waves_stopped, self.tokens_saved):
                c.labels(pool)

    def watch_state(self, read: Callable[[], GatewayState]) -> None:
        """Export what ``read()`` returns at every scrape (upstreams, circuits, drain, quota store)."""
        self.registry.register(_StateCollector(read))

    def _wave_collectors(self, r: CollectorRegistry) -> None:
        self.wave_latency = Histogram("isocompute_wave_latency_seconds", "One wave's wall time, its request's send "
                                      "to its end", ["family", "mode", "pool"], buckets=LATENCY_BUCKETS, registry=r)
        self.first_token = Histogram("isocompute_wave_first_token_seconds", "A streamed wave's send to its first "
                                     "token", ["family", "pool"], buckets=LATENCY_BUCKETS, registry=r)
        self.decode_seconds = Histogram("isocompute_wave_decode_seconds", "A streamed wave's seconds after its "
                                        "first token", ["family", "pool"], buckets=LATENCY_BUCKETS, registry=r)
        self.decode_tokens = Counter("isocompute_wave_decode_tokens", "Completion tokens of each wave's longest "
                                     "sample", ["family", "pool"], registry=r)
        self.streamed_decode_tokens = Counter("isocompute_stream_decode_tokens", "Completion tokens of each "
                                              "streamed wave's longest sample", ["family", "pool"], registry=r)
        self.tokens_saved = Counter("isocompute_aborted_tokens_saved", "Tokens a stop saved against letting the "
                                    "wave finish, where known", ["pool"], registry=r)
        self.plan_latency = Histogram("isocompute_plan_latency_seconds", "A prompt's plan, its first wave's send "
                                      "to its stop", ["family", "pool"], buckets=LATENCY_BUCKETS, registry=r)

    def observe_wave(self, wave: Any, family: str, pool: str) -> None:
        """One wave as it ran (an :class:`~isocompute.app.runner.parallel_wave.WaveRecord`) of a plan of
        rule family ``family``: its latency, its first token and decode seconds where streamed, its longest
        sample's tokens and the tokens its stop saved where known."""
        if wave.seconds is not None:
            self.wave_latency.labels(family, wave.mode, pool).observe(wave.seconds)
        self.decode_tokens.labels(family, pool).inc(wave.longest)
        if wave.first_token_s is not None and wave.seconds is not None:
            self.first_token.labels(family, pool).observe(wave.first_token_s)
            self.decode_seconds.labels(family, pool).observe(max(wave.seconds - wave.first_token_s, 0.0))
            self.streamed_decode_tokens.labels(family, pool).inc(wave.longest)
        if wave.saved_tokens:
            self.tokens_saved.labels(pool).inc(wave.saved_tokens)

    def observe_plan(self, family: str, pool: str, seconds: float) -> None:
        """A prompt's plan latency (its first wave's send to its stop), by rule family."""
        self.plan_latency.labels(family, pool).observe(seconds)

    def forget(self, budget_key: str) -> None:
        """Drop a budget key's gauge labels (after the controller bank evicted it)."""
        for g in (self.lam, self.internal_budget, self.mean_cost, self.internal_latency_budget, self.mean_latency,
                  self.budget_target):
            try:
                g.remove(budget_key)
            except KeyError:
                pass

    def render(self) -> bytes:
        return generate_latest(self.registry)


class MetricsMiddleware:
    """Pure ASGI middleware counting requests and timing them per route (unknown paths → ``other``, so a
    scan of random URLs cannot grow the label set)."""

    def __init__(self, app: Any, *, metrics: Metrics, routes: frozenset[str]):
        self.app, self.metrics, self.routes = app, metrics, routes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        label = scope["path"] if scope["path"] in self.routes else "other"
        status = 500

        async def send_status(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        t0 = time.perf_counter()
        try:
            await self.app(scope, receive, send_status)
        finally:
            self.metrics.requests.labels(label, str(status)).inc()
            self.metrics.latency.labels(label).observe(time.perf_counter() - t0)
