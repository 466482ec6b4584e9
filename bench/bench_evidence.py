"""Evidence-aware plans vs the best fixed plan and uniform, at matched tokens and latency, cross-validated.

    python bench/bench_evidence.py /tmp/lat/gpt-oss-20b.jsonl /tmp/lat/Qwen3-14B.jsonl \
        /tmp/lat/Phi-4-reasoning.jsonl [--waves 4,8] [--draws 16] [--eval-draws 32] [--out docs/evidence]

Per table (token counts on every sample), the block of :mod:`isocompute.evaluation.evidence_report` — the
same one ``isocompute report`` writes for a policy fitted with ``isocompute evidence``: the served chain
(learned-from-evidence → best fixed mixture, chosen on the other folds) against the best fixed mixture
chosen on the other folds (CV), the best fixed mixture at the chain's realised tokens and latency
(hindsight), and uniform at the chain's realised tokens and latency; every rule family's fixed plans (waiting and parallel-stop) are in the menu. It
prints the markdown table and writes ``evidence_<table>.json`` and the calibration plot to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from isocompute.evaluation.evidence_report import evidence_block, evidence_markdown, plot_calibration  # noqa: E402
from isocompute.solver.outcomes import read_outcomes  # noqa: E402
from isocompute.solver.plans.plan import default_plans, parallel_plans  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tables", nargs="+")
    ap.add_argument("--waves", default="4,8")
    ap.add_argument("--draws", type=int, default=16)
    ap.add_argument("--eval-draws", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--confidence", action="store_true", help="the heads also read confidence (offline only)")
    ap.add_argument("--out", default=None, help="folder for evidence_<table>.json and calibration_<table>.png")
    a = ap.parse_args()
    waves = tuple(int(w) for w in a.waves.split(","))
    for path in a.tables:
        t = read_outcomes(path)
        L = t.completion_tokens[t.mask]
        menu = [p.name for p in default_plans() + parallel_plans() if p.max_samples <= int(t.n_samples.min())]
        t0 = time.perf_counter()
        block = evidence_block(t, waves, menu, unit=float(np.median(L)), per_sample=float(np.mean(L)),
                               draws=a.draws, eval_draws=a.eval_draws, seed=a.seed,
                               use_confidence=a.confidence)
        name = Path(path).stem + ("-confidence" if a.confidence else "")
        print(evidence_markdown(block, f"— {name} ({len(t)} prompts, {time.perf_counter() - t0:.0f} s)"), flush=True)
        if a.out:
            out = Path(a.out)
            out.mkdir(parents=True, exist_ok=True)
            (out / f"evidence_{name}.json").write_text(json.dumps(block, indent=1) + "\n")
            plot_calibration(block, out / f"calibration_{name}.png", name)


if __name__ == "__main__":
    main()
