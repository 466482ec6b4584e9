"""Plans: a schedule of sample waves plus a stopping rule — the solver's actions.

A plan with waves w₁, w₂, …, w_L draws w₁ samples (one request with n = w₁), lets its rule look at the
vote, stops or draws w₂, and so on; after the last wave it stops whatever the vote says. It draws at most
Σ w_l samples in at most L requests. "k samples at once" is the one-wave plan with no rule.

Each wave has a **mode**. A *waiting* wave (``"wait"``, today's) waits for all its samples, then the rule
looks at the vote of everything drawn so far. A *parallel-stop* wave (``"parallel-stop"``) decodes its
samples together, in lock-step, so they finish in order of their length (completion tokens; samples of
equal length finish in a uniformly random order); the rule is checked at every finish, over everything
finished so far (earlier waves included), and when it fires the rest of the wave is aborted — each
aborted sample has then generated as many tokens as the sample that finished last. A parallel-stop wave
that runs out (its last sample finishes without the rule firing) ends like a waiting wave.

Names are stable text, stored in ``policy.json`` and shown in reports and by the gateway:
``RULE@SCHEDULE`` where RULE is a rule name (:func:`isocompute.solver.plans.rules.parse_rule`) and SCHEDULE
lists the waves: ``N`` a waiting wave of N samples, ``Ns`` a parallel-stop wave of N, ``AxB`` (``AsxB``)
B such waves of A:

    none@4                      4 samples at once (today's uniform action k = 4)
    lead:m=2@1x16               one sample at a time until the leader leads by 2, at most 16
    window:w=3@3x5,1            ESC: windows of 3 until one is unanimous, at most 16
    bayes:B=10,alpha=0.3,top=5@1x2,2,4,8   doubling waves 1, 1, 2, 4, 8 (≤ 16 samples, ≤ 5 requests)
    boinf:B=10,alpha=0.3@1x16   Best-of-∞ as published, one sample at a time, at most 16
    lead:m=2@8s                 8 samples at once, stopped at the first finish where the lead is 2
    lead:m=2@4s,8s              the same over a parallel-stop wave of 4, then (if it ran out) one of 8
    beta:p=0.9@4sx2             two parallel-stop waves of 4
    first:m=3@8s                short-m@k with m = 3, k = 8: vote among the first 3 of 8 to finish

Worked examples. ``lead:m=2@1x2,2,4,8`` on answers a, a, … stops after the second wave (2 samples,
2 requests, lead 2); on a, b, a, a it stops after the third (4 samples, 3 requests, lead 2).
``lead:m=2@4s`` on samples (answer, length) (a, 300), (b, 120), (a, 200), (a, 900): they finish b, a, a, …
in length order; after the third finish (length 300) the vote is a 2 – b 1, lead 1; at the fourth
a leads 3 – 1 and the rule fires: 4 samples started, 120 + 200 + 300 + 900 tokens generated, latency
900 (the last finish). With ``lead:m=1`` instead it stops at the first finish (b, lead 1):
latency 120, tokens 4 · 120 (the three others are aborted at 120 tokens each), answer b.
``first:m=3@4s`` on the same samples stops at the third finish: answer a (2 – 1), latency 300,
tokens 120 + 200 + 300 + 300.

:func:`plan_family` builds a rule family over a parameter grid; :func:`default_plans` is the ~30-plan
menu of waiting plans the allocation chooses from; :func:`parallel_plans` a menu of parallel-stop plans.
This module ignores costs and estimates (:mod:`isocompute.solver.plans.estimates`).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from isocompute.errors import InputError
from isocompute.solver.plans.rules import RULES, NoRule, StopDecision, StoppingRule, parse_rule

MAX_PLAN_SAMPLES = 1000
WaveMode = Literal["wait", "parallel-stop"]
WAIT: WaveMode = "wait"
PARALLEL: WaveMode = "parallel-stop"
_GRAMMAR = ("a plan is RULE@SCHEDULE, e.g. none@4, lead:m=2@1x16, window:w=3@3x5,1, "
            "bayes:B=10,alpha=0.3,top=5@1x2,2,4,8, lead:m=2@4s,8s (AxB = B waves of A samples; "
            "a trailing s, As or AsxB, makes the waves parallel-stop)")
_ITEM = re.compile(r"\s*(\d+)(s?)(?:x(\d+))?\s*")


def schedule_name(waves: Sequence[int], modes: Sequence[WaveMode] | None = None) -> str:
    """(1, 1, 2, 4, 8) → ``1x2,2,4,8``; (1,)*16 → ``1x16``; (4,) → ``4``; with modes (parallel-stop,
    parallel-stop) (4, 4) → ``4sx2``, (4, 8) → ``4s,8s``."""
    out = []
    for (size, mode), group in itertools.groupby(zip(waves, modes or (WAIT,) * len(waves), strict=True)):
        n = len(list(group))
        tag = "s" if mode == PARALLEL else ""
        out.append(f"{size}{tag}x{n}" if n > 1 else f"{size}{tag}")
    return ",".join(out)


def parse_waves(text: str) -> tuple[tuple[int, ...], tuple[WaveMode, ...]]:
    """The wave sizes and modes of a schedule: ``2s,4sx2,8`` → (2, 4, 4, 8), (parallel-stop ×3, wait)."""
    waves: list[int] = []
    modes: list[WaveMode] = []
    for item in text.split(","):
        match = _ITEM.fullmatch(item)
        if match is None:
            raise InputError(f"bad wave schedule {text!r}: {item!r} is not N or NxCOUNT (waiting waves of N "
                             f"samples), Ns or NsxCOUNT (parallel-stop waves) ({_GRAMMAR}).")
        size, tag, count = match.groups()
        n = int(count) if count else 1
        waves += [int(size)] * n
        modes += [PARALLEL if tag else WAIT] * n
    return tuple(waves), tuple(modes)


def parse_schedule(text: str) -> tuple[int, ...]:
    """The wave sizes of a schedule (``1x2,2,4,8`` → (1, 1, 2, 4, 8)); their modes: :func:`parse_waves`."""
    return parse_waves(text)[0]


@dataclass(frozen=True)
class PlanStep:
    """What a plan says after a wave or a finish: the rule's decision, whether to stop, why (``"rule"``:
    the rule fired — mid-wave, abort the wave's other samples; ``"plan_end"``: no waves left;
    ``"continue"``: start the next wave; ``"running"``: keep decoding the current wave), the size of the
    next wave (None unless ``"continue"``) and the waves ended so far (a wave stopped mid-way counts)."""

    decision: StopDecision
    stop: bool
    reason: Literal["rule", "plan_end", "continue", "running"]
    next_wave: int | None
    waves_done: int


@dataclass(frozen=True)
class Plan:
    """A wave schedule and a stopping rule; see the module docstring."""

    waves: tuple[int, ...]
    rule: StoppingRule = field(default_factory=NoRule)
    modes: tuple[WaveMode, ...] = ()  # one per wave; () = every wave waits

    def __post_init__(self) -> None:
        waves = tuple(self.waves)
        if not waves or any(not isinstance(w, int) or isinstance(w, bool) or w < 1 for w in waves):
            raise InputError(f"a plan needs one or more waves of >= 1 samples each, got {self.waves!r}.")
        if sum(waves) > MAX_PLAN_SAMPLES:
            raise InputError(f"a plan may draw at most {MAX_PLAN_SAMPLES} samples; {schedule_name(waves)} "
                             f"draws {sum(waves)}.")
        if not isinstance(self.rule, StoppingRule):
            raise InputError(f"a plan's rule must be a StoppingRule (e.g. parse_rule('lead:m=2')), got {self.rule!r}.")
        modes = tuple(self.modes) or (WAIT,) * len(waves)
        if len(modes) != len(waves) or any(m not in (WAIT, PARALLEL) for m in modes):
            raise InputError(f"a plan needs one mode per wave, each {WAIT!r} or {PARALLEL!r}; got {self.modes!r} "
                             f"for {len(waves)} waves.")
        object.__setattr__(self, "waves", waves)
        object.__setattr__(self, "modes", modes)

    @property
    def name(self) -> str:
        return f"{self.rule.name}@{schedule_name(self.waves, self.modes)}"

    @property
    def parallel(self) -> tuple[bool, ...]:
        """Per wave: whether it is parallel-stop."""
        return tuple(m == PARALLEL for m in self.modes)

    @property
    def stops_in_wave(self) -> bool:
        """Whether the plan can stop mid-wave: a parallel-stop wave and a rule that can fire."""
        return any(self.parallel) and not isinstance(self.rule, NoRule)

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

    def _decide(self, answers: Sequence[Hashable | None], evidence: Mapping[str, Any] | None) -> StopDecision:
        """The rule's verdict; a rule that reads evidence (``needs_evidence``: the finished samples' lengths
        and what is spent, :mod:`isocompute.policy.evidence.rule`) gets it where the runner has it."""
        if evidence is not None and getattr(self.rule, "needs_evidence", False):
            return self.rule.should_stop_given(answers, evidence)  # type: ignore[attr-defined]
        return self.rule.should_stop(answers)

    def step(self, answers: Sequence[Hashable | None], evidence: Mapping[str, Any] | None = None) -> PlanStep:
        """After a wave: ``answers`` are the answer classes of every sample drawn so far (None = no
        answer), in order; their number must be one of :attr:`boundaries`. ``evidence``: see
        :meth:`on_finish`."""
        bounds = self.boundaries
        try:
            done = bounds.index(len(answers)) + 1
        except ValueError:
            raise InputError(f"plan {self.name} checks its rule after {list(bounds)} samples, not after "
                             f"{len(answers)}; pass every answer drawn so far.") from None
        decision = self._decide(answers, evidence)
        if decision.stop:
            return PlanStep(decision, True, "rule", None, done)
        if done == len(bounds):
            return PlanStep(decision, True, "plan_end", None, done)
        return PlanStep(decision, False, "continue", self.waves[done], done)

    def on_finish(self, answers: Sequence[Hashable | None], *, running: bool,
                  evidence: Mapping[str, Any] | None = None) -> PlanStep:
        """After a sample finishes, for an online runner: ``answers`` are the answer classes of every
        sample finished so far (earlier waves' and this wave's, in finish order; None = no answer) and
        ``running`` says whether samples of the current wave are still decoding. Not running: the wave
        is complete and this is :meth:`step`. Running: in a parallel-stop wave the rule is checked —
        ``"rule"`` (stop, abort the rest) or ``"running"``; a waiting wave is not checked until complete.
        ``evidence`` (``lengths`` of the finished samples in tokens, in the order of ``answers``;
        ``running``, ``wave``, ``tokens`` and ``latency`` so far; optionally ``confidence``) is read only by
        rules that need it; other rules ignore it.

        >>> plan = parse_plan("lead:m=2@4s")
        >>> plan.on_finish(["a"], running=True).reason, plan.on_finish(["a", "a"], running=True).reason
        ('running', 'rule')
        """
        if not running:
            return self.step(answers, evidence)
        bounds = self.boundaries
        wave = next((i for i, b in enumerate(bounds) if len(answers) < b), None)
        if wave is None:
            raise InputError(f"plan {self.name} draws {self.max_samples} samples: none can be running after "
                             f"{len(answers)} finished; pass running=False after the wave's last finish.")
        decision = self._decide(answers, evidence)
        if self.parallel[wave] and decision.stop:
            return PlanStep(decision, True, "rule", None, wave + 1)
        return PlanStep(decision, False, "running", None, wave)

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
        return Plan(tuple(waves), self.rule, self.modes[: len(waves)])


def parse_plan(name: str) -> Plan:
    """The plan named ``name`` (the inverse of :attr:`Plan.name`)."""
    rule_text, at, sched = name.strip().rpartition("@")
    if not at or not rule_text or not sched:
        raise InputError(f"bad plan name {name!r}: {_GRAMMAR}.")
    waves, modes = parse_waves(sched)
    return Plan(waves, parse_rule(rule_text), modes)


# --------------------------------------------------------------------------------------------- families

FAMILY_GRIDS: dict[str, dict[str, tuple]] = {
    "uniform": {"k": (1, 2, 4, 8, 16)},
    "lead": {"m": (2, 3, 4)},
    "window": {"w": (2, 3, 4)},
    "beta": {"p": (0.75, 0.9, 0.95, 0.99)},
    "dirichlet": {"p": (0.8, 0.9, 0.95)},
    "bayes": {"B": (3.0, 10.0, 30.0, 100.0)},
    "boinf": {"B": (3.0, 10.0, 30.0, 100.0)},  # Best-of-∞ as published; not in default_plans()
    "first": {"m": (1, 3, 5)},
}
_EXTRA_PARAMS = {"bayes": {"alpha", "top"}, "dirichlet": {"alpha", "top"}, "boinf": {"alpha"}}  # off-grid
Schedule = Literal["single", "doubling", "window", "one"] | int


def schedule_waves(schedule: Schedule, k_max: int, rule: StoppingRule | None = None) -> tuple[int, ...]:
    """Waves summing to ``k_max``: ``"single"`` one sample at a time; ``"doubling"`` 1, 1, 2, 4, …
    (the boundaries double); ``"window"`` waves of the window rule's w (ESC); ``"one"`` one wave of
    ``k_max``; an int W: waves of W. The last wave shrinks so the total is exactly ``k_max``."""
    if not isinstance(k_max, int) or k_max < 1:
        raise InputError(f"k_max must be an integer >= 1, got {k_max!r}.")
    if schedule == "one":
        return (k_max,)
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
    raise InputError(f"unknown schedule {schedule!r}; use 'single', 'doubling', 'window', 'one' or a wave "
                     "size >= 1.")


def plan_family(family: str, *, k_max: int | Sequence[int] = 16, schedule: Schedule | None = None,
                mode: WaveMode = WAIT, **grid: Sequence) -> list[Plan]:
    """Plans of one rule family over a parameter grid (defaults: :data:`FAMILY_GRIDS`), for each
    ``k_max``, every wave in ``mode``. ``uniform`` gives ``none@k`` for ``k`` in its grid (``k_max`` and
    ``mode`` unused: without a rule both modes are the same plan). The default schedule is one wave for
    parallel-stop plans; for waiting plans ESC's waves of w for ``window``, one sample at a time otherwise.

    >>> [p.name for p in plan_family("lead", m=[2, 3], k_max=[4, 8])]
    ['lead:m=2@1x4', 'lead:m=2@1x8', 'lead:m=3@1x4', 'lead:m=3@1x8']
    >>> [p.name for p in plan_family("first", m=3, k_max=[8, 16], mode="parallel-stop")]
    ['first:m=3@8s', 'first:m=3@16s']
    """
    if mode not in (WAIT, PARALLEL):
        raise InputError(f"mode must be {WAIT!r} or {PARALLEL!r}, not {mode!r}.")
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
            sched = schedule if schedule is not None else \
                ("one" if mode == PARALLEL else "window" if family == "window" else "single")
            waves = schedule_waves(sched, km, rule)
            out.append(Plan(waves, rule, (mode,) * len(waves)))
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


def parallel_plans() -> list[Plan]:
    """A menu of 31 parallel-stop plans, all within 16 samples (not in :func:`default_plans`): one wave of
    4, 8 and 16 for lead 2/3; one wave of 8 and 16 for ESC windows of 2/3, Adaptive-Consistency Beta
    0.9/0.95 and Dirichlet 0.9, Best-of-∞ Bayes factor 10/30; two waves ``4s,8s`` and three waves
    ``2s,4s,8s`` for lead 2, Beta 0.9 and Bayes factor 10; short-m@k for (m, k) = (1, 4), (1, 8), (3, 8),
    (3, 16), (5, 16)."""
    par = PARALLEL
    multi = [Plan(w, r, (par,) * len(w)) for r in (RULES["lead"](m=2), RULES["beta"](p=0.9), RULES["bayes"](B=10.0))
             for w in ((4, 8), (2, 4, 8))]
    return [
        *plan_family("lead", m=(2, 3), k_max=(4, 8, 16), mode=par),
        *plan_family("window", w=(2, 3), k_max=(8, 16), mode=par),
        *plan_family("beta", p=(0.9, 0.95), k_max=(8, 16), mode=par),
        *plan_family("dirichlet", p=0.9, k_max=(8, 16), mode=par),
        *plan_family("bayes", B=(10.0, 30.0), k_max=(8, 16), mode=par),
        *multi,
        *plan_family("first", m=1, k_max=(4, 8), mode=par),
        *plan_family("first", m=3, k_max=(8, 16), mode=par),
        *plan_family("first", m=5, k_max=16, mode=par),
    ]
