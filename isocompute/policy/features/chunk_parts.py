"""The pieces of the chunk cache (:mod:`isocompute.policy.features.chunk_cache`): what one whitespace chunk
contributes (its tokens, counts, largest number and expression flags), the hand block assembled from a
batch's chunk rows, the reference path, and two vectorised containers (a growing array, an int map).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from isocompute.policy.features.text_rules import (
    COUNTS,
    EXPRESSION,
    EXPRESSION_OPS,
    NUMBER,
    is_digit,
    token_counts,
    tokenize,
)
from isocompute.policy.features.text_stats import (
    HAND_FEATURES,
    expression_features,
    hand_features,
    hashed_matrix,
)

# Per-chunk counts (text_rules.COUNTS), summed per prompt; their columns in the hand block, by name.
_COL = [HAND_FEATURES.index(c) for c in COUNTS]
_EXPR_COLS = [HAND_FEATURES.index(c) for c in ("expr_operands", "expr_carries", "expr_result_digits",
                                                 "expr_negative")]
_MAXDIG_COL = HAND_FEATURES.index("max_number_digits")
_CHARS_COL = HAND_FEATURES.index("chars")
_LOG_COL = HAND_FEATURES.index("log10_max_number")
_NUMBERS, _DIGITS = COUNTS.index("numbers"), COUNTS.index("digits")

# Expression flags of a chunk (bits). An expression needs digit [ \t]* op [ \t]* digit somewhere: inside
# one chunk, or with whitespace before the operator, after it, or both (then the operator is a chunk).
_INSIDE, _ENDS_D, _ENDS_DOP, _IS_OP, _STARTS_D, _STARTS_OPD = 1, 2, 4, 8, 16, 32
_SEP = " \x00 "  # joins a batch; a batch with a whitespace-delimited NUL of its own takes the reference
_SEP_CHUNK = "\x00"


def _expression_flags(c: str) -> int:
    if not c:
        return 0
    f = _INSIDE if EXPRESSION.search(c) else 0
    if is_digit(c[-1]):
        f |= _ENDS_D
    if len(c) >= 2 and c[-1] in EXPRESSION_OPS and is_digit(c[-2]):
        f |= _ENDS_DOP
    if c in EXPRESSION_OPS:
        f |= _IS_OP
    if is_digit(c[0]):
        f |= _STARTS_D
    if len(c) >= 2 and c[0] in EXPRESSION_OPS and is_digit(c[1]):
        f |= _STARTS_OPD
    return f


class _Memo(dict):
    """A dict that fills a miss with ``fn(key)``: hits stay a C-level lookup (``map(memo.__getitem__, …)``)."""

    def __init__(self, fn: Any) -> None:
        super().__init__()
        self.fn = fn

    def __missing__(self, key: Any) -> Any:
        v = self[key] = self.fn(key)
        return v


def _describe(c: str) -> tuple[list[str], tuple[int, ...], int, float, int]:
    """(tokens, counts in COUNTS order, most integer digits, largest number, expression flags) of a chunk:
    the reference's formulas (features._hand_row) applied to the chunk, one chunk at a time (the table
    describes new chunks in bulk; this is its check, and its path for chunks holding a NUL)."""
    toks = tokenize(c)
    counts = tuple(map(sum, zip(*map(token_counts, toks), strict=True))) if toks else (0,) * len(COUNTS)
    max_digits, max_value = 0, 0.0  # numbers are unsigned: 0 is a neutral start for both maxima
    if counts[_NUMBERS]:
        nums = NUMBER.findall(c)
        max_digits = max(len(n.partition(".")[0]) for n in nums)
        max_value = max(map(float, nums))
    # every expression flag needs a digit, but a lone operator
    flags = _expression_flags(c) if counts[_DIGITS] else (_IS_OP if c in EXPRESSION_OPS else 0)
    return toks, counts, max_digits, max_value, flags


class _Grow:
    """A numpy array that doubles its capacity along axis 0; ``buf[:n]`` are the rows in use."""

    def __init__(self, shape: tuple[int, ...], dtype: type) -> None:
        self.buf = np.zeros((64, *shape), dtype=dtype)
        self.n = 0

    def extend(self, rows: np.ndarray) -> None:
        need = self.n + len(rows)
        if need > len(self.buf):
            buf = np.zeros((max(need, 2 * len(self.buf)), *self.buf.shape[1:]), dtype=self.buf.dtype)
            buf[: self.n] = self.buf[: self.n]
            self.buf = buf
        self.buf[self.n : need] = rows
        self.n = need


class _IntMap:
    """A map from non-negative int64 keys to int64 values with vectorised lookups: open addressing with
    linear probing in two numpy arrays, so a batch of keys costs a few numpy passes rather than a dict
    lookup each (~100 ns). Kept at most half full."""

    def __init__(self, capacity: int = 1 << 12) -> None:
        self.keys = np.full(capacity, -1, dtype=np.int64)
        self.values = np.zeros(capacity, dtype=np.int64)
        self.n = 0

    def _home(self, k: np.ndarray) -> np.ndarray:
        # Fibonacci hashing: the top bits of k·2^64/φ (mod 2^64) spread consecutive ids over the table
        bits = self.keys.size.bit_length() - 1
        return ((k.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(64 - bits)).astype(np.intp)

    def get(self, k: np.ndarray) -> np.ndarray:
        """Values of keys ``k`` (-1 where absent)."""
        out = np.full(k.size, -1, dtype=np.int64)
        slot, todo = self._home(k), np.arange(k.size)
        mask = self.keys.size - 1
        while todo.size:
            found = self.keys[slot]
            hit = found == k[todo]
            out[todo[hit]] = self.values[slot[hit]]
            more = ~hit & (found >= 0)  # an occupied slot holding another key: probe the next one
            todo, slot = todo[more], (slot[more] + 1) & mask
        return out

    def put(self, k: np.ndarray, v: np.ndarray) -> None:
        """Insert distinct keys ``k`` (absent so far) with values ``v``."""
        if 2 * (self.n + k.size) > self.keys.size:
            old_k, old_v = self.keys[self.keys >= 0], self.values[self.keys >= 0]
            size = self.keys.size
            while 2 * (self.n + k.size) > size:
                size *= 2
            self.keys, self.values, self.n = np.full(size, -1, dtype=np.int64), np.zeros(size, dtype=np.int64), 0
            self.put(old_k, old_v)
        mask = self.keys.size - 1
        slot, todo = self._home(k), np.arange(k.size)
        while todo.size:
            free = self.keys[slot] < 0
            # of the keys that found a free slot, the first to claim each slot takes it
            cand = np.flatnonzero(free)
            _, first = np.unique(slot[cand], return_index=True)
            won = cand[first]
            self.keys[slot[won]], self.values[slot[won]] = k[todo[won]], v[todo[won]]
            left = np.ones(todo.size, dtype=bool)
            left[won] = False
            todo, slot = todo[left], (slot[left] + 1) & mask  # the rest probe on past taken slots
        self.n += k.size


def _hand(texts: list[str], seps: np.ndarray, row: np.ndarray, counts: np.ndarray, maxdig: np.ndarray,
          maxval: np.ndarray, flags: np.ndarray) -> np.ndarray:
    """The hand block from the batch's chunk rows (``seps``: where each prompt's rows start)."""
    n = len(texts)
    hand = np.empty((n, len(HAND_FEATURES)), dtype=np.float64)
    hand[:, _CHARS_COL] = np.fromiter(map(len, texts), dtype=np.float64, count=n)
    sums = np.add.reduceat(counts, seps, axis=0)
    hand[:, _COL] = sums
    md = np.maximum.reduceat(maxdig, seps)  # 0 without numbers, as in the reference
    hand[:, _MAXDIG_COL] = md
    hand[:, _LOG_COL] = 0.0
    has = np.flatnonzero(sums[:, _NUMBERS])
    if has.size:
        mv = np.maximum.reduceat(maxval, seps)[has]
        # beyond float precision the digit count *is* the log magnitude (as in the reference)
        hand[has, _LOG_COL] = [math.log10(1.0 + v) if d <= 15 else float(d)
                               for d, v in zip(md[has].tolist(), mv.tolist(), strict=True)]
    hand[:, _EXPR_COLS] = 0.0
    f = flags
    cand = (f & _INSIDE) > 0
    cand[:-1] |= ((f[:-1] & _ENDS_D) > 0) & ((f[1:] & _STARTS_OPD) > 0)
    cand[:-1] |= ((f[:-1] & _ENDS_DOP) > 0) & ((f[1:] & _STARTS_D) > 0)
    cand[:-2] |= ((f[:-2] & _ENDS_D) > 0) & ((f[1:-1] & _IS_OP) > 0) & ((f[2:] & _STARTS_D) > 0)
    if cand.any():
        rows = np.unique(row[cand])  # a false candidate (e.g. a newline in between) finds nothing
        hand[rows[:, None], _EXPR_COLS] = [expression_features(texts[i]) for i in rows.tolist()]
    return hand


def _reference(texts: list[str], n_features: int, ngrams: bool) -> tuple[np.ndarray, Any]:
    if not ngrams:
        return hand_features(texts), None
    X = hashed_matrix(texts, n_features)
    return hand_features(texts), (X.data, X.indices, X.indptr)
