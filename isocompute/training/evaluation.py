"""Held-out evaluation of a trained policy: sample n completions per problem, grade, and report mean
accuracy, maj@k and pass@k (exact U-statistics from :mod:`isocompute.solver.estimators`) with 95 %
confidence intervals over problems.

Sampling uses transformers ``generate`` in-process (training may not import the engines room): chat
template, temperature sampling with top-k/top-p off, rows in micro-batches, a forked seeded RNG so the
caller's torch RNG is untouched. A per-problem metric m_i has CI mean ± 1.96·sd/√P over P problems; a
paired difference of two models on the same problems uses the per-problem differences.

:func:`reference_probability` is the noise-free companion: the exact probability, at temperature 1, that
one sample is the reference solution verbatim (then end-of-sequence). It is a lower bound of the expected
accuracy (other correct completions exist) that costs one forward pass per problem; for the tiny arith
model, whose correct answers almost all follow the reference, it tracks sampled accuracy closely and has
no sampling noise, so a training curve read from it is decided by training, not by evaluation.

Ignores: stop strings, vLLM, and problems whose prompt exceeds the model's context.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from isocompute.errors import InputError
from isocompute.solver.estimators import majority_at_k, pass_at_k
from isocompute.tasks.answers.extract import extract_answer, normalize_answer
from isocompute.tasks.base import Problem
from isocompute.tasks.grading import grade
from isocompute.training.rewards import answer_codes

Z95 = 1.959963984540054


def mean_ci(values: Sequence[float] | np.ndarray) -> tuple[float, float, float]:
    """(mean, low, high): normal 95 % interval over items; ±0 for a single item.

    >>> [round(v, 3) for v in mean_ci([0.0, 1.0, 1.0, 0.0])]
    [0.5, -0.066, 1.066]
    """
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        raise InputError("no values to average; evaluate on at least one problem.")
    half = Z95 * v.std(ddof=1) / np.sqrt(v.size) if v.size > 1 else 0.0
    return float(v.mean()), float(v.mean() - half), float(v.mean() + half)


@dataclass(frozen=True)
class EvalResult:
    """Per-problem metrics (rows = problems) and their means; ``ks`` are the k of maj@k / pass@k."""

    n: int
    ks: tuple[int, ...]
    correct: np.ndarray  # (P, n) bool
    maj: np.ndarray  # (P, len(ks))
    pass_: np.ndarray  # (P, len(ks))
    completion_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def accuracy(self) -> float:
        return float(self.correct.mean())

    def metric(self, name: str) -> np.ndarray:
        """Per-problem values of ``"accuracy"``, ``"maj@k"`` or ``"pass@k"``."""
        if name == "accuracy":
            return self.correct.mean(axis=1)
        kind, _, k = name.partition("@")
        if kind in ("maj", "pass") and k.isdigit() and int(k) in self.ks:
            table = self.maj if kind == "maj" else self.pass_
            return table[:, self.ks.index(int(k))]
        raise InputError(f"unknown metric {name!r}; use 'accuracy' or maj@k / pass@k with k in {self.ks}.")

    def summary(self) -> dict[str, float]:
        out = {"accuracy": self.accuracy, "eval_problems": float(self.correct.shape[0]), "eval_n": float(self.n)}
        for k in self.ks:
            out[f"maj@{k}"] = float(self.metric(f"maj@{k}").mean())
            out[f"pass@{k}"] = float(self.metric(f"pass@{k}").mean())
        return out


def sample(model: Any, tokenizer: Any, problems: Sequence[Problem], *, n: int, temperature: float = 1.0,
           max_new_tokens: int = 96, seed: int = 0, batch_rows: int = 256) -> tuple[list[list[str]], np.ndarray]:
    """``n`` completions per problem (chat format) and their generated token counts, (P, n)."""
    import torch

    per_call = max(1, batch_rows // n)
    texts: list[list[str]] = []
    tokens = np.zeros((len(problems), n), dtype=np.int64)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    was_training = model.training
    model.eval()
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        for start in range(0, len(problems), per_call):
            chunk = problems[start : start + per_call]
            prompts = [tokenizer.apply_chat_template([{"role": "user", "content": p.prompt}],
                                                     add_generation_prompt=True, tokenize=False) for p in chunk]
            enc = tokenizer(prompts, add_special_tokens=False, return_tensors="pt", padding=True)
            kw = ({"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature > 0
                  else {"do_sample": False})
            gen = model.generate(**enc, max_new_tokens=max_new_tokens, num_return_sequences=n, pad_token_id=pad,
                                 eos_token_id=eos, **kw)
            new = gen[:, enc["input_ids"].shape[1]:]
            done = (new == eos).int()
            length = torch.where(done.any(1), done.argmax(1) + 1, torch.full_like(done[:, 0], new.shape[1]))
            decoded = tokenizer.batch_decode(new, skip_special_tokens=True)
            for i in range(len(chunk)):
                texts.append(decoded[i * n : (i + 1) * n])
                tokens[start + i] = length[i * n : (i + 1) * n].numpy()
    model.train(was_training)
    return texts, tokens


def evaluate(model: Any, tokenizer: Any, problems: Sequence[Problem], *, n: int = 8,
             ks: Sequence[int] = (1, 4, 8), temperature: float = 1.0, max_new_tokens: int = 96, seed: int = 0,
             batch_rows: int = 256) -> EvalResult:
    """Sample ``n`` completions per problem, grade them, and compute maj@k / pass@k for k in ``ks`` ≤ n."""
    ks = tuple(sorted({int(k) for k in ks}))
    if not problems or not ks or ks[0] < 1 or ks[-1] > n:
        raise InputError(f"need at least one problem and 1 ≤ k ≤ n={n} for every k; got ks={ks}.")
    texts, tokens = sample(model, tokenizer, problems, n=n, temperature=temperature,
                           max_new_tokens=max_new_tokens, seed=seed, batch_rows=batch_rows)
    correct = np.array([[grade(p, t) for t in row] for p, row in zip(problems, texts, strict=True)], dtype=bool)
    answers = [[_answer(t) for t in row] for row in texts]
    codes = answer_codes(answers)
    maj = majority_at_k(codes, correct, list(ks)).reshape(len(problems), len(ks))
    pas = pass_at_k(np.full(len(problems), n), correct.sum(axis=1), list(ks)).reshape(len(problems), len(ks))
    return EvalResult(n, ks, correct, maj, pas, tokens)


def _answer(text: str) -> str | None:
    a = extract_answer(text)
    return normalize_answer(a) if a is not None else None


def reference_probability(model: Any, tokenizer: Any, prompts: Sequence[str], references: Sequence[str], *,
                          batch_rows: int = 128) -> np.ndarray:
    """P(completion = reference + EOS | chat prompt) at temperature 1, one value per prompt.

    The chat-templated prompt and the reference are tokenised as SFT does, right-padded into batches
    (pads follow every real token, so causal attention never sees them), and the log-probabilities of
    the reference tokens and the EOS are summed: log P = Σ_t log softmax(logits_{t-1})[y_t]. Example: a
    reference of two tokens with conditional probabilities 0.5 and 0.8 and an EOS at 0.9 has P = 0.36.
    """
    import torch

    if len(prompts) != len(references):
        raise InputError(f"got {len(prompts)} prompts but {len(references)} references; pass one reference "
                         "per prompt.")
    if not prompts:
        raise InputError("no prompts to score; pass at least one prompt with its reference.")
    seqs = []
    for prompt, ref in zip(prompts, references, strict=True):
        head = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                             tokenize=False)
        head_ids = tokenizer(head, add_special_tokens=False)["input_ids"]
        ref_ids = tokenizer(ref, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        seqs.append((head_ids, ref_ids))
    out = np.zeros(len(seqs))
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for start in range(0, len(seqs), batch_rows):
            chunk = seqs[start : start + batch_rows]
            width = max(len(a) + len(b) for a, b in chunk)
            ids = torch.full((len(chunk), width), tokenizer.pad_token_id, dtype=torch.long)
            mask = torch.zeros_like(ids)
            scored = torch.zeros_like(ids, dtype=torch.bool)
            for r, (a, b) in enumerate(chunk):
                ids[r, : len(a) + len(b)] = torch.tensor(a + b)
                mask[r, : len(a) + len(b)] = 1
                scored[r, len(a) : len(a) + len(b)] = True
            logits = model(input_ids=ids, attention_mask=mask).logits.float()
            logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(2, ids[:, 1:, None])[..., 0]
            out[start : start + len(chunk)] = (logp.double() * scored[:, 1:]).sum(1).exp().numpy()
    model.train(was_training)
    return out
