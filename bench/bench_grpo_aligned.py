"""maj@8-aligned GRPO vs plain GRPO at equal training FLOPs on tiny arith, and what each serves.

For each seed, two runs from the same base with the same n, B_p and learning rate, stopped at the same
analytic training-FLOP budget: plain GRPO (objective ``mean``, the named baseline) and the maj@8-aligned
objective. Each final model samples 8 completions at temperature 1 for every held-out test problem:

* held-out maj@8 (exact U-statistic over the 8 samples); the difference aligned − plain with a 95 %
  interval over problems (paired: per-problem values averaged over seeds) and the per-seed differences;
* served accuracy at a budget of 4 samples per request: uniform maj@4, the allocation policy
  (:class:`isocompute.policy.policy.Policy`, LightGBM on prompt features, fitted on a separate
  calibration set sampled from the same model, actions 1, 2, 4, 8) — per request through its calibrated
  knob (``policy``, whose realised mean k may differ from 4) and with the knob solved on the test batch so
  the mean k is the budget (``policy_batch``) — and the per-prompt oracle at the same mean budget (an upper
  bound: it sees the test outcomes).

The defaults are the setting where plain GRPO measurably learns (``bench_grpo_allocation.py``: levels
1-3, lr 2e-5, B_p 8; at lr 1e-4 and above every objective lowered held-out accuracy).

    .venv/bin/python bench/bench_grpo_aligned.py --base runs/tiny-sft --seeds 0,1,2 --threads 1 \\
        --json bench/results/grpo_aligned.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_grpo_common import held_out, parse_mix, run_curve  # noqa: E402

from isocompute.training.evaluation import evaluate, mean_ci  # noqa: E402
from isocompute.training.grpo import AlignedGRPOConfig  # noqa: E402

ACTIONS = (1, 2, 4, 8)


def served(model, tok, cal, test, *, seed: int, max_new_tokens: int, budget: float):
    """(test EvalResult, {uniform maj@4, policy at budget, oracle at budget})."""
    from isocompute.policy.policy import Policy, PolicyConfig
    from isocompute.solver.allocate import allocate

    ev_cal = evaluate(model, tok, cal, n=8, ks=ACTIONS, max_new_tokens=max_new_tokens, seed=seed + 100)
    ev = evaluate(model, tok, test, n=8, ks=ACTIONS, max_new_tokens=max_new_tokens, seed=seed + 200)
    C = np.tile(np.array(ACTIONS, dtype=float), (len(test), 1))
    policy = Policy(PolicyConfig(actions=ACTIONS, budget_range=(1.0, 8.0), min_data_in_leaf=5, n_rounds=50,
                                 seed=seed))
    policy.fit_arrays([p.prompt for p in cal], ev_cal.maj, np.tile(np.array(ACTIONS, float), (len(cal), 1)))
    dec = policy.decide([p.prompt for p in test], budget)
    batch = policy.decide([p.prompt for p in test], budget, match="batch")
    rows = np.arange(len(test))
    out = {"uniform_maj@4": float(ev.maj[:, ACTIONS.index(4)].mean()),
           "policy": float(ev.maj[rows, dec.action_index].mean()), "policy_mean_k": float(dec.k.mean()),
           "policy_batch": float(ev.maj[rows, batch.action_index].mean()), "policy_batch_mean_k": float(batch.k.mean()),
           "oracle": float(allocate(ev.maj, C, budget).mean_utility)}
    return ev, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="runs/tiny-sft", help="model directory, or none for the random tiny model")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--objectives", default="mean,maj@8", help="baseline first")
    ap.add_argument("--flops", type=float, default=1.2e12, help="analytic training FLOPs per run")
    ap.add_argument("--n", type=int, default=12, help="rollouts per prompt (≥ 9 for maj@8)")
    ap.add_argument("--prompts-per-step", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--max-completion-length", type=int, default=64)
    ap.add_argument("--test-problems", type=int, default=256)
    ap.add_argument("--cal-problems", type=int, default=128)
    ap.add_argument("--budget", type=float, default=4.0, help="served mean samples per request")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--mix", type=parse_mix, default=parse_mix("1:1,2:1,3:1"),
                    help="arith difficulty weights for training and held-out problems (default 1:1,2:1,3:1)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    wall = time.monotonic()

    seeds = [int(s) for s in args.seeds.split(",")]
    objectives = args.objectives.split(",")
    test = held_out(args.test_problems, mix=args.mix)
    cal = held_out(args.cal_problems, seed=8, mix=args.mix)
    base = None if args.base == "none" else args.base
    per: dict[str, dict[int, dict]] = {o: {} for o in objectives}
    maj8: dict[str, list[np.ndarray]] = {o: [] for o in objectives}
    # the untrained base, served the same way: what GRPO changes at all
    import torch

    from isocompute.training.grpo import load_base

    torch.set_num_threads(args.threads)
    model, tok = load_base(base)
    ev, serve = served(model, tok, cal, test, seed=0, max_new_tokens=args.max_completion_length, budget=args.budget)
    start = {**ev.summary(), **{f"served/{k}": v for k, v in serve.items()}}
    print(f"base model: maj@8 {start['maj@8']:.3f}, acc {ev.accuracy:.3f}; served@{args.budget:g}: uniform "
          f"{serve['uniform_maj@4']:.3f}, policy {serve['policy']:.3f} (mean k {serve['policy_mean_k']:.2f}), "
          f"batch-matched {serve['policy_batch']:.3f} (mean k {serve['policy_batch_mean_k']:.2f}), "
          f"oracle {serve['oracle']:.3f}", flush=True)
    for seed in seeds:
        for obj in objectives:
            cfg = AlignedGRPOConfig(objective=obj, num_generations=args.n, prompts_per_step=args.prompts_per_step,
                                    steps=10_000, lr=args.lr, max_completion_length=args.max_completion_length,
                                    seed=seed, threads=args.threads, mix=args.mix)
            curve, (model, tok) = run_curve(cfg, base=base, problems=test[:16], eval_every=10**9,
                                            stop_flops=args.flops, max_new_tokens=args.max_completion_length,
                                            keep_model=True)
            ev, serve = served(model, tok, cal, test, seed=seed, max_new_tokens=args.max_completion_length,
                               budget=args.budget)
            maj8[obj].append(ev.metric("maj@8"))
            per[obj][seed] = {**ev.summary(), **{f"served/{k}": v for k, v in serve.items()},
                              "flops": curve.ledger["analytic"], "rollouts": curve.rollouts["total"],
                              "steps": curve.points[-1]["step"], "seconds": curve.seconds,
                              "ledger": curve.ledger}
            print(f"seed {seed} {obj:>6}: {per[obj][seed]['steps']} steps, {curve.rollouts['total']} rollouts, "
                  f"maj@8 {ev.summary()['maj@8']:.3f}, acc {ev.accuracy:.3f}; served@{args.budget:g}: "
                  f"uniform {serve['uniform_maj@4']:.3f}, policy {serve['policy']:.3f} "
                  f"(mean k {serve['policy_mean_k']:.2f}), batch-matched {serve['policy_batch']:.3f} "
                  f"(mean k {serve['policy_batch_mean_k']:.2f}), oracle {serve['oracle']:.3f}; training "
                  f"{curve.seconds:.0f} s", flush=True)

    base_obj, aligned = objectives[0], objectives[-1]
    a, b = np.mean(maj8[aligned], axis=0), np.mean(maj8[base_obj], axis=0)
    diff_mean, lo, hi = mean_ci(a - b)
    seed_diffs = [float(x.mean() - y.mean()) for x, y in zip(maj8[aligned], maj8[base_obj], strict=True)]
    print(f"\nheld-out maj@8: {aligned} {a.mean():.3f} vs {base_obj} {b.mean():.3f}; difference {diff_mean:+.3f} "
          f"(95% CI over {len(a)} problems, seeds averaged: [{lo:+.3f}, {hi:+.3f}]); per seed "
          f"{', '.join(f'{d:+.3f}' for d in seed_diffs)}")
    for key in ("served/uniform_maj@4", "served/policy", "served/policy_mean_k", "served/policy_batch",
                "served/policy_batch_mean_k", "served/oracle"):
        vals = {o: np.mean([per[o][s][key] for s in seeds]) for o in objectives}
        print(f"{key:>22}: " + ", ".join(f"{o} {v:.3f}" for o, v in vals.items()))
    seconds = time.monotonic() - wall
    print(f"wall time {seconds:.0f} s")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"args": vars(args), "base": start, "runs": per, "maj8_difference": {
            "mean": diff_mean, "ci95": [lo, hi], "per_seed": seed_diffs}, "wall_seconds": seconds},
            indent=2, default=float) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
