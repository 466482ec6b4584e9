"""Benchmark: utility, samples, tokens generated and latency of the parallel-stop menu for 10,000 prompts × 48 samples.

Target (issue 20): 10,000 prompts × 48 samples × the menu in <= 10 s on this machine. The table is
bench_estimators' synthetic LLM-like one (per-prompt difficulty, recurring wrong answers, one-off answers,
5% nulls, 50–600 completion tokens); the menu is ``parallel_plans()`` (31 plans: one parallel-stop wave of
4–16 per rule family, ``4s,8s`` and ``2s,4s,8s`` schedules, short-m@k), estimated by the wave engine with
100 random orders per prompt (tokens and latency of short-m@k exactly). Also timed, for the default menu
the integrator may build: ``default_plans()`` (exact lattice, now with tokens and latency), both menus
together, and the policy's default menu in the tokens unit (``fit --plans default --cost-unit tokens``: 87
plans, the lead grid included).

Named baseline, in the same run, on a few of the same prompts: per-prompt Monte Carlo in Python — for each
prompt, 100 random orders, each plan played finish by finish through ``Plan.on_finish`` (the online
runner's code path). It prints seconds per prompt, the engine's speed ratio (95% CI by bootstrap over the
prompts) and how far the two independent Monte Carlo estimates sit apart in their joint standard errors
(|z| should look standard normal: mean 0.80, share > 3 about 0.003).

    .venv/bin/python bench/bench_parallel_plans.py [--prompts 10000] [--samples 48] [--baseline-prompts 6]

Timings on a shared machine: CPU time (time.process_time) is printed beside wall time.
"""

from __future__ import annotations

import argparse
import math
import time
from collections import Counter

import numpy as np
from bench_estimators import synthetic_records

from isocompute.policy.plans.menu import resolve_plans
from isocompute.solver.outcomes import OutcomeTable, from_records
from isocompute.solver.plans.estimates import estimate_table
from isocompute.solver.plans.plan import Plan, default_plans, parallel_plans


def play(plan: Plan, answers: list, correct: np.ndarray, codes: np.ndarray, lengths: np.ndarray,
         perm: np.ndarray) -> tuple[float, float, float]:
    """(utility, tokens generated, latency) of one order, finish by finish through Plan.on_finish."""
    finished: list[int] = []
    tokens = latency = 0.0
    lo = 0
    for w, par in zip(plan.waves, plan.parallel, strict=True):
        members = perm[lo:lo + w]
        lo += w
        order = sorted(members, key=lambda i: lengths[i]) if par else list(members)  # stable: ties in random order
        for i, s in enumerate(order):
            finished.append(s)
            step = plan.on_finish([answers[x] for x in finished], running=i < w - 1)
            if step.stop or step.reason == "continue":
                break
        last = lengths[order[i]]
        tokens += sum(min(lengths[x], last) if j > i else lengths[x] for j, x in enumerate(order))
        latency += last if par else max(lengths[x] for x in order)
        if step.stop:
            votes = Counter(answers[x] for x in finished if answers[x] is not None)
            if not votes:
                return 0.0, tokens, latency
            top = max(votes.values())
            winners = [a for a, c in votes.items() if c == top]
            drawn = np.array(finished)
            credit = [correct[drawn][codes[drawn] == a].mean() for a in winners]
            return sum(credit) / len(winners), tokens, latency
    raise AssertionError(f"{plan.name} ended without a stop")


def per_prompt_monte_carlo(table: OutcomeTable, i: int, plans: list[Plan], n_orders: int,
                           rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(3, P) means and standard errors of utility, tokens and latency over ``n_orders`` random orders."""
    n = int(table.n_samples[i])
    codes, correct = table.answer_codes[i, :n], table.correct[i, :n]
    lengths = table.completion_tokens[i, :n]
    answers = [None if c < 0 else int(c) for c in codes]
    out = np.zeros((3, len(plans), n_orders))
    for r in range(n_orders):
        perm = rng.permutation(n)
        for p, plan in enumerate(plans):
            out[:, p, r] = play(plan, answers, correct, codes, lengths, perm)
    return out.mean(axis=2), out.std(axis=2, ddof=1) / math.sqrt(n_orders)


def timed(table: OutcomeTable, plans: list[Plan], repeat: int) -> tuple[float, float, object]:
    walls, cpus, est = [], [], None
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        est = estimate_table(table, plans)
        walls.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    return min(walls), min(cpus), est


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=10_000)
    ap.add_argument("--samples", type=int, default=48)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--baseline-prompts", type=int, default=6)
    ap.add_argument("--orders", type=int, default=100)
    args = ap.parse_args()

    table = from_records(synthetic_records(args.prompts, args.samples, args.seed))
    menu = parallel_plans()
    estimate_table(table.subset(range(20)), default_plans() + menu)  # warm the lattice and rule tables
    wall, cpu, est = timed(table, menu, args.repeat)
    verdict = "met" if wall <= 10 else "MISSED"
    print(f"parallel-stop menu: {args.prompts} prompts x {args.samples} samples x {len(menu)} plans "
          f"({Counter(est.method)}, latency {Counter(est.latency_method)}): {wall:.2f} s wall, {cpu:.2f} s CPU "
          f"(best of {args.repeat}); target <= 10 s: {verdict}")
    print(f"  mean utility {est.utility.mean():.4f}, tokens {est.tokens.mean():.0f}, latency {est.latency.mean():.0f}, "
          f"median utility SE {np.median(est.utility_se):.4f}")
    served = list(resolve_plans("default", (1, 2, 4, 8, 16), parallel=True))  # fit's default menu in tokens
    for name, plans in (("default_plans()", default_plans()), ("default_plans() + parallel_plans()", default_plans() + menu),
                        ("the policy's default menu in tokens", served)):
        w, c, _ = timed(table, plans, args.repeat)
        print(f"{name}: {len(plans)} plans: {w:.2f} s wall, {c:.2f} s CPU; target <= 10 s: "
              f"{'met' if w <= 10 else 'MISSED'}")

    rng = np.random.default_rng(args.seed + 1)
    per_engine = wall / args.prompts
    times, z = [], []
    for i in range(args.baseline_prompts):
        t = time.perf_counter()
        mean, se = per_prompt_monte_carlo(table, i, menu, args.orders, rng)
        times.append(time.perf_counter() - t)
        ours = np.stack([est.utility[i], est.tokens[i], est.latency[i]])
        ours_se = np.stack([est.utility_se[i], est.generated_tokens_se[i], est.latency_se[i]])
        spread = np.hypot(se, ours_se)
        z.append((mean - ours)[spread > 0] / spread[spread > 0])
    zz = np.concatenate(z)
    per = np.array(times)
    boot = rng.choice(per, size=(2000, per.size)).mean(axis=1) / per_engine
    print(f"baseline per-prompt Monte Carlo ({args.orders} orders, Plan.on_finish in Python): {per.mean():.3f} s/prompt "
          f"vs engine {per_engine * 1e6:.0f} us/prompt: engine is {per.mean() / per_engine:,.0f}x faster "
          f"[95% CI {np.quantile(boot, 0.025):,.0f}, {np.quantile(boot, 0.975):,.0f}]; |z| between the two: mean "
          f"{np.abs(zz).mean():.2f}, share > 3: {(np.abs(zz) > 3).mean():.3f} (standard normal: 0.80, 0.003)")


if __name__ == "__main__":
    main()
