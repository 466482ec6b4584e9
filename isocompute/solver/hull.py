"""Per-prompt upper concave hulls of (cost, utility): the shared core of the oracle and the frontier.

Each prompt i offers actions a = 0..A-1 with cost C[i, a] (sorted ascending along a) and utility
U[i, a]. For a price λ ≥ 0 the Lagrangian oracle picks ``argmax_a U[i, a] − λ·C[i, a]``; as λ falls
from +∞ to 0 the choice walks, left to right, along the vertices of the *upper concave hull* of the
points (C[i, a], U[i, a]), starting at the cheapest action (the best one among equally cheap ones)
and ending at the cheapest action of maximal utility. Actions off that hull are never chosen by any
λ ≥ 0 and never used by the LP relaxation, so the hull's edges are all the solver needs:

    edge t of prompt i:  Δc = C[i, v_{t+1}] − C[i, v_t] > 0,  Δu = U[i, v_{t+1}] − U[i, v_t] > 0,
                         slope = Δu / Δc, strictly decreasing in t.

The oracle at price λ takes exactly the edges with slope > λ (ties go to the cheaper action).

Vertex test, with A small (≈5): after dropping dominated actions (one no better than a cheaper or
equally cheap one), the remaining points have strictly increasing cost and utility, and point j is a
hull vertex iff it lies strictly above every chord (i, k) with i < j < k, i.e.
``min_{i<j} slope(i, j) > max_{k>j} slope(j, k)``. That is O(A²) vectorised column operations over
all prompts at once, no per-row loop; the edge slopes are the very pair slopes compared, so they come
out strictly decreasing in floating point too.

Worked example (one prompt, costs 1, 2, 4, 8; utilities 0.3, 0.5, 0.6, 0.6)::

    slopes: (1→2) 0.2, (2→4) 0.05, (4→8) 0    → action 3 is dominated by action 2 (same utility,
    vertices: actions 0, 1, 2                     higher cost); hull edges have slopes 0.2 > 0.05.

Ignores: negative prices (λ < 0 would reward spending) and actions with equal cost and utility
(the lower index wins).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from isocompute.errors import InputError

# Prompts per block: small enough that a block's temporaries stay in cache and are recycled by the
# allocator instead of being page-faulted in afresh for every (A, N) array.
BLOCK = 1 << 15


@dataclass(frozen=True)
class Hulls:
    """Upper hulls of N prompts, stored action-major: edge slot j−1 holds the hull edge that *ends* at
    action j (j = 1..A−1), or padding when action j is not a hull vertex (or is the first one).

    Along j the real edges of a prompt have strictly decreasing slopes, so "take every edge with slope
    > λ" lands on the largest j whose edge slope exceeds λ, and no per-row gather or sort is needed.

    Attributes
    ----------
    start : (N,) int
        First vertex per prompt: its cheapest action (the best of equally cheap ones).
    d_cost, d_utility : (A−1, N) float
        Edge increments ending at action j = slot + 1; 0 on padding.
    slope : (A−1, N) float
        Δu/Δc of those edges; −inf on padding.
    utilities, costs : (N, A) float
        The validated inputs (not copied when they were float64 already).
    """

    start: np.ndarray
    d_cost: np.ndarray
    d_utility: np.ndarray
    slope: np.ndarray
    utilities: np.ndarray
    costs: np.ndarray

    @property
    def n_prompts(self) -> int:
        return int(self.start.shape[0])

    def actions_at(self, lam: float, *, inclusive: bool = False) -> np.ndarray:
        """Action per prompt after taking every hull edge with slope > lam (≥ lam when ``inclusive``)."""
        op = np.greater_equal if inclusive else np.greater
        act = self.start.copy()
        for slot in range(self.slope.shape[0]):
            act[op(self.slope[slot], lam)] = slot + 1
        return act

    def gather(self, table: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """``table[i, a_i]`` for a prompt-major (N, A) table such as :attr:`costs`."""
        n, a = table.shape
        return table.ravel()[np.arange(n) * a + actions]

    def edges(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Flat (slope, d_cost, d_utility) of every real edge, in slot-major order."""
        real = self.slope > -np.inf
        return self.slope[real], self.d_cost[real], self.d_utility[real]


def check_inputs(utilities: object, costs: object) -> tuple[np.ndarray, np.ndarray]:
    """Return U, C as float64 arrays (without copying when already float64), or raise InputError.

    Requires matching 2-D shapes with at least one prompt and one action and finite values; costs
    ascending along the action axis are checked by :func:`upper_hulls`, block by block.
    """
    U = np.asarray(utilities, dtype=np.float64)
    C = np.asarray(costs, dtype=np.float64)
    if U.ndim != 2 or U.shape != C.shape:
        raise InputError(f"utilities and costs must be 2-D arrays of the same shape (prompts × actions); got "
                         f"{U.shape} and {C.shape}. Build both from the same action list.")
    if U.shape[0] == 0 or U.shape[1] == 0:
        raise InputError(f"need at least one prompt and one action; got shape {U.shape}.")
    if not (np.isfinite(U).all() and np.isfinite(C).all()):
        raise InputError("utilities and costs must be finite (found NaN or inf); drop or repair those prompts.")
    return U, C


def upper_hulls(utilities: object, costs: object) -> Hulls:
    """Validate U, C (see :func:`check_inputs`; costs must ascend along actions) and build every
    prompt's hull, block by block."""
    U, C = check_inputs(utilities, costs)
    N, A = U.shape
    start = np.empty(N, dtype=np.intp)
    d_cost = np.empty((A - 1, N))
    d_utility = np.empty((A - 1, N))
    slope = np.empty((A - 1, N))
    for lo in range(0, N, BLOCK):
        hi = min(lo + BLOCK, N)
        Ct = np.ascontiguousarray(C[lo:hi].T)
        bad = (Ct[1:] < Ct[:-1]).any(axis=0)
        if bad.any():
            row = lo + int(np.argmax(bad))
            raise InputError(f"costs must be sorted ascending along the action axis (prompt {row} has costs "
                             f"{C[row].tolist()}); order the actions by cost, e.g. k = 1, 2, 4, 8.")
        _block_hulls(np.ascontiguousarray(U[lo:hi].T), Ct,
                     start[lo:hi], d_cost[:, lo:hi], d_utility[:, lo:hi], slope[:, lo:hi])
    return Hulls(start=start, d_cost=d_cost, d_utility=d_utility, slope=slope, utilities=U, costs=C)


def _block_hulls(Ut: np.ndarray, Ct: np.ndarray, start: np.ndarray, d_cost: np.ndarray,
                 d_utility: np.ndarray, slope: np.ndarray) -> None:
    """Hulls of one block given action-major (A, n) U and C; fills the four output views."""
    A, n = Ut.shape
    # Candidates: strictly better than every cheaper-or-equal action to the left, and not beaten by an
    # equally cheap action to the right. Survivors have strictly increasing cost and utility.
    cand = np.empty((A, n), dtype=bool)
    best = np.full(n, -np.inf)
    for j in range(A):
        np.greater(Ut[j], best, out=cand[j])
        np.maximum(best, Ut[j], out=best)
    right_same = np.full(n, -np.inf)
    for j in range(A - 2, -1, -1):
        right_same = np.where(Ct[j + 1] == Ct[j], np.maximum(Ut[j + 1], right_same), -np.inf)
        cand[j] &= ~(right_same > Ut[j])

    # Point j is a vertex iff min over candidates i<j of slope(i, j) > max over candidates k>j of
    # slope(j, k); the first and last candidates always are. Non-candidates get utility −inf, so their
    # pair slopes are ±inf or NaN and never bind the fmin/fmax of a candidate.
    Um = np.where(cand, Ut, -np.inf)
    left_min = np.full((A, n), np.inf)
    right_max = np.full((A, n), -np.inf)
    s = np.empty(n)
    with np.errstate(divide="ignore", invalid="ignore"):
        for i in range(A):
            for k in range(i + 1, A):
                np.divide(Um[k] - Um[i], Ct[k] - Ct[i], out=s)
                np.fmin(left_min[k], s, out=left_min[k])
                np.fmax(right_max[i], s, out=right_max[i])
    on_hull = cand & (left_min > right_max)

    # Walk the vertices left to right, carrying the previous vertex's cost and utility (no gathers).
    start.fill(-1)
    start[on_hull[0]] = 0
    prev_c, prev_u = Ct[0].copy(), Ut[0].copy()
    d_cost.fill(0.0)
    d_utility.fill(0.0)
    slope.fill(-np.inf)
    with np.errstate(divide="ignore", invalid="ignore"):
        for j in range(1, A):
            first = on_hull[j] & (start < 0)
            start[first] = j
            edge = on_hull[j] & ~first & (start >= 0)
            dc = Ct[j] - prev_c
            du = Ut[j] - prev_u
            # Same operands and formula as the pair slopes above, hence bit-identical values.
            np.copyto(d_cost[j - 1], dc, where=edge)
            np.copyto(d_utility[j - 1], du, where=edge)
            np.copyto(slope[j - 1], du / dc, where=edge)
            np.copyto(prev_c, Ct[j], where=on_hull[j])
            np.copyto(prev_u, Ut[j], where=on_hull[j])
