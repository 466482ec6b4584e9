"""Is the policy never worse than uniform on real models? import → fit → report on every real table.

For each dump in ``../shared/data/real`` (three MATH-500 boinf dumps of reasoning models, Llama-2-13B on
GSM8K and on Date Understanding from mot) the bench runs the commands a user runs:

    isocompute import boinf|mot DUMP [--problems ../shared/data/math500_test.jsonl | --task gsm8k|date] --out T
    isocompute fit T --out P --seed 0
    isocompute report T --policy P --out R            (5-fold CV × 3 seeds, the default budget grid)

and, with ``--demo``, ``fit`` + ``report`` on the demo's arith table. The named baseline is the
budget-matched **uniform** policy (every prompt the same k, adjacent k mixed to the budget) scored on
the same held-out prompts; the policy is scored *as served*, its never-worse chain included. Printed
as one table, per table and budget:

* accuracy of uniform and of the policy, the relative gain with its paired bootstrap 95% CI over
  prompts, and the share of the refitted policies whose chain served the learned rule;
* the policy's realised mean cost and its error against the budget;
* the targets: policy ≥ uniform − 0.1% relative and cost within ±2% of the budget at budgets 2, 4 and 8
  on every real table; gain ≥ +7% at budget 4 on the demo table. A miss prints as ``MISS``.

Then, per table, "same accuracy for less": the cost at which the policy, the oracle and uniform reach
the accuracy of uniform at k = 16 (from the report's ``same_accuracy``). Results go to
``--work/summary.json``; import, fit and report are skipped when their outputs exist (``--fresh`` redoes
them).

    .venv/bin/python bench/bench_real.py [--work /tmp/isocompute-bench-real] [--demo runs/demo/outcomes.jsonl]
        [--folds 5] [--seeds 3] [--only gsm8k,date] [--no-prompt] [--workers 0]

``--no-prompt`` also runs every table with its prompt text removed (each record's ``prompt`` empty, as in
dumps that ship only answers: rows ``NAME/no-prompt``): the policy must keep its budget there too.
``--workers`` runs the report's folds in that many processes (0: one per core; the same report).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from isocompute.errors import IsoComputeError
from isocompute.stages.fit import FitConfig, fit
from isocompute.stages.import_ import ImportConfig, import_samples
from isocompute.stages.options import parse_config
from isocompute.stages.report import ReportConfig, report

STAGES = {"import": (ImportConfig, import_samples), "fit": (FitConfig, fit), "report": (ReportConfig, report)}

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
TARGET_BUDGETS = (2.0, 4.0, 8.0)
TOLERANCE = 0.001  # policy ≥ uniform × (1 − 0.1%)
COST_TOLERANCE = 0.02
DEMO_GAIN = 0.07

PROBLEMS = "{data}/math500_test.jsonl"
TABLES = {  # name → (format, dump relative to DATA/real, import flags; {data} is --data)
    "math500-phi4-reasoning": ("boinf", "boinf/analysis_math500_Phi-4-reasoning.jsonl", ["--problems", PROBLEMS]),
    "math500-qwen3-14b": ("boinf", "boinf/analysis_math500_Qwen3-14B.jsonl", ["--problems", PROBLEMS]),
    "math500-gpt-oss-20b": ("boinf", "boinf/analysis_math500_gpt-oss-20b.jsonl", ["--problems", PROBLEMS]),
    "gsm8k-llama2-13b": ("mot", "mot/llama2_13b_gsm8k_pot1.json", ["--task", "gsm8k"]),
    "date-llama2-13b": ("mot", "mot/llama2_13b_date_cot1.json", ["--task", "date"]),
}


def _run(argv: list[str], log: Path) -> None:
    """One stage in-process (the library, configured from the command's arguments), its progress appended to
    ``log``; a failure stops the bench."""
    cls, stage = STAGES[argv[0]]
    with log.open("a") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
        print(f"$ isocompute {' '.join(argv)}", flush=True)
        try:
            stage(parse_config(cls, argv[1:], prog=f"isocompute {argv[0]}"))
            error = None
        except IsoComputeError as e:
            print(f"isocompute {argv[0]}: error: {e}", flush=True)
            error = e
    if error is not None:
        raise SystemExit(f"isocompute {' '.join(argv)} failed ({error}); see {log}")


def import_table(name: str, work: Path, data: Path, *, fresh: bool) -> Path:
    """``isocompute import`` of the real table ``name`` into ``work/name/outcomes.jsonl`` (skipped when it
    exists, unless ``fresh``); returns the table's path."""
    fmt, rel, flags = TABLES[name]
    d = work / name
    d.mkdir(exist_ok=True)
    table = d / "outcomes.jsonl"
    if fresh or not table.is_file():
        flags = [f.format(data=data) for f in flags]
        _run(["import", fmt, str(data / "real" / rel), *flags, "--out", str(table), "--no-progress"], d / "log.txt")
    return table


def fit_and_report(table: Path, d: Path, args: argparse.Namespace, *, fresh: bool,
                   fit_flags: Sequence[str] = ()) -> tuple[dict, float, float]:
    """``isocompute fit`` then ``report`` of ``table`` into ``d`` (each skipped when its output exists; ``fresh``
    redoes both): (report.json, fit seconds, report seconds)."""
    d.mkdir(parents=True, exist_ok=True)
    pol, rep, log = d / "policy", d / "report", d / "log.txt"
    for stale in (pol, rep) if fresh else ():
        if stale.exists():
            shutil.rmtree(stale)
    t0 = time.perf_counter()
    if not (pol / "manifest.json").is_file():
        _run(["fit", str(table), "--out", str(pol), "--seed", "0", *fit_flags], log)
    t_fit = time.perf_counter() - t0
    if not (rep / "manifest.json").is_file():
        _run(["report", str(table), "--policy", str(pol), "--out", str(rep), "--folds", str(args.folds),
              "--seeds", str(args.seeds), "--seed", "0", "--workers", str(args.workers)], log)
    report = json.loads((rep / "report.json").read_text())
    return report, t_fit, time.perf_counter() - t0 - t_fit


def without_prompts(table: Path) -> Path:
    """A copy of ``table`` beside it whose every ``prompt`` is empty (written once)."""
    out = table.with_name("outcomes-no-prompt.jsonl")
    if not out.is_file():
        with table.open() as f, out.open("w") as g:
            for line in f:
                if line.strip():
                    g.write(json.dumps({**json.loads(line), "prompt": ""}) + "\n")
    return out


def run_table(name: str, table: Path, work: Path, args: argparse.Namespace, *, fresh: bool) -> dict:
    report, t_fit, t_report = fit_and_report(table, work / name, args, fresh=fresh)
    return {"name": name, "table": str(table), "n_prompts": report["n_prompts"], "fit_s": t_fit,
            "report_s": t_report, "budgets": report["budgets"],
            "same_accuracy": report["same_accuracy"], "fallback": report["policy"]["fallback"]["ranges"]}


def check(res: dict, demo: bool) -> list[dict]:
    """Per target budget: the figures and whether each target is met."""
    rows = []
    for e in res["budgets"]:
        b = e["budget"]
        if not any(abs(b - t) < 1e-9 for t in TARGET_BUDGETS):
            continue
        m, g = e["methods"], e["gain_vs_uniform"]
        pol, uni, cost = m["learned"]["accuracy"], m["uniform"]["accuracy"], m["learned"]["cost"]
        row = {"table": res["name"], "budget": b, "uniform": uni, "policy": pol, "gain": g["relative"],
               "ci95": g["ci95"], "learned_share": (e["rules"] or {}).get("learned", 0.0), "cost": cost,
               "cost_error": cost / b - 1, "not_worse": pol >= uni * (1 - TOLERANCE),
               "cost_ok": abs(cost / b - 1) <= COST_TOLERANCE, "gain_no_fallback": (e.get("gain_no_fallback")
                                                                                    or {}).get("relative")}
        if demo and abs(b - 4.0) < 1e-9:
            row["demo_gain_ok"] = g["relative"] >= DEMO_GAIN
        rows.append(row)
    return rows


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:+.2f}%"


def print_summary(rows: list[dict], results: list[dict]) -> None:
    head = ("table", "budget", "uniform", "policy", "gain [95% CI]", "learned served", "alone", "cost (err)",
            "≥ uniform−0.1%", "cost ±2%")
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" if i == 0 else "---:" for i in range(len(head))) + "|")
    misses = 0
    for r in rows:
        ok = "ok" if r["not_worse"] else "MISS"
        cost = "ok" if r["cost_ok"] else "MISS"
        misses += (not r["not_worse"]) + (not r["cost_ok"])
        extra = ""
        if "demo_gain_ok" in r:
            extra = " (≥ +7%: " + ("ok" if r["demo_gain_ok"] else "MISS") + ")"
            misses += not r["demo_gain_ok"]
        print(f"| {r['table']} | {r['budget']:g} | {r['uniform']:.4f} | {r['policy']:.4f} | "
              f"{_pct(r['gain'])} [{_pct(r['ci95'][0])}, {_pct(r['ci95'][1])}]{extra} | "
              f"{100 * r['learned_share']:.0f}% | {_pct(r['gain_no_fallback'])} | {r['cost']:.4g} "
              f"({_pct(r['cost_error'])}) | {ok} | {cost} |")
    print()
    print("same accuracy for less: the cost (samples) to reach the accuracy of uniform k = 16")
    print("| table | target accuracy | policy | oracle | uniform |")
    print("|---|---:|---:|---:|---:|")
    for res in results:
        s = res["same_accuracy"]
        cells = []
        for m in ("learned", "oracle", "uniform"):
            hit = s["methods"].get(m)
            cells.append("not reached" if hit is None else
                         f"{'≤ ' if hit['at_lowest'] else ''}{hit['cost']:.3g} ({hit['times_less']:.2f}× less)")
        print(f"| {res['name']} | {s['reference']['accuracy']:.4f} | " + " | ".join(cells) + " |")
    print()
    print(f"{misses} target(s) missed." if misses else "every target met.")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/isocompute-bench-real"))
    ap.add_argument("--data", type=Path, default=DATA, help="directory holding real/ and math500_test.jsonl")
    ap.add_argument("--demo", type=Path, help="the demo's outcome table (runs/demo/outcomes.jsonl), for its target")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--only", help="comma list of table names to run (default: all)")
    ap.add_argument("--fresh", action="store_true", help="redo import, fit and report even when their outputs exist")
    ap.add_argument("--no-prompt", action="store_true", help="also run every table with its prompt text removed")
    ap.add_argument("--workers", type=int, default=1, help="processes for the report's folds (0: one per core)")
    args = ap.parse_args(argv)
    real = args.data / "real"
    if not real.is_dir():
        print(f"{real} is absent: nothing to measure.", file=sys.stderr)
        return 2
    args.work.mkdir(parents=True, exist_ok=True)
    names = list(TABLES) if not args.only else [n.strip() for n in args.only.split(",")]
    results, rows = [], []
    for name in names:
        t0 = time.perf_counter()
        table = import_table(name, args.work, args.data, fresh=args.fresh)
        t_import = time.perf_counter() - t0
        res = run_table(name, table, args.work, args, fresh=args.fresh)
        res["import_s"] = t_import
        print(f"{name}: {res['n_prompts']} prompts; import {t_import:.0f} s, fit {res['fit_s']:.0f} s, report "
              f"{res['report_s']:.0f} s (wall, machine shared); chain: "
              + ", ".join(f"{r} [{lo:.3g}, {hi:.3g}]" for r, lo, hi in res["fallback"]), flush=True)
        results.append(res)
        rows += check(res, demo=False)
        if args.no_prompt:
            res = run_table(f"{name}/no-prompt", without_prompts(table), args.work, args, fresh=args.fresh)
            print(f"{name}/no-prompt: fit {res['fit_s']:.0f} s, report {res['report_s']:.0f} s; chain: "
                  + ", ".join(f"{r} [{lo:.3g}, {hi:.3g}]" for r, lo, hi in res["fallback"]), flush=True)
            results.append(res)
            rows += check(res, demo=False)
    if args.demo is not None:
        res = run_table("demo-arith", args.demo, args.work, args, fresh=args.fresh)
        print(f"demo-arith: {res['n_prompts']} prompts; fit {res['fit_s']:.0f} s, report {res['report_s']:.0f} s",
              flush=True)
        results.append(res)
        rows += check(res, demo=True)
    print()
    print_summary(rows, results)
    (args.work / "summary.json").write_text(json.dumps({"rows": rows, "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
