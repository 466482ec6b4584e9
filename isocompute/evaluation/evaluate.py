"""Held-out evaluation: the learned policy against the oracle and three baselines at matched budgets.

Two protocols. **Cross-validation** (``cross_validate``): for each seed, the prompts are split into k
folds; a policy with the given configuration is fitted on k − 1 folds (its own features, learners and
calibration) and scored on the held-out fold, so every prompt is scored once per seed by a policy that
never saw it. **Holdout** (``holdout``): a fitted policy is scored on a table it never saw.

Methods, each scored per held-out prompt i at requested budget B (U, C: the held-out prompts' utility
and cost tables; expectations are exact, nothing is sampled):

Actions are the policy's plans (columns of U and C; the one-wave ``none@k`` without a plan menu);
every method also has its expected waves per prompt (latency: upstream requests), from W, and with
token counts its expected tokens and latency (:mod:`isocompute.evaluation.channels`).

* ``oracle`` — the solver on the held-out prompts in hindsight (``allocate(U, C, B,
  rounding="deterministic")`` over each prompt's cost-sorted plan columns: cost ≤ B, within one
  prompt's gap of the LP bound, which is reported as ``oracle_lp``). Not achievable; the upper reference.
* ``learned`` — the policy *as served*: its default learner where its never-worse chain keeps the
  learned rule at this budget, the fixed plan or the uniform mix (hashed per prompt) where it falls
  back (then nothing is paid for the probe or extra features); ``learned_no_fallback`` — the default learner everywhere;
  ``learned_classifier`` / ``learned_utility`` — each learner, no fallback. Each prompt is decided alone
  through the calibration table, so the held-out part's realised cost carries the sampling noise of which
  prompts it holds (about ±4% at budget 4 on 160 arith prompts).
* ``learned_mix`` — ``learned`` with a fallback's two-plan mix scored at its share q, not drawn by each
  prompt's hash: the same expectation over new prompts, without the draw on a few held-out ones (issue 32).
* ``learned_batch`` — ``learned`` with the knob (or the uniform mix) solved on the held-out part itself
  (``Policy.decide(..., match="batch")``): what an offline batch job spends, on budget to one prompt's step.
* ``fixed_plan`` — the policy's own fixed-plan rule (:mod:`isocompute.policy.plans.fixed_rule`: one plan
  of its menu, or a mix of two, chosen on the training part), whether or not its chain serves it;
  ``fixed_<family>`` / ``fixed_best`` — the best fixed plan of each rule family and of all of them
  (:mod:`isocompute.evaluation.baselines`, chosen on the training part: the ESC, Adaptive-Consistency and
  Best-of-∞ baselines), when the caller passes their plan arrays.
* ``uniform`` — every prompt gets the same k (the ladder ``none@k``), mixing the two actions adjacent
  to B so the mean cost is B: with mean action costs c̄_j ≤ B ≤ c̄_{j+1}, q = (B − c̄_j)/(c̄_{j+1} − c̄_j) and prompt i scores
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

The per-prompt scores land in an :class:`Evaluation`; :mod:`isocompute.evaluation.summary` turns them into
the report's numbers (gains with CIs, imitation, regret and its bound, "same accuracy for less").

Ignores: the variance of a single sampled answer (utilities are exact expectations over the table's
samples) and serving-time effects (batching, latency).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from isocompute.errors import InputError
from isocompute.evaluation.baselines import FixedBaselines, length_rule, score_baselines  # noqa: F401 (re-exported)
from isocompute.evaluation.channels import plan_channels, rows_of
from isocompute.evaluation.folds import run_jobs
from isocompute.evaluation.reach import fold_latencies, pooled_reach, reach_scores, reach_setup
from isocompute.evaluation.summary import (  # noqa: F401  (re-exported: evaluation's public names)
    BASE_METHODS,
    METHODS,
    Evaluation,
    bootstrap_indices,
    check_targets,
    compare_learners,
    cost_to_reach,
    same_accuracy,
    summarise,
)
from isocompute.policy.fallback import FIXED_PLAN, LEARNED, uniform_mix
from isocompute.policy.latency import reachable_latency
from isocompute.policy.learn.shrinkage import shrink_utilities
from isocompute.policy.plans.arrays import allocate_plans
from isocompute.policy.policy import LEARNERS, Policy, PolicyConfig
from isocompute.solver.allocate import feasible_range


def default_budgets(lo: float, hi: float) -> list[float]:
    """Report grid: 9 geometric steps over [lo, hi] plus the powers of two inside it."""
    # interior steps rounded for legibility; the ends exact, so rounding never leaves the trained range
    grid = set(np.round(np.geomspace(lo, hi, 9) if lo > 0 else np.linspace(lo, hi, 9), 6)[1:-1].tolist()) | {
        float(lo), float(hi)}
    if lo > 0:
        grid |= {float(2.0**j) for j in range(int(np.floor(np.log2(lo))), int(np.ceil(np.log2(hi))) + 1)
                 if lo <= 2.0**j <= hi}
    return sorted(grid)


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
    o = allocate_plans(U, C, b_oracle, rounding="deterministic").actions
    out: dict[str, tuple[np.ndarray, bool]] = {
        "oracle": (_one_hot(o, A), False),
        "oracle_lp": (allocate_plans(U, C, b_oracle, rounding="mix").action_probs(), False)}
    served = o  # replaced below: the default learner is always among the policy's learners
    rule = LEARNED
    for name in policy.learners_:
        a, _ = policy.decide_features(X, u, route, b, name)
        out[f"learned_{name}"] = (_one_hot(a, A), True)
        if name != default:
            continue
        out["learned_no_fallback"] = (_one_hot(a, A), True)
        rule = policy.rule_at(b, name).rule
        if rule != LEARNED:
            served = policy.fallback_actions(rule, u, b)
            batch = policy.fallback_actions(rule, u, b, match="batch")
        else:
            served = a
            batch, _ = policy.decide_features(X, u, route, b, name, match="batch")
        out["learned"] = (_one_hot(served, A), rule == LEARNED)
        mix = out["learned"][0] if rule == LEARNED else _two_point(*policy.fallback_mix(rule, b), n, A)
        out["learned_mix"] = (mix, rule == LEARNED)  # a fallback's mix at its share, not hashed (issue 32)
        out["learned_batch"] = (_one_hot(batch, A), rule == LEARNED)
    if policy.config.plans:
        out["fixed_plan"] = (_one_hot(policy.fallback_actions(FIXED_PLAN, u, b), A), False)
    lad = policy.ladder
    lo, hi, q = uniform_mix(C[:, lad].mean(axis=0), b)
    out["uniform"] = (_two_point(int(lad[lo]), int(lad[hi]), q, n, A), False)
    # The heuristic decides from training data only: its two actions and share from the policy's per-action
    # training costs (without the probe and extra features it does not use), its threshold from training lengths.
    hlo, hhi, hq = uniform_mix(policy.sample_action_costs[lad], b)
    out["heuristic"] = (_two_point(int(lad[hlo]), int(lad[hhi]), length_rule(train_lengths, lengths, hq), n, A),
                        False)
    out["random"] = (np.broadcast_to(np.bincount(o, minlength=A) / n, (n, A)), False)
    return out, o, served, rule


def _score(policy: Policy, prompts: Sequence[str], U: np.ndarray, C: np.ndarray, budgets: np.ndarray,
           train_lengths: np.ndarray, default: str, probe: np.ndarray | None = None,
           C_alt: np.ndarray | None = None, paid_alt: float = 0.0, W: np.ndarray | None = None,
           extra: dict[str, np.ndarray] | None = None) -> dict[str, Any]:
    """Scores of every method on one held-out part: dict of arrays (M, B, n) / (B, n), and the rule
    served per budget. ``W``: each plan's expected waves per prompt (default 1: one-wave plans); ``extra``:
    more per-plan channels averaged the same way (:mod:`isocompute.evaluation.channels`), one key each.

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
    waves = np.full_like(util, np.nan)
    W = np.ones_like(U) if W is None else W
    extra = extra or {}
    ch = {k: np.full_like(util, np.nan) for k in extra}
    o_act = np.empty((budgets.size, n), dtype=np.intp)
    l_act = np.empty((budgets.size, n), dtype=np.intp)
    per_learner = np.full((len(LEARNERS), budgets.size, n), -1, dtype=np.intp)
    gap = np.empty((budgets.size, n))
    rules = []
    M = {m: j for j, m in enumerate(METHODS)}
    lo, hi = policy.budget_range
    for bi, b in enumerate(budgets):
        b = policy.check_budget(min(max(float(b), lo), hi))  # a fold may reach a little less than the table
        probs, o, served, rule = _method_probs(policy, X, u, route, U, C, b, train_lengths, lengths, default)
        for m, (P, pays) in probs.items():
            util[M[m], bi] = (P * U).sum(axis=1)
            cost[M[m], bi] = (P * C).sum(axis=1) + (policy.paid_per_request if pays else 0.0)
            waves[M[m], bi] = (P * W).sum(axis=1)
            for k, Y in extra.items():
                ch[k][M[m], bi] = (P * Y).sum(axis=1)
            if C_alt is not None:
                cost_alt[M[m], bi] = (P * C_alt).sum(axis=1) + (paid_alt if pays else 0.0)
        for name in policy.learners_:
            per_learner[LEARNERS.index(name), bi] = probs[f"learned_{name}"][0].argmax(axis=1)
        o_act[bi], l_act[bi], gap[bi] = o, served, U[rows, o] - U.min(axis=1)
        rules.append(rule)
    return {"utility": util, "cost": cost, "cost_alt": cost_alt, "waves": waves, "oracle_actions": o_act,
            "learned_actions": l_act, "learner_actions": per_learner, "gap": gap, "rules": rules, **ch}


def cross_validate(prompts: Sequence[str], U: np.ndarray, C: np.ndarray, config: PolicyConfig,
                   budgets: Sequence[float], *, folds: int = 5, seeds: Sequence[int] = (0, 1, 2),
                   probe: np.ndarray | None = None, sample_flops: np.ndarray | None = None,
                   C_alt: np.ndarray | None = None, paid_alt: float = 0.0, alt_unit: str = "flops",
                   label_var: np.ndarray | None = None, groups: Sequence[str] | None = None,
                   samples: np.ndarray | None = None, waves: np.ndarray | None = None,
                   tokens: np.ndarray | None = None, latency: np.ndarray | None = None,
                   baselines: FixedBaselines | None = None, progress: bool = False, workers: int = 1,
                   gold: np.ndarray | None = None, consensus: np.ndarray | None = None) -> Evaluation:
    """k-fold CV over prompts for each seed, refitting ``config`` (both learners) on each training part;
    ``probe``: the probe's value per prompt when ``config`` has a probe (split with the prompts);
    ``sample_flops``: one sample's FLOPs per prompt, to price extra features in samples (split likewise);
    ``C_alt``: the cost table in ``alt_unit`` too (FLOPs), ``paid_alt`` the per-request payment in it;
    ``label_var``: each utility's sampling variance, needed when the config shrinks the learners' labels
    (``shrinkage="eb"``: each training part is shrunk toward its own ``groups``' means, so nothing of the
    held-out part leaks into the labels); ``samples`` / ``waves``: each plan's expected samples and waves
    per prompt (adaptive plans; :func:`~isocompute.policy.plans.arrays.plan_arrays`), ``tokens`` / ``latency``
    its expected tokens and latency (:mod:`isocompute.evaluation.channels`; None: absent); ``baselines``: the
    rule families' plan arrays, whose best fixed plans are chosen on each training part and scored on
    its held-out part (:mod:`isocompute.evaluation.baselines`); ``gold`` / ``consensus``: each plan's utility
under the other target, reported beside the accuracy (:mod:`isocompute.evaluation.channels`). ``workers``: processes the folds run in
    (:mod:`isocompute.evaluation.folds`; 0: one per core) — the same results, sooner."""
    from tqdm.auto import tqdm

    prompts = list(prompts)
    n = len(prompts)
    pv, sf = _cv_inputs(config, n, probe, sample_flops, folds)
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
    wav = np.full_like(util, np.nan)
    extra = plan_channels(tokens, latency, gold, consensus)
    ext = {k: np.full_like(util, np.nan) for k in extra}
    bar = tqdm(total=S * folds, desc="report: fitting folds", unit="fold", disable=not progress)
    jobs = []
    for si, seed in enumerate(seeds):
        perm = np.random.default_rng(seed).permutation(N)
        parts = np.array_split(perm, folds)
        for f, test in enumerate(parts):
            jobs.append((si, seed, f, np.sort(np.concatenate(parts[:f] + parts[f + 1:])), np.sort(test)))
    ctx = {"prompts": prompts, "U": U, "C": C, "config": config, "refit": refit, "pv": pv, "sf": sf,
           "label_var": label_var, "groups": groups, "samples": samples, "waves": waves, "C_alt": C_alt,
           "paid_alt": paid_alt, "baselines": baselines, "budgets": budgets_arr, "extra": extra,
           "reach": reach_setup(config, Policy(config).plans, U, C, extra), "unit": int(Policy(config).ladder[0]) if config.cost_unit == "tokens" else None}
    results = run_jobs(_fold, ctx, jobs, workers=workers, done=lambda: bar.update(1))
    defaults: list[list[str]] = [[] for _ in seeds]
    selections: list[list[dict[str, Any]]] = [[] for _ in seeds]
    rules: list[list[list[str]]] = [[] for _ in seeds]
    for (si, _, f, _, test), (sc, default, selection) in zip(jobs, results, strict=True):
        util[si][:, :, test], cost[si][:, :, test] = sc["utility"], sc["cost"]
        cost_alt[si][:, :, test], wav[si][:, :, test] = sc["cost_alt"], sc["waves"]
        for k, x in ext.items():
            x[si][:, :, test] = sc[k]
        rules[si].append(sc["rules"])
        o_act[si][:, test], l_act[si][:, test], gap[si][:, test] = (
            sc["oracle_actions"], sc["learned_actions"], sc["gap"])
        per_learner[si][:, :, test] = sc["learner_actions"]
        fold_of[si, test] = f
        defaults[si].append(default)
        selections[si].append(selection)
    bar.close()
    reach = pooled_reach(ctx["reach"], [(si, test) for si, _, _, _, test in jobs], [r[0] for r in results], S, N)
    menu = Policy(config)
    return Evaluation("cv", budgets_arr, menu.actions, tuple(seeds), folds, util, cost, o_act, l_act,
                      per_learner, gap, fold_of, defaults, selections, rules,
                      None if C_alt is None else cost_alt, None if C_alt is None else alt_unit,
                      _reference(U, C, C_alt, config.actions, menu.ladder), wav, tuple(p.name for p in menu.plans),
                      **ext, reach=reach)


def _fold(c: dict[str, Any], job: tuple[int, int, int, np.ndarray, np.ndarray]) -> tuple[dict[str, Any], str, Any]:
    """One CV fold (:func:`cross_validate`; run by :func:`~isocompute.evaluation.folds.run_jobs`): refit on
    ``train``, score on ``test`` → (scores, the default learner, the fit's learner selection)."""
    _, seed, f, train, test = job
    config, prompts, U, C, pv, sf, waves, samples = (c["config"], c["prompts"], c["U"], c["C"], c["pv"], c["sf"],
                                                     c["waves"], c["samples"])
    labels = _fold_labels(config, U, c["label_var"], c["groups"], train)
    lat = None if config.latency_range is None else c["extra"]["latency"][train]
    # a tokens budget is served as the same multiple of the refit's own 1x, as the gateway serves "4x" (issue 32)
    x = 1.0 if c["unit"] is None else float(C[train, c["unit"]].mean() / C[:, c["unit"]].mean())
    refit = dataclasses.replace(c["refit"], budget_range=tuple(x * b for b in c["refit"].budget_range))
    refit = dataclasses.replace(refit, seed=config.seed + 1000 * seed + f, budget_range=_reachable(refit, C[train]),
                                latency_range=reachable_latency(config.latency_range, lat))
    pol = Policy(refit).fit_arrays(
        [prompts[i] for i in train], U[train], C[train], probe=None if pv is None else pv[train],
        sample_flops=None if sf is None else sf[train], labels=labels, latency=lat,
        samples=None if samples is None else samples[train], waves=None if waves is None else waves[train])
    default = config.learner if config.learner in LEARNERS else pol.default_learner_
    sc = _score(pol, [prompts[i] for i in test], U[test], C[test], x * c["budgets"], pol.train_lengths_, default,
                None if pv is None else pv[test], None if c["C_alt"] is None else c["C_alt"][test], c["paid_alt"],
                None if waves is None else waves[test], rows_of(c["extra"], test))
    if c["baselines"] is not None:
        score_baselines(c["baselines"], train, test, c["budgets"], sc, METHODS)
    if c["reach"] is not None:
        refs, sweep, arrays = c["reach"]["references"], c["reach"]["budgets"], c["reach"]["arrays"]
        sc["reach"] = reach_scores(pol, [prompts[i] for i in test], rows_of(arrays, test), refs, x * sweep,
                                   None if pv is None else pv[test], fold_latencies(refs, arrays["latency"][train]))
    return sc, default, pol.selection_

def _reachable(config: PolicyConfig, C: np.ndarray) -> tuple[float, float]:
    """The part of ``budget_range`` a training part's plans can spend. With costs that vary per prompt
    (tokens, FLOPs) a fold's cheapest and dearest plans spend a little more or less than the whole table's,
    so a range fitted on the table (e.g. ``1x:16x``) can overhang a fold by a percent or two; the refit then
    serves the overhang at its nearest reachable budget, and the report shows the cost it realises there.
    In samples every fold spends exactly the table's range: unchanged. What the policy pays per request
    (probe, extra features) is part of every plan's cost, as in the fit."""
    paid = (config.probe.cost if config.probe is not None else 0.0) + (config.feature_cost or 0.0)
    lo, hi = feasible_range(C + paid)
    b_lo, b_hi = config.budget_range
    new_lo, new_hi = max(b_lo, lo), min(b_hi, hi)
    return (new_lo, new_hi) if new_lo < new_hi else (b_lo, b_hi)


def _cv_inputs(config: PolicyConfig, n: int, probe: np.ndarray | None, sample_flops: np.ndarray | None,
               folds: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Check :func:`cross_validate`'s per-prompt inputs and folds; the probe values and sample FLOPs as arrays."""
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
    return pv, sf


def _fold_labels(config: PolicyConfig, U: np.ndarray, label_var: np.ndarray | None, groups: Sequence[str] | None,
                 train: np.ndarray) -> np.ndarray | None:
    """The training part's labels when the config shrinks them (``shrinkage="eb"``), else None (the utilities)."""
    if config.shrinkage != "eb":
        return None
    if label_var is None:
        raise InputError("a configuration with shrinkage='eb' needs label_var= (the utilities' sampling "
                         "variance, policy.shrinkage.sampling_variance) for cross-validation.")
    return shrink_utilities(U[train], label_var[train], None if groups is None else [groups[i] for i in train])


def _reference(U: np.ndarray, C: np.ndarray, C_alt: np.ndarray | None, actions: Sequence[int],
               ladder: np.ndarray) -> dict[str, Any]:
    """The uniform rule at the largest action (``none@k`` for the largest k of the ladder): what "same
    accuracy for less" is measured against."""
    j = int(ladder[-1])
    return {"k": int(actions[-1]), "accuracy": float(U[:, j].mean()), "cost": float(C[:, j].mean()),
            "cost_alt": None if C_alt is None else float(np.asarray(C_alt)[:, j].mean())}


def holdout(policy: Policy, prompts: Sequence[str], U: np.ndarray, C: np.ndarray,
            budgets: Sequence[float], *, probe: np.ndarray | None = None, C_alt: np.ndarray | None = None,
            paid_alt: float = 0.0, alt_unit: str = "flops", waves: np.ndarray | None = None,
            tokens: np.ndarray | None = None, latency: np.ndarray | None = None, gold: np.ndarray | None = None,
            consensus: np.ndarray | None = None, **_: Any) -> Evaluation:
    """Score a fitted policy on prompts it never saw (one part, no refitting); ``probe`` as for decide,
    ``C_alt`` / ``paid_alt`` / ``waves`` / ``tokens`` / ``latency`` as for :func:`cross_validate` (the rule families' baselines
    need training prompts to be chosen on, so a holdout has none)."""
    prompts = list(prompts)
    if len(prompts) < 2:
        raise InputError(f"a holdout table needs at least 2 prompts; it has {len(prompts)}.")
    budgets_arr = np.asarray(budgets, dtype=np.float64)
    sc = _score(policy, prompts, U, C, budgets_arr, policy.train_lengths_, policy.default_learner_, probe,
                C_alt, paid_alt, waves, extra := plan_channels(tokens, latency, gold, consensus))
    n = len(prompts)
    return Evaluation("holdout", budgets_arr, policy.actions, (policy.config.seed,), 1,
                      sc["utility"][None], sc["cost"][None], sc["oracle_actions"][None],
                      sc["learned_actions"][None], sc["learner_actions"][None], sc["gap"][None],
                      np.zeros((1, n), dtype=np.intp),
                      [[policy.default_learner_]], [[policy.selection_]], [[sc["rules"]]],
                      None if C_alt is None else sc["cost_alt"][None], None if C_alt is None else alt_unit,
                      _reference(U, C, C_alt, policy.config.actions, policy.ladder), sc["waves"][None],
                      tuple(p.name for p in policy.plans), **{k: sc[k][None] for k in extra})
