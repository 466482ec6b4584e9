"""Served vs promised: what ``isocompute serve`` delivers over replay upstreams against what ``isocompute report``
estimated for the same policy on the same held-out prompts.

Per table (outcome tables with token counts): the prompts split in two halves (seeded); ``fit --cost-unit tokens
--budgets 1x:16x --latency-budgets LO:HI`` on the first; ``report --holdout --budgets 2x,4x,8x`` on the second
(the baseline: the estimate); then the second half served by ``isocompute serve --policy`` over one
``isocompute replay`` of it (a SIMULATOR: recorded answers and lengths, modelled seconds), ``--requests`` seeded
requests per prompt at ``--concurrency`` in flight, budget control on and off. Per budget and control setting it
prints report vs served: accuracy against gold (the answer the gateway returned, graded by the table's own
verdict of that answer), completion tokens per request, waves, latency in sample lengths and in seconds (the
report's at the replay's per-sequence decode rate; the served, the replay's modelled clock), samples aborted
(served only: the report has no such channel), each served mean with a bootstrap 95% CI over prompts, and
served/report ratios. Targets (issue 30): tokens within ±3%, accuracy inside the report's 95% CI, latency
(sample lengths) within ±5%.

    python bench/bench_served_vs_report.py /work/tables/gsm8k_tok.jsonl --out /tmp/served --requests 4

Ignores: probe policies, several models, latency budgets on requests (the report's rows carry none either).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from bench_gateway import start_gateway, stop, wait_ready  # noqa: E402

from isocompute.cli import main as cli  # noqa: E402
from isocompute.engines.vllm_server import free_port  # noqa: E402
from isocompute.replay.process import start_replay  # noqa: E402
from isocompute.replay.table import FIRST_FILLER, answer_text  # noqa: E402
from isocompute.tasks.answers.extract import extract_answer  # noqa: E402

BUDGETS = ("2x", "4x", "8x")


def split(table: Path, out: Path, seed: int, limit: int | None) -> tuple[Path, Path, list[dict]]:
    """(fit half, held-out half, held-out rows): a seeded split of the table's rows."""
    rows = [json.loads(x) for x in table.read_text().splitlines() if x.strip()]
    random.Random(seed).shuffle(rows)
    half = len(rows) // 2
    fit, held = rows[:half], rows[half:]
    if limit:
        fit, held = fit[:limit], held[:limit]
    out.mkdir(parents=True, exist_ok=True)
    a, b = out / "fit.jsonl", out / "held.jsonl"
    a.write_text("".join(json.dumps(r) + "\n" for r in fit))
    b.write_text("".join(json.dumps(r) + "\n" for r in held))
    return a, b, held


def verdicts(row: dict) -> dict[str | None, bool]:
    """The answer the gateway extracts from each recorded sample's replayed text → the table's verdict."""
    task = str((row.get("meta") or {}).get("task") or "")
    out: dict[str | None, bool] = {None: False}
    for s in row["samples"]:
        if s.get("answer") is not None:
            got = extract_answer(FIRST_FILLER + answer_text(task, str(s["answer"]))[0])
            out[got] = out.get(got, False) or bool(s.get("correct"))
    return out


def latency_range(table: Path) -> str:
    from bench_latency_policy import table_facts

    lo, _ = table_facts(table, 0.0)
    return f"{lo}:{max(4.0, lo * 4):.3f}"


def fit_and_report(fit_t: Path, held_t: Path, out: Path, decode_tps: float) -> dict:
    pol, rep = out / "policy", out / "report"
    if not (pol / "manifest.json").exists():
        cli(["fit", str(fit_t), "--cost-unit", "tokens", "--budgets", "1x:16x", "--latency-budgets",
             latency_range(fit_t), "--out", str(pol), "--seed", "0"])
    if not (rep / "report.json").exists():  # "4x": 4 × the policy's tokens per sample, as the gateway reads it
        unit = json.loads((pol / "policy.json").read_text())["tokens_per_sample"]
        cli(["report", str(held_t), "--policy", str(pol), "--holdout", "--budgets",
             ",".join(f"{float(b[:-1]) * unit:.6g}" for b in BUDGETS), "--out", str(rep),
             "--decode-speed", str(decode_tps)])
    return json.loads((rep / "report.json").read_text())


async def load(url: str, jobs: list[tuple[int, str, str, int]], concurrency: int) -> list[dict]:
    """Each job (prompt index, prompt, budget, seed) as one completions request; ``concurrency`` in flight."""
    out: list[dict] = []
    queue = list(jobs)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=600, limits=limits) as c:
        async def worker() -> None:
            while queue:
                i, prompt, budget, seed = queue.pop()
                r = await c.post(f"{url}/v1/completions", json={"model": "isocompute", "prompt": prompt,
                                                                "budget": budget, "seed": seed, "temperature": 1.0})
                if r.status_code != 200:
                    out.append({"i": i, "error": r.status_code, "text": r.text[:300]})
                    continue
                d = r.json()
                info = d["isocompute"]
                runs = info.get("wave_runs") or []
                out.append({"i": i, "answer": info["answer"], "tokens": d["usage"]["completion_tokens"],
                            "waves": info["waves"], "decode": sum(w["decode_tokens"] for w in runs),
                            "latency_s": info.get("latency_s"),
                            "aborted": sum(w["aborted"] for w in info.get("wave_runs") or []), "k": info["k"]})
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return out


def boot_ci(per_prompt: np.ndarray, draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(per_prompt), size=(draws, len(per_prompt)))
    m = per_prompt[idx].mean(axis=1)
    return float(np.quantile(m, 0.025)), float(np.quantile(m, 0.975))


def served_summary(records: list[dict], held: list[dict]) -> dict:
    """Per-prompt means (the unit of the CIs), then their mean and CI per quantity."""
    ok = [r for r in records if "error" not in r]
    table = [verdicts(row) for row in held]
    # latency in sample lengths as the report counts it: decode tokens over the held-out table's mean sample
    unit = float(np.mean([s["completion_tokens"] for row in held for s in row["samples"]]))
    for r in ok:
        r["latency"] = r["decode"] / unit
    out: dict = {"requests": len(records), "errors": len(records) - len(ok)}
    for key in ("accuracy", "tokens", "waves", "latency", "latency_s", "aborted"):
        per: dict[int, list[float]] = {}
        for r in ok:
            v = float(table[r["i"]].get(r["answer"], False)) if key == "accuracy" else r[key]
            if v is not None:
                per.setdefault(r["i"], []).append(float(v))
        arr = np.array([np.mean(v) for v in per.values()])
        out[key] = {"mean": float(arr.mean()) if len(arr) else None, "ci95": boot_ci(arr) if len(arr) else None}
    return out


def serve_half(held_t: Path, held: list[dict], pol: Path, out: Path, args: argparse.Namespace,
               control: bool) -> dict[str, dict]:
    kind = str((held[0].get("meta") or {}).get("answer_kind") or "number")
    rport, gport = free_port(), free_port()
    rep = start_replay([held_t], rport, log=out / "replay.log", decode_tps=args.decode_tps, max_tps=args.max_tps,
                       stream_interval=args.stream_interval, max_seqs=args.max_seqs)
    env = {"ISOCOMPUTE_ANSWER_KIND": kind, "ISOCOMPUTE_BUDGET_CONTROL": str(control).lower(),
           "ISOCOMPUTE_DEFAULT_MAX_TOKENS": "131072", "ISOCOMPUTE_MAX_TOKENS_LIMIT": "131072",
           "ISOCOMPUTE_UPSTREAM_TIMEOUT_S": "600", "ISOCOMPUTE_MAX_BUDGET": "1e12",
           "ISOCOMPUTE_GRADE_WORKERS": "1", "ISOCOMPUTE_MAX_PROMPT_CHARS": "200000"}
    gw = start_gateway(pol, gport, out / f"gateway-{control}.log", upstream=rep.url, env=env)
    url = f"http://127.0.0.1:{gport}"
    results = {}
    try:
        wait_ready(url, gw, out / f"gateway-{control}.log")
        for b in BUDGETS:
            jobs = [(i, row["prompt"], b, 1000 * s + i) for i, row in enumerate(held) for s in range(args.requests)]
            random.Random(0).shuffle(jobs)
            t0 = time.perf_counter()
            recs = asyncio.run(load(url, jobs, args.concurrency))
            results[b] = served_summary(recs, held) | {"wall_s": time.perf_counter() - t0}
            errs = [r for r in recs if "error" in r][:3]
            if errs:
                print(f"  errors at {b}: {errs}", flush=True)
    finally:
        stop(gw)
        rep.stop()
    return results


def report_rows(report: dict) -> dict[str, dict]:
    rows = {}
    for e, b in zip(report["budgets"], BUDGETS, strict=True):
        m = e["methods"]["learned"]
        rows[b] = {"accuracy": m["accuracy"], "ci95": m["ci95"], "tokens": m.get("tokens", m["cost"]),
                   "waves": m.get("waves"), "latency": m.get("latency"), "latency_s": m.get("latency_s")}
    return rows


def fmt(x: float | None, spec: str = ".3f") -> str:
    return "—" if x is None else format(x, spec)


def compare(name: str, rep: dict, served: dict, control: bool) -> list[dict]:
    lines = []
    print(f"\n{name}: budget control {'on' if control else 'off'} (report → served [95% CI]; ratio)")
    for b in BUDGETS:
        r, s = rep[b], served[b]
        acc_in = r["ci95"][0] <= s["accuracy"]["mean"] <= r["ci95"][1]
        tok = s["tokens"]["mean"] / r["tokens"]
        lat = None if r["latency"] is None or s["latency"]["mean"] is None else s["latency"]["mean"] / r["latency"]
        print(f"  {b}: accuracy {r['accuracy']:.3f} [{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}] → "
              f"{s['accuracy']['mean']:.3f} [{s['accuracy']['ci95'][0]:.3f}, {s['accuracy']['ci95'][1]:.3f}] "
              f"({'inside' if acc_in else 'OUTSIDE'});  tokens {r['tokens']:.0f} → {s['tokens']['mean']:.0f} "
              f"[{s['tokens']['ci95'][0]:.0f}, {s['tokens']['ci95'][1]:.0f}] (×{tok:.3f});  waves {fmt(r['waves'], '.2f')}"
              f" → {s['waves']['mean']:.2f};  latency {fmt(r['latency'])} → {fmt(s['latency']['mean'])} "
              f"(×{fmt(lat)});  seconds {fmt(r['latency_s'], '.2f')} → {fmt(s['latency_s']['mean'], '.2f')};  "
              f"aborted/request {s['aborted']['mean']:.2f};  {s['requests']} requests, {s['errors']} errors, "
              f"{s['wall_s']:.0f} s", flush=True)
        lines.append({"table": name, "control": control, "budget": b, "report": r, "served": s,
                      "tokens_ratio": tok, "latency_ratio": lat, "accuracy_inside_ci": acc_in,
                      "tokens_ok": abs(tok - 1) <= 0.03, "latency_ok": lat is not None and abs(lat - 1) <= 0.05})
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tables", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--requests", type=int, default=4, help="requests per held-out prompt and budget")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--limit", type=int, help="prompts per half (a shorter run)")
    ap.add_argument("--decode-tps", type=float, default=20000.0, help="the replay's decode tokens/s per sequence")
    ap.add_argument("--max-tps", type=float, default=2e6, help="the replay's aggregate tokens/s ceiling")
    ap.add_argument("--max-seqs", type=int, default=4096)
    ap.add_argument("--stream-interval", type=int, default=64, help="tokens per chunk")
    ap.add_argument("--control", default="on,off", help="budget control settings to run: on,off")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    all_lines = []
    for t in args.tables:
        out = args.out / t.stem
        fit_t, held_t, held = split(t, out, args.seed, args.limit)
        rep = report_rows(fit_and_report(fit_t, held_t, out, args.decode_tps))
        for control in [c == "on" for c in args.control.split(",")]:
            served = serve_half(held_t, held, out / "policy", out, args, control)
            all_lines += compare(t.stem, rep, served, control)
            (args.out / "results.json").write_text(json.dumps(all_lines, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
