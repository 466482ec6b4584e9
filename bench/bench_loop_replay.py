"""The learning loop end to end, through the gateway, over a replay upstream of a real MATH-500 table.

``isocompute replay TABLE`` (a simulator: recorded answers and lengths, modelled seconds — set fast here) serves
the table; the prompts are split in half (seeded). Phase 1: ``isocompute serve --capture DIR --explore SHARE``
with no policy (the cold start) answers ``--requests`` requests on half A at budget ``4x``; the realised mean
tokens per request, exploration included, is read from the gateway's metrics; then half B is sent to the cold
start (its accuracy, the third row; it captures too). Phase 2: ``isocompute refit``
(consensus target) writes a policy and reloads the gateway. Phase 3: every prompt of half B is sent
``--reps`` times to the gateway serving, in turn, the refitted policy and a gold-fitted policy (``isocompute
fit --target gold --cost-unit tokens`` on half A's table: the named baseline); each answer is graded by the
table's own verdict of the answer the gateway returned. Prints accuracy on gold and tokens per request for the
three, and the targets (refitted within 0.3 pt of gold-fitted; tokens ≤ the cold start's at ≥ its accuracy;
realised tokens within ±5% of the budget with exploration on).

    PYTHONPATH=. python bench/bench_loop_replay.py /work/tables/Qwen3-14B.jsonl [--requests 10000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from isocompute.engines.vllm_server import free_port

REPO = Path(__file__).resolve().parents[1]
ADMIN = "bench-admin"


def start(cmd: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    with open(log, "ab") as fh:
        return subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
                                stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)


def wait(url: str, path: str, proc: subprocess.Popen, log: Path) -> None:
    t_end = time.monotonic() + 300
    while time.monotonic() < t_end:
        try:
            if httpx.get(url + path, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args[3]} exited: {log.read_text()[-2000:]}")
        time.sleep(0.5)
    raise SystemExit(f"{url} not ready: {log.read_text()[-2000:]}")


def send_all(url: str, prompts: list[str], budget: str, workers: int, seed0: int) -> list[dict]:
    def one(i: int) -> dict:
        with httpx.Client(timeout=300) as c:
            r = c.post(url + "/v1/completions", json={"model": "isocompute", "prompt": prompts[i], "budget": budget,
                                                       "seed": seed0 + i, "max_tokens": 32768})
            return r.json() if r.status_code == 200 else {"error": r.status_code, "text": r.text[:200]}

    with ThreadPoolExecutor(workers) as ex:
        return list(ex.map(one, range(len(prompts))))


def grade(resps: list[dict], ids: list[str], verdicts: dict) -> tuple[float, float, int]:
    ok, tok, errors = 0.0, 0.0, 0
    for r, rid in zip(resps, ids, strict=True):
        if "isocompute" not in r:
            errors += 1
            continue
        ok += verdicts[rid].get(r["isocompute"]["answer"], 0.0)
        tok += r["isocompute"]["tokens"]
    n = max(len(resps) - errors, 1)
    return ok / n, tok / n, errors


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("table", type=Path)
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--explore", type=float, default=0.05)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--budget", type=float, default=4.0)
    args = ap.parse_args(argv)
    from isocompute.solver.costs import token_multiple_of
    from isocompute.solver.outcomes import read_outcomes

    t = read_outcomes(args.table)
    unit = token_multiple_of(t.mean_completion_tokens)
    verdicts = {rid: {} for rid in t.ids}
    for rid, rec in zip(t.ids, t.records, strict=True):
        for s in rec["samples"]:
            if s["answer"] is not None:
                verdicts[rid][s["answer"]] = float(s["correct"])
    order = list(range(len(t)))
    random.Random(0).shuffle(order)
    half_a, half_b = sorted(order[: len(t) // 2]), sorted(order[len(t) // 2:])
    work = Path(tempfile.mkdtemp(prefix="isocompute-loop-"))
    cap, log = work / "capture", work / "log.txt"
    rport, gport = free_port(), free_port()
    rurl, gurl = f"http://127.0.0.1:{rport}", f"http://127.0.0.1:{gport}"
    procs = [start([sys.executable, "-m", "isocompute", "replay", str(args.table), "--port", str(rport),
                    "--decode-tps", "1e7", "--max-tps", "1e9", "--max-seqs", "100000", "--stream-interval", "4096",
                    "--prefill-s-per-token", "0"], log)]
    try:
        wait(rurl, "/health", procs[0], log)
        import hashlib

        env = {"ISOCOMPUTE_ADMIN_KEY_SHA256": hashlib.sha256(ADMIN.encode()).hexdigest(),
               "ISOCOMPUTE_COLD_START_SAMPLE_TOKENS": str(unit), "ISOCOMPUTE_MAX_TOKENS_LIMIT": "40000",
               "ISOCOMPUTE_DEFAULT_MAX_TOKENS": "32768", "ISOCOMPUTE_ANSWER_KIND": "math",
               "ISOCOMPUTE_MAX_BUDGET": "1e9", "ISOCOMPUTE_UPSTREAM_TIMEOUT_S": "600"}
        procs.append(start([sys.executable, "-m", "isocompute", "serve", "--upstream", rurl, "--capture", str(cap),
                            "--explore", str(args.explore), "--capture-prompts", "--port", str(gport),
                            "--log-level", "warning"], log, env))
        wait(gurl, "/ready", procs[1], log)
        budget = f"{args.budget:g}x"
        pa = [t.prompts[i] for i in half_a]
        stream = [pa[i % len(pa)] for i in range(args.requests)]
        t0 = time.monotonic()
        resp = send_all(gurl, stream, budget, args.workers, 0)
        metrics = httpx.get(gurl + "/metrics").text
        explore_tok = float(re.search(r"^isocompute_explore_tokens_total (\S+)$", metrics, re.M).group(1))
        served = sum(r["isocompute"]["tokens"] for r in resp if "isocompute" in r)
        n_ok = sum("isocompute" in r for r in resp)
        print(f"phase 1: {n_ok}/{len(resp)} requests in {time.monotonic() - t0:.0f} s; realised tokens per request "
              f"with exploration {(served + explore_tok) / n_ok / unit:.3f}x (budget {budget}; served "
              f"{served / n_ok / unit:.3f}x + explored {explore_tok / n_ok / unit:.3f}x)")
        ids_b = [t.ids[i] for i in half_b] * args.reps
        pb = [t.prompts[i] for i in half_b] * args.reps
        results = {"cold start": grade(send_all(gurl, pb, budget, args.workers, 10**6), ids_b, verdicts)}
        time.sleep(5)  # the last explorations finish
        out = subprocess.run([sys.executable, "-m", "isocompute", "refit", str(cap), "--out", str(work / "refit"),
                              "--gateway", gurl], cwd=REPO, capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO), "ISOCOMPUTE_ADMIN_KEY": ADMIN})
        print(f"refit (exit {out.returncode}):\n{out.stdout}{out.stderr[-800:]}")
        if out.returncode == 0:
            results["refitted (consensus)"] = grade(send_all(gurl, pb, budget, args.workers, 10**6), ids_b, verdicts)
        gold_dir = work / "gold"
        sub = t.subset(half_a)
        tab = work / "half_a.jsonl"
        tab.write_text("".join(json.dumps(r) + "\n" for r in sub.records))
        subprocess.run([sys.executable, "-m", "isocompute", "fit", str(tab), "--target", "gold", "--cost-unit",
                        "tokens", "--out", str(gold_dir)], cwd=REPO, capture_output=True, check=True,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
        httpx.post(gurl + "/admin/reload", json={"policy_dir": str(gold_dir)},
                   headers={"Authorization": f"Bearer {ADMIN}"}, timeout=120).raise_for_status()
        results["gold-fitted"] = grade(send_all(gurl, pb, budget, args.workers, 10**6), ids_b, verdicts)
        for name, (acc, tok, err) in results.items():
            print(f"{name}: accuracy on gold {acc:.4f}, tokens {tok / unit:.3f}x per request, {err} errors")
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(60)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
