"""The gateway's work behind the routes: budget → decision → one upstream call per k → vote → answer.

For a request with prompts ``x_1 … x_P`` under budget key ``(caller, B, unit)``:

1. the key's :class:`~isocompute.app.budget_control.BudgetController` gives the internal budget ``b``
   (``B`` itself when control is off), and ``Policy.decide(prompts, b)`` returns an action (k) per
   prompt, λ and the expected cost;
2. k is capped by the request's ``max_samples`` and the server's ``max_samples`` (never exceeded);
3. prompts with equal k go upstream together in ONE ``engine.generate(prompts, n=k, …)`` call (a single
   prompt → a single call), so the engine shares each prompt's prefix across its k samples;
4. every sample's answer is extracted (``isocompute.tasks.extract.extract_answer``) and voted on
   (``app.aggregate``); the winning sample's text is the answer. Samples that failed upstream (fewer
   than k returned, or ``finish_reason`` ``error``/``abort``) are left out and the answer says ``partial``;
5. the realised cost (k in samples; prefill once + every decode in FLOPs) goes to the controller.

A policy with a probe feature (``policy.config.probe``) needs one cheap model call per prompt before it
can decide: the engine answers the policy text greedily (:func:`isocompute.engines.probe.probe_entropy`,
in the probe spec's prompt format, so the model sees what it saw at fit time) and the mean token entropy
goes to ``decide(..., probe=values)``. The probe is part of the request's cost: ``expected_cost``
includes its declared cost (the policy adds it to every action), ``flops`` and ``usage.flops`` include
the call's FLOPs, the controller is charged k + the probe's cost, and ``isocompute.probe`` itemises it.
A policy with extra feature blocks (``policy.config.feature_extras``, e.g. the minilm sentence
embedding) computes them inside ``decide`` on this machine; they are paid the same way: ``expected_cost``
includes their declared cost (``policy.feature_cost_``), ``flops``/``usage.flops`` include the
encoder's FLOPs for this prompt, and the controller is charged k + their cost (not itemised in the
response yet). Such a ``decide`` runs in the gateway's one decide worker thread, off the event loop (the
encoder takes milliseconds per prompt); a text-only policy decides inline (~0.5 ms).

Chat requests are rendered to one prompt with the model tokenizer's chat template (the transformers
engine's tokenizer, or the tokenizer in ``model_dir`` for vLLM upstreams — the same template vLLM's
own chat endpoint applies).

Budget units: the policy's budgets are in its ``cost_unit`` (samples or FLOPs); a request's budget in the
other unit is converted with the FLOPs of one sample — the policy's training average when it prices in
FLOPs, else this request's prompt with a ``max_tokens`` completion (an overestimate, so the first
requests underspend) — and the controller, which measures the error in the request's unit, corrects the
conversion online. Limits (``max_budget``, a key's ``max_budget``) are in samples.

Ignores: streaming, stop strings, and cancelling the in-process engine's thread on timeout (the call
finishes in the background; the client already got its 504).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from isocompute.app.aggregate import Vote, best_of, majority_vote
from isocompute.app.auth import Principal
from isocompute.app.budget_control import BudgetController, ControllerBank
from isocompute.app.errors import UpstreamBadResponse, UpstreamTimeout
from isocompute.app.metrics import Metrics
from isocompute.app.schemas import ChatMessage, IsoComputeInfo, ProbeInfo
from isocompute.app.settings import Settings
from isocompute.engines.base import Completion, Engine
from isocompute.errors import BudgetError, EngineUnavailable, InputError

log = logging.getLogger("isocompute.app")

FAILED_REASONS = frozenset({"error", "abort"})
SEED_MODULUS = 2**31


class Verifier(Protocol):
    """Scores complete samples for ``strategy="best_of"`` (higher is better)."""

    def score(self, prompt: str, texts: list[str]) -> list[float]: ...


@dataclass(frozen=True, slots=True)
class ProbeCall:
    """The probe feature's call for a request's prompts: per prompt its value, generated tokens, FLOPs
    (None without the model's config) and cost in the request's budget unit; the spec's declared cost."""

    name: str
    values: list[float]
    tokens: list[int]
    flops: list[float | None]
    costs: list[float]
    declared_cost: float


@dataclass(frozen=True, slots=True)
class FeatureCall:
    """The policy's extra feature blocks for a request's prompts: their names, per prompt the encoder's
    FLOPs and the cost in the request's budget unit; the policy's declared cost per request."""

    names: tuple[str, ...]
    flops: list[float]
    costs: list[float]
    declared_cost: float


@dataclass(frozen=True, slots=True)
class Routing:
    """The decision for one request: per-prompt k (capped and as the policy asked), action indices and
    expected costs (in the policy's unit, the probe's included), λ (``None`` for a classifier policy,
    whose knob is the internal budget), the budget bookkeeping the response reports, and the probe call
    and the extra features when the policy has them."""

    ks: list[int]
    policy_ks: list[int]
    actions: list[int]
    costs: list[float]
    lam: float | None
    expected_cost: float
    policy_unit: str
    budget: float
    unit: str
    internal_budget: float
    budget_key: str
    controller: BudgetController | None
    probe: ProbeCall | None = None
    features: FeatureCall | None = None


@dataclass(frozen=True, slots=True)
class Answer:
    """One prompt's aggregated answer, ready to become a response choice."""

    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    flops: float | None
    info: IsoComputeInfo


def _message_text(i: int, m: ChatMessage) -> str:
    if isinstance(m.content, list):
        parts = []
        for part in m.content:
            if part.type != "text" or part.text is None:
                raise InputError(f"messages[{i}] has a {part.type!r} part; only text parts are supported")
            parts.append(part.text)
        return "".join(parts)
    return m.content or ""


def policy_text(messages: Sequence[ChatMessage]) -> str:
    """The text the policy's features are computed from: the last user message.

    Outcome tables hold the bare question in ``prompt`` and the policy was fitted on it, so features of
    the chat-templated string (role markers, system prompt) would be out of distribution.
    """
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].role == "user":
            return _message_text(i, messages[i])
    return _message_text(len(messages) - 1, messages[-1])


def render_chat(tokenizer: Any, messages: Sequence[ChatMessage]) -> str:
    """One prompt string from OpenAI chat messages via the tokenizer's chat template.

    Raises :class:`InputError` for non-text content or a tokenizer without a template.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise InputError("the served model's tokenizer has no chat template; use /v1/completions instead")
    rendered = [{"role": "system" if m.role == "developer" else m.role, "content": _message_text(i, m)}
                for i, m in enumerate(messages)]
    if not any(r["content"].strip() for r in rendered):
        raise InputError("every message is empty; send at least one message with text content")
    text = tokenizer.apply_chat_template(rendered, tokenize=False, add_generation_prompt=True)
    # Templates often render BOS while encoding adds it again; a doubled BOS is out of distribution.
    bos = getattr(tokenizer, "bos_token", None)
    if bos and text.startswith(bos):
        ids = tokenizer("")["input_ids"]
        if ids and ids[0] == getattr(tokenizer, "bos_token_id", None):
            text = text[len(bos):]
    return str(text)


def policy_budget_range(policy: Any) -> tuple[float, float]:
    """The budgets the policy was calibrated for, in :func:`policy_cost_unit`."""
    lo, hi = policy.budget_range
    return float(lo), float(hi)


def policy_cost_unit(policy: Any) -> str:
    """``samples`` or ``flops``: the unit of the policy's budgets and costs."""
    config = getattr(policy, "config", None)
    return str(getattr(config, "cost_unit", "samples"))


def policy_probe(policy: Any) -> Any:
    """The policy's :class:`~isocompute.policy.policy.ProbeSpec`, or None (policies without a probe)."""
    return getattr(getattr(policy, "config", None), "probe", None)


def policy_extras(policy: Any) -> tuple[str, ...]:
    """Names of the policy's extra feature blocks (e.g. ``("minilm",)``), empty without."""
    return tuple(getattr(getattr(policy, "config", None), "feature_extras", ()) or ())


def policy_feature_cost(policy: Any) -> float:
    """The declared cost per request of the policy's extra feature blocks, in its unit (0 without)."""
    return float(getattr(policy, "feature_cost_", 0.0) or 0.0)


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
    ) -> None:
        self.policy = policy
        self.engine = engine
        self.settings = settings
        self.metrics = metrics
        self.extract = extract
        self.tokenizer = tokenizer
        self.model_flops = model_flops
        self.context_limit = context_limit
        self.verifier = verifier
        self.upstream_answered = False
        self.controllers = ControllerBank(max_keys=settings.control_max_keys,
                                          on_evict=lambda key: metrics.forget(_key_label(key)))
        self._decide_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="isocompute-decide")

    def close(self) -> None:
        """Stop the decide worker (requests still running in it finish first)."""
        self._decide_pool.shutdown(wait=True, cancel_futures=True)

    # ---- policy ---------------------------------------------------------------------------------

    def replace_policy(self, policy: Any) -> None:
        """Swap in a reloaded policy; the old controllers' internal budgets no longer apply."""
        self.policy = policy
        self.controllers.clear()

    # ---- input checks ---------------------------------------------------------------------------

    def check_model(self, model: str | None) -> None:
        from isocompute.app.errors import ModelNotFound

        if model is not None and model != self.settings.served_model:
            raise ModelNotFound(
                f"model {model!r} is not served here; send model={self.settings.served_model!r} "
                "(GET /v1/models lists it)"
            )

    def chat_prompt(self, messages: Sequence[ChatMessage]) -> str:
        if self.tokenizer is None:
            raise InputError(
                "chat needs the model's chat template and this gateway has no tokenizer; start it with "
                "--model DIR (the checkpoint the upstream serves) or use /v1/completions"
            )
        return render_chat(self.tokenizer, messages)

    def check_prompts(self, prompts: Sequence[str], max_tokens: int) -> list[int] | None:
        """Reject empty, too many or over-long prompts (400); return token counts when a tokenizer is known."""
        s = self.settings
        if not prompts:
            raise InputError("prompt is empty; send a non-empty string or list of strings")
        if len(prompts) > s.max_batch_prompts:
            raise InputError(f"{len(prompts)} prompts in one request; send at most {s.max_batch_prompts}")
        for i, p in enumerate(prompts):
            if not p.strip():
                raise InputError(f"prompt {i} is empty; send text to answer")
            if len(p) > s.max_prompt_chars:
                raise InputError(f"prompt {i} has {len(p)} characters; the limit is {s.max_prompt_chars}, "
                                 "shorten it")
        if self.tokenizer is None:
            return None
        counts = [len(ids) for ids in self.tokenizer(list(prompts), add_special_tokens=True)["input_ids"]]
        if self.context_limit is not None:
            for i, n in enumerate(counts):
                if n + max_tokens > self.context_limit:
                    raise InputError(
                        f"prompt {i} has {n} tokens; with max_tokens={max_tokens} that exceeds the model's "
                        f"context of {self.context_limit} tokens; shorten the prompt or lower max_tokens"
                    )
        return counts

    def sampling(self, max_tokens: int | None, temperature: float | None, seed: int | None
                 ) -> tuple[int, float, int | None]:
        s = self.settings
        mt = s.default_max_tokens if max_tokens is None else max_tokens
        if mt > s.max_tokens_limit:
            raise InputError(f"max_tokens={mt} exceeds this server's limit {s.max_tokens_limit}; lower it")
        t = s.temperature if temperature is None else temperature
        return mt, t, None if seed is None else seed % SEED_MODULUS

    # ---- routing --------------------------------------------------------------------------------

    async def route(
        self,
        prompts: list[str],
        *,
        principal: Principal,
        budget: float | None,
        unit: str | None,
        max_samples: int | None,
        max_tokens: int,
        prompt_tokens: list[int] | None = None,
        policy_prompts: list[str] | None = None,
    ) -> Routing:
        """Decide k for every prompt (see the module docstring). Raises BudgetError / PermissionDenied.

        ``policy_prompts`` (default ``prompts``) is the text the policy sees: for chat, the question
        without the chat template (see :func:`policy_text`). A probe policy's probe call happens here,
        after the budget checks, so a refused request costs no model call.
        """
        s = self.settings
        policy = self.policy  # one policy for the whole request, whatever /admin/reload does meanwhile
        if policy is None:
            raise EngineUnavailable("no policy loaded; start the gateway with --policy DIR or POST /admin/reload")
        unit = unit or (s.default_budget_unit if budget is None else "samples")
        B = s.default_budget if budget is None else float(budget)
        lo, hi = policy_budget_range(policy)
        p_unit = policy_cost_unit(policy)
        per_sample = 1.0 if unit == p_unit == "samples" else self._flops_per_sample(prompt_tokens, max_tokens)
        b_samples = B if unit == "samples" else B / per_sample
        b_policy = b_samples if p_unit == "samples" else b_samples * per_sample
        shown = (f"{B:g} samples" if unit == "samples" else
                 f"{B:g} FLOPs (≈ {b_samples:.3g} samples of up to {max_tokens} tokens here)")
        if b_samples > s.max_budget:
            raise BudgetError(f"budget {shown} exceeds this server's max_budget {s.max_budget:g} samples; "
                              "send a smaller budget")
        if not (lo <= b_policy <= hi):
            rng = f"[{lo:g}, {hi:g}] {p_unit}"
            raise BudgetError(f"budget {shown} is outside the policy's calibrated range {rng} per request; "
                              "send a budget in that range")
        principal.check_budget(b_samples)
        key = (principal.name, B, unit)
        ctl = None
        internal = b_policy
        if s.budget_control:
            ctl = self.controllers.get(key, lambda: BudgetController(
                B, lo=lo, hi=hi, gain=s.control_gain, max_step=s.control_max_step, initial=b_policy))
            internal = ctl.internal
        texts = prompts if policy_prompts is None else policy_prompts
        probe = None
        spec = policy_probe(policy)
        if spec is not None:
            probe = await self._probe_feature(texts, spec, unit, p_unit, per_sample)

        def decide() -> tuple[Any, FeatureCall | None]:
            t0 = time.perf_counter()
            if probe is None:
                decision = policy.decide(texts, internal)
            else:
                decision = policy.decide(texts, internal, probe=np.asarray(probe.values))
            self.metrics.decision.observe(time.perf_counter() - t0)
            return decision, self._feature_call(policy, texts, unit, p_unit, per_sample)

        if policy_extras(policy):
            # a model call per prompt (milliseconds): off the event loop, one at a time (decide is not
            # written to run concurrently with itself)
            decision, features = await asyncio.get_running_loop().run_in_executor(self._decide_pool, decide)
        else:
            decision, features = decide()  # ~0.5 ms: a thread hop would cost more than it frees
        policy_ks = [int(k) for k in np.asarray(decision.k).reshape(-1)]
        actions = [int(a) for a in np.asarray(decision.action_index).reshape(-1)]
        costs = [float(c) for c in np.asarray(decision.costs, dtype=float).reshape(-1)]
        if not (len(policy_ks) == len(actions) == len(prompts)):
            raise RuntimeError(f"policy returned {len(policy_ks)} decisions for {len(prompts)} prompts")
        cap = min(s.max_samples, max_samples or s.max_samples)
        ks = [max(1, min(k, cap)) for k in policy_ks]
        lam = decision.lam
        label = _key_label(key)
        if lam is not None:
            self.metrics.lam.labels(label).set(float(lam))
        self.metrics.internal_budget.labels(label).set(internal)
        return Routing(ks, policy_ks, actions, costs, None if lam is None else float(lam),
                       float(decision.expected_cost), p_unit, B, unit, float(internal), label, ctl, probe, features)

    async def _probe_feature(self, texts: list[str], spec: Any, unit: str, p_unit: str,
                             per_sample: float) -> ProbeCall:
        """Run the policy's probe on ``texts`` and price each call in the request's unit ``unit``.

        Samples: the declared cost (converted with ``per_sample`` FLOPs when the policy prices in FLOPs).
        FLOPs: the call's analytic FLOPs when the model's config is known, else the declared cost.
        """
        from isocompute.app.batching import BatchingEngine
        from isocompute.engines.probe import probe_entropy, probe_flops

        if spec.prompt_format == "chat":
            if self.tokenizer is None:
                raise EngineUnavailable("this policy's probe runs on the chat template and this gateway has no "
                                        "tokenizer; start it with --model DIR (the checkpoint the upstream serves)")
            from isocompute.engines.transformers_engine import apply_chat_template

            shown = [apply_chat_template(self.tokenizer, t) for t in texts]
        else:
            shown = [t + "\n" for t in texts]
        engine = self.engine.engine if isinstance(self.engine, BatchingEngine) else self.engine
        try:
            res = await asyncio.wait_for(probe_entropy(engine, shown, spec.max_tokens),
                                         timeout=self.settings.upstream_timeout_s)
        except TimeoutError:
            self.metrics.upstream_errors.labels("timeout").inc()
            raise UpstreamTimeout(f"the probe call to {self.engine.name} did not answer within "
                                  f"{self.settings.upstream_timeout_s:g} s; retry later or raise upstream_timeout_s"
                                  ) from None
        except EngineUnavailable:
            self.metrics.upstream_errors.labels("unavailable").inc()
            raise
        flops: list[float | None] = [None] * len(texts)
        if self.model_flops is not None:
            flops = [float(f) for f in probe_flops(self.model_flops, res.prompt_tokens, res.completion_tokens)]
        declared = float(spec.cost)
        if unit == "samples":
            c = declared if p_unit == "samples" else declared / per_sample
            costs = [c] * len(texts)
        else:
            fallback = declared if p_unit == "flops" else declared * per_sample
            costs = [fallback if f is None else f for f in flops]
        return ProbeCall(spec.name, [float(v) for v in res.values], [int(m) for m in res.completion_tokens],
                         flops, costs, declared)

    def _feature_call(self, policy: Any, texts: list[str], unit: str, p_unit: str,
                      per_sample: float) -> FeatureCall | None:
        """The extra feature blocks' FLOPs per prompt and their cost in the request's unit ``unit`` (None
        when the policy has none). Samples: the declared cost (converted with ``per_sample`` FLOPs when
        the policy prices in FLOPs); FLOPs: the encoder's FLOPs for this prompt."""
        if not policy_extras(policy):
            return None
        flops = [float(f) for f in policy.features_.extra_flops(texts)]
        declared = policy_feature_cost(policy)
        if unit == "samples":
            costs = [declared if p_unit == "samples" else declared / per_sample] * len(texts)
        else:
            costs = list(flops)
        return FeatureCall(policy_extras(policy), flops, costs, declared)

    def _flops_per_sample(self, prompt_tokens: list[int] | None, max_tokens: int) -> float:
        """FLOPs one sample costs, to convert between budget units: the policy's training average when
        it prices in FLOPs, else this request's prompt with a ``max_tokens`` completion."""
        if policy_cost_unit(self.policy) == "flops":
            # the probe's and extra features' costs are in every action's cost, not a sample's
            paid = float(getattr(policy_probe(self.policy), "cost", 0.0)) + policy_feature_cost(self.policy)
            per = ((np.asarray(self.policy.action_costs_, dtype=float) - paid)
                   / np.asarray(self.policy.actions, dtype=float))
            return float(per.mean())
        if self.model_flops is None:
            raise BudgetError("budget_unit 'flops' needs the model's config for FLOP accounting; start the "
                              "gateway with --model DIR, or send the budget in samples")
        from isocompute.flops import request_flops

        p = int(np.mean(prompt_tokens)) if prompt_tokens else 64
        return float(request_flops(self.model_flops, p, [max_tokens]))

    # ---- completion -----------------------------------------------------------------------------

    async def complete(
        self,
        prompts: list[str],
        routing: Routing,
        *,
        max_tokens: int,
        temperature: float,
        seed: int | None,
        strategy: str,
    ) -> list[Answer]:
        """Sample, vote and account for every prompt of a routed request."""
        if strategy == "best_of" and self.verifier is None:
            raise InputError("strategy 'best_of' needs a verifier and this server has none configured; "
                             "use strategy 'majority'")
        groups: dict[int, list[int]] = {}
        for i, k in enumerate(routing.ks):
            groups.setdefault(k, []).append(i)
        results: list[list[Completion]] = [[] for _ in prompts]
        t0 = time.perf_counter()
        try:
            outs = await asyncio.wait_for(
                asyncio.gather(*(self.engine.generate([prompts[i] for i in idx], k, max_tokens, temperature, seed)
                                 for k, idx in groups.items())),
                timeout=self.settings.upstream_timeout_s,
            )
        except TimeoutError:
            self.metrics.upstream_errors.labels("timeout").inc()
            raise UpstreamTimeout(
                f"upstream {self.engine.name} did not answer within {self.settings.upstream_timeout_s:g} s; "
                "retry later, lower max_tokens or budget, or raise upstream_timeout_s"
            ) from None
        except EngineUnavailable:
            self.metrics.upstream_errors.labels("unavailable").inc()
            raise
        self.metrics.upstream_latency.observe(time.perf_counter() - t0)
        for (_k, idx), out in zip(groups.items(), outs, strict=True):
            if not isinstance(out, list) or len(out) != len(idx):
                self.metrics.upstream_errors.labels("bad_response").inc()
                raise UpstreamBadResponse(f"upstream {self.engine.name} returned {len(out)} results for "
                                          f"{len(idx)} prompts; check the upstream server")
            for i, comps in zip(idx, out, strict=True):
                results[i] = list(comps)
        self.upstream_answered = True
        return [self._answer(prompts[i], results[i], routing, i, strategy, seed) for i in range(len(prompts))]

    def _answer(self, prompt: str, comps: list[Completion], routing: Routing, i: int, strategy: str,
                seed: int | None) -> Answer:
        k = routing.ks[i]
        ok = [c for c in comps if c.finish_reason not in FAILED_REASONS][:k]
        if not ok:
            self.metrics.upstream_errors.labels("bad_response").inc()
            raise UpstreamBadResponse(f"upstream {self.engine.name} returned no usable sample of {k}; "
                                      "check the upstream server and retry")
        if len(ok) < k:
            self.metrics.upstream_errors.labels("partial").inc()
        answers = [self.extract(c.text) for c in ok]
        vote: Vote
        if strategy == "best_of":
            assert self.verifier is not None
            vote = best_of(answers, self.verifier.score(prompt, [c.text for c in ok]))
        else:
            vote = majority_vote(answers, tie_break=self.settings.tie_break, seed=seed)
        chosen = ok[vote.index]
        prompt_tokens = max(c.prompt_tokens for c in comps)
        completion_tokens = sum(c.completion_tokens for c in comps)
        flops = None
        pr, fe = routing.probe, routing.features
        if self.model_flops is not None:
            from isocompute.flops import request_flops

            flops = float(request_flops(self.model_flops, prompt_tokens, [c.completion_tokens for c in comps]))
            if pr is not None and pr.flops[i] is not None:
                flops += float(pr.flops[i])  # type: ignore[arg-type]
            if fe is not None:
                flops += fe.flops[i]
            self.metrics.flops.inc(flops)
        self.metrics.k.observe(k)
        self.metrics.samples.inc(k)
        if routing.controller is not None:
            # Without the model's config, a FLOP budget is charged the policy's expected cost of the action
            # (which includes the probe's and extra features' declared costs).
            paid = (0.0 if pr is None else pr.costs[i]) + (0.0 if fe is None else fe.costs[i])
            cost = (float(k) + paid if routing.unit == "samples"
                    else (flops if flops is not None else routing.costs[i]))
            if math.isfinite(cost):
                routing.controller.observe(cost)
                st = routing.controller.state()
                if st.mean_cost is not None:
                    self.metrics.mean_cost.labels(routing.budget_key).set(st.mean_cost)
        info = IsoComputeInfo(
            action=routing.actions[i], k=k, policy_k=routing.policy_ks[i], strategy=strategy,  # type: ignore[arg-type]
            answer=vote.answer, votes=vote.counts, samples_received=len(ok), partial=len(ok) < k,
            lambda_=routing.lam, budget=routing.budget, budget_unit=routing.unit,  # type: ignore[arg-type]
            internal_budget=routing.internal_budget, expected_cost=routing.costs[i],
            policy_unit=routing.policy_unit, flops=flops,  # type: ignore[arg-type]
            probe=None if pr is None else ProbeInfo(name=pr.name, value=pr.values[i], tokens=pr.tokens[i],
                                                    cost=pr.declared_cost, flops=pr.flops[i]),
        )
        return Answer(chosen.text, chosen.finish_reason, prompt_tokens, completion_tokens, flops, info)

    # ---- readiness ------------------------------------------------------------------------------

    async def probe(self) -> None:
        """Make one real 1-token request until the upstream answers (sets ``upstream_answered``)."""
        deadline = time.monotonic() + self.settings.ready_probe_timeout_s
        delay = 0.25
        while not self.upstream_answered:
            try:
                out = await asyncio.wait_for(self.engine.generate(["1 + 1 ="], 1, 1, 0.0, 0),
                                             timeout=self.settings.upstream_timeout_s)
                if out and out[0]:
                    self.upstream_answered = True
                    return
            except (EngineUnavailable, InputError, TimeoutError) as e:
                log.info("readiness probe: upstream not ready yet (%s)", e)
            if time.monotonic() > deadline:
                log.warning("upstream did not answer a real request within %.0f s; /ready stays 503 until one "
                            "request succeeds", self.settings.ready_probe_timeout_s)
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)


def _key_label(key: Any) -> str:
    name, budget, unit = key
    return f"{name}:{budget:g}{unit}"
