"""The never-worse rule chain: at each budget, serve a learned rule only where it has earned its place.

A policy holds a chain of candidate rules, most ambitious first, ending in the budget-matched
**uniform** rule (every prompt the same k, mixing the two actions adjacent to the budget so the mean
cost is exactly the budget). With plans the chain is ``learned → fixed_plan → uniform``: the fixed
plan is the best budget-matched mix of two plans played for every prompt (an adaptive stopping rule
the same for everyone, :mod:`isocompute.policy.plans.fixed_rule`); with one-wave actions it is
``learned → uniform``.

Each rule is scored on the training prompts out of fold (the learned rule by the cross-fitted member
that never saw the prompt — the process that serves new prompts), giving per budget b and prompt i the
expected correctness S_r[b, i]. At every budget of the policy's grid the choice walks the chain from
its end, the simplest rule, towards its head: a rule r replaces the current choice c when

    gain = (mean_i S_r[b, i] − mean_i S_c[b, i]) / mean_i S_c[b, i]

has its one-sided lower confidence bound above the margin: ``level`` 0.99 (the default) → the 1st
percentile of the paired bootstrap over prompts (prompts resampled with replacement, the same draws for
both rules; the question "does r beat c?" is one-sided). The recorded ``ci95`` is the two-sided 95%
interval.

Why 99% and not 95%: the test is run on the training prompts, and a rule admitted on training
evidence that only just clears the bar is, on average, worse on the prompts that were not seen — on
a finite table the held-out gain is anti-correlated with the training gain (train 4/5 of a fixed total,
test the other 1/5). Measured on Date Understanding (Llama-2-13B, 369 prompts, 5-fold CV × 3 seeds)
at budget 8: the learned rule alone +0.61%; served with the 95% test (3 of 15 refits admitted it, all
three lost on their held-out fold) −0.22% [−0.49, +0.05]; with 97.5% −0.09%; with 99% 0.00% (uniform).
The demo table's gain at budget 4 (+12.8%) passes either. A test can have its own level
(``rule_levels``): the fixed plan's test against uniform uses 0.95 (``PolicyConfig.fixed_plan_level``),
since two numbers chosen on the training prompts carry far less selection optimism. A rule that does not
beat the one after it does not serve: the learned rule must beat the fixed plan, the fixed plan must
beat uniform. Every test is kept as evidence (gain, CI, n, accepted), in the policy artifact and on
each decision.

Worked example: 4 prompts, learned scores (1, 1, 0, 1), uniform (0.5, 0.5, 0.5, 0.5): gain +50%, but
with 4 prompts some resamples draw only the third prompt (gain −100%), so the CI's lower end is far
below 0 and uniform serves. With 400 prompts in the same proportions the CI is about [+42%, +58%] and
the learned rule serves.

Serving uniform (:func:`uniform_actions`): with mean action costs c̄_j ≤ B ≤ c̄_{j+1} and
q = (B − c̄_j)/(c̄_{j+1} − c̄_j), prompt i takes the dearer action iff its hash uniform u_i < q, so the
expected cost of a new prompt is exactly B; ``match="batch"`` instead gives the dearer action to the
round(q·N) prompts of smallest u, so the batch spends B up to one prompt's step.

**Spend check** (issue 32): with ``costs`` (rule → its out-of-fold cost per budget and prompt) a rule whose
out-of-fold mean cost exceeds the reference by more than ``spend_tolerance`` (5% of the budget) — its
paired bootstrap lower bound, at the rule's level, above the tolerance — is not admitted, whatever its gain:
a rule that wins only by spending more than it was given is not kept. The reference is the chain's last
rule's (uniform's) out-of-fold cost on the same prompts when ``costs`` has it — paired, so the length noise
of which prompts a fold holds cancels and what is left is the rule's own overspend — else the budget. The
last rule itself is never checked. Why a bound and not the point estimate: on 24–48 training prompts with
heavy-tailed lengths the out-of-fold mean cost moves by ±10% by noise, and a point test threw away the
fixed plan's gains (+3 to +4.7 pt over uniform at 2x–3x on a 30-prompt gpt-oss-20b subset, down to +1.1 to
+2.3).

Ignores: multiplicity over the grid's budgets (each budget is its own test; neighbouring budgets use
nearly the same prompts and decisions, so their tests agree far more often than independent ones) and
the learner selection's own small optimism (the default learner is the better of two on these folds).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from isocompute.errors import InputError

UNIFORM = "uniform"
LEARNED = "learned"
FIXED_PLAN = "fixed_plan"


def uniform_mix(mean_costs: np.ndarray, budget: float) -> tuple[int, int, float]:
    """(j, j + 1, q): the adjacent actions and the share q of the dearer one whose mean cost is budget.

    Example: mean costs (1, 2, 4, 8) and budget 3 → (1, 2, 0.5): half the prompts k = 2, half k = 4.
    """
    mean_costs = np.asarray(mean_costs, dtype=np.float64)
    j = int(np.clip(np.searchsorted(mean_costs, budget, side="right") - 1, 0, mean_costs.size - 2))
    span = mean_costs[j + 1] - mean_costs[j]
    q = float(np.clip((budget - mean_costs[j]) / span, 0.0, 1.0)) if span > 0 else 0.0
    return j, j + 1, q


def uniform_utilities(U: np.ndarray, mean_costs: np.ndarray, budgets: Sequence[float]) -> np.ndarray:
    """(B, N) expected utility of each prompt under the uniform rule at each budget: (1 − q)·U_j + q·U_{j+1}."""
    out = np.empty((len(budgets), U.shape[0]))
    for bi, b in enumerate(budgets):
        lo, hi, q = uniform_mix(mean_costs, float(b))
        out[bi] = (1 - q) * U[:, lo] + q * U[:, hi]
    return out


def uniform_oof_costs(C: np.ndarray, folds: Sequence[tuple[np.ndarray, np.ndarray]],
                      budgets: Sequence[float]) -> np.ndarray:
    """(B, N) each prompt's cost under the uniform rule chosen on the folds that do not hold it (``C``: the
    ladder's columns): the spend check's reference on the same out-of-fold prompts."""
    out = np.empty((len(budgets), C.shape[0]))
    for tr, ho in folds:
        out[:, ho] = uniform_utilities(C[ho], C[tr].mean(axis=0), budgets)
    return out


def uniform_actions(u: np.ndarray, mean_costs: np.ndarray, budget: float, *, match: str = "calibrated") -> np.ndarray:
    """Action index per prompt under the uniform rule (module docstring): hashed mixing of the two
    actions adjacent to the budget, exact in expectation (``calibrated``) or on the batch (``batch``)."""
    return mix_actions(u, *uniform_mix(mean_costs, budget), match=match)


def mix_actions(u: np.ndarray, lo: int, hi: int, q: float, *, match: str = "calibrated") -> np.ndarray:
    """Action ``hi`` for a share q of the prompts, ``lo`` for the rest, by each prompt's hash uniform u:
    ``hi`` iff u < q (``calibrated``: exact in expectation over prompts), or for the round(q·N) prompts
    of smallest u (``batch``: exact on the batch up to one prompt)."""
    u = np.asarray(u, dtype=np.float64)
    if match == "batch":
        up = np.zeros(u.size, dtype=bool)
        up[np.argsort(u, kind="stable")[: int(np.floor(q * u.size + 0.5))]] = True
    elif match == "calibrated":
        up = u < q
    else:
        raise InputError(f"match must be 'calibrated' or 'batch'; you passed {match!r}.")
    return np.where(up, hi, lo).astype(np.intp)


def _opt_float(x: Any) -> float | None:
    return None if x is None else float(x)


@dataclass(frozen=True)
class RuleTest:
    """One comparison: does ``rule`` beat ``baseline`` on ``n`` out-of-fold prompts? ``gain`` is relative
    (None when the baseline scores 0), ``ci95`` its two-sided paired bootstrap 95% interval, ``lower``
    the one-sided lower bound at the chain's level that had to clear the margin, ``accepted`` the verdict;
    ``spend`` the rule's out-of-fold mean cost / budget where it was checked (above 1 + the tolerance it
    is not accepted)."""

    rule: str
    baseline: str
    gain: float | None
    ci95: tuple[float, float] | None
    lower: float | None
    n: int
    accepted: bool
    spend: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "baseline": self.baseline, "gain": self.gain,
                "ci95": None if self.ci95 is None else list(self.ci95), "lower": self.lower, "n": self.n,
                "accepted": self.accepted, "spend": self.spend}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> RuleTest:
        ci = d.get("ci95")
        return RuleTest(str(d["rule"]), str(d["baseline"]), _opt_float(d.get("gain")),
                        None if ci is None else (float(ci[0]), float(ci[1])), _opt_float(d.get("lower")),
                        int(d["n"]), bool(d["accepted"]), _opt_float(d.get("spend")))

    def why(self) -> str:
        verdict = "beats" if self.accepted else "does not beat"
        if self.gain is None or self.ci95 is None:
            out = f"{self.rule} {verdict} {self.baseline}, which scores 0 on {self.n} out-of-fold prompts"
        else:
            lo, hi = self.ci95
            out = (f"{self.rule} {verdict} {self.baseline}: {100 * self.gain:+.1f}% [95% CI {100 * lo:+.1f}, "
                   f"{100 * hi:+.1f}] on {self.n} out-of-fold prompts")
        if self.spend is not None:
            out += f", spending {100 * (self.spend - 1):+.1f}% over the budget out of fold"
        return out


@dataclass(frozen=True)
class RuleChoice:
    """The rule that serves at one grid budget, and the tests that chose it (simplest rule's first)."""

    budget: float
    rule: str
    tests: tuple[RuleTest, ...]

    @property
    def why(self) -> str:
        return "; ".join(t.why() for t in self.tests) or f"{self.rule} is the only rule"

    def evidence(self) -> dict[str, Any]:
        """JSON-able: what a decision carries (the gateway's ``isocompute`` object shows it)."""
        return {"rule": self.rule, "grid_budget": self.budget, "why": self.why,
                "tests": [t.to_dict() for t in self.tests]}


@dataclass(frozen=True, eq=False)
class RuleChain:
    """Per grid budget, the rule that serves (:func:`choose_rules`). ``rules``: the chain, head first."""

    rules: tuple[str, ...]
    budgets: np.ndarray
    choices: tuple[RuleChoice, ...]
    level: float
    margin: float
    n_boot: int
    rule_levels: dict[str, float] = field(default_factory=dict)

    def at(self, budget: float) -> RuleChoice:
        """The choice at the grid budget nearest ``budget`` (in log scale when the grid is positive)."""
        b = self.budgets
        if b[0] > 0 and budget > 0:
            j = int(np.argmin(np.abs(np.log(b) - np.log(budget))))
        else:
            j = int(np.argmin(np.abs(b - budget)))
        return self.choices[j]

    def ranges(self) -> list[tuple[str, float, float]]:
        """Consecutive grid budgets served by the same rule: [(rule, first budget, last budget), …]."""
        out: list[tuple[str, float, float]] = []
        for b, c in zip(self.budgets, self.choices, strict=True):
            if out and out[-1][0] == c.rule:
                out[-1] = (c.rule, out[-1][1], float(b))
            else:
                out.append((c.rule, float(b), float(b)))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"rules": list(self.rules), "level": self.level, "margin": self.margin, "n_boot": self.n_boot,
                "rule_levels": dict(self.rule_levels), "budgets": self.budgets.tolist(),
                "choices": [{"rule": c.rule, "tests": [t.to_dict() for t in c.tests]} for c in self.choices]}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> RuleChain:
        budgets = np.asarray(d["budgets"], dtype=np.float64)
        choices = tuple(RuleChoice(float(b), str(c["rule"]), tuple(RuleTest.from_dict(t) for t in c["tests"]))
                        for b, c in zip(budgets, d["choices"], strict=True))
        return RuleChain(tuple(d["rules"]), budgets, choices, float(d["level"]), float(d["margin"]),
                         int(d["n_boot"]), {str(k): float(v) for k, v in (d.get("rule_levels") or {}).items()})

    @staticmethod
    def single(rule: str, budgets: np.ndarray) -> RuleChain:
        """A chain that serves ``rule`` at every budget, untested (a policy fitted without the fallback)."""
        return RuleChain((rule,), np.asarray(budgets, dtype=np.float64),
                         tuple(RuleChoice(float(b), rule, ()) for b in budgets), 0.0, 0.0, 0)


def _bootstrap_weights(n: int, n_boot: int, seed: int) -> np.ndarray:
    """(n_boot, n) resampling counts / n: row r times a score vector is resample r's mean."""
    idx = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
    counts = np.zeros((n_boot, n))
    np.add.at(counts, (np.repeat(np.arange(n_boot), n), idx.ravel()), 1.0)
    return counts / n


SPEND_TOLERANCE = 0.05  # a rule's out-of-fold mean cost may exceed the budget by this much at most
SPEND_CHECK = True  # off: the chain before the check (the bench's baseline)


def choose_rules(scores: Mapping[str, np.ndarray], budgets: Sequence[float], *, level: float = 0.99,
                 margin: float = 0.0, n_boot: int = 1000, seed: int = 0,
                 rule_levels: Mapping[str, float] | None = None, costs: Mapping[str, np.ndarray] | None = None,
                 spend_tolerance: float | None = SPEND_TOLERANCE) -> RuleChain:
    """The rule chain's choice at each budget (module docstring).

    ``scores``: rule name → (B, N) out-of-fold expected correctness per budget and training prompt, in
    chain order (head first, the simplest rule last; insertion order of the mapping). ``level``: the
    one-sided confidence level whose lower bound must clear ``margin`` (a relative gain, e.g. 0.01 = 1%);
    ``rule_levels``: another level for the test that admits a given rule (e.g. ``{"fixed_plan": 0.95}``);
    ``costs``: rule name → (B, N) out-of-fold cost, for the spend check (``spend_tolerance`` None: off).
    """
    names = list(scores)
    if len(names) < 1:
        raise InputError("choose_rules needs at least one rule.")
    levels = dict(rule_levels or {})
    for lv in (level, *levels.values()):
        if not 0 < lv < 1:
            raise InputError(f"the fallback's CI level must be in (0, 1), e.g. 0.99; you passed {lv}.")
    arrays = [np.asarray(scores[r], dtype=np.float64) for r in names]
    B = len(budgets)
    n = arrays[0].shape[1] if arrays[0].ndim == 2 else 0
    if any(a.shape != (B, n) for a in arrays):
        raise InputError(f"every rule's scores must be (budgets × prompts) = ({B}, {n}); got "
                         f"{[a.shape for a in arrays]}.")
    W = _bootstrap_weights(n, n_boot, seed)
    means = [a.mean(axis=1) for a in arrays]  # (B,)
    boots = [W @ a.T for a in arrays]  # (n_boot, B): each resample's mean, per budget
    alphas = [100 * (1 - levels.get(r, level)) for r in names]  # one-sided lower bound, per admitted rule
    spend = _spend(costs, names, budgets, n, spend_tolerance, W, alphas)
    choices = []

    def spent(r: int, bi: int) -> float | None:
        return None if spend[r] is None else float(spend[r][0][bi])

    def spends(r: int, bi: int) -> bool:  # not demoted unless its excess over the tolerance is significant
        return spend[r] is None or bool(spend[r][1][bi] <= float(spend_tolerance or 0.0))

    for bi, b in enumerate(budgets):
        current = len(names) - 1
        tests = []
        for r in range(len(names) - 2, -1, -1):
            base_mean, base_boot = means[current][bi], boots[current][:, bi]
            if base_mean > 0:
                gain = float((means[r][bi] - base_mean) / base_mean)
                with np.errstate(divide="ignore", invalid="ignore"):
                    rel = (boots[r][:, bi] - base_boot) / base_boot
                rel = rel[np.isfinite(rel)]
                ci = (float(np.percentile(rel, 2.5)), float(np.percentile(rel, 97.5)))
                lower = float(np.percentile(rel, alphas[r]))
                accepted = lower > margin and spends(r, bi)
                tests.append(RuleTest(names[r], names[current], gain, ci, lower, n, accepted, spent(r, bi)))
            else:  # the baseline never answers right: no relative gain; the absolute one must clear 0
                diff = boots[r][:, bi] - base_boot
                accepted = bool(np.percentile(diff, alphas[r]) > 0) and spends(r, bi)
                tests.append(RuleTest(names[r], names[current], None, None, None, n, accepted, spent(r, bi)))
            if accepted:
                current = r
        choices.append(RuleChoice(float(b), names[current], tuple(tests)))
    return RuleChain(tuple(names), np.asarray(budgets, dtype=np.float64), tuple(choices), float(level),
                     float(margin), int(n_boot), {r: float(v) for r, v in levels.items()})


def _spend(costs: Mapping[str, np.ndarray] | None, names: Sequence[str], budgets: Sequence[float], n: int,
           tolerance: float | None, W: np.ndarray, alphas: Sequence[float]) -> list[tuple[np.ndarray, np.ndarray] | None]:
    """Per rule, ((B,) its out-of-fold mean cost / the reference's, (B,) the one-sided lower bound at its
    level of its mean paired excess over the reference / the budget) (module docstring), or None where it
    is not checked."""
    if costs is None or tolerance is None or not SPEND_CHECK:
        return [None] * len(names)
    b = np.asarray(budgets, dtype=np.float64)
    arrays = {}
    for r, c in costs.items():
        c = np.asarray(c, dtype=np.float64)
        if c.shape != (b.size, n):
            raise InputError(f"{r}'s out-of-fold costs must be (budgets × prompts) = ({b.size}, {n}); got {c.shape}.")
        arrays[r] = c
    ref = arrays.get(names[-1], np.broadcast_to(b[:, None], (b.size, n)))
    scale = np.where(b > 0, b, 1.0)
    out: list[tuple[np.ndarray, np.ndarray] | None] = []
    for r, alpha in zip(names, alphas, strict=True):
        if r not in arrays or r == names[-1]:
            out.append(None)
            continue
        d = (arrays[r] - ref) / scale[:, None]  # (B, n) paired excess, in budgets
        ratio = 1.0 + d.mean(axis=1) * scale / np.where(ref.mean(axis=1) > 0, ref.mean(axis=1), 1.0)
        out.append((ratio, np.percentile(W @ d.T, alpha, axis=0)))
    return out
