"""Prompt features: hand-worked counts, bit-equality with scikit-learn's hashing, persistence, purity."""

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.feature_extraction.text import HashingVectorizer

from isocompute.errors import ArtifactError, InputError
from isocompute.policy.features.prompt import (
    HAND_FEATURES,
    PromptFeatures,
    expression_features,
    hand_features,
    hashed_matrix,
    ngrams,
)
from isocompute.policy.features.text_rules import murmur_index, tokenize

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"

PROMPTS = [
    "What is 47 + 385 - 12?",
    "What is 9 * 8?",
    r"Compute $\frac{3}{4} \times 12.5$.",
    "How many primes are below 100?",
    "",
    "Évaluez 3 + 4 — combien?",
    "x" * 50,
]


def test_hand_features_worked_example():
    row = dict(zip(HAND_FEATURES, hand_features(["What is 47 + 385 - 12?"])[0], strict=True))
    assert row == pytest.approx({
        "chars": 22, "tokens": 8, "words": 2, "numbers": 3, "digits": 7, "max_number_digits": 3,
        "log10_max_number": np.log10(386), "operators": 2, "plus": 1, "minus": 1, "times": 0,
        "latex_commands": 0, "dollars": 0, "question_marks": 1, "question_words": 1,
        "expr_operands": 3, "expr_carries": 2, "expr_result_digits": 3, "expr_negative": 0,
    })


def test_hand_features_latex_example():
    row = dict(zip(HAND_FEATURES, hand_features([r"Compute $\frac{3}{4} \times 12.5$."])[0], strict=True))
    # numbers 3, 4, 12.5 -> 1 + 1 + 3 = 5 digits; operators: \frac and \times; times: \times; question word: compute.
    assert row["numbers"] == 3 and row["digits"] == 5 and row["max_number_digits"] == 2
    assert row["latex_commands"] == 2 and row["operators"] == 2 and row["times"] == 1
    assert row["dollars"] == 2 and row["question_words"] == 1 and row["question_marks"] == 0
    assert row["log10_max_number"] == pytest.approx(np.log10(13.5))


def _carries_by_columns(a: int, op: str, b: int) -> int:
    """Independent count: schoolbook column arithmetic on digit lists (magnitudes, larger first for −)."""
    x, y = abs(a), abs(b)
    add = (op == "+") == ((a >= 0) == (b >= 0))
    if not add:
        x, y = max(x, y), min(x, y)
    xd, yd = [int(c) for c in str(x)[::-1]], [int(c) for c in str(y)[::-1]]
    yd += [0] * (len(xd) - len(yd))
    xd += [0] * (len(yd) - len(xd))
    n, c = 0, 0
    for p, q in zip(xd, yd, strict=True):
        if add:
            c = int(p + q + c >= 10)
        else:
            c = int(p - q - c < 0)
        n += c
    return n


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 99999), min_size=2, max_size=5), st.lists(st.sampled_from("+-*"), min_size=4,
                                                                              max_size=4))
def test_expression_features_match_schoolbook_columns(nums, ops):
    ops = ops[: len(nums) - 1]
    text = "What is " + " ".join(f"{n} {o}" for n, o in zip(nums, ops, strict=False)) + f" {nums[-1]}?"
    got = expression_features(text)
    vals, rest = list(nums), list(ops)
    while "*" in rest:
        j = rest.index("*")
        vals[j : j + 2] = [vals[j] * vals[j + 1]]
        del rest[j]
    acc, carries, neg = vals[0], 0, 0
    for op, b in zip(rest, vals[1:], strict=True):
        carries += _carries_by_columns(acc, op, b)
        acc = acc + b if op == "+" else acc - b
        neg |= acc < 0
    assert got == (len(nums), carries, len(str(abs(acc))), int(neg))
    assert acc == eval(" ".join(f"{n} {o}" for n, o in zip(nums, ops, strict=False)) + f" {nums[-1]}")  # noqa: S307


def test_expression_features_edge_cases():
    assert expression_features("no maths here") == (0, 0, 0, 0)
    assert expression_features("What is 999 × 2 + 1?") == (3, 0, 4, 0)  # 1998 + 1: no carry
    assert expression_features("add 99+1") == (2, 2, 3, 0)
    assert expression_features("1" * 30 + " + 1")[0] == 2  # too long to evaluate: operands only


def test_tokenize_and_ngrams():
    assert tokenize(r"What is $47 \times 3.5$?") == ["what", "is", "$", "00", "\\times", "0.0", "$", "?"]
    assert ngrams("9 + 10") == ["0", "+", "00", "0 +", "+ 00"]
    assert ngrams("") == []


def test_huge_number_does_not_overflow():
    row = hand_features(["1" * 400])[0]
    assert row[HAND_FEATURES.index("log10_max_number")] == 400
    assert np.isfinite(row).all()


@pytest.mark.parametrize("n_features", [2, 97, 1 << 13])
def test_hashing_equals_sklearn_bit_for_bit(n_features):
    hv = HashingVectorizer(analyzer=ngrams, n_features=n_features, alternate_sign=False, norm="l2")
    ref = hv.transform(PROMPTS)
    ref.sum_duplicates()
    got = hashed_matrix(PROMPTS, n_features)
    assert np.array_equal(got.indptr, ref.indptr)
    assert np.array_equal(got.indices, ref.indices)
    assert np.array_equal(got.data, ref.data)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.text(max_size=60), min_size=1, max_size=5))
def test_hashing_equals_sklearn_on_arbitrary_text(texts):
    hv = HashingVectorizer(analyzer=ngrams, n_features=64, alternate_sign=False, norm="l2")
    ref = hv.transform(texts).toarray()
    assert np.array_equal(hashed_matrix(texts, 64).toarray(), ref)


def test_murmur_index_matches_sklearn_single():
    hv = HashingVectorizer(analyzer=lambda s: [s], n_features=1000, alternate_sign=False, norm=None)
    for gram in ["what", "00 +", "é", "\\times"]:
        assert hv.transform([gram]).indices[0] == murmur_index(gram, 1000)


def test_svd_block_is_projection_of_hashed_counts():
    f = PromptFeatures(n_components=3, n_features=256).fit(PROMPTS)
    X = f.transform(PROMPTS)
    assert X.shape == (len(PROMPTS), len(HAND_FEATURES) + 3) and f.n_components_ == 3
    ref = hashed_matrix(PROMPTS, 256).toarray() @ f.components_.T
    np.testing.assert_allclose(X[:, len(HAND_FEATURES):], ref, atol=1e-12)
    assert f.feature_names_[-1] == "svd_2"


def test_transform_is_pure_and_batch_independent():
    f = PromptFeatures(n_components=4, n_features=512).fit(PROMPTS)
    batch = f.transform(PROMPTS)
    singles = np.vstack([f.transform([p]) for p in PROMPTS])
    np.testing.assert_allclose(batch, singles, atol=1e-12)
    np.testing.assert_array_equal(f.transform(PROMPTS), batch)
    assert f.transform([]).shape == (0, batch.shape[1])


def test_components_shrink_on_tiny_training_sets():
    f = PromptFeatures(n_components=16).fit(["a b", "c d", "e f"])
    assert f.n_components_ == 2
    g = PromptFeatures(n_components=16).fit(["only one"])
    assert g.n_components_ == 0 and g.transform(["x"]).shape == (1, len(HAND_FEATURES))


def test_save_load_roundtrip(tmp_path):
    f = PromptFeatures(n_components=4, n_features=512, seed=3).fit(PROMPTS)
    f.save(tmp_path)
    g = PromptFeatures.load(tmp_path)
    np.testing.assert_array_equal(g.transform(PROMPTS), f.transform(PROMPTS))
    assert g.config() == f.config()
    assert json.loads((tmp_path / "features.json").read_text())["name"] == "prompt-text"


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda cfg: cfg.update(version=1), "version 1 is not"),
        (lambda cfg: cfg.update(name="other"), "'other'"),
        (lambda cfg: cfg.update(n_components_=7), "shape"),
        (lambda cfg: cfg.update(feature_names=cfg["feature_names"][1:]), "feature names differ"),
    ],
)
def test_load_refuses_other_config(tmp_path, mutate, match):
    PromptFeatures(n_components=4, n_features=512).fit(PROMPTS).save(tmp_path)
    cfg = json.loads((tmp_path / "features.json").read_text())
    mutate(cfg)
    (tmp_path / "features.json").write_text(json.dumps(cfg))
    with pytest.raises(ArtifactError, match=match):
        PromptFeatures.load(tmp_path)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: PromptFeatures().transform(["x"]), "not fitted"),
        (lambda: PromptFeatures().fit("one string"), "not one string"),
        (lambda: PromptFeatures().fit(["ok", 3]), "must be a string"),
        (lambda: PromptFeatures(n_components=-1).fit(["a", "b"]), "n_components"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(InputError, match=match):
        call()


def test_real_math_prompts():
    path = DATA / "qwen_math_cot_100.jsonl"
    if not path.exists():
        pytest.skip("shared data absent")
    prompts = [json.loads(line)["question"] for line in path.read_text().splitlines() if line.strip()]
    f = PromptFeatures().fit(prompts)
    X = f.transform(prompts)
    assert X.shape == (100, len(HAND_FEATURES) + 16) and np.isfinite(X).all()
    assert (X[:, HAND_FEATURES.index("latex_commands")] > 0).mean() > 0.2


def test_expression_features_match_the_arith_task_meta():
    from isocompute.tasks.arith import generate

    for p in generate(300, seed=4):
        operands, carries, digits, _ = expression_features(p.prompt)
        assert (operands, carries) == (p.meta["n_operands"], p.meta["carries"])
        assert digits == len(p.gold.lstrip("-"))
