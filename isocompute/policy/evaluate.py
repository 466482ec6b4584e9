"""Held-out evaluation: the learned policy against the oracle and three baselines at matched budgets.

Two protocols. **Cross-validation** (``cross_validate``): for each seed, the prompts are split into k
folds; a policy with the given configuration is fitted on k − 1 folds (its own features, learners and
calibration) and scored on the held-out fold, so every prompt is scored once per seed by a policy that
never saw it. **Holdout** (``holdout``): a fitted policy is scored on a table it never saw.

Methods, each scored per held-out prompt i at requested budget B (U, C: the held-out prompts' utility
and cost tables; expectations are exact, nothing is sampled):

* ``oracle`` — the solver on the held-out prompts in hindsight (``allocate(U, C, B,
  rounding="deterministic")``: cost ≤ B, within one prompt's gap of the LP bound, which is reported
  as ``oracle_lp``). Not achievable; the upper reference.
* ``learned`` — the policy's default learner; ``learned_classifier`` / ``learned_utility`` each learner.
  Each prompt is decided alone through the calibration table, so the held-out part's realised cost
  carries the sampling noise of which prompts it holds (about ±4% at budget 4 on 160 arith prompts).
* ``learned_batch`` — the default learner with its knob solved on the held-out part itself
  (``Policy.decide(..., match="batch")``): what an offline batch job spends, on budget to one prompt's step.
* ``uniform`` — every prompt gets the same k, mixing the two actions adjacent to B so the mean cost
  is B: with mean action costs c̄_j ≤ B ≤ c̄_{j+1}, q = (B − c̄_j)/(c̄_{j+1} − c̄_j) and prompt i scores
  (1 − q)·U[i, j] + q·U[i, j+1]. Example: k ∈ {1, 2, 4, 8}, B = 3 → half k = 2, half k = 4.
* ``heuristic`` — "longer prompts get more samples": the same two actions as uniform, but the top
  q-share of prompts by character length (threshold from the *training* prompts, ties split in
  proportion) take the larger one.
* ``random`` — the oracle's own action histogram h dealt to random prompts: prompt i scores
  Σ_a h_a·U[i, a]. Same spend as the oracle, no targeting; isolates the value of *which* prompts get
  compute.

With a probe feature (``PolicyConfig.probe``) the probe values travel with the prompts (``probe=``,
split with them into folds) and the learned methods pay the probe: their cost is C + c_p at every
action, so at budget B they buy B − c_p in samples. The oracle and the baselines do not use the probe
and pay nothing for it, so "gain vs uniform" is net of the probe's cost. Extra feature blocks
(``PolicyConfig.feature_extras``, e.g. a sentence embedding) are paid the same way: the learned methods'
cost is C + c_p + c_f (``Policy.paid_per_request``), the baselines pay neither. Each refit measures c_f
on its training part, which in samples needs one sample's FLOPs per prompt (``sample_flops=``, split
with the prompts) unless the configuration declares ``feature_cost``.

Per budget the report carries, pooled over folds and seeds: accuracy (mean utility) and realised mean
cost per method; imitation accuracy (learned action = oracle action); regret = oracle − learned
accuracy and the bound (1 − imitation) × max_i gap_i with gap_i = U[i, o_i] − min_a U[i, a] — it holds
per fold by construction (a mismatched prompt loses at most its gap), so a violation flags a bug; the
relative gain over uniform with a paired bootstrap 95% CI over prompts (per-prompt utilities averaged
over seeds, prompts resampled with replacement); and APGR = (learned − uniform)/(oracle − uniform), the
share of the uniform→oracle gap recovered (None when that gap is 0).

Ignores: the variance of a single sampled answer (utilities are exact expectations over the table's
samples) and serving-time effects (batching, latency).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from isocompute.errors import InputError
from isocompute.policy.fallback import LEARNED, UNIFORM, uniform_actions, uniform_mix
from isocompute.policy.policy import LEARNERS, Policy, PolicyConfig
from isocompute.policy.shrinkage import shrink_utilities
from isocompute.solver.allocate import allocate, feasible_range

BASE_METHODS = ("oracle", "learned", "uniform", "heuristic", "random")
METHODS = (*BASE_METHODS, "oracle_lp", "learned_batch", *(f"learned_{name}" for name in LEARNERS),
           "learned_no_fallback")
__all__ = ["BASE_METHODS", "METHODS", "Evaluation", "check_targets", "cross_validate", "default_budgets", "holdout",
           "cost_to_reach", "length_rule", "same_accuracy", "summarise", "uniform_mix"]


@dataclass(frozen=True, eq=False)
class Evaluation:
    """Per-prompt scores of every method: arrays indexed (seed, method, budget, prompt).

    ``utility``/``cost``: (S, M, B, N) with methods in :data:`METHODS` (NaN for a learner the policy
    lacks); ``oracle_actions``/``learned_actions``: (S, B, N) action indices, ``learner_actions``: (S, L, B, N)
    per learner in :data:`LEARNERS` order (−1 where the policy lacks it); ``gap``: (S, B, N)
    U[i, o_i] − min_a U[i, a]; ``fold``: (S, N) held-out fold of each prompt; ``default_learner``:
    per (seed, fold) the learner ``learned`` used; ``rules``: per (seed, fold, budget) the rule of the
    never-worse chain that ``learned`` served (``learned_no_fallback`` is the learner everywhere);
    ``cost_alt``: (S, M, B, N) the same costs in ``alt_unit`` (FLOPs; None without a FLOP model);
    ``reference``: the uniform rule at the largest action on all N prompts — ``accuracy``, ``cost``,
    ``cost_alt`` and ``k`` — the accuracy "same accuracy for less" is measured against.
    """

    mode: str
    budgets: np.ndarray
    actions: tuple[int, ...]
    seeds: tuple[int, ...]
    n_folds: int
    utility: np.ndarray
    cost: np.ndarray
    oracle_actions: np.ndarray
    learned_actions: np.ndarray
    learner_actions: np.ndarray
    gap: np.ndarray
    fold: np.ndarray
    default_learner: list[list[str]]
    selection: list[list[dict[str, Any]]]
    rules: list[list[list[str]]] | None = None
    cost_alt: np.ndarray | None = None
    alt_unit: str | None = None
    reference: dict[str, Any] | None = None


def default_budgets(lo: float, hi: float) -> list[float]:
    """Report grid: 9 geometric steps over [lo, hi] plus the powers of two inside it."""
    grid = set(np.round(np.geomspace(lo, hi, 9) if lo > 0 else np.linspace(lo, hi, 9), 6).tolist())
    if lo > 0:
        grid |= {float(2.0**j) for j in range(int(np.floor(np.log2(lo))), int(np.ceil(np.log2(hi))) + 1)
                 if lo <= 2.0**j <= hi}
    return sorted(grid)


def length_rule(train_lengths: np.ndarray, lengths: np.ndarray, share: float) -> np.ndarray:
    """Probability that each prompt takes the dearer action when the longest ``share`` of the training
    prompts do: 1 above the threshold length, 0 below, and a split at it so the training share is exact."""
    t = np.sort(np.asarray(train_lengths))
    m = share * t.size  # training prompts to upgrade
    if m <= 0:
        return np.zeros(len(lengths))
    if m >= t.size:
        return np.ones(len(lengths))
    thr = t[t.size - int(np.ceil(m))]
    above = int((t > thr).sum())
    at = int((t == thr).sum())
    r = (m - above) / at
    lengths = np.asarray(lengths)
    return np.where(lengths > thr, 1.0, np.where(lengths == thr, r, 0.0))


def _one_hot(a: np.ndarray, A: int) -> np.ndarray:
    P = np.zeros((a.size, A))
    P[np.arange(a.size), a] = 1.0
    return P


def _two_point(lo: int, hi: int, p_up: np.ndarray | float, n: int, A: int) -> np.ndarray:
    """(n, A): action ``hi`` with probability p_up per prompt, else ``lo``."""
    P = np.zeros((n, A))
    P[:, lo] += 1 - np.broadcast_to(p_up, (n,))
    P[:, hi] += np.broadcast_to(p_up, (n,))
    return P


def _method_probs(policy: Policy, X: np.ndarray, u: np.ndarray, route: np.ndarray, U: np.ndarray, C: np.ndarray,
                  b: float, train_lengths: np.ndarray, lengths: np.ndarray,
                  default: str) -> tuple[dict[str, tuple[np.ndarray, bool]], np.ndarray, np.ndarray, str]:
    """Every method's action probabilities per held-out prompt at budget b, and whether it pays the
    probe and extra features: {method: ((n, A), pays)}, plus the oracle's and the served actions and
    the rule the never-worse chain served."""
    n, A = U.shape
    f_lo, f_hi = feasible_range(C)
    # With per-prompt (FLOP) costs the held-out part's feasible range can be narrower than the
    # trained range; the oracle then takes the cheapest (or dearest) action everywhere.
    b_oracle = float(np.clip(b, f_lo, f_hi))
    o = allocate(U, C, b_oracle, rounding="deterministic").actions
    out: dict[str, tuple[np.ndarray, bool]] = {
        "oracle": (_one_hot(o, A), False),
        "oracle_lp": (allocate(U, C, b_oracle, rounding="mix").action_probs(), False)}
    served = o  # replaced below: the default learner is always among the policy's learners
    rule = LEARNED
    for name in policy.learners_:
        a, _ = policy.decide_features(X, u, route, b, name)
        out[f"learned_{name}"] = (_one_hot(a, A), True)
        if name != default:
            continue
        out["learned_no_fallback"] = (_one_hot(a, A), True)
        rule = policy.rule_at(b, name).rule
        if rule == UNIFORM:
            served = uniform_actions(u, policy.sample_action_costs, b)
            batch = uniform_actions(u, policy.sample_action_costs, b, match="batch")
        else:
            served = a
            batch, _ = policy.decide_features(X, u, route, b, name, match="batch")
        out["learned"] = (_one_hot(served, A), rule != UNIFORM)
        out["learned_batch"] = (_one_hot(batch, A), rule != UNIFORM)
    lo, hi, q = uniform_mix(C.mean(axis=0), b)
    out["uniform"] = (_two_point(lo, hi, q, n, A), False)
    # The heuristic decides from training data only: its two actions and share come from the policy's
    # per-action training costs (without the probe and extra features it does not use), its threshold
    # from the training lengths.
    hlo, hhi, hq = uniform_mix(policy.sample_action_costs, b)
    out["heuristic"] = (_two_point(hlo, hhi, length_rule(train_lengths, lengths, hq), n, A), False)
    out["random"] = (np.broadcast_to(np.bincount(o, minlength=A) / n, (n, A)), False)
    return out, o, served, rule


def _score(policy: Policy, prompts: Sequence[str], U: np.ndarray, C: np.ndarray, budgets: np.ndarray,
           train_lengths: np.ndarray, default: str, probe: np.ndarray | None = None,
           C_alt: np.ndarray | None = None, paid_alt: float = 0.0) -> dict[str, Any]:
    """Scores of every method on one held-out part: dict of arrays (M, B, n) / (B, n), and the rule
    served per budget.

    ``C`` is the samples' cost; the learned methods also pay the policy's probe and extra features
    (``C + c_p + c_f``) where the learned rule serves, the baselines do not. ``C_alt``: the same costs
    in a second unit (FLOPs), with ``paid_alt`` the per-request payment in that unit.
    """
    n, A = U.shape
    rows = np.arange(n)
    X = policy.features(prompts, probe)
    u, route = policy.prompt_keys(prompts)
    lengths = np.array([len(p) for p in prompts])
    util = np.full((len(METHODS), budgets.size, n), np.nan)
    cost = np.full_like(util, np.nan)
    cost_alt = np.full_like(util, np.nan)
    o_act = np.empty((budgets.size, n), dtype=np.intp)
    l_act = np.empty((budgets.size, n), dtype=np.intp)
    per_learner = np.full((len(LEARNERS), budgets.size, n), -1, dtype=np.intp)
    gap = np.empty((budgets.size, n))
    rules = []
    M = {m: j for j, m in enumerate(METHODS)}
    for bi, b in enumerate(budgets):
        b = policy.check_budget(b)
        probs, o, served, rule = _method_probs(policy, X, u, route, U, C, b, train_lengths, lengths, default)
        for m, (P, pays) in probs.items():
            util[M[m], bi] = (P * U).sum(axis=1)
            cost[M[m], bi] = (P * C).sum(axis=1) + (policy.paid_per_request if pays else 0.0)
            if C_alt is not None:
                cost_alt[M[m], bi] = (P * C_alt).sum(axis=1) + (paid_alt if pays else 0.0)
        for name in policy.learners_:
            per_learner[LEARNERS.index(name), bi] = probs[f"learned_{name}"][0].argmax(axis=1)
        o_act[bi], l_act[bi], gap[bi] = o, served, U[rows, o] - U.min(axis=1)
        rules.append(rule)
    return {"utility": util, "cost": cost, "cost_alt": cost_alt, "oracle_actions": o_act, "learned_actions": l_act,
            "learner_actions": per_learner, "gap": gap, "rules": rules}


def cross_validate(prompts: Sequence[str], U: np.ndarray, C: np.ndarray, config: PolicyConfig,
                   budgets: Sequence[float], *, folds: int = 5, seeds: Sequence[int] = (0, 1, 2),
                   probe: np.ndarray | None = None, sample_flops: np.ndarray | None = None,
                   C_alt: np.ndarray | None = None, paid_alt: float = 0.0, alt_unit: str = "flops",
                   label_var: np.ndarray | None = None, groups: Sequence[str] | None = None,
                   progress: bool = False) -> Evaluation:
    """k-fold CV over prompts for each seed, refitting ``config`` (both learners) on each training part;
    ``probe``: the probe's value per prompt when ``config`` has a probe (split with the prompts);
    ``sample_flops``: one sample's FLOPs per prompt, to price extra features in samples (split likewise);
    ``C_alt``: the cost table in ``alt_unit`` too (FLOPs), ``paid_alt`` the per-request payment in it;
    ``label_var``: each utility's sampling variance, needed when the config shrinks the learners' labels
    (``shrinkage="eb"``: each training part is shrunk toward its own ``groups``' means, so nothing of the
    held-out part leaks into the labels)."""
    from tqdm.auto import tqdm

    prompts = list(prompts)
    n = len(prompts)
    if (config.probe is None) != (probe is None):
        raise InputError("probe values must be passed exactly when the configuration has a probe "
                         f"(it {'has none' if config.probe is None else 'has ' + repr(config.probe.name)}).")
    pv = None if probe is None else np.asarray(probe, dtype=np.float64)
    if pv is not None and pv.shape != (n,):
        raise InputError(f"probe values must be one number per prompt, shape ({n},); got shape {pv.shape}.")
    sf = None if sample_flops is None else np.asarray(sample_flops, dtype=np.float64)
    if sf is not None and sf.shape != (n,):
        raise InputError(f"sample_flops must be one number per prompt, shape ({n},); got shape {sf.shape}.")
    if folds < 2:
        raise InputError(f"--folds must be ≥ 2 for cross-validation (got {folds}); use --holdout to score a "
                         "fitted policy on a separate table.")
    min_train = 4 * config.calibration_folds
    if n // folds < 2 or n - (n + folds - 1) // folds < min_train:
        raise InputError(f"{folds} folds over {n} prompts leave held-out parts of {n // folds} prompt(s) and "
                         f"training parts of {n - (n + folds - 1) // folds}; each needs ≥ 2 held-out and ≥ "
                         f"{min_train} training prompts. Use fewer folds or a larger table.")
    budgets_arr = np.asarray(budgets, dtype=np.float64)
    refit = dataclasses.replace(config, learner="auto")
    S, N = len(seeds), n
    util = np.full((S, len(METHODS), budgets_arr.size, N), np.nan)
    cost = np.full_like(util, np.nan)
    o_act = np.empty((S, budgets_arr.size, N), dtype=np.intp)
    l_act = np.empty_like(o_act)
    per_learner = np.full((S, len(LEARNERS), budgets_arr.size, N), -1, dtype=np.intp)
    gap = np.empty((S, budgets_arr.size, N))
    fold_of = np.empty((S, N), dtype=np.intp)
    cost_alt = np.full_like(util, np.nan)
    defaults: list[list[str]] = []
    selections: list[list[dict[str, Any]]] = []
    rules: list[list[list[str]]] = []
    bar = tqdm(total=S * folds, desc="report: fitting folds", unit="fold", disable=not progress)
    for si, seed in enumerate(seeds):
        perm = np.random.default_rng(seed).permutation(N)
        parts = np.array_split(perm, folds)
        defaults.append([])
        selections.append([])
        rules.append([])
        for f, test in enumerate(parts):
            test = np.sort(test)
            train = np.sort(np.concatenate(parts[:f] + parts[f + 1:]))
            labels = None
            if config.shrinkage == "eb":
                if label_var is None:
                    raise InputError("a configuration with shrinkage='eb' needs label_var= (the utilities' sampling "
                                     "variance, policy.shrinkage.sampling_variance) for cross-validation.")
                labels = shrink_utilities(U[train], label_var[train],
                                          None if groups is None else [groups[i] for i in train])
            pol = Policy(dataclasses.replace(refit, seed=config.seed + 1000 * seed + f)).fit_arrays(
                [prompts[i] for i in train], U[train], C[train], probe=None if pv is None else pv[train],
                sample_flops=None if sf is None else sf[train], labels=labels)
            default = config.learner if config.learner in LEARNERS else pol.default_learner_
            sc = _score(pol, [prompts[i] for i in test], U[test], C[test], budgets_arr,
                        pol.train_lengths_, default, None if pv is None else pv[test],
                        None if C_alt is None else C_alt[test], paid_alt)
            util[si][:, :, test], cost[si][:, :, test] = sc["utility"], sc["cost"]
            cost_alt[si][:, :, test] = sc["cost_alt"]
            rules[si].append(sc["rules"])
            o_act[si][:, test], l_act[si][:, test], gap[si][:, test] = (
                sc["oracle_actions"], sc["learned_actions"], sc["gap"])
            per_learner[si][:, :, test] = sc["learner_actions"]
            fold_of[si, test] = f
            defaults[si].append(default)
            selections[si].append(pol.selection_)
            bar.update(1)
    bar.close()
    return Evaluation("cv", budgets_arr, config.actions, tuple(seeds), folds, util, cost, o_act, l_act,
                      per_learner, gap, fold_of, defaults, selections, rules,
                      None if C_alt is None else cost_alt, None if C_alt is None else alt_unit,
                      _reference(U, C, C_alt, config.actions))


def _reference(U: np.ndarray, C: np.ndarray, C_alt: np.ndarray | None, actions: Sequence[int]) -> dict[str, Any]:
    """The uniform rule at the largest action: what "same accuracy for less" is measured against."""
    return {"k": int(actions[-1]), "accuracy": float(U[:, -1].mean()), "cost": float(C[:, -1].mean()),
            "cost_alt": None if C_alt is None else float(np.asarray(C_alt)[:, -1].mean())}


def holdout(policy: Policy, prompts: Sequence[str], U: np.ndarray, C: np.ndarray,
            budgets: Sequence[float], *, probe: np.ndarray | None = None, C_alt: np.ndarray | None = None,
            paid_alt: float = 0.0, alt_unit: str = "flops") -> Evaluation:
    """Score a fitted policy on prompts it never saw (one part, no refitting); ``probe`` as for decide,
    ``C_alt`` / ``paid_alt`` as for :func:`cross_validate`."""
    prompts = list(prompts)
    if len(prompts) < 2:
        raise InputError(f"a holdout table needs at least 2 prompts; it has {len(prompts)}.")
    budgets_arr = np.asarray(budgets, dtype=np.float64)
    sc = _score(policy, prompts, U, C, budgets_arr, policy.train_lengths_, policy.default_learner_, probe,
                C_alt, paid_alt)
    n = len(prompts)
    return Evaluation("holdout", budgets_arr, policy.actions, (policy.config.seed,), 1,
                      sc["utility"][None], sc["cost"][None], sc["oracle_actions"][None],
                      sc["learned_actions"][None], sc["learner_actions"][None], sc["gap"][None],
                      np.zeros((1, n), dtype=np.intp),
                      [[policy.default_learner_]], [[policy.selection_]], [[sc["rules"]]],
                      None if C_alt is None else sc["cost_alt"][None], None if C_alt is None else alt_unit,
                      _reference(U, C, C_alt, policy.actions))


# --------------------------------------------------------------------------------------------- summary


def bootstrap_indices(n: int, n_boot: int, seed: int) -> np.ndarray:
    """(n_boot, n) prompt indices drawn with replacement (shared by all methods: a paired bootstrap)."""
    return np.random.default_rng(seed).integers(0, n, size=(n_boot, n))


def _ci(samples: np.ndarray) -> list[float]:
    return [float(np.percentile(samples, 2.5)), float(np.percentile(samples, 97.5))]


def summarise(ev: Evaluation, *, n_boot: int = 2000, seed: int = 0) -> dict[str, Any]:
    """The report's numbers (JSON-able): per budget, per method, gains, CIs, imitation, regret, bound."""
    S, M, B, N = ev.utility.shape
    idx = bootstrap_indices(N, n_boot, seed)
    mi = {m: j for j, m in enumerate(METHODS)}
    per_prompt = ev.utility.mean(axis=0)  # (M, B, N): averaged over seeds, so prompts are the unit
    A = len(ev.actions)
    entries = []
    for bi, b in enumerate(ev.budgets):
        methods: dict[str, Any] = {}
        for m in METHODS:
            u = per_prompt[mi[m], bi]
            if np.isnan(u).any():
                continue
            boot = u[idx].mean(axis=1)
            cboot = ev.cost[:, mi[m], bi].mean(axis=0)[idx].mean(axis=1)
            methods[m] = {"accuracy": float(ev.utility[:, mi[m], bi].mean()),
                          "cost": float(ev.cost[:, mi[m], bi].mean()), "ci95": _ci(boot), "cost_ci95": _ci(cboot)}
            if ev.cost_alt is not None:
                methods[m]["cost_alt"] = float(ev.cost_alt[:, mi[m], bi].mean())
        uU = per_prompt[mi["uniform"], bi]
        rel, ci = _paired_gain(per_prompt[mi["learned"], bi], uU, idx)
        match = ev.oracle_actions[:, bi] == ev.learned_actions[:, bi]  # (S, N)
        imitation = float(match.mean())
        regret = methods["oracle"]["accuracy"] - methods["learned"]["accuracy"]
        gap_max = float(ev.gap[:, bi].max())
        per_fold = []
        for s in range(S):
            for f in range(ev.n_folds):
                sel = ev.fold[s] == f
                o = ev.utility[s, mi["oracle"], bi, sel].mean()
                lrn = ev.utility[s, mi["learned"], bi, sel].mean()
                imit = float(match[s, sel].mean())
                bound = (1 - imit) * float(ev.gap[s, bi, sel].max())
                per_fold.append({"seed": ev.seeds[s], "fold": f, "n": int(sel.sum()),
                                 "oracle": float(o), "learned": float(lrn),
                                 "uniform": float(ev.utility[s, mi["uniform"], bi, sel].mean()),
                                 "cost": float(ev.cost[s, mi["learned"], bi, sel].mean()),
                                 "imitation_accuracy": imit, "regret": float(o - lrn), "bound": bound,
                                 "regret_le_bound": bool(o - lrn <= bound + 1e-12),
                                 "learner": ev.default_learner[s][f]})
        gap_uo = methods["oracle"]["accuracy"] - methods["uniform"]["accuracy"]
        confusion = np.zeros((A, A), dtype=np.int64)
        np.add.at(confusion, (ev.learned_actions[:, bi].ravel(), ev.oracle_actions[:, bi].ravel()), 1)
        learners = {}
        for name in LEARNERS:
            m = f"learned_{name}"
            if m in methods:
                la = ev.learner_actions[:, LEARNERS.index(name), bi]
                learners[name] = {**methods[m], "imitation_accuracy": float((la == ev.oracle_actions[:, bi]).mean()),
                                  "gain_vs_uniform": float(
                    (methods[m]["accuracy"] - methods["uniform"]["accuracy"]) / methods["uniform"]["accuracy"])
                    if methods["uniform"]["accuracy"] > 0 else None}
        uL = per_prompt[mi["learned"], bi]
        entries.append({
            "budget": float(b),
            "methods": {m: methods[m] for m in METHODS if m in methods},
            "gain_vs_uniform": {"relative": float(rel), "absolute": float(uL.mean() - uU.mean()), "ci95": ci,
                                "significant": bool(ci[0] > 0 or ci[1] < 0)},
            "rules": _rule_shares(ev, bi),
            "gain_no_fallback": _gain_entry(per_prompt[mi["learned_no_fallback"], bi], uU, idx),
            "imitation_accuracy": imitation,
            "regret": float(regret),
            "bound": float((1 - imitation) * gap_max),
            "regret_le_bound_all_folds": all(p["regret_le_bound"] for p in per_fold),
            "apgr": float((methods["learned"]["accuracy"] - methods["uniform"]["accuracy"]) / gap_uo)
            if gap_uo > 1e-12 else None,
            "cost_error": float(methods["learned"]["cost"] / b - 1) if b > 0 else None,
            "cost_error_batch": float(methods["learned_batch"]["cost"] / b - 1)
            if b > 0 and "learned_batch" in methods else None,
            "oracle_budget_binding": bool(methods["oracle_lp"]["cost"] >= b * (1 - 1e-6)),
            "learners": learners,
            "action_histogram": {
                "oracle": np.bincount(ev.oracle_actions[:, bi].ravel(), minlength=A).tolist(),
                "learned": np.bincount(ev.learned_actions[:, bi].ravel(), minlength=A).tolist(),
            },
            "confusion_learned_vs_oracle": confusion.tolist(),
            "per_fold": per_fold,
        })
    return {"budgets": entries, "n_prompts": N, "bootstrap": n_boot, "bootstrap_seed": seed,
            "learner_comparison": compare_learners(entries),
            "same_accuracy": same_accuracy(entries, ev.reference, ev.alt_unit) if ev.reference else None}


def _paired_gain(a: np.ndarray, base: np.ndarray, idx: np.ndarray) -> tuple[float, list[float]]:
    """Relative gain of per-prompt scores ``a`` over ``base`` and its paired bootstrap 95% CI (NaN if base is 0)."""
    rel = (a.mean() - base.mean()) / base.mean() if base.mean() > 0 else float("nan")
    ba, bb = a[idx].mean(axis=1), base[idx].mean(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        boot_rel = np.where(bb > 0, (ba - bb) / bb, np.nan)
    ci = _ci(boot_rel[np.isfinite(boot_rel)]) if np.isfinite(boot_rel).any() else [float("nan")] * 2
    return float(rel), ci


def _gain_entry(a: np.ndarray, base: np.ndarray, idx: np.ndarray) -> dict[str, Any] | None:
    if np.isnan(a).any():
        return None
    rel, ci = _paired_gain(a, base, idx)
    return {"relative": rel, "ci95": ci, "significant": bool(ci[0] > 0 or ci[1] < 0)}


def _rule_shares(ev: Evaluation, bi: int) -> dict[str, float] | None:
    """Share of the (seed, fold) policies whose never-worse chain served each rule at budget ``bi``."""
    if ev.rules is None:
        return None
    served = [fold[bi] for seed in ev.rules for fold in seed]
    return {r: served.count(r) / len(served) for r in sorted(set(served))}


def cost_to_reach(points: Sequence[tuple[float, float, float | None]], target: float) -> dict[str, Any] | None:
    """The least cost at which a method's accuracy reaches ``target``, from its (cost, alt cost, accuracy)
    points at increasing budgets: the first point at or above the target, interpolated linearly from the
    point before it (a hashed mix of the two budgets' decisions realises every point on that segment,
    so the interpolated cost is achievable). None when no point reaches it; ``at_lowest`` when the
    first point already does (the true cost may be lower).

    Example: points (2, ·, 0.80), (4, ·, 0.90) and target 0.85 → cost 3.
    """
    prev = None
    for c, c_alt, acc in points:
        if acc >= target - 1e-12:
            if prev is None:
                return {"cost": c, "cost_alt": c_alt, "at_lowest": True}
            t = (target - prev[2]) / (acc - prev[2])
            alt = None if c_alt is None or prev[1] is None else prev[1] + t * (c_alt - prev[1])
            return {"cost": prev[0] + t * (c - prev[0]), "cost_alt": alt, "at_lowest": False}
        prev = (c, c_alt, acc)
    return None


def same_accuracy(entries: list[dict[str, Any]], reference: dict[str, Any], alt_unit: str | None) -> dict[str, Any]:
    """Per method: the cost to reach the accuracy of uniform at the largest action (k = 16 for actions
    1…16), in the cost unit and in ``alt_unit``, and how many times less that is than the reference's."""
    target = reference["accuracy"]
    out: dict[str, Any] = {"reference": reference, "alt_unit": alt_unit, "methods": {}}
    for m in ("oracle", "learned", "learned_no_fallback", "uniform", "heuristic", "random"):
        if not all(m in e["methods"] for e in entries):
            continue
        pts = [(e["methods"][m]["cost"], e["methods"][m].get("cost_alt"), e["methods"][m]["accuracy"])
               for e in entries]
        hit = cost_to_reach(pts, target)
        if hit is not None:
            hit["times_less"] = reference["cost"] / hit["cost"] if hit["cost"] > 0 else None
            hit["times_less_alt"] = (reference["cost_alt"] / hit["cost_alt"]
                                     if hit["cost_alt"] and reference.get("cost_alt") else None)
        out["methods"][m] = hit
    return out


def compare_learners(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """Which learner did better on held-out prompts, averaged over the budgets both were scored at."""
    acc = {name: [e["learners"][name]["accuracy"] for e in entries if name in e["learners"]] for name in LEARNERS}
    acc = {k: float(np.mean(v)) for k, v in acc.items() if len(v) == len(entries) and v}
    if len(acc) < 2:
        return {"scores": acc, "better": next(iter(acc), None), "why": "only one learner was scored"}
    c, u = acc["classifier"], acc["utility"]
    better = "utility" if u > c + 1e-12 else "classifier"
    return {"scores": acc, "better": better,
            "why": f"{better}: mean held-out accuracy {max(c, u):.4f} vs {min(c, u):.4f} over {len(entries)} budgets"
                   + (" (tie → classifier, the seed's learner)" if abs(u - c) <= 1e-12 else "")}


def check_targets(summary: dict[str, Any], budget: float = 4.0) -> dict[str, Any] | None:
    """The issue's targets at ``budget`` (None when it was not evaluated): imitation ≥ 91%, gain over
    uniform ≥ 5% relative with a CI excluding 0, realised cost within ±2%."""
    entry = next((e for e in summary["budgets"] if abs(e["budget"] - budget) < 1e-9), None)
    if entry is None:
        return None
    g = entry["gain_vs_uniform"]
    return {
        "budget": budget,
        "imitation_ge_91pct": {"value": entry["imitation_accuracy"], "pass": entry["imitation_accuracy"] >= 0.91,
                               "ceiling": entry.get("imitation_ceiling")},
        "gain_ge_5pct_ci_excludes_0": {"value": g["relative"], "ci95": g["ci95"],
                                       "pass": bool(g["relative"] >= 0.05 and g["ci95"][0] > 0)},
        "cost_within_2pct": {"value": entry["cost_error"],
                             "pass": entry["cost_error"] is not None and abs(entry["cost_error"]) <= 0.02},
        "batch_cost_within_2pct": {"value": entry["cost_error_batch"],
                                   "pass": entry["cost_error_batch"] is not None
                                   and abs(entry["cost_error_batch"]) <= 0.02},
    }
