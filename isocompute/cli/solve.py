"""``isocompute solve``: per-prompt oracle actions under a mean compute budget, from an outcome table.

The options are :class:`isocompute.stages.solve.SolveConfig`'s fields (argparse generated from them);
the work is :func:`isocompute.stages.solve.solve`. This module prints the summary: a table, or with
``--json`` one JSON object.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from isocompute.stages.inputs import ModelInputs
from isocompute.stages.options import add_arguments, from_namespace
from isocompute.stages.solve import SolveConfig


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "solve",
        help="per-prompt oracle actions under a mean compute budget (exact Lagrangian solver)",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_arguments(p, SolveConfig, groups=False)
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object instead of a table")
    add_arguments(p, ModelInputs)  # the several-models options after --json, where --help has always shown them
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from isocompute.stages.solve import solve

    cfg = from_namespace(SolveConfig, args)
    summary = solve(cfg)
    if args.json:
        print(json.dumps(summary))
    elif cfg.models.model_outcomes:
        _print_models(summary, cfg)
    else:
        _print_table(summary)
    return 0


def _print_models(summary: dict[str, Any], cfg: SolveConfig) -> None:
    print(f"oracle over {sum(summary['menu'].values())} actions on {', '.join(summary['models'])} at "
          f"{cfg.budget:.4g} FLOPs: accuracy {summary['mean_utility']:.4f}, mean {summary['mean_cost']:.4g} FLOPs "
          f"per prompt → {cfg.out}")
    for m, h in summary["uniform"].items():
        print(f"  uniform {m}: " + ("outside its range" if h is None else f"{h['accuracy']:.4f} ({h['plays']})"))


def _print_table(summary: dict[str, Any]) -> None:
    from rich.table import Table

    from isocompute.cli.console import console as make_console

    console = make_console()
    t = Table(title=f"oracle solution → {summary['out']}", show_header=False)
    t.add_column(style="bold")
    t.add_column(justify="right")
    t.add_row("prompts", str(summary["n_prompts"]))
    if summary["dropped"]:
        t.add_row("dropped (short)", f"{summary['dropped']} of {summary['prompts_in_table']} (fewer than "
                                     f"{summary['min_samples']} samples)")
    if summary["ragged_prompts"]:
        t.add_row("ragged prompts", f"{summary['ragged_prompts']} (actions k > n infeasible for them)")
    t.add_row(f"budget ({summary['cost_unit']})", f"{summary['budget']:.6g}")
    t.add_row("λ*", f"{summary['lambda']:.6g}")
    t.add_row("mean cost (expected)", f"{summary['mean_cost']:.6g}")
    t.add_row(f"mean utility ({summary['strategy']}, target {summary.get('target', 'gold')})",
              f"{summary['mean_utility']:.4f}")
    t.add_row("LP bound", f"{summary['lp_utility']:.4f}")
    t.add_row("mixed prompts", f"{summary['n_mixed']} (p = {summary['mix_prob']:.3g})")
    t.add_row("share of k" + (" (plans' most samples)" if "plans" in summary else ""),
              "  ".join(f"{k}:{s:.2f}" for k, s in summary["k_share"].items()))
    if "plans" in summary:
        top = sorted(summary["plan_share"].items(), key=lambda x: -x[1])[:6]
        t.add_row(f"plans ({len(summary['plans'])} in the menu)", "  ".join(f"{n}:{s:.2f}" for n, s in top))
        t.add_row("expected samples / waves", f"{summary['expected_samples']:.4g} / {summary['expected_waves']:.3g}")
    timed = "mean_latency" in summary
    if timed:
        t.add_row("latency budget (samples' waits)", f"{summary['latency_budget']:.6g} (+{summary['wave_overhead']:g}"
                                                     f" per wave; 1.0 = {summary['latency_unit_tokens']:.6g} tokens)")
        t.add_row("μ*", f"{summary['mu']:.6g}")
        secs = (f" ({summary['mean_latency_s']:.4g} s at {summary['decode_speed']:g} tokens/s)"
                if "mean_latency_s" in summary else "")
        t.add_row("mean latency / tokens (expected)",
                  f"{summary['mean_latency']:.4g}{secs} / {summary['mean_tokens']:.6g}")
    console.print(t)
    u = Table(title="uniform k (same k for every prompt)")
    secs = "mean_latency_s" in summary
    for col in ("k", "mean cost", "mean utility", *(("mean latency", "mean tokens") if timed else ()),
                *(("mean latency (s)",) if secs else ())):
        u.add_column(col, justify="right")
    for row in summary["uniform"]:
        u.add_row(str(row["k"]), f"{row['mean_cost']:.6g}", f"{row['mean_utility']:.4f}",
                  *((f"{row['mean_latency']:.4g}", f"{row['mean_tokens']:.6g}") if timed else ()),
                  *((f"{row['mean_latency_s']:.4g}",) if secs else ()))
    console.print(u)
    if summary["message"]:
        console.print(summary["message"])
    if "frontier" in summary:
        console.print(f"frontier at {len(summary['frontier']['budgets'])} budgets → frontier.json, frontier.png")
