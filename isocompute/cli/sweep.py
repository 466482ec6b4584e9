"""``isocompute sweep``: IsoCompute grids over (n, B_p, M) and the RACE diagnostic.

    isocompute sweep grid --budgets 512,1024 --n 2,4,8 --prompts-per-step 2,4 --out sweep/grid.jsonl
    isocompute sweep run --grid sweep/grid.jsonl --base runs/tiny-sft --out sweep   # resumable
    isocompute sweep report --runs sweep/runs.jsonl --out sweep/report [--metric accuracy]

``run`` trains each grid point with :func:`isocompute.training.grpo.train_grpo`, evaluates it on held-out
arith and appends one JSON line to ``runs.jsonl`` (``rho`` in the RACE convention, ``rho_analytic``
beside it); points already there are skipped, so an interrupted sweep resumes. ``report`` reads any
JSONL of runs with ``n``, ``prompts_per_step``, ``steps``, ``rho`` and the metric.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from isocompute.errors import InputError


def _ints(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _mix(text: str) -> dict[int, float]:
    try:
        return {int(k): float(v) for k, v in (part.split(":") for part in text.split(",") if part)}
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LEVEL:WEIGHT pairs like 1:1,2:0.5, got {text!r}") from None


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("sweep", help="IsoCompute grids and the RACE allocation diagnostic",
                              description="Plan, run and analyse IsoCompute sweeps of GRPO post-training.")
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    g = sub.add_parser("grid", help="list every (n, B_p, M) with n·B_p·M equal to a budget")
    g.add_argument("--budgets", type=_ints, required=True, help="rollout budgets C, comma-separated")
    g.add_argument("--n", type=_ints, required=True, help="rollouts per problem, comma-separated")
    g.add_argument("--prompts-per-step", type=_ints, required=True, help="problems per batch B_p")
    g.add_argument("--lora-ranks", type=_ints, default=[0], help="LoRA ranks (0 = full fine-tuning)")
    g.add_argument("--out", help="write the grid as JSONL here (default: print it)")
    g.set_defaults(func=_grid)

    r = sub.add_parser("run", help="train and evaluate every grid point (resumable)")
    r.add_argument("--grid", required=True, help="grid JSONL from `isocompute sweep grid`")
    r.add_argument("--out", required=True, help="sweep directory (runs.jsonl, one model per point)")
    r.add_argument("--base", default=None, help="model directory to start from (default: random-init tiny)")
    r.add_argument("--objective", default="mean", help="training objective (default: %(default)s)")
    r.add_argument("--lr", type=float, default=5e-4, help="learning rate (default: %(default)s)")
    r.add_argument("--eval-problems", type=int, default=64, help="held-out problems (default: %(default)s)")
    r.add_argument("--eval-n", type=int, default=4, help="samples per held-out problem (default: %(default)s)")
    r.add_argument("--max-completion-length", type=int, default=96)
    r.add_argument("--mix", type=_mix, default=None,
                   help="arith difficulty weights for training and held-out problems, e.g. 1:1,2:1,3:1")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--threads", type=int, default=1)
    r.set_defaults(func=_run)

    a = sub.add_parser("report", help="best n per level, RACE per band, family comparison, plots")
    a.add_argument("--runs", required=True, help="JSONL of finished runs")
    a.add_argument("--out", required=True, help="report directory")
    a.add_argument("--metric", default="reward", help="run field to maximise (default: %(default)s)")
    a.set_defaults(func=_report)


def _grid(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from isocompute.training.sweep import iso_grid

    points = iso_grid(args.budgets, args.n, args.prompts_per_step, lora_ranks=args.lora_ranks)
    text = "".join(json.dumps({**asdict(p), "rollouts": p.rollouts, "band": f"C={p.rollouts}"}) + "\n"
                   for p in points)
    if args.out:
        from isocompute.artifacts import atomic_write_text

        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(args.out, text)
        print(f"wrote {len(points)} grid points to {args.out}")
    else:
        print(text, end="")
    return 0


def _read_jsonl(path: str | Path, what: str) -> list[dict[str, Any]]:
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise InputError(f"cannot read {what} {path}: {e.strerror or e}; check the path.") from None
    try:
        return [json.loads(line) for line in lines if line.strip()]
    except json.JSONDecodeError as e:
        raise InputError(f"{what} {path} has a line that is not JSON ({e}); fix or delete that line.") from None


def _key(d: dict[str, Any]) -> tuple[int, int, int, int]:
    return int(d["n"]), int(d["prompts_per_step"]), int(d["steps"]), int(d.get("lora_rank", 0))


def _run(args: argparse.Namespace) -> int:
    from isocompute.tasks import arith
    from isocompute.training import tiny
    from isocompute.training.evaluation import evaluate
    from isocompute.training.grpo import AlignedGRPOConfig, train_grpo

    points = _read_jsonl(args.grid, "grid")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs_path = out / "runs.jsonl"
    done = {_key(d) for d in _read_jsonl(runs_path, "runs")} if runs_path.exists() else set()
    held_out = arith.generate(args.eval_problems, seed=args.seed + 1, mix=args.mix)
    for i, point in enumerate(points):
        key = _key(point)
        if key in done:
            continue
        n, bp, m, rank = key
        cfg = AlignedGRPOConfig(objective=args.objective, num_generations=n, prompts_per_step=bp, steps=m,
                                lora_rank=rank, lr=args.lr, max_completion_length=args.max_completion_length,
                                seed=args.seed, threads=args.threads, log_every=max(1, m // 10), mix=args.mix)
        model_dir = out / "models" / f"n{n}-bp{bp}-m{m}-r{rank}"
        res = train_grpo(cfg, model_dir, base=args.base)
        model, tok = tiny.load_tiny(model_dir)
        ev = evaluate(model, tok, held_out, n=args.eval_n, ks=sorted({1, args.eval_n}),
                      max_new_tokens=args.max_completion_length, seed=args.seed)
        train_correct = [e["objective/correct"] for e in res.log if "objective/correct" in e]
        tail = train_correct[-max(1, len(train_correct) // 4):] or [float("nan")]
        led = res.ledger
        record = {**point, "rollouts": led.samples, "flops": led.race.total, "flops_analytic": led.analytic.total,
                  "rho": led.race_rho, "rho_analytic": led.rho, "reward": sum(tail) / len(tail),
                  **ev.summary(), "objective": args.objective, "seconds": round(res.seconds, 1)}
        with runs_path.open("a", encoding="utf-8") as f:  # one complete line per finished point
            f.write(json.dumps(record) + "\n")
        print(f"[{i + 1}/{len(points)}] n={n} B_p={bp} M={m} r={rank}: accuracy {ev.accuracy:.3f}, "
              f"rho {led.race_rho:.3f}, {res.seconds:.0f} s")
    return 0


def _report(args: argparse.Namespace) -> int:
    from isocompute.training.sweep import SweepRun
    from isocompute.training.sweep_report import analyse, write_report

    runs = [SweepRun.from_dict(d, metric=args.metric) for d in _read_jsonl(args.runs, "runs")]
    if not runs:
        raise InputError(f"{args.runs} has no runs; run `isocompute sweep run` first.")
    analysis = analyse(runs, metric=args.metric)
    paths = write_report(analysis, runs, args.out)
    print(f"best n with compute: {analysis.trend}")
    for fit in analysis.race:
        print(f"RACE {fit.band}: {fit.decision} (validate at rho {fit.rho_star:.3f}"
              f"{', ' + fit.direction if fit.direction else ''}) — {fit.reason}")
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0
