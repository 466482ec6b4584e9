"""``isocompute demo``: the whole Solve-then-Learn loop on the embedded default, CPU only, no network.

Stages, each skipped when its artifact is already there (so an interrupted demo resumes, and a second
run is instant)::

    train sft   → DIR/tiny-sft           the tiny arith model: the embedded checkpoint, or trained from scratch
                                         with ``--train`` (about 3.5 min more on one core)
    sample      → DIR/outcomes.jsonl     n samples per held-out arith prompt, graded (resumable itself)
    solve       → DIR/solution/          oracle actions at the demo budget + the accuracy-vs-budget frontier
    fit         → DIR/policy/            the budget-conditioned LightGBM policy
    report      → DIR/report/            held-out regret against oracle, uniform, heuristic, random

Each stage is the ordinary subcommand (the same parser and code path a user runs by hand, taken from the
``isocompute`` command's subparsers); this module only chains them and decides what is already done.
``--force`` redoes every stage.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

# The SFT stage trains on arith seed TRAIN_SEED_OFFSET + seed; the demo samples held-out problems from
# small seeds, which SFT never draws from.
HELD_OUT_DATA_SEED = 1


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "demo", help="train, sample, solve, fit and report on the embedded tiny model (CPU, minutes)",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--out", default="runs/demo", help="directory for every stage's artifact")
    p.add_argument("--prompts", type=int, default=800, help="held-out arith prompts to sample")
    p.add_argument("--n", type=int, default=16, help="samples per prompt")
    p.add_argument("--actions", default="1,2,4,8,16", help="sample counts k the policy chooses from")
    p.add_argument("--budget", type=float, default=4.0, help="mean samples per prompt for solve and the report")
    p.add_argument("--train", action="store_true",
                   help="train the tiny model from scratch (`isocompute train sft`, 1200 steps: about 3.5 min on one "
                        "core) instead of copying the embedded checkpoint that this same command wrote")
    p.add_argument("--sft-steps", type=int, default=None,
                   help="SFT optimiser steps; implies --train (default: the SFT default)")
    p.add_argument("--seed", type=int, default=0, help="seed for every stage")
    p.add_argument("--report-seeds", default="1",
                   help="CV seeds of the demo's report (the full report, `isocompute report`, runs 3; one keeps "
                        "the demo within five minutes on two cores)")
    p.add_argument("--workers", type=int, default=0,
                   help="processes the sample stage and the report's folds run in (0: one per CPU core; the same "
                        "samples and report, sooner)")
    p.add_argument("--force", action="store_true", help="redo every stage even when its artifact exists")
    # The stages run through the other subcommands' parsers (subparsers.choices: name → parser), filled in
    # by the time the demo runs.
    p.set_defaults(func=lambda args: run(args, subparsers.choices))


def _invoke(commands: Mapping[str, argparse.ArgumentParser], argv: list[str]) -> int:
    """``isocompute ARGV`` in this process, as the command runs it: its exit code, errors printed."""
    from isocompute.cli.running import run_parsed

    return run_parsed(commands[argv[0]].parse_args(argv[1:]), argv[0])


def _stage(commands: Mapping[str, argparse.ArgumentParser], name: str, done: Path, argv: list[str], *,
           force: bool) -> None:
    if done.exists() and not force:
        print(f"[demo] {name}: {done} exists, skipped (--force redoes it)")
        return
    print(f"[demo] {name}: isocompute {' '.join(argv)}", flush=True)
    t0 = time.perf_counter()
    rc = _invoke(commands, argv)
    if rc != 0:
        from isocompute.errors import IsoComputeError

        raise IsoComputeError(f"stage {name!r} failed (exit {rc}); fix the error above and rerun "
                              "`isocompute demo` — finished stages are kept.")
    print(f"[demo] {name}: done in {time.perf_counter() - t0:.0f} s", flush=True)


def run(args: argparse.Namespace, commands: Mapping[str, argparse.ArgumentParser]) -> int:
    from isocompute.errors import InputError

    if args.prompts < 20 or args.n < 1:
        raise InputError("--prompts must be ≥ 20 (the report cross-validates over prompts) and --n ≥ 1.")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model, outcomes = out / "tiny-sft", out / "outcomes.jsonl"
    solution, policy, report = out / "solution", out / "policy", out / "report"
    seed = str(args.seed)
    if args.force:
        # sample resumes from an existing table, so a forced redo must start from an empty one
        outcomes.unlink(missing_ok=True)
    t0 = time.perf_counter()

    sft = ["train", "sft", "--task", "arith", "--out", str(model), "--seed", seed]
    if args.sft_steps is not None:
        sft += ["--steps", str(args.sft_steps)]
    if args.train or args.sft_steps is not None or args.seed != 0:
        _stage(commands, "train sft", model / "manifest.json", sft, force=args.force)
    elif (model / "manifest.json").exists() and not args.force:
        print(f"[demo] train sft: {model / 'manifest.json'} exists, skipped (--force redoes it)")
    else:
        from isocompute.training.embedded import TINY_SFT, copy_tiny_sft

        copy_tiny_sft(model)
        print(f"[demo] train sft: shortened — copied the embedded checkpoint {TINY_SFT.name} (what `isocompute "
              "train sft --task arith --seed 0` wrote: 1200 steps, 196 s on one core) to "
              f"{model}; --train trains it here instead", flush=True)

    # `sample` resumes by itself: a table that stopped half-way is continued, not redone.
    workers = args.workers or os.cpu_count() or 1
    if _table_complete(outcomes, args.prompts) and not args.force:
        print(f"[demo] sample: {outcomes} has {args.prompts} prompts, skipped")
    else:
        argv = ["sample", "--task", "arith", "--limit", str(args.prompts), "--data-seed", str(HELD_OUT_DATA_SEED),
                "--engine", "transformers", "--model", str(model), "--n", str(args.n), "--temperature", "1.0",
                "--seed", seed, "--threads", "1"]
        if workers == 1:
            _stage(commands, "sample", out / ".never", [*argv, "--out", str(outcomes)], force=True)
        else:
            _sample_shards(argv, outcomes, workers, args.prompts, force=args.force)

    common = ["--actions", args.actions, "--strategy", "majority"]
    lo, hi = min(int(a) for a in args.actions.split(",")), max(int(a) for a in args.actions.split(","))
    _stage(commands, "solve", solution / "manifest.json", [
        "solve", str(outcomes), *common, "--budget", str(args.budget), "--budgets", f"{lo}:{hi}:0.5",
        "--out", str(solution)], force=args.force)
    _stage(commands, "fit", policy / "manifest.json", [
        "fit", str(outcomes), *common, "--budgets", f"{lo}:{hi}", "--seed", seed, "--out", str(policy)],
        force=args.force)
    full = ["report", str(outcomes), "--policy", str(policy), "--seed", seed]
    print(f"[demo] report: cross-validated over {args.report_seeds} seed(s) of 5 folds (the full report over 3: "
          f"isocompute {' '.join(full)} --out {out / 'report-full'})", flush=True)
    _stage(commands, "report", report / "manifest.json", [
        *full, "--seeds", args.report_seeds, "--workers", str(args.workers), "--out", str(report)],
        force=args.force)

    print(f"[demo] all stages done in {time.perf_counter() - t0:.0f} s. Report: {report / 'report.md'}; "
          f"serve it with: isocompute serve --policy {policy} --engine transformers --model {model}")
    return 0


def _sample_shards(argv: list[str], outcomes: Path, workers: int, prompts: int, *, force: bool) -> None:
    """The sample stage as ``workers`` processes (``sample ARGV --out SHARD --shard I/N``), each drawing the
    samples one process would for its batches, then their tables merged in problem order into ``outcomes``."""
    from isocompute.errors import IsoComputeError
    from isocompute.solver.outcome_writer import merge_shards
    from isocompute.tasks.registry import load_task

    shards = [outcomes.with_name(f"{outcomes.stem}.shard{i}of{workers}.jsonl") for i in range(workers)]
    if force:
        for path in shards:
            path.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "isocompute", *argv]
    print(f"[demo] sample: {workers} processes, isocompute {' '.join(argv)} --out {outcomes} --shard I/{workers}",
          flush=True)
    t0 = time.perf_counter()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with _shards_stopped_with_the_demo() as start:
        procs = [start([*cmd, "--out", str(path), "--shard", f"{i}/{workers}", "--no-progress", "--grade-workers", "1"],
                       env) for i, path in enumerate(shards)]
        failed = [i for i, proc in enumerate(procs) if proc.wait() != 0]
    if failed:
        raise IsoComputeError(f"stage 'sample' failed in shard(s) {failed}; fix the error above and rerun "
                              "`isocompute demo` — finished prompts are kept.")
    order = [p.id for p in load_task("arith", None, prompts, HELD_OUT_DATA_SEED)]
    merge_shards(shards, outcomes, order)
    for path in shards:
        path.unlink()
    print(f"[demo] sample: done in {time.perf_counter() - t0:.0f} s", flush=True)


@contextlib.contextmanager
def _shards_stopped_with_the_demo() -> Iterator[Callable[[list[str], dict[str, str]], subprocess.Popen]]:
    """``start(cmd, env)`` runs a shard in its own process group (the shard and its grading worker). SIGTERM,
    Ctrl-C or an error while the shards run stops every group started: a container's stop reaches only the
    demo, and so does a terminal's Ctrl-C now. SIGTERM then ends the demo as it would have (killed by the
    signal); Ctrl-C raises KeyboardInterrupt as before. Finished prompts are kept.

    The handler only signals, never waits: it may interrupt ``Popen.wait()``, which holds the Popen's lock,
    so a wait there blocks until its timeout (a fresh-clone CI run took 10.4 s to stop). A signal that lands
    while a shard starts is acted on once the shard is known, so that shard is stopped too."""
    procs: list[subprocess.Popen] = []
    state = {"starting": False, "pending": 0}

    def signal_all() -> None:
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)

    def die(signum: int) -> None:
        signal_all()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    def act(signum: int) -> None:
        if signum == signal.SIGINT:
            raise KeyboardInterrupt  # as Python's own handler would; the except below stops the shards
        die(signum)

    def on_signal(signum: int, frame: Any) -> None:
        if state["starting"]:
            state["pending"] = signum
        else:
            act(signum)

    def start(cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
        state["starting"] = True
        try:
            procs.append(subprocess.Popen(cmd, env=env, process_group=0))
        finally:
            state["starting"] = False
        if state["pending"]:
            act(state["pending"])
        return procs[-1]

    sigs = (signal.SIGTERM, signal.SIGINT) if threading.current_thread() is threading.main_thread() else ()
    previous = {sig: signal.signal(sig, on_signal) for sig in sigs}
    try:
        yield start
    except BaseException:
        signal_all()
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _table_complete(path: Path, prompts: int) -> bool:
    if not path.exists():
        return False
    from isocompute.solver.outcomes import completed_ids

    return len(completed_ids(path)) >= prompts
