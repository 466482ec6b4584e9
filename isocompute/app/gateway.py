"""The gateway's work behind the routes: price → decide → run the plans → vote → account.

For a request with prompts ``x_1 … x_P``, arriving with a deadline ``upstream_timeout_s`` away:

1. **price** (:func:`isocompute.app.accounting.pricing.price_request`): the budget in samples and in the policy's
   unit (``"4x"`` resolved to tokens), checked against the server's and the policy's limits, and the latency
   budget against the policy's range; the caps on samples and on waves per prompt; the controller's key;
2. **decide**: the key's :class:`~isocompute.app.accounting.budget_control.BudgetController` gives the internal
   budget ``b`` (the priced budget itself when control is off); when the rule serving ``b`` reads the
   prompt features (``policy.needs_features(b)``) the policy's probe runs, if it has one; then
   ``policy.decide(texts, b)`` (with ``latency_budget=l`` when ``L`` is sent: the internal latency budget of
   the key's :class:`~isocompute.app.accounting.latency_control.LatencyController`) returns a plan per prompt,
   λ, the expected cost (and latency) and the rule of the never-worse chain that decided — the policy is
   reached only through :class:`~isocompute.app.serving_policy.ServingPolicy`; each plan is cut to the caps
   (``Plan.capped``);
3. **run** (:class:`isocompute.app.runner.answers.Answers`, the one runner — a single-model plan is a
   one-stage action, cascades and ensembles are more stages): waves of samples upstream within the
   deadline (a parallel-stop wave streamed, and closed — aborted upstream — when its rule fires), each
   prompt's answers merged into equivalence classes (:mod:`isocompute.app.runner.voting`) and its stopping
   rule checked between waves and, in a parallel-stop wave, at every finish;
4. **vote**: the plurality over answer classes (ties: ``tie_break``, by default a seeded random pick —
   the offline estimators give t tied classes 1/t of the credit each, and a uniform pick is the
   unbiased match) or best-of under the verifier; the winning sample's text is the answer. Samples that
   failed upstream (fewer returned, or ``finish_reason`` ``error``/``abort``) do not vote; lost ones make
   the answer ``partial``;
5. **charge** (:meth:`isocompute.app.accounting.ledger.Ledger.book`): what was actually spent — the samples
   the waves drew, not the plan's maximum (samples; in tokens their completion tokens, aborted samples'
   partial tokens included; in FLOPs each wave's decodes plus the prompt's prefill, once per plan with
   ``prefix_caching``, else once per wave) — goes to the controller, the metrics and the response; under a
   latency budget the realised latency too (:mod:`isocompute.app.accounting.latency_control`).

Each route makes one call (:meth:`Gateway.chat_completions`, :meth:`Gateway.completions`, :meth:`Gateway.route_request`,
as vLLM's routes hand the request to one serving method): the request is checked (:class:`~isocompute.app.routing.Intake`),
admitted (:class:`~isocompute.app.accounting.admission.Admission`), steps 1–5 run, the response shaped or streamed.

A policy with a probe feature needs one cheap model call per prompt before it can decide, and a policy
with extra feature blocks computes them inside ``decide`` (:mod:`isocompute.app.runner.extras`). Both are part
of the request's cost when the serving rule reads them: ``expected_cost`` includes their declared costs,
``flops`` and ``usage.flops`` their FLOPs, the controller is charged the samples + their cost, and
``isocompute.probe`` itemises the probe. Where a fallback rule serves (``fixed_plan``, ``uniform``),
neither runs and nothing is charged for them. A ``decide`` with extra blocks runs in the gateway's one
decide worker thread, off the event loop (the encoder takes milliseconds per prompt); a text-only
policy decides inline (~0.5 ms).

**Several models** (:mod:`isocompute.app.runner.pools`): the gateway holds a pool per model name besides the
default one. A multi-model policy's decision carries an action per prompt (``model_actions``), each stage
on its model's pool, the vote over the last stage or all of them, the stages summed. A request's ``model``
naming one of ``policy.models`` pins the decision to actions on that model alone.

**Spend quotas** (:mod:`isocompute.app.accounting.spend`): a key's worst case (the policy's largest plan) is reserved
after step 1, its cap lowered to fit (re-priced with that ``max_samples``) or a 429; settled after 5. Ignores: stop strings.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, TypeVar

import numpy as np
from fastapi import Request, Response
from fastapi.responses import StreamingResponse

from isocompute.app.accounting.admission import Admission
from isocompute.app.accounting.auth import Principal
from isocompute.app.accounting.budget_control import BudgetController, ControllerBank
from isocompute.app.accounting.latency_control import LatencyControl
from isocompute.app.accounting.ledger import Ledger
from isocompute.app.accounting.metrics import Metrics
from isocompute.app.accounting.pricing import BudgetPlan, budget_unit, price_request
from isocompute.app.accounting.quotas import Hold, Quotas, open_store
from isocompute.app.accounting.spend import Spend
from isocompute.app.accounting.tracing import span, traced
from isocompute.app.chat import policy_text, render_chat
from isocompute.app.readiness import UpstreamHealth
from isocompute.app.routing import Ask, Intake, Routing, route_response
from isocompute.app.runner.answer import Answer, Verifier
from isocompute.app.runner.answers import Answers
from isocompute.app.runner.execute import Backend, Deadline
from isocompute.app.runner.extras import FeatureCall, ProbeCall, feature_call, probe_call
from isocompute.app.runner.pools import (
    DEFAULT,
    POOL_LABEL,
    ModelPool,
    Pool,
    PoolsHealth,
    missing_pools,
    missing_pools_message,
)
from isocompute.app.runner.voting import Voter
from isocompute.app.schemas import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    RouteRequest,
    RouteResponse,
)
from isocompute.app.serving_policy import PolicyDecision, ServingPolicy, as_serving_policy
from isocompute.app.settings import Settings
from isocompute.app.streaming import (
    SSE_HEADERS,
    answer_events,
    chat_response,
    completion_response,
    head,
    unless_disconnected,
)
from isocompute.engines.base import Engine
from isocompute.errors import EngineUnavailable, InputError

T = TypeVar("T")
__all__ = ["Answer", "Ask", "FeatureCall", "Gateway", "ProbeCall", "Routing", "Verifier", "policy_text",
           "render_chat"]


class Gateway:
    """Holds the loaded policy, engine and per-key controllers; one per app (built in the lifespan)."""

    def __init__(
        self,
        *,
        policy: Any,
        engine: Engine,
        settings: Settings,
        metrics: Metrics,
        extract: Callable[[str], str | None],
        tokenizer: Any = None,
        model_flops: Any = None,
        context_limit: int | None = None,
        verifier: Verifier | None = None,
        grader: Any = None,
        pools: Mapping[str, ModelPool] | None = None,
    ) -> None:
        self.engine = engine
        self.settings = settings
        self.metrics = metrics
        self.extract = extract
        self.tokenizer, self.model_flops, self.context_limit, self.verifier = tokenizer, model_flops, context_limit, verifier
        # the default pool is the bare one, or the named pool whose engine it is: its metrics carry that name
        label = next((n for n, f in (pools or {}).items() if f.engine is engine), POOL_LABEL)
        self.backend = Backend(engine, metrics, UpstreamHealth(), label)
        default = Pool(DEFAULT, engine, self.backend, tokenizer, model_flops, context_limit)
        # named pools (model name → pool); the default pool's engine, when it is one of them, keeps its backend
        self.pools: dict[str, Pool] = {
            name: Pool.of(name, facts, metrics, self.backend if facts.engine is engine else None)
            for name, facts in (pools or {}).items()}
        self.health: UpstreamHealth | PoolsHealth = (
            PoolsHealth({**self.pools, DEFAULT: default}) if self.pools else self.backend.health)
        self.policy: ServingPolicy | None = None if policy is None else self._check_pools(as_serving_policy(policy))
        self.latency = LatencyControl(settings)  # a key's μ controller goes when its λ controller does
        self.controllers = ControllerBank(max_keys=settings.control_max_keys,
                                          max_per_caller=settings.control_max_keys_per_caller, on_evict=lambda key: (
            metrics.forget(self._labels.pop(key, "")), self.latency.drop(key)))
        self._labels: dict[Any, str] = {}
        flops_of = {name: p.model_flops for name, p in {**self.pools, DEFAULT: default}.items()}
        self.ledger = Ledger(metrics, self.controllers, flops_of, prefix_caching=settings.prefix_caching)
        self.voter = Voter(settings.answer_kind, timeout_s=settings.vote_timeout_s, grader=grader)
        self.answers = Answers(self.pools, default, settings=settings, voter=self.voter, extract=extract,
                               verifier=verifier, ledger=self.ledger)
        self._decide_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="isocompute-decide")
        self.intake = Intake(settings, tokenizer, context_limit)
        self.admission = Admission(settings.max_inflight, settings.queue_timeout_s, metrics)
        self.quotas = Quotas(open_store(settings.quota_store))
        self.spend = Spend(self.quotas, self.ledger, list(flops_of.values()))

    def close(self) -> None:
        """Stop the decide and vote workers (requests still running in them finish first)."""
        try:
            self._decide_pool.shutdown(wait=True, cancel_futures=True)
            self.intake.close()
        finally:
            self.voter.close()

    def deadline(self) -> Deadline:
        """A new request's deadline: ``upstream_timeout_s`` from now."""
        return Deadline.after(self.settings.upstream_timeout_s)

    async def watch_upstream(self) -> None:
        """The readiness task (:meth:`UpstreamHealth.watch`, one per pool); runs until cancelled."""
        s = self.settings
        backends = {id(b): b for b in [self.backend, *(p.backend for p in self.pools.values())]}
        await asyncio.gather(*(b.health.watch(b.engine, interval_s=s.ready_interval_s,
                                              timeout_s=s.ready_probe_timeout_s) for b in backends.values()))

    # ---- policy ---------------------------------------------------------------------------------

    def replace_policy(self, policy: Any) -> None:
        """Swap in a reloaded policy; the old controllers' internal budgets no longer apply. Raises
        :class:`InputError` when its models have no pool here."""
        self.policy = self._check_pools(as_serving_policy(policy))
        self.controllers.clear()

    def _check_pools(self, policy: ServingPolicy) -> ServingPolicy:
        missing = missing_pools(policy.models, self.pools)
        if missing:
            raise InputError(missing_pools_message(missing, self.pools))
        return policy

    def _loaded_policy(self) -> ServingPolicy:
        if self.policy is None:
            raise EngineUnavailable("no policy loaded; start the gateway with --policy DIR or POST /admin/reload")
        return self.policy

    # ---- the routes' one call each --------------------------------------------------------------

    async def chat_completions(self, req: ChatCompletionRequest, caller: Principal, request: Request,
                               response: Response) -> ChatCompletionResponse | StreamingResponse:
        """A chat request, whole (the one call its route makes): checked, admitted, priced, decided, run,
        voted, charged, and answered as one assistant message — or streamed."""
        return await self._generate("chat", req, caller, request, response)  # type: ignore[return-value]

    async def completions(self, req: CompletionRequest, caller: Principal, request: Request,
                          response: Response) -> CompletionResponse | StreamingResponse:
        """A completion request, whole: one aggregated choice per prompt — or streamed."""
        return await self._generate("text", req, caller, request, response)  # type: ignore[return-value]

    async def _generate(self, kind: Literal["chat", "text"], req: ChatCompletionRequest | CompletionRequest,
                        caller: Principal, request: Request, response: Response) -> Any:
        deadline = self.deadline()
        prompts, ask = await self.intake.generation(req, self._models())
        self.answers.check_strategy(ask.strategy)  # a refusal before any stream opens is a JSON 4xx
        h = head(kind, self.settings.served_model)
        if req.stream:
            return await self._stream(request, caller, prompts, ask, deadline, kind, req.stream_options, h)
        answers = await unless_disconnected(request, self._admitted(lambda: self.answer(
            prompts, ask, principal=caller, deadline=deadline, headers=response.headers)))
        return chat_response(h, answers) if kind == "chat" else completion_response(h, answers)

    async def _admitted(self, work: Callable[[], Awaitable[T]]) -> T:
        """``work()`` holding an admission slot (:class:`Admission`: 503 after ``queue_timeout_s`` without one)."""
        async with self.admission.slot():
            return await work()

    async def route_request(self, req: RouteRequest, caller: Principal, request: Request) -> RouteResponse:
        """The decision alone (``/v1/route``): a plan per prompt, without sampling (a dry run moves no controller);
        a probe policy's probe call is upstream work, which a client that goes away cancels."""
        deadline = self.deadline()
        prompts, ask = await self.intake.route(req, self._models())
        r = await unless_disconnected(request, self.route(prompts, ask, principal=caller, deadline=deadline))
        return route_response(r, self.settings.served_model, len(prompts))

    async def _stream(self, request: Request, caller: Principal, prompts: list[str], ask: Ask, deadline: Deadline,
                      kind: Literal["chat", "text"], options: dict[str, Any] | None, h: dict[str, Any]
                      ) -> StreamingResponse:
        """A ``stream: true`` request (:mod:`isocompute.app.streaming`): admitted and routed before the stream
        opens, so a refusal is a JSON 4xx (or 503); its waves run in a task started now — settled and its slot
        given back however it ends, even when the stream never starts — which a disconnect cancels."""
        if options is not None and not isinstance(options.get("include_usage", False), bool):
            raise InputError("stream_options.include_usage must be true or false")
        await unless_disconnected(request, self.admission.acquire())
        try:
            routing = await unless_disconnected(request, self.route(prompts, ask, principal=caller,
                                                                    deadline=deadline, dry_run=False))
        except BaseException:
            self.admission.release()
            raise
        work = asyncio.ensure_future(self.run(prompts, routing, ask, deadline))
        work.add_done_callback(lambda _: self.admission.release())
        events = answer_events(work, request.receive, kind=kind, head=h, keepalive_s=self.settings.stream_keepalive_s,
                               include_usage=bool((options or {}).get("include_usage")))
        quota = {} if routing.quota is None else routing.quota.headers()  # what was left before this request
        return StreamingResponse(events, media_type="text/event-stream", headers={**SSE_HEADERS, **quota})

    def _models(self) -> tuple[str, ...]:
        return () if self.policy is None else self.policy.models

    # ---- routing --------------------------------------------------------------------------------

    async def answer(self, prompts: list[str], ask: Ask, *, principal: Principal, deadline: Deadline,
                     headers: MutableMapping[str, str] | None = None) -> list[Answer]:
        """Route, run, vote and charge every prompt of a generation request (module docstring, steps 1–5).
        Raises what :meth:`route` and :meth:`Answers.answer` raise.
        ``headers`` receives the key's quota headers after the request (a key with quotas)."""
        routing = await self.route(prompts, ask, principal=principal, deadline=deadline, dry_run=False)
        answers = await self.run(prompts, routing, ask, deadline)
        if headers is not None and routing.quota is not None:
            headers.update(routing.quota.headers())
        return answers

    async def run(self, prompts: list[str], routing: Routing, ask: Ask, deadline: Deadline) -> list[Answer]:
        """Steps 3–5 of a routed request (a streamed one runs them after its stream opened); then the key's
        quota reservation is settled to what was generated (:meth:`Spend.settled`)."""
        return await self.spend.settled(routing, lambda on_runs: self.answers.answer(
            prompts, routing, max_tokens=ask.max_tokens, temperature=ask.temperature, seed=ask.seed,
            strategy=ask.strategy, deadline=deadline, messages=ask.messages, on_runs=on_runs))

    async def route(self, prompts: list[str], ask: Ask, *, principal: Principal, deadline: Deadline,
                    dry_run: bool = True) -> Routing:
        """Decide a plan for every prompt (module docstring, steps 1–2). Raises BudgetError / PermissionDenied.

        ``ask.policy_prompts`` (default ``prompts``) is the text the policy sees: for chat, the question
        without the chat template (see :func:`policy_text`). A probe policy's probe call happens here,
        after the budget checks (so a refused request costs no model call), and only when the rule
        serving the budget reads it. ``ask.model`` (from ``Intake.check_model``) pins the decision to that
        model; ``ask.latency_budget`` (sample lengths, checked in pricing) goes to the policy only when sent.
        Raises EngineUnavailable (503) when an action names a model with no pool. A ``dry_run`` (``/v1/route``)
        reads the key's controller when it exists and keeps none it makes: dry runs never grow the bank nor
        evict anyone's controller.
        """
        policy = self._loaded_policy()  # one policy for the whole request, whatever /admin/reload does
        texts = prompts if ask.policy_prompts is None else ask.policy_prompts
        plan = self._price(policy, principal, ask)
        # reserve for the largest plan the policy can serve, not the server's cap (often far above it)
        most = min(plan.cap, getattr(policy, "max_plan_samples", None) or plan.cap)
        hold = None if dry_run else await self.spend.admit(policy, principal, ask, most, len(prompts))
        if hold is not None and hold.cap < most:  # the quota left buys fewer samples: re-priced with that cap
            plan = self._price(policy, principal, dataclasses.replace(ask, max_samples=hold.cap))
        return await self.spend.released(hold, self._route(policy, texts, prompts, ask, plan, hold, deadline,
                                                           dry_run))

    async def _route(self, policy: ServingPolicy, texts: list[str], prompts: list[str], ask: Ask, plan: BudgetPlan,
                     hold: Hold | None, deadline: Deadline, dry_run: bool) -> Routing:
        ctl = self._controller(plan, policy, keep=not dry_run)
        internal = ctl.internal if self.settings.budget_control else plan.policy_budget
        lr = self.latency.route(plan, policy, keep=not dry_run)
        lat: dict[str, Any] = {} if lr is None else {"latency_budget": lr.internal}
        reads = policy.needs_features(internal, **lat)
        probe = None
        if reads and policy.probe is not None:
            probe = await probe_call(self.backend, texts, policy.probe, plan, deadline, tokenizer=self.tokenizer,
                                     model_flops=self.model_flops)
        with span("isocompute.decide", budget_key=plan.label, internal_budget=float(internal)):
            decision, features = await self._decide(policy, texts, internal, probe, plan, reads, ask.model, lat)
        routing = Routing.of(decision, plan, len(prompts), multi_model=bool(policy.models),
                             internal_budget=float(internal), controller=ctl, probe=probe, features=features,
                             latency_control=lr, quota=hold)
        missing = missing_pools((m for a in routing.model_actions for m in a.models), self.pools)
        if missing:
            raise EngineUnavailable(missing_pools_message(missing, self.pools, "this request's actions"))
        self.ledger.export(routing)
        return routing

    @traced("isocompute.price")
    def _price(self, policy: ServingPolicy, principal: Principal, ask: Ask) -> BudgetPlan:
        s = self.settings
        resolved = budget_unit(ask.budget, ask.unit, s.default_budget_unit)
        flops = (self._sample_flops(policy, ask.prompt_tokens, ask.max_tokens)
                 if "flops" in (resolved, policy.cost_unit) else None)
        plan = price_request(ask.budget, resolved, caller=principal.name, policy_range=policy.budget_range,
                             policy_unit=policy.cost_unit, sample_flops=flops, limits=s,
                             max_samples=ask.max_samples, temperature=ask.temperature, max_tokens=ask.max_tokens,
                             max_waves=ask.max_waves, tokens_per_sample=policy.tokens_per_sample,
                             latency_budget=ask.latency_budget, latency_range=policy.latency_range)
        principal.check_budget(plan.samples)
        return plan

    def _controller(self, plan: BudgetPlan, policy: ServingPolicy, *, keep: bool = True) -> BudgetController:
        """The key's controller (made on first sight; with ``keep`` False one not yet kept is made and
        dropped). Kept with control off too, for its mean-cost metric and so that the metric labels stay
        bounded by the bank's LRU."""
        s = self.settings
        lo, hi = policy.budget_range

        def make() -> BudgetController:
            self._labels[plan.key] = plan.label
            return BudgetController(plan.budget, lo=lo, hi=hi, gain=s.control_gain, max_step=s.control_max_step,
                                    initial=plan.policy_budget)

        if not keep:
            return self.controllers.peek(plan.key) or BudgetController(
                plan.budget, lo=lo, hi=hi, gain=s.control_gain, max_step=s.control_max_step, initial=plan.policy_budget)
        return self.controllers.get(plan.key, make)

    async def _decide(self, policy: ServingPolicy, texts: list[str], internal: float, probe: ProbeCall | None,
                      plan: BudgetPlan, reads: bool, model: str | None, lat: dict[str, Any]
                      ) -> tuple[PolicyDecision, FeatureCall | None]:
        """``policy.decide``; ``reads``: the serving rule reads the features (then the extra blocks are
        computed, and paid for); ``model`` is passed only when a request pins one, ``lat`` (the latency
        budget) only when it sends one."""
        pin: dict[str, Any] = {**lat} if model is None else {"model": model, **lat}

        def decide() -> tuple[PolicyDecision, FeatureCall | None]:
            t0 = time.perf_counter()
            decision = policy.decide(texts, internal, probe=None if probe is None else np.asarray(probe.values),
                                     **pin)
            self.metrics.decision.observe(time.perf_counter() - t0)
            return decision, feature_call(policy, texts, plan) if reads else None

        if reads and policy.feature_extras:
            # a model call per prompt (milliseconds): off the event loop, one at a time (decide is not
            # written to run concurrently with itself)
            return await asyncio.get_running_loop().run_in_executor(self._decide_pool, decide)
        return decide()  # ~0.5 ms: a thread hop would cost more than it frees

    def _sample_flops(self, policy: ServingPolicy, prompt_tokens: list[int] | None, max_tokens: int) -> float | None:
        """FLOPs of one sample, to convert between budget units: the policy's training average when it
        prices in FLOPs, else this request's prompt with a ``max_tokens`` completion (None without the
        model's config)."""
        if policy.sample_flops is not None:
            return policy.sample_flops
        if self.model_flops is None:
            return None
        from isocompute.flops import request_flops

        p = int(np.mean(prompt_tokens)) if prompt_tokens else 64
        return float(request_flops(self.model_flops, p, [max_tokens]))
