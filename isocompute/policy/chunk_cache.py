"""The fast path of :meth:`PromptFeatures.transform`: a cache of whitespace chunks, equal to the reference.

Why it is exact. Every quantity of the ``prompt-text`` feature set is a sum or a maximum over pieces that
never cross whitespace: tokens (no branch of the tokenizer matches whitespace), numbers, and the counted
symbols (single characters); lower-casing works per character except Unicode's final-sigma rule, whose
context stops at whitespace. So a prompt is its whitespace-separated chunks (``str.split()``), and each
chunk's share is computed once and cached:

* hand counts (tokens, words, numbers, digits, operators, + − ×, LaTeX commands, $, ?, question words)
  add over chunks; the longest number (integer digits) and the largest number are maxima over chunks;
* n-grams: a chunk's unigrams and inner bigrams are cached as hash buckets; the only n-grams crossing
  chunks are the bigrams (last token of a chunk, first token of the next), looked up per token pair;
* the inline expression (``47 + 385 - 12``) may cross whitespace, so it is searched on the prompt text,
  but only on prompts whose chunks show a digit-operator-digit pattern inside a chunk or across one or
  two boundaries (flags cached per chunk): the other prompts cannot contain one.

Worked example: ``"What is 47 + 385 - 12?"`` → chunks ``What | is | 47 | + | 385 | - | 12?``. Chunk
``12?`` has tokens ``00 ?`` (2 tokens, 1 number of 2 digits, 1 question mark) and the inner bigram
``00 ?``; the crossing bigrams are ``what is``, ``is 00``, ``00 +``, …, ``- 00``; ``47`` ends with a
digit, ``+`` is a lone operator and ``385`` starts with a digit, so this prompt is searched.

Per batch the Python-level work is one dict lookup per chunk and one per crossing bigram (C-level
``map``), plus the misses; the rest is numpy over flat arrays. The n-gram matrix is built with the
reference's arithmetic (counts, then l2 normalisation in sorted bucket order), so its product with the
SVD components is the reference's bit for bit (tests compare both on arbitrary text).

Memory is bounded: once the table holds ``max_chunks`` chunks it starts afresh before the next batch.
Ignores: parallelism (a lock serialises the cache; a transform holds it for microseconds per prompt).
"""

from __future__ import annotations

import math
import re
import threading
from itertools import chain, compress, repeat
from operator import itemgetter
from typing import Any

import numpy as np
from sklearn.utils import murmurhash3_32

from isocompute.policy.features import (
    _EXPRESSION,
    _LATEX_OPS,
    _LATEX_TIMES,
    _NUMBER,
    _SHAPE,
    _TOKEN,
    HAND_FEATURES,
    QUESTION_WORDS,
    expression_features,
    hand_features,
    hashed_matrix,
)

# Per-chunk counts, summed per prompt; their columns in the hand block are looked up by name.
COUNTS = ("tokens", "words", "numbers", "digits", "operators", "plus", "minus", "times", "latex_commands",
          "dollars", "question_marks", "question_words")
_COL = [HAND_FEATURES.index(c) for c in COUNTS]
_EXPR_COLS = [HAND_FEATURES.index(c) for c in ("expr_operands", "expr_carries", "expr_result_digits",
                                                 "expr_negative")]
_MAXDIG_COL = HAND_FEATURES.index("max_number_digits")
_CHARS_COL = HAND_FEATURES.index("chars")
# A chunk record: (counts, most integer digits, largest number, expression flags, n-gram buckets, first
# token id, last token id); a pair record: (chunk row, crossing bucket).
_COUNTS_OF, _MAXDIG_OF, _MAXVAL_OF, _FLAGS_OF, _GRAMS_OF, _FIRST_OF, _LAST_OF = (itemgetter(j) for j in range(7))
_NUMBERS = COUNTS.index("numbers")
_LOG_COL = HAND_FEATURES.index("log10_max_number")

# Expression flags of a chunk (bits). An expression needs digit [ \t]* op [ \t]* digit somewhere: inside
# one chunk, or with whitespace before the operator, after it, or both (then the operator is a chunk).
_INSIDE, _ENDS_D, _ENDS_DOP, _IS_OP, _STARTS_D, _STARTS_OPD = 1, 2, 4, 8, 16, 32
_EXPR_OPS = frozenset("-+*×")
_DIGIT = re.compile(r"\d")  # the tokenizer's notion of a digit (Unicode Nd)
_SEP = " \x00 "  # joins a batch; a batch with a whitespace-delimited NUL of its own takes the reference
_SEP_CHUNK = "\x00"
_NO_CROSS, _UNDERSCORES = -1, -2  # pair crossings: none (a prompt starts), or past a token-less chunk


def _is_digit(ch: str) -> bool:
    return _DIGIT.match(ch) is not None


def _expression_flags(c: str) -> int:
    if not c:
        return 0
    f = _INSIDE if _EXPRESSION.search(c) else 0
    if _is_digit(c[-1]):
        f |= _ENDS_D
    if len(c) >= 2 and c[-1] in _EXPR_OPS and _is_digit(c[-2]):
        f |= _ENDS_DOP
    if c in _EXPR_OPS:
        f |= _IS_OP
    if _is_digit(c[0]):
        f |= _STARTS_D
    if len(c) >= 2 and c[0] in _EXPR_OPS and _is_digit(c[1]):
        f |= _STARTS_OPD
    return f


_OPERATOR_CHARS = frozenset("+-*/^=<>×÷·−")  # the characters of features._OPERATOR
_DIGITS = COUNTS.index("digits")


def _token_counts(t: str) -> tuple[int, ...]:
    r"""One token's share of COUNTS. The reference counts operator characters, ``+ - − * × · $ ?`` in
    the raw text; each of them is a token of its own (a symbol; lower-casing makes none of them), so
    counting tokens gives the same numbers. A number token is a digit shape (``00.0``).

    >>> _token_counts("00.0")[:4], _token_counts("\\times")[4:9]  # 1 number, 3 digits; an operator, ×, LaTeX
    ((1, 0, 1, 3), (1, 0, 0, 1, 1))
    """
    latex = t[0] == "\\"
    number = _is_digit(t[0])
    return (1, int(t.isalpha()), int(number), len(t) - t.count(".") if number else 0,
            int(t in _OPERATOR_CHARS or (latex and t in _LATEX_OPS)), int(t == "+"), int(t in ("-", "−")),
            int(t in ("*", "×", "·") or (latex and t in _LATEX_TIMES)), int(latex), int(t == "$"), int(t == "?"),
            int(t in QUESTION_WORDS))


class _Memo(dict):
    """A dict that fills a miss with ``fn(key)``: hits stay a C-level lookup (``map(memo.__getitem__, …)``)."""

    def __init__(self, fn: Any) -> None:
        super().__init__()
        self.fn = fn

    def __missing__(self, key: Any) -> Any:
        v = self[key] = self.fn(key)
        return v


_NO_COUNTS = (0,) * len(COUNTS)


def _describe(c: str, token_counts: Any = _token_counts) -> tuple[list[str], tuple[int, ...], int, float, int]:
    """(tokens, counts in COUNTS order, most integer digits, largest number, expression flags) of a chunk:
    the reference's formulas (features._hand_row) applied to the chunk. ``token_counts``: a memo of
    :func:`_token_counts`."""
    toks = _TOKEN.findall(c.lower().translate(_SHAPE))
    if not toks:
        return toks, _NO_COUNTS, 0, 0.0, 0
    counts = token_counts(toks[0]) if len(toks) == 1 else tuple(map(sum, zip(*map(token_counts, toks), strict=True)))
    max_digits, max_value = 0, 0.0  # numbers are unsigned: 0 is a neutral start for both maxima
    if counts[_NUMBERS]:
        nums = _NUMBER.findall(c)
        max_digits = max(len(n.partition(".")[0]) for n in nums)
        max_value = max(map(float, nums))
    # every expression flag needs a digit, but a lone operator
    flags = _expression_flags(c) if counts[_DIGITS] else (_IS_OP if c in _EXPR_OPS else 0)
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


class ChunkTable:
    """Cache of per-chunk features for one hashing width; :meth:`transform` is the batch transform.

    Two tables: chunks (text → its counts, maxima, expression flags, n-gram buckets, end tokens) and chunk
    pairs ((previous chunk, chunk) → the chunk's row and the bucket of the bigram crossing into it), so a
    cached prompt costs one dict lookup per chunk. A miss is filled in plain Python (a new chunk: ~10 µs;
    a new pair of known chunks: ~1 µs); the numpy copies the batch path reads are appended in bulk.
    """

    def __init__(self, n_features: int, *, max_chunks: int = 1 << 16) -> None:
        self.n_features = n_features
        self.max_chunks = max_chunks
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self._chunks: dict[str, int] = {}  # chunk text → row of _chunk_rec
        self._chunk_rec: list[tuple] = []
        self._pairs: dict[tuple[str, str], int] = {}  # (previous chunk, chunk) → row of _pair_rec
        self._pair_rec: list[tuple[int, int]] = []
        self._tokens: dict[str, int] = {}  # token → id
        self._token_text: list[str] = []
        self._token_pairs: dict[int, int] = {}  # (last id << 32 | first id) → bucket of "last first"
        self._buckets = _Memo(self._murmur)  # n-gram → bucket (murmurhash3 costs ~1 µs a call)
        self._token_counts = _Memo(_token_counts)
        # numpy copies of the records for the batch path, appended by _sync
        self._counts = _Grow((len(COUNTS),), np.int64)
        self._maxdig = _Grow((), np.int64)
        self._maxval = _Grow((), np.float64)
        self._flags = _Grow((), np.uint8)
        self._first = _Grow((), np.int64)
        self._last = _Grow((), np.int64)
        self._gstart = _Grow((), np.int64)  # a chunk's unigram and inner bigram buckets in _grams
        self._glen = _Grow((), np.int64)
        self._grams = _Grow((), np.int64)
        self._pair_chunk = _Grow((), np.int64)
        self._pair_cross = _Grow((), np.int64)
        # Row 0: the chunk that joins a batch (a real chunk too); row 1: "" (never a chunk), all zeros,
        # which stands in for the separators so that every prompt's run of rows is non-empty.
        self._chunk_row(_SEP_CHUNK)
        self._chunk_row("")

    def __len__(self) -> int:
        return len(self._chunks)

    def _full(self) -> bool:
        return (len(self._chunks) > self.max_chunks or len(self._pairs) > 4 * self.max_chunks
                or len(self._buckets) > 8 * self.max_chunks)

    # ------------------------------------------------------------------------------------------- misses
    def _murmur(self, gram: str) -> int:
        """sklearn's HashingVectorizer bucket of an n-gram (what features.murmur_index computes)."""
        h = murmurhash3_32(gram.encode("utf-8"), seed=0)
        nf = self.n_features
        return (2147483647 - (nf - 1)) % nf if h == -(2**31) else abs(h) % nf

    def _token_id(self, t: str) -> int:
        j = self._tokens.get(t)
        if j is None:
            j = self._tokens[t] = len(self._token_text)
            self._token_text.append(t)
        return j

    def _chunk_row(self, c: str) -> int:
        j = self._chunks.get(c)
        if j is None:
            toks, counts, max_digits, max_value, flags = _describe(c, self._token_counts.__getitem__)
            bucket = self._buckets.__getitem__
            grams = (*map(bucket, toks), *map(bucket, map(" ".join, zip(toks, toks[1:], strict=False))))
            first = self._token_id(toks[0]) if toks else -1
            last = self._token_id(toks[-1]) if toks else -1
            j = self._chunks[c] = len(self._chunk_rec)
            self._chunk_rec.append((counts, max_digits, max_value, flags, grams, first, last))
        return j

    def _pair_row(self, pair: tuple[str, str]) -> int:
        j = self._pairs.get(pair)
        if j is None:
            chunks = self._chunks
            prev, cur = chunks.get(pair[0]), chunks.get(pair[1])
            prev = self._chunk_row(pair[0]) if prev is None else prev
            cur = self._chunk_row(pair[1]) if cur is None else cur
            a, b = self._chunk_rec[prev], self._chunk_rec[cur]
            if prev == 0 or cur == 0:
                cross = _NO_CROSS  # the pair spans two prompts of a batch
            elif not (a[4] and b[4]):
                cross = _UNDERSCORES
            else:
                key = a[6] << 32 | b[5]
                cross = self._token_pairs.get(key)
                if cross is None:
                    text = self._token_text
                    cross = self._token_pairs[key] = self._buckets[text[a[6]] + " " + text[b[5]]]
            j = self._pairs[pair] = len(self._pair_rec)
            self._pair_rec.append((cur, cross))
        return j

    def _token_pair_buckets(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Bucket of the bigram "token a, token b" for token-id arrays a, b."""
        keys = ((a << 32) | b).tolist()
        out = np.fromiter(map(self._token_pairs.get, keys, repeat(-1)), dtype=np.int64, count=len(keys))
        text = self._token_text
        for i in np.flatnonzero(out < 0).tolist():
            k = keys[i]
            j = self._token_pairs.get(k)
            if j is None:
                j = self._token_pairs[k] = self._buckets[text[k >> 32] + " " + text[k & 0xFFFFFFFF]]
            out[i] = j
        return out

    def _sync(self) -> None:
        """Append the records added since the last call to the numpy copies."""
        new = self._chunk_rec[self._counts.n :]
        if new:
            self._counts.extend(np.array(list(map(_COUNTS_OF, new)), dtype=np.int64).reshape(len(new), len(COUNTS)))
            self._maxdig.extend(np.fromiter(map(_MAXDIG_OF, new), dtype=np.int64, count=len(new)))
            self._maxval.extend(np.fromiter(map(_MAXVAL_OF, new), dtype=np.float64, count=len(new)))
            self._flags.extend(np.fromiter(map(_FLAGS_OF, new), dtype=np.uint8, count=len(new)))
            self._first.extend(np.fromiter(map(_FIRST_OF, new), dtype=np.int64, count=len(new)))
            self._last.extend(np.fromiter(map(_LAST_OF, new), dtype=np.int64, count=len(new)))
            glen = np.fromiter(map(len, map(_GRAMS_OF, new)), dtype=np.int64, count=len(new))
            self._gstart.extend(self._grams.n + np.cumsum(glen) - glen)
            self._glen.extend(glen)
            self._grams.extend(np.fromiter(chain.from_iterable(map(_GRAMS_OF, new)), dtype=np.int64,
                                           count=int(glen.sum())))
        new_pairs = self._pair_rec[self._pair_chunk.n :]
        if new_pairs:
            cur, cross = np.array(new_pairs, dtype=np.int64).reshape(len(new_pairs), 2).T
            self._pair_chunk.extend(cur)
            self._pair_cross.extend(cross)

    def _pair_ids(self, flat: list[str]) -> np.ndarray:
        pid = np.fromiter(map(self._pairs.get, zip(chain((_SEP_CHUNK,), flat), flat, strict=False), repeat(-1)),
                          dtype=np.intp, count=len(flat))
        miss = np.flatnonzero(pid < 0)
        if miss.size:
            missing = list(compress(zip(chain((_SEP_CHUNK,), flat), flat, strict=False), (pid < 0).tolist()))
            pid[miss] = list(map(self._pair_row, missing))
        self._sync()
        return pid

    # ------------------------------------------------------------------------------------------- batch
    def features(self, texts: list[str], ngrams: bool = True) -> tuple[np.ndarray, Any]:
        """(hand block (N, len(HAND_FEATURES)) float64, l2-normalised hashed n-gram counts (N, n_features)
        as a ``scipy.sparse.csr_array`` or None without ``ngrams``): the reference's ``hand_features`` and
        ``hashed_matrix``."""
        import scipy.sparse as sp

        hand, parts = self._batch(texts, ngrams)
        if parts is None:
            return hand, None
        return hand, sp.csr_array(parts, shape=(len(texts), self.n_features))

    def transform(self, texts: list[str], components_t: np.ndarray | None) -> np.ndarray:
        """``[hand | counts @ components_t]`` (just the hand block when ``components_t`` is None): what
        :meth:`PromptFeatures.transform` returns, bit for bit."""
        if len(texts) == 1:
            row = self._single(texts[0], components_t)
            if row is not None:
                return row
        hand, parts = self._batch(texts, components_t is not None)
        if parts is None:
            return hand
        import scipy.sparse as sp

        return np.hstack([hand, sp.csr_array(parts, shape=(len(texts), self.n_features)) @ components_t])

    def _single(self, text: str, components_t: np.ndarray | None) -> np.ndarray | None:
        """One prompt in plain Python (numpy per-call overhead would dominate), or None for the batch path
        (a NUL or an underscores-only chunk)."""
        flat = text.split()
        with self._lock:
            if self._full():
                self._reset()
            pids = list(map(self._pairs.get, zip(chain((_SEP_CHUNK,), flat), flat, strict=False)))
            if None in pids:
                keys = list(zip(chain((_SEP_CHUNK,), flat), flat, strict=False))
                pids = [self._pair_row(keys[i]) if j is None else j for i, j in enumerate(pids)]
            crows, crosses = zip(*map(self._pair_rec.__getitem__, pids), strict=True) if pids else ((), ())
            recs = list(map(self._chunk_rec.__getitem__, crows))
        if 0 in crows or _UNDERSCORES in crosses:
            return None
        row = [0.0] * len(HAND_FEATURES)
        row[_CHARS_COL] = len(text)
        if recs:
            sums = list(map(sum, zip(*map(_COUNTS_OF, recs), strict=True)))
            for j, v in zip(_COL, sums, strict=True):
                row[j] = v
            if sums[_NUMBERS]:
                md = row[_MAXDIG_COL] = max(map(_MAXDIG_OF, recs))
                # beyond float precision the digit count *is* the log magnitude (as in the reference)
                row[_LOG_COL] = math.log10(1.0 + max(map(_MAXVAL_OF, recs))) if md <= 15 else float(md)
            # searching one prompt costs less than checking its chunks' flags in Python
            for j, v in zip(_EXPR_COLS, expression_features(text), strict=True):
                row[j] = v
        hand = np.array([row], dtype=np.float64)
        if components_t is None:
            return hand
        grams = list(chain.from_iterable(map(_GRAMS_OF, recs)))
        grams.extend(x for x in crosses if x >= 0)
        if not grams:
            return np.hstack([hand, np.zeros((1, components_t.shape[1]))])
        g = np.array(grams)
        g.sort()
        first = np.empty(g.size, dtype=bool)
        first[0] = True
        np.not_equal(g[1:], g[:-1], out=first[1:])
        start = np.flatnonzero(first)
        counts = np.empty_like(start)
        counts[:-1] = start[1:] - start[:-1]
        counts[-1] = g.size - start[-1]
        # integer counts: their squares sum exactly in any order, as the reference's bincount does
        data = counts.astype(np.float64)
        data /= math.sqrt(float(counts @ counts))
        # Summing down axis 0 of a C-ordered array adds row after row (numpy pairs up sums only along the
        # fast axis), which is csr_matvecs' order: the reference's product, bit for bit.
        proj = (components_t[g[start]] * data[:, None]).sum(axis=0, keepdims=True)
        return np.hstack([hand, proj])

    def _batch(self, texts: list[str], ngrams: bool) -> tuple[np.ndarray, Any]:
        n = len(texts)
        if n == 0:
            return np.zeros((0, len(HAND_FEATURES)), dtype=np.float64), (
                (np.zeros(0), np.zeros(0, dtype=np.int32), np.zeros(1, dtype=np.int64)) if ngrams else None)
        # One split of the joined batch, a separator chunk before each prompt: per-prompt lists would be
        # ~1 container per prompt, and holding a thousand triggers garbage-collector passes.
        flat = (_SEP + _SEP.join(texts)).split()
        with self._lock:
            if self._full():
                self._reset()
            pid = self._pair_ids(flat)
            cid = self._pair_chunk.buf[pid]
            is_sep = cid == 0
            seps = np.flatnonzero(is_sep)
            if seps.size != n:  # a prompt has a whitespace-delimited NUL of its own (never in practice)
                return _reference(texts, self.n_features, ngrams)
            cid[seps] = 1  # the all-zero row: each prompt's rows start with one, so none is empty
            counts = self._counts.buf[cid]
            maxdig = self._maxdig.buf[cid]
            maxval = self._maxval.buf[cid]
            flags = self._flags.buf[cid]
            if ngrams:
                cross = self._pair_cross.buf[pid]
                glen = self._glen.buf[cid]
                ends = np.cumsum(glen)
                inner = self._grams.buf[np.repeat(self._gstart.buf[cid] - ends + glen, glen) + np.arange(ends[-1])]
                underscores = bool((cross == _UNDERSCORES).any())
                if underscores:  # a chunk without tokens: bigrams cross it, token pair by token pair
                    keep = glen > 0
                    ck, rk = cid[keep], np.cumsum(is_sep)[keep]
                    same = rk[1:] == rk[:-1]
                    cross = self._token_pair_buckets(self._last.buf[ck[:-1][same]], self._first.buf[ck[1:][same]])
                    cross_rows = rk[1:][same] - 1
        row = np.cumsum(is_sep) - 1
        hand = _hand(texts, seps, row, counts, maxdig, maxval, flags)
        if not ngrams:
            return hand, None
        if not underscores:
            has_cross = cross >= 0
            cross_rows, cross = row[has_cross], cross[has_cross]
        return hand, self._csr_parts(n, np.concatenate([np.repeat(row, glen), cross_rows]),
                                  np.concatenate([inner, cross]))

    def _csr_parts(self, n: int, rows: np.ndarray, buckets: np.ndarray) -> tuple[np.ndarray, ...]:
        """(data, indices, indptr) of the counts of (row, bucket) pairs, l2-normalised per row, with the
        reference's arithmetic (entries in bucket order, squared norms summed in that order)."""
        nf = self.n_features
        keys = rows * nf + buckets
        if n * nf < 2**31:
            keys = keys.astype(np.int32)  # sorts faster
        keys.sort()
        first = np.empty(keys.size, dtype=bool)
        first[:1] = True
        np.not_equal(keys[1:], keys[:-1], out=first[1:])
        start = np.flatnonzero(first)
        u = keys[start]
        data = np.diff(start, append=keys.size).astype(np.float64)
        ru = u // nf
        sq = np.bincount(ru, weights=data**2, minlength=n)
        data /= np.sqrt(sq)[ru]
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(ru, minlength=n), out=indptr[1:])
        return data, u - ru * nf, indptr


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
