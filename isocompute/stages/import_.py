"""The import stage (``isocompute import FORMAT SRC... --out TABLE.jsonl``): samples a user already has →
an outcome table.

Formats (:mod:`isocompute.tasks.importers`): ``jsonl`` (any JSONL / JSON array, mapped with ``--field
KEY=PATH`` or ``--mapping FILE``), ``boinf`` (BoInf's MATH-500 answer lists; ``--problems`` gives the
problem text, joined by index), ``mot`` (MoT's Llama-2 GSM8K / Date lists). Every record is graded
with its task's rule (:mod:`isocompute.tasks.answers.equivalence`: math-verify in a process pool for math,
numbers, dates, letters, strings) and each sample stores its raw ``answer``, its ``class`` and
``correct``; the task is ``--task`` or the record's own (a ``task`` field, or what the format implies).

The job, :func:`import_samples`, is resumable and atomic:

* lines go to ``TABLE.jsonl.partial``, one flushed line per prompt; an interrupted run is resumed by
  rerunning the same command (finished prompts are skipped, a cut-off last line dropped), and
  ``TABLE.jsonl`` appears only when every prompt is in, by one rename, after the whole table has been
  read back through :func:`isocompute.solver.outcomes.read_outcomes`;
* ``TABLE.jsonl.manifest.json`` (written atomically at the start and again at the end) holds the
  sources' and the problem file's sha256, the options, and at the end the table's sha256 and the
  figures printed by the command. A rerun with other sources or options refuses to mix them in.

Bad input: a malformed record is an error naming file and line; a gold answer that cannot be read as
its task's kind is reported with its id (and counted in the manifest) and the record left out, never
graded wrong; join lengths that differ are an error that gives both.

Token counts: a dump's own (BoInf's per-sample output tokens; ``completion_tokens`` mapped in
``jsonl``) are kept. With ``--tokenizer DIR`` (a local Hugging Face tokenizer) ``prompt_tokens`` is
counted on the prompt text (without any chat template: the dump's is unknown) and completion tokens on
completions that have no counts (MoT's). ``solve --cost-unit flops`` needs both on every row plus
``--model-config``; without a tokenizer, use ``--cost-unit samples``.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from isocompute.errors import InputError
from isocompute.stages.options import option

SCHEMA_VERSION = 1
KIND = "outcome-import"
FORMAT_CHOICES = ("jsonl", "boinf", "mot")


@dataclass(kw_only=True)
class ImportConfig:
    """One import run (the options of ``isocompute import``, each documented on its field); checked once."""

    format: str = option(flag="format", choices=FORMAT_CHOICES, help="the dump's layout")
    sources: list[Path] = option(flag="sources", nargs="+", type=Path, metavar="SRC",
                                 help="dump file(s), JSONL or a JSON array")
    out: Path = option(type=Path, help="outcome table to write (.jsonl)")
    task: str | None = option(None, help="task or answer kind of every record (math, gsm8k, arith, date, or a kind: "
                                         "math, number, date, choice, exact); default: the record's own, or the format's")
    problems: Path | None = option(None, type=Path,
                                   help="boinf: problem file joined by index (e.g. MATH-500 test.jsonl)")
    question_field: str = option("problem", help="boinf: the problem file's text field")
    fields: list[str] = option([], flag="--field", action="append", metavar="KEY=PATH",
                               help="jsonl: where a field is, e.g. question=doc.problem or answers=samples[].answer "
                                    "(repeatable; keys: id question gold answers completions completion_tokens scores "
                                    "prompt_tokens task meta)")
    mapping: Path | None = option(None, type=Path, help="jsonl: a JSON file of the same KEY: PATH pairs")
    model: str | None = option(None, help="model name stored in each line's meta (boinf: taken from the file name)")
    tokenizer: Path | None = option(None, type=Path, help="local tokenizer directory to count prompt (and missing "
                                                          "completion) tokens; needed for solve --cost-unit flops")
    grade_workers: int = option(2, type=int, help="grading processes (math-verify)")
    timeout: float = option(5.0, type=float, help="seconds one math-verify parse or comparison may take")
    batch: int = option(250, type=int, help="prompts graded (and written) per step: larger is faster (fewer merge "
                                            "rounds), smaller resumes finer")
    progress: bool = option(True, flag="--no-progress", action="store_false", help="hide the progress bar")

    def __post_init__(self) -> None:
        self.out = Path(self.out)
        self.sources = [Path(s) for s in self.sources]
        checks = [
            (self.format in FORMAT_CHOICES,
             f"FORMAT must be one of {', '.join(FORMAT_CHOICES)}; you passed {self.format!r}"),
            (bool(self.sources), "give at least one source file to import"),
            (self.grade_workers >= 1, f"--grade-workers must be >= 1; you passed {self.grade_workers}"),
            (self.timeout > 0, f"--timeout must be > 0 seconds; you passed {self.timeout}"),
            (self.batch >= 1, f"--batch must be >= 1 prompts; you passed {self.batch}"),
            (self.format == "jsonl" or not (self.fields or self.mapping),
             "--field and --mapping describe the jsonl format; drop them for boinf/mot"),
            (self.format == "boinf" or self.problems is None, "--problems is for the boinf format"),
        ]
        for ok, message in checks:
            if not ok:
                raise InputError(message)
        for src in self.sources:
            if not src.is_file():
                raise InputError(f"source {src} does not exist; pass the dump file(s) to import.")
        if self.out.resolve() in {s.resolve() for s in self.sources}:
            raise InputError(f"--out {self.out} is one of the sources; write the table somewhere else.")
        if self.task is not None:
            from isocompute.tasks.answers.equivalence import kind_of

            kind_of(self.task)  # an unknown task fails here, before any work


@dataclass
class ImportResult:
    """What a run did and what the table holds (figures over the whole table, resumed part included)."""

    out: Path
    manifest: Path
    prompts: int
    written: int
    skipped: int
    samples: int
    accuracy: float
    distinct_answers: int
    classes: int
    merged_prompts: int
    unreadable: list[dict[str, str]]
    disagree: int
    references: int
    timed_out: int
    maj_by_class: float
    maj_by_string: float
    maj4_by_class: float | None
    maj4_by_string: float | None
    seconds: float
    cpu_seconds: float
    examples: list[str] = field(default_factory=list)
    target: str = "gold"  # what accuracy and maj@n are scored on: consensus where some record has no gold


def _manifest_path(out: Path) -> Path:
    return out.with_name(out.name + ".manifest.json")


def _partial_path(out: Path) -> Path:
    return out.with_name(out.name + ".partial")


def _identity(cfg: ImportConfig) -> dict[str, Any]:
    """Inputs' checksums and the options that shape the table: what a resumed run must share."""
    from isocompute.artifacts import sha256_file

    inputs = {str(s): sha256_file(s) for s in cfg.sources}
    for name in ("problems", "mapping"):
        path = getattr(cfg, name)
        if path is not None:
            inputs[f"{name}:{path}"] = sha256_file(path)
    if cfg.tokenizer is not None:
        tok = Path(cfg.tokenizer) / "tokenizer.json"
        inputs[f"tokenizer:{cfg.tokenizer}"] = sha256_file(tok) if tok.is_file() else str(cfg.tokenizer)
    params = {"format": cfg.format, "task": cfg.task, "question_field": cfg.question_field,
              "fields": list(cfg.fields), "model": cfg.model}
    return {"inputs": inputs, "params": params}


def _write_manifest(path: Path, identity: dict[str, Any], **extra: Any) -> None:
    from isocompute import __version__
    from isocompute.artifacts import atomic_write_text

    manifest = {"kind": KIND, "schema_version": SCHEMA_VERSION, "package_version": __version__,
                "created_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"), **identity, **extra}
    atomic_write_text(path, json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    path.chmod(0o644)  # a temporary file's 0600 would hide it from the table's other readers


def _check_resumable(cfg: ImportConfig, identity: dict[str, Any]) -> bool:
    """True when the finished table already matches; raise when an old run's files would be mixed in."""
    mpath = _manifest_path(cfg.out)
    old = json.loads(mpath.read_text()) if mpath.is_file() else None
    same = old is not None and old.get("kind") == KIND and \
        {k: old.get(k) for k in identity} == identity
    if cfg.out.exists():
        if same and old.get("complete"):
            return True
        raise InputError(f"{cfg.out} already exists and was not imported from these sources with these options; "
                         "delete it (and its .manifest.json) or choose another --out.")
    if _partial_path(cfg.out).exists() and not same:
        raise InputError(f"{_partial_path(cfg.out)} is left from an import of other sources or options; rerun "
                         "that command to finish it, or delete the .partial file to start over.")
    return False


def _read_all(cfg: ImportConfig) -> list[Any]:
    from isocompute.tasks.importers import read_source
    from isocompute.tasks.importers.generic import load_mapping

    mapping = load_mapping(cfg.mapping, cfg.fields) if cfg.format == "jsonl" else None
    records: list[Any] = []
    seen: dict[str, str] = {}
    for src in cfg.sources:
        for rec in read_source(cfg.format, src, task=cfg.task, problems=cfg.problems, mapping=mapping,
                               question_field=cfg.question_field):
            if rec.id in seen:
                raise InputError(f"{rec.where}: id {rec.id!r} repeats {seen[rec.id]}; ids must be unique in one "
                                 "table (import each model's dump into its own table).")
            seen[rec.id] = rec.where
            model = cfg.model or _model_from_name(cfg.format, src)
            if model:
                rec.meta = {"model": model, **rec.meta}
            rec.meta = {"source": src.name, **rec.meta}
            records.append(rec)
    return records


def _model_from_name(fmt: str, src: Path) -> str | None:
    """BoInf names its dumps ``analysis_<dataset>_<model>.jsonl``: the model is the last part."""
    if fmt == "boinf" and src.stem.startswith("analysis_") and src.stem.count("_") >= 2:
        return src.stem.split("_", 2)[2]
    return None


def import_samples(cfg: ImportConfig) -> ImportResult:
    """The job (module docstring)."""
    from isocompute.solver.outcomes import OutcomeWriter
    from isocompute.tasks.grading import Grader
    from isocompute.tasks.importers.grade import grade_records

    start, cpu0 = time.perf_counter(), time.process_time()
    identity = _identity(cfg)
    if _check_resumable(cfg, identity):
        return _summarise(cfg, json.loads(_manifest_path(cfg.out).read_text())["unreadable"], 0, 0, 0, 0,
                          start, cpu0, already=True)
    records = _read_all(cfg)
    _write_manifest(_manifest_path(cfg.out), identity, complete=False)
    tokenizer = _load_tokenizer(cfg.tokenizer)
    partial = _partial_path(cfg.out)
    unreadable: list[dict[str, str]] = []
    disagree = references = timed_out = written = 0
    grader = Grader(workers=cfg.grade_workers, timeout=cfg.timeout)
    try:
        with OutcomeWriter(partial) as writer:
            todo = [r for r in records if r.id not in writer.completed]
            skipped = len(records) - len(todo)
            bar = _progress(cfg, len(records), skipped)
            correct = samples = 0
            for i in range(0, len(todo), cfg.batch):
                chunk = todo[i:i + cfg.batch]
                batch = grade_records(chunk, grader=grader, tokenizer=tokenizer)
                _check_join(batch)
                unreadable += [asdict(u) for u in batch.unreadable]
                disagree += len(batch.disagree)
                references += batch.references
                timed_out += batch.timed_out
                for line in batch.lines:
                    writer.write(line)
                    written += 1
                    samples += len(line["samples"])
                    correct += sum(bool(s.get("correct")) for s in line["samples"])
                if bar is not None:
                    bar.update(len(chunk))
                    bar.set_postfix(acc=f"{correct / max(samples, 1):.3f}", unreadable=len(unreadable))
            if bar is not None:
                bar.close()
    finally:
        grader.close()
    if not written and not skipped:
        raise InputError(f"no record of {', '.join(map(str, cfg.sources))} could be graded "
                         f"({len(unreadable)} with an unreadable gold, e.g. {unreadable[:1]}); nothing to write.")
    return _summarise(cfg, unreadable, disagree, references, timed_out, written, start, cpu0, identity=identity)


def _check_join(batch: Any) -> None:
    """A joined problem file whose answers mostly disagree with the dump's golds is the wrong file."""
    if batch.references >= 10 and len(batch.disagree) * 2 > batch.references:
        rid, where, gold, ref = batch.disagree[0]
        raise InputError(f"{where}: the problem file does not line up with the dump: {len(batch.disagree)} of "
                         f"{batch.references} of its answers differ from the dump's golds (e.g. {rid}: dump "
                         f"{gold!r}, problem file {ref!r}); pass the problem file the dump was made from, "
                         "in the same order.")


def _summarise(cfg: ImportConfig, unreadable: list[dict[str, str]], disagree: int, references: int,
               timed_out: int, written: int, start: float, cpu0: float, *, identity: dict[str, Any] | None = None,
               already: bool = False) -> ImportResult:
    """Read the table back (validating all of it), move it into place, write the final manifest."""
    import numpy as np

    from isocompute.artifacts import sha256_file
    from isocompute.solver.outcomes import from_records, read_outcomes
    from isocompute.solver.votes.consensus import with_target

    path = cfg.out if already else _partial_path(cfg.out)
    table = with_target(read_outcomes(path))  # records without gold: scored by agreement with the consensus
    by_string = with_target(from_records([{**r, "samples": [{k: v for k, v in s.items() if k != "class"}
                                                            for s in r["samples"]]} for r in table.records]),
                            table.target)
    maj_class = _maj_ragged(table.answer_codes, table.correct, table.n_samples)
    maj_string = _maj_ragged(by_string.answer_codes, by_string.correct, by_string.n_samples)
    four = table.n_samples.min() >= 4
    maj4 = [_maj_ragged(t.answer_codes, t.correct, np.full(len(t), 4)) if four else None for t in (table, by_string)]
    distinct = (by_string.answer_codes.max(axis=1) + 1).clip(min=0)
    classes = (table.answer_codes.max(axis=1) + 1).clip(min=0)
    order = np.argsort(-(distinct - classes), kind="stable")[:3]
    examples = [_example(table.records[i]) for i in order if distinct[i] > classes[i]]
    samples = int(table.n_samples.sum())
    result = ImportResult(
        out=cfg.out, manifest=_manifest_path(cfg.out), prompts=len(table), written=written,
        skipped=len(table) - written, samples=samples, accuracy=float(table.correct.sum() / samples),
        distinct_answers=int(distinct.sum()), classes=int(classes.sum()),
        merged_prompts=int((distinct > classes).sum()), unreadable=unreadable, disagree=disagree,
        references=references, timed_out=timed_out, maj_by_class=maj_class, maj_by_string=maj_string,
        maj4_by_class=maj4[0], maj4_by_string=maj4[1],
        seconds=time.perf_counter() - start, cpu_seconds=time.process_time() - cpu0, examples=examples,
        target=table.target,
    )
    if not already:
        os.replace(path, cfg.out)
        figures = {k: v for k, v in asdict(result).items()
                   if k not in ("out", "manifest", "seconds", "cpu_seconds", "written", "skipped")}
        _write_manifest(_manifest_path(cfg.out), identity or _identity(cfg), complete=True,
                        table_sha256=sha256_file(cfg.out), **figures)
    return result


def _maj_ragged(codes: Any, correct: Any, n: Any) -> float:
    """Mean maj@n[i] over prompts, prompt i voting over n[i] of its samples (one estimator call per n)."""
    import numpy as np

    from isocompute.solver.estimators import majority_at_k

    out = np.empty(len(n))
    for k in np.unique(n):
        rows = np.flatnonzero(n == k)
        out[rows] = majority_at_k(codes[rows], correct[rows], int(k))
    return float(out.mean())


def _example(record: dict[str, Any]) -> str:
    """``id: 'a' 52 + 'b' 23 → one class`` for the largest merged class of a record."""
    by_class: dict[int, dict[str, int]] = {}
    for s in record["samples"]:
        if s.get("class") is not None:
            votes = by_class.setdefault(s["class"], {})
            votes[s["answer"]] = votes.get(s["answer"], 0) + 1
    merged = max(by_class.values(), key=lambda v: (len(v), sum(v.values())))
    parts = " + ".join(f"{a!r} {c}" for a, c in sorted(merged.items(), key=lambda x: -x[1])[:4])
    return f"{record['id']}: {parts} votes → one class"


def _load_tokenizer(path: Path | None) -> Any:
    if path is None:
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError) as e:
        raise InputError(f"--tokenizer {path}: cannot load a tokenizer there ({e}); pass a local model or "
                         "tokenizer directory.") from None


def _progress(cfg: ImportConfig, total: int, skipped: int) -> Any:
    if not cfg.progress:
        return None
    from tqdm import tqdm

    desc = f"import {cfg.format}" + (f" (resumed, {skipped} done)" if skipped else "")
    return tqdm(total=total, initial=skipped, desc=desc, unit="prompt", file=sys.stderr, dynamic_ncols=True)
