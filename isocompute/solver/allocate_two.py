"""The Lagrangian oracle under two budgets: a mean-cost budget and a mean-latency budget.

Problem, for N prompts and A actions (costs ascending along a, as for :func:`~isocompute.solver.allocate.allocate`;
latencies L ≥ 0 in any order and units), solved exactly in its LP relaxation (x[i, a] ≥ 0, Σ_a x[i, a] = 1)::

    maximise (1/N) Σ_i U[i, a_i]  s.t.  (1/N) Σ_i C[i, a_i] ≤ B,  (1/N) Σ_i L[i, a_i] ≤ Λ,  a_i ∈ {0, …, A−1}.

Its optimum is the minimum over λ, μ ≥ 0 of the dual (convex, piecewise linear), and pricing both budgets
gives the per-prompt closed form (ties to the lowest index: the cheapest action)::

    g(λ, μ) = (1/N) Σ_i max_a (U − λC − μL)[i, a] + λB + μΛ,      a_i(λ, μ) = argmax_a U − λC − μL.

Each allocation k, with mean cost, latency and utility (c_k, l_k, u_k), is a cut under the dual (max_a ≥ any
one action): g(λ, μ) ≥ u_k − λ(c_k − B) − μ(l_k − Λ), with equality where k is the closed form. The search
minimises g exactly with these cuts (Kelley's method on g, i.e. Dantzig–Wolfe on the LP):

1. The cost budget alone, ``allocate(U, C, B)``. If its expected latency is ≤ Λ it is optimal for both (a
   relaxation's optimum that is feasible) and is returned unchanged: μ* = 0, the same actions and mixing.
2. Else the *master* LP mixes the allocations found so far (w ≥ 0, Σ w = 1): maximise Σ w_k u_k s.t.
   Σ w_k c_k ≤ B, Σ w_k l_k ≤ Λ. Its duals (λ, μ, π) minimise the cuts' model of g; three rows, so a dense
   simplex (Bland's rule, warm-started) solves it exactly. If the closed form at (λ, μ) has a Lagrangian mean
   φ(λ, μ) > π, its cut lies above the model there: a new column. When φ ≤ π (within ``tol``), g(λ, μ) =
   π + λB + μΛ = the master's value, so the master's mixture (which meets both budgets) reaches the dual bound:
   the LP optimum, certified by the gap. Allocations are finitely many, so the loop ends (20–40 cuts here).
3. Phase one, only while no mixture found meets Λ: the same loop minimises the mean latency within the cost
   budget; if that minimum exceeds Λ the two budgets are infeasible together (BudgetError names the least Λ).

The master's basic solution mixes at most 3 allocations, each with zero reduced cost, i.e. a closed form at
(λ*, μ*): they differ only on prompts tied there, in general position at most two (the LP's basic optimum,
N + 2 rows). Ties shared by many prompts (identical rows, values on a grid) are then made basic as well:
triples of such prompts move mass along a null direction of their (Δcost, Δlatency), keeping both means and
never lowering the utility, until at most two are fractional. Each prompt independently plays allocation k
with probability w_k, so both budgets are met in expectation (exactly where their price is > 0).

Worked example (2 prompts; actions one sample (C 1, L 1), two sequential samples (C 2, L 2), four in
parallel (C 4, L 1); B = 2, Λ = 1.5)::

    U = [[0.6, 0.8, 0.8],      the cost budget alone (λ = 0.05) buys two sequential samples for both:
         [0.2, 0.5, 0.6]]      mean utility 0.65, but mean latency 2 > 1.5.

    λ* = μ* = 0.1:  U − λC − μL = [[0.4, 0.4, 0.3],    prompt 0 is indifferent between one sample and two
                                   [0.0, 0.1, 0.1]]    sequential; prompt 1 between sequential and parallel.
    Prompt 0 plays sequential w.p. q, prompt 1 parallel w.p. r (sequential otherwise): mean cost
    ((1 + q) + (2 + 2r)) / 2 = 2 and mean latency ((1 + q) + (2 − r)) / 2 = 1.5 give q = r = 1/3. Mean utility
    ((0.6 + 0.2/3) + (0.5 + 0.1/3)) / 2 = 0.6 = g(λ*, μ*) = (0.4 + 0.1)/2 + 0.1·2 + 0.1·1.5: the LP optimum.
    ``action_probs()`` = [[2/3, 1/3, 0], [0, 2/3, 1/3]]; both prompts mix (two, as in a basic solution).

Speed (``bench/bench_solver.py`` part 3): N = 10,000 × A = 60 plans, both budgets binding: 0.11–0.14 s on the
2-core dev machine (one ``allocate``, ~35 closed forms of O(NA); 0.1–0.2 s on uniform random U, C, L); HiGHS on
the same LP: 10–11 s by interior point (70–95× slower), 5 min by dual simplex; the same optimum to 1e-15.

Ignores: per-prompt caps, deterministic rounding (the result is randomised) and uncertainty in U, C and L.
With a slack latency budget the result is allocate's, whose tied prompts share one mixing probability.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

from isocompute.errors import BudgetError, InputError
from isocompute.solver.allocate import STATUS_OK, Allocation, allocate, check_budget
from isocompute.solver.hull import check_inputs

STATUS_MAX_ITER = 2  # the cut limit was hit: the best mixture found, with its duality gap in the message


@dataclass(frozen=True, eq=False)
class Allocation2:
    """Result of :func:`allocate_two`: a mixture of deterministic allocations (scipy ``OptimizeResult`` style).

    Attributes
    ----------
    plays, weights : (K, N) int, (K,) float
        K ≤ 5 allocations; prompt i plays ``plays[k, i]`` with probability ``weights[k]`` (they sum to 1),
        independently of the other prompts. When the latency budget is slack (or None) they are
        :func:`allocate`'s ``[actions, actions_hi]`` with weights ``[1 − mix_prob, mix_prob]``.
    mixed : (M,) int
        Prompts whose plays differ (the fractional ones).
    lam, mu : float
        λ*, μ*: prices of cost and of latency (μ = 0 when the latency budget is slack or None).
    mean_utility, mean_cost, mean_latency : float
        Expected means of the allocation (``mean_latency`` is NaN when no latencies were given).
    dual_value : float
        g(λ*, μ*), an upper bound on any allocation's mean utility under both budgets.
    budget, latency_budget : float, float | None
    allocation : Allocation | None
        :func:`allocate`'s result when it is the answer (latency slack or not asked for), else None.
    n_actions, n_iter, status, message
        ``n_iter``: closed forms evaluated; ``status``: ``STATUS_OK`` (0), ``STATUS_NOT_BINDING`` (1: neither
        budget binds) or ``STATUS_MAX_ITER`` (2).
    """

    plays: np.ndarray
    weights: np.ndarray
    mixed: np.ndarray
    lam: float
    mu: float
    mean_utility: float
    mean_cost: float
    mean_latency: float
    dual_value: float
    budget: float
    latency_budget: float | None
    allocation: Allocation | None
    n_actions: int
    n_iter: int
    status: int
    message: str

    @property
    def n_prompts(self) -> int:
        return int(self.plays.shape[1])

    @property
    def actions(self) -> np.ndarray:
        """(N,) the first play: a closed form at (λ*, μ*), or :func:`allocate`'s cheap side."""
        return self.plays[0]

    def action_probs(self) -> np.ndarray:
        """(N, A) probability of each action per prompt; rows sum to 1."""
        probs = np.zeros((self.n_prompts, self.n_actions))
        rows = np.arange(self.n_prompts)
        for play, w in zip(self.plays, self.weights, strict=True):
            probs[rows, play] += w
        return probs

    def sample(self, seed: int | np.random.Generator | None = None) -> np.ndarray:
        """One draw: each mixed prompt independently plays ``plays[k]`` w.p. ``weights[k]`` (the budgets hold
        in expectation, not in every draw)."""
        rng = np.random.default_rng(seed)
        out = self.plays[0].copy()
        k = rng.choice(self.weights.size, size=self.mixed.size, p=self.weights / self.weights.sum())
        out[self.mixed] = self.plays[k, self.mixed]
        return out


def lagrangian_actions_two(utilities: object, costs: object, latencies: object, lam: float,
                           mu: float) -> np.ndarray:
    """Per-prompt ``argmax_a U − lam·C − mu·L`` for prices lam, mu ≥ 0; exact ties go to the lowest index
    (the cheapest action, costs ascending). This is the closed form every cut of :func:`allocate_two` uses."""
    U, C, L = _check_latencies(utilities, costs, latencies)
    if not (float(lam) >= 0 and float(mu) >= 0):
        raise InputError(f"the prices must be ≥ 0 (got lam = {lam}, mu = {mu}); a negative one rewards spending.")
    return _closed_form(U, -C, L, float(lam), float(mu), np.empty_like(U))[0]


def allocate_two(utilities: object, costs: object, latencies: object, budget: float,
                 latency_budget: float | None = None, *, tol: float = 1e-12, max_iter: int = 500) -> Allocation2:
    """Solve the two-budget allocation exactly (module docstring: the maths, the method and an example).

    ``utilities``, ``costs`` (ascending along a), ``latencies`` (≥ 0; may be None without a latency budget):
    (N, A) array-likes, not modified. ``budget``: target mean cost, within [mean C[:, 0], mean C[:, -1]];
    ``latency_budget``: target mean latency, or None for none (the result is then :func:`allocate`'s). ``tol``:
    relative tolerance for budgets on a breakpoint and for the duality gap that ends the search; past
    ``max_iter`` closed forms the best mixture is returned with a warning. Raises BudgetError when a budget is
    outside its feasible range or the two are infeasible together; the message names the range and the fix.
    """
    if latency_budget is None:
        res = allocate(utilities, costs, budget)
        L = None if latencies is None else _check_latencies(utilities, costs, latencies)[2]
        return _from_allocation(res, L, None)
    U, C, L = _check_latencies(utilities, costs, latencies)
    budget = check_budget(budget, C)
    lat = _check_latency_budget(latency_budget, L)
    first = allocate(U, C, budget)
    scale_l = max(lat, float(np.abs(L).mean()), 1e-300)
    if _mix_mean(L, first.actions, first.actions_hi, first.mix_prob) <= lat + tol * scale_l:
        return _from_allocation(first, L, lat)
    return _column_generation(U, C, L, budget, lat, first, tol, max_iter)


def _check_latencies(utilities: object, costs: object, latencies: object) -> tuple[np.ndarray, ...]:
    U, C = check_inputs(utilities, costs)
    L = np.asarray(latencies, dtype=np.float64)
    if L.shape != U.shape:
        raise InputError(f"latencies must have the utilities' shape {U.shape} (prompts × actions); got {L.shape}. "
                         "Build U, C and L from the same action list.")
    if not (np.isfinite(L).all() and (L >= 0).all()):
        raise InputError("latencies must be finite and ≥ 0 (found NaN, inf or a negative value); drop or repair "
                         "those prompts.")
    return U, C, L


def _check_latency_budget(latency_budget: object, L: np.ndarray) -> float:
    try:
        lat = float(latency_budget)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        lat = math.nan
    if not (math.isfinite(lat) and lat >= 0):
        lo = float(L.min(axis=1).mean())
        raise BudgetError(f"latency_budget must be a finite number ≥ 0, not {latency_budget!r}; the least mean "
                          f"latency is {lo:.6g} (the fastest action everywhere), so pick one ≥ that.")
    return lat


def _mix_mean(T: np.ndarray, lo: np.ndarray, hi: np.ndarray, p: float) -> float:
    return (1.0 - p) * float(T[np.arange(len(T)), lo].mean()) + p * float(T[np.arange(len(T)), hi].mean())


def _from_allocation(res: Allocation, L: np.ndarray | None, lat: float | None) -> Allocation2:
    """:func:`allocate`'s result as it stands, in the two-budget shape."""
    p = res.mix_prob
    latency = math.nan if L is None else _mix_mean(L, res.actions, res.actions_hi, p)
    return Allocation2(plays=np.stack([res.actions, res.actions_hi]), weights=np.array([1.0 - p, p]),
                       mixed=res.mixed, lam=res.lam, mu=0.0, mean_utility=res.mean_utility,
                       mean_cost=res.mean_cost, mean_latency=latency, dual_value=res.lp_utility,
                       budget=res.budget, latency_budget=lat, allocation=res, n_actions=res.n_actions,
                       n_iter=0, status=res.status,
                       message=res.message + ("" if lat is None else f" The latency budget {lat:.6g} is not "
                                              f"binding (mean latency {latency:.6g})."))


def _closed_form(U: np.ndarray, negC: np.ndarray, L: np.ndarray, lam: float, mu: float,
                 buf: np.ndarray) -> tuple[np.ndarray, float]:
    """(argmax_a U − lam·C − mu·L per prompt, mean of those maxima); ``buf`` is (N, A) scratch. Pass
    U = −L, mu = 0 for phase one's objective (−latency)."""
    np.multiply(negC, lam, out=buf)
    buf += U
    if mu:
        buf -= mu * L
    a = np.argmax(buf, axis=1)
    return a, float(buf[np.arange(buf.shape[0]), a].mean())


def _simplex(obj: np.ndarray, rows: np.ndarray, rhs: np.ndarray, n_ub: int, basis: list[int],
             tol: float) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Maximise obj·w s.t. rows[:n_ub] w ≤ rhs[:n_ub], rows[n_ub:] w = rhs[n_ub:], w ≥ 0, from a feasible
    ``basis`` over the columns [slacks | w]; returns (basic values, duals, basis). Bland's rule (lowest index
    enters, and leaves among tied ratios) cannot cycle; every step is a 3 × 3 solve."""
    m = rows.shape[0]
    M = np.hstack([np.eye(m)[:, :n_ub], rows])
    o = np.r_[np.zeros(n_ub), obj]
    for _ in range(100 + 10 * M.shape[1]):
        Bm = M[:, basis]
        xB = np.linalg.solve(Bm, rhs)
        y = np.linalg.solve(Bm.T, o[basis])
        red = o - y @ M
        red[basis] = 0.0
        enter = np.flatnonzero(red > tol)
        if enter.size == 0:
            return xB, y, basis
        d = np.linalg.solve(Bm, M[:, enter[0]])
        pos = d > 1e-12
        ratio = np.where(pos, np.maximum(xB, 0.0) / np.where(pos, d, 1.0), np.inf)
        tied = np.flatnonzero(ratio <= ratio.min() * (1 + 1e-12) + 1e-300)
        leave = int(tied[np.argmin(np.asarray(basis)[tied])])
        basis = [*basis[:leave], int(enter[0]), *basis[leave + 1:]]
    return xB, y, basis  # unreachable in exact arithmetic (Bland); a float cycle stops at a feasible basis


class _Cuts:
    """The allocations found so far (the master's columns) with their mean cost, latency and utility."""

    def __init__(self, U: np.ndarray, C: np.ndarray, L: np.ndarray, *plays: np.ndarray) -> None:
        self.tables, self.plays, self.means, self.seen = (C, L, U), [], [], set()
        for a in plays:
            self.add(a)

    def add(self, a: np.ndarray) -> bool:
        """Append allocation ``a``; False when it is a column already (its cut adds nothing)."""
        if (key := a.tobytes()) in self.seen:
            return False
        self.seen.add(key)
        self.plays.append(a)
        self.means.append([float(T[np.arange(a.shape[0]), a].mean()) for T in self.tables])
        return True

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        c, lt, u = np.array(self.means).T
        return c, lt, u


def _phase_one(U: np.ndarray, C: np.ndarray, L: np.ndarray, budget: float, lat: float, cuts: _Cuts, tol: float,
               max_iter: int, buf: np.ndarray) -> tuple[list[int], int]:
    """Minimise the master's mean latency within the cost budget until a mixture meets ``lat``; returns its
    basis over [cost slack | columns] and the closed forms used. Raises BudgetError if none can."""
    cs, ls = max(budget, float(np.abs(C).mean()), 1e-300), max(lat, float(np.abs(L).mean()), 1e-300)
    basis, n_iter = [0, 1], 0  # the cost slack and allocate's cheap side (which fits the cost budget)
    negC, negL = -C, -L
    while True:
        c, lt, _ = cuts.arrays()
        xB, y, basis = _simplex(-lt / ls, np.vstack([c / cs, np.ones_like(c)]), np.array([budget / cs, 1.0]),
                                1, basis, tol * 0.1)
        w = _weights(xB, basis, 1, c.size)
        least = float(w @ lt)
        if least <= lat + tol * ls:
            return basis, n_iter
        lam = float(y[0]) * ls / cs  # price of cost in latency units
        a, phi = _closed_form(negL, negC, L, lam, 0.0, buf)
        n_iter += 1
        if phi / ls - float(y[1]) <= tol or not cuts.add(a):
            break
        if n_iter >= max_iter:
            raise BudgetError(f"no mixture within both budgets after max_iter = {max_iter} closed forms (least "
                              f"mean latency so far {least:.6g} > {lat:.6g}); raise max_iter.")
    rows, fast = np.arange(U.shape[0]), np.argmax(-L, axis=1)  # the fastest action, ties to the cheapest
    raise BudgetError(
        f"latency budget {lat:.6g} is infeasible with the cost budget {budget:.6g}: the least mean latency "
        f"within that cost budget is {least:.6g}, so the feasible latency budgets there are ≥ {least:.6g}. "
        f"Raise latency_budget to at least {least:.6g}, or raise budget (the fastest action everywhere has mean "
        f"latency {L[rows, fast].mean():.6g} at mean cost {C[rows, fast].mean():.6g}).")


def _weights(xB: np.ndarray, basis: list[int], n_ub: int, n_cols: int) -> np.ndarray:
    w = np.zeros(n_ub + n_cols)
    w[basis] = np.maximum(xB, 0.0)  # basic values; the slacks come first
    return w[n_ub:]


def _column_generation(U: np.ndarray, C: np.ndarray, L: np.ndarray, budget: float, lat: float,
                       first: Allocation, tol: float, max_iter: int) -> Allocation2:
    """Steps 2 and 3 of the module docstring: cuts until the duality gap closes."""
    cuts = _Cuts(U, C, L, first.actions, first.actions_hi)
    buf = np.empty_like(U)
    basis1, n_iter = _phase_one(U, C, L, budget, lat, cuts, tol, max_iter, buf)
    basis = [0 if b == 0 else b + 1 for b in basis1] + [1]  # add the latency slack (index 1)
    cs, ls = max(budget, float(np.abs(C).mean()), 1e-300), max(lat, float(np.abs(L).mean()), 1e-300)
    scale_u = float(np.abs(U).max()) or 1.0
    negC = -C
    while True:
        c, lt, u = cuts.arrays()
        xB, y, basis = _simplex(u, np.vstack([c / cs, lt / ls, np.ones_like(c)]),
                                np.array([budget / cs, lat / ls, 1.0]), 2, basis, tol * 0.1 * scale_u)
        lam, mu, pi = max(float(y[0]) / cs, 0.0), max(float(y[1]) / ls, 0.0), float(y[2])
        a, phi = _closed_form(U, negC, L, lam, mu, buf)
        n_iter += 1
        gap = phi - pi
        scale = scale_u + lam * float(np.abs(C).max()) + mu * float(np.abs(L).max())
        if gap <= tol * scale or not cuts.add(a):
            status = STATUS_OK
            break
        if n_iter >= max_iter:
            status = STATUS_MAX_ITER
            warnings.warn(f"allocate_two stopped after max_iter = {max_iter} closed forms with a duality gap of "
                          f"{gap:.3g} in mean utility; raise max_iter for the exact optimum.", RuntimeWarning, 3)
            break
    w = _weights(xB, basis, 2, c.size)
    keep = np.flatnonzero(w > 0)
    keep = keep[np.argsort(-w[keep], kind="stable")]  # the heaviest play first
    plays, weights = _purify(np.stack([cuts.plays[k] for k in keep]), w[keep] / w[keep].sum(), U, C, L)
    return _result(plays, weights, U, C, L, lam, mu, phi, budget, lat, n_iter, status)


def _purify(plays: np.ndarray, weights: np.ndarray, U: np.ndarray, C: np.ndarray,
            L: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Plays that differ on many (tied) prompts → at most two fractional prompts (module docstring)."""
    d = np.flatnonzero((plays != plays[0]).any(axis=0))
    if d.size <= 2:
        return plays, weights
    acts, prob = plays[:, d].T.copy(), np.tile(weights, (d.size, 1))  # each mixed prompt's distribution
    for k in range(1, len(plays)):
        for j in range(k):  # merge repeated actions into their first slot
            same = acts[:, k] == acts[:, j]
            prob[same, j] += prob[same, k]
            prob[same, k] = 0.0
    while (frac := np.flatnonzero((prob > 0).sum(axis=1) > 1)).size > 2:
        f = frac[: frac.size // 3 * 3]  # disjoint triples; each moves mass between two actions of a prompt
        j1, j2 = np.argsort(np.where(prob[f] > 0, prob[f], np.inf), axis=1)[:, :2].T
        m = prob[f, j1] + prob[f, j2]
        dv = np.stack([m * (T[d[f], acts[f, j1]] - T[d[f], acts[f, j2]]) for T in (C, L, U)])
        dv[:2] /= np.maximum(np.abs(dv[:2]).max(axis=1, keepdims=True), 1e-300)
        dv = dv.reshape(3, -1, 3)
        n = np.linalg.svd(dv[:2].transpose(1, 0, 2))[2][:, 2]  # (T, 3) unit null vectors: both means kept
        n *= np.where((dv[2] * n).sum(axis=1) < 0, -1.0, 1.0)[:, None]  # in the sign that lowers no utility
        p = (prob[f, j1] / m).reshape(-1, 3)
        with np.errstate(divide="ignore", invalid="ignore"):
            room = np.where(n > 0, (1 - p) / n, np.where(n < 0, -p / n, np.inf))
        step = room.min(axis=1, keepdims=True)
        q = np.clip(p + step * n, 0.0, 1.0)
        hit = room == step  # one per triple lands exactly on its bound: that prompt drops an action
        q[hit] = (n[hit] > 0).astype(np.float64)
        prob[f, j1], prob[f, j2] = q.ravel() * m, (1 - q.ravel()) * m
    cum = np.cumsum(prob[frac], axis=1)
    edges = np.unique(np.clip(np.r_[0.0, cum[:, :-1].ravel(), 1.0], 0.0, 1.0))
    out = np.repeat(plays[:1], edges.size - 1, axis=0)
    out[:, d] = acts[np.arange(d.size), np.argmax(prob, axis=1)]
    for k, lo in enumerate(edges[:-1]):  # comonotone: on [lo, next edge) prompt i plays the slot holding lo
        slot = np.minimum((cum <= lo).sum(axis=1), len(plays) - 1)
        out[k, d[frac]] = acts[frac, slot]
    return out, np.diff(edges)


def _result(plays: np.ndarray, weights: np.ndarray, U: np.ndarray, C: np.ndarray, L: np.ndarray, lam: float,
            mu: float, phi: float, budget: float, lat: float, n_iter: int, status: int) -> Allocation2:
    rows = np.arange(U.shape[0])
    mean_c, mean_l, mean_u = (float(sum(w * T[rows, a].mean() for a, w in zip(plays, weights, strict=True)))
                              for T in (C, L, U))
    mixed = np.flatnonzero((plays != plays[0]).any(axis=0))
    dual = phi + lam * budget + mu * lat
    message = (f"expected mean cost {mean_c:.6g} (budget {budget:.6g}), mean latency {mean_l:.6g} (budget "
               f"{lat:.6g}); {mixed.size} prompt(s) mix over {len(plays)} allocation(s) at λ* = {lam:.6g}, "
               f"μ* = {mu:.6g}; duality gap {dual - mean_u:.2g} after {n_iter} closed forms.")
    return Allocation2(plays=plays, weights=weights, mixed=mixed, lam=lam, mu=mu, mean_utility=mean_u,
                       mean_cost=mean_c, mean_latency=mean_l, dual_value=dual, budget=budget,
                       latency_budget=lat, allocation=None, n_actions=U.shape[1], n_iter=n_iter, status=status,
                       message=message)
