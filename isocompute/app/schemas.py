"""Request and response schemas: OpenAI's fields in OpenAI's order, then a fenced block of extensions.

Extensions (every request type): ``budget`` — target mean cost per request under this key: samples (default unit),
tokens or FLOPs, or (a tokens-unit policy only) a multiple of one sample's mean completion tokens on the policy's
training table written as a string, ``"4x"`` (resolved to tokens); omitted → the server's ``default_budget``;
``budget_unit`` — ``"samples"`` | ``"tokens"`` | ``"flops"``; ``latency_budget`` — target mean latency per request
in sample lengths (1.0 = waiting for one sample), for a policy fitted with latency budgets (``fit
--latency-budgets``), within its range; ``max_samples`` — hard cap on the samples drawn for this request, over all
its waves (never exceeded, also not by budget control); ``max_waves`` — hard cap on the waves of this request's plan
(at most the server's ``max_waves``); ``strategy`` — ``"majority"`` (plurality vote) | ``"best_of"`` (highest
verifier score, with a verifier) | ``"weighted"`` (each vote weighted by its sample's evidence under the server's
fitted ``vote_file``). A number is a number: ``true`` for a numeric field is a 422 (lax parsing would read it as 1).

OpenAI fields the gateway cannot honour are refused with 400 when they would change the answer's form (``n`` > 1,
``logprobs``, ``tools``, ``echo``, ``suffix``, ``best_of`` > 1, a non-text ``response_format``) and accepted but
ignored otherwise (``stop``, ``top_p``, penalties, ``logit_bias``, ``user``, …). Unknown fields are accepted and
logged. ``seed`` is reduced modulo 2**31 before it reaches an engine, so every back-end accepts it.

Responses follow OpenAI; the first choice carries the aggregated answer (one sample that gave it); ``usage`` adds
``flops``; ``isocompute`` (top level, and per choice of a multi-prompt completion): the decision, the plan as it ran
(:class:`WaveInfo`s), the vote over answer classes, each stage of a multi-model action (:class:`StageInfo`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from isocompute.app.accounting.pricing import budget_as_sent

BudgetUnit = Literal["samples", "tokens", "flops"]
Strategy = Literal["majority", "best_of", "weighted"]
StopReason = Literal["rule", "plan_end", "cap", "deadline", "upstream_error"]
StageStop = Literal["rule", "plan_end", "cap", "deadline", "upstream_error", "escalated"]

_INT64 = 2**63


def _leaves(t: Any) -> set[Any]:
    """The plain types in a type (``int | None`` → {int, NoneType})."""
    return set().union(*map(_leaves, args)) if (args := get_args(t)) else {t}


Budget = Annotated[float | str, BeforeValidator(budget_as_sent)]
"""A budget: a number in ``budget_unit``, or ``"4x"`` (a multiple of one sample's mean tokens)."""
LatencyBudget = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class _Open(BaseModel):
    # Unknown fields are kept (and logged by the route) rather than rejected: clients of newer OpenAI
    # API versions send fields we do not know yet.
    model_config = ConfigDict(extra="allow")

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_numbers(cls, v: Any, info: ValidationInfo) -> Any:
        # pydantic's lax mode reads true as 1: `budget: true` is a client's mistake, never a budget of 1
        leaves = _leaves(cls.model_fields[info.field_name].annotation) if isinstance(v, bool) else set()
        if leaves & {int, float} and bool not in leaves:
            raise PydanticCustomError("number_type", "Input should be a number, not true or false")
        return v


class TextPart(_Open):
    type: str
    text: str | None = None


class ChatMessage(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None


class ChatCompletionRequest(_Open):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    model: str
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    n: int | None = Field(1, ge=1)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    response_format: dict[str, Any] | None = None
    seed: int | None = Field(None, ge=-_INT64, lt=_INT64)
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: dict[str, Any] | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    user: str | None = None
    # --- isocompute extensions -------------------------------------------------------------------
    budget: Budget | None = None
    budget_unit: BudgetUnit | None = None
    latency_budget: LatencyBudget | None = None
    max_samples: int | None = Field(None, ge=1)
    max_waves: int | None = Field(None, ge=1)
    strategy: Strategy = "majority"
    # --- end of extensions -----------------------------------------------------------------------


class CompletionRequest(_Open):
    """``POST /v1/completions``; ``prompt`` may be one string or a list of strings (one choice each)."""

    model: str
    prompt: str | list[str] | list[int] | list[list[int]]
    best_of: int | None = Field(None, ge=1)
    echo: bool | None = False
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    logprobs: int | None = Field(None, ge=0, le=5)
    max_tokens: int | None = Field(None, ge=1)
    n: int | None = Field(1, ge=1)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    seed: int | None = Field(None, ge=-_INT64, lt=_INT64)
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: dict[str, Any] | None = None
    suffix: str | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    user: str | None = None
    # --- isocompute extensions -------------------------------------------------------------------
    budget: Budget | None = None
    budget_unit: BudgetUnit | None = None
    latency_budget: LatencyBudget | None = None
    max_samples: int | None = Field(None, ge=1)
    max_waves: int | None = Field(None, ge=1)
    strategy: Strategy = "majority"
    # --- end of extensions -----------------------------------------------------------------------


class RouteRequest(_Open):
    """``POST /v1/route``: the decision alone. Send ``prompt`` (one or several) or ``messages``."""

    model: str | None = None
    prompt: str | list[str] | None = None
    messages: list[ChatMessage] | None = None
    temperature: float | None = Field(None, ge=0, le=2)  # 0 caps k at 1, as in a real request
    # --- isocompute extensions -------------------------------------------------------------------
    budget: Budget | None = None
    budget_unit: BudgetUnit | None = None
    latency_budget: LatencyBudget | None = None
    max_samples: int | None = Field(None, ge=1)
    max_waves: int | None = Field(None, ge=1)
    # --- end of extensions -----------------------------------------------------------------------


# ---- responses ---------------------------------------------------------------------------------


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    flops: float | None = Field(None, description="FLOPs spent: one shared prefill plus every decode step")


class ProbeInfo(BaseModel):
    """The probe feature's call for one prompt, when the policy has one (its cost is in the request's)."""

    name: str = Field(description="probe feature, e.g. greedy_entropy (mean token entropy of a greedy answer)")
    value: float = Field(description="the feature's value the policy decided on (nats for greedy_entropy)")
    tokens: int = Field(description="tokens the probe's greedy answer generated")
    cost: float = Field(description="the probe's declared cost per request, in policy_unit (in expected_cost)")
    flops: float | None = Field(None, description="FLOPs of this probe call (in flops and usage.flops)")


class WaveInfo(BaseModel):
    """One wave as it ran (completion tokens include aborted samples' partial tokens)."""
    mode: Literal["wait", "parallel-stop"]
    started: int = Field(description="samples asked for")
    finished: int = Field(description="samples that came back complete")
    aborted: int = Field(description="samples aborted when the rule fired mid-wave (paid, not voting)")
    tokens: int = Field(description="completion tokens generated in the wave")
    decode_tokens: int | None = Field(None, description="its longest sample's completion tokens (latency sums these)")
    ended: Literal["rule", "finished"] = Field(description="rule: stopped mid-wave; finished: every sample ended")
    seconds: float | None = Field(None, description="wall-clock seconds from sending the wave to its end")


class StageInfo(BaseModel):
    """One stage of a multi-model action as it ran (a plan on one model's pool)."""

    model: str = Field(description="the model whose pool ran the stage")
    plan: str = Field(description="the stage's plan as run, cut to what max_samples / max_waves left it")
    policy_plan: str = Field(description="the stage's plan in the policy's action")
    waves: int
    wave_sizes: list[int]
    samples: int = Field(description="samples drawn (asked upstream in waves that answered)")
    samples_received: int
    stopped: StageStop = Field(description="rule | plan_end | cap | deadline | upstream_error as for a plan, or "
                                           "escalated: the plan ran out without its rule firing and the next stage ran")
    stop_statistic: float | None = None
    stop_detail: str | None = Field(None, description="the failure that stopped the stage (deadline, upstream_error)")
    votes: dict[str, int] = Field(description="this stage's own vote over answer classes")
    weight: float = Field(description="its samples' weight in a vote over all samples (1 otherwise)")
    flops: float | None = Field(None, description="FLOPs of its samples on its model (None without that "
                                                  "model's config)")


class IsoComputeInfo(BaseModel):
    """What the gateway decided, how its plan ran and how the vote went, for one prompt."""

    model_config = ConfigDict(populate_by_name=True)

    action: int = Field(description="index of the policy's action (its plan)")
    plan: str = Field(description="the plan the gateway ran, RULE@SCHEDULE (the policy's, cut by max_samples / "
                                  "max_waves)")
    policy_plan: str = Field(description="the plan the policy chose, before caps")
    waves: int = Field(description="waves run: upstream calls of n = wave size")
    wave_sizes: list[int] = Field(description="samples drawn in each wave")
    wave_runs: list[WaveInfo] = Field(default_factory=list, description="each wave as it ran, all stages in order")
    tokens: int = Field(0, description="completion tokens generated, every wave (= usage.completion_tokens)")
    stopped: StopReason = Field(description="why sampling stopped: rule (the plan's stopping rule fired), plan_end "
                                            "(no waves left), cap (max_samples / max_waves cut the plan), deadline "
                                            "or upstream_error (a later wave failed; the vote used the waves before)")
    stop_statistic: float | None = Field(None, description="the stopping rule's statistic after the last wave "
                                                           "(e.g. the lead for lead:m); null for the rule none")
    stop_detail: str | None = Field(None, description="the failure that stopped a plan early (deadline, "
                                                      "upstream_error)")
    k: int = Field(description="samples drawn, all waves together")
    policy_k: int = Field(description="the most samples the policy's plan may draw, before caps")
    expected_samples: float | None = Field(None, description="samples the policy expected the plan to draw here")
    expected_waves: float | None = Field(None, description="waves the policy expected the plan to run here")
    rule: str | None = Field(None, description="the rule of the never-worse chain that decided: learned | "
                                               "fixed_plan | uniform")
    rule_evidence: dict[str, Any] | None = Field(None, description="why that rule serves at this budget (the "
                                                                   "cross-validated gains the fit recorded)")
    strategy: Strategy
    answer: str | None = Field(description="winning answer (its class's first extracted answer; null when no "
                                           "sample had one)")
    votes: dict[str, int] = Field(description="answer class → votes (equivalent answers merged), each class "
                                              "shown by its first answer, in order of first occurrence")
    votes_complete: bool = Field(True, description="false when the time limit cut the merging of answers short "
                                                   "(equal answers may then vote apart, never wrongly together)")
    samples_received: int
    partial: bool = Field(description="true when fewer samples came back than were drawn, or a later wave "
                                      "failed; the vote used what arrived")
    lambda_: float | None = Field(None, alias="lambda", description="λ (price of one cost unit) of the decision")
    budget: float = Field(description="the target mean cost per request in budget_unit (a budget written as a "
                                      "multiple, budget_written, resolved to tokens)")
    budget_unit: BudgetUnit
    budget_written: str | None = Field(None, description="the budget as the request wrote it when it was a multiple "
                                                         "of one sample's mean tokens (e.g. 4x); null for a number")
    internal_budget: float = Field(description="budget handed to the policy after online control")
    latency_budget: float | None = Field(None, description="the mean latency budget served, in sample lengths (1.0 = "
                                                           "waiting for one sample); null without one")
    expected_latency: float | None = Field(None, description="the policy's expected latency of this prompt's plan "
                                                             "(mean over draws, sample lengths), latency budgets")
    internal_latency_budget: float | None = Field(None, description="latency budget handed to the policy after "
                                                                    "online control (sample lengths); null without one")
    latency: float | None = Field(None, description="this prompt's realised latency in sample lengths: each wave's "
                                                    "longest completion, summed, over one sample's mean tokens (plus "
                                                    "the policy's per-wave overhead); null without a latency budget")
    latency_s: float | None = Field(None, description="wall-clock seconds of this prompt's waves, summed")
    expected_cost: float | None = Field(None, description="the policy's expected cost of the action, in policy_unit")
    policy_unit: BudgetUnit = Field("samples", description="unit of the policy's budgets and expected costs")
    flops: float | None = None
    probe: ProbeInfo | None = Field(None, description="the probe call the decision used (probe policies only)")
    model_action: str | None = Field(None, description="the multi-model action run (its name, e.g. tiny-s/lead:m=2"
                                                       "@1x2 > tiny-l/none@4); null for a plan on the one model")
    vote: Literal["last", "all"] | None = Field(None, description="a multi-model action's final vote: over the "
                                                                  "last stage's samples, or over all (weighted)")
    stages: list[StageInfo] | None = Field(None, description="each stage that ran, in order (multi-model "
                                                             "actions); the top-level waves, k and flops sum them")
    vote_weights: dict[str, Any] | None = Field(None, description="strategy weighted: weights, scores (gateway.md)")
    evidence: dict[str, Any] | None = Field(None, description="an evidence plan's last check (policy.md)")


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: ChatMessageOut
    logprobs: None = None
    finish_reason: str


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None
    isocompute: IsoComputeInfo


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: None = None
    finish_reason: str
    isocompute: IsoComputeInfo | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    system_fingerprint: str | None = None
    isocompute: IsoComputeInfo


class RouteDecision(BaseModel):
    action: int
    plan: str = Field(description="the plan a request would run (after max_samples / max_waves caps)")
    policy_plan: str = Field(description="the plan the policy chose")
    k: int = Field(description="the most samples the plan may draw (after caps)")
    policy_k: int
    expected_samples: float | None = None
    expected_waves: float | None = None
    expected_cost: float | None = None
    expected_latency: float | None = Field(None, description="the plan's expected latency (sample lengths), under a "
                                                             "latency budget")
    model_action: str | None = Field(None, description="a multi-model policy's action (stages on models)")


class RouteResponse(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    object: Literal["isocompute.route"] = "isocompute.route"
    model: str
    budget: float
    budget_unit: BudgetUnit
    budget_written: str | None = Field(None, description="the budget as written when it was a multiple (4x)")
    internal_budget: float
    latency_budget: float | None = Field(None, description="the mean latency budget served (sample lengths)")
    internal_latency_budget: float | None = Field(None, description="latency budget handed to the policy after "
                                                                    "online control (sample lengths)")
    expected_latency: float | None = Field(None, description="mean over the prompts of their plans' expected "
                                                             "latency (sample lengths), under a latency budget")
    lambda_: float | None = Field(None, alias="lambda")
    rule: str | None = None
    rule_evidence: dict[str, Any] | None = None
    decisions: list[RouteDecision]


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "isocompute"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class HealthResponse(BaseModel):
    status: Literal["ok"] = "ok"


class ReadyResponse(BaseModel):
    ready: bool
    policy_loaded: bool
    upstream_answered: bool
    engine: str | None = None
    detail: str | None = None
    saturated: bool = Field(False, description="every admission slot is taken (max_inflight): a request would wait")
    inflight: int = 0


class ReloadResponse(BaseModel):
    reloaded: bool
    policy_dir: str
