"""Budget bias on small, hard tables (issue 32) and uniform@k at its own latency (issue 36), before and after,
on the same subsets in the same run.

    python bench/bench_budget_bias.py /work/tables/{gpt-oss-20b,Qwen3-14B,Phi-4-reasoning,gsm8k_tok,date_tok}.jsonl \\
        [--sizes 30,60,120] [--subsets 100] [--policy-sizes 30,60] [--policy-subsets 1] [--json out.json]

Subsets: n prompts drawn at random from the ``pool(n)`` prompts with the longest mean sample (hard problems
with heavy-tailed lengths: 100 for n = 30, 150 for 60, 250 for 120), each its own table (its own 1x = its
mean sample length), 5-fold cross-validation, tokens unit, the policy's default menu (87 plans).

**A — the fixed plan and uniform**, the rules the never-worse chain serves on these tables (``--subsets``
subsets per size): realised mean tokens / budget − 1 at 2x–8x, mean over subsets with a 95% CI, for
``before`` (the mix chosen at the budget on the training means), ``after`` (at the held-out-searched internal
budget, :mod:`isocompute.policy.plans.heldout`) and uniform; two diagnostics of the cause — ``true cost``
(plans chosen on the training utilities but priced at the subset's own means: the bias vanishes, so it comes
from the cost estimates) and ``ratio`` (costs in units of the training part's own 1x: the common length
scale removed, the rest is the selection among plans). ``acc Δ matched``: after's accuracy minus before's at
the same realised tokens (mean curves over subsets, before's over 33 budgets interpolated), points, with a
95% bootstrap CI over subsets; ``vs what it means to spend``: realised tokens / min(budget, the top of the
plans' hull on the training part) − 1 (above the top, extra tokens buy nothing on the training prompts and
the rule rightly spends less).

**B — the policy as served** (``--policy-subsets`` subsets per size in ``--policy-sizes``): ``report``'s own
cross-validation (``isocompute.evaluation.evaluate.cross_validate``, latency budgets from the quickest plan to
4), the code before the chain's spend check and ladder-point test (``before``: the chain as on main after
issue 36's first round) against this code: realised tokens / budget − 1 of the policy as served (no latency
budget), its accuracy gain over uniform at matched realised tokens (points), and the reach ratio for
uniform@4 and uniform@8 (≤ 1.0 is the target; "—" = not reached within its latency). The tokens also with
the fallbacks' two-plan mixes scored at their share (``learned_mix``: the same expectation over new prompts,
without the draw of each prompt's hash), and at the end, per table and size, the mean of both over the
subsets with a 95% t interval (``**`` outside ±5%).

**C — the evidence chain's fixed mixture** (``--mix-subsets`` subsets per size in ``--policy-sizes``): the
best mixture of the menu's plans within the tokens budget (the LP of
:func:`isocompute.policy.evidence.chain.best_fixed_mix`, no latency budget), 5-fold, chosen on the training
part at the budget (``before``) or at its held-out-searched budget
(:func:`~isocompute.policy.evidence.chain.heldout_mix_budget`, ``after``): realised tokens / budget − 1 and
after's accuracy minus before's at after's realised tokens (before's curve over 33 budgets, points).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from isocompute.policy.plans.arrays import plan_arrays  # noqa: E402
from isocompute.policy.plans.fixed import fold_assignment  # noqa: E402
from isocompute.policy.plans.heldout import heldout_budgets, hull_mix  # noqa: E402
from isocompute.policy.plans.menu import resolve_plans  # noqa: E402
from isocompute.solver.outcomes import read_outcomes  # noqa: E402

BX = np.array([2.0, 3.0, 4.0, 5.0, 6.0, 8.0])
CURVE = np.geomspace(1.2, 12.0, 33)
POOL = {30: 100, 60: 150, 120: 250}
RULES = ("before", "after", "own 1x only", "search only", "true cost", "uniform before", "uniform after")


def _ci(x: np.ndarray) -> tuple[float, float, float]:
    m, se = float(x.mean()), float(x.std(ddof=1) / np.sqrt(len(x))) if len(x) > 1 else float("nan")
    return m, m - 1.96 * se, m + 1.96 * se


def _mix(U, C, X, g):
    lo, hi, p = hull_mix(U.mean(axis=0), C.mean(axis=0), g)
    return ((1 - p) * X[:, lo] + p * X[:, hi]).T  # (G, n)


def subset_spend(U: np.ndarray, C: np.ndarray, ladder: list[int], seed: int) -> dict[str, np.ndarray]:
    """One subset, 5-fold: per budget, each rule's realised mean tokens / budget − 1 (``tok:``), the fixed
    plan's realised tokens / what it means to spend − 1 (``bind:``: min(budget, its hull's top on the training
    part) — above the top extra tokens buy nothing there), and before's and after's accuracy-vs-tokens
    curves (``curve:``, in x) for the matched comparison."""
    n = U.shape[0]
    unit = C[:, ladder[0]]
    m = unit.mean()
    b, curve = BX * m, CURVE * m
    fold = fold_assignment(n, 5, seed)
    tok = {r: np.zeros((BX.size, n)) for r in RULES}
    meant = {r: np.zeros((BX.size, n)) for r in ("before", "after")}
    crv = {r: np.zeros((2, CURVE.size, n)) for r in ("before", "after")}
    lad = np.asarray(ladder)
    for f in range(5):
        te, tr = fold == f, fold != f
        Ut, Ct = U[tr], C[tr]
        x = unit[tr].mean() / m  # the refit's own 1x over the subset's: "4x" is served as 4 of its own
        top = Ct.mean(axis=0)[hull_mix(Ut.mean(axis=0), Ct.mean(axis=0), np.array([np.inf]))[1][0]]
        after = heldout_budgets(Ut, Ct, x * b, seed=seed, unit=unit[tr])
        for r, gb, gc in (("before", b, curve),
                          ("after", after, heldout_budgets(Ut, Ct, x * curve, seed=seed, unit=unit[tr]))):
            tok[r][:, te] = _mix(Ut, Ct, C[te], gb)
            meant[r][:, te] = np.minimum(b, top * (1 if r == "before" else 1 / x))[:, None]
            crv[r][0][:, te], crv[r][1][:, te] = _mix(Ut, Ct, C[te], gc), _mix(Ut, Ct, U[te], gc)
        tok["own 1x only"][:, te] = _mix(Ut, Ct, C[te], x * b)
        tok["search only"][:, te] = _mix(Ut, Ct, C[te], heldout_budgets(Ut, Ct, b, seed=seed))
        full = np.broadcast_to(C.mean(axis=0), Ct.shape)  # true cost: the subset's own means
        tok["true cost"][:, te] = _mix(Ut, full, C[te], b)
        cl = Ct[:, lad].mean(axis=0)
        for r, bb in (("uniform before", b), ("uniform after", x * b)):
            j = np.clip(np.searchsorted(cl, bb, side="right") - 1, 0, len(ladder) - 2)
            q = np.clip((bb - cl[j]) / (cl[j + 1] - cl[j]), 0, 1)
            tok[r][:, te] = ((1 - q)[:, None] * C[te][:, lad[j]].T + q[:, None] * C[te][:, lad[j + 1]].T)
    out = {f"tok:{r}": v.mean(axis=1) / b - 1 for r, v in tok.items()}
    for r in ("before", "after"):
        out[f"bind:{r}"] = tok[r].mean(axis=1) / meant[r].mean(axis=1) - 1
        out[f"curve:{r}"] = np.stack([crv[r][0].mean(axis=1) / m, crv[r][1].mean(axis=1)])  # (2, CURVE)
    return out


def matched(curves_before: np.ndarray, curves_after: np.ndarray, n_boot: int = 1000, seed: int = 0) -> np.ndarray:
    """(3, BX) after's accuracy minus before's at after's realised tokens (points): mean curves over subsets,
    before's interpolated in realised tokens; a 95% bootstrap CI over subsets."""
    def diff(cb: np.ndarray, ca: np.ndarray) -> np.ndarray:
        tb, ab = cb[0], cb[1]
        o = np.argsort(tb)
        ta, aa = np.interp(BX, CURVE, ca[0]), np.interp(BX, CURVE, ca[1])  # after at the budgets of BX
        return 100 * (aa - np.interp(ta, tb[o], ab[o]))

    S = curves_before.shape[0]
    idx = np.random.default_rng(seed).integers(0, S, (n_boot, S))
    boots = np.array([diff(curves_before[i].mean(0), curves_after[i].mean(0)) for i in idx])
    return np.stack([diff(curves_before.mean(0), curves_after.mean(0)), *np.percentile(boots, (2.5, 97.5), axis=0)])


def part_a(name: str, U: np.ndarray, C: np.ndarray, lengths: np.ndarray, ladder: list[int], sizes, subsets,
           seed: int) -> dict:
    res = {}
    for n, pool_n in sizes:
        if n >= len(lengths):
            continue
        pool = np.argsort(-lengths)[: min(pool_n or len(lengths), len(lengths))]
        rng = np.random.default_rng(seed + n + pool.size)
        runs = [subset_spend(U[rows], C[rows], ladder, seed + s)
                for s, rows in enumerate(rng.choice(pool, n, replace=False) for _ in range(subsets))]
        key = f"{n}:{pool.size}"
        res[key] = {k: np.array([r[k] for r in runs]) for k in runs[0]}
        print(f"\n### {name}: {n} of the {pool.size} longest, {subsets} subsets — realised tokens / budget − 1, "
              f"mean [95% CI] over subsets (** = outside ±5%)\n")
        print("| rule | " + " | ".join(f"{b:g}x" for b in BX) + " |")
        print("|---|" + "---|" * BX.size)
        rows = [(r, f"tok:{r}") for r in RULES] + [(f"{r}, vs what it means to spend", f"bind:{r}")
                                                    for r in ("before", "after")]
        for label, k in rows:
            cells = []
            for v in res[key][k].T:
                m, lo, hi = _ci(100 * v)
                star = "**" if abs(m) > 5 else ""
                cells.append(f"{star}{m:+.1f}%{star} [{lo:+.1f}, {hi:+.1f}]")
            print(f"| {label} | " + " | ".join(cells) + " |")
        d = matched(res[key]["curve:before"], res[key]["curve:after"], seed=seed)
        print("| after − before at matched tokens (pt) | " + " | ".join(
            f"{x:+.2f} [{lo:+.2f}, {hi:+.2f}]" for x, lo, hi in d.T) + " |", flush=True)
        res[key]["matched"] = d
    return res


@contextlib.contextmanager
def before_chain_checks():
    """The chain before this change, for the baseline: no spend check, and uniform@k's own latency tested
    like any other level."""
    from isocompute.policy import fallback, latency

    saved = fallback.SPEND_CHECK, latency.STRICT_ON_LADDER
    fallback.SPEND_CHECK, latency.STRICT_ON_LADDER = False, False
    try:
        yield
    finally:
        fallback.SPEND_CHECK, latency.STRICT_ON_LADDER = saved


def _matched_gain(acc: np.ndarray, tok: np.ndarray, u_acc: np.ndarray, u_tok: np.ndarray) -> np.ndarray:
    """Points: the policy's accuracy minus uniform's at the policy's realised tokens (uniform's curve over
    the same budgets, interpolated; clipped at its ends)."""
    o = np.argsort(u_tok)
    return 100 * (acc - np.interp(tok, u_tok[o], u_acc[o]))


def part_b(name: str, table, arr, lengths: np.ndarray, sizes, subsets: int, seed: int,
           labels: tuple[str, ...] = ("before", "after")) -> list[dict]:
    from isocompute.evaluation.evaluate import METHODS, cross_validate
    from isocompute.evaluation.reach import reach_block
    from isocompute.policy.policy import PolicyConfig

    names = [p.name for p in arr.plans]
    rows_out = []
    for n in sizes:
        n = n or len(lengths)  # 0 ("all"): the whole table, one "subset"
        pool = np.argsort(-lengths)[: min(POOL.get(n, 2 * n), len(lengths))]
        rng = np.random.default_rng(seed + 7 * n)
        for s in range(subsets):
            rows = np.sort(rng.choice(pool, n, replace=False))
            U, C = arr.utility[rows], arr.cost[rows]
            m = C[:, names.index("none@1")].mean()
            lat = arr.total_latency(0.0)[rows] / m
            prompts = [table.prompts[i] for i in arr.kept[rows]]
            row = {"table": name, "n": n, "subset": s}
            for label in labels:
                cfg = PolicyConfig(plans=tuple(names), cost_unit="tokens", seed=0,
                                   budget_range=(float(C.mean(axis=0).min()) * 1.0001, 16 * m * 0.999),
                                   latency_range=(float(np.ceil(lat.mean(axis=0).min() * 1000) / 1000), 4.0))
                t0 = time.perf_counter()
                ctx = before_chain_checks() if label == "before" else contextlib.nullcontext()
                with ctx:
                    ev = cross_validate(prompts, U, C, cfg, BX * m, folds=5, seeds=(seed,), samples=arr.samples[rows],
                                        waves=arr.waves[rows], tokens=arr.tokens[rows], latency=lat)
                r = ev.reach
                blk = reach_block(r["scores"], r["references"], r["arrays"], r["budgets"], r["latency_budgets"],
                                  n_boot=200, seed=seed)
                li, ui = METHODS.index("learned"), METHODS.index("uniform")
                tok, acc = ev.cost[0, li].mean(axis=-1), ev.utility[0, li].mean(axis=-1)
                mix = ev.cost[0, METHODS.index("learned_mix")].mean(axis=-1)  # fallbacks' mixes at their share
                row[label] = {"tokens_error": (tok / (BX * m) - 1).tolist(), "accuracy": acc.tolist(),
                              "tokens_error_mix": (mix / (BX * m) - 1).tolist(),
                              "matched_gain": _matched_gain(acc, tok, ev.utility[0, ui].mean(axis=-1),
                                                            ev.cost[0, ui].mean(axis=-1)).tolist(),
                              "reach": {e["reference"] + ("@1.0" if e["max_latency"] != e["latency"] else ""):
                                        {"ratio": e["ratio"], "ci": e["ratio_ci95"], "best": e["best_accuracy"],
                                         "accuracy": e["accuracy"]} for e in blk},
                              "seconds": time.perf_counter() - t0}
            _print_b(row)
            rows_out.append(row)
    return rows_out


def _summary_b(rows: list[dict], label: str) -> None:
    """Per table and size: realised tokens / budget − 1, mean over the subsets ± the 95% t half-width, as
    served and with the fallbacks' mixes at their share; then pooled over every subset."""
    from scipy import stats

    cells: dict[tuple[str, int], list[dict]] = {}
    for r in rows:
        if label in r:
            cells.setdefault((r["table"], r["n"]), []).append(r[label])
    if not cells:
        return

    def fmt(v: np.ndarray) -> str:
        mu = v.mean(axis=0)
        h = stats.t.ppf(0.975, len(v) - 1) * v.std(axis=0, ddof=1) / np.sqrt(len(v)) if len(v) > 1 else 0 * mu
        return " | ".join(f"{'**' if abs(a) > 5 else ''}{a:+.1f} ± {b:.1f}%{'**' if abs(a) > 5 else ''}"
                          for a, b in zip(mu, h, strict=True))

    print(f"\npart B ({label}), realised tokens / budget − 1, mean over subsets ± 95% half-width:")
    print("| table | n | subsets | kind | " + " | ".join(f"{b:g}x" for b in BX) + " |")
    pooled = {"tokens_error": [], "tokens_error_mix": []}
    for (t, n), rs in cells.items():
        for key, kind in (("tokens_error", "as served"), ("tokens_error_mix", "mixes at their share")):
            v = 100 * np.array([r[key] for r in rs])
            pooled[key].append(v)
            print(f"| {t} | {n} | {len(rs)} | {kind} | {fmt(v)} |")
    for key, kind in (("tokens_error", "as served"), ("tokens_error_mix", "mixes at their share")):
        v = np.concatenate(pooled[key])
        print(f"| all | | {len(v)} | {kind} | {fmt(v)} |  above the budget {100 * (v > 0).mean():.0f}%, "
              f"below {100 * (v < 0).mean():.0f}%")


def _print_b(row: dict) -> None:
    def ratio(e: dict) -> str:
        if e["ratio"] is None:
            return f"— (best {e['best']:.4f} vs {e['accuracy']:.4f})"
        lo, hi = e["ci"]
        return f"{e['ratio']:.3f} [{'—' if lo is None else f'{lo:.2f}'}, {'—' if hi is None else f'{hi:.2f}'}]"

    print(f"\n{row['table']}, {row['n']} hardest-pool prompts, subset {row['subset']}:")
    for label in ("before", "after"):
        if label not in row:
            continue
        r = row[label]
        errs = " ".join(f"{100 * e:+.1f}%" for e in r["tokens_error"])
        errs += " (mixes at their share: " + " ".join(f"{100 * e:+.1f}%" for e in r["tokens_error_mix"]) + ")"
        gains = " ".join(f"{g:+.2f}" for g in r["matched_gain"])
        print(f"  {label:6s} tokens vs budget {' '.join(f'{b:g}x' for b in BX)}: {errs}; gain vs uniform at matched "
              f"tokens (pt): {gains}; reach uniform@4 "
              f"{ratio(r['reach']['uniform@4'])}, uniform@8 {ratio(r['reach']['uniform@8'])} ({r['seconds']:.0f} s)",
              flush=True)


def part_c(name: str, arr, sizes, subsets: int, seed: int) -> dict:
    from isocompute.policy.evidence.chain import _mix_or_cheapest, heldout_mix_budget

    names = [p.name for p in arr.plans]
    U, T = arr.utility, arr.tokens
    lengths = T[:, names.index("none@1")]
    res = {}
    for n in sizes:
        n = n or len(lengths)  # 0 ("all"): the whole table, one "subset"
        pool = np.argsort(-lengths)[: min(POOL.get(n, 2 * n), len(lengths))]
        rng = np.random.default_rng(seed + 11 * n)
        errs, gains = {"before": [], "after": []}, []
        for s in range(subsets):
            rows = rng.choice(pool, n, replace=False)
            u, t = U[rows], T[rows]
            m = t[:, names.index("none@1")].mean()
            fold = fold_assignment(n, 5, seed + s)
            tok = {"before": np.zeros((CURVE.size, n)), "after": np.zeros((BX.size, n))}
            acc = {k: np.zeros_like(v) for k, v in tok.items()}
            for f in range(5):
                tr, te = fold != f, fold == f
                x = t[tr, names.index("none@1")].mean()  # the training part's own 1x
                for label, grid in (("before", CURVE), ("after", BX)):
                    for bi, bx in enumerate(grid):
                        g = bx * x if label == "before" else heldout_mix_budget((u[tr], t[tr], t[tr]), bx * x, None,
                                                                                seed=seed + s)
                        p, w = _mix_or_cheapest(u[tr], t[tr], t[tr], float(g), None)
                        tok[label][bi, te], acc[label][bi, te] = t[te][:, p] @ w, u[te][:, p] @ w
            tb, ab = tok["before"].mean(axis=1) / m, acc["before"].mean(axis=1)
            ta, aa = tok["after"].mean(axis=1) / m, acc["after"].mean(axis=1)
            errs["before"].append(np.interp(BX, CURVE, tb) / BX - 1)
            errs["after"].append(ta / BX - 1)
            o = np.argsort(tb)
            gains.append(100 * (aa - np.interp(ta, tb[o], ab[o])))
        res[n] = {k: np.array(v).tolist() for k, v in errs.items()} | {"matched": np.array(gains).tolist()}
        print(f"\n{name}, evidence chain's fixed mixture, {n} of the {pool.size} longest, {subsets} subsets "
              f"(realised tokens / budget − 1, mean [95% CI]; ** outside ±5%):")
        for label, v in (*errs.items(), ("after − before at matched tokens (pt)", gains)):
            cells = []
            for col in np.array(v).T:
                mu, lo, hi = _ci(col if "pt" in label else 100 * col)
                star = "**" if "pt" not in label and abs(mu) > 5 else ""
                cells.append(f"{star}{mu:+.2f}{star} [{lo:+.2f}, {hi:+.2f}]" if "pt" in label
                             else f"{star}{mu:+.1f}%{star} [{lo:+.1f}, {hi:+.1f}]")
            print(f"  {label}: " + " | ".join(f"{b:g}x {c}" for b, c in zip(BX, cells, strict=True)), flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tables", type=Path, nargs="+")
    ap.add_argument("--sizes", default="30:100,60:150,120:250,30:all",
                    help="n:pool — n prompts drawn from the pool longest (all: from every prompt)")
    ap.add_argument("--subsets", type=int, default=100)
    ap.add_argument("--policy-sizes", default="30,60", help="part B's subset sizes (all: the whole table)")
    ap.add_argument("--policy-subsets", type=int, default=1)
    ap.add_argument("--mix-subsets", type=int, default=0)
    ap.add_argument("--after-only", action="store_true",
                    help="part B: this code's chain only (no 'before' baseline): twice the subsets in the same time")
    ap.add_argument("--before-only", action="store_true", help="part B: the baseline chain only")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    sizes = [(int(x.split(":")[0]), None if x.split(":")[1] == "all" else int(x.split(":")[1]))
             for x in a.sizes.split(",") if x]
    psizes = [0 if x == "all" else int(x) for x in a.policy_sizes.split(",") if x]
    plans = resolve_plans("default", (1, 2, 4, 8, 16), parallel=True)
    out: dict = {"a": {}, "b": [], "c": {}}
    for path in a.tables:
        table = read_outcomes(path)
        arr = plan_arrays(table, plans, cost_unit="tokens")
        ladder = [[p.name for p in plans].index(f"none@{k}") for k in (1, 2, 4, 8, 16)]
        lengths = arr.tokens[:, ladder[0]]
        res = part_a(path.stem, arr.utility, arr.cost, lengths, ladder, sizes, a.subsets, a.seed)
        out["a"][path.stem] = {n: {k: (v if k == "matched" else v.mean(axis=0)).tolist() for k, v in r.items()}
                               for n, r in res.items()}
    for path in a.tables:
        if a.mix_subsets <= 0:
            break
        arr = plan_arrays(read_outcomes(path), plans, cost_unit="tokens")
        out["c"][path.stem] = part_c(path.stem, arr, psizes, a.mix_subsets, a.seed)
    for path in a.tables:
        if a.policy_subsets <= 0:
            break
        table = read_outcomes(path)
        arr = plan_arrays(table, plans, cost_unit="tokens")
        out["b"] += part_b(path.stem, table, arr, arr.tokens[:, 0], psizes, a.policy_subsets, a.seed,
                           ("after",) if a.after_only else ("before",) if a.before_only else ("before", "after"))
        if a.json:
            a.json.write_text(json.dumps(out, indent=1) + "\n")
    for label in ("before", "after"):
        _summary_b(out["b"], label)
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
