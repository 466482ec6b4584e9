"""Cost of the compute-aligned advantages per training batch: vectorised leave-one-out U-statistics
(:func:`isocompute.training.rewards.group_advantages`) against the named baseline, the per-rollout
definition evaluated by enumerating every k-subset that contains the rollout and every k-subset of the
others (checked equal on a slice).

    .venv/bin/python bench/bench_grpo_rewards.py [--groups 256 --n 16 --k 8]
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections import Counter

import numpy as np

from isocompute.training.rewards import Objective, group_advantages


def plurality_correct(codes, correct, subset) -> float:
    votes = Counter(codes[i] for i in subset if codes[i] >= 0)
    if not votes:
        return 0.0
    top = max(votes.values())
    winners = [a for a, v in votes.items() if v == top]
    return sum(float(correct[next(i for i in subset if codes[i] == a)]) for a in winners) / len(winners)


def brute_maj(codes, correct, k) -> np.ndarray:
    """A_j = n·(U − U₋ⱼ) by enumerating subsets (the definition)."""
    n = len(codes)
    u = np.mean([plurality_correct(codes, correct, s) for s in itertools.combinations(range(n), k)])
    out = np.empty(n)
    for j in range(n):
        others = [i for i in range(n) if i != j]
        out[j] = n * (u - np.mean([plurality_correct(codes, correct, s) for s in itertools.combinations(others, k)]))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--groups", type=int, default=256)
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--slice", type=int, default=4, help="groups timed with the brute-force baseline")
    args = ap.parse_args(argv)

    rng = np.random.default_rng(0)
    codes = rng.integers(-1, 4, size=(args.groups, args.n))  # 4 answers + nulls
    correct = (codes == 0)  # answer 0 is the right one
    obj = Objective("maj", args.k)
    group_advantages(obj, correct[:2], codes=codes[:2])  # warm caches
    t = time.perf_counter()
    adv = group_advantages(obj, correct, codes=codes)
    fast = time.perf_counter() - t
    t = time.perf_counter()
    ref = np.array([brute_maj(codes[g], correct[g], args.k) for g in range(args.slice)])
    slow = (time.perf_counter() - t) / args.slice * args.groups
    np.testing.assert_allclose(adv[: args.slice], ref, atol=1e-9)
    t = time.perf_counter()
    group_advantages(Objective("pass", args.k), correct)
    fast_pass = time.perf_counter() - t
    print(f"maj@{args.k} advantages, {args.groups} groups × n={args.n}: vectorised {fast * 1e3:.1f} ms, "
          f"subset enumeration (baseline, scaled from {args.slice} groups) {slow:.2f} s → {slow / fast:.0f}× faster")
    print(f"pass@{args.k} advantages (closed form): {fast_pass * 1e3:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
