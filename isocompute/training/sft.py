"""Supervised fine-tuning of the tiny model from scratch on arith reference solutions (CPU, minutes).

Each training example is one arith problem rendered either in the chat format or as a plain completion
(fraction ``plain_fraction``), so both ``/v1/chat/completions`` and ``/v1/completions`` work::

    chat : <s><|user|>What is 2 + 3?<|end|><|assistant|> | 2 + 3 = 5. The answer is 5.<|end|>
    plain: <s>What is 2 + 3?                            | \\n2 + 3 = 5. The answer is 5.<|end|>

The loss is the mean next-token cross-entropy over the tokens right of ``|`` only (the answer and its
closing ``<|end|>``); prompt and padding tokens get label ``-100``. Training problems come from the arith
generator with seed ``TRAIN_SEED_OFFSET + seed``, far from the small seeds used for evaluation, and
every step sees fresh problems (no epochs). AdamW with linear warm-up and cosine decay to 10 %.

The defaults (3 layers, 1200 steps × 32 problems) take about 190 CPU-seconds on one thread and leave
the model deliberately imperfect: greedy accuracy falls from ~0.6 on level 1 to 0 on levels 4-5, and
about a third of held-out problems are solved by some but not most samples at T = 1
(``bench/eval_tiny.py`` measures both), so allocating samples per problem matters.

The result is written atomically with :func:`isocompute.artifacts.artifact_writer` (kind ``tiny-sft``): a
Hugging Face model directory plus ``train_log.jsonl`` and ``manifest.json``. Ignores: gradient
accumulation, mixed precision, resuming a half-finished run (a run takes minutes; rerun it).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from isocompute.errors import InputError
from isocompute.tasks import arith
from isocompute.training import tiny

KIND = "tiny-sft"
SCHEMA_VERSION = 1
TRAIN_SEED_OFFSET = 1_000_000
IGNORE = -100


@dataclass(frozen=True)
class SFTConfig:
    """Options of one SFT run; each is documented here only.

    ``steps``/``batch_size``: optimiser steps and problems per step. ``lr``, ``warmup``, ``weight_decay``:
    AdamW peak learning rate, linear warm-up steps, decoupled weight decay. ``seed``: model init, data and
    format choice. ``mix``: arith difficulty weights (default :data:`isocompute.tasks.arith.DEFAULT_MIX`).
    ``plain_fraction``: share of examples in plain-completion format. ``hidden_size``, ``num_layers``,
    ``num_heads``, ``intermediate_size``: the tiny architecture (head_dim = hidden/heads). ``threads``: torch
    CPU threads — 1 by default: the tiny model's matmuls are too small to split, and with 2 threads on a
    2-core machine that is doing anything else, OpenMP spin-waiting made steps ~10x slower (measured). ``log_every``: steps between lines of ``train_log.jsonl``.
    """

    task: str = "arith"
    steps: int = 1200
    batch_size: int = 32
    lr: float = 3e-3
    warmup: int = 50
    weight_decay: float = 0.01
    seed: int = 0
    mix: Mapping[int, float] | None = None
    plain_fraction: float = 0.25
    hidden_size: int = 128
    num_layers: int = 3
    num_heads: int = 4
    intermediate_size: int = 256
    threads: int = 1
    log_every: int = 10

    def __post_init__(self) -> None:
        if self.task != "arith":
            raise InputError(f"SFT supports only task 'arith' (the embedded default); you passed {self.task!r}.")
        if self.steps < 1 or self.batch_size < 1:
            raise InputError(f"steps and batch_size must be ≥ 1; you passed steps={self.steps}, "
                             f"batch_size={self.batch_size}.")
        if not self.lr > 0:
            raise InputError(f"lr must be > 0; you passed {self.lr}.")
        if not 0.0 <= self.plain_fraction <= 1.0:
            raise InputError(f"plain_fraction must be in [0, 1]; you passed {self.plain_fraction}.")
        if self.hidden_size % self.num_heads:
            raise InputError(f"hidden_size={self.hidden_size} must be divisible by num_heads={self.num_heads}.")
        tiny.tiny_config(**self.model_kwargs())  # raises on an unsupported head_dim

    def model_kwargs(self) -> dict[str, int]:
        return {"hidden_size": self.hidden_size, "num_layers": self.num_layers, "num_heads": self.num_heads,
                "head_dim": self.hidden_size // self.num_heads, "intermediate_size": self.intermediate_size}


@dataclass
class SFTResult:
    """What :func:`train_sft` did: where the model is, the first and last logged losses, timing."""

    out_dir: Path
    steps: int
    first_loss: float
    final_loss: float
    seconds: float
    n_parameters: int
    log: list[dict[str, float]] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------- data
def encode_example(tokenizer: Any, prompt: str, answer: str, *, chat: bool) -> tuple[list[int], list[int]]:
    """``(input_ids, labels)`` for one example; labels are ``-100`` on the prompt (see module docstring)."""
    return encode_examples(tokenizer, [prompt], [answer], [chat])[0]


def encode_examples(tokenizer: Any, prompts: list[str], answers: list[str],
                    chats: list[bool]) -> list[tuple[list[int], list[int]]]:
    """:func:`encode_example` for many examples, each string list tokenized in one batched call (SFT's
    38,400 examples: 12 s one by one, mostly per-call overhead; the same ids)."""
    chat_at = [i for i, c in enumerate(chats) if c]
    prefixes = tokenizer.apply_chat_template([[{"role": "user", "content": prompts[i]}] for i in chat_at],
                                             add_generation_prompt=True, tokenize=False) if chat_at else []
    plain_ids = tokenizer([p for p, c in zip(prompts, chats, strict=True) if not c])["input_ids"] if not all(chats) else []
    chat_ids = tokenizer(prefixes, add_special_tokens=False)["input_ids"] if chat_at else []
    answer_ids = tokenizer([a if c else "\n" + a for a, c in zip(answers, chats, strict=True)], add_special_tokens=False)["input_ids"]
    chat_it, plain_it = iter(chat_ids), iter(plain_ids)  # chat prefixes: no <s> (the template has it); plain: <s>
    out = []
    for c, ans in zip(chats, answer_ids, strict=True):
        head = next(chat_it) if c else next(plain_it)
        tail = ans + [tokenizer.eos_token_id]
        out.append((head + tail, [IGNORE] * len(head) + tail))
    return out


def collate(examples: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, Any]:
    """Right-pad a batch into ``input_ids``, ``attention_mask`` and ``labels`` tensors."""
    import torch

    width = max(len(ids) for ids, _ in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for r, (x, y) in enumerate(examples):
        ids[r, : len(x)] = torch.tensor(x)
        labels[r, : len(y)] = torch.tensor(y)
        mask[r, : len(x)] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def training_batches(cfg: SFTConfig, tokenizer: Any, *, bucket: int = 16) -> list[list[tuple[list[int], list[int]]]]:
    """``steps`` batches of ``batch_size`` encoded examples, deterministic in ``cfg.seed``.

    Examples are sorted by length within groups of ``bucket`` batches (then the batch order is shuffled),
    which cuts padding, and so CPU time, by about a third; a batch then holds problems of similar length
    (so similar difficulty), and the shuffled batch order keeps the stream mixed.
    """
    problems = arith.generate(cfg.steps * cfg.batch_size, TRAIN_SEED_OFFSET + cfg.seed, mix=cfg.mix)
    rng = random.Random(f"sft-format:{cfg.seed}")
    chats = [rng.random() >= cfg.plain_fraction for _ in problems]
    examples = encode_examples(tokenizer, [p.prompt for p in problems], [arith.solution_for(p) for p in problems], chats)
    group = bucket * cfg.batch_size
    batches = []
    for g in range(0, len(examples), group):
        chunk = sorted(examples[g : g + group], key=lambda e: len(e[0]))
        part = [chunk[b : b + cfg.batch_size] for b in range(0, len(chunk), cfg.batch_size)]
        rng.shuffle(part)
        batches += part
    return batches


def lr_at(step: int, cfg: SFTConfig) -> float:
    """Linear warm-up to ``lr`` over ``warmup`` steps, then cosine decay to ``0.1·lr`` at the last step.

    With lr=1, warmup=10, steps=111: step 0 → 0.1, step 9 → 1.0, step 60 → 0.1 + 0.9·0.5 = 0.55, step 110 → 0.1.
    """
    import math

    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    span = max(1, cfg.steps - 1 - cfg.warmup)
    progress = min(1.0, (step - cfg.warmup) / span)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


# ------------------------------------------------------------------------------------------ training
def train_sft(cfg: SFTConfig, out_dir: str | Path, *, progress: bool = True, stop_after: int | None = None) -> SFTResult:
    """Train the tiny model from scratch per ``cfg`` and write the ``tiny-sft`` artifact to ``out_dir``.

    ``stop_after``: only the recipe's first steps (same data and schedule), to check a checkpoint's loss curve."""
    import torch
    from tqdm.auto import tqdm

    from isocompute.artifacts import artifact_writer

    torch.set_num_threads(cfg.threads)
    tokenizer = tiny.build_tokenizer()
    model = tiny.build_model(tiny.tiny_config(**cfg.model_kwargs()), seed=cfg.seed)
    model.train()
    batches = training_batches(cfg, tokenizer)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
    torch.manual_seed(cfg.seed)
    log: list[dict[str, float]] = []
    start, cpu_start, window = time.monotonic(), time.process_time(), []
    last = cfg.steps if stop_after is None else min(stop_after, cfg.steps)
    bar = tqdm(range(last), desc="sft", disable=not progress, unit="step")
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        batch = collate(batches[step], tokenizer.pad_token_id)
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        window.append(loss.item())
        if (step + 1) % cfg.log_every == 0 or step == 0 or step == last - 1:
            entry = {"step": step + 1, "loss": sum(window) / len(window), "lr": lr_at(step, cfg),
                     "seconds": round(time.monotonic() - start, 2),
                     "cpu_seconds": round(time.process_time() - cpu_start, 2)}
            log.append(entry)
            window = []
            bar.set_postfix(loss=f"{entry['loss']:.3f}")
    seconds = time.monotonic() - start
    model.eval()
    params = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in asdict(cfg).items()}
    params["mix"] = {str(k): w for k, w in (cfg.mix or arith.DEFAULT_MIX).items()}
    if last < cfg.steps:
        params["stopped_after"] = last  # the recipe's first steps only
    with artifact_writer(out_dir, kind=KIND, schema_version=SCHEMA_VERSION, params=params) as tmp:
        tiny.save_tiny(tmp, model, tokenizer)
        (tmp / "train_log.jsonl").write_text("".join(json.dumps(e) + "\n" for e in log))
    return SFTResult(out_dir=Path(out_dir), steps=last, first_loss=log[0]["loss"], final_loss=log[-1]["loss"],
                     seconds=seconds, n_parameters=tiny.count_parameters(model), log=log)
