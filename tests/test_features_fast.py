"""PromptFeatures.transform's fast paths (one prompt; a batch through the chunk cache) equal the reference
features bit for bit."""

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isocompute.policy.features.chunk_cache import COUNTS, ChunkTable, _describe
from isocompute.policy.features.prompt import (
    HAND_FEATURES,
    PromptFeatures,
    expression_features,
    hand_features,
    hashed_matrix,
)
from isocompute.policy.features.text_rules import EXPRESSION

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"

TRAIN = [
    "What is 47 + 385 - 12?",
    "What is 9 * 8?",
    r"Compute $\frac{3}{4} \times 12.5$.",
    "How many primes are below 100?",
    "Solve $x^2+3x-5=0$ for x.",
    "Évaluez 3 + 4 — combien?",
    "Find the value of a_1 + a_2 given a_n = 2n.",
    "If 3 cats eat 3 mice in 3 minutes, how long do 100 cats take?",
]

EDGE = [
    "",
    "   \n\t ",
    "__",
    "a __ b",
    "a_b __ c_",
    "3 +\n4",
    "3\t+\t4 and 5 +6",
    "x 3+ 4",
    "3 +4 - 5*6",
    "ΑΣ_Α ΑΣ ς",
    "İstanbul",
    "1" * 400,
    "3.5.6 and 0.5 and .5",
    "١٢ + ٣ = ١٥",
    "12345678901234567 + 1",
    "99999999999999.5 is big",
    "x" * 50,
    "\\frac{1}{2} × 3 − 4 · 5 ÷ 6",
    "$$ ? ?? $",
    "a\x00b",
    "tab\tsep\x0bvt\x1cfs\u2003em\u3000ideo",
]


def _reference(f: PromptFeatures, prompts: list[str]) -> np.ndarray:
    hand = hand_features(prompts)
    if f.n_components_ == 0:
        return hand
    return np.hstack([hand, hashed_matrix(prompts, f.n_features) @ f.components_.T])


@pytest.fixture(scope="module")
def fitted() -> PromptFeatures:
    return PromptFeatures(n_components=5, n_features=1024).fit(TRAIN)


def _check(f: PromptFeatures, prompts: list[str]) -> None:
    ref = _reference(f, prompts)
    assert np.array_equal(f.transform(prompts), ref)  # the batch path
    for p, r in zip(prompts, ref, strict=True):  # the one-prompt path
        assert np.array_equal(f.transform([p])[0], r), repr(p)


def test_edge_cases_equal_reference(fitted):
    _check(fitted, EDGE)
    _check(fitted, EDGE[::-1])  # again, now from a warm cache, in another order


def test_worked_example_counts():
    # "12?" → tokens 00 ?: 2 tokens, 1 number of 2 digits, 1 question mark, no expression inside.
    toks, counts, max_digits, max_value, flags = _describe("12?")
    assert toks == ["00", "?"] and max_digits == 2 and max_value == 12.0
    named = dict(zip(COUNTS, counts, strict=True))
    assert (named["tokens"], named["numbers"], named["digits"], named["question_marks"]) == (2, 1, 2, 1)
    assert named["words"] == named["operators"] == 0
    assert flags & 16 and not flags & 1  # starts with a digit; no expression inside


@pytest.mark.parametrize("prompts", [["a \x00 b"], ["x", "\x00", "y"], ["ok", "a\n\x00\nb"]])
def test_whitespace_delimited_nul_takes_the_reference_path(fitted, prompts):
    _check(fitted, prompts)


_PIECES = st.sampled_from(list("ab xyz09187+-*×−·÷/^=<>$?.\\_\t\n\x00ΣςéŁ٣²{}()") + ["frac ", "times ", "What "])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(_PIECES, max_size=25).map("".join), min_size=1, max_size=6))
def test_equals_reference_on_arbitrary_text(fitted, texts):
    _check(fitted, texts)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(max_size=30), min_size=1, max_size=4))
def test_equals_reference_on_any_unicode(fitted, texts):
    _check(fitted, texts)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.text(st.sampled_from(list("0123456789 \t\n+-*×_x")), max_size=30), min_size=1, max_size=5))
def test_expression_candidates_miss_nothing(texts):
    """Only prompts whose chunks are flagged are searched; on expression-dense text the flags must catch
    every expression the regex finds (the batch path, then one prompt at a time)."""
    table = ChunkTable(64)
    cols = [HAND_FEATURES.index(c) for c in ("expr_operands", "expr_carries", "expr_result_digits", "expr_negative")]
    want = np.array([expression_features(t) for t in texts], dtype=np.float64)
    assert np.array_equal(table.features(texts)[0][:, cols], want)
    assert [bool(EXPRESSION.search(t)) for t in texts] == [bool(w[0]) for w in want]


def test_cache_restarts_when_full_and_stays_exact(fitted):
    f = fitted
    table = ChunkTable(f.n_features, max_chunks=8)
    prompts = TRAIN + EDGE
    want = _reference(f, prompts)
    for _ in range(3):  # each batch overfills the table, which restarts before the next one
        got = table.transform(prompts, f._components_t)
        assert np.array_equal(got, want)
        assert len(table) > 8
    for p, w in zip(prompts, want, strict=True):
        assert np.array_equal(table.transform([p], f._components_t)[0], w)


def test_hand_block_without_ngrams():
    f = PromptFeatures(n_components=16).fit(["only one"])
    assert f.n_components_ == 0
    np.testing.assert_array_equal(f.transform(EDGE), hand_features(EDGE))
    assert f.transform([]).shape == (0, len(HAND_FEATURES))


def test_empty_batch(fitted):
    assert fitted.transform([]).shape == (0, len(HAND_FEATURES) + 5)
    hand, X = ChunkTable(16).features([])
    assert hand.shape == (0, len(HAND_FEATURES)) and X.shape == (0, 16)


def test_concurrent_transforms_agree(fitted):
    prompts = TRAIN + EDGE
    f = PromptFeatures(n_components=5, n_features=1024).fit(TRAIN)  # a cold cache shared by the threads
    want = _reference(f, prompts)
    batches = [prompts[i:] + prompts[:i] for i in range(8)]
    with ThreadPoolExecutor(4) as ex:
        results = list(ex.map(f.transform, batches))
    for i, got in enumerate(results):
        assert np.array_equal(got, np.roll(want, -i, axis=0))


def _real_prompts() -> list[str]:
    out = []
    math_path, gsm_path = DATA / "math500_test.jsonl", DATA / "gsm8k_test.jsonl"
    if not (math_path.exists() and gsm_path.exists()):
        pytest.skip("shared data absent")
    from isocompute.tasks.math import load

    out += [p.prompt for p in load(math_path)]
    out += [json.loads(line)["question"] for line in gsm_path.read_text().splitlines()[:300] if line.strip()]
    return out


def test_real_prompts_equal_reference():
    from isocompute.tasks.arith import generate

    prompts = _real_prompts() + [p.prompt for p in generate(300, seed=5)]
    f = PromptFeatures().fit(prompts[::3])
    ref = _reference(f, prompts)
    assert np.array_equal(f.transform(prompts), ref)
    assert np.array_equal(f.transform(prompts), ref)  # warm
    for i in range(0, len(prompts), 7):
        assert np.array_equal(f.transform([prompts[i]])[0], ref[i])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2**40), max_size=300, unique=True), min_size=1, max_size=5))
def test_int_map_agrees_with_a_dict(batches):
    """The vectorised open-addressing map (it grows from 16 slots here) against a plain dict."""
    from isocompute.policy.features.chunk_cache import _IntMap

    table, ref = _IntMap(16), {}
    for keys in batches:
        k = np.array(keys, dtype=np.int64)
        got = table.get(k)
        assert got.tolist() == [ref.get(x, -1) for x in keys]
        new = np.array([x for x in keys if x not in ref], dtype=np.int64)
        table.put(new, new % 97)
        ref.update((x, x % 97) for x in new.tolist())
        assert table.get(k).tolist() == [ref[x] for x in keys]
        assert table.n == len(ref) and 2 * table.n <= table.keys.size
