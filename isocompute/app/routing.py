"""A routed request: what the client asked (:class:`Intake` checks it into an :class:`Ask`) and what the
gateway decided for each of its prompts (:class:`Routing`), before anything is sampled.

:class:`Routing` gathers the priced budget (:class:`~isocompute.app.accounting.pricing.BudgetPlan`), the policy's
decision read through the :class:`~isocompute.app.serving_policy.PolicyDecision` contract, and each
prompt's plan cut to the request's caps: ``Plan.capped(max_samples=cap, max_waves=wave cap)``. A policy
whose actions are "k samples at once" may leave ``plans`` empty; its prompts then run the one-wave
plans ``none@k``.

Worked example: the policy chooses ``lead:m=2@1x2,2,4`` (at most 8 samples) and the request sends
``max_samples = 3`` → the plan run is ``lead:m=2@1x3`` (``ks = [3]``, ``policy_ks = [8]``).

:class:`Ask` is a request's options once :class:`Intake` has validated them (OpenAI options the gateway
cannot honour refused, the model it pins checked, sampling resolved, a chat rendered in the model's template,
the prompts checked and counted): what every step after validation reads.

Ignores: running the plans (:mod:`isocompute.app.runner.plan_run`) and the controller's arithmetic
(:mod:`isocompute.app.accounting.budget_control`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel

from isocompute.app.accounting.budget_control import BudgetController
from isocompute.app.accounting.latency_control import LatencyRoute
from isocompute.app.accounting.logs import loggable
from isocompute.app.accounting.pricing import BudgetPlan
from isocompute.app.accounting.quotas import Hold
from isocompute.app.chat import check_text, policy_text, render_chat
from isocompute.app.errors import ModelNotFound
from isocompute.app.runner.extras import FeatureCall, ProbeCall
from isocompute.app.runner.plan_run import SEED_MODULUS
from isocompute.app.runner.pools import check_context
from isocompute.app.schemas import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    RouteDecision,
    RouteRequest,
    RouteResponse,
)
from isocompute.app.serving_policy import PolicyDecision
from isocompute.app.settings import Settings
from isocompute.errors import InputError
from isocompute.solver.models.actions import Action
from isocompute.solver.plans.plan import Plan

__all__ = ["Ask", "Intake", "Routing"]

log = logging.getLogger("isocompute.app")
OFF_LOOP_CHARS = 16_000  # a request with more text than this is templated and tokenised in a worker thread


@dataclass(frozen=True, slots=True)
class Ask:
    """A validated generation (or route) request's options: the budget as sent and its unit, the caps,
    the sampling (``max_tokens``, ``temperature``, ``seed`` reduced mod 2³¹), the answer ``strategy``, the
    latency budget, the model it pins (None: the policy chooses), the prompts' token counts (when a
    tokenizer is known), the text the policy reads (a chat's question without its template; None: the
    prompts) and a chat's messages (each model's stage renders them in its own template)."""

    budget: float | str | None
    unit: str | None
    max_samples: int | None
    max_waves: int | None
    max_tokens: int
    temperature: float
    seed: int | None = None
    strategy: str = "majority"
    latency_budget: float | None = None
    model: str | None = None
    prompt_tokens: list[int] | None = None
    policy_prompts: list[str] | None = None
    messages: Sequence[ChatMessage] | None = None


def _floats(x: Any, n: int) -> list[float] | None:
    return None if x is None else [float(v) for v in np.asarray(x, dtype=float).reshape(-1)][:n]


@dataclass(frozen=True, slots=True)
class Routing:
    """The decision for one request: its priced budget; per prompt the plan to run (the policy's, cut to
    the caps) and the policy's own, their most samples (``ks``, ``policy_ks``), the action, its expected
    cost (policy unit, probe included where read), samples and waves; λ (None for a classifier policy,
    whose knob is the internal budget); the rule of the never-worse chain that decided and its evidence;
    the internal budget handed to the policy and the key's controller; the probe call and the extra
    features when the serving rule reads them; a multi-model policy's action per prompt (``model_actions``,
    empty for a single-model policy, whose prompts run ``plans``; an action's caps apply across its
    stages, :mod:`isocompute.app.runner.action_run`); under a latency budget the request's (served through
    the internal latency budget of ``latency_control``, the key's μ controller) and each prompt's expected
    latency (sample lengths; None without one); the key's spend-quota reservation (``quota``, None for a key
without quotas and for a dry run)."""

    plan: BudgetPlan
    plans: list[Plan]
    policy_plans: list[Plan]
    ks: list[int]
    policy_ks: list[int]
    actions: list[int]
    costs: list[float]
    expected_samples: list[float] | None
    expected_waves: list[float] | None
    lam: float | None
    expected_cost: float
    rule: str | None
    rule_evidence: dict[str, Any] | None
    internal_budget: float
    controller: BudgetController
    probe: ProbeCall | None = None
    features: FeatureCall | None = None
    model_actions: tuple[Action, ...] = ()
    latency_budget: float | None = None
    expected_latency: list[float] | None = None
    latency_control: LatencyRoute | None = None
    quota: Hold | None = None

    @classmethod
    def of(cls, decision: PolicyDecision, plan: BudgetPlan, n: int, *, multi_model: bool = False,
           **rest: Any) -> Routing:
        """``multi_model``: the policy has ``models`` (only then does its decision carry ``model_actions``)."""
        policy_ks = [int(k) for k in np.asarray(decision.k).reshape(-1)]
        actions = [int(a) for a in np.asarray(decision.action_index).reshape(-1)]
        costs = [float(c) for c in np.asarray(decision.costs, dtype=float).reshape(-1)]
        # a policy whose actions are "k samples at once" may leave plans empty: the one-wave plans none@k
        policy_plans = list(decision.plans) or [Plan((k,)) for k in policy_ks]
        model_actions = tuple(decision.model_actions) if multi_model else ()
        if not (len(policy_ks) == len(actions) == len(costs) == len(policy_plans) == n) or (
                model_actions and len(model_actions) != n):
            raise RuntimeError(f"policy returned {len(policy_ks)} decisions for {n} prompts")
        plans = [p.capped(max_samples=plan.cap, max_waves=plan.wave_cap) for p in policy_plans]
        lam = None if decision.lam is None else float(decision.lam)
        served = getattr(decision, "latency_budget", None)  # absent on a decision without latency budgets
        if served is not None and plan.latency_budget is not None:
            served = plan.latency_budget  # the request's; the policy served the internal one
        return cls(plan, plans, policy_plans, [p.max_samples for p in plans], policy_ks, actions, costs,
                   _floats(decision.expected_samples, n), _floats(decision.expected_waves, n), lam,
                   float(decision.expected_cost), decision.rule, decision.rule_evidence, **rest,
                   model_actions=model_actions, latency_budget=None if served is None else float(served),
                   expected_latency=_floats(getattr(decision, "expected_latency", None), n))


GenerationRequest = ChatCompletionRequest | CompletionRequest


class Intake:
    """A request's checks and prompts, before anything is priced: OpenAI options the gateway cannot honour
    refused (400), the model it pins checked, sampling resolved, a chat rendered in the model's template, the
    prompts checked and counted — inline for a small request, in a worker thread for a large one (over
    ``OFF_LOOP_CHARS`` characters), so that templating and tokenising a big body never hold up the event
    loop. ``tokenizer`` and ``context_limit`` are the default pool's."""

    def __init__(self, settings: Settings, tokenizer: Any = None, context_limit: int | None = None) -> None:
        self.settings, self.tokenizer, self.context_limit = settings, tokenizer, context_limit
        # large requests' templating and tokenising (one at a time: the tokenizer is shared)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="isocompute-prep")

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    async def generation(self, req: GenerationRequest, models: Sequence[str]) -> tuple[list[str], Ask]:
        """A chat or completion request's prompts (a chat's rendered) and its :class:`Ask`."""
        log_unknown(req)
        refuse_unsupported(req)
        pin = self.check_model(req.model, models)
        chat = isinstance(req, ChatCompletionRequest)
        max_tokens, temperature, seed = self.sampling(
            (req.max_completion_tokens or req.max_tokens) if chat else req.max_tokens, req.temperature, req.seed)
        prompts, counts = await self.prepare(None if chat else text_prompts(req.prompt),
                                             req.messages if chat else None, max_tokens)
        return prompts, Ask(req.budget, req.budget_unit, req.max_samples, req.max_waves, max_tokens, temperature,
                            seed, req.strategy, req.latency_budget, pin, counts,
                            [policy_text(req.messages)] if chat else None, req.messages if chat else None)

    async def route(self, req: RouteRequest, models: Sequence[str]) -> tuple[list[str], Ask]:
        """A dry run's (``/v1/route``) prompts and :class:`Ask`: exactly one of prompt or messages."""
        log_unknown(req)
        pin = self.check_model(req.model, models)
        if (req.prompt is None) == (req.messages is None):
            raise InputError("send exactly one of prompt (string or list of strings) or messages")
        max_tokens, temperature, _ = self.sampling(None, req.temperature, None)
        prompts, counts = await self.prepare(None if req.messages is not None else text_prompts(req.prompt),
                                             req.messages, max_tokens)
        return prompts, Ask(req.budget, req.budget_unit, req.max_samples, req.max_waves, max_tokens, temperature,
                            latency_budget=req.latency_budget, model=pin, prompt_tokens=counts,
                            policy_prompts=None if req.messages is None else [policy_text(req.messages)])

    def check_model(self, model: str | None, models: Sequence[str]) -> str | None:
        """The model a request pins (one of a multi-model policy's ``models``), None when it pins none."""
        served = self.settings.served_model
        if model is None or model == served:
            return None
        if model in models:
            return model
        if models:
            raise InputError(f"model {model!r} is not served here; send model={served!r} (the policy chooses the "
                             f"models) or one of {', '.join(models)} to pin it (GET /v1/models lists them)")
        raise ModelNotFound(f"model {model!r} is not served here; send model={served!r} (GET /v1/models lists it)")

    async def prepare(self, prompts: Sequence[str] | None, messages: Sequence[ChatMessage] | None,
                      max_tokens: int) -> tuple[list[str], list[int] | None]:
        """The request's prompts (a chat's rendered in its template) and their token counts, checked."""
        s = self.settings
        if messages is not None and len(messages) > s.max_messages:
            raise InputError(f"{len(messages)} messages in one chat; send at most {s.max_messages} (max_messages)")

        def work() -> tuple[list[str], list[int] | None]:
            texts = [self.chat_prompt(messages)] if messages is not None else list(prompts or [])
            return texts, self.check_prompts(texts, max_tokens)

        size = (sum(len(m.content) if isinstance(m.content, str) else sum(len(p.text or "") for p in m.content or ())
                    for m in messages) if messages is not None else sum(map(len, prompts or [])))
        if size <= OFF_LOOP_CHARS:
            return work()
        return await asyncio.get_running_loop().run_in_executor(self._pool, work)

    def chat_prompt(self, messages: Sequence[ChatMessage]) -> str:
        if self.tokenizer is None:
            raise InputError(
                "chat needs the model's chat template and this gateway has no tokenizer; start it with "
                "--model DIR (the checkpoint the upstream serves) or use /v1/completions"
            )
        return render_chat(self.tokenizer, messages)

    def check_prompts(self, prompts: Sequence[str], max_tokens: int) -> list[int] | None:
        """Reject empty, too many or over-long prompts (400); return token counts when a tokenizer is known.
        The context checked is the default pool's; a multi-model action's other models are checked before
        it runs (``Answers.check_context``)."""
        s = self.settings
        if not prompts:
            raise InputError("prompt is empty; send a non-empty string or list of strings")
        if len(prompts) > s.max_batch_prompts:
            raise InputError(f"{len(prompts)} prompts in one request; send at most {s.max_batch_prompts}")
        for i, p in enumerate(prompts):
            if not p.strip():
                raise InputError(f"prompt {i} is empty; send text to answer")
            check_text(p, f"prompt {i}")
            if len(p) > s.max_prompt_chars:
                raise InputError(f"prompt {i} has {len(p)} characters; the limit is {s.max_prompt_chars}, "
                                 "shorten it")
        if self.tokenizer is None:
            return None
        counts = [len(ids) for ids in self.tokenizer(list(prompts), add_special_tokens=True)["input_ids"]]
        if self.context_limit is not None:
            check_context(counts, max_tokens, self.context_limit)
        return counts

    def sampling(self, max_tokens: int | None, temperature: float | None, seed: int | None
                 ) -> tuple[int, float, int | None]:
        s = self.settings
        mt = s.default_max_tokens if max_tokens is None else max_tokens
        if mt > s.max_tokens_limit:
            raise InputError(f"max_tokens={mt} exceeds this server's limit {s.max_tokens_limit}; lower it")
        t = s.temperature if temperature is None else temperature
        return mt, t, None if seed is None else seed % SEED_MODULUS


def log_unknown(req: BaseModel) -> None:
    """One log line naming the unknown fields (at most 10, each escaped and cut: ``accounting.logs``)."""
    if req.model_extra:
        names = sorted(req.model_extra)
        more = f" and {len(names) - 10} more" if len(names) > 10 else ""
        log.info("ignoring unknown request fields: %s%s", ", ".join(loggable(n, 64) for n in names[:10]), more)


def refuse_unsupported(req: GenerationRequest) -> None:
    """400 for OpenAI options that would change the answer's form; we cannot honour them."""
    if req.n not in (None, 1):
        raise InputError(f"n={req.n}: the gateway returns one aggregated choice per prompt; send n=1 and "
                         "control sampling with budget / max_samples")
    if isinstance(req, ChatCompletionRequest):
        if req.logprobs or req.top_logprobs:
            raise InputError("logprobs are not supported; send logprobs=false")
        if req.tools:
            raise InputError("tools are not supported; send no tools")
        fmt = (req.response_format or {}).get("type", "text")
        if fmt != "text":
            raise InputError(f"response_format {fmt!r} is not supported; send type 'text' or omit it")
    else:
        if req.logprobs:
            raise InputError("logprobs are not supported; omit logprobs")
        if req.echo:
            raise InputError("echo=true is not supported; send echo=false")
        if req.suffix:
            raise InputError("suffix is not supported; omit it")
        if req.best_of not in (None, 1):
            raise InputError("best_of is not supported; use strategy='best_of' with budget instead")


def text_prompts(prompt: Any) -> list[str]:
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        return list(prompt)
    raise InputError("prompt must be a string or a list of strings; token-id prompts are not supported")


def route_response(r: Routing, served_model: str, n: int) -> RouteResponse:
    """A dry run's answer: the decision for each of its ``n`` prompts."""
    el = r.expected_latency
    return RouteResponse(
        model=served_model, budget=r.plan.budget, budget_unit=r.plan.unit,  # type: ignore[arg-type]
        budget_written=r.plan.written, internal_budget=r.internal_budget, latency_budget=r.latency_budget,
        internal_latency_budget=None if r.latency_control is None else r.latency_control.internal,
        expected_latency=None if el is None else sum(el) / len(el),
        lambda_=r.lam, rule=r.rule, rule_evidence=r.rule_evidence,
        decisions=[RouteDecision(action=r.actions[i], plan=r.plans[i].name, policy_plan=r.policy_plans[i].name,
                                 k=r.ks[i], policy_k=r.policy_ks[i], expected_cost=r.costs[i],
                                 expected_samples=None if r.expected_samples is None else r.expected_samples[i],
                                 expected_waves=None if r.expected_waves is None else r.expected_waves[i],
                                 expected_latency=None if el is None else el[i],
                                 model_action=r.model_actions[i].name if r.model_actions else None)
                   for i in range(n)],
    )
