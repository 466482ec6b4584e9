r"""The text rules of the ``prompt-text`` feature set, in one place: the tokenizer, the counted symbols,
the inline-expression pattern and the n-gram bucket.

Two implementations compute the features from these rules and must agree bit for bit: the reference,
:mod:`isocompute.policy.features.prompt`, which counts on the raw text, and the chunk cache,
:mod:`isocompute.policy.features.chunk_cache`, which counts per token and caches per whitespace chunk. Both
import the rules from here, so a rule changed here changes both (and the tests comparing them still
hold them to each other).

* **tokens**: one regex pass over the normalised text (lower case, every digit as 0): ASCII word |
  number (one decimal part) | LaTeX command | other symbol | non-ASCII word; whitespace separates.
* **counted symbols**: the operators ``+ - * / ^ = < > × ÷ · −`` (plus the LaTeX operators), and
  separately ``+``, the minus signs ``- −``, the times signs ``* × ·`` (plus ``\times``, ``\cdot``),
  ``$`` and ``?``.
* **expression**: an inline integer expression is digits, then one or more ``[ \t]* op [ \t]* digits``
  with op one of ``- + * ×``.
* **bucket**: scikit-learn's ``HashingVectorizer`` index of an n-gram (signed murmurhash3, seed 0).

Counting per token equals counting on the raw text because every counted symbol is a single character
that the tokenizer's "other symbol" branch makes a token of its own, and lower-casing changes none of
them: :func:`token_counts` is a token's share of :data:`COUNTS`, so a text's counts are the sum over its
tokens. Worked example: ``"What is 47 + 385 - 12?"`` → tokens ``what is 00 + 000 - 00 ?``; summing
``token_counts`` gives 8 tokens, 2 words, 3 numbers, 7 digits, 2 operators (one plus, one minus), 1
question mark, 1 question word.

Ignores: the feature layout (column names and order live in :mod:`isocompute.policy.features.prompt`).
"""

from __future__ import annotations

import functools
import re
from typing import Any

__all__ = [
    "COUNTS", "EXPRESSION", "EXPRESSION_OPS", "EXPRESSION_TERM", "LATEX_OPS", "LATEX_TIMES", "MINUS_CHARS",
    "NUMBER", "OPERATOR", "OPERATOR_CHARS", "QUESTION_WORDS", "SHAPE", "TIMES_CHARS", "TOKEN", "is_digit",
    "murmur_index", "token_counts", "tokenize",
]

# One pass of the tokenizer over the normalised text (lower case, digits as 0): ASCII word | number |
# LaTeX command | other symbol | non-ASCII word; the common branches first, because order is speed here.
TOKEN = re.compile(r"[a-z]+|\d+(?:\.\d+)?|\\[a-z]+|[^\w\s]|[^\W\d_]+")
NUMBER = re.compile(r"\d+(?:\.\d+)?")
# Every digit becomes 0, so a number's token is its shape ("385" -> "000"): raw numbers are almost all
# unique and their n-grams would share nothing, while "000 + 00" generalises.
SHAPE = str.maketrans("0123456789", "0000000000")
_DIGIT = re.compile(r"\d")  # the tokenizer's notion of a digit (Unicode Nd)

OPERATOR_CHARS = frozenset("+-*/^=<>×÷·−")
OPERATOR = re.compile("[" + re.escape("".join(sorted(OPERATOR_CHARS))) + "]")
MINUS_CHARS = ("-", "−")
TIMES_CHARS = ("*", "×", "·")
LATEX_OPS = frozenset(r"\times \cdot \div \pm \le \ge \leq \geq \neq \frac \sqrt".split())
LATEX_TIMES = frozenset((r"\times", r"\cdot"))

QUESTION_WORDS = frozenset(
    "what how which why when where who whom whose many much find compute calculate evaluate determine "
    "solve simplify prove show express".split()
)

# An inline integer expression such as "47 + 385 * 6" ("-" first: a literal inside a regex class).
_EXPRESSION_OPS = "-+*×"
EXPRESSION_OPS = frozenset(_EXPRESSION_OPS)
EXPRESSION = re.compile(rf"\d+(?:[ \t]*[{_EXPRESSION_OPS}][ \t]*\d+)+")
EXPRESSION_TERM = re.compile(rf"\d+|[{_EXPRESSION_OPS}]")

# The counts that add over tokens (names of the hand features they fill).
COUNTS = ("tokens", "words", "numbers", "digits", "operators", "plus", "minus", "times", "latex_commands",
          "dollars", "question_marks", "question_words")

_INT32_MIN = -(2**31)


def tokenize(text: str) -> list[str]:
    r"""Normalised regex tokens: lower case, every digit as 0; LaTeX commands, numbers (with one decimal
    part), runs of letters and single other symbols are tokens; whitespace separates.

    >>> tokenize(r"What is $47 \times 3.5$?")
    ['what', 'is', '$', '00', '\\times', '0.0', '$', '?']
    """
    return TOKEN.findall(text.lower().translate(SHAPE))


def is_digit(ch: str) -> bool:
    """Is ``ch`` a digit as the tokenizer reads one (Unicode Nd)?"""
    return _DIGIT.match(ch) is not None


def token_counts(t: str) -> tuple[int, ...]:
    r"""One token's share of :data:`COUNTS` (see the module docstring for why the shares add up to the
    raw text's counts). A number token is a digit shape (``00.0``).

    >>> token_counts("00.0")[:4], token_counts("\\times")[4:9]  # 1 number, 3 digits; an operator, ×, LaTeX
    ((1, 0, 1, 3), (1, 0, 0, 1, 1))
    """
    latex = t[0] == "\\"
    number = is_digit(t[0])
    return (1, int(t.isalpha()), int(number), len(t) - t.count(".") if number else 0,
            int(t in OPERATOR_CHARS or (latex and t in LATEX_OPS)), int(t == "+"), int(t in MINUS_CHARS),
            int(t in TIMES_CHARS or (latex and t in LATEX_TIMES)), int(latex), int(t == "$"), int(t == "?"),
            int(t in QUESTION_WORDS))


@functools.cache
def _murmurhash3_32() -> Any:
    # Imported on first use: scikit-learn costs ~0.5 s, which importing the features should not pay.
    from sklearn.utils import murmurhash3_32

    return murmurhash3_32


def murmur_index(gram: str, n_features: int) -> int:
    """Bucket of one n-gram, with the arithmetic of sklearn's ``_hashing_fast``: signed murmurhash3 of
    the utf-8 bytes with seed 0, then ``abs(h) % n_features`` (and its defined value for h = -2**31).

    >>> murmur_index("what is", 8192)
    8187
    """
    h = _murmurhash3_32()(gram.encode("utf-8"), seed=0)
    if h == _INT32_MIN:
        return (2147483647 - (n_features - 1)) % n_features
    return abs(h) % n_features
