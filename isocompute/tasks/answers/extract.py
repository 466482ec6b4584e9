"""Final-answer extraction from a model completion.

``extract_answer(text)`` returns the string a grader should compare with the reference, or ``None``
when the completion commits to no answer. Rules, first match wins:

1. the last non-empty ``\\boxed{…}`` / ``\\fbox{…}`` (braces matched, so ``\\boxed{\\frac{1}{2}}`` keeps
   its inner braces; ``\\boxed 7`` without braces is read up to the next space or ``$``);
2. the last GSM8K marker ``#### x`` (rest of that line);
3. the last "the answer is x" / "answer: x" (case-insensitive; ``Final Answer: The final answer is $x$.``
   included). The text after it up to the end of the sentence is kept when it reads like a bare answer
   (``\\frac{3}{4}``, ``x = 5``); otherwise its first number is taken ("18 eggs" → ``18``);
4. the whole text when it is itself a bare answer without ``=`` or a ``label:`` (an already-extracted
   ``\\frac{1}{9}``, or a single token such as ``Tuesday``);
5. the last number in the text (``-3``, ``1,234`` → ``1234``, ``2.5``, ``3/4``).

Normalisation is deliberately trivial — whitespace, surrounding ``$`` and ``\\(…\\)`` / ``\\[…\\]``
delimiters, escaped ``\\$`` signs, a trailing period, thin spaces ``\\!`` and thousands commas in plain
numbers. Mathematical equivalence (``0.5`` vs ``\\frac12``) is the grader's job (math-verify), not ours.

Ignores: multiple-choice letters, code blocks, answers split over several boxes (the last box wins).

>>> extract_answer("so 16 - 3 - 4 = 9 eggs, and 9 * 2 = 18.\\n#### 18")
'18'
>>> extract_answer("Hence $x = \\\\boxed{\\\\frac{1}{2}}$.")
'\\\\frac{1}{2}'
>>> extract_answer("I am not sure.") is None
True
"""

from __future__ import annotations

import re

__all__ = ["extract_answer", "extract_boxed", "last_number", "normalize_answer"]

_BOX_COMMANDS = ("\\boxed", "\\fbox")

# A number: thousands-grouped (1,234,567.5), plain (12, 0.25), leading-dot (.5) or a fraction (3/4).
# The sign is only taken when the '-' does not follow a word character, so "16-3" yields 3, not -3.
_NUMBER = re.compile(
    r"(?:(?<![\w)\]}])-)?(?<![\w.])"
    r"(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?(?:/\d+)?|\.\d+)"
    r"(?![\d])"
)
_THOUSANDS = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_GSM8K_MARK = re.compile(r"####\s*([^\n]*)")
_ANSWER_IS = re.compile(r"(?:answer\s+is|answer\s*:)\s*:?", re.IGNORECASE)
# Sentence end: a period followed by whitespace, or a newline. Keeps decimals (3.5) and "p.m" intact.
_SENTENCE_END = re.compile(r"\.(?:\s|$)|\n")
_LATEX_COMMAND = re.compile(r"\\[A-Za-z]+")
_WORD = re.compile(r"[A-Za-z]{2,}")  # an English word; single letters are variables (or p.m.)


def _matching_brace(text: str, open_at: int) -> int:
    """Index of the ``}`` closing the ``{`` at ``open_at``, or -1 when unbalanced."""
    depth = 0
    i = open_at
    while i < len(text):
        ch = text[i]
        if ch == "\\":  # skip escaped characters such as \{ and \}
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


def extract_boxed(text: str) -> str | None:
    """Content of the last non-empty ``\\boxed{…}`` or ``\\fbox{…}``, un-normalised; ``None`` if none."""
    found: list[tuple[int, str]] = []
    for command in _BOX_COMMANDS:
        start = 0
        while (at := text.find(command, start)) != -1:
            after = at + len(command)
            start = after
            if after < len(text) and (text[after].isalpha()):
                continue  # \boxedfoo is another command
            j = after
            while j < len(text) and text[j] == " ":
                j += 1
            if j < len(text) and text[j] == "{":
                end = _matching_brace(text, j)
                if end == -1:
                    continue  # truncated completion: an unclosed box is no answer
                content = text[j + 1 : end]
            else:
                # "\boxed 7": the argument runs to the next space or math delimiter.
                m = re.match(r"[^\s$]+", text[j:])
                content = m.group(0) if m else ""
            if content.strip():
                found.append((at, content))
    if not found:
        return None
    return max(found)[1]


def normalize_answer(answer: str) -> str:
    """Trivial clean-up of an extracted answer; see the module docstring for what it does not do.

    >>> normalize_answer(" $1,234$. ")
    '1234'
    >>> normalize_answer("(3, 4)")
    '(3, 4)'
    """
    s = answer.strip()
    for left, right in (("\\(", "\\)"), ("\\[", "\\]")):
        if s.startswith(left) and s.endswith(right):
            s = s[len(left) : -len(right)].strip()
    s = s.replace("\\$", "").replace("$", "").strip()
    s = s.rstrip(".").strip()
    # LaTeX thousands separators: "11,\\! 111" and "10{,}000".
    s = re.sub(r",\\!\s*", ",", s).replace("\\!", "").replace("{,}", ",")
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    return s


def _is_bare_answer(s: str) -> bool:
    """True when ``s`` reads like an answer rather than prose: short, one line, no English words.

    LaTeX commands and their names (``\\frac``, ``\\text``) do not count as words, so
    ``\\text{4:30 p.m.}`` is bare while ``18 eggs`` is not.
    """
    if not s or len(s) > 100 or "\n" in s:
        return False
    return _WORD.search(_LATEX_COMMAND.sub(" ", s)) is None


def _passes_through(s: str) -> bool:
    if not s or "=" in s or ": " in s or any(c in s for c in _BOX_COMMANDS):  # "\boxed{}" is no answer
        return False
    return _is_bare_answer(s) or (len(s) <= 100 and re.search(r"\s", s) is None)


def last_number(text: str) -> str | None:
    """The last number in ``text`` with thousands commas removed, or ``None``.

    >>> last_number("from 16-3 we get 1,234 and then -2.5")
    '-2.5'
    """
    matches = _NUMBER.findall(text)
    if not matches:
        return None
    return matches[-1].replace(",", "")


def _after_answer_phrase(text: str) -> str | None:
    """The answer following the last "answer is" / "answer:" phrase, or ``None``."""
    phrases = list(_ANSWER_IS.finditer(text))
    for m in reversed(phrases):
        rest = text[m.end() :].lstrip()
        end = _SENTENCE_END.search(rest)
        segment = normalize_answer(rest[: end.start()] if end else rest)
        if _is_bare_answer(segment):
            return segment
        number = _NUMBER.search(segment)
        if number:
            return number.group(0).replace(",", "")
    return None


def extract_answer(text: str) -> str | None:
    """The final answer in ``text`` after trivial normalisation, or ``None`` when there is none."""
    boxed = extract_boxed(text)
    if boxed is not None:
        return normalize_answer(boxed) or None
    marks = _GSM8K_MARK.findall(text)
    if marks and normalize_answer(marks[-1]):
        return normalize_answer(marks[-1])
    phrase = _after_answer_phrase(text)
    if phrase:
        return phrase
    # An already-extracted answer passes through unchanged. Equations and labels are excluded so that
    # a bare working line ("47 + 385 = 432") or a labelled one ("A: 224") yields its number (rule 5).
    whole = normalize_answer(text)
    if _passes_through(whole):
        return whole
    return last_number(text)
