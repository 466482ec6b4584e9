"""Stopping rules: pure functions of the vote so far that say whether to stop sampling.

Every rule has one method in Adaptive-Consistency's shape, ``should_stop(answers) -> StopDecision``
(``most_common``, ``prob``, ``stop``), its threshold fixed in ``__init__``, and underneath a vectorised
``statistic(states)`` over many vote states at once. The gateway calls ``should_stop`` on the answer
classes of the waves drawn so far; the plan estimators call ``stops`` on every reachable vote state;
both run the same ``statistic``, so offline estimates and served behaviour cannot drift apart.

A vote state (:class:`VoteStates`, one row per state) holds all the rules may look at:

* ``counts`` — the votes of each answer class, sorted descending (the labels do not matter).
  **Null answers never vote**: a sample with no answer is drawn and paid for but adds no count, a
  state whose samples are all null has no leader, and no rule but ``first`` stops on zero votes;
* ``run`` — how many of the latest samples agree (the trailing run of one non-null class; a null
  ends it). Only ESC's window reads it; it depends on the order of the samples, not only on counts;
* ``samples`` — how many samples have finished, nulls included (only ``first`` reads it).

Rules (``stop`` ⟺ statistic ≥ threshold; ``prob`` in :class:`StopDecision` is that statistic):

``none``                 never stops early (the plan draws all its waves).
``lead:m=M``             the leader leads the runner-up by ≥ M votes (statistic c₁ − c₂).
``window:w=W``           the latest W samples are one answer (ESC, Li et al. 2024; statistic: the run).
``first:m=M``            M samples have finished, nulls included (short-m@k, Hassid et al. 2025: with one
                         parallel-stop wave of k, vote among the first M to finish). The one rule that
                         stops without votes: M nulls finish the plan with an empty vote (utility 0).
``beta:p=P``             Adaptive-Consistency's Beta rule (Aggarwal et al. 2023): with the top two
                         counts c₁, c₂ and a uniform prior, P(x > ½) for x ~ Beta(c₁+1, c₂+1) ≥ P,
                         in closed form ``scipy.stats.beta.sf(0.5, c₁+1, c₂+1)``.
``dirichlet:p=P,top=T``  Adaptive-Consistency's Dirichlet rule: over the T largest classes with a
                         uniform prior, P(the leader's probability is the largest) ≥ P under
                         Dirichlet(c + 1); fewer than 3 classes fall back to the Beta rule, as there.
``bayes:B=B,alpha=A,top=T``  our reconstruction of Best-of-∞'s Bayes factor (Komiyama et al.), kept as a
                         named variant: a Dirichlet-process prior of concentration A gives the posterior
                         Dirichlet(c₁ … c_T, A) over the T largest classes and the unseen mass; stop
                         when P₁/(1 − P₁) ≥ B, P₁ = P(the leader beats every seen class and the unseen
                         mass), in closed form (:mod:`isocompute.solver.plans.dirichlet`).
``boinf:B=B,alpha=A``    Best-of-∞ as the authors' code computes it: shapes c + 1 for *every* seen class
                         and A + 1 for the unseen mass, statistic K · P₁/(1 − P₁) with K = the seen
                         classes + 1, stop when ≥ B; P₁ exact by quadrature where they draw 1,000
                         Dirichlet samples (:mod:`isocompute.solver.plans.best_of_infinity`). It reads
                         every count (``width`` = :data:`ALL_COUNTS`). Counts (4, 2), A = 0.3 → 9.04.

Which one the report's "Best-of-∞" row uses: ``bayes`` (the ``bayes`` family of
:data:`isocompute.policy.plans.menu.FAMILY_BASELINES` and of the default menu), so existing figures keep
their values; ``--plans boinf`` (or plan names such as ``boinf:B=10,alpha=0.3@1x16``) asks for the
published rule. They differ by the shapes (c vs c + 1, the top T vs every class) and the factor K: at
α = 0.3 ``bayes`` gives 4.19 on counts (4, 2), 3.44 on (3, 1, 1) and 4.33 on one vote; ``boinf``
9.04, 7.86 and 4.06.

Worked example: answers [a, a, b, a]: counts (3, 1), run 1. ``lead:m=2`` stops (3 − 1 = 2);
``window:w=2`` does not (the last two differ); ``beta:p=0.9``: beta.sf(0.5, 4, 2) = 0.8125, no stop.

This module ignores how answers are put into classes (``isocompute.tasks``) and the cost of sampling.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, fields
from typing import ClassVar

import numpy as np
from scipy.stats import beta as beta_dist

from isocompute.errors import InputError
from isocompute.solver.plans import best_of_infinity
from isocompute.solver.plans.dirichlet import leader_max_prob

ALL_COUNTS = 1 << 62  # a rule's ``width`` when its statistic reads every count


@dataclass(frozen=True, eq=False)
class VoteStates:
    """Vote states, one per row: ``counts`` (S, W) sorted descending and zero-padded, ``run`` (S,) the
    trailing run of one non-null answer, ``samples`` (S,) the samples finished, nulls included (None
    where the caller's rules do not read it: :attr:`StoppingRule.uses_samples`)."""

    counts: np.ndarray
    run: np.ndarray
    samples: np.ndarray | None = None

    @property
    def votes(self) -> np.ndarray:
        return self.counts.sum(axis=1)

    def top(self, width: int) -> np.ndarray:
        """(S, width) the largest ``width`` counts, zero-padded."""
        c = self.counts[:, :width]
        if c.shape[1] < width:
            c = np.pad(c, ((0, 0), (0, width - c.shape[1])))
        return c


@dataclass(frozen=True)
class StopDecision:
    """One rule's verdict on one vote: the leading answer (None without votes), the rule's statistic
    (a probability for beta/dirichlet, the Bayes factor for bayes/boinf, the lead or run for lead/window)
    and whether to stop."""

    most_common: Hashable | None
    prob: float
    stop: bool
    detail: dict | None = None  # what an evidence rule saw and priced (Plan.on_finish's evidence)


def vote_state(answers: Sequence[Hashable | None]) -> tuple[VoteStates, Hashable | None]:
    """The one-row vote state of ``answers`` (class keys in sampling order, None = no answer) and the
    leading class (among tied leaders the one seen first)."""
    votes = Counter(a for a in answers if a is not None)
    ranked = votes.most_common()
    counts = np.array([[c for _, c in ranked]], dtype=np.int64).reshape(1, -1)
    run = 0
    for a in reversed(answers):
        if a is None or (run and a != answers[-1]):
            break
        run += 1
    states = VoteStates(counts=counts, run=np.array([run]), samples=np.array([len(answers)]))
    return states, (ranked[0][0] if ranked else None)


class StoppingRule:
    """Base class: subclasses are frozen dataclasses whose fields are the rule's parameters."""

    kind: ClassVar[str]
    width: ClassVar[int] = 0  # how many of the largest counts ``statistic`` reads (ALL_COUNTS: all)
    uses_run: ClassVar[bool] = False  # reads ``run`` (then ``run_cap``: runs longer than it look the same)
    run_cap: ClassVar[int] = 0
    uses_samples: ClassVar[bool] = False  # reads ``samples`` (the samples finished, nulls included)

    @property
    def threshold(self) -> float:
        raise NotImplementedError

    def statistic(self, states: VoteStates) -> np.ndarray:
        raise NotImplementedError

    @property
    def name(self) -> str:
        """Stable text name, e.g. ``lead:m=2`` (parsed back by :func:`parse_rule`)."""
        params = ",".join(f"{f.name}={_fmt(getattr(self, f.name))}" for f in fields(self))  # type: ignore[arg-type]
        return f"{self.kind}:{params}" if params else self.kind

    def stops(self, states: VoteStates) -> np.ndarray:
        """(S,) bool: stop at each state. A state without votes never stops."""
        return (self.statistic(states) >= self.threshold) & (states.top(1)[:, 0] > 0)

    def should_stop(self, answers: Sequence[Hashable | None]) -> StopDecision:
        states, leader = vote_state(answers)
        stat = float(self.statistic(states)[0])
        return StopDecision(most_common=leader, prob=stat, stop=bool(self.stops(states)[0]))


def _fmt(x: float | int) -> str:
    if isinstance(x, int):
        return str(x)
    r = repr(float(x))
    return r[:-2] if r.endswith(".0") else r


def _int_at_least(rule: str, name: str, value: object, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise InputError(f"{rule} rule: {name} must be an integer >= {low}, got {value!r}.")


def _prob_above_half(rule: str, value: object) -> None:
    if not isinstance(value, float | int) or not 0.5 < float(value) < 1.0:
        raise InputError(f"{rule} rule: p must be a probability in (0.5, 1), got {value!r}; at p <= 0.5 "
                         "a state with no votes already looks decided.")


@dataclass(frozen=True)
class NoRule(StoppingRule):
    kind: ClassVar[str] = "none"

    @property
    def threshold(self) -> float:
        return math.inf

    def statistic(self, states: VoteStates) -> np.ndarray:
        return np.full(states.run.shape, -math.inf)


@dataclass(frozen=True)
class LeadRule(StoppingRule):
    m: int = 2
    kind: ClassVar[str] = "lead"
    width: ClassVar[int] = 2

    def __post_init__(self) -> None:
        _int_at_least("lead", "m", self.m, 1)

    @property
    def threshold(self) -> float:
        return float(self.m)

    def statistic(self, states: VoteStates) -> np.ndarray:
        c = states.top(2)
        return (c[:, 0] - c[:, 1]).astype(np.float64)


@dataclass(frozen=True)
class WindowRule(StoppingRule):
    w: int = 3
    kind: ClassVar[str] = "window"
    uses_run: ClassVar[bool] = True

    def __post_init__(self) -> None:
        _int_at_least("window", "w", self.w, 1)

    @property
    def threshold(self) -> float:
        return float(self.w)

    @property
    def run_cap(self) -> int:  # type: ignore[override]
        return self.w

    def statistic(self, states: VoteStates) -> np.ndarray:
        return states.run.astype(np.float64)


@dataclass(frozen=True)
class BetaRule(StoppingRule):
    p: float = 0.95
    kind: ClassVar[str] = "beta"
    width: ClassVar[int] = 2

    def __post_init__(self) -> None:
        _prob_above_half("beta", self.p)
        object.__setattr__(self, "p", float(self.p))

    @property
    def threshold(self) -> float:
        return self.p

    def statistic(self, states: VoteStates) -> np.ndarray:
        c = states.top(2)
        return beta_dist.sf(0.5, c[:, 0] + 1, c[:, 1] + 1)


@dataclass(frozen=True)
class DirichletRule(StoppingRule):
    p: float = 0.95
    top: int = 5
    kind: ClassVar[str] = "dirichlet"

    def __post_init__(self) -> None:
        _prob_above_half("dirichlet", self.p)
        _int_at_least("dirichlet", "top", self.top, 2)
        object.__setattr__(self, "p", float(self.p))

    @property
    def width(self) -> int:  # type: ignore[override]
        return self.top

    @property
    def threshold(self) -> float:
        return self.p

    def statistic(self, states: VoteStates) -> np.ndarray:
        c = states.top(self.top)
        out = beta_dist.sf(0.5, c[:, 0] + 1, c[:, 1] + 1)
        many = (c > 0).sum(axis=1) >= 3
        if many.any():
            cm = c[many]
            out[many] = leader_max_prob(cm[:, 0] + 1, np.where(cm[:, 1:] > 0, cm[:, 1:] + 1, 0))
        return out


def _positive(rule: str, obj: StoppingRule, names: tuple[str, ...]) -> None:
    for name in names:
        v = getattr(obj, name)
        if not isinstance(v, float | int) or isinstance(v, bool) or not 0 < float(v) < math.inf:
            raise InputError(f"{rule} rule: {name} must be a positive number, got {v!r}.")
        object.__setattr__(obj, name, float(v))


@dataclass(frozen=True)
class BayesFactorRule(StoppingRule):
    B: float = 10.0
    alpha: float = 0.3
    top: int = 5
    kind: ClassVar[str] = "bayes"

    def __post_init__(self) -> None:
        _positive("bayes", self, ("B", "alpha"))
        _int_at_least("bayes", "top", self.top, 1)

    @property
    def width(self) -> int:  # type: ignore[override]
        return self.top

    @property
    def threshold(self) -> float:
        return self.B

    def statistic(self, states: VoteStates) -> np.ndarray:
        c = states.top(self.top)
        out = np.zeros(c.shape[0])
        voted = c[:, 0] > 0
        if voted.any():
            p1 = leader_max_prob(c[voted, 0], c[voted, 1:], self.alpha)
            with np.errstate(divide="ignore"):
                out[voted] = p1 / (1.0 - p1)
        return out


@dataclass(frozen=True)
class BestOfInfinityRule(StoppingRule):
    B: float = 10.0
    alpha: float = 0.3
    kind: ClassVar[str] = "boinf"
    width: ClassVar[int] = ALL_COUNTS

    def __post_init__(self) -> None:
        _positive("boinf", self, ("B", "alpha"))

    @property
    def threshold(self) -> float:
        return self.B

    def statistic(self, states: VoteStates) -> np.ndarray:
        return best_of_infinity.bayes_factor(states.counts, self.alpha)


@dataclass(frozen=True)
class FirstRule(StoppingRule):
    m: int = 1
    kind: ClassVar[str] = "first"
    uses_samples: ClassVar[bool] = True

    def __post_init__(self) -> None:
        _int_at_least("first", "m", self.m, 1)

    @property
    def threshold(self) -> float:
        return float(self.m)

    def statistic(self, states: VoteStates) -> np.ndarray:
        if states.samples is None:
            raise ValueError("the first rule reads VoteStates.samples (the samples finished, nulls included)")
        return np.asarray(states.samples, dtype=np.float64)

    def stops(self, states: VoteStates) -> np.ndarray:
        return self.statistic(states) >= self.threshold  # nulls count as finished: no vote needed


def stops_unique(rule: StoppingRule, states: VoteStates) -> np.ndarray:
    """``rule.stops(states)``, evaluating the statistic once per distinct state the rule can tell apart:
    its ``width`` largest counts (at least the largest, which says whether there are votes; at most the
    states' classes with votes, so ``ALL_COUNTS`` keys on every count), the run (capped) if it reads it, and
    the samples finished if it reads them. The Dirichlet rules cost milliseconds per distinct state."""
    seen = int((states.counts > 0).sum(axis=1).max(initial=0))  # counts sorted descending: zeros trail
    w = max(min(rule.width, seen), 1)
    cols = [states.top(w)]
    if rule.uses_run:
        cols.append(np.minimum(states.run, rule.run_cap)[:, None])
    if rule.uses_samples:
        cols.append(np.asarray(states.samples)[:, None])
    uniq, inv = np.unique(np.hstack(cols), axis=0, return_inverse=True)
    run = uniq[:, w] if rule.uses_run else np.zeros(len(uniq), np.int64)
    sub = VoteStates(counts=uniq[:, :w], run=run, samples=uniq[:, -1] if rule.uses_samples else None)
    return rule.stops(sub)[inv.ravel()]


RULES: dict[str, type[StoppingRule]] = {
    r.kind: r for r in (NoRule, LeadRule, WindowRule, BetaRule, DirichletRule, BayesFactorRule,
                        BestOfInfinityRule, FirstRule)
}
_GRAMMAR = ("a rule is KIND or KIND:NAME=VALUE,…, e.g. none, lead:m=2, window:w=3, beta:p=0.95, "
            "dirichlet:p=0.95,top=5, bayes:B=10,alpha=0.3,top=5, boinf:B=10,alpha=0.3, first:m=3")


def parse_rule(text: str) -> StoppingRule:
    """The rule named ``text`` (the inverse of :attr:`StoppingRule.name`); omitted parameters take
    their defaults."""
    kind, _, rest = text.strip().partition(":")
    cls = RULES.get(kind)
    if cls is None:
        raise InputError(f"unknown stopping rule {kind!r} in {text!r}; kinds: {', '.join(RULES)} ({_GRAMMAR}).")
    types = {f.name: f.type for f in fields(cls)}  # type: ignore[arg-type]
    kwargs: dict[str, int | float] = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or key not in types:
            raise InputError(f"bad parameter {item!r} in rule {text!r}: {kind} takes "
                             f"{', '.join(types) or 'no parameters'} ({_GRAMMAR}).")
        try:
            kwargs[key] = int(value) if types[key] in (int, "int") else float(value)
        except ValueError:
            raise InputError(f"parameter {key} of rule {text!r} must be a number, got {value!r}.") from None
    return cls(**kwargs)
