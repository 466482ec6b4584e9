"""The several-models flags of ``fit``, ``solve`` and ``report``: ``--outcomes NAME=TABLE`` (repeatable),
``--model-params NAME=ACTIVE_PARAMS``, ``--model NAME=CONFIG``, ``--align-cache PATH``.

:func:`add_model_args` registers them; :func:`load_estimates` reads the tables and runs
:func:`isocompute.policy.multi.fit.model_estimates` (join by id → align classes → FLOPs → the menu's
estimates). The menu's single-model plans are ``--plans`` (default: the 30 default plans), every plan
capped at the largest ``--actions``, plus the uniform ladder ``none@k``; cascades, weighted cascades and
ensembles are built from them as :class:`~isocompute.solver.models.actions.MenuConfig` says, their plans
capped likewise. A positional table (one model) keeps today's behaviour; giving both is an error.

Ignores: what the commands do with the estimates.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from isocompute.errors import InputError


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--outcomes", dest="model_outcomes", action="append", default=[], metavar="NAME=TABLE",
                   help="one model's outcome table of the same prompts; repeat for each model (several models: "
                        "actions are (model, plan), cascades and ensembles, priced in FLOPs); instead of the "
                        "positional table")
    p.add_argument("--model-params", dest="model_params", action="append", default=[], metavar="NAME=ACTIVE_PARAMS",
                   help="a model's cost as its parameter count, 2 FLOPs per parameter per generated token; for a "
                        "mixture-of-experts model the ACTIVE parameters per token (e.g. gpt-oss-20b=3.6e9); repeatable")
    p.add_argument("--model", dest="model_configs", action="append", default=[], metavar="NAME=CONFIG",
                   help="a model's config.json or model directory for its FLOPs (else --model-params, else the "
                        "table's meta.model_config); repeatable")
    p.add_argument("--align-cache", type=Path, help="cache file of the answer classes aligned across models")
    p.add_argument("--orders", type=int, default=200,
                   help="Monte Carlo sample orders per prompt for votes that mix models")


def is_multi(args: argparse.Namespace) -> bool:
    """Whether the command got several models; InputError for both forms, or neither."""
    multi = bool(getattr(args, "model_outcomes", None))
    if multi and args.outcomes is not None:
        raise InputError("pass either one outcome table (positional) or several with --outcomes NAME=TABLE, not both.")
    if not multi and args.outcomes is None:
        raise InputError("pass an outcome table (positional), or one per model with --outcomes NAME=TABLE (repeated).")
    if not multi and any(getattr(args, k, None) for k in ("model_params", "model_configs", "align_cache")):
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


def load_estimates(args: argparse.Namespace, actions: tuple[int, ...]) -> tuple[Any, dict[str, str]]:
    """(:class:`~isocompute.policy.multi.fit.ModelEstimates`, inputs for the artifact's manifest)."""
    from isocompute.cli.fit import read_table
    from isocompute.policy.multi.fit import model_estimates, parse_named_tables
    from isocompute.solver.models.costs import parse_model_params

    paths = parse_named_tables(args.model_outcomes)
    params = parse_model_params(args.model_params)
    configs: dict[str, Path] = {}
    for item in args.model_configs:
        name, eq, path = str(item).partition("=")
        if not eq:
            raise InputError(f"bad --model {item!r}: write NAME=CONFIG (a config.json or model directory).")
        configs[name.strip()] = Path(path.strip())
    unknown = sorted((set(params) | set(configs)) - set(paths))
    if unknown:
        raise InputError(f"--model-params/--model name {unknown}, which no --outcomes names; the models are "
                         f"{', '.join(paths)}.")
    tables = {name: read_table(p) for name, p in paths.items()}
    me = model_estimates(tables, params=params, configs=configs, align_cache=args.align_cache,
                         menu=menu_config(getattr(args, "plans", None), actions, args.orders))
    inputs = {f"outcomes:{name}": t.sha256 for name, t in tables.items()}
    inputs.update({f"model_params:{k}": f"{v:g}" for k, v in params.items()})
    return me, inputs
