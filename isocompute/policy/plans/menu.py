"""The policy's plan menu: which plans a policy chooses from, and the rule families it is measured against.

A policy's *actions* are plans (:mod:`isocompute.solver.plans.plan`): a wave schedule and a stopping rule.
``isocompute fit/report/solve --plans SPEC`` names the menu; :func:`resolve_plans` turns SPEC into
plans, every one capped at the largest action (``--actions``, 16 by default) so a table with that many
samples per prompt can play all of them:

    none          today's one-wave plans ``none@k``, k ∈ actions (no stopping rule)
    default       the default menu (:func:`default_menu`): the 30 plans of
                  :func:`isocompute.solver.plans.plan.default_plans` plus the lead rules m = 1, 2, 3 at every
                  k_max of :data:`K_MAX` (the fixed plans bench_fixed_plans found best on the real tables);
                  with a largest action above 16, its one-sample-at-a-time rules also run to that many;
                  with ``parallel=True`` (fit/solve in cost unit tokens or flops, or under a latency
                  budget) also the ``parallel`` menu below. In samples a parallel-stop wave of k starts
                  k samples, as none@k does, and votes on fewer, so it is dominated there and left out
    lead, window, beta, dirichlet, bayes
                  one rule family over its baseline grid (:data:`FAMILY_BASELINES`); ``bayes`` is the
                  reconstruction of Best-of-∞ that the report's "Best-of-∞" row plays
    boinf         Best-of-∞ as published (:class:`~isocompute.solver.plans.rules.BestOfInfinityRule`),
                  a menu family only (:data:`MENU_FAMILIES`): the report gets no row for it, so
                  existing reports keep their rows and their ``fixed_best``
    parallel      the parallel-stop menu (:func:`isocompute.solver.plans.plan.parallel_plans`: one-, two- and
                  three-wave plans whose waves stop mid-generation, and short-m@k), capped at the largest action
    A+B           the union of menus A and B, in that order: ``default+parallel`` is both
    NAME,NAME,…   plan names (``RULE@SCHEDULE``); a new name starts where a comma is followed by a rule
                  kind and ``:`` or ``@`` (``window:w=3@3x5,1,lead:m=2@1x8`` is two plans)

Every menu but ``none`` also holds the *uniform ladder* ``none@k`` for k ∈ actions (added where
missing): the never-worse chain's last rule serves those. Duplicates are dropped, first one kept.

Worked example: ``--plans lead --actions 1,2,4,8`` → the ladder none@1, none@2, none@4, none@8 and
lead m ∈ 1…5 with k_max ∈ {2, …, 8} (the grid's 10 … 16 capped to 8 are duplicates of k_max = 8):
``lead:m=1@1x2``, …, ``lead:m=5@1x8``, 4 + 5 × 7 = 39 plans.

:func:`plan_descriptors` gives the utility learner one row of numbers per plan (its stand-in for k).
Ignores: estimating the plans on a table (:mod:`isocompute.policy.plans.arrays`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from isocompute.errors import InputError
from isocompute.solver.plans.plan import (
    PARALLEL,
    Plan,
    default_plans,
    parallel_plans,
    parse_plan,
    plan_family,
)

K_MAX = (2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16)  # lead rules' k_max grid
_KS = (2, 4, 8, 12, 16)
FAMILY_BASELINES: dict[str, tuple[str, dict]] = {  # family → (label, plan_family arguments)
    "lead": ("lead", {"m": (1, 2, 3, 4, 5), "k_max": K_MAX}),
    "window": ("ESC window", {"w": (2, 3, 4), "k_max": _KS}),
    "beta": ("Adaptive-Consistency Beta", {"p": (0.6, 0.75, 0.9, 0.95, 0.99), "k_max": _KS}),
    "dirichlet": ("Adaptive-Consistency Dirichlet", {"p": (0.6, 0.75, 0.9, 0.95), "k_max": _KS}),
    "bayes": ("Best-of-∞ Bayes factor", {"B": (1.0, 3.0, 10.0, 30.0, 100.0), "k_max": _KS}),
}
# The same families with every wave parallel-stop (one wave of k_max, the rule checked at every finish,
# the rest aborted when it fires), and short-m@k: report baselines where the menu holds parallel-stop plans.
PARALLEL_BASELINES: dict[str, tuple[str, str, dict]] = {  # name → (label, family, plan_family arguments)
    "lead_par": ("lead, parallel-stop", "lead", {"m": (1, 2, 3, 4, 5), "k_max": (4, 8, 12, 16)}),
    "window_par": ("ESC window, parallel-stop", "window", {"w": (2, 3, 4), "k_max": (8, 12, 16)}),
    "beta_par": ("Adaptive-Consistency Beta, parallel-stop", "beta", {"p": (0.75, 0.9, 0.95, 0.99),
                                                                     "k_max": (4, 8, 16)}),
    "dirichlet_par": ("Adaptive-Consistency Dirichlet, parallel-stop", "dirichlet", {"p": (0.75, 0.9, 0.95),
                                                                                   "k_max": (8, 16)}),
    "bayes_par": ("Best-of-∞ Bayes factor, parallel-stop", "bayes", {"B": (3.0, 10.0, 30.0, 100.0),
                                                                    "k_max": (8, 16)}),
    "short": ("short-m@k", "first", {"m": (1, 2, 3, 5), "k_max": (4, 8, 16)}),
}
MENU_FAMILIES: dict[str, tuple[str, dict]] = {  # families for --plans that are not report baselines
    "boinf": ("Best-of-∞ as published", {"B": (1.0, 3.0, 10.0, 30.0, 100.0), "k_max": _KS}),
}
MENUS = ("none", "default", "parallel", *FAMILY_BASELINES, *MENU_FAMILIES)
_NEW_PLAN = re.compile(r"^[a-z_]+[:@]")


def ladder(actions: Sequence[int]) -> list[Plan]:
    """The uniform ladder: ``none@k`` for each k in ``actions``."""
    return [Plan((int(k),)) for k in actions]


def _capped(plans: Sequence[Plan], k_max: int) -> list[Plan]:
    """Plans cut to at most ``k_max`` samples, duplicates (by name) dropped, first kept."""
    out: dict[str, Plan] = {}
    for p in plans:
        c = p.capped(max_samples=k_max) if p.max_samples > k_max else p
        out.setdefault(c.name, c)
    return list(out.values())


def default_menu(k_max: int = 16) -> list[Plan]:
    """The default menu (module docstring), capped at ``k_max`` samples. Above 16 samples (a table with
    more samples per prompt, e.g. 24 of MATH-500's 80), every rule that draws one sample at a time up
    to 16 also runs up to ``k_max``: ``lead:m=3@1x16`` gains ``lead:m=3@1x24``."""
    ks = tuple(k for k in K_MAX if k <= k_max) or (k_max,)
    base = [*default_plans(), *plan_family("lead", m=(1, 2, 3), k_max=ks)]
    longer = [Plan((1,) * k_max, p.rule) for p in base
              if k_max > 16 and p.max_samples == 16 and p.rule.kind != "none" and set(p.waves) == {1}]
    return _capped([*base, *longer], k_max)


def family_plans(family: str, k_max: int = 16) -> list[Plan]:
    """One rule family over its grid (:data:`FAMILY_BASELINES`, :data:`MENU_FAMILIES`), k_max values above
    ``k_max`` replaced by ``k_max`` itself, which is always in the grid (so a family tunes up to the menu's
    most)."""
    families = {**FAMILY_BASELINES, **MENU_FAMILIES}
    if family not in families:
        raise InputError(f"unknown rule family {family!r}; families: {', '.join(families)}.")
    grid = dict(families[family][1])
    grid["k_max"] = tuple(sorted({min(int(k), k_max) for k in grid["k_max"]} | {k_max}))
    return _capped(plan_family(family, **grid), k_max)


def parallel_family_plans(name: str, k_max: int = 16) -> list[Plan]:
    """One parallel-stop baseline family of :data:`PARALLEL_BASELINES` over its grid, capped at ``k_max``
    (short-m@k keeps m ≤ k)."""
    _, family, grid = PARALLEL_BASELINES[name]
    grid = dict(grid)
    grid["k_max"] = tuple(sorted({min(int(k), k_max) for k in grid["k_max"]}))
    if family == "first":
        return _capped([p for m in grid["m"] for p in plan_family("first", m=m, k_max=tuple(
            k for k in grid["k_max"] if k >= m), mode=PARALLEL)], k_max)
    return _capped(plan_family(family, **grid, mode=PARALLEL), k_max)


def split_plan_names(text: str) -> list[str]:
    """"window:w=3@3x5,1,lead:m=2@1x8" → ["window:w=3@3x5,1", "lead:m=2@1x8"] (module docstring)."""
    names: list[str] = []
    for token in text.split(","):
        token = token.strip()
        if not token:
            continue
        if names and not _NEW_PLAN.match(token):
            names[-1] += "," + token
        else:
            names.append(token)
    return names


def resolve_plans(spec: str, actions: Sequence[int], *, parallel: bool = False) -> tuple[Plan, ...]:
    """The menu named by ``spec`` (module docstring) for the uniform ladder ``actions``; ``none`` gives
    the one-wave ladder alone; ``parallel``: ``default`` includes the parallel-stop menu."""
    acts = [int(k) for k in actions]
    if not acts or any(b <= a for a, b in zip(acts, acts[1:], strict=False)) or acts[0] < 1:
        raise InputError(f"actions must be strictly increasing sample counts k ≥ 1, e.g. 1,2,4,8,16; got {acts}.")
    spec = (spec or "").strip()
    if spec == "none":
        return tuple(ladder(acts))
    if "@" in spec:
        menu = [parse_plan(name) for name in split_plan_names(spec)]
    else:
        menu = [p for part in spec.split("+") for p in _named_menu(part.strip(), acts[-1], parallel)]
    out: dict[str, Plan] = {p.name: p for p in ladder(acts)}
    for p in menu:
        out.setdefault(p.name, p)
    return tuple(out.values())


def _named_menu(name: str, k_max: int, parallel: bool = False) -> list[Plan]:
    """One named menu of :func:`resolve_plans` (``none`` is the ladder, which every menu holds anyway)."""
    if name == "default":
        return default_menu(k_max) + (_capped(parallel_plans(), k_max) if parallel else [])
    if name == "parallel":
        return _capped(parallel_plans(), k_max)
    if name in FAMILY_BASELINES or name in MENU_FAMILIES:
        return family_plans(name, k_max)
    if name == "none":
        return []
    raise InputError(f"--plans must be one of {', '.join(MENUS)}, several joined by + (default+parallel), or a "
                     f"comma list of plan names such as none@1,lead:m=2@1x8 (RULE@SCHEDULE); got {name!r}.")


def ladder_columns(plans: Sequence[Plan], actions: Sequence[int]) -> np.ndarray:
    """Indices into ``plans`` of ``none@k`` for each k in ``actions``, in that order (InputError if one
    is missing: the uniform rule needs them)."""
    index = {p.name: j for j, p in enumerate(plans)}
    missing = [f"none@{k}" for k in actions if f"none@{k}" not in index]
    if missing:
        raise InputError(f"the plan menu lacks the uniform ladder's {', '.join(missing)}; the never-worse chain "
                         "serves those plans where nothing beats uniform. Add them to the menu.")
    return np.array([index[f"none@{k}"] for k in actions], dtype=np.intp)


def is_one_wave_menu(plans: Sequence[Plan]) -> bool:
    """Whether every plan is ``none@k`` (today's actions)."""
    return all(p.n_waves == 1 and p.rule.kind == "none" for p in plans)


def plan_descriptors(plans: Sequence[Plan], utility: np.ndarray, samples: np.ndarray) -> np.ndarray:
    """(P, 4) numbers that describe each plan to the utility learner, in place of k: its mean utility and
    mean expected samples over the given (training) prompts, its most samples and its most waves. Plans
    close in these columns share the learner's trees, so a plan it rarely sees is priced like its
    neighbours. Example: ``lead:m=2@1x8`` on a table where it averages 0.61 at 3.4 samples →
    (0.61, 3.4, 8, 8)."""
    return np.column_stack([np.asarray(utility, dtype=np.float64).mean(axis=0),
                            np.asarray(samples, dtype=np.float64).mean(axis=0),
                            [p.max_samples for p in plans], [p.n_waves for p in plans]])


def menu_of(plan_names: Sequence[str], actions: Sequence[int]) -> tuple[Plan, ...]:
    """A config's menu: its plan names parsed, or the one-wave ladder when it names none."""
    return tuple(parse_plan(n) for n in plan_names) if plan_names else tuple(ladder(actions))
