"""Plans: a schedule of sample waves plus a stopping rule checked between them — the solver's actions.

A plan with waves w₁, w₂, …, w_L draws w₁ samples (one request with n = w₁), lets its rule look at the
vote, stops or draws w₂, and so on; after the last wave it stops whatever the vote says. It draws at most
Σ w_l samples in at most L requests. "k samples at once" is the one-wave plan with no rule.

Names are stable text, stored in ``policy.json`` and shown in reports and by the gateway:
``RULE@SCHEDULE`` where RULE is a rule name (:func:`isocompute.solver.plans.rules.parse_rule`) and SCHEDULE
lists the waves, ``AxB`` standing for B waves of A:

    none@4                      4 samples at once (today's uniform action k = 4)
    lead:m=2@1x16               one sample at a time until the leader leads by 2, at most 16
    window:w=3@3x5,1            ESC: windows of 3 until one is unanimous, at most 16
    bayes:B=10,alpha=0.3,top=5@1x2,2,4,8   doubling waves 1, 1, 2, 4, 8 (≤ 16 samples, ≤ 5 requests)
    boinf:B=10,alpha=0.3@1x16   Best-of-∞ as published, one sample at a time, at most 16

Worked example: ``lead:m=2@1x2,2,4,8`` on answers a, a, … stops after the second wave (2 samples,
2 requests, lead 2); on a, b, a, a it stops after the third (4 samples, 3 requests, lead 2).

:func:`plan_family` builds a rule family over a parameter grid; :func:`default_plans` is the ~30-plan
menu the allocation chooses from. This module ignores costs and estimates
(:mod:`isocompute.solver.plans.estimates`).
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from isocompute.errors import InputError
from isocompute.solver.plans.rules import RULES, NoRule, StopDecision, StoppingRule, parse_rule

MAX_PLAN_SAMPLES = 1000
_GRAMMAR = ("a plan is RULE@SCHEDULE, e.g. none@4, lead:m=2@1x16, window:w=3@3x5,1, "
            "bayes:B=10,alpha=0.3,top=5@1x2,2,4,8 (AxB = B waves of A samples)")


def schedule_name(waves: Sequence[int]) -> str:
    """(1, 1, 2, 4, 8) → ``1x2,2,4,8``; (1,)*16 → ``1x16``; (4,) → ``4``."""
    out = []
    for size, group in itertools.groupby(waves):
        n = len(list(group))
        out.append(f"{size}x{n}" if n > 1 else str(size))
    return ",".join(out)


def parse_schedule(text: str) -> tuple[int, ...]:
    waves: list[int] = []
    for item in text.split(","):
        size, x, count = item.strip().partition("x")
        try:
            waves += [int(size)] * (int(count) if x else 1)
        except ValueError:
            raise InputError(f"bad wave schedule {text!r}: {item!r} is not N or NxCOUNT ({_GRAMMAR}).") from None
    return tuple(waves)


@dataclass(frozen=True)
class PlanStep:
    """What a plan says after a wave: the rule's decision, whether to stop, why (``"rule"``: the rule
    fired; ``"plan_end"``: no waves left; ``"continue"``), and the size of the next wave (None: stop)."""

    decision: StopDecision
    stop: bool
    reason: Literal["rule", "plan_end", "continue"]
    next_wave: int | None
    waves_done: int


@dataclass(frozen=True)
class Plan:
    """A wave schedule and a stopping rule; see the module docstring."""

    waves: tuple[int, ...]
    rule: StoppingRule = field(default_factory=NoRule)

    def __post_init__(self) -> None:
        waves = tuple(self.waves)
        if not waves or any(not isinstance(w, int) or isinstance(w, bool) or w < 1 for w in waves):
            raise InputError(f"a plan needs one or more waves of >= 1 samples each, got {self.waves!r}.")
        if sum(waves) > MAX_PLAN_SAMPLES:
            raise InputError(f"a plan may draw at most {MAX_PLAN_SAMPLES} samples; {schedule_name(waves)} "
                             f"draws {sum(waves)}.")
        if not isinstance(self.rule, StoppingRule):
            raise InputError(f"a plan's rule must be a StoppingRule (e.g. parse_rule('lead:m=2')), got {self.rule!r}.")
        object.__setattr__(self, "waves", waves)

    @property
    def name(self) -> str:
        return f"{self.rule.name}@{schedule_name(self.waves)}"

    @property
    def max_samples(self) -> int:
        return sum(self.waves)

    @property
    def n_waves(self) -> int:
        return len(self.waves)

    @property
    def boundaries(self) -> tuple[int, ...]:
        """Samples drawn after each wave: the cumulative sums of the waves."""
        return tuple(itertools.accumulate(self.waves))

    def step(self, answers: Sequence[Hashable | None]) -> PlanStep:
        """After a wave: ``answers`` are the answer classes of every sample drawn so far (None = no
        answer), in order; their number must be one of :attr:`boundaries`."""
        bounds = self.boundaries
        try:
            done = bounds.index(len(answers)) + 1
        except ValueError:
            raise InputError(f"plan {self.name} checks its rule after {list(bounds)} samples, not after "
                             f"{len(answers)}; pass every answer drawn so far.") from None
        decision = self.rule.should_stop(answers)
        if decision.stop:
            return PlanStep(decision, True, "rule", None, done)
        if done == len(bounds):
            return PlanStep(decision, True, "plan_end", None, done)
        return PlanStep(decision, False, "continue", self.waves[done], done)

    def capped(self, *, max_samples: int | None = None, max_waves: int | None = None) -> Plan:
        """This plan cut to at most ``max_samples`` samples (the wave that crosses the cap shrinks to
        fit) and ``max_waves`` requests — a request's and a server's hard limits."""
        for name, v in (("max_samples", max_samples), ("max_waves", max_waves)):
            if v is not None and (not isinstance(v, int) or v < 1):
                raise InputError(f"{name} must be an integer >= 1, got {v!r}.")
        waves = list(self.waves[:max_waves] if max_waves else self.waves)
        if max_samples is not None:
            kept, left = [], max_samples
            for w in waves:
                if left <= 0:
                    break
                kept.append(min(w, left))
                left -= kept[-1]
            waves = kept
        return Plan(tuple(waves), self.rule)


def parse_plan(name: str) -> Plan:
    """The plan named ``name`` (the inverse of :attr:`Plan.name`)."""
    rule_text, at, sched = name.strip().rpartition("@")
    if not at or not rule_text or not sched:
        raise InputError(f"bad plan name {name!r}: {_GRAMMAR}.")
    return Plan(parse_schedule(sched), parse_rule(rule_text))


# --------------------------------------------------------------------------------------------- families

FAMILY_GRIDS: dict[str, dict[str, tuple]] = {
    "uniform": {"k": (1, 2, 4, 8, 16)},
    "lead": {"m": (2, 3, 4)},
    "window": {"w": (2, 3, 4)},
    "beta": {"p": (0.75, 0.9, 0.95, 0.99)},
    "dirichlet": {"p": (0.8, 0.9, 0.95)},
    "bayes": {"B": (3.0, 10.0, 30.0, 100.0)},
    "boinf": {"B": (3.0, 10.0, 30.0, 100.0)},  # Best-of-∞ as published; not in default_plans()
}
_EXTRA_PARAMS = {"bayes": {"alpha", "top"}, "dirichlet": {"alpha", "top"}, "boinf": {"alpha"}}  # off-grid
Schedule = Literal["single", "doubling", "window"] | int


def schedule_waves(schedule: Schedule, k_max: int, rule: StoppingRule | None = None) -> tuple[int, ...]:
    """Waves summing to ``k_max``: ``"single"`` one sample at a time; ``"doubling"`` 1, 1, 2, 4, …
    (the boundaries double); ``"window"`` waves of the window rule's w (ESC); an int W: waves of W.
    The last wave shrinks so the total is exactly ``k_max``."""
    if not isinstance(k_max, int) or k_max < 1:
        raise InputError(f"k_max must be an integer >= 1, got {k_max!r}.")
    if schedule == "single":
        return (1,) * k_max
    if schedule == "doubling":
        waves, total = [1], 1
        while total < k_max:
            waves.append(min(total, k_max - total))
            total += waves[-1]
        return tuple(waves)
    if schedule == "window":
        size = getattr(rule, "w", None)
        if size is None:
            raise InputError("schedule 'window' needs the window rule (waves of its w); use 'single', "
                             "'doubling' or a wave size for other rules.")
        schedule = size
    if isinstance(schedule, int) and not isinstance(schedule, bool) and schedule >= 1:
        full, rest = divmod(k_max, schedule)
        return (schedule,) * full + ((rest,) if rest else ())
    raise InputError(f"unknown schedule {schedule!r}; use 'single', 'doubling', 'window' or a wave size >= 1.")


def plan_family(family: str, *, k_max: int | Sequence[int] = 16, schedule: Schedule | None = None,
                **grid: Sequence) -> list[Plan]:
    """Plans of one rule family over a parameter grid (defaults: :data:`FAMILY_GRIDS`), for each
    ``k_max``. ``uniform`` gives ``none@k`` for ``k`` in its grid (``k_max`` unused). The default
    schedule is ESC's waves of w for ``window``, one sample at a time otherwise.

    >>> [p.name for p in plan_family("lead", m=[2, 3], k_max=[4, 8])]
    ['lead:m=2@1x4', 'lead:m=2@1x8', 'lead:m=3@1x4', 'lead:m=3@1x8']
    """
    if family not in FAMILY_GRIDS:
        raise InputError(f"unknown plan family {family!r}; families: {', '.join(FAMILY_GRIDS)}.")
    allowed = FAMILY_GRIDS[family]
    bad = sorted(set(grid) - set(allowed) - _EXTRA_PARAMS.get(family, set()))
    if bad:
        raise InputError(f"plan family {family!r} has no parameter {bad[0]!r}; its grid takes "
                         f"{', '.join(allowed)}.")
    values = {**allowed, **{k: tuple(v) if isinstance(v, Sequence) and not isinstance(v, str) else (v,)
                            for k, v in grid.items()}}
    if family == "uniform":
        return [Plan((int(k),)) for k in values["k"]]
    k_maxes = (k_max,) if isinstance(k_max, int) else tuple(k_max)
    names = list(values)
    out = []
    for combo in itertools.product(*(values[n] for n in names)):
        rule = RULES[family](**dict(zip(names, combo, strict=True)))
        for km in k_maxes:
            sched = schedule if schedule is not None else ("window" if family == "window" else "single")
            out.append(Plan(schedule_waves(sched, km, rule), rule))
    return out


def default_plans() -> list[Plan]:
    """The default menu of 30 plans, all within 16 samples: uniform k ∈ {1, 2, 4, 8, 16}; "first
    answer" (lead 1, ≤ 4); lead 2/3/4 to 4, 8, 16 one at a time and lead 2/3 with doubling waves; ESC
    windows of 2/3/4; Adaptive-Consistency Beta 0.75/0.9/0.95 and Dirichlet 0.9/0.95; Best-of-∞ Bayes
    factor 3/10/30/100 one at a time and 10 with doubling waves — the reconstruction ``bayes``; the
    published ``boinf`` family is not in this menu (``plan_family("boinf")`` or ``--plans boinf``)."""
    return [
        *plan_family("uniform"),
        *plan_family("lead", m=1, k_max=4),
        *plan_family("lead", k_max=(4, 8, 16)),
        *plan_family("lead", m=(2, 3), schedule="doubling"),
        *plan_family("window"),
        *plan_family("beta", p=(0.75, 0.9, 0.95)),
        *plan_family("dirichlet", p=(0.9, 0.95)),
        *plan_family("bayes"),
        *plan_family("bayes", B=10.0, schedule="doubling"),
    ]
