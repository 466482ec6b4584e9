"""The solve stage: per-prompt oracle actions under a mean compute budget, from an outcome table.

:func:`solve` reads the outcome table, builds utilities U[i, a] (:func:`isocompute.solver.estimators.utilities`,
the chosen strategy with k = actions[a] samples) and costs C[i, a] (:func:`isocompute.solver.costs.cost_table`,
in samples or analytic FLOPs), solves the budget exactly (:func:`isocompute.solver.allocate.allocate`) and
writes a ``solution`` artifact (schema version 1) with :func:`isocompute.artifacts.artifact_writer`:

``manifest.json``   inputs' sha256 (the outcome table, the model config) and every parameter
``solution.jsonl``  one line per prompt, in table order::

                        {"id": "gsm8k-17", "action": 1, "k": 2, "p": 1.0,
                         "utilities": [0.41, 0.55, …], "costs": [1.0, 2.0, …]}

                    ``action``/``k`` is the oracle action (the cheap side a(λ*)); a prompt that mixes
                    also has ``action_hi``/``k_hi``, played with probability ``p_hi`` (then ``p`` =
                    1 − ``p_hi``). ``utilities``/``costs`` are the prompt's rows of U and C.
``summary.json``    budget, lambda, mean_cost, mean_utility (expected), lp_utility, n_prompts, n_mixed,
                    mix_prob, status, message, the expected share of each k, the uniform-k baselines,
                    feasible_range, actions, strategy, cost_unit, rounding
``frontier.json``   with ``budgets``: the optimal mean utility and λ at each requested budget, every
``frontier.png``    breakpoint of the frontier, and the uniform-k points (plotted for comparison)

Actions are **plans** by default (``plans="default"``, :mod:`isocompute.policy.plans.menu`; ``"none"`` for
k samples at once, the default for strategies other than majority): U[i, p] and C[i, p] are each plan's
expected accuracy and cost over random orders of the prompt's samples (:mod:`isocompute.policy.plans.arrays`),
C differs per prompt for adaptive plans, and the solver takes each prompt's columns in its own cost order.
Then ``solution.jsonl`` names the plan (``plan``, ``plan_hi``; ``k`` is its maximum samples) and
``summary.json`` has ``plans``, ``plan_share`` and the allocation's ``expected_samples`` / ``expected_waves``.

A ragged table (prompts with fewer samples than the largest action) is refused unless ``min_samples``
drops the shorter prompts or ``ragged="infeasible"`` marks the actions above a prompt's sample count
infeasible for that prompt (:mod:`isocompute.solver.ragged`); ``summary.json`` says how many of each.

Several models (``--outcomes NAME=TABLE …``, :class:`~isocompute.stages.inputs.ModelInputs`): the tables go
through :func:`~isocompute.stages.inputs.load_estimates`, :func:`isocompute.solver.models.estimates.oracle`
solves the budget (mean FLOPs per prompt) over every action, and ``solution.jsonl`` has one line per
prompt, ``{"id", "action", "p", "utility", "cost"}``, the action by its stable name (and ``action_hi`` /
``p_hi`` for a prompt that mixes); ``summary.json`` the budget, λ, the models cheapest first, the menu by
kind, each kind's and model's share and each model's uniform maj@k at the budget (None outside its range).

With ``latency_budget`` (plans; units of one sample's mean completion length, plus ``wave_overhead`` per
wave) both budgets are solved exactly (:mod:`isocompute.stages.solutions`); summary.json then adds the
mean latency and tokens of the solution and of each uniform none@k, and with ``decode_speed`` (tokens per
second) ``mean_latency_s``, the mean latency in seconds. Budgets are mean costs per prompt in the
cost unit. Ignores: anything about features or policies (the fit stage).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from isocompute.errors import InputError
from isocompute.stages.inputs import (
    ModelInputs,
    load_estimates,
    min_samples_option,
    ragged_option,
    several,
    target_option,
)
from isocompute.stages.options import group, option
from isocompute.stages.parsing import (
    Multiple,
    parse_action_set,
    parse_actions,
    parse_budget,
    parse_budgets,
    parse_plans,
    resolve_budgets,
)
from isocompute.stages.solutions import check_latency_options, write_solution

SCHEMA_VERSION = 1
KIND = "solution"
STRATEGIES = ("majority", "pass", "best_of")
COST_UNITS = ("samples", "tokens", "flops")
# The parameters a single-model solution's manifest records (every option but the output directory).
_PARAMS = ("outcomes", "budget", "actions", "strategy", "budgets", "cost_unit", "model_config", "prefix_sharing",
           "rounding", "min_samples", "ragged", "plans", "target")


@dataclass(kw_only=True)
class SolveConfig:
    """One solve: the options of ``isocompute solve`` (each documented on its field)."""

    outcomes: Path | None = option(
        None, flag="outcomes", type=Path, nargs="?",
        help="outcome table (.jsonl, see isocompute.solver.outcomes); or --outcomes NAME=TABLE per model")
    actions: list[int] = option([1, 2, 4, 8, 16], text="1,2,4,8,16", parse=parse_actions,
                                help="sample counts k to choose from, comma-separated")
    strategy: str = option("majority", choices=STRATEGIES,
                           help="how k samples become one answer (utility = its expected accuracy)")
    target: str | None = target_option()
    plans: str | None = option(
        None, help="the plan menu: default, a rule family (lead, window, beta, dirichlet, bayes; boinf: Best-of-∞ "
                   "as published, bayes: as the report's row plays it), a comma list of plan names, or none "
                   "for k samples at once (default: default for --strategy majority, none otherwise)")
    budget: float = option(parse=parse_budget,
                           help="mean cost per prompt, in the cost unit (e.g. 4 = four samples on average; in the "
                                "tokens unit also 4x = four times one sample's mean completion tokens)")
    budgets: list[float] | None = option(
        None, parse=parse_budgets,
        help="also write the frontier at these budgets: start:stop:step (stop included) or 1,2,4")
    cost_unit: str = option("samples", choices=COST_UNITS,
                            help="samples (C = k), tokens (completion tokens generated) or analytic FLOPs from "
                                 "token counts and --model-config")
    model_config: Path | None = option(
        None, type=Path, help="config.json or model directory of the policy model (cost unit flops; default: the "
                              "model_config in the table's meta)")
    prefix_sharing: bool = option(
        True, flag="--no-prefix-sharing", action="store_false",
        help="FLOPs: charge the prompt's prefill once per sample instead of once per request")
    rounding: str = option(
        "mix", choices=("mix", "deterministic"),
        help="mix: randomise boundary prompts so the expected cost equals the budget; deterministic: greedy "
             "rounding that never exceeds it")
    min_samples: int = min_samples_option()
    ragged: str = ragged_option()
    latency_budget: float | None = option(
        None, type=float, help="also cap the mean latency, in units of one sample's mean completion length on the "
                               "table (1.0 = waiting for one sample; needs token counts; plans only)")
    wave_overhead: float = option(0.0, type=float, help="with --latency-budget: latency added per wave (prefill, "
                                                        "queueing), in the same units")
    decode_speed: float | None = option(
        None, type=float, metavar="TOKENS_PER_S", help="with --latency-budget: decode tokens per second, to give "
        "the mean latency in seconds too (mean_latency_s = mean_latency × latency_unit_tokens / speed)")
    out: Path = option(type=Path, help="artifact directory to write (replaced atomically)")
    models: ModelInputs = group(ModelInputs)

    def __post_init__(self) -> None:
        self.out = Path(self.out)
        if self.outcomes is not None:
            self.outcomes = Path(self.outcomes)
        if several(self.outcomes, self.models):
            if self.latency_budget is not None or self.wave_overhead or self.decode_speed is not None:
                raise InputError("several models are solved under one FLOP budget, without latency; drop "
                                 "--latency-budget, --wave-overhead and --decode-speed.")
            return
        if self.strategy not in STRATEGIES:
            raise InputError(f"--strategy must be one of {', '.join(STRATEGIES)}; you passed {self.strategy!r}.")
        if self.cost_unit not in COST_UNITS:
            raise InputError(f"--cost-unit must be one of {', '.join(COST_UNITS)}; you passed {self.cost_unit!r}.")
        if self.rounding not in ("mix", "deterministic"):
            raise InputError(f"--rounding must be mix or deterministic; you passed {self.rounding!r}.")
        check_latency_options(self.latency_budget, self.rounding, self.wave_overhead, self.decode_speed)
        if self.model_config is not None and self.cost_unit != "flops":
            raise InputError("--model-config only matters with --cost-unit flops; add that or drop --model-config.")


def solve(cfg: SolveConfig) -> dict[str, Any]:
    """Run the whole stage and write the artifact; return the summary (what summary.json holds, plus
    ``out`` and the frontier's figures for one model)."""
    if cfg.models.model_outcomes:
        return _solve_models(cfg)
    names = parse_plans(cfg.plans, tuple(cfg.actions), cfg.strategy,
                        parallel=cfg.cost_unit != "samples" or cfg.latency_budget is not None)
    if cfg.latency_budget is not None and not names:  # k samples at once: the one-wave ladder as plans
        names = tuple(f"none@{k}" for k in cfg.actions)
    if names:
        return _solve_plans(cfg, names)
    import numpy as np

    from isocompute.solver.allocate import allocate, check_budget, feasible_range
    from isocompute.solver.costs import cost_table
    from isocompute.solver.frontier import frontier
    from isocompute.solver.ragged import drop_short, ragged_utilities

    table, inputs, model = _load(cfg)
    full = len(table)
    table, _, dropped, floor = drop_short(table, cfg.actions, min_samples=cfg.min_samples, ragged=cfg.ragged)
    C = cost_table(table.prompt_tokens, table.mean_completion_tokens, cfg.actions, unit=cfg.cost_unit,
                   model=model, prefix_sharing=cfg.prefix_sharing)
    # Check budgets before the (slower) utilities, so a typo fails fast with the feasible range.
    check_budget(cfg.budget, C)
    for b in cfg.budgets or []:
        check_budget(b, C)
    U, feasible = ragged_utilities(table, cfg.actions, cfg.strategy)

    res = allocate(U, C, cfg.budget, rounding=cfg.rounding)
    ks = np.asarray(cfg.actions)
    uniform = [{"k": int(k), "mean_cost": float(C[:, a].mean()), "mean_utility": float(U[:, a].mean())}
               for a, k in enumerate(ks)]
    probs = res.action_probs()
    summary: dict[str, Any] = {
        "budget": res.budget, "lambda": res.lam, "mean_cost": res.mean_cost, "mean_utility": res.mean_utility,
        "lp_utility": res.lp_utility, "n_prompts": res.n_prompts, "n_mixed": int(res.mixed.size),
        "mix_prob": res.mix_prob, "status": res.status, "message": res.message,
        "k_share": {str(int(k)): float(s) for k, s in zip(ks, probs.mean(axis=0), strict=True)},
        "uniform": uniform, "feasible_range": list(feasible_range(C)),
        "actions": [int(k) for k in ks], "strategy": cfg.strategy, "cost_unit": cfg.cost_unit,
        "rounding": cfg.rounding, "target": table.target,
        "prompts_in_table": full, "dropped": len(dropped), "min_samples": floor,
        "ragged_prompts": int((~feasible).any(axis=1).sum()),
    }
    front = _frontier_json(frontier(U, C), cfg, uniform) if cfg.budgets else None
    return _write_artifact(cfg, inputs, summary, front,
                           lambda path: write_solution(path, table.ids, res, ks, U, C))


def _load(cfg: SolveConfig) -> tuple[Any, dict[str, str], Any]:
    """(the table, its inputs' checksums, the FLOP model or None) for ``cfg``."""
    from isocompute.artifacts import sha256_file
    from isocompute.flops import load_model_flops
    from isocompute.solver.outcomes import read_outcomes
    from isocompute.solver.votes.consensus import with_target

    table = with_target(read_outcomes(cfg.outcomes), cfg.target)
    cfg.target = table.target  # the manifest and summary record the target used (cfg: solve()'s own)
    _resolve_multiples(cfg, table)
    inputs = {"outcomes": table.sha256 or sha256_file(cfg.outcomes)}
    model = None
    if cfg.cost_unit == "flops":
        if cfg.model_config is not None:
            model = load_model_flops(cfg.model_config)
            inputs["model_config"] = sha256_file(cfg.model_config if cfg.model_config.is_file()
                                                 else cfg.model_config / "config.json")
        elif isinstance(table.meta.get("model_config"), dict):
            model = load_model_flops(table.meta["model_config"])
        else:
            raise InputError("--cost-unit flops needs the policy model's config: pass --model-config "
                             "PATH (a config.json or model directory); this table's meta has none.")
    return table, inputs, model


def _resolve_multiples(cfg: SolveConfig, table: Any) -> None:
    """Budgets written as multiples (``4x``, tokens unit) become tokens on ``table``, in ``cfg`` itself."""
    from isocompute.solver.costs import token_multiple_of

    values = [cfg.budget, *(cfg.budgets or [])]
    if not any(isinstance(v, Multiple) for v in values):
        return
    per_sample = token_multiple_of(table.mean_completion_tokens) if cfg.cost_unit == "tokens" else None
    cfg.budget = resolve_budgets([cfg.budget], cfg.cost_unit, per_sample)[0]
    if cfg.budgets:
        cfg.budgets = resolve_budgets(list(cfg.budgets), cfg.cost_unit, per_sample)


def _solve_plans(cfg: SolveConfig, names: tuple[str, ...]) -> dict[str, Any]:
    """:func:`solve` over a plan menu (module docstring)."""
    import numpy as np

    from isocompute.policy.plans.arrays import allocate_plans, plan_arrays
    from isocompute.solver.allocate import check_budget, feasible_range
    from isocompute.solver.frontier import frontier
    from isocompute.solver.plans.estimates import by_cost
    from isocompute.solver.plans.plan import parse_plan

    table, inputs, model = _load(cfg)
    menu = [parse_plan(n) for n in names]
    arr = plan_arrays(table, menu, cost_unit=cfg.cost_unit, model=model, min_samples=cfg.min_samples,
                      ragged=cfg.ragged, prefix_caching=cfg.prefix_sharing)
    U, C = arr.utility, arr.cost
    for b in [cfg.budget, *(cfg.budgets or [])]:
        check_budget(b, C)  # feasible_range is per-prompt min/max, so plan columns need no sorting here
    ks = np.array([p.max_samples for p in menu])
    lad = [names.index(f"none@{k}") for k in cfg.actions]
    if cfg.latency_budget is None:
        res = allocate_plans(U, C, cfg.budget, rounding=cfg.rounding)
        a, probs, sol = res.allocation, res.action_probs(), None
        head = {"budget": a.budget, "lambda": a.lam, "mean_cost": a.mean_cost, "mean_utility": a.mean_utility,
                "lp_utility": a.lp_utility, "n_prompts": a.n_prompts, "n_mixed": int(a.mixed.size),
                "mix_prob": a.mix_prob, "status": a.status, "message": a.message}
        write = lambda path: write_solution(path, arr.table.ids, a, ks, U, C, res.order, names)  # noqa: E731
    else:
        from isocompute.solver.costs import token_multiple_of
        from isocompute.stages.solutions import latency_oracle, write_mixture

        sol = latency_oracle(arr, cfg.budget, cfg.latency_budget, cfg.wave_overhead,
                             token_multiple_of(table.mean_completion_tokens))
        head, probs = sol.head(), sol.probs
        write = lambda path: write_mixture(path, arr.table.ids, sol, ks, names, U, C)  # noqa: E731
    summary: dict[str, Any] = {
        **head, "plans": list(names),
        "plan_share": {n: float(x) for n, x in zip(names, probs.mean(axis=0), strict=True) if x > 0},
        "k_share": {str(int(k)): float(probs[:, ks == k].sum(axis=1).mean()) for k in np.unique(ks)},
        "expected_samples": float((probs * arr.samples).sum(axis=1).mean()),
        "expected_waves": float((probs * arr.waves).sum(axis=1).mean()),
        "uniform": [{"k": int(k), "plan": names[j], "mean_cost": float(C[:, j].mean()),
                     "mean_utility": float(U[:, j].mean()), **(sol.uniform(j, cfg.decode_speed) if sol else {})}
                    for k, j in zip(cfg.actions, lad, strict=True)],
        "feasible_range": list(feasible_range(C)), "actions": [int(k) for k in cfg.actions],
        "strategy": cfg.strategy, "cost_unit": cfg.cost_unit, "rounding": cfg.rounding, "target": table.target,
        "prompts_in_table": len(table), "dropped": len(arr.dropped), "min_samples": arr.min_samples,
        "ragged_prompts": arr.n_ragged, **(sol.fields(cfg.decode_speed) if sol else {}),
    }
    front = None
    if cfg.budgets:
        order = by_cost(U, C)
        front = _frontier_json(frontier(order.utility, order.cost), cfg, summary["uniform"])
    extra = {} if sol is None else {"latency_budget": cfg.latency_budget, "wave_overhead": cfg.wave_overhead,
                                    **({} if cfg.decode_speed is None else {"decode_speed": cfg.decode_speed})}
    return _write_artifact(cfg, inputs, summary, front, write, plans=list(names), **extra)


def _frontier_json(f: Any, cfg: SolveConfig, uniform: list[dict[str, Any]]) -> dict[str, Any]:
    """frontier.json: the frontier ``f`` at ``cfg.budgets``, its breakpoints and the uniform baselines."""
    import numpy as np

    return {
        "budgets": list(cfg.budgets or []), "utility": np.atleast_1d(f.utility_at(cfg.budgets)).tolist(),
        "lambda": np.atleast_1d(f.lam_at(cfg.budgets)).tolist(),
        "breakpoints": {"cost": f.cost.tolist(), "utility": f.utility.tolist(), "lambda": f.lam.tolist()},
        "max_cost": f.max_cost, "uniform": uniform, "strategy": cfg.strategy, "cost_unit": cfg.cost_unit,
    }


def _write_artifact(cfg: SolveConfig, inputs: dict[str, str], summary: dict[str, Any], front: dict[str, Any] | None,
                    write_solution: Callable[[Path], None], **extra_params: Any) -> dict[str, Any]:
    """Write the solve artifact (solution.jsonl by ``write_solution``, summary.json, and frontier.json/png
    with ``front``) atomically; return ``summary`` with where it went and the frontier's figures."""
    from isocompute.artifacts import artifact_writer

    params = {k: (str(v) if isinstance(v, Path) else v) for k in _PARAMS for v in [getattr(cfg, k)]}
    params.update(extra_params)
    with artifact_writer(cfg.out, kind=KIND, schema_version=SCHEMA_VERSION, inputs=inputs, params=params) as d:
        write_solution(d / "solution.jsonl")
        (d / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        if front is not None:
            (d / "frontier.json").write_text(json.dumps(front) + "\n")
            _plot(d / "frontier.png", front, cfg)
    summary["out"] = str(cfg.out)
    if front is not None:
        summary["frontier"] = {"budgets": front["budgets"], "utility": front["utility"]}
    return summary


def _plot(path: Path, front: dict[str, Any], cfg: SolveConfig) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    bp = front["breakpoints"]
    ax.plot(bp["cost"] + [front["max_cost"]], bp["utility"] + [bp["utility"][-1]], color="C0", lw=1.5,
            label="oracle (Lagrangian, exact)")
    ax.plot(front["budgets"], front["utility"], "o", color="C0", ms=3.5, label="requested budgets")
    uni = front["uniform"]
    ax.plot([u["mean_cost"] for u in uni], [u["mean_utility"] for u in uni], "s--", color="C1", ms=5,
            lw=1, label="uniform k")
    for u in uni:
        ax.annotate(f"k={u['k']}", (u["mean_cost"], u["mean_utility"]), textcoords="offset points",
                    xytext=(4, -10), fontsize=8, color="C1")
    unit = {"samples": "samples per prompt", "tokens": "tokens per prompt"}.get(cfg.cost_unit, "FLOPs per prompt")
    ax.set_xlabel(f"mean cost ({unit})")
    ax.set_ylabel(f"mean accuracy ({cfg.strategy})")
    ax.set_title(f"accuracy vs budget — {cfg.outcomes.name}")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _solve_models(cfg: SolveConfig) -> dict[str, Any]:
    """:func:`solve` over several models' actions at a FLOP budget (module docstring); the summary."""
    import numpy as np

    from isocompute.artifacts import artifact_writer
    from isocompute.evaluation.model_baselines import uniform_at_budget
    from isocompute.solver.models.estimates import oracle

    actions = parse_action_set(",".join(str(k) for k in cfg.actions))
    me, inputs = load_estimates(cfg.models, actions, cfg.plans)
    est = me.estimates
    orc = oracle(est, float(cfg.budget))
    kinds = ("single", "cascade", "ensemble")
    kind_of = np.array([kinds.index(a.kind) for a in est.actions])
    flops_by_model = (orc.probs[:, :, None] * est.flops).sum(axis=(0, 1))
    uniform = {m: uniform_at_budget(est, m, float(cfg.budget)) for m in me.models}
    summary: dict[str, Any] = {
        "budget": float(cfg.budget), "lambda": float(orc.allocation.lam), "mean_cost": orc.mean_cost,
        "mean_utility": orc.accuracy, "binding": bool(orc.binding), "status": int(orc.allocation.status),
        "n_prompts": len(me.prompts), "models": list(me.models), "cost_unit": "flops",
        "menu": {k: int((kind_of == i).sum()) for i, k in enumerate(kinds)},
        "kind_share": {k: float(orc.probs[:, kind_of == i].sum() / len(me.prompts)) for i, k in enumerate(kinds)},
        "model_flops_share": {m: float(flops_by_model[j] / max(flops_by_model.sum(), 1e-300))
                              for j, m in enumerate(est.models)},
        "uniform": {m: None if h is None else {"accuracy": h.accuracy, "mean_cost": h.mean_cost, "plays": h.choices[0]}
                    for m, h in uniform.items()},
    }
    names = est.names
    with artifact_writer(cfg.out, kind=KIND, schema_version=SCHEMA_VERSION, inputs=inputs,
                         params={"budget": float(cfg.budget), "actions": list(actions), "plans": cfg.plans,
                                 "orders": cfg.models.orders, "models": list(me.models)}) as d:
        with (d / "solution.jsonl").open("w") as f:
            for i, rid in enumerate(me.tables.ids):
                cols = np.flatnonzero(orc.probs[i] > 1e-12)
                cols = cols[np.argsort(-orc.probs[i, cols])]
                row: dict[str, Any] = {"id": rid, "action": names[cols[0]], "p": float(orc.probs[i, cols[0]]),
                                       "utility": float(orc.utility[i]), "cost": float(orc.cost[i])}
                if cols.size > 1:
                    row.update(action_hi=names[cols[1]], p_hi=float(orc.probs[i, cols[1]]))
                f.write(json.dumps(row) + "\n")
        (d / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
