"""The sample stage: run a model n times on every prompt of a task, grade each answer, write the
outcome table (format: :mod:`isocompute.solver.outcomes`, DESIGN.md).

The job, :func:`sample`, keeps ``concurrency`` engine calls of ``batch_prompts`` prompts each in
flight; as each call returns its prompts are graded (the task's grader: exact numbers for arith,
math-verify in a process pool otherwise, in a worker thread so sampling goes on) and written, one
flushed line per prompt, in the order they finish. Each sample stores its extracted ``answer``, the
grader's ``correct`` and its equivalence ``class`` (the task's kind: numbers for arith and GSM8K,
math-verify for MATH), so majority votes count equivalent answers once. Resuming: the writer drops a cut-off last line and
the ids already in the table are skipped, so a rerun of an interrupted command finishes the table with
no prompt lost or duplicated.

Seeds: the engine call for a batch gets ``derive_seed(seed, first id of the batch)``, a hash, so a
prompt's samples do not depend on which other prompts were still to do when the run (re)started —
exactly so when ``batch_prompts`` is 1 (the ``vllm-http`` default).

Each line's ``meta`` holds task, engine, model, temperature, n, max_tokens, seed, the model's
``config.json`` (``model_config``, what :mod:`isocompute.flops` reads for FLOP costs) and its sha256,
plus the problem's own meta (``problem``, e.g. arith difficulty).
With ``--logprobs K`` each sample also gets ``logprob_mean`` and ``confidence_min_window``
(:mod:`isocompute.tasks.confidence`, windows of ``--confidence-window`` tokens) and meta records
``logprobs``, ``confidence_window`` and ``logprob_cost_factor`` (the measured price of asking,
:data:`isocompute.flops.logprobs.LOGPROB_COST_FACTOR`). Token counts come from the engine:
``prompt_tokens`` once per prompt, ``completion_tokens`` per sample (up to and including EOS).

Prompt format: ``chat`` wraps the task prompt in the tokenizer's chat template (needs a tokenizer:
``--model DIR``, or for ``vllm-http`` a server whose model is a local directory); ``plain`` sends
``prompt + "\\n"``; ``auto`` (default) is chat when a tokenizer with a template is at hand, else plain.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from isocompute.errors import InputError
from isocompute.flops.logprobs import LOGPROB_COST_FACTOR, priced_tokens
from isocompute.stages.options import option
from isocompute.tasks.confidence import DEFAULT_WINDOW

TASK_CHOICES = ("arith", "gsm8k", "math", "math500")
ENGINE_CHOICES = ("transformers", "vllm-http", "vllm")
PROMPT_FORMATS = ("auto", "chat", "plain")


@dataclass(kw_only=True)
class SampleConfig:
    """Everything one sampling run needs (the options of ``isocompute sample``, each documented on its
    field); checked once in ``__post_init__``."""

    task: str = option(choices=TASK_CHOICES, help="problem set")
    data: str | None = option(None, help="JSONL file for gsm8k/math (arith is generated)")
    limit: int | None = option(None, type=int, help="use this many problems (a seeded subset of a file)")
    data_seed: int = option(0, type=int, help="seed of arith generation / the --limit subset")
    engine: str = option("transformers", choices=ENGINE_CHOICES, help="generation back-end")
    model: str | None = option(None, help="model directory (transformers/vllm); for vllm-http optional, read for "
                                          "config.json and tokenizer")
    upstreams: list[str] = option([], flag="--upstream", action="append", metavar="URL",
                                  help="vLLM server base URL (repeat for several; load-balanced)")
    n: int = option(16, type=int, help="samples per prompt")
    temperature: float = option(1.0, type=float, help="sampling temperature (0 = greedy)")
    max_tokens: int = option(256, type=int, help="completion length cap")
    seed: int = option(0, type=int, help="sampling seed")
    out: Path = option(type=Path, help="outcome table to write or resume (.jsonl)")
    prompt_format: str = option("auto", choices=PROMPT_FORMATS, help="chat template or plain")
    batch_prompts: int | None = option(None, type=int, help="prompts per engine call (default: 1 for vllm-http, "
                                                            "64 // n otherwise)")
    concurrency: int | None = option(None, type=int,
                                     help="engine calls in flight (default: 64 for vllm-http, 2 otherwise)")
    device: str = option("cpu", help="transformers device: cpu, cuda or auto")
    dtype: str = option("float32", help="weights dtype for in-process engines")
    threads: int | None = option(None, type=int, help="torch threads for the transformers engine (default: torch's)")
    grade_workers: int = option(2, type=int, help="grading processes (math-verify)")
    timeout: float = option(600.0, type=float, help="seconds one vllm-http request may take")
    progress: bool = option(True, flag="--no-progress", action="store_false", help="hide the progress bar")
    logprobs: int | None = option(None, type=int, metavar="K",
                                  help="ask for the K top log-probabilities of every token and record each "
                                       "sample's logprob_mean and confidence_min_window (off by default)")
    confidence_window: int = option(DEFAULT_WINDOW, type=int, metavar="W",
                                    help="tokens per window of confidence_min_window (shorter: one window)")
    shard: str | None = option(None, metavar="I/N",
                               help="sample only the batches I, I+N, I+2N, … of the problem list (0 ≤ I < N): "
                                    "N processes with I = 0 … N-1 draw the same samples as one, into N tables "
                                    "to join (isocompute.solver.outcome_writer.merge_shards)")

    def __post_init__(self) -> None:
        self.out = Path(self.out)
        checks = [
            (self.task in TASK_CHOICES, f"--task must be one of {', '.join(TASK_CHOICES)}; you passed {self.task!r}"),
            (self.engine in ENGINE_CHOICES, f"--engine must be one of {', '.join(ENGINE_CHOICES)}; you passed {self.engine!r}"),
            (self.n >= 1, f"--n must be >= 1 (samples per prompt); you passed {self.n}"),
            (self.temperature >= 0, f"--temperature must be >= 0 (0 is greedy); you passed {self.temperature}"),
            (self.max_tokens >= 1, f"--max-tokens must be >= 1; you passed {self.max_tokens}"),
            (self.limit is None or self.limit >= 1, f"--limit must be >= 1; you passed {self.limit}"),
            (self.prompt_format in PROMPT_FORMATS,
             f"--prompt-format must be one of {', '.join(PROMPT_FORMATS)}; you passed {self.prompt_format!r}"),
            (self.batch_prompts is None or self.batch_prompts >= 1,
             f"--batch-prompts must be >= 1; you passed {self.batch_prompts}"),
            (self.concurrency is None or self.concurrency >= 1,
             f"--concurrency must be >= 1; you passed {self.concurrency}"),
            (self.threads is None or self.threads >= 1, f"--threads must be >= 1; you passed {self.threads}"),
            (self.grade_workers >= 1, f"--grade-workers must be >= 1; you passed {self.grade_workers}"),
            (self.logprobs is None or 1 <= self.logprobs <= 20,
             f"--logprobs must be 1 … 20 (top log-probabilities per token); you passed {self.logprobs}"),
            (self.confidence_window >= 1, f"--confidence-window must be >= 1; you passed {self.confidence_window}"),
            (self.engine != "vllm-http" or bool(self.upstreams),
             "--engine vllm-http needs --upstream URL (repeatable), e.g. --upstream http://127.0.0.1:8000"),
            (self.engine == "vllm-http" or self.model is not None,
             f"--engine {self.engine} needs --model DIR (a Hugging Face checkpoint directory)"),
        ]
        for ok, message in checks:
            if not ok:
                raise InputError(message)
        self.shard_index, self.shard_count = parse_shard(self.shard)
        if self.batch_prompts is None:
            # vllm-http: one prompt per request, vLLM batches across requests; in-process engines get
            # enough rows per call to fill a micro-batch of 64.
            self.batch_prompts = 1 if self.engine == "vllm-http" else max(1, 64 // self.n)
        if self.concurrency is None:
            self.concurrency = 64 if self.engine == "vllm-http" else 2


@dataclass
class SampleResult:
    """What a run did: prompts in the task, already in the table, written now; tokens and time."""

    out: Path
    total: int
    skipped: int
    written: int
    prompt_tokens: int
    completion_tokens: int
    correct: int
    samples: int
    seconds: float
    logprobs: int | None = None

    @property
    def priced_tokens(self) -> float:
        """The completion tokens priced as tokens without logprobs (:func:`isocompute.flops.logprobs.priced_tokens`)."""
        return priced_tokens(self.completion_tokens, self.logprobs)

    @property
    def completion_tokens_per_s(self) -> float:
        return self.completion_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def accuracy(self) -> float:
        return self.correct / self.samples if self.samples else 0.0


def parse_shard(text: str | None) -> tuple[int, int]:
    """``"I/N"`` → ``(I, N)``; None → ``(0, 1)`` (everything)."""
    if text is None:
        return 0, 1
    i, sep, n = text.partition("/")
    if not (sep and i.strip().isdigit() and n.strip().isdigit() and 0 <= int(i) < int(n)):
        raise InputError(f"--shard must be I/N with 0 <= I < N (e.g. 0/2 and 1/2 for two processes); you passed {text!r}")
    return int(i), int(n)


def shard_problems(problems: list, batch_prompts: int, index: int, count: int) -> list:
    """The problems in batches ``index, index + count, …`` of ``problems`` cut into ``batch_prompts``-sized
    batches: whole batches, in order, so a shard forms the same batches (and seeds) as one process would."""
    return [p for j, p in enumerate(problems) if (j // batch_prompts) % count == index]


def derive_seed(seed: int, key: str) -> int:
    """A 31-bit seed from ``(seed, key)``, stable across processes and machines (unlike ``hash``)."""
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def model_config_meta(model_dir: str | Path | None) -> dict[str, Any]:
    """``{"model_config": <config.json>, "model_config_sha256": …}`` for a local model directory, else ``{}``."""
    if model_dir is None:
        return {}
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        return {}
    data = path.read_bytes()
    return {"model_config": json.loads(data), "model_config_sha256": hashlib.sha256(data).hexdigest()}


def _logprob_meta(cfg: SampleConfig) -> dict[str, Any]:
    """What a logprob-asking run records in meta: K, the window, and the measured cost factor its tokens
    are priced at (:data:`isocompute.flops.logprobs.LOGPROB_COST_FACTOR`); nothing for a plain run."""
    if cfg.logprobs is None:
        return {}
    return {"logprobs": cfg.logprobs, "confidence_window": cfg.confidence_window,
            "logprob_cost_factor": LOGPROB_COST_FACTOR}


def _load_tokenizer(model_dir: str | Path | None) -> Any:
    if model_dir is None or not (Path(model_dir) / "tokenizer_config.json").is_file():
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def make_formatter(prompt_format: str, tokenizer: Any) -> Any:
    """Return ``f(task_prompt) -> engine prompt`` for ``chat``/``plain``/``auto`` (module docstring)."""
    from isocompute.engines.transformers_engine import apply_chat_template

    has_template = tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))
    if prompt_format == "chat" and not has_template:
        raise InputError(
            "--prompt-format chat needs a tokenizer with a chat template; pass --model DIR whose tokenizer "
            "has one, or use --prompt-format plain"
        )
    if prompt_format == "chat" or (prompt_format == "auto" and has_template):
        return lambda prompt: apply_chat_template(tokenizer, prompt)
    return lambda prompt: prompt + "\n"


def _build_engine(cfg: SampleConfig) -> Any:
    from isocompute.engines.registry import make_engine

    if cfg.engine == "transformers":
        return make_engine("transformers", model=cfg.model, device=cfg.device, dtype=cfg.dtype,
                           threads=cfg.threads)
    if cfg.engine == "vllm-http":
        return make_engine("vllm-http", upstreams=cfg.upstreams, max_concurrency=cfg.concurrency,
                           timeout=cfg.timeout)
    return make_engine("vllm", model=cfg.model, dtype=cfg.dtype)


async def _model_dir_and_name(cfg: SampleConfig, engine: Any) -> tuple[str | None, str]:
    """Where the model's files are (for config and tokenizer) and the name recorded in meta."""
    if cfg.engine != "vllm-http":
        return cfg.model, str(cfg.model)
    await engine.wait_ready(timeout=min(cfg.timeout, 120.0))
    info = await engine.model_info()
    root = info.get("root") or info["id"]
    local = cfg.model or (root if Path(root, "config.json").is_file() else None)
    return local, info["id"]


async def sample_async(cfg: SampleConfig, engine: Any | None = None) -> SampleResult:
    """The job (see the module docstring). ``engine`` overrides the one ``cfg`` describes (tests, bench)."""
    from isocompute.solver.outcomes import OutcomeWriter
    from isocompute.tasks.grading import NUMERIC_TASKS, Grader, require_math_verify
    from isocompute.tasks.registry import load_task

    problems = load_task(cfg.task, cfg.data, cfg.limit, cfg.data_seed)
    if cfg.shard_count > 1:
        problems = shard_problems(problems, cfg.batch_prompts, cfg.shard_index, cfg.shard_count)
    if any(p.task not in NUMERIC_TASKS for p in problems):
        require_math_verify()  # a broken install stops the job here, not after the first batch is generated
    own_engine = engine is None
    engine = engine if engine is not None else _build_engine(cfg)
    grader = Grader(workers=cfg.grade_workers)
    start = time.perf_counter()
    try:
        model_dir, model_name = await _model_dir_and_name(cfg, engine)
        tokenizer = getattr(engine, "tokenizer", None) or _load_tokenizer(model_dir)
        fmt = make_formatter(cfg.prompt_format, tokenizer)
        meta_common = {
            "task": cfg.task, "engine": engine.name, "model": model_name, "temperature": cfg.temperature,
            "n": cfg.n, "max_tokens": cfg.max_tokens, "seed": cfg.seed,
            **model_config_meta(model_dir), **_logprob_meta(cfg),
        }
        with OutcomeWriter(cfg.out) as writer:
            todo = [p for p in problems if p.id not in writer.completed]
            result = SampleResult(cfg.out, len(problems), len(problems) - len(todo), 0, 0, 0, 0, 0, 0.0, cfg.logprobs)
            await _sample_into(cfg, engine, grader, writer, todo, fmt, meta_common, result)
    finally:
        grader.close()
        if own_engine:
            await engine.aclose()
    result.seconds = time.perf_counter() - start
    return result


async def _sample_into(cfg, engine, grader, writer, todo, fmt, meta_common, result) -> None:  # noqa: ANN001
    from isocompute.solver.outcomes import OutcomeRecord, Sample

    batches = [todo[i : i + cfg.batch_prompts] for i in range(0, len(todo), cfg.batch_prompts)]
    sem = asyncio.Semaphore(cfg.concurrency)
    grade_lock = asyncio.Lock()  # one Grader, one caller at a time
    bar = _progress(cfg, len(todo), result.skipped)
    t0 = time.perf_counter()

    # Only a run that asks for logprobs passes them: an engine without the option still samples.
    asks = {} if cfg.logprobs is None else {"logprobs": cfg.logprobs, "confidence_window": cfg.confidence_window}

    async def one(batch: list) -> None:
        async with sem:
            outs = await engine.generate(
                [fmt(p.prompt) for p in batch], cfg.n, cfg.max_tokens, cfg.temperature,
                derive_seed(cfg.seed, batch[0].id), **asks,
            )
        async with grade_lock:
            graded, classes = await asyncio.to_thread(_grade_and_classify, grader, batch, outs)
        k = 0
        for p, comps, row in zip(batch, outs, classes, strict=True):
            samples = []
            for c, cls in zip(comps, row, strict=True):
                # An answer that normalises to nothing has no class; it is then no answer at all.
                answer = graded.answers[k] if cls is not None else None
                samples.append(Sample(answer, graded.correct[k], c.completion_tokens, answer_class=cls,
                                      logprob_mean=c.logprob_mean, confidence_min_window=c.confidence_min_window))
                k += 1
            meta = {**meta_common, **({"problem": p.meta} if p.meta else {})}
            writer.write(OutcomeRecord(p.id, p.prompt, p.gold, tuple(samples), comps[0].prompt_tokens, meta))
            result.written += 1
            result.prompt_tokens += comps[0].prompt_tokens
            result.completion_tokens += sum(c.completion_tokens for c in comps)
            result.correct += sum(bool(s.correct) for s in samples)
            result.samples += len(samples)
        if bar is not None:
            bar.update(len(batch))
            elapsed = time.perf_counter() - t0
            bar.set_postfix(tok_s=f"{result.completion_tokens / elapsed:.0f}", acc=f"{result.accuracy:.3f}")

    tasks = [asyncio.create_task(one(b)) for b in batches]
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if bar is not None:
            bar.close()


def _grade_and_classify(grader: Any, batch: list, outs: list) -> tuple[Any, list[list[int | None]]]:
    """Grade every completion (the task's grader) and merge each prompt's answers into equivalence
    classes (the task's kind, :mod:`isocompute.tasks.answers.equivalence`; the gold leads its class)."""
    from isocompute.tasks.answers.equivalence import classify

    graded = _grade(grader, batch, outs)
    rows, k = [], 0
    for comps in outs:
        rows.append(graded.answers[k:k + len(comps)])
        k += len(comps)
    classes: list[list[int | None]] = []
    for task, labelled in dict.fromkeys((p.task, p.gold is not None) for p in batch):
        idx = [i for i, p in enumerate(batch) if p.task == task and (p.gold is not None) == labelled]
        golds = [batch[i].gold for i in idx] if labelled else None  # unlabelled: classes without a gold
        res = classify([rows[i] for i in idx], task, golds=golds, grader=grader)
        classes += list(zip(idx, res.classes, strict=True))
    return graded, [c for _, c in sorted(classes, key=lambda x: x[0])]


def _grade(grader: Any, batch: list, outs: list) -> Any:
    """The grader's verdicts and extracted answers, flat; a problem without gold (an unlabelled prompt) gets
    its answers extracted and ``correct`` None (written ungraded, for the consensus target)."""
    from isocompute.tasks.answers.extract import extract_answer

    pairs = [(p.gold, c.text, p.task) for p, comps in zip(batch, outs, strict=True) for c in comps]
    labelled = [i for i, (g, _, _) in enumerate(pairs) if g is not None]
    graded = grader.run([pairs[i] for i in labelled]) if labelled else None
    if len(labelled) == len(pairs):
        return graded
    correct: list[bool | None] = [None] * len(pairs)
    answers = [extract_answer(text) for _, text, _ in pairs]
    for j, i in enumerate(labelled):
        correct[i], answers[i] = graded.correct[j], graded.answers[j]
    return _Graded(correct, answers)


@dataclass(frozen=True)
class _Graded:
    """Verdicts (None: ungraded) and extracted answers of a batch's completions, flat."""

    correct: list[bool | None]
    answers: list[str | None]


def _progress(cfg: SampleConfig, total: int, skipped: int) -> Any:
    if not cfg.progress:
        return None
    from tqdm import tqdm

    desc = f"sample {cfg.task} n={cfg.n}" + (f" (resumed, {skipped} done)" if skipped else "")
    return tqdm(total=total, desc=desc, unit="prompt", file=sys.stderr, dynamic_ncols=True)


def sample(cfg: SampleConfig, engine: Any | None = None) -> SampleResult:
    """The job (module docstring), blocking: :func:`sample_async` in a new event loop."""
    return asyncio.run(sample_async(cfg, engine))
