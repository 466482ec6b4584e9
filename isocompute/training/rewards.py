"""Group reward transforms whose expectation is the gradient of a test-time metric (compute-aligned RL).

Served with majority vote or best-of-k, a model is judged by a metric of k of its samples, not of one;
plain GRPO optimises the single-sample reward. Given n ≥ k + 1 i.i.d. rollouts y_1..y_n of one prompt, we
want per-rollout advantages A_j with

    E[ (1/n) Σ_j A_j ∇log π(y_j) ] = ∇ M_k(θ),   M_k = E_{y_1..y_k ~ π}[ f(y_1..y_k) ]

for a symmetric score f of a k-subset:

* ``pass@k`` — f = 1 if some sample is correct;
* ``maj@k``  — f = correctness of the subset's plurality answer (null answers never vote; t answers tied
  at the top share the credit 1/t), as in :func:`isocompute.solver.estimators.majority_at_k`;
* ``bon@k``  — f = correctness of the subset's highest-scored sample (verifier score, ties broken
  uniformly at random), as in :func:`isocompute.solver.estimators.best_of_k`;
* ``mean``   — f = correctness of one sample (k = 1): plain GRPO.

The transform (leave-one-out U-statistics). Let U be the exact U-statistic of M_k over the n rollouts
(mean of f over all C(n, k) subsets) and U₋ⱼ the same statistic over the n − 1 rollouts without y_j. Then

    A_j = n · (U − U₋ⱼ).

Why: U is unbiased for M_k, so ∇M_k = ∇E[U] = E[U Σ_j ∇log π(y_j)] (score function over all n draws), and
U₋ⱼ does not depend on y_j, so E[U₋ⱼ ∇log π(y_j)] = 0: subtracting it is a baseline. Expanding U by
whether a subset contains j shows the same weights are the issue's form "(k/n)·mean over k-subsets S ∋ j
of f(S), minus the leave-one-out baseline (k/n)·U₋ⱼ":

    (k/n)·mean_{S∋j} f(S) = U − ((n−k)/n)·U₋ⱼ     (the no-baseline weight, :func:`rollout_weights`)

For pass@k that weight is k/n for a correct rollout and (k/n)·[1 − C(n−c−1,k−1)/C(n−1,k−1)] for an
incorrect one (c = correct count). Properties the tests check: the group's A_j sum to zero (the mean of
the U₋ⱼ is U), so GRPO's group-mean subtraction leaves them unchanged; all-correct and all-wrong groups
give A = 0; at k = 1 every objective gives A_j = r_j − mean_{i≠j} r_i = n/(n−1)·(r_j − r̄), GRPO's
centred reward without std scaling (Dr. GRPO) times n/(n−1).

Worked example (pass@2, n = 4, correct = [1, 0, 0, 0]): U = 1 − C(3,2)/C(4,2) = 1/2; dropping the correct
rollout leaves U₋₀ = 0, dropping a wrong one leaves 1 − C(2,2)/C(3,2) = 2/3. A = 4·(1/2 − [0, 2/3, 2/3,
2/3]) = [2, −2/3, −2/3, −2/3] (sums to 0). The pass@1 (GRPO) advantages of the same group are
[1, −1/3, −1/3, −1/3]: pass@2 pushes the rare correct answer twice as hard.

Ignores: per-token credit assignment and length normalisation (the trainer's loss decides those),
rewards other than correctness (use ``bon`` with a score for graded rewards).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from isocompute.errors import InputError
from isocompute.solver.estimators import best_of_k, majority_at_k, pass_at_k
from isocompute.solver.outcomes import NULL_CODE

KINDS: tuple[str, ...] = ("mean", "pass", "maj", "bon")
_SPELLING = re.compile(r"^(pass|maj|bon)@([0-9]+)$")


@dataclass(frozen=True)
class Objective:
    """A test-time metric to train for: ``kind`` in :data:`KINDS` and the number of samples ``k``.

    >>> Objective.parse("maj@8")
    Objective(kind='maj', k=8)
    >>> Objective.parse("mean").name
    'mean'
    """

    kind: str
    k: int = 1

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InputError(f"unknown objective kind {self.kind!r}; use one of {', '.join(KINDS)}.")
        if self.k < 1 or (self.kind == "mean" and self.k != 1):
            raise InputError(f"objective {self.kind} needs k ≥ 1 (and k = 1 for 'mean'); you passed k={self.k}.")

    @classmethod
    def parse(cls, text: str) -> Objective:
        """``"mean"``, ``"pass@k"``, ``"maj@k"`` or ``"bon@k"``; raises :class:`InputError` otherwise."""
        text = text.strip().lower()
        if text == "mean":
            return cls("mean", 1)
        m = _SPELLING.match(text)
        if not m:
            raise InputError(f"cannot read objective {text!r}; write 'mean', 'pass@K', 'maj@K' or 'bon@K' "
                             "with a positive integer K, e.g. 'maj@8'.")
        return cls(m.group(1), int(m.group(2)))

    @property
    def name(self) -> str:
        return "mean" if self.kind == "mean" else f"{self.kind}@{self.k}"

    @property
    def needs_scores(self) -> bool:
        return self.kind == "bon"

    def min_generations(self) -> int:
        """The fewest rollouts per prompt the leave-one-out baseline allows: k + 1 (2 for ``mean``)."""
        return self.k + 1


# --------------------------------------------------------------------------------------------- helpers


def answer_codes(answers: Sequence[Sequence[str | None]]) -> np.ndarray:
    """(G, n) integer codes: equal answers within a group share a code ≥ 0, ``None`` → ``NULL_CODE``.

    >>> answer_codes([["3", None, "3", "4"]]).tolist()
    [[0, -1, 0, 1]]
    """
    rows = [list(r) for r in answers]
    if not rows:
        return np.zeros((0, 0), dtype=np.int64)
    n = len(rows[0])
    if any(len(r) != n for r in rows):
        raise InputError("every group needs the same number of answers; pad or drop ragged groups.")
    out = np.full((len(rows), n), NULL_CODE, dtype=np.int64)
    for g, row in enumerate(rows):
        seen: dict[str, int] = {}
        for j, a in enumerate(row):
            if a is not None:
                out[g, j] = seen.setdefault(a, len(seen))
    return out


def _loo_index(n: int) -> np.ndarray:
    """(n, n−1): row j lists 0..n−1 without j."""
    full = np.broadcast_to(np.arange(n), (n, n))
    return full[~np.eye(n, dtype=bool)].reshape(n, n - 1)


def _as_groups(correct: np.ndarray) -> np.ndarray:
    c = np.asarray(correct)
    if c.ndim != 2:
        raise InputError(f"rewards must be a (groups, n) array, one row per prompt; got shape {c.shape}.")
    if c.dtype.kind == "f" and not np.isin(c, (0.0, 1.0)).all():
        raise InputError("correctness rewards must be 0/1; pass graded booleans (use 'bon' for scores).")
    return c.astype(bool)


def _u_full(objective: Objective, correct: np.ndarray, codes: np.ndarray | None,
            scores: np.ndarray | None) -> np.ndarray:
    """(G,) exact U-statistic of the metric over each group's n rollouts."""
    G, n = correct.shape
    if objective.kind in ("mean", "pass"):
        return pass_at_k(np.full(G, n), correct.sum(axis=1), objective.k)
    if objective.kind == "maj":
        return majority_at_k(_need(codes, "maj@k", "codes"), correct, objective.k)
    return best_of_k(_need(scores, "bon@k", "scores", float), correct, objective.k)


def _u_loo(objective: Objective, correct: np.ndarray, codes: np.ndarray | None,
           scores: np.ndarray | None) -> np.ndarray:
    """(G, n): the U-statistic over the n − 1 rollouts left when rollout j is dropped."""
    G, n = correct.shape
    if objective.kind in ("mean", "pass"):  # closed form on counts: cheap for any group size
        c = correct.sum(axis=1)
        return pass_at_k(np.full((G, n), n - 1), c[:, None] - correct, objective.k)
    idx = _loo_index(n)
    loo_correct = correct[:, idx].reshape(G * n, n - 1)
    if objective.kind == "maj":
        loo_codes = _need(codes, "maj@k", "codes")[:, idx].reshape(G * n, n - 1)
        return majority_at_k(loo_codes, loo_correct, objective.k).reshape(G, n)
    loo_scores = _need(scores, "bon@k", "scores", float)[:, idx].reshape(G * n, n - 1)
    return best_of_k(loo_scores, loo_correct, objective.k).reshape(G, n)


def _need(x: np.ndarray | None, name: str, arg: str, dtype: type = np.int64) -> np.ndarray:
    if x is None:
        what = "the extracted answers' codes (answer_codes)" if arg == "codes" else "a verifier score"
        raise InputError(f"{name} needs {what} for every rollout; pass {arg}=.")
    return np.asarray(x, dtype=dtype)


def _check_shapes(correct: np.ndarray, other: np.ndarray | None, what: str) -> None:
    if other is not None and np.shape(other) != correct.shape:
        raise InputError(f"{what} has shape {np.shape(other)} but the rewards have {correct.shape}; "
                         "pass one entry per rollout, groups as rows.")


# --------------------------------------------------------------------------------------------- transforms


def group_advantages(
    objective: Objective | str,
    correct: np.ndarray,
    *,
    codes: np.ndarray | None = None,
    scores: np.ndarray | None = None,
) -> np.ndarray:
    """(G, n) advantages A_j = n·(U − U₋ⱼ) of the module docstring, one row per prompt.

    ``correct``: 0/1 per rollout; ``codes``: answer codes (:func:`answer_codes`) for ``maj``; ``scores``:
    verifier scores for ``bon``. Needs n ≥ k + 1 rollouts per prompt (the baseline uses k of n − 1).

    >>> group_advantages("pass@2", np.array([[1, 0, 0, 0]])).round(4).tolist()
    [[2.0, -0.6667, -0.6667, -0.6667]]
    """
    obj = Objective.parse(objective) if isinstance(objective, str) else objective
    c = _as_groups(correct)
    _check_shapes(c, codes, "codes")
    _check_shapes(c, scores, "scores")
    n = c.shape[1]
    if n < obj.min_generations():
        raise InputError(f"{obj.name} with a leave-one-out baseline needs at least {obj.min_generations()} "
                         f"rollouts per prompt; you have {n}. Raise num_generations to ≥ {obj.min_generations()} "
                         f"or lower k.")
    if c.shape[0] == 0:
        return np.zeros(c.shape)
    return n * (_u_full(obj, c, codes, scores)[:, None] - _u_loo(obj, c, codes, scores))


def rollout_weights(
    objective: Objective | str,
    correct: np.ndarray,
    *,
    codes: np.ndarray | None = None,
    scores: np.ndarray | None = None,
) -> np.ndarray:
    """(G, n) no-baseline weights w_j = (k/n)·mean_{S∋j} f(S) = U − ((n−k)/n)·U₋ⱼ, for k ≤ n.

    Unbiased too (E[Σ_j w_j ∇log π(y_j)] = ∇M_k) but with a larger variance and non-zero weights on
    all-correct groups; kept for the tests and for comparison with the published closed forms.

    >>> rollout_weights("pass@2", np.array([[1, 0, 0, 0]])).round(4).tolist()
    [[0.5, 0.1667, 0.1667, 0.1667]]
    """
    obj = Objective.parse(objective) if isinstance(objective, str) else objective
    c = _as_groups(correct)
    _check_shapes(c, codes, "codes")
    _check_shapes(c, scores, "scores")
    n = c.shape[1]
    if n < obj.k:
        raise InputError(f"{obj.name} needs at least k={obj.k} rollouts per prompt; you have {n}.")
    u = _u_full(obj, c, codes, scores)[:, None]
    if n == obj.k:  # every subset is the whole group: w_j = U
        return np.repeat(u, n, axis=1)
    return u - (n - obj.k) / n * _u_loo(obj, c, codes, scores)


@dataclass(frozen=True)
class GroupMetrics:
    """Batch means over prompts of the raw metrics (what a served model would score), for logging."""

    correct: float
    pass_at_k: float
    maj_at_k: float
    k: int
    groups: int


def group_metrics(correct: np.ndarray, codes: np.ndarray, k: int) -> GroupMetrics:
    """Mean correctness, pass@k and maj@k (exact U-statistics) of (G, n) groups; k is capped at n."""
    c = _as_groups(correct)
    G, n = c.shape
    if G == 0:
        nan = float("nan")
        return GroupMetrics(nan, nan, nan, k, 0)
    kk = max(1, min(k, n))
    return GroupMetrics(
        correct=float(c.mean()),
        pass_at_k=float(np.mean(pass_at_k(np.full(G, n), c.sum(axis=1), kk))),
        maj_at_k=float(np.mean(majority_at_k(np.asarray(codes, dtype=np.int64), c, kk))),
        k=kk,
        groups=G,
    )
