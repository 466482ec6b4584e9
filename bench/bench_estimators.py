"""Benchmark: read an outcome table and build U (N prompts × n samples × actions) for every strategy.

Default: 10,000 prompts × 48 samples, actions 1,2,4,8,16 (the DESIGN target: majority in <= 2 s).
Baselines in the same run, on a small subset of the same prompts:
  * brute force — enumerate every k-subset (itertools.combinations) for k <= 4 (k = 8 or 16 would be
    C(48,16) ≈ 2e12 subsets per prompt);
  * per-prompt DP — maj@k for all actions by a forward DP over answer groups in exact integers and
    fractions (state: samples drawn, top count, ties, value at the top), the natural exact solver
    one would write first.
Each prints seconds per prompt and the speed ratio to the vectorised estimator, plus the largest
disagreement (which must be ~1e-15).

    .venv/bin/python bench/bench_estimators.py [--prompts 10000] [--samples 48] [--actions 1,2,4,8,16]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import numpy as np

from isocompute.solver.estimators import utilities
from isocompute.solver.outcomes import OutcomeTable, read_outcomes


def synthetic_records(n_prompts: int, n: int, seed: int) -> list[dict]:
    """LLM-like outcomes: per-prompt difficulty, a few recurring wrong answers, a tail of one-off
    answers, 5% unparsable (null) answers, verifier scores correlated with correctness (2 decimals,
    so scores tie)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n_prompts):
        p = rng.beta(0.7, 0.7)
        n_wrong = int(rng.integers(1, 6))
        wrong_w = rng.dirichlet(np.full(n_wrong, 0.5))
        u = rng.random(n)
        kind = np.where(u < 0.05, 0, np.where(u < 0.05 + 0.95 * p, 1, np.where(rng.random(n) < 0.3, 2, 3)))
        recurring = rng.choice(n_wrong, size=n, p=wrong_w)
        one_off = rng.integers(100, 10_000, size=n)
        score = np.round(rng.normal(kind == 1, 1.0), 2)
        tokens = rng.integers(50, 600, size=n)
        samples = []
        for j in range(n):
            ans = (None, "18", str(one_off[j]), str(20 + recurring[j]))[kind[j]]
            samples.append({"answer": ans, "correct": bool(kind[j] == 1),
                            "completion_tokens": int(tokens[j]), "score": float(score[j])})
        out.append({"id": f"syn-{i}", "prompt": f"Synthetic question {i}: what is 9 + 9?", "gold": "18",
                    "prompt_tokens": 20, "samples": samples, "meta": {"task": "synthetic", "seed": seed}})
    return out


def best_time(fn, repeat: int = 3) -> tuple[float, object]:
    """Best wall time of ``repeat`` runs (the least disturbed by other processes) and the result."""
    best, result = math.inf, None
    for _ in range(repeat):
        t = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t)
    return best, result


def cpu_time(fn) -> float:
    """CPU seconds of one run of ``fn``: on a shared machine this varies less than wall time."""
    t = time.process_time()
    fn()
    return time.process_time() - t


# --------------------------------------------------------------------------- baselines (per prompt)


def brute_force(table: OutcomeTable, i: int, k: int, strategy: str) -> float:
    n = int(table.n_samples[i])
    codes, correct = table.answer_codes[i, :n].tolist(), table.correct[i, :n].tolist()
    scores = table.scores[i, :n].tolist()
    tot, count = 0.0, 0
    for s in itertools.combinations(range(n), k):
        count += 1
        if strategy == "pass":
            tot += any(correct[j] for j in s)
        elif strategy == "best_of":
            top = max(scores[j] for j in s)
            tied = [j for j in s if scores[j] == top]
            tot += sum(correct[j] for j in tied) / len(tied)
        else:
            votes: dict[int, list[int]] = {}
            for j in s:
                if codes[j] >= 0:
                    votes.setdefault(int(codes[j]), []).append(j)
            if votes:
                top = max(map(len, votes.values()))
                win = [v for v in votes.values() if len(v) == top]
                tot += sum(sum(correct[j] for j in v) / len(v) for v in win) / len(win)
    return tot / count


def dp_majority(table: OutcomeTable, i: int, ks: list[int]) -> list[float]:
    """maj@k for one prompt by a forward DP over answer groups in exact arithmetic; the state is
    (samples drawn, top count, answers tied at the top, summed value of those answers) → ways."""
    n = int(table.n_samples[i])
    codes, correct = table.answer_codes[i, :n].tolist(), table.correct[i, :n].tolist()
    groups: dict[int, list[bool]] = {}
    for g, c in zip(codes, correct, strict=True):
        if g >= 0:
            groups.setdefault(g, []).append(c)
    kmax = max(ks)
    states: dict[tuple[int, int, int, Fraction], int] = {(0, 0, 0, Fraction(0)): 1}
    for members in groups.values():
        m, v = len(members), Fraction(sum(members), len(members))
        new: dict[tuple[int, int, int, Fraction], int] = {}
        for (size, top, ties, val), w in states.items():
            for x in range(min(m, kmax - size) + 1):
                if x == 0 or x < top:
                    key = (size + x, top, ties, val)
                elif x == top:
                    key = (size + x, top, ties + 1, val + v)
                else:
                    key = (size + x, x, 1, v)
                new[key] = new.get(key, 0) + w * math.comb(m, x)
        states = new
    nulls = n - sum(map(len, groups.values()))
    out = []
    for k in ks:
        tot = sum(w * math.comb(nulls, k - size) * val / ties
                  for (size, _, ties, val), w in states.items() if ties and size <= k)
        out.append(float(Fraction(tot) / math.comb(n, k)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=10_000)
    ap.add_argument("--samples", type=int, default=48)
    ap.add_argument("--actions", default="1,2,4,8,16")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--baseline-prompts", type=int, default=2)
    args = ap.parse_args()
    actions = [int(a) for a in args.actions.split(",")]

    records = synthetic_records(args.prompts, args.samples, args.seed)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "outcomes.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        size_mb = path.stat().st_size / 1e6
        t_json, _ = best_time(lambda: [json.loads(line) for line in path.read_text().split("\n") if line])
        t_read, table = best_time(lambda: read_outcomes(path))
        c_read, c_json = cpu_time(lambda: read_outcomes(path)), cpu_time(
            lambda: [json.loads(line) for line in path.read_text().split("\n") if line])
    print(f"read_outcomes: {args.prompts} prompts x {args.samples} samples ({size_mb:.0f} MB): {t_read:.3f} s wall, "
          f"{c_read:.3f} s CPU (of which stdlib json.loads alone {t_json:.3f} s wall, {c_json:.3f} s CPU)")

    vec: dict[str, np.ndarray] = {}
    for strategy in ("majority", "pass", "best_of"):
        t, vec[strategy] = best_time(lambda s=strategy: utilities(table, actions, s))
        c = cpu_time(lambda s=strategy: utilities(table, actions, s))
        print(f"U {strategy:8s} {args.prompts} x {args.samples} x {len(actions)} actions {actions}: {t:.3f} s wall, "
              f"{c:.3f} s CPU (mean U {np.round(vec[strategy].mean(0), 4).tolist()})")

    rows = range(args.baseline_prompts)
    small = [k for k in actions if k <= 4]
    for strategy in ("majority", "pass", "best_of"):
        t_vec, _ = best_time(lambda s=strategy: utilities(table, small, s))
        per_vec = t_vec / len(table)
        t0 = time.perf_counter()
        bf = np.array([[brute_force(table, i, k, strategy) for k in small] for i in rows])
        per_bf = (time.perf_counter() - t0) / len(rows)
        err = np.abs(bf - vec[strategy][list(rows)][:, [actions.index(k) for k in small]]).max()
        print(f"baseline brute force {strategy:8s} k={small}: {per_bf * 1e3:.1f} ms/prompt vs vectorised "
              f"{per_vec * 1e6:.1f} us/prompt: {per_bf / per_vec:,.0f}x faster; max |diff| {err:.1e}")

    n_enum = 4 * args.baseline_prompts
    t0 = time.perf_counter()
    ce = np.array([dp_majority(table, i, actions) for i in range(n_enum)])
    per_ce = (time.perf_counter() - t0) / n_enum
    t_vec, _ = best_time(lambda: utilities(table, actions, "majority"))
    per_vec = t_vec / len(table)
    err = np.abs(ce - vec["majority"][:n_enum]).max()
    print(f"baseline exact per-prompt DP majority k={actions}: {per_ce * 1e3:.1f} ms/prompt vs vectorised "
          f"{per_vec * 1e6:.1f} us/prompt: {per_ce / per_vec:,.0f}x faster; max |diff| {err:.1e}")


if __name__ == "__main__":
    main()
