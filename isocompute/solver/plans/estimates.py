"""Plan estimators: per prompt and plan, the expected utility and cost over random sample orders.

For a prompt with n graded samples (answer classes, nulls) and a plan (waves + stopping rule), play the
plan on a uniformly random order of the n samples — without replacement, as the gateway sees them —
and take expectations of

* utility: majority vote over answer classes at the point the plan stops; t classes tied at the top
  each get credit 1/t, a class scores the mean correctness of its samples, nulls never vote (a vote of
  nulls only scores 0) — exactly :func:`~isocompute.solver.estimators.majority_at_k`'s convention;
* samples drawn, waves (requests), and channel totals: the sum over the drawn samples of per-sample
  values such as completion tokens or decode FLOPs;
* with completion tokens (the ``completion_tokens`` channel, which doubles as the samples' lengths):
  tokens generated and latency in tokens of decode time (:mod:`~isocompute.solver.plans.latency`).

Plans with parallel-stop waves (:mod:`~isocompute.solver.plans.plan`) finish in length order inside such a
wave, ties broken uniformly at random, and stop at the finish where the rule fires; ``samples`` then
counts the samples started, ``channels`` the finished samples' values, tokens generated add the aborted
samples' partial tokens. Their finish order depends on lengths, so they are Monte Carlo
(:mod:`~isocompute.solver.plans.waves`) unless their rule never fires (then they are waiting plans).

Exact method (:mod:`~isocompute.solver.plans.exact`): the lattice of vote types, which says how many label
sequences of each type stop where, contracted with the prompt's class sums — for waiting plans (and
parallel-stop plans whose rule never fires) of up to ``exact_max_samples`` samples.

Monte Carlo (:mod:`~isocompute.solver.plans.montecarlo`) serves larger plans, with standard errors; the
exact method's standard errors are 0. ``method="auto"`` uses exact for plans of ≤ ``exact_max_samples``.

Worked example: answers [a, a, b], a correct, plan ``lead:m=2@1x3``. The first two samples agree in
2 of the 6 orders (a a …): stop at 2 with a; otherwise the third sample decides 2–1 for a: U = 1,
E[samples] = (2·2 + 4·3)/6 = 8/3, E[waves] = 8/3. With ``none@2`` instead U = maj@2 = (1 + ½ + ½)/3 = 2/3
(of the three pairs, only {a, a} avoids a tie).

Stop reasons (``split=True``): the same contraction over only the stops where the rule fired
(:func:`~isocompute.solver.plans.vote_lattice.stop_counts` with ``part="fired"``) gives P(fired) and the fired
part of every expectation, E[X·1{fired}] (:class:`FiredPart`); the rest, E[X] − E[X·1{fired}], is where
the plan ran out. A cascade needs exactly this: it escalates to the next model only when the plan ran out.
In the example, ``lead:m=2@1x3`` fires in the 2 orders a a … only: P(fired) = 1/3, E[U·1{fired}] = 1/3,
E[samples·1{fired}] = 2/3.

Cost (:meth:`PlanEstimates.cost`): samples, completion tokens, or FLOPs — each wave is one request with
n = wave size; the prompt is prefilled once per plan with prefix caching, once per wave without. The
solver prices plans unchanged as columns of U and C; :func:`by_cost` sorts each prompt's columns by its
own expected cost, as :func:`~isocompute.solver.allocate.allocate` requires, and maps choices back.
Ignored: verifier scores (plans vote), and any dependence between a sample's content and its position.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from isocompute.errors import InputError
from isocompute.flops import ModelFlops, decode_flops, prefill_flops
from isocompute.solver.outcomes import PAD_CODE, OutcomeTable
from isocompute.solver.plans.exact import classes, exact_estimates
from isocompute.solver.plans.latency import Columns, TokensLatency, price_estimates
from isocompute.solver.plans.montecarlo import simulate_plans
from isocompute.solver.plans.plan import Plan, parse_plan

Method = Literal["auto", "exact", "monte-carlo"]
CostUnit = Literal["samples", "tokens", "flops"]
TOKENS, DECODE = "completion_tokens", "decode_flops"


@dataclass(frozen=True, eq=False)
class FiredPart:
    """The part of each expectation where the plan's rule fired (module docstring), each (N, P):
    ``prob`` = P(fired); ``utility``, ``samples``, ``waves`` and ``channels[name]`` are E[X·1{fired}];
    ``*_se`` their standard errors (0 for exact plans); ``generated_tokens`` and ``latency`` likewise when
    the estimates have them (:class:`PlanEstimates`)."""

    prob: np.ndarray
    utility: np.ndarray
    samples: np.ndarray
    waves: np.ndarray
    channels: dict[str, np.ndarray]
    prob_se: np.ndarray
    utility_se: np.ndarray
    samples_se: np.ndarray
    waves_se: np.ndarray
    channels_se: dict[str, np.ndarray]
    generated_tokens: np.ndarray | None = None
    generated_tokens_se: np.ndarray | None = None
    latency: np.ndarray | None = None
    latency_se: np.ndarray | None = None

    def subset(self, idx: np.ndarray) -> FiredPart:
        return FiredPart(**{k: ({c: v[idx] for c, v in x.items()} if isinstance(x, dict) else
                                None if x is None else x[idx]) for k, x in vars(self).items()})


@dataclass(frozen=True, eq=False)
class PlanEstimates:
    """Result of :func:`estimate_plans`: (N, P) arrays for N prompts and P plans.

    ``utility``, ``samples``, ``waves`` and each ``channels[name]`` hold expectations; the ``*_se``
    arrays their standard errors (0 for exact plans). ``method[j]`` says how plan j was estimated
    (``"exact"`` or ``"monte-carlo"``, then with ``n_orders`` orders per prompt from ``seed``).
    ``prompt_tokens`` (N,) is kept for FLOP costs (NaN when unknown). ``fired`` holds the split by stop
    reason when estimated with ``split=True`` (else None).

    With the ``completion_tokens`` channel (the samples' lengths) come ``generated_tokens`` (tokens
    actually generated, aborted samples' partial tokens included) and ``latency`` (in tokens of decode
    time, no per-wave overhead: :meth:`total_latency`), with standard errors; ``latency_method[j]`` says
    whether plan j's latency is exact (:mod:`~isocompute.solver.plans.latency`). Without it they are None.
    For plans that stop mid-wave, ``samples`` counts the samples started and ``channels`` sum over the
    samples that finished (aborted samples' partial values are only in ``generated_tokens``).
    """

    plans: tuple[Plan, ...]
    utility: np.ndarray
    samples: np.ndarray
    waves: np.ndarray
    channels: dict[str, np.ndarray]
    utility_se: np.ndarray
    samples_se: np.ndarray
    waves_se: np.ndarray
    channels_se: dict[str, np.ndarray]
    method: tuple[str, ...]
    n_orders: int
    seed: int
    prompt_tokens: np.ndarray | None = None
    fired: FiredPart | None = None
    generated_tokens: np.ndarray | None = None
    generated_tokens_se: np.ndarray | None = None
    latency: np.ndarray | None = None
    latency_se: np.ndarray | None = None
    latency_method: tuple[str, ...] = ()

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.plans]

    def total_latency(self, overhead: float = 0.0) -> np.ndarray:
        """(N, P) expected latency with ``overhead`` tokens' worth of time per wave: decode + overhead · waves."""
        if self.latency is None:
            raise InputError("these estimates have no latency; estimate them with completion_tokens "
                             "(a table with completion_tokens on every sample).")
        return self.latency + overhead * self.waves

    @property
    def tokens(self) -> np.ndarray:
        """(N, P) expected completion tokens generated (needs the ``completion_tokens`` channel); for
        waiting plans the same as the channel: every drawn sample's tokens."""
        if self.generated_tokens is not None:
            return self.generated_tokens
        if TOKENS not in self.channels:
            raise InputError("these estimates have no completion-token channel; estimate them with "
                             "completion_tokens (a table with completion_tokens on every sample).")
        return self.channels[TOKENS]

    def cost(self, unit: CostUnit, *, model: ModelFlops | None = None, prefix_caching: bool = True) -> np.ndarray:
        """C[i, j] in ``unit``: expected samples, completion tokens, or FLOPs. FLOPs = prefill(p_i) ·
        (1 with prefix caching, else E[waves]) + E[Σ decode FLOPs of the drawn samples]; they need the
        ``decode_flops`` channel (:func:`estimate_table` with ``model``) and prompt tokens. For plans that
        stop mid-wave the channel holds the finished samples' FLOPs only: aborted samples' partial decode
        is not priced in FLOPs yet (it is in ``tokens``)."""
        if unit == "samples":
            return self.samples
        if unit == "tokens":
            return self.tokens
        if unit != "flops":
            raise InputError(f"unknown cost unit {unit!r}; use 'samples', 'tokens' or 'flops'.")
        if model is None or DECODE not in self.channels or self.prompt_tokens is None:
            raise InputError("FLOP costs need the model's FLOP shape and token counts: estimate with "
                             "estimate_table(table, plans, model=load_model_flops(...)) and pass the same model.")
        prefill = np.asarray(prefill_flops(model, self.prompt_tokens))[:, None]
        return prefill * (1.0 if prefix_caching else self.waves) + self.channels[DECODE]


    def subset(self, indices: Sequence[int] | np.ndarray) -> PlanEstimates:
        """The rows ``indices`` (ints or a boolean mask), e.g. one cross-validation fold."""
        idx = np.asarray(indices)
        idx = np.flatnonzero(idx) if idx.dtype == bool else idx.astype(np.int64)
        rows = {k: getattr(self, k)[idx] for k in ("utility", "samples", "waves", "utility_se", "samples_se", "waves_se")}
        rows.update({k: None if getattr(self, k) is None else getattr(self, k)[idx]
                     for k in ("generated_tokens", "generated_tokens_se", "latency", "latency_se")})
        return PlanEstimates(
            plans=self.plans, channels={k: v[idx] for k, v in self.channels.items()},
            channels_se={k: v[idx] for k, v in self.channels_se.items()}, method=self.method,
            n_orders=self.n_orders, seed=self.seed, latency_method=self.latency_method,
            prompt_tokens=None if self.prompt_tokens is None else self.prompt_tokens[idx],
            fired=None if self.fired is None else self.fired.subset(idx), **rows,
        )


@dataclass(frozen=True, eq=False)
class CostOrder:
    """Plan columns sorted by each prompt's expected cost, as :func:`isocompute.solver.allocate.allocate`
    wants them: ``utility``/``cost`` (N, P) sorted per row, ``order[i, a]`` the plan of column a."""

    utility: np.ndarray
    cost: np.ndarray
    order: np.ndarray

    def plans_of(self, actions: np.ndarray) -> np.ndarray:
        """(N,) plan index of each prompt's sorted column ``actions[i]`` (e.g. ``Allocation.actions``)."""
        return self.order[np.arange(self.order.shape[0]), actions]


def by_cost(utility: np.ndarray, cost: np.ndarray) -> CostOrder:
    """Sort each prompt's plan columns by cost (stable): which plan is cheaper differs per prompt."""
    order = np.argsort(cost, axis=1, kind="stable")
    return CostOrder(utility=np.take_along_axis(utility, order, 1), cost=np.take_along_axis(cost, order, 1),
                     order=order)


def estimate_plans(answer_codes: np.ndarray, correct: np.ndarray, plans: Sequence[Plan | str], *,
                   channels: Mapping[str, np.ndarray] | None = None, method: Method = "auto",
                   n_orders: int = 100, seed: int = 0, exact_max_samples: int = 24, chunk: int = 2048,
                   prompt_tokens: np.ndarray | None = None, split: bool = False) -> PlanEstimates:
    """Estimates for N prompts: ``answer_codes`` (N, n_max) as in an :class:`OutcomeTable` (classes ≥ 0,
    −1 null, −2 padding; a row's codes need not be dense), ``correct`` (N, n_max); ``channels`` name →
    (N, n_max) per-sample values (e.g. completion tokens; NaN makes that prompt's channel NaN). Plans may
    be given by name. ``split``: also the part where each plan's rule fired (:class:`FiredPart`). The
    ``completion_tokens`` channel doubles as the samples' lengths: with it come tokens generated and
    latency, and plans that stop mid-wave (which need it; a prompt with a NaN length gets NaN there)."""
    plan_list, codes, corr, chans = _checked(answer_codes, correct, plans, channels, method, exact_max_samples)
    kinds = [_kind(p, method, exact_max_samples) for p in plan_list]
    if "waves" in kinds and TOKENS not in chans:
        j = kinds.index("waves")
        raise InputError(f"plan {plan_list[j].name} stops mid-wave, and its samples finish in length order: it "
                         f"needs the {TOKENS!r} channel (a table with completion_tokens on every sample).")
    names = list(chans)
    per_sample = np.stack([np.where(codes != PAD_CODE, chans[k], 0.0) for k in names], axis=2) if names \
        else np.zeros(codes.shape + (0,))
    cls = classes(codes, corr, per_sample)
    N, P, C = codes.shape[0], len(plan_list), len(names)
    out = {k: np.zeros((N, P)) for k in ("u", "s", "w", "u_se", "s_se", "w_se")}
    ch, ch_se = np.zeros((N, P, C)), np.zeros((N, P, C))
    fo = {k: np.zeros((N, P)) for k in ("p", "u", "s", "w", "p_se", "u_se", "s_se", "w_se")}
    fch, fch_se = np.zeros((N, P, C)), np.zeros((N, P, C))
    ex = [j for j in range(P) if kinds[j] == "exact"]
    if ex:
        u, s, w, c, _ = exact_estimates(cls, [plan_list[j] for j in ex], chunk)
        out["u"][:, ex], out["s"][:, ex], out["w"][:, ex], ch[:, ex] = u, s, w, c
        if split:
            u, s, w, c, p = exact_estimates(cls, [plan_list[j] for j in ex], chunk, part="fired")
            fo["u"][:, ex], fo["s"][:, ex], fo["w"][:, ex], fch[:, ex], fo["p"][:, ex] = u, s, w, c, p
    mc = [j for j in range(P) if kinds[j] == "monte-carlo"]
    labels = np.where(codes >= 0, cls.rank_of_code(codes), codes)
    if mc:
        res = simulate_plans(labels, cls.values, per_sample, [plan_list[j] for j in mc], n_orders=n_orders,
                             seed=seed, split=split)
        out["u"][:, mc], out["s"][:, mc], out["w"][:, mc], ch[:, mc] = res.utility, res.samples, res.waves, res.channels
        out["u_se"][:, mc], out["s_se"][:, mc], out["w_se"][:, mc] = res.utility_se, res.samples_se, res.waves_se
        ch_se[:, mc] = res.channels_se
        if split and res.fired is not None and res.fired_prob is not None and res.fired_prob_se is not None:
            f = res.fired
            fo["u"][:, mc], fo["s"][:, mc], fo["w"][:, mc], fch[:, mc] = f.utility, f.samples, f.waves, f.channels
            fo["u_se"][:, mc], fo["s_se"][:, mc], fo["w_se"][:, mc] = f.utility_se, f.samples_se, f.waves_se
            fo["p"][:, mc], fo["p_se"][:, mc], fch_se[:, mc] = res.fired_prob, res.fired_prob_se, f.channels_se
    priced = None
    if TOKENS in chans:
        cols = Columns(out, ch, ch_se, fo if split else None, fch, fch_se, names.index(TOKENS))
        priced = price_estimates(plan_list, kinds, codes, labels, cls.values, chans[TOKENS], per_sample, cols,
                        n_orders=n_orders, seed=seed, split=split)
    return _result(plan_list, kinds, names, out, ch, ch_se, fo, fch, fch_se, priced, split, n_orders, seed,
                   prompt_tokens)


def _checked(answer_codes: np.ndarray, correct: np.ndarray, plans: Sequence[Plan | str],
             channels: Mapping[str, np.ndarray] | None, method: str,
             exact_max_samples: int) -> tuple[tuple[Plan, ...], np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    plan_list = tuple(p if isinstance(p, Plan) else parse_plan(p) for p in plans)
    if not plan_list:
        raise InputError("estimate_plans needs at least one plan (e.g. default_plans()).")
    if method not in ("auto", "exact", "monte-carlo"):
        raise InputError(f"method must be 'auto', 'exact' or 'monte-carlo', not {method!r}.")
    codes = np.atleast_2d(np.asarray(answer_codes, dtype=np.int64))
    corr = np.atleast_2d(np.asarray(correct, dtype=np.float64))  # bool verdicts or consensus credit
    if codes.shape != corr.shape:
        raise InputError(f"answer_codes {codes.shape} and correct {corr.shape} must have the same shape.")
    chans = {k: np.atleast_2d(np.asarray(v, dtype=np.float64)) for k, v in (channels or {}).items()}
    for k, v in chans.items():
        if v.shape != codes.shape:
            raise InputError(f"channel {k!r} has shape {v.shape}; it needs one value per sample, {codes.shape}.")
    n = (codes != PAD_CODE).sum(axis=1)
    worst = max(plan_list, key=lambda p: p.max_samples)
    if (n < worst.max_samples).any():
        i = int(np.argmin(n))
        raise InputError(f"plan {worst.name} draws up to {worst.max_samples} samples but prompt row {i} has only "
                         f"{int(n[i])}; use plans of at most {int(n.min())} samples or sample more per prompt.")
    if method == "exact" and worst.max_samples > exact_max_samples:
        raise InputError(f"plan {worst.name} draws up to {worst.max_samples} samples, beyond the exact "
                         f"method's {exact_max_samples}; use method='auto' or 'monte-carlo', or raise exact_max_samples.")
    if method == "exact" and (mid := next((p for p in plan_list if p.stops_in_wave), None)) is not None:
        raise InputError(f"plan {mid.name} stops mid-wave: its finish order follows the samples' lengths, which "
                         "only Monte Carlo estimates; use method='auto'.")
    return plan_list, codes, corr, chans


def _kind(plan: Plan, method: str, exact_max_samples: int) -> str:
    """How a plan's utility is estimated: ``"exact"`` (the lattice), ``"monte-carlo"`` (random orders,
    :mod:`.montecarlo`) or ``"waves"`` (it stops mid-wave: random orders and finish orders, :mod:`.waves`)."""
    if plan.stops_in_wave:
        return "waves"
    return "exact" if method != "monte-carlo" and plan.max_samples <= exact_max_samples else "monte-carlo"


def _result(plans: tuple[Plan, ...], kinds: Sequence[str], names: list[str], out: dict[str, np.ndarray],
            ch: np.ndarray, ch_se: np.ndarray, fo: dict[str, np.ndarray], fch: np.ndarray, fch_se: np.ndarray,
            priced: TokensLatency | None, split: bool, n_orders: int, seed: int,
            prompt_tokens: np.ndarray | None) -> PlanEstimates:
    fired = FiredPart(
        prob=fo["p"], utility=fo["u"], samples=fo["s"], waves=fo["w"],
        channels={k: fch[:, :, i] for i, k in enumerate(names)}, prob_se=fo["p_se"], utility_se=fo["u_se"],
        samples_se=fo["s_se"], waves_se=fo["w_se"], channels_se={k: fch_se[:, :, i] for i, k in enumerate(names)},
        generated_tokens=None if priced is None else priced.fired_tokens,
        generated_tokens_se=None if priced is None else priced.fired_tokens_se,
        latency=None if priced is None else priced.fired_latency,
        latency_se=None if priced is None else priced.fired_latency_se,
    ) if split else None
    return PlanEstimates(
        plans=plans, utility=out["u"], samples=out["s"], waves=out["w"],
        channels={k: ch[:, :, i] for i, k in enumerate(names)}, utility_se=out["u_se"], samples_se=out["s_se"],
        waves_se=out["w_se"], channels_se={k: ch_se[:, :, i] for i, k in enumerate(names)},
        method=tuple("exact" if k == "exact" else "monte-carlo" for k in kinds), n_orders=n_orders, seed=seed,
        prompt_tokens=None if prompt_tokens is None else np.asarray(prompt_tokens, dtype=np.float64), fired=fired,
        generated_tokens=None if priced is None else priced.tokens,
        generated_tokens_se=None if priced is None else priced.tokens_se,
        latency=None if priced is None else priced.latency, latency_se=None if priced is None else priced.latency_se,
        latency_method=() if priced is None else priced.method,
    )


def estimate_table(table: OutcomeTable, plans: Sequence[Plan | str], *, model: ModelFlops | None = None,
                   **kwargs: object) -> PlanEstimates:
    """:func:`estimate_plans` on an outcome table, with the completion-token channel when the table has
    token counts and the decode-FLOP channel when ``model`` is given too."""
    channels: dict[str, np.ndarray] = {}
    ct = np.where(table.mask, table.completion_tokens, 0.0)
    if not np.isnan(table.completion_tokens[table.mask]).all():
        channels[TOKENS] = ct
    if model is not None:
        if not table.has_token_counts:
            raise InputError(f"FLOP costs need prompt_tokens and completion_tokens on every row of {table.source}; "
                             "add them or use the 'samples' cost unit.")
        channels[DECODE] = np.where(table.mask, decode_flops(model, table.prompt_tokens[:, None], ct), 0.0)
    return estimate_plans(table.answer_codes, table.correct, plans, channels=channels,
                          prompt_tokens=table.prompt_tokens, **kwargs)  # type: ignore[arg-type]
