"""The counted part of the prompt features: hand-counted text statistics (lengths, numbers, operators,
question words, the arithmetic of the first expression) and hashed word n-grams — pure functions of
the text that :class:`~isocompute.policy.features.prompt.PromptFeatures` and its fast paths
(:mod:`isocompute.policy.features.chunk_cache`) both compute.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import chain

import numpy as np

from isocompute.policy.features.text_rules import (
    EXPRESSION,
    EXPRESSION_TERM,
    LATEX_OPS,
    LATEX_TIMES,
    MINUS_CHARS,
    NUMBER,
    OPERATOR,
    QUESTION_WORDS,
    TIMES_CHARS,
    murmur_index,
    tokenize,
)

FEATURE_SET = "prompt-text"
FEATURE_VERSION = 2  # 2: the expression block (expr_*) joined the hand features

HAND_FEATURES: tuple[str, ...] = (
    "chars",
    "tokens",
    "words",
    "numbers",
    "digits",
    "max_number_digits",
    "log10_max_number",
    "operators",
    "plus",
    "minus",
    "times",
    "latex_commands",
    "dollars",
    "question_marks",
    "question_words",
    "expr_operands",
    "expr_carries",
    "expr_result_digits",
    "expr_negative",
)

_EXPR_MAX_DIGITS = 18  # longer operands: count them, skip the arithmetic (bounded work per request)


def ngrams(text: str) -> list[str]:
    """Unigrams then bigrams of :func:`tokenize` — the analyzer the hashing uses.

    >>> ngrams("What is 47?")
    ['what', 'is', '00', '?', 'what is', 'is 00', '00 ?']
    """
    return _with_bigrams(tokenize(text))


def _with_bigrams(toks: list[str]) -> list[str]:
    return toks + list(map(" ".join, zip(toks, toks[1:], strict=False)))


def _digit_sum(n: int) -> int:
    b = str(n).encode()  # ASCII digits: summing the bytes runs in C
    return sum(b) - 48 * len(b)


def _carries_add(a: int, b: int) -> int:
    # Each carry turns 10 in one column into 1 in the next, so it lowers the digit sum by 9:
    # carries(a + b) = (S(a) + S(b) − S(a + b)) / 9, with S the decimal digit sum (no per-digit loop).
    return (_digit_sum(a) + _digit_sum(b) - _digit_sum(a + b)) // 9


def _borrows_sub(a: int, b: int) -> int:
    # a − b (a ≥ b) borrows exactly where (a − b) + b carries.
    return _carries_add(a - b, b)


def expression_features(text: str) -> tuple[int, int, int, int]:
    """(operands, carries, result digits, negative) of the first inline integer expression, else zeros.

    The expression is evaluated like a pupil would: ``*`` first, then left to right; each ``+``/``-``
    step adds or subtracts magnitudes digit by digit and counts its carries/borrows (a step whose signs
    differ subtracts the smaller magnitude from the larger). ``negative`` is 1 when any intermediate
    result is below 0. These are the difficulty knobs of the arithmetic task, read off the text.

    >>> expression_features("What is 47 + 385 - 12?")  # 7+5, 4+8+1 carry; 432 − 12 borrows nothing
    (3, 2, 3, 0)
    >>> expression_features("What is 9 * 8 - 100?")  # 72 − 100 = −28: 100 − 72 borrows twice
    (3, 2, 2, 1)
    """
    m = EXPRESSION.search(text)
    if m is None:
        return 0, 0, 0, 0
    terms = EXPRESSION_TERM.findall(m.group())
    nums, ops = terms[0::2], ["*" if o == "×" else o for o in terms[1::2]]
    if max(map(len, nums)) > _EXPR_MAX_DIGITS:
        return len(nums), 0, 0, 0
    vals = [int(x) for x in nums]
    while "*" in ops:
        j = ops.index("*")
        vals[j : j + 2] = [vals[j] * vals[j + 1]]
        del ops[j]
    acc, carries, negative = vals[0], 0, 0
    for op, b in zip(ops, vals[1:], strict=True):
        if (op == "+") == ((acc >= 0) == (b >= 0)):
            carries += _carries_add(abs(acc), abs(b))
        else:
            carries += _borrows_sub(max(abs(acc), abs(b)), min(abs(acc), abs(b)))
        acc = acc + b if op == "+" else acc - b
        negative |= acc < 0
    return len(nums), carries, len(str(abs(acc))), int(negative)


def _hand_row(text: str, toks: list[str]) -> tuple[float, ...]:
    # Counts come from C-level str/regex/map calls: a Python loop per character or per number would
    # cost several times more, and this runs for every request.
    nums = NUMBER.findall(text)
    joined = "".join(nums)
    if not nums:
        max_digits, log_max = 0, 0.0
    elif "." not in joined:  # integers only (the common case): int() parses in C
        max_digits = max(map(len, nums))
        log_max = math.log10(1.0 + max(map(int, nums))) if max_digits <= 15 else float(max_digits)
    else:
        max_digits = max(len(n.partition(".")[0]) for n in nums)
        # beyond float precision the digit count *is* the log magnitude
        log_max = math.log10(1.0 + max(map(float, nums))) if max_digits <= 15 else float(max_digits)
    latex = [t for t in toks if t[0] == "\\"]
    return (
        len(text),
        len(toks),
        sum(map(str.isalpha, toks)),
        len(nums),
        len(joined) - joined.count("."),
        max_digits,
        log_max,
        len(OPERATOR.findall(text)) + sum(map(LATEX_OPS.__contains__, latex)),
        text.count("+"),
        sum(map(text.count, MINUS_CHARS)),
        sum(map(text.count, TIMES_CHARS)) + sum(map(LATEX_TIMES.__contains__, latex)),
        len(latex),
        text.count("$"),
        text.count("?"),
        sum(map(QUESTION_WORDS.__contains__, toks)),
        *expression_features(text),
    )


def hand_features(prompts: Sequence[str]) -> np.ndarray:
    """The hand block, shape ``(len(prompts), len(HAND_FEATURES))``, float64, columns as named."""
    rows = [_hand_row(t, tokenize(t)) for t in prompts]
    return np.array(rows, dtype=np.float64).reshape(len(prompts), len(HAND_FEATURES))


class _BucketCache(dict):
    """n-gram → bucket, filled on a miss, so the hot path is a C-level dict lookup per n-gram."""

    def __init__(self, n_features: int) -> None:
        super().__init__()
        self.n_features = n_features

    def __missing__(self, gram: str) -> int:
        if len(self) > 1 << 18:  # bound memory on a long-running server; refills cost microseconds
            self.clear()
        j = self[gram] = murmur_index(gram, self.n_features)
        return j


def hashed_matrix(prompts: Sequence[str], n_features: int, cache: dict[str, int] | None = None,
                  grams: list[list[str]] | None = None):
    """The l2-normalised hashed n-gram counts as a ``scipy.sparse.csr_array`` (duplicates summed).

    Equal to ``HashingVectorizer(analyzer=ngrams, n_features=n_features, alternate_sign=False,
    norm="l2").transform(prompts)`` — a test checks it bit for bit.
    """
    import scipy.sparse as sp

    cache = _BucketCache(n_features) if cache is None else cache
    grams = [ngrams(t) for t in prompts] if grams is None else grams
    indptr = np.zeros(len(prompts) + 1, dtype=np.int64)
    np.cumsum([len(g) for g in grams], out=indptr[1:])
    indices = np.fromiter(map(cache.__getitem__, chain.from_iterable(grams)), dtype=np.int64,
                          count=int(indptr[-1]))
    X = sp.csr_array((np.ones(len(indices)), indices, indptr), shape=(len(prompts), n_features))
    X.sum_duplicates()
    if X.nnz:
        lengths = np.diff(X.indptr)
        sq = np.bincount(np.repeat(np.arange(len(prompts)), lengths), weights=X.data**2, minlength=len(prompts))
        X.data /= np.repeat(np.sqrt(sq), lengths)
    return X
