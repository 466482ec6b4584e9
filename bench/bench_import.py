"""Benchmark ``isocompute import`` of the three MATH-500 dumps (3 × 500 × 80 = 120,000 samples) against
per-sample grading.

Target (issue 13): import + grading of the three dumps in ≤ 2 minutes, progress bar shown.

Arms, each run as its own process so its whole process tree (the math-verify pool included) is measured:

* ``import`` — ``isocompute import boinf DUMP --problems math500_test.jsonl`` into a fresh directory:
  read, join, math-verify keys and class merging in the grading pool (2 workers), write, read back;
* ``per-sample`` (the named baseline) — today's ``sample`` grading path on the same answers:
  :meth:`isocompute.tasks.grading.Grader.run` over every (gold, answer) sample, one math-verify call per
  sample whose string differs from the gold (no classes, no cache across samples), same pool size.

Printed per dump and in total: wall seconds and CPU seconds of the process tree (polled from /proc, so
pool workers count), and the ratio import / per-sample with a 95% t-interval over dumps × repeats. The
machine is shared: wall swings with other people's load, CPU seconds much less.

    .venv/bin/python bench/bench_import.py [--data ../shared/data] [--repeats 1] [--skip-baseline]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("Phi-4-reasoning", "Qwen3-14B", "gpt-oss-20b")


def tree_cpu(pid: int, seen: dict[int, float]) -> None:
    """Update ``seen[pid]`` with the CPU seconds of ``pid`` and each live descendant."""
    tick = os.sysconf("SC_CLK_TCK")
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            seen[p] = (int(fields[11]) + int(fields[12])) / tick
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, IndexError, ValueError):
            continue


def timed(cmd: list[str]) -> tuple[float, float, str]:
    """Run ``cmd``; (wall s, CPU s of its process tree, stderr tail). CPU is polled every 50 ms, so a
    short-lived process may lose its last 50 ms."""
    seen: dict[int, float] = {}
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    while proc.poll() is None:
        tree_cpu(proc.pid, seen)
        time.sleep(0.05)
    wall = time.perf_counter() - start
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err[-2000:]}")
    return wall, sum(seen.values()), out + err[-400:]


def baseline_arm(dump: Path) -> None:
    """The per-sample baseline, in this process: grade every sample of ``dump`` with Grader.run."""
    from isocompute.tasks.grading import Grader

    pairs = []
    for line in dump.read_text().splitlines():
        rec = json.loads(line)
        pairs += [(rec["gold_answer"], a or "", "math") for a, _ in rec["all_answers"]]
    with Grader(workers=2) as g:
        result = g.run(pairs)
    print(f"graded {len(pairs)} samples, accuracy {sum(result.correct) / len(pairs):.4f}")


def interval(xs: list[float]) -> str:
    if len(xs) < 2:
        return f"{xs[0]:.2f}"
    m, s = statistics.mean(xs), statistics.stdev(xs)
    h = stats.t.ppf(0.975, len(xs) - 1) * s / len(xs) ** 0.5
    return f"{m:.2f} [{m - h:.2f}, {m + h:.2f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--skip-baseline", action="store_true")
    ap.add_argument("--baseline-arm", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.baseline_arm:
        baseline_arm(args.baseline_arm)
        return
    dumps = [args.data / "real" / "boinf" / f"analysis_math500_{m}.jsonl" for m in MODELS]
    problems = args.data / "math500_test.jsonl"
    missing = [p for p in [*dumps, problems] if not p.is_file()]
    if missing:
        raise SystemExit(f"missing {missing}; pass --data DIR holding real/boinf/ and math500_test.jsonl")
    print(f"isocompute import boinf vs per-sample Grader.run; 3 dumps × 500 × 80 samples; repeats={args.repeats}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    totals = {"import": [0.0, 0.0], "per-sample": [0.0, 0.0]}
    wall_ratios, cpu_ratios = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for model, dump in zip(MODELS, dumps, strict=True):
                out = Path(tmp) / f"{model}-{r}.jsonl"
                w, c, log = timed([sys.executable, "-m", "isocompute", "import", "boinf", str(dump),
                                   "--problems", str(problems), "--out", str(out)])
                shown = "progress bar shown" if "import boinf: 100%" in log else "NO progress bar"
                totals["import"][0] += w
                totals["import"][1] += c
                line = f"{model:16s} import {w:6.1f} s wall {c:6.1f} s CPU ({shown})"
                if not args.skip_baseline:
                    bw, bc, _ = timed([sys.executable, str(Path(__file__)), "--baseline-arm", str(dump)])
                    totals["per-sample"][0] += bw
                    totals["per-sample"][1] += bc
                    wall_ratios.append(w / bw)
                    cpu_ratios.append(c / bc)
                    line += f" | per-sample {bw:6.1f} s wall {bc:6.1f} s CPU | ratio wall {w / bw:.2f} CPU {c / bc:.2f}"
                print(line, flush=True)
    n = args.repeats
    wall, cpu = totals["import"][0] / n, totals["import"][1] / n
    verdict = "met" if wall <= 120 else "MISSED"
    print(f"import of the three dumps: {wall:.1f} s wall, {cpu:.1f} s CPU per repeat (target ≤ 120 s wall: {verdict})")
    if wall_ratios:
        print(f"per-sample baseline: {totals['per-sample'][0] / n:.1f} s wall, {totals['per-sample'][1] / n:.1f} s CPU")
        print(f"ratio import / per-sample (mean, 95% CI over dumps × repeats): wall {interval(wall_ratios)}, "
              f"CPU {interval(cpu_ratios)}")


if __name__ == "__main__":
    main()
