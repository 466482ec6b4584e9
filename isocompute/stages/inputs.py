"""What the stages read: an outcome table, a model's FLOP shape, and several models' tables.

:func:`read_table` reads our outcome table or a Qwen CoT evaluation dump; :func:`model_flops_for` finds the
FLOP shape for cost unit ``flops``. Several models (``fit``, ``solve`` and ``report`` with ``--outcomes
NAME=TABLE`` repeated) are the option group :class:`ModelInputs`: ``--outcomes``, ``--model-params
NAME=ACTIVE_PARAMS``, ``--model NAME=CONFIG``, ``--align-cache PATH``, ``--orders``. :func:`several` says
whether a stage got them (a positional table, one model, keeps the single-model behaviour; both is an
error); :func:`load_estimates` reads the tables and runs :func:`model_estimates`
(join by id → align classes → FLOPs → the menu's estimates). The menu's single-model plans are ``--plans``
(default: the 30 default plans), every plan capped at the largest ``--actions``, plus the uniform ladder
``none@k``; cascades, weighted cascades and ensembles are built from them as
:class:`~isocompute.solver.models.actions.MenuConfig` says, their plans capped likewise.

Ignores: what the stages do with what they read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from isocompute.errors import InputError
from isocompute.stages.options import option

__all__ = ["ModelInputs", "load_estimates", "menu_config", "model_estimates", "model_flops_for", "parse_named_tables",
           "read_raw", "read_table", "several", "target_line", "target_option"]


def min_samples_option() -> Any:
    """The ``--min-samples`` option of the stages that read a table (fit, solve): one text, one default."""
    return option(0, type=int, help="drop prompts with fewer samples than this (and say how many), e.g. the "
                                    "largest action")


def ragged_option() -> Any:
    """The ``--ragged`` option of the stages that read a table (fit, solve)."""
    return option("error", choices=("error", "infeasible"),
                  help="prompts with fewer samples than the largest action: refuse the table, or keep them and "
                       "mark the actions above their sample count infeasible for them only")


def target_option() -> Any:
    """The ``--target`` option of every stage that credits samples (solve, fit, report, vote, evidence)."""
    return option(None, choices=("gold", "consensus"),
                  help="what a sample is credited against: its gold verdict, or agreement with its prompt's "
                       "plurality answer over all its samples (for traffic without gold); default gold when every "
                       "sample has 'correct', else consensus")


def target_line(table: Any) -> str:
    """One line saying which target a stage used on ``table`` and why (printed by the CLI)."""
    why = ("every sample has a gold verdict" if table.has_gold else "samples without gold verdicts") \
        if table.target == ("gold" if table.has_gold else "consensus") else "as asked"
    return f"target: {table.target} ({why})"


def read_table(path: Path, target: str | None = "gold") -> Any:
    """Our outcome table, or a Qwen CoT evaluation dump (lines with idx/question/pred/score), credited under
    ``target`` (:func:`isocompute.solver.votes.consensus.with_target`; None: gold when every sample has a
    verdict, else consensus)."""
    from isocompute.solver.votes.consensus import with_target

    return with_target(read_raw(Path(path)), target)


def read_raw(path: Path) -> Any:
    """The table as read, ``correct`` holding its gold verdicts (False where a sample has none)."""
    from isocompute.solver.outcomes import from_qwen_cot_table, read_outcomes

    path = Path(path)
    if not path.is_file():
        raise InputError(f"outcome table {path} does not exist; create it with `isocompute sample` or pass "
                         "the path of an existing .jsonl table.")
    with path.open(encoding="utf-8", errors="replace") as f:
        first = next((line for line in f if line.strip()), "")
    try:
        keys = set(json.loads(first)) if first else set()
    except json.JSONDecodeError:
        keys = set()
    if "id" not in keys and {"idx", "question", "pred", "score"} <= keys:
        return from_qwen_cot_table(path)
    return read_outcomes(path)


def model_flops_for(table: Any, model_config: Path | None) -> tuple[Any, dict[str, str]]:
    """The FLOP shape for cost unit flops: --model-config, else the table's meta (as `solve` does)."""
    from isocompute.artifacts import sha256_file
    from isocompute.flops import load_model_flops

    if model_config is not None:
        path = model_config if Path(model_config).is_file() else Path(model_config) / "config.json"
        return load_model_flops(model_config), {"model_config": sha256_file(path)}
    if isinstance(table.meta.get("model_config"), dict):
        return load_model_flops(table.meta["model_config"]), {}
    raise InputError("--cost-unit flops needs the policy model's config: pass --model-config PATH (a "
                     "config.json or model directory); this table's meta has none.")


@dataclass(kw_only=True)
class ModelInputs:
    """Several models' outcome tables of the same prompts and how each model's FLOPs are known."""

    model_outcomes: list[str] = option(
        [], flag="--outcomes", action="append", metavar="NAME=TABLE",
        help="one model's outcome table of the same prompts; repeat for each model (several models: actions are "
             "(model, plan), cascades and ensembles, priced in FLOPs); instead of the positional table")
    model_params: list[str] = option(
        [], action="append", metavar="NAME=ACTIVE_PARAMS",
        help="a model's cost as its parameter count, 2 FLOPs per parameter per generated token; for a "
             "mixture-of-experts model the ACTIVE parameters per token (e.g. gpt-oss-20b=3.6e9); repeatable")
    model_configs: list[str] = option(
        [], flag="--model", action="append", metavar="NAME=CONFIG",
        help="a model's config.json or model directory for its FLOPs (else --model-params, else the table's "
             "meta.model_config); repeatable")
    align_cache: Path | None = option(None, type=Path, help="cache file of the answer classes aligned across models")
    orders: int = option(200, type=int, help="Monte Carlo sample orders per prompt for votes that mix models")


def several(outcomes: Path | None, models: ModelInputs) -> bool:
    """Whether a stage got several models; InputError for both forms, or neither."""
    multi = bool(models.model_outcomes)
    if multi and outcomes is not None:
        raise InputError("pass either one outcome table (positional) or several with --outcomes NAME=TABLE, not both.")
    if not multi and outcomes is None:
        raise InputError("pass an outcome table (positional), or one per model with --outcomes NAME=TABLE (repeated).")
    if not multi and (models.model_params or models.model_configs or models.align_cache):
        raise InputError("--model-params, --model and --align-cache apply to several models; add --outcomes "
                         "NAME=TABLE for each model.")
    return multi


def menu_config(plans: str | None, actions: tuple[int, ...], n_orders: int) -> Any:
    """The menu settings for ``--plans`` and ``--actions`` (module docstring)."""
    from isocompute.policy.plans.menu import ladder, resolve_plans
    from isocompute.solver.models.actions import MenuConfig
    from isocompute.solver.plans.plan import default_plans, parse_plan

    k_max = max(actions)

    def cap(names: Any) -> tuple[Any, ...]:
        out: dict[str, Any] = {}
        for n in names:
            p = parse_plan(n) if isinstance(n, str) else n
            p = p.capped(max_samples=k_max) if p.max_samples > k_max else p
            out.setdefault(p.name, p)
        return tuple(out.values())

    if plans is None or plans.strip() == "default":
        menu = cap([*ladder(actions), *default_plans()])
    elif plans.strip() == "none":
        menu = tuple(ladder(actions))
    else:
        menu = resolve_plans(plans, actions)
    base = MenuConfig()
    return MenuConfig(plans=menu, weighted_first=cap(base.weighted_first), weighted_last=cap(base.weighted_last),
                      ensemble_k=tuple(sorted({min(k, k_max) for k in base.ensemble_k})), n_orders=n_orders)


def load_estimates(models: ModelInputs, actions: tuple[int, ...], plans: str | None,
                   orders: int | None = None) -> tuple[Any, dict[str, str]]:
    """(:class:`~isocompute.policy.multi.fit.ModelEstimates`, inputs for the artifact's manifest) of the
    menu of ``plans`` over ``actions``, votes that mix models over ``orders`` (default ``models.orders``)."""
    from isocompute.solver.models.costs import parse_model_params

    paths = parse_named_tables(models.model_outcomes)
    params = parse_model_params(models.model_params)
    configs: dict[str, Path] = {}
    for item in models.model_configs:
        name, eq, path = str(item).partition("=")
        if not eq:
            raise InputError(f"bad --model {item!r}: write NAME=CONFIG (a config.json or model directory).")
        configs[name.strip()] = Path(path.strip())
    unknown = sorted((set(params) | set(configs)) - set(paths))
    if unknown:
        raise InputError(f"--model-params/--model name {unknown}, which no --outcomes names; the models are "
                         f"{', '.join(paths)}.")
    tables = {name: read_raw(p) for name, p in paths.items()}
    ungraded = [name for name, t in tables.items() if not t.has_gold]
    if ungraded:  # one plurality over several models' aligned classes is not built: say so, not "use consensus"
        raise InputError(f"several models are credited on gold only, and {', '.join(ungraded)}'s table has samples "
                         "without 'correct'; grade them (isocompute import --task …), or fit each model alone "
                         "(positional table) under --target consensus.")
    me = model_estimates(tables, params=params, configs=configs, align_cache=models.align_cache,
                         menu=menu_config(plans, actions, models.orders if orders is None else orders))
    inputs = {f"outcomes:{name}": t.sha256 for name, t in tables.items()}
    inputs.update({f"model_params:{k}": f"{v:g}" for k, v in params.items()})
    return me, inputs


def parse_named_tables(items: Sequence[str]) -> dict[str, Path]:
    """``["gpt-oss-20b=runs/a.jsonl", …]`` (the ``--outcomes`` values) → name → path."""
    out: dict[str, Path] = {}
    for item in items:
        name, eq, path = str(item).partition("=")
        if not eq or not name.strip() or not path.strip():
            raise InputError(f"bad --outcomes {item!r}: write NAME=TABLE, e.g. gpt-oss-20b=runs/real/math500_gpt-oss-20b.jsonl.")
        if name.strip() in out:
            raise InputError(f"--outcomes names {name.strip()} twice; give each model one table.")
        out[name.strip()] = Path(path.strip())
    if len(out) < 2:
        raise InputError("--outcomes joins the tables of several models: pass it at least twice (NAME=TABLE each); "
                         "for one model pass its table as the positional argument.")
    return out


def model_estimates(tables: Mapping[str, Any], *, params: Mapping[str, float] | None = None,
                    configs: Mapping[str, Any] | None = None, align_cache: str | Path | None = None,
                    menu: Any = None, grader: Any = None) -> Any:
    """Join by id → align answer classes (math-verify) → each model's FLOPs → the menu's estimates, on name →
    :class:`~isocompute.solver.outcomes.OutcomeTable`: a :class:`~isocompute.policy.multi.fit.ModelEstimates`."""
    from isocompute.policy.multi.fit import ModelEstimates
    from isocompute.solver.models.costs import resolve_model_flops
    from isocompute.solver.models.estimates import estimate_menu, models_by_cost
    from isocompute.solver.models.tables import join_tables
    from isocompute.tasks.answers.class_alignment import align_answers
    from isocompute.tasks.grading import Grader

    mt = join_tables(dict(tables))
    flops = resolve_model_flops(mt, params=params, configs=configs)  # before alignment: fail fast on costs
    own = grader is None
    g = Grader(workers=2) if own else grader  # its pool starts on the first grading call: not on a cache hit
    try:
        al = align_answers(mt.answers(), mt.kind, golds=mt.golds, grader=g, cache=align_cache)
    finally:
        if own:
            g.close()
    mt = mt.with_classes(al.classes)
    est = estimate_menu(mt, flops, menu)
    return ModelEstimates(mt, flops, tuple(models_by_cost(mt, flops)), est)
