"""Monte Carlo for votes across models: the part of a cascade's or an ensemble's utility no formula gives.

A vote over all the samples a cascade drew mixes models, so its utility is not a product of per-model
expectations. For each prompt, ``n_orders`` uniformly random orders of *each* model's samples are
drawn (independently across models, without replacement within one, as the gateway would see them);
every action is played on the same orders — common random numbers, so two actions' estimates differ
by their real difference more than by noise. The utility splits at the first stage,

    U = E[U₁·1{stage 1 fired}] + P(stage 1 ran out) · E[credit(final vote) | stage 1 ran out],

and :mod:`isocompute.solver.models.estimates` has the first two terms exactly (the plan estimators'
split by stop reason). This module estimates the conditional credit V by the mean over the orders
where stage 1 ran out (a ratio estimator: U stays within [0, 1], and a prompt whose samples all agree
gets V without noise), with standard error s/√(those orders); when no order ran out although the exact
probability says it can, over all orders with the escalation forced. The final vote at the stage s*
where the cascade stopped (the first whose rule fired, else the last):

    score_g = Σ_{s ≤ s*} w_s · x_{s,g}   (vote "all";  x_{s,g}: votes of class g among stage s's drawn samples)
    score_g = x_{s*,g}                    (vote "last")
    credit  = mean over the classes with the top score (> 0) of their value; 0 without votes.

Orders are seeded per (seed, model, chunk of prompts), prompts chunked in the order of their number of
answer classes — fixed by the tables — so the same model gets the same orders in every action.

Example: A = a, a, b; B = b, b, a, b (a correct), ``A/lead:m=2@2 > B/none@1 [w=1,4]``: A fires (a a)
with probability 1/3; otherwise A's a b plus B's one sample weighted 4 decide: B's a (1/4) → a wins,
B's b → b wins, so V = 1/4 and U = 1/3 + 2/3 · 1/4 = 1/2; 200 orders give V within ≈ 0.04.

Ignores: dependence between a sample's content and its position; verifier scores.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from isocompute.solver.plans.montecarlo import StopPoints, prefix_states, stop_points
from isocompute.solver.plans.plan import Plan


@dataclass(frozen=True)
class VoteGroup:
    """Actions with the same chain of models: ``plans[a][s]`` stage s's plan of action a, ``weights``
    (A, L) for vote ``"all"`` (ignored for ``"last"``), and each stage's model index ``models[s]``."""

    models: tuple[int, ...]
    plans: tuple[tuple[Plan, ...], ...]
    weights: np.ndarray
    vote: str


def simulate_votes(codes: Sequence[np.ndarray], values: np.ndarray, groups: Sequence[VoteGroup], *,
                   n_orders: int, seed: int, chunk: int = 64) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per group, ``(V, se)`` (module docstring), each (N, A_group). ``codes[m]`` (N, n_m) model m's
    aligned answer codes (≥ 0 classes, −1 null, −2 padding); ``values`` (N, G) the classes' values."""
    N, G_all = values.shape
    n_classes = np.zeros(N, np.int64)
    for c in codes:
        n_classes = np.maximum(n_classes, c.max(axis=1) + 1)
    order = np.argsort(n_classes, kind="stable")  # chunks of similar class counts keep G small
    out = [(np.zeros((N, len(g.plans))), np.zeros((N, len(g.plans)))) for g in groups]
    used = sorted({m for g in groups for m in g.models})
    k_need = {m: max(p[s].max_samples for g in groups for p in g.plans for s, mm in enumerate(g.models) if mm == m)
              for m in used}
    for c_idx, lo in enumerate(range(0, N, chunk)):
        rows = order[lo:lo + chunk]
        G = max(int(n_classes[rows].max()), 1)
        vals = values[rows, :G]
        draws = {m: _draw(codes[m][rows], k_need[m], n_orders, np.random.default_rng([seed, m, c_idx]), G)
                 for m in used}
        for g, (mean, se) in zip(groups, out, strict=True):
            stops: dict[tuple[int, Plan], StopPoints] = {}
            for a, plans in enumerate(g.plans):
                at = []
                for s, m in enumerate(g.models):
                    key = (m, plans[s])
                    if key not in stops:
                        stops[key] = stop_points(plans[s], draws[m].prefix)
                    at.append(stops[key])
                credit, escalated = _values(g, a, at, draws, vals, n_orders)
                mean[rows, a], se[rows, a] = _conditional(credit, escalated)
    return out


@dataclass(frozen=True, eq=False)
class _Draw:
    prefix: object  # plan_montecarlo.Prefix over (rows·R) orders
    cum: np.ndarray  # (rows·R, k+1, G) labelled vote counts after each prefix


def _draw(codes: np.ndarray, k: int, R: int, rng: np.random.Generator, G: int) -> _Draw:
    rows, n = codes.shape
    keys = rng.random((rows, R, n))
    keys[np.broadcast_to((codes == -2)[:, None, :], keys.shape)] = np.inf
    perm = np.argsort(keys, axis=2)[:, :, :k]
    seq = codes[np.arange(rows)[:, None, None], perm].reshape(rows * R, k)
    onehot = (seq[:, :, None] == np.arange(G)[None, None, :]).astype(np.int16)
    cum = np.zeros((rows * R, k + 1, G), np.int16)
    np.cumsum(onehot, axis=1, out=cum[:, 1:])
    dummy = np.zeros((rows * R, G))  # prefix credit is not used here
    return _Draw(prefix=prefix_states(seq, dummy, k), cum=cum)


def _conditional(credit: np.ndarray, escalated: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: mean credit over the escalated orders and its standard error (all orders if none)."""
    n = escalated.sum(axis=1)
    w = np.where(n[:, None] > 0, escalated, True).astype(np.float64)
    m = np.maximum(w.sum(axis=1), 1.0)
    mean = (w * credit).sum(axis=1) / m
    var = (w * (credit - mean[:, None]) ** 2).sum(axis=1) / np.maximum(m - 1.0, 1.0)
    se = np.where(m > 1, np.sqrt(var / m), 0.5)  # one escalated order: no spread to measure, take the widest
    return mean, se


def _values(g: VoteGroup, a: int, at: list[StopPoints], draws: Mapping[int, _Draw], vals: np.ndarray,
            R: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows, R) credit of the final vote with stage 1 forced to escalate, and whether it did."""
    L = len(g.models)
    rr = np.arange(at[0].samples.shape[0])
    escalated = ~at[0].fired
    alive = np.ones_like(escalated)  # still going before stage s (stage 1 forced on)
    score = np.zeros((rr.size, vals.shape[1]))
    if g.vote == "all":
        score += g.weights[a, 0] * draws[g.models[0]].cum[rr, at[0].samples]
    for s in range(1, L):
        counts = draws[g.models[s]].cum[rr, at[s].samples]
        if g.vote == "all":
            score += np.where(alive[:, None], g.weights[a, s] * counts, 0.0)
        else:
            score = np.where(alive[:, None], counts, score)
        if s < L - 1:
            alive &= ~at[s].fired
    top = score.max(axis=1, keepdims=True)
    tied = (score >= top - 1e-9 * np.maximum(top, 1.0)) & (top > 0)
    vals_rep = np.repeat(vals, R, axis=0)
    credit = np.where(tied.any(axis=1), (tied * vals_rep).sum(axis=1) / np.maximum(tied.sum(axis=1), 1), 0.0)
    return credit.reshape(-1, R), escalated.reshape(-1, R)
