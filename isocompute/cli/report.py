"""``isocompute report``: held-out evaluation of a policy against the oracle and baselines at matched budgets.

The options are :class:`isocompute.stages.report.ReportConfig`'s fields (argparse generated from them);
the work is :func:`isocompute.stages.report.report`. This module prints the held-out tables (accuracy per
budget, gains with their CIs, the cost to reach uniform's accuracy) or, for several models, the report's
markdown.
"""

from __future__ import annotations

import argparse
from typing import Any

from isocompute.stages.options import add_arguments, from_namespace
from isocompute.stages.report import ReportConfig


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "report", help="held-out regret of a policy vs oracle, uniform, heuristic and random at matched budgets",
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_arguments(p, ReportConfig)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from isocompute.stages.report import report

    res = report(from_namespace(ReportConfig, args))
    if res.markdown is not None:  # several models
        print(res.markdown)
        print(f"report → {res.out}")
    else:
        _print_report(res)
        _print_target(res.report.get("target"))
    return 0


def _print_target(t: Any) -> None:
    """Which target accuracy is scored on and how consensus and gold disagree (report.md's Target table has every
    method under both)."""
    if not t:
        return
    line = f"target: {t['scored_on']}"
    if t.get("agreement"):
        ag = t["agreement"]
        line += (f" (consensus vs gold: {100 * ag['sample_flip']:.1f}% of samples change verdict, the plurality is "
                 f"right on {100 * ag['plurality_right']:.1f}% of prompts)")
    print(line)


def _print_report(res: Any) -> None:
    """The held-out tables of a single-model policy's report."""
    from rich.table import Table

    from isocompute.cli.console import console

    rep, cfg = res.report, res.policy.config
    probe_info = rep["probe"]
    con = console()
    if cfg.plans:
        _print_plans_table(con, rep, res.mode, res.n_prompts, res.out)
    else:
        t = Table(title=f"held-out accuracy ({res.mode}, {res.n_prompts} prompts) → {res.out}")
        for col in ("budget", "oracle", "learned", "uniform", "heuristic", "random", "cost", "gain vs uniform [CI]",
                    "served learned", "imitation", "ceiling"):
            t.add_column(col, justify="right")
        for e in rep["budgets"]:
            m, g = e["methods"], e["gain_vs_uniform"]
            sig = "" if g["significant"] else " n.s."
            t.add_row(f"{e['budget']:.3g}", *(f"{m[k]['accuracy']:.4f}" for k in ("oracle", "learned", "uniform",
                                                                                 "heuristic", "random")),
                      f"{m['learned']['cost']:.4g}",
                      f"{100 * g['relative']:+.1f}% [{100 * g['ci95'][0]:+.1f}, {100 * g['ci95'][1]:+.1f}]{sig}",
                      f"{100 * (e['rules'] or {}).get('learned', 0.0):.0f}%",
                      f"{e['imitation_accuracy']:.3f}", f"{e['imitation_ceiling']:.3f}")
        con.print(t)
    con.print("learned = the policy as served: at each budget its never-worse chain serves the learned rule "
              "only where it beat the next rule out of fold" + (" (the fixed plan, then uniform)" if cfg.plans
                                                                 else ", else uniform")
              + " ('served learned': share of the refitted policies that served the learned rule).")
    con.print(rep["learner_comparison"]["why"])
    _print_same_accuracy(con, rep["same_accuracy"], cfg.cost_unit)
    if probe_info is not None:
        con.print(f"probe {probe_info['name']} ({probe_info['source']}): the learned policy pays "
                  f"{probe_info['cost']:.4g} {cfg.cost_unit} per request for it in every column above; "
                  f"Spearman ρ with 1-sample accuracy {probe_info['spearman_vs_accuracy_k1']:+.3f}")
    if cfg.feature_extras:
        con.print(f"extra features {', '.join(cfg.feature_extras)}: the learned policy pays "
                  f"{res.policy.feature_cost_:.4g} {cfg.cost_unit} per request for them in every column above "
                  f"(declared by the fitted policy; every refit pays the same)")


def _print_plans_table(con: Any, report: dict[str, Any], mode: str, n: int, out: Any) -> None:
    """The held-out table of a plan policy: the policy as served against its fixed plan, the best fixed
    plan of every rule family and uniform, with costs, waves and the two gains."""
    from rich.table import Table

    t = Table(title=f"held-out accuracy over plans ({mode}, {n} prompts) → {out}")
    for col in ("budget", "oracle", "learned", "fixed plan", "best fixed", "uniform", "cost", "waves",
                "gain vs uniform [CI]", "vs best fixed [CI]", "served learned / fixed"):
        t.add_column(col, justify="right")

    def gain(g: dict[str, Any] | None) -> str:
        if not g:
            return "—"
        return f"{100 * g['relative']:+.2f}% [{100 * g['ci95'][0]:+.2f}, {100 * g['ci95'][1]:+.2f}]"

    for e in report["budgets"]:
        m, rules = e["methods"], e["rules"] or {}
        acc = [f"{m[k]['accuracy']:.4f}" if k in m else "—" for k in ("oracle", "learned", "fixed_plan", "fixed_best",
                                                                       "uniform")]
        t.add_row(f"{e['budget']:.3g}", *acc, f"{m['learned']['cost']:.4g}", f"{m['learned'].get('waves', 1.0):.2f}",
                  gain(e["gain_vs_uniform"]), gain(e["gain_vs_fixed"].get("fixed_best")),
                  f"{100 * rules.get('learned', 0.0):.0f}% / {100 * rules.get('fixed_plan', 0.0):.0f}%")
    con.print(t)


def _print_same_accuracy(con: Any, same: dict[str, Any] | None, unit: str) -> None:
    """"Same accuracy for N× less": each method's cost to reach uniform's accuracy at the largest k."""
    from rich.table import Table

    if not same:
        return
    ref = same["reference"]
    alt = same["alt_unit"]
    t = Table(title=f"cost to reach the accuracy of uniform k = {ref['k']} ({ref['accuracy']:.4f}; costs "
                    f"{ref['cost']:.4g} {unit}" + (f", {ref['cost_alt']:.4g} {alt}" if alt else "") + ")")
    for col in ("method", f"{unit}", "× less", *((alt, "× less") if alt else ())):
        t.add_column(col, justify="right")
    for m, hit in same["methods"].items():
        if hit is None:
            t.add_row(m, "not reached", "—", *(("—", "—") if alt else ()))
            continue
        le = "≤ " if hit["at_lowest"] else ""
        row = [m, f"{le}{hit['cost']:.4g}", f"{hit['times_less']:.2f}×" if hit["times_less"] else "—"]
        if alt:
            row += [f"{le}{hit['cost_alt']:.4g}" if hit["cost_alt"] is not None else "—",
                    f"{hit['times_less_alt']:.2f}×" if hit["times_less_alt"] else "—"]
        t.add_row(*row)
    con.print(t)
