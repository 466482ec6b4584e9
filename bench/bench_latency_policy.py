"""The learned policy as served under a token and a latency budget, against uniform maj@k in the same run, on
every outcome table with token counts given (the MATH-500 dumps of three reasoning models).

Per table: ``fit --plans default --cost-unit tokens --budgets 1x:16x --latency-budgets LO:HI`` (the default
menu holds the parallel-stop plans in this unit; LO = the quickest plan's mean latency on the table,
rounded up, HI = ``--latency-hi``), then ``report`` (5-fold CV, ``--seeds``), whose ``reach`` block is
read back and checked against the issue's targets:

1. at latency ≤ uniform@16's: uniform@16's accuracy (within 0.2 pt) at ≤ 1/3 of its tokens;
2. at latency ≤ 1.0 (one sample's wait): at least uniform@4's accuracy (the sweep's best within 1.0);
3. never below uniform at matched tokens and latency: at each point of each reach sweep, the policy's
   accuracy minus uniform's with no more tokens and no more latency than the policy realised there
   (uniform@k, k = 1 … 16, and mixes of adjacent ones; means over the held-out prompts, no CI here);
4. realised tokens within ±5% of the budget at the report's budgets (no latency budget).

``--no-prompt`` runs every table with its prompt text removed (every ``prompt`` empty, as in dumps that ship
only answers): the budget must hold there too.

    python -m isocompute import boinf analysis_math500_gpt-oss-20b.jsonl --problems math500_test.jsonl \\
        --out /tmp/lat/gpt-oss-20b.jsonl        # likewise Qwen3-14B, Phi-4-reasoning
    python bench/bench_latency_policy.py /tmp/lat/*.jsonl --out /tmp/latbench
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

from isocompute.cli import main as cli
from isocompute.policy.latency import latency_units
from isocompute.policy.plans.arrays import plan_arrays
from isocompute.policy.plans.menu import resolve_plans
from isocompute.solver.outcomes import read_outcomes

ACTIONS = (1, 2, 4, 8, 16)


def table_facts(table_path: Path, overhead: float) -> tuple[float, list[dict]]:
    """(the quickest plan's mean latency on the table in sample lengths, rounded up to 3 decimals; the
    uniform ladder none@k, k ∈ ACTIONS, as {tokens, accuracy, latency} on the whole table)."""
    table = read_outcomes(table_path)
    menu = resolve_plans("default", ACTIONS, parallel=True)
    arr = plan_arrays(table, menu, cost_unit="tokens")
    lat = latency_units(arr, overhead)
    names = [p.name for p in menu]
    ladder = [{"tokens": float(arr.tokens[:, j].mean()), "accuracy": float(arr.utility[:, j].mean()),
               "latency": float(lat[:, j].mean())} for j in (names.index(f"none@{k}") for k in ACTIONS)]
    return math.ceil(float(lat.mean(axis=0).min()) * 1000) / 1000, ladder


def uniform_at(tokens: float, latency: float, ladder: list[dict]) -> float:
    """Uniform's accuracy with mean tokens ≤ ``tokens`` and mean latency ≤ ``latency``: along the ladder
    none@1 → none@2 → … → none@16 (mixing adjacent ones), tokens and latency both grow, so the best feasible mix
    is at the lower of the two positions where each limit binds (flat beyond the ends)."""
    idx = np.arange(len(ladder), dtype=np.float64)
    t, a, lat = (np.array([e[k] for e in ladder]) for k in ("tokens", "accuracy", "latency"))
    s = min(np.interp(tokens, t, idx), np.interp(latency, lat, idx))
    return float(np.interp(s, idx, a))


def check_table(path: Path, out: Path, args: argparse.Namespace) -> dict:
    t0 = time.perf_counter()
    lo, ladder = table_facts(path, args.wave_overhead)
    pol, rep = out / f"pol-{path.stem}", out / f"rep-{path.stem}"
    assert cli(["fit", str(path), "--plans", "default", "--cost-unit", "tokens", "--budgets", "1x:16x",
                "--latency-budgets", f"{lo}:{args.latency_hi}", "--wave-overhead", str(args.wave_overhead),
                "--seed", "0", "--out", str(pol)]) == 0
    assert cli(["report", "--policy", str(pol), str(path), "--folds", "5", "--seeds", str(args.seeds),
                "--workers", str(args.workers), "--out", str(rep)]) == 0
    r = json.loads((rep / "report.json").read_text())
    unit = r["latency_unit_tokens"]
    print(f"\n{path.stem}: {r['n_prompts']} prompts, 1x = {unit:,.0f} tokens, latency range {lo}:{args.latency_hi}, "
          f"{time.perf_counter() - t0:.0f} s")
    print("  reference          acc    tokens  latency  ≤lat   policy tokens  policy lat  ratio [95% CI]   best acc")
    for e in r["reach"]:
        ci = e["ratio_ci95"]
        ratio = "not reached" if e["ratio"] is None else (
            f"{e['ratio']:.3f} [{ci[0] if ci[0] is None else round(ci[0], 3)}, "
            f"{ci[1] if ci[1] is None else round(ci[1], 3)}]")
        pt = "—" if e["policy_tokens"] is None else f"{e['policy_tokens']:,.0f}"
        pl = "—" if e["policy_latency"] is None else f"{e['policy_latency']:.3f}"
        print(f"  {e['reference']:<12} {e['accuracy']:.4f} {e['tokens']:9,.0f}  {e['latency']:.3f}  "
              f"{e['max_latency']:.3f}  {pt:>13}  {pl:>10}  {ratio:<22} {e['best_accuracy']}")
    worst = None
    for e in r["reach"]:
        s = e["sweep"]
        for acc, tok, lat in zip(s["accuracy"], s["tokens"], s["latency"], strict=True):
            uni = uniform_at(tok, lat, ladder)
            if worst is None or acc - uni < worst[0]:
                worst = (acc - uni, e["reference"], e["max_latency"], tok)
    errors = [(e["budget"], e["methods"]["learned"]["cost"] / e["budget"] - 1) for e in r["budgets"]]
    u16, one = r["reach"][2], r["reach"][-1]
    out_row = {"table": path.stem, "u16_ratio": u16["ratio"], "u16_ratio_ci": u16["ratio_ci95"],
               "one_sample_best": one["best_accuracy"], "u4_accuracy": one["accuracy"],
               "worst_vs_uniform": worst, "cost_errors": errors}
    print(f"  target 1 (uniform@16 at ≤ 1/3 of its tokens, no slower): "
          f"{'met' if u16['ratio'] is not None and u16['ratio'] <= 1 / 3 else 'MISSED'} (ratio {u16['ratio']})")
    print(f"  target 2 (≥ uniform@4's accuracy within one sample's wait): "
          f"{'met' if one['best_accuracy'] is not None and one['best_accuracy'] >= one['accuracy'] else 'MISSED'} "
          f"(best {one['best_accuracy']} vs {one['accuracy']:.4f})")
    if worst is not None:
        print(f"  target 3 (never below uniform at matched tokens and latency): worst policy − uniform "
              f"{worst[0]:+.4f} ({worst[1]} sweep, latency ≤ {worst[2]:.3f}, {worst[3]:,.0f} tokens)")
    bad = [(b, e) for b, e in errors if abs(e) > 0.05]
    print(f"  target 4 (realised tokens within ±5%): {len(errors) - len(bad)}/{len(errors)} budgets"
          + ("" if not bad else " — missed at " + ", ".join(f"{b:,.0f} ({e:+.1%})" for b, e in bad)))
    return out_row


def without_prompts(table: Path, out: Path) -> Path:
    """A copy of ``table`` in ``out`` whose every ``prompt`` is empty (as in dumps that ship only answers)."""
    path = out / f"{table.stem}-no-prompt.jsonl"
    with table.open() as f, path.open("w") as g:
        for line in f:
            if line.strip():
                g.write(json.dumps({**json.loads(line), "prompt": ""}) + "\n")
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tables", type=Path, nargs="+")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--latency-hi", type=float, default=4.0)
    ap.add_argument("--wave-overhead", type=float, default=0.0)
    ap.add_argument("--no-prompt", action="store_true", help="run every table with its prompt text removed instead")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    tables = [without_prompts(p, args.out) for p in args.tables] if args.no_prompt else args.tables
    rows = [check_table(p, args.out, args) for p in tables]
    (args.out / "summary.json").write_text(json.dumps(rows, indent=2) + "\n")
    print(f"\nsummary → {args.out / 'summary.json'}")


if __name__ == "__main__":
    main()
