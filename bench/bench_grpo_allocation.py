"""Pilot-Commit (plain, and with its learned screen) vs uniform GRPO vs DAPO dynamic sampling on tiny
arith: held-out accuracy against cumulative rollouts (pilot and discarded rollouts included) and against
FLOPs, several seeds. Methods: ``uniform``, ``pilot-commit``, ``dynamic``, ``pilot-commit+screen``
(:mod:`isocompute.training.screen`); ``--methods`` picks some, ``--from-json`` re-summarises runs saved by
several invocations (e.g. one per core) after their ``runs`` were merged into one file.

Every method trains the same base model with plain GRPO advantages (objective ``mean``), the same group
size n, B_p and learning rate, from the same training problems and seed, until the same cumulative
rollout budget is spent. The held-out problems and the evaluation's sampling seed are the same for every
method and seed (common random numbers), so runs differ only by their training. Two held-out metrics:

* ``ref`` (the curves, every ``--eval-every`` steps): the exact probability that a temperature-1 sample
  is the reference solution, averaged over ``--eval-problems`` problems — one forward pass per problem,
  no sampling noise. It is a lower bound of the expected accuracy that follows it closely for the tiny
  model (its correct answers almost all follow the reference; see the sampled check below).
* ``accuracy`` (the check, at the start and the end; every ``--sample-every`` steps if set): mean
  correctness of ``--eval-n`` samples at temperature 1 on the first ``--sample-problems`` problems.
  With 16 samples on 128 problems its standard error is about 0.008, as large as the differences the
  crossing times depend on — why the curves use ``ref``.

The named baseline is uniform GRPO. Per seed the script prints the rollouts (and FLOPs) each method
needed to first reach the target on its curve smoothed by a centred 3-point moving average, and the
ratio uniform / method (> 1: fewer rollouts). The target is ``--target`` or, by default, the start value
plus half of uniform GRPO's mean smoothed gain at the end of the budget (so uniform reaches it mid-run).

    .venv/bin/python bench/bench_grpo_allocation.py --base runs/tiny-sft --seeds 0,1,2 --threads 1 \\
        --json bench/results/grpo_allocation.json --plot docs/grpo-allocation.png
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_grpo_common import cached, crossing, held_out, parse_mix, run_curve, smooth  # noqa: E402

from isocompute.tasks import arith  # noqa: E402
from isocompute.training.grpo import AlignedGRPOConfig, load_base  # noqa: E402

METHODS = ("uniform", "pilot-commit", "dynamic", "pilot-commit+screen")


def flop_split(ledger: dict) -> dict[str, float]:
    """Rollout / update FLOPs and ρ = F_update / F_total in the analytic count and the RACE convention."""
    out = {}
    for conv in ("analytic", "race"):
        d = ledger[conv]
        total = d["rollout"] + d["update"] + d["reward"]
        out.update({f"{conv}_rollout": d["rollout"], f"{conv}_update": d["update"],
                    f"{conv}_rho": d["update"] / total if total else float("nan")})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="runs/tiny-sft", help="model directory, or none for the random tiny model")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--budget", type=float, default=4800, help="cumulative rollouts per run")
    ap.add_argument("--n", type=int, default=8, help="group size (rollouts per prompt in an update)")
    ap.add_argument("--prompts-per-step", type=int, default=8)
    ap.add_argument("--pool-size", type=int, default=0, help="Pilot-Commit prompts piloted per step (0: 2·B_p)")
    ap.add_argument("--n-pilot", type=int, default=0, help="Pilot-Commit pilot rollouts per prompt (0: n // 2)")
    ap.add_argument("--n-problems", type=int, default=2000, help="training prompt pool (fewer: more passes over it)")
    ap.add_argument("--staleness", type=int, default=5, help="Pilot-Commit: steps a hopeless prompt is deferred")
    ap.add_argument("--lr", type=float, default=2e-5,
                    help="AdamW learning rate (1e-4 and above made every method lower held-out accuracy)")
    ap.add_argument("--max-completion-length", type=int, default=64)
    ap.add_argument("--eval-problems", type=int, default=256, help="held-out problems for the ref curve")
    ap.add_argument("--eval-every", type=int, default=4, help="steps between ref measurements")
    ap.add_argument("--eval-n", type=int, default=16, help="samples per problem for the sampled accuracy")
    ap.add_argument("--sample-problems", type=int, default=128, help="held-out problems for the sampled accuracy")
    ap.add_argument("--sample-every", type=int, default=0,
                    help="steps between sampled-accuracy measurements (0: start and end only)")
    ap.add_argument("--target", type=float, default=None,
                    help="target on the curve (default: start + half of uniform's mean smoothed gain)")
    ap.add_argument("--target-gain", type=float, default=None,
                    help="target = the base model's start value + this, fixed before any run (wins over --target)")
    ap.add_argument("--curve", choices=("ref", "accuracy"), default="ref",
                    help="the curve the target is crossed on: ref (the tiny model) or the sampled accuracy, "
                         "measured every --eval-every steps (a pretrained model, whose solutions are its own)")
    ap.add_argument("--lora-rank", type=int, default=0, help="0: full fine-tuning; r > 0: LoRA adapters of rank r")
    ap.add_argument("--temperature", type=float, default=1.0, help="rollouts' and the sampled accuracy's temperature")
    ap.add_argument("--out-dir", default=None,
                    help="keep each finished run here (one JSON per method and seed) and skip it when rerun: "
                         "an interrupted bench resumes at the run it was in")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--mix", type=parse_mix, default=dict(arith.DEFAULT_MIX),
                    help="arith difficulty weights for training and held-out problems, e.g. 1:1,2:1,3:1 "
                         "(default: the task's default mix, what `isocompute train grpo` trains on)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=None)
    ap.add_argument("--from-json", default=None,
                    help="re-summarise (and re-plot) the runs of an earlier --json instead of training")
    args = ap.parse_args(argv)
    if args.from_json:
        return resummarise(args)

    wall = time.monotonic()
    seeds = [int(s) for s in args.seeds.split(",")]
    methods = args.methods.split(",")
    problems = held_out(args.eval_problems, mix=args.mix)
    base = None if args.base == "none" else args.base
    out_dir = Path(args.out_dir) if args.out_dir else None
    start_acc = cached(out_dir, "start", lambda: {"accuracy": start_accuracy(base, problems[: args.sample_problems],
                                                                             args)})["accuracy"]
    print(f"start: sampled accuracy {start_acc:.3f} ({args.eval_n} samples x {args.sample_problems} problems, "
          "shared by every run)", flush=True)
    if args.target_gain is not None:
        if args.curve != "accuracy":
            ap.error("--target-gain sets the target from the start accuracy: use it with --curve accuracy")
        args.target = start_acc + args.target_gain
        print(f"target: sampled accuracy {args.target:.3f} (start + {args.target_gain:g}), fixed before the runs",
              flush=True)
    results: dict[str, dict[int, dict]] = {m: {} for m in methods}
    for seed in seeds:
        for method in methods:
            results[method][seed] = cached(out_dir, f"{method}-seed{seed}", functools.partial(
                one_run, args, method, seed, base, problems, start_acc))
            curve, last = results[method][seed], results[method][seed]["points"][-1]
            print(f"seed {seed} {method:>12}: ref {curve['points'][0]['ref']:.4f} -> {last['ref']:.4f}, sampled "
                  f"accuracy {start_acc:.3f} -> {last['accuracy']:.3f} after {last['rollouts']:.0f} rollouts "
                  f"({last['step']} steps, {last['used']:.0f} used, {curve['zero_groups']:.0%} of update groups "
                  f"all-same, {curve['informative_per_1k']:.1f} informative groups per 1k rollouts), "
                  f"{last['flops']:.3e} FLOPs, {curve['seconds']:.0f} s", flush=True)

    summary = summarise(results, methods, seeds, args.target, args.curve)
    print(f"\n{args.curve} at start {summary['start']:.4f}; target {summary['target']:.4f}")
    print(f"{'method':>12} | final {args.curve} (smoothed) / sampled acc per seed | rollouts to target | "
          "ratio uniform/method: rollouts | FLOPs")
    for m in methods:
        s = summary["methods"][m]
        print(f"{m:>12} | {', '.join(f'{a:.4f}/{b:.3f}' for a, b in zip(s['final_ref'], s['final_accuracy'], strict=True))}"
              f" | {', '.join(f'{v:.0f}' for v in s['rollouts_to_target'])} | "
              f"{', '.join(f'{v:.2f}' for v in s['ratio_rollouts'])} (mean {s['mean_ratio_rollouts']:.2f}, ratio of "
              f"means {s['ratio_of_means_rollouts']:.2f}, seed-mean curve {s['mean_curve_ratio_rollouts']:.2f}) | {', '.join(f'{v:.2f}' for v in s['ratio_flops'])} "
              f"(mean {s['mean_ratio_flops']:.2f})")
    print("NaN: the run never reached the target within the budget; it needed more than it spent, so the ratio "
          "lies in an interval:")
    for m in methods:
        s = summary["methods"][m]
        if m != methods[0] and any(lo != hi for lo, hi in s["ratio_rollouts_range"]):
            print(f"{m:>12} | ratio per seed {', '.join(_span(lo, hi) for lo, hi in s['ratio_rollouts_range'])}; mean "
                  f"{_span(*s['mean_ratio_rollouts_range'])} | FLOPs {_span(*s['mean_ratio_flops_range'])}")
    for frac in (0.25, 0.75):
        ratios = summary[f"ratio_rollouts_at_{frac:g}_gain"]
        print(f"ratio uniform/method (rollouts) at start + {frac:g} x uniform's gain: " + "; ".join(
            f"{m} {', '.join(f'{v:.2f}' for v in r)}" for m, r in ratios.items() if m != "uniform"))
    one = results[methods[0]][seeds[0]]["flop_split"]
    print(f"FLOP split, {methods[0]} seed {seeds[0]}: analytic rollout {one['analytic_rollout']:.3e} + update "
          f"{one['analytic_update']:.3e}, rho {one['analytic_rho']:.3f}; RACE rollout {one['race_rollout']:.3e} + "
          f"update {one['race_update']:.3e}, rho {one['race_rho']:.3f}")
    summary["wall_seconds"] = time.monotonic() - wall
    print(f"wall time {summary['wall_seconds']:.0f} s")

    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"args": vars(args), "start_accuracy": start_acc, "summary": summary,
                                               "runs": results}, indent=2, default=float) + "\n")
    if args.plot:
        plot(results, summary["target"], args.plot, args.curve, args.base)
    return 0


def one_run(args: argparse.Namespace, method: str, seed: int, base: str | None, problems: list,
            start_acc: float) -> dict:
    """One method's run on one seed: its curve, ledger and rollout counts (see the module docstring)."""
    cfg = AlignedGRPOConfig(objective="mean", num_generations=args.n, prompts_per_step=args.prompts_per_step,
                            steps=10_000, lr=args.lr, max_completion_length=args.max_completion_length,
                            temperature=args.temperature, lora_rank=args.lora_rank,
                            seed=seed, threads=args.threads, allocation=method.removesuffix("+screen"),
                            screen=method.endswith("+screen"), n_pilot=args.n_pilot,
                            pool_size=args.pool_size, max_rounds=2, mix=args.mix,
                            n_problems=args.n_problems, staleness=args.staleness)
    by_accuracy = args.curve == "accuracy"
    curve, _ = run_curve(cfg, base=base, problems=problems, eval_every=args.eval_every, eval_n=args.eval_n,
                         temperature=args.temperature, stop_rollouts=args.budget,
                         max_new_tokens=args.max_completion_length,
                         sample_every=args.eval_every if by_accuracy else args.sample_every or 10**9,
                         sample_problems=args.sample_problems, start_accuracy=start_acc, ref=not by_accuracy,
                         label=f"seed {seed} {method}")
    last = curve.points[-1]
    # informative groups per 1,000 generated rollouts: what each method buys with its sampling
    informative = (1 - curve.zero_groups) * last["used"] / args.n / last["rollouts"] * 1000
    return {"points": curve.points, "seconds": curve.seconds, "rollouts": curve.rollouts, "ledger": curve.ledger,
            "flop_split": flop_split(curve.ledger), "zero_groups": curve.zero_groups,
            "informative_per_1k": informative}


def resummarise(args: argparse.Namespace) -> int:
    """Recompute the summary of a saved --json (rewritten in place, keeping its wall time) and its plot."""
    path = Path(args.from_json)
    data = json.loads(path.read_text())
    runs = {m: {int(k): v for k, v in r.items()} for m, r in data["runs"].items()}
    methods, seeds = list(runs), sorted(next(iter(runs.values())))
    curve = data["args"].get("curve", "ref")
    summary = summarise(runs, methods, seeds, data["args"]["target"], curve)
    summary["wall_seconds"] = data["summary"].get("wall_seconds")
    data["summary"] = summary
    path.write_text(json.dumps(data, indent=2, default=float) + "\n")
    for m in methods:
        s = summary["methods"][m]
        print(f"{m:>12}: rollouts to target {', '.join(f'{v:.0f}' for v in s['rollouts_to_target'])}; ratio "
              f"{', '.join(f'{v:.2f}' for v in s['ratio_rollouts'])} (mean {s['mean_ratio_rollouts']:.2f}, "
              f"seed-mean curve {s['mean_curve_ratio_rollouts']:.2f}); FLOPs ratio "
              f"{', '.join(f'{v:.2f}' for v in s['ratio_flops'])}")
    if args.plot:
        plot(runs, summary["target"], args.plot, curve, data["args"].get("base"))
    return 0


def start_accuracy(base: str | None, problems: list, args: argparse.Namespace) -> float:
    """Sampled accuracy of the base model: every run starts from it, so it is measured once."""
    import torch

    from isocompute.training.evaluation import evaluate

    torch.set_num_threads(args.threads)
    model, tok = load_base(base)
    return evaluate(model, tok, problems, n=args.eval_n, ks=(1,), temperature=args.temperature,
                    max_new_tokens=args.max_completion_length, seed=0).accuracy


def summarise(results: dict, methods: list[str], seeds: list[int], target: float | None, key: str = "ref") -> dict:
    """Target, rollouts/FLOPs to target per seed and the uniform / method ratios on the ``key`` curve
    (``ref`` or ``accuracy``; see the module docstring)."""

    def final(m: str, s: int) -> float:  # smoothed end of the curve
        return float(_curve(results[m][s], key)[-1])

    start = float(np.mean([r["points"][0][key] for runs in results.values() for r in runs.values()]))
    ref_method = "uniform" if "uniform" in methods else methods[0]
    gain = float(np.mean([final(ref_method, s) for s in seeds])) - start
    if target is None:
        target = start + 0.5 * gain if gain > 0 else float("nan")
    out: dict = {"start": start, "target": target, "uniform_gain": gain, "methods": {}}
    for m in methods:
        to_roll, to_flops = [], []
        for s in seeds:
            pts = results[m][s]["points"]
            y = _curve(results[m][s], key)
            to_roll.append(crossing(np.array([p["rollouts"] for p in pts], float), y, target))
            to_flops.append(crossing(np.array([p["flops"] for p in pts], float), y, target))
        out["methods"][m] = {"rollouts_to_target": to_roll, "flops_to_target": to_flops,
                             "final_ref": [final(m, s) for s in seeds], "curve": key,
                             "final_accuracy": [results[m][s]["points"][-1]["accuracy"] for s in seeds],
                             "seconds": [results[m][s]["seconds"] for s in seeds]}
    # robustness of the headline: the same ratios at a quarter and three quarters of uniform's gain
    for frac in (0.25, 0.75):
        t = start + frac * gain if gain > 0 else float("nan")
        cross = {m: np.array([crossing(np.array([p["rollouts"] for p in results[m][s]["points"]], float),
                                       _curve(results[m][s], key), t) for s in seeds]) for m in methods}
        with np.errstate(divide="ignore", invalid="ignore"):
            out[f"ratio_rollouts_at_{frac:g}_gain"] = {m: (cross[ref_method] / cross[m]).tolist() for m in methods}
    # the crossing of the seed-mean curve (the thick line of the plot), a steadier single number
    for m in methods:
        xs, ys = mean_curve(results[m], "rollouts", key)
        out["methods"][m]["mean_curve_rollouts_to_target"] = crossing(xs, ys, target)
    base_r = np.array(out["methods"][ref_method]["rollouts_to_target"])
    base_f = np.array(out["methods"][ref_method]["flops_to_target"])
    for m in methods:
        s = out["methods"][m]
        r, f = np.array(s["rollouts_to_target"]), np.array(s["flops_to_target"])
        with np.errstate(divide="ignore", invalid="ignore"):
            s["ratio_rollouts"], s["ratio_flops"] = (base_r / r).tolist(), (base_f / f).tolist()
            s["mean_ratio_rollouts"] = float(np.mean(s["ratio_rollouts"]))
            s["mean_ratio_flops"] = float(np.mean(s["ratio_flops"]))
            s["ratio_of_means_rollouts"] = float(np.mean(base_r) / np.mean(r))
            s["mean_curve_ratio_rollouts"] = float(np.divide(out["methods"][ref_method]["mean_curve_rollouts_to_target"],
                                                             s["mean_curve_rollouts_to_target"]))
    for unit, key_ in (("rollouts", "rollouts"), ("flops", "flops")):
        spans = {m: _to_target_span(out["methods"][m][f"{unit}_to_target"],
                                    [results[m][sd]["points"][-1][key_] for sd in seeds]) for m in methods}
        for m in methods:
            lo, hi = spans[ref_method][0] / spans[m][1], spans[ref_method][1] / spans[m][0]
            out["methods"][m][f"ratio_{unit}_range"] = np.stack([lo, hi], axis=1).tolist()
            out["methods"][m][f"mean_ratio_{unit}_range"] = [float(lo.mean()), float(hi.mean())]
    return out


def _to_target_span(to_target: list[float], spent: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """What a run needed to reach the target, as an interval: the crossing where it reached it, and more
    than all it spent (``spent``, to infinity) where it never did — a censored run bounds the ratio."""
    t = np.array(to_target, float)
    reached = np.isfinite(t)
    return np.where(reached, t, np.array(spent, float)), np.where(reached, t, np.inf)


def _span(lo: float, hi: float) -> str:
    return f"{lo:.2f}" if lo == hi else f"[{lo:.2f}, {hi:.2f}]"


def mean_curve(runs: dict, key: str, curve: str = "ref", points: int = 60) -> tuple[np.ndarray, np.ndarray]:
    """The seeds' ``curve`` values averaged on a common grid of ``key`` (rollouts or FLOPs), up to the
    shortest run."""
    grids = [(np.array([p[key] for p in r["points"]], float), _points(r, curve)) for r in runs.values()]
    xs = np.linspace(0, min(g[0][-1] for g in grids), points)
    return xs, np.mean([np.interp(xs, gx, gy) for gx, gy in grids], axis=0)


def _points(run: dict, curve: str) -> np.ndarray:
    """The run's ``curve`` value at each measured point."""
    return np.array([p[curve] for p in run["points"]], float)


def _curve(run: dict, curve: str = "ref") -> np.ndarray:
    """The curve smoothed for crossings; the start is one shared measurement and stays as measured."""
    raw = _points(run, curve)
    return np.concatenate([raw[:1], smooth(raw)[1:]])


def plot(results: dict, target: float, path: str, curve: str = "ref", base: str | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, label in ((axes[0], "rollouts", "cumulative rollouts (pilot and discarded included)"),
                           (axes[1], "flops", "cumulative training FLOPs (analytic)")):
        for i, (m, runs) in enumerate(results.items()):
            for r in runs.values():
                ax.plot([p[key] for p in r["points"]], _points(r, curve), color=f"C{i}", alpha=0.3, linewidth=0.8)
            ax.plot(*mean_curve(runs, key, curve), color=f"C{i}", linewidth=2, label=f"{m} (mean of {len(runs)} seeds)")
        if np.isfinite(target):
            ax.axhline(target, color="grey", linestyle=":", label="target")
        ax.set_xlabel(label)
        ax.set_ylabel("held-out P(reference solution), T = 1" if curve == "ref" else "held-out sampled accuracy")
        ax.legend(fontsize=8)
    model = Path(base).name if base and base != "none" else "the random tiny model"
    fig.suptitle(f"GRPO rollout allocation on arith, {model} (thin: one seed; thick: mean)")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
