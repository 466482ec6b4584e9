"""ModelFlops from config dicts and files: published parameter counts, LoRA counts, errors."""

from __future__ import annotations

import json

import pytest

from isocompute.errors import InputError
from isocompute.flops import ModelFlops, load_model_flops

QWEN25_05B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896,
              "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
              "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True}
QWEN25_15B = {**QWEN25_05B, "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
              "num_attention_heads": 12}
LLAMA2_7B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
             "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
             "num_key_value_heads": 32, "vocab_size": 32000, "tie_word_embeddings": False}


@pytest.mark.parametrize(
    ("config", "n_params"),
    [(QWEN25_05B, 494_032_768), (QWEN25_15B, 1_543_714_304), (LLAMA2_7B, 6_738_415_616)],
    ids=["qwen2.5-0.5b", "qwen2.5-1.5b", "llama-2-7b"],
)
def test_published_parameter_counts(config, n_params):
    assert load_model_flops(config).n_params == n_params


def test_qwen25_05b_hand_count():
    mf = load_model_flops(QWEN25_05B)
    assert mf.body_params == 24 * (896 * 896 + 2 * 896 * 128 + 896 * 896 + 3 * 896 * 4864) == 357_826_560
    assert mf.head_params == 896 * 151936  # lm_head counts as a matmul although it is tied
    assert mf.d_attn == 896 and mf.n_layers == 24
    assert mf.lora_params(8) == 24 * 183_296 == 4_399_104
    assert mf.lora_params(8, ("q_proj", "v_proj")) == 24 * 8 * ((896 + 896) + (896 + 128))


def test_untying_adds_the_head_to_n_params_only():
    tied, untied = load_model_flops(QWEN25_05B), load_model_flops({**QWEN25_05B, "tie_word_embeddings": False})
    assert untied.n_params - tied.n_params == 896 * 151936
    assert untied.matmul_params == tied.matmul_params


def test_family_defaults_and_gqa_head_dim():
    # a hand-written config without num_key_value_heads / head_dim / tie flag gets the family defaults
    mf = load_model_flops({"model_type": "llama", "hidden_size": 64, "intermediate_size": 96,
                           "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 10})
    assert mf.body_params == 4 * 64 * 64 + 3 * 64 * 96 and mf.head_params == 640
    assert mf.n_params == mf.body_params + 2 * 64 + 64 + 2 * 640  # norms, final norm, untied
    gqa = load_model_flops({"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 96,
                            "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 1,
                            "head_dim": 32, "vocab_size": 10})
    assert gqa.d_attn == 128  # head_dim from the config, not 64 / 4
    assert gqa.body_params == 64 * 128 + 2 * 64 * 32 + 128 * 64 + 3 * 64 * 96


def test_text_config_of_a_multimodal_config():
    assert load_model_flops({"model_type": "x_vl", "text_config": QWEN25_05B}) == load_model_flops(QWEN25_05B)


def test_process_reward_model_head():
    prm = {**QWEN25_05B, "architectures": ["Qwen2ForProcessRewardModel"]}
    mf = load_model_flops(prm)
    assert mf.head_params == 896 * 896 + 896 * 2
    lm = load_model_flops(QWEN25_05B)
    assert mf.n_params == lm.n_params + 896 * 896 + 896 * 2 + 896 + 2  # tied lm_head gone, MLP head added


def test_explicit_counts():
    mf = ModelFlops.from_params(1_500_000_000)
    assert (mf.matmul_params, mf.n_layers, mf.d_attn, mf.n_params) == (1_500_000_000, 0, 0, 1_500_000_000)
    assert load_model_flops(mf) is mf


def test_config_file_and_directory(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN25_05B))
    assert load_model_flops(tmp_path) == load_model_flops(tmp_path / "config.json")
    assert load_model_flops(str(tmp_path)).name == tmp_path.name


def _write(tmp_path, text):
    p = tmp_path / "config.json"
    p.write_text(text)
    return p


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda d: d / "nope" / "config.json", "cannot read model config"),
        (lambda d: d / "empty_dir", "cannot read model config"),
        (lambda d: _write(d, "{not json"), "not valid JSON"),
        (lambda d: _write(d, "[1, 2]"), "JSON list, not an object"),
        (lambda d: {**QWEN25_05B, "model_type": "mamba"}, "unsupported model_type 'mamba'.*from_params"),
        (lambda d: {**QWEN25_05B, "num_experts": 8}, "unsupported mixture-of-experts"),
        (lambda d: {"model_type": "llama", "hidden_size": 8}, r"lacks \['num_hidden_layers'"),
        (lambda d: 42, "cannot build model FLOPs from a int"),
        (lambda d: ModelFlops.from_params(-1), "n_params > 0"),
        (lambda d: ModelFlops.from_params(10, head_params=11), "head_params <= n_params"),
        (lambda d: ModelFlops.from_params(10).lora_params(8), "need the layer shapes"),
        (lambda d: load_model_flops(QWEN25_05B).lora_params(0), "positive integer"),
        (lambda d: load_model_flops(QWEN25_05B).lora_params(8, ("q", "w_in")), r"unknown LoRA target\(s\) \['w_in'\]"),
    ],
)
def test_errors(tmp_path, make, match):
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(InputError, match=match):
        load_model_flops(make(tmp_path))
