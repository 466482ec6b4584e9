"""Pilot-Commit vs uniform GRPO vs DAPO dynamic sampling on tiny arith: held-out accuracy against
cumulative rollouts (pilot and discarded rollouts included) and against FLOPs, several seeds.

Every method trains the same base model with plain GRPO advantages (objective ``mean``), the same group
size n and B_p, until the same cumulative rollout budget is spent; held-out accuracy is measured
every ``--eval-every`` steps (mean correctness of ``--eval-n`` samples per held-out problem at temperature
1). The named baseline is uniform GRPO: the script prints, per seed, the
rollouts each method needed to first reach the target accuracy and the ratio uniform / method (> 1:
fewer rollouts). Crossings are read on curves smoothed by a centred 3-point moving average. The target is
``--target`` or, by default, the start accuracy plus half of uniform GRPO's mean gain at its smoothed end
(so uniform reaches it mid-run); when uniform gains nothing, half of the best method's gain.

    .venv/bin/python bench/bench_grpo_allocation.py --base runs/tiny-sft --seeds 0,1,2 \\
        --budget 6000 --json bench/results/grpo_allocation.json --plot bench/results/grpo_allocation.png
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_grpo_common import crossing, held_out, parse_mix, run_curve, smooth  # noqa: E402

from isocompute.training.grpo import AlignedGRPOConfig  # noqa: E402

METHODS = ("uniform", "pilot-commit", "dynamic")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="runs/tiny-sft", help="model directory, or none for the random tiny model")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--budget", type=float, default=6000, help="cumulative rollouts per run")
    ap.add_argument("--n", type=int, default=8, help="group size (rollouts per prompt in an update)")
    ap.add_argument("--prompts-per-step", type=int, default=4)
    ap.add_argument("--pool-size", type=int, default=8, help="Pilot-Commit prompts piloted per step")
    ap.add_argument("--n-pilot", type=int, default=4)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--max-completion-length", type=int, default=64)
    ap.add_argument("--eval-problems", type=int, default=128)
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--eval-n", type=int, default=4, help="samples per held-out problem (temperature 1)")
    ap.add_argument("--target", type=float, default=None, help="accuracy target (default: uniform's mean final)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--mix", type=parse_mix, default=None,
                    help="arith difficulty weights for training and held-out problems, e.g. 1:1,2:1 (default: all)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=None)
    args = ap.parse_args(argv)

    seeds = [int(s) for s in args.seeds.split(",")]
    methods = args.methods.split(",")
    problems = held_out(args.eval_problems, mix=args.mix)
    results: dict[str, dict[int, dict]] = {m: {} for m in methods}
    for seed in seeds:
        for method in methods:
            cfg = AlignedGRPOConfig(objective="mean", num_generations=args.n, prompts_per_step=args.prompts_per_step,
                                    steps=10_000, lr=args.lr, max_completion_length=args.max_completion_length,
                                    seed=seed, threads=args.threads, allocation=method, n_pilot=args.n_pilot,
                                    pool_size=args.pool_size, max_rounds=2, mix=args.mix)
            curve, _ = run_curve(cfg, base=None if args.base == "none" else args.base, problems=problems,
                                 eval_every=args.eval_every, eval_n=args.eval_n, temperature=1.0,
                                 stop_rollouts=args.budget, max_new_tokens=args.max_completion_length)
            last = curve.points[-1]
            # informative groups per 1,000 generated rollouts: what each method buys with its sampling
            informative = (1 - curve.zero_groups) * last["used"] / args.n / last["rollouts"] * 1000
            results[method][seed] = {"points": curve.points, "seconds": curve.seconds, "rollouts": curve.rollouts,
                                     "zero_groups": curve.zero_groups, "informative_per_1k": informative}
            print(f"seed {seed} {method:>12}: acc {curve.points[0]['accuracy']:.3f} -> {last['accuracy']:.3f} "
                  f"after {last['rollouts']:.0f} rollouts ({last['used']:.0f} used, {curve.zero_groups:.0%} of "
                  f"update groups all-same, {informative:.1f} informative groups per 1k rollouts), "
                  f"{last['flops']:.3e} FLOPs, {curve.seconds:.0f} s", flush=True)

    def final(m: str) -> float:  # smoothed end of the curve, averaged over seeds
        return float(np.mean([smooth(np.array([p["accuracy"] for p in r["points"]]))[-1]
                              for r in results[m].values()]))

    start = float(np.mean([r["points"][0]["accuracy"] for runs in results.values() for r in runs.values()]))
    gain = final("uniform") - start if "uniform" in results else 0.0
    if gain <= 0:
        gain = max(final(m) - start for m in methods)
    if args.target is None and gain <= 0:
        print(f"\nno method improved on the start accuracy {start:.3f}: no target, no ratios "
              "(try another learning rate, mix or budget).")
        gain = float("nan")
    target = args.target if args.target is not None else start + 0.5 * gain
    print(f"\nstart accuracy {start:.3f}; final (smoothed, mean of seeds): "
          + ", ".join(f"{m} {final(m):.3f}" for m in methods) + f"; target accuracy {target:.3f}")
    summary: dict[str, dict[str, list[float]]] = {}
    for m in methods:
        to_roll, to_flops = [], []
        for seed in seeds:
            pts = results[m][seed]["points"]
            acc = smooth(np.array([p["accuracy"] for p in pts]))
            to_roll.append(crossing(np.array([p["rollouts"] for p in pts]), acc, target))
            to_flops.append(crossing(np.array([p["flops"] for p in pts]), acc, target))
        summary[m] = {"rollouts_to_target": to_roll, "flops_to_target": to_flops}
    base_r = np.array(summary["uniform"]["rollouts_to_target"]) if "uniform" in summary else None
    base_f = np.array(summary["uniform"]["flops_to_target"]) if "uniform" in summary else None
    print(f"{'method':>12} | rollouts to target per seed | ratio uniform/method (rollouts) | (FLOPs)")
    for m in methods:
        r, f = np.array(summary[m]["rollouts_to_target"]), np.array(summary[m]["flops_to_target"])
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio_r = base_r / r if base_r is not None else np.full_like(r, np.nan)
            ratio_f = base_f / f if base_f is not None else np.full_like(f, np.nan)
        summary[m].update(ratio_rollouts=ratio_r.tolist(), ratio_flops=ratio_f.tolist())
        print(f"{m:>12} | {', '.join(f'{v:.0f}' for v in r)} | "
              f"{', '.join(f'{v:.2f}' for v in ratio_r)} (mean of seeds {np.nanmean(ratio_r):.2f}; ratio of "
              f"means {np.nanmean(base_r) / np.nanmean(r):.2f}) | "
              f"{', '.join(f'{v:.2f}' for v in ratio_f)}")
    print("NaN: the run never reached the target within the budget.")

    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"args": vars(args), "target": target, "summary": summary,
                                               "runs": results}, indent=2, default=float) + "\n")
    if args.plot:
        plot(results, target, args.plot)
    return 0


def plot(results: dict, target: float, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, label in ((axes[0], "rollouts", "cumulative rollouts (pilot and discarded included)"),
                           (axes[1], "flops", "cumulative training FLOPs (analytic)")):
        for i, (m, runs) in enumerate(results.items()):
            for j, r in enumerate(runs.values()):
                pts = r["points"]
                ax.plot([p[key] for p in pts], [p["accuracy"] for p in pts], color=f"C{i}", alpha=0.8,
                        label=m if j == 0 else None)
        ax.axhline(target, color="grey", linestyle=":", label="target")
        ax.set_xlabel(label)
        ax.set_ylabel("held-out accuracy (T = 1)")
        ax.legend(fontsize=8)
    fig.suptitle("Rollout allocation on tiny arith (one line per seed)")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
