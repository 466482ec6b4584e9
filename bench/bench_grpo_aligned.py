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
import functools
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_grpo_common import cached, held_out, parse_mix, run_curve  # noqa: E402

from isocompute.training.evaluation import evaluate, mean_ci  # noqa: E402
from isocompute.training.grpo import AlignedGRPOConfig  # noqa: E402

ACTIONS = (1, 2, 4, 8)


def served(model, tok, cal, test, *, seed: int, max_new_tokens: int, budget: float, temperature: float = 1.0):
    """(test EvalResult, {uniform maj@4, policy at budget, oracle at budget})."""
    from isocompute.policy.policy import Policy, PolicyConfig
    from isocompute.solver.allocate import allocate

    ev_cal = evaluate(model, tok, cal, n=8, ks=ACTIONS, max_new_tokens=max_new_tokens, seed=seed + 100,
                      temperature=temperature)
    ev = evaluate(model, tok, test, n=8, ks=ACTIONS, max_new_tokens=max_new_tokens, seed=seed + 200,
                  temperature=temperature)
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
    choice = policy.rule_at(budget)  # which rule of the never-worse chain serves, and why
    out.update(policy_rule=choice.rule, policy_rule_why=choice.why)
    return ev, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="runs/tiny-sft", help="model directory, or none for the random tiny model")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--objectives", default="mean,maj@8", help="baseline first; each other one is compared with it")
    ap.add_argument("--flops", type=float, default=1.2e12, help="analytic training FLOPs per run")
    ap.add_argument("--n", type=int, default=12, help="rollouts per prompt (≥ 9 for maj@8)")
    ap.add_argument("--prompts-per-step", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--lora-rank", type=int, default=0, help="0: full fine-tuning; r > 0: LoRA adapters of rank r")
    ap.add_argument("--temperature", type=float, default=1.0, help="rollouts' and the evaluations' temperature")
    ap.add_argument("--max-completion-length", type=int, default=64)
    ap.add_argument("--test-problems", type=int, default=256)
    ap.add_argument("--cal-problems", type=int, default=128)
    ap.add_argument("--budget", type=float, default=4.0, help="served mean samples per request")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--mix", type=parse_mix, default=parse_mix("1:1,2:1,3:1"),
                    help="arith difficulty weights for training and held-out problems (default 1:1,2:1,3:1)")
    ap.add_argument("--out-dir", default=None,
                    help="keep the base model's and each finished run's results here (one JSON each) and skip "
                         "them when rerun: an interrupted bench resumes at the run it was in")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    wall = time.monotonic()

    seeds = [int(s) for s in args.seeds.split(",")]
    objectives = args.objectives.split(",")
    test = held_out(args.test_problems, mix=args.mix)
    cal = held_out(args.cal_problems, seed=8, mix=args.mix)
    base = None if args.base == "none" else args.base
    out_dir = Path(args.out_dir) if args.out_dir else None
    # the untrained base, served the same way: what GRPO changes at all
    start = cached(out_dir, "base", functools.partial(base_run, args, base, cal, test))
    serve = start["served"]
    print(f"base model: maj@8 {start['summary']['maj@8']:.3f}, pass@8 {start['summary']['pass@8']:.3f}, acc "
          f"{start['summary']['accuracy']:.3f}; served@{args.budget:g}: uniform {serve['uniform_maj@4']:.3f}, "
          f"policy {serve['policy']:.3f} (mean k {serve['policy_mean_k']:.2f}), batch-matched "
          f"{serve['policy_batch']:.3f} (mean k {serve['policy_batch_mean_k']:.2f}), oracle {serve['oracle']:.3f}"
          f"{rule_note(serve)}", flush=True)
    per: dict[str, dict[int, dict]] = {o: {} for o in objectives}
    for seed in seeds:
        for obj in objectives:
            r = per[obj][seed] = cached(out_dir, f"{obj.replace('@', '_at_')}-seed{seed}",
                                        functools.partial(one_run, args, obj, seed, base, cal, test))
            serve = r["served"]
            print(f"seed {seed} {obj:>6}: {r['steps']} steps, {r['rollouts']} rollouts, {sum(r['flops'].values()):.3e} "
                  f"FLOPs, maj@8 {r['summary']['maj@8']:.3f}, pass@8 {r['summary']['pass@8']:.3f}, acc "
                  f"{r['summary']['accuracy']:.3f}; served@{args.budget:g}: uniform {serve['uniform_maj@4']:.3f}, "
                  f"policy {serve['policy']:.3f} (mean k {serve['policy_mean_k']:.2f}), batch-matched "
                  f"{serve['policy_batch']:.3f} (mean k {serve['policy_batch_mean_k']:.2f}), oracle "
                  f"{serve['oracle']:.3f}{rule_note(serve)}; training {r['seconds']:.0f} s", flush=True)

    base_obj = objectives[0]
    comparisons = {f"{obj} - {base_obj} on {metric}": compare(per, obj, base_obj, metric, seeds)
                   for obj in objectives[1:] for metric in ("maj@8", "pass@8")}
    print()
    for name, c in comparisons.items():
        print(f"held-out {name}: {c['difference']:+.3f}; 95% CI over problems (seeds averaged) "
              f"[{c['ci95_problems'][0]:+.3f}, {c['ci95_problems'][1]:+.3f}], over problems and seeds (bootstrap) "
              f"[{c['ci95_problems_seeds'][0]:+.3f}, {c['ci95_problems_seeds'][1]:+.3f}]; per seed "
              f"{', '.join(f'{d:+.3f}' for d in c['per_seed'])}")
    served_means = {}
    for key in ("uniform_maj@4", "policy", "policy_mean_k", "policy_batch", "policy_batch_mean_k", "oracle"):
        served_means[key] = {o: float(np.mean([per[o][s]["served"][key] for s in seeds])) for o in objectives}
        print(f"{'served/' + key:>26}: " + ", ".join(f"{o} {v:.3f}" for o, v in served_means[key].items()))
    for o in objectives:
        gain = [per[o][s]["served"]["policy_batch"] - per[o][s]["served"]["uniform_maj@4"] for s in seeds]
        print(f"served@{args.budget:g} {o}: batch-matched policy - uniform maj@4 per seed "
              f"{', '.join(f'{g:+.3f}' for g in gain)} (mean {np.mean(gain):+.3f})")
    seconds = time.monotonic() - wall
    print(f"wall time {seconds:.0f} s")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        legacy = comparisons.get(f"{objectives[-1]} - {base_obj} on maj@8")
        Path(args.json).write_text(json.dumps({
            "args": vars(args), "base": start, "runs": per, "comparisons": comparisons, "served": served_means,
            "maj8_difference": legacy and {"mean": legacy["difference"], "ci95": legacy["ci95_problems"],
                                           "per_seed": legacy["per_seed"]},
            "wall_seconds": seconds}, indent=2, default=float) + "\n")
    return 0


def rule_note(serve: dict) -> str:
    """", policy serves fixed_plan" (results kept before the rule was recorded say nothing)."""
    return f", policy serves {serve['policy_rule']}" if "policy_rule" in serve else ""


def base_run(args: argparse.Namespace, base: str | None, cal: list, test: list) -> dict:
    """The untrained base model evaluated and served as every trained one is."""
    import torch

    from isocompute.training.grpo import load_base

    torch.set_num_threads(args.threads)
    model, tok = load_base(base)
    ev, serve = served(model, tok, cal, test, seed=0, max_new_tokens=args.max_completion_length, budget=args.budget,
                       temperature=args.temperature)
    return {"summary": ev.summary(), "served": serve}


def one_run(args: argparse.Namespace, obj: str, seed: int, base: str | None, cal: list, test: list) -> dict:
    """One objective trained on one seed to the FLOP budget, then evaluated and served (module docstring)."""
    cfg = AlignedGRPOConfig(objective=obj, num_generations=args.n, prompts_per_step=args.prompts_per_step,
                            steps=10_000, lr=args.lr, max_completion_length=args.max_completion_length,
                            temperature=args.temperature, lora_rank=args.lora_rank, seed=seed,
                            threads=args.threads, mix=args.mix)
    curve, (model, tok) = run_curve(cfg, base=base, problems=test[:16], eval_every=10**9, stop_flops=args.flops,
                                    max_new_tokens=args.max_completion_length, keep_model=True, ref=False,
                                    label=f"seed {seed} {obj}")
    ev, serve = served(model, tok, cal, test, seed=seed, max_new_tokens=args.max_completion_length,
                       budget=args.budget, temperature=args.temperature)
    return {"summary": ev.summary(), "served": serve, "maj@8": ev.metric("maj@8").tolist(),
            "pass@8": ev.metric("pass@8").tolist(), "flops": curve.ledger["analytic"],
            "rollouts": curve.rollouts["total"], "steps": curve.points[-1]["step"], "seconds": curve.seconds,
            "ledger": curve.ledger}


def compare(per: dict, obj: str, base_obj: str, metric: str, seeds: list[int], boots: int = 4000) -> dict:
    """``obj`` − ``base_obj`` on held-out ``metric``, paired by problem and seed (the same test problems and
    evaluation seed): the mean, a 95 % interval over problems with seeds averaged, and one over problems
    and seeds (seeds and problems resampled independently, a two-way bootstrap)."""
    d = np.array([per[obj][s][metric] for s in seeds]) - np.array([per[base_obj][s][metric] for s in seeds])
    mean, lo, hi = mean_ci(d.mean(axis=0))
    rng = np.random.default_rng(0)
    S, P = d.shape
    stats = [d[rng.integers(0, S, S)][:, rng.integers(0, P, P)].mean() for _ in range(boots)]
    return {"difference": mean, "ci95_problems": [lo, hi],
            "ci95_problems_seeds": [float(np.quantile(stats, 0.025)), float(np.quantile(stats, 0.975))],
            "per_seed": d.mean(axis=1).tolist()}


if __name__ == "__main__":
    sys.exit(main())
