"""``isocompute solve --outcomes NAME=TABLE …``: the oracle over several models' actions at a FLOP budget.

The tables go through :func:`isocompute.cli.models_input.load_estimates` (join → align → FLOPs → the
menu's estimates); :func:`isocompute.solver.models.estimates.oracle` solves the budget (mean FLOPs per
prompt) exactly over every action, and a ``solution`` artifact is written:

``solution.jsonl``  one line per prompt: ``{"id", "action", "p", "utility", "cost"}`` — the oracle's
                    action by its stable name (``gpt-oss-20b/lead:m=2@2 > Qwen3-14B/none@2``), and for a
                    prompt that mixes ``action_hi`` / ``p_hi``; ``utility`` / ``cost`` its expectation
``summary.json``    budget, lambda, mean_cost, mean_utility, binding, models (cheapest first), menu size
                    by kind, the expected share of each action kind and each model's share of the FLOPs,
                    and each model's uniform maj@k at the budget (None outside its range)

Ignores: learning (``isocompute fit --outcomes``) and held-out evaluation (``isocompute report``).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np

from isocompute.cli.solve import KIND, SCHEMA_VERSION


def run_models(args: argparse.Namespace) -> int:
    from isocompute.artifacts import artifact_writer
    from isocompute.cli.fit import parse_actions
    from isocompute.cli.models_input import load_estimates
    from isocompute.evaluation.model_baselines import uniform_at_budget
    from isocompute.solver.models.estimates import oracle

    me, inputs = load_estimates(args, parse_actions(args.actions))
    est = me.estimates
    orc = oracle(est, float(args.budget))
    kinds = ("single", "cascade", "ensemble")
    kind_of = np.array([kinds.index(a.kind) for a in est.actions])
    flops_by_model = (orc.probs[:, :, None] * est.flops).sum(axis=(0, 1))
    uniform = {m: uniform_at_budget(est, m, float(args.budget)) for m in me.models}
    summary: dict[str, Any] = {
        "budget": float(args.budget), "lambda": float(orc.allocation.lam), "mean_cost": orc.mean_cost,
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
    with artifact_writer(args.out, kind=KIND, schema_version=SCHEMA_VERSION, inputs=inputs,
                         params={"budget": float(args.budget), "actions": list(parse_actions(args.actions)),
                                 "plans": args.plans, "orders": args.orders, "models": list(me.models)}) as d:
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
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"oracle over {len(est.actions)} actions on {', '.join(me.models)} at {args.budget:.4g} FLOPs: "
              f"accuracy {orc.accuracy:.4f}, mean {orc.mean_cost:.4g} FLOPs per prompt → {args.out}")
        for m, h in uniform.items():
            print(f"  uniform {m}: " + ("outside its range" if h is None else f"{h.accuracy:.4f} ({h.choices[0]})"))
    return 0
