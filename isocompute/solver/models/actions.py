"""Actions over several models: a plan on one model, cascades from cheap to strong, and ensemble votes.

An :class:`Action` is a chain of *stages*, each a plan (:mod:`isocompute.solver.plans.plan`) on one model:

* **single** — one stage, ``gpt-oss-20b/lead:m=2@1x4``: the plan on that model, as today;
* **cascade** — ``gpt-oss-20b/lead:m=2@2 > Qwen3-14B/none@2``: run the first stage's plan; if its
  stopping rule fired (after any wave, the last one included) the answer is its vote; if it *ran out*
  (no wave left and the rule never fired) run the next stage's plan on the next model, and so on.
  The final vote (``vote``) is over the last stage's samples (``"last"``) or over every sample drawn
  (``"all"``), each model's samples weighted by its stage weight: ``… > … [w=1,2]``;
* **ensemble** — ``gpt-oss-20b/none@4 + Qwen3-14B/none@2 [w=1,0.5]``: a cascade whose stages before the
  last have no rule, so every stage always runs, with the vote over all samples (MoT's "vote" and
  Best-of-∞'s weighted vote across models).

Each stage's rule reads only its own model's votes (a model's confidence decides whether to escalate);
the weighted vote over answer classes needs classes aligned across models
(:meth:`isocompute.solver.models.tables.ModelTables.with_classes`). Under vote ``"all"`` class g scores
Σ_s w_s · (votes of g among stage s's samples); the top score wins, t tied classes get 1/t each, and a
class is worth the mean correctness of its samples (:meth:`ModelTables.class_values`).

Worked example: A answers a, a, b (a correct) and B answers b, b, a, b (b wrong). ``A/lead:m=2@2 > B/none@1``:
A's first two samples agree (fire) with probability 1/3 and then a wins (U = 1); otherwise B's one sample
decides, a with probability 1/4: U = 1/3 + 2/3 · 1/4 = 1/2. ``A/none@2 + B/none@2 [w=1,1]``: A's pair
is a a (probability 1/3) or a b (2/3), B's pair b b or a b (1/2 each). a a with b b ties 2–2 (credit 1/2),
a a with a b gives a 3–1 (1); a b with b b gives b 3–1 (0), a b with a b ties 2–2 (1/2):
U = 1/3 · (1/2 · 1/2 + 1/2 · 1) + 2/3 · (1/2 · 0 + 1/2 · 1/2) = 1/4 + 1/6 = 5/12.

Names are stable text (stored by the policy, shown by the report and the gateway); :func:`parse_action`
reads them back. :class:`MenuConfig` and :func:`default_actions` build the menu the oracle chooses from;
estimates are :mod:`isocompute.solver.models.estimates`. This module ignores utilities and costs.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from isocompute.errors import InputError
from isocompute.solver.models.tables import check_model_name
from isocompute.solver.plans.plan import Plan, default_plans, parse_plan
from isocompute.solver.plans.rules import NoRule

Vote = Literal["last", "all"]
WEIGHT_GRID = (0.25, 0.5, 1.0, 2.0, 4.0)
_GRAMMAR = ("an action is MODEL/PLAN, stages joined by ' > ' (cascade) or ' + ' (ensemble), with ' [w=W1,W2,…]' "
            "for a vote over all samples, e.g. gpt-oss-20b/lead:m=2@2 > Qwen3-14B/none@2 [w=1,2]")


@dataclass(frozen=True)
class Stage:
    """One plan on one model."""

    model: str
    plan: Plan

    @property
    def name(self) -> str:
        return f"{self.model}/{self.plan.name}"


@dataclass(frozen=True)
class Action:
    """A chain of stages with its final vote (module docstring); ``weights`` one per stage for ``"all"``."""

    stages: tuple[Stage, ...]
    vote: Vote = "last"
    weights: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        stages = tuple(self.stages)
        if not stages or not all(isinstance(s, Stage) for s in stages):
            raise InputError(f"an action needs one or more stages (Stage(model, plan)); got {self.stages!r}.")
        models = [s.model for s in stages]
        if len(set(models)) != len(models):
            raise InputError(f"a cascade uses each model at most once (a model's samples would be drawn twice); "
                             f"got {' > '.join(models)}. Give that model one plan with more waves instead.")
        if self.vote not in ("last", "all"):
            raise InputError(f"vote must be 'last' or 'all', not {self.vote!r}.")
        weights = tuple(float(w) for w in self.weights)
        if self.vote == "all" and len(stages) > 1:
            if len(weights) != len(stages) or not all(0 < w < math.inf for w in weights):
                raise InputError(f"a vote over all samples needs one positive weight per stage ({len(stages)}); "
                                 f"got {self.weights!r}.")
        elif weights:
            raise InputError("weights apply only to a vote over all samples of two or more stages (vote='all').")
        object.__setattr__(self, "stages", stages)
        object.__setattr__(self, "weights", weights)
        if len(stages) == 1:
            object.__setattr__(self, "vote", "last")

    @property
    def kind(self) -> Literal["single", "cascade", "ensemble"]:
        if len(self.stages) == 1:
            return "single"
        if self.vote == "all" and all(isinstance(s.plan.rule, NoRule) for s in self.stages[:-1]):
            return "ensemble"
        return "cascade"

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(s.model for s in self.stages)

    @property
    def max_samples(self) -> dict[str, int]:
        return {s.model: s.plan.max_samples for s in self.stages}

    @functools.cached_property
    def name(self) -> str:  # cached: menus hold thousands of actions and reports ask for every name
        sep = " + " if self.kind == "ensemble" else " > "
        text = sep.join(s.name for s in self.stages)
        if self.weights:
            text += " [w=" + ",".join(_fmt(w) for w in self.weights) + "]"
        return text


def _fmt(w: float) -> str:
    r = repr(float(w))
    return r[:-2] if r.endswith(".0") else r


def parse_action(name: str) -> Action:
    """The action named ``name`` (the inverse of :attr:`Action.name`)."""
    text = name.strip()
    weights: tuple[float, ...] = ()
    if text.endswith("]"):
        text, bracket, spec = text[:-1].rpartition(" [w=")
        if not bracket:
            raise InputError(f"bad action name {name!r}: {_GRAMMAR}.")
        try:
            weights = tuple(float(w) for w in spec.split(","))
        except ValueError:
            raise InputError(f"bad weights {spec!r} in action {name!r}: {_GRAMMAR}.") from None
    ensemble, cascade = " + " in text, " > " in text
    if ensemble and cascade:
        raise InputError(f"bad action name {name!r}: use ' > ' or ' + ' between stages, not both ({_GRAMMAR}).")
    parts = text.split(" + " if ensemble else " > ")
    stages = []
    for part in parts:
        model, slash, plan = part.strip().partition("/")
        if not slash:
            raise InputError(f"bad stage {part!r} in action {name!r}: {_GRAMMAR}.")
        stages.append(Stage(check_model_name(model), parse_plan(plan)))
    if ensemble and (not weights or any(not isinstance(s.plan.rule, NoRule) for s in stages[:-1])):
        raise InputError(f"bad ensemble {name!r}: its stages before the last have no rule (none@k) and it carries "
                         f"weights ({_GRAMMAR}).")
    action = Action(tuple(stages), "all" if weights else "last", weights)
    return action


# --------------------------------------------------------------------------------------------- the menu


def _plans(items: Sequence[Plan | str]) -> tuple[Plan, ...]:
    return tuple(p if isinstance(p, Plan) else parse_plan(p) for p in items)


@dataclass(frozen=True)
class MenuConfig:
    """The menu of multi-model actions; each option is documented here only.

    ``plans``: single-model plans, on every model (default :func:`~isocompute.solver.plans.plan.default_plans`).
    ``chains``: model sequences for cascades (default: every pair, cheap → dear, see :func:`default_actions`).
    ``cascade_first`` / ``cascade_last``: plans of a cascade's earlier stages (default: ``plans`` that have
    a rule, plus the one-wave "k agree" triggers ``lead:m=k@k``, k = 2, 3, 4) and of its last stage
    (default ``plans``); vote over the last stage. ``weighted_first`` / ``weighted_last``: the plans of
    cascades voting over all samples, each with every weight in ``weights`` (the later stages' weight
    relative to the first's). ``ensemble_k``: sample counts k of each model in an ensemble (every pair of
    models, every k × k, every weight). ``n_orders``/``seed``: Monte Carlo orders per prompt for the
    weighted votes (:mod:`isocompute.solver.models.estimates`). ``extra``: further actions, appended.
    """

    plans: tuple[Plan | str, ...] | None = None
    chains: tuple[tuple[str, ...], ...] | None = None
    cascade_first: tuple[Plan | str, ...] | None = None
    cascade_last: tuple[Plan | str, ...] | None = None
    weighted_first: tuple[Plan | str, ...] = ("lead:m=2@2", "lead:m=3@3", "lead:m=4@4", "lead:m=2@1x4",
                                              "lead:m=2@1x2,2,4")
    weighted_last: tuple[Plan | str, ...] = ("none@1", "none@2", "none@4", "lead:m=2@1x4")
    ensemble_k: tuple[int, ...] = (1, 2, 4, 8)
    weights: tuple[float, ...] = WEIGHT_GRID
    n_orders: int = 200
    seed: int = 0
    extra: tuple[Action, ...] = field(default=())

    def __post_init__(self) -> None:
        if not isinstance(self.n_orders, int) or self.n_orders < 2:
            raise InputError(f"n_orders must be an integer >= 2 (standard errors need two orders); got {self.n_orders!r}.")
        if not self.weights or not all(0 < float(w) < math.inf for w in self.weights):
            raise InputError(f"weights must be positive numbers, got {self.weights!r}.")
        if any(not isinstance(k, int) or k < 1 for k in self.ensemble_k):
            raise InputError(f"ensemble_k must be sample counts >= 1, got {self.ensemble_k!r}.")


def default_actions(models_by_cost: Sequence[str], cfg: MenuConfig | None = None) -> list[Action]:
    """The menu for models listed cheapest first: every single-model plan; cascades along every chain
    (default: each pair cheap → dear) with last-stage vote; weighted cascades and ensembles of every
    pair (see :class:`MenuConfig`)."""
    cfg = cfg or MenuConfig()
    models = tuple(check_model_name(m) for m in models_by_cost)
    plans = _plans(cfg.plans) if cfg.plans is not None else tuple(default_plans())
    first = _plans(cfg.cascade_first) if cfg.cascade_first is not None else tuple(
        dict.fromkeys([p for p in plans if not isinstance(p.rule, NoRule)]
                      + [parse_plan(f"lead:m={k}@{k}") for k in (2, 3, 4)]))
    last = _plans(cfg.cascade_last) if cfg.cascade_last is not None else plans
    pairs = list(itertools.combinations(models, 2))
    chains = cfg.chains if cfg.chains is not None else tuple(pairs)
    for chain in chains:
        unknown = [m for m in chain if m not in models]
        if unknown or len(chain) < 2:
            raise InputError(f"cascade chain {chain!r} must name two or more of the models {list(models)}.")
    out = [Action((Stage(m, p),)) for m in models for p in plans]
    for chain in chains:
        for combo in itertools.product(*([first] * (len(chain) - 1)), last):
            out.append(Action(tuple(Stage(m, p) for m, p in zip(chain, combo, strict=True))))
    ws = tuple(float(w) for w in cfg.weights)
    for a, b in pairs:
        for pa, pb in itertools.product(_plans(cfg.weighted_first), _plans(cfg.weighted_last)):
            out += [Action((Stage(a, pa), Stage(b, pb)), "all", (1.0, w)) for w in ws]
        for ka, kb in itertools.product(cfg.ensemble_k, repeat=2):
            pa, pb = Plan((ka,)), Plan((kb,))
            out += [Action((Stage(a, pa), Stage(b, pb)), "all", (1.0, w)) for w in ws]
    out += list(cfg.extra)
    return list(dict.fromkeys(out))
