"""Analytic FLOPs against torch's FlopCounterMode on tiny real transformers models (eager attention).

FlopCounterMode counts a matmul as 2·m·n·k and ignores elementwise ops, like our analytic count, so
the two agree exactly where the formulas are exact; the acceptance bound is 2%. Marked slow as a
module: importing transformers and building the first model takes several seconds on a small CPU.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

pytestmark = pytest.mark.slow

from isocompute.flops import (  # noqa: E402
    ModelFlops,
    decode_flops,
    forward_flops,
    load_model_flops,
    lora_update_flops,
    prefill_flops,
    train_flops,
)

REL = 0.02
T = 24  # sequence length: long enough that attention is a visible share of the tiny model's FLOPs


def tiny_llama_config(**kw):
    base = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=24, tie_word_embeddings=False,
                attn_implementation="eager")
    return transformers.LlamaConfig(**{**base, **kw})


def build(config):
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def counted(fn) -> int:
    with FlopCounterMode(display=False) as fc:
        fn()
    return fc.get_total_flops()


@pytest.fixture(scope="module")
def llama():
    config = tiny_llama_config()
    return build(config), load_model_flops(config)


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 128, (1, T), generator=torch.Generator().manual_seed(1))


def test_tiny_llama_shape_matches_hand_count(llama):
    model, mf = llama
    # per layer: q 64·96 + k,v 2·64·48 + o 96·64 + gated MLP 3·64·96 = 36,864; lm_head 64·128
    assert (mf.body_params, mf.head_params, mf.d_attn, mf.n_layers) == (73_728, 8_192, 96, 2)
    assert mf.n_params == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("logits", ["all", "last"])
def test_prefill_forward(llama, ids, logits):
    model, mf = llama
    keep = 0 if logits == "all" else 1
    with torch.no_grad():
        got = counted(lambda: model(ids, logits_to_keep=keep))
    assert forward_flops(mf, T, logits=logits) == pytest.approx(got, rel=REL)


def test_full_backward(llama, ids):
    model, mf = llama
    model.zero_grad()

    def step():
        model(ids).logits.float().pow(2).mean().backward()

    assert all(p.requires_grad for p in model.parameters())
    assert train_flops(mf, T) == pytest.approx(counted(step), rel=REL)


class LoRALinear(torch.nn.Module):
    """A frozen nn.Linear plus a trainable low-rank update B·A (what peft's LoRA computes)."""

    def __init__(self, base: torch.nn.Linear, rank: int):
        super().__init__()
        self.base = base
        self.A = torch.nn.Parameter(torch.randn(rank, base.in_features) * 0.02)
        self.B = torch.nn.Parameter(torch.randn(base.out_features, rank) * 0.02)

    def forward(self, x):
        return self.base(x) + torch.nn.functional.linear(torch.nn.functional.linear(x, self.A), self.B)


def lora_model(rank: int, input_grads: bool):
    model = build(tiny_llama_config()).train()
    for p in model.parameters():
        p.requires_grad_(False)
    for layer in model.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name, child in list(parent.named_children()):
                if isinstance(child, torch.nn.Linear):
                    setattr(parent, name, LoRALinear(child, rank))
    if input_grads:
        model.enable_input_require_grads()  # what peft does under gradient checkpointing
    return model


@pytest.mark.parametrize("rank", [2, 8])
def test_lora_backward(ids, rank):
    model = lora_model(rank, input_grads=True)
    mf = load_model_flops(model.config)
    n_lora = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert n_lora == mf.lora_params(rank)
    got = counted(lambda: model(ids).logits.float().pow(2).mean().backward())
    assert lora_update_flops(mf, T, n_lora) == pytest.approx(got, rel=REL)


def test_lora_backward_without_input_grads_skips_only_first_block_qkv(ids):
    # The docstring's bound, checked exactly: with the embedding output not requiring grad, layer 0's
    # frozen Q/K/V matmuls and their adapters' A matrices compute no input gradient.
    rank = 4
    model = lora_model(rank, input_grads=False)
    mf = load_model_flops(model.config)
    n_lora = mf.lora_params(rank)
    got = counted(lambda: model(ids).logits.float().pow(2).mean().backward())
    shapes = {n: (i, o) for n, i, o in mf.layer_linears}
    qkv = sum(shapes[t][0] * shapes[t][1] for t in ("q", "k", "v"))
    skipped = 2 * T * qkv + 3 * 2 * T * rank * 64
    assert lora_update_flops(mf, T, n_lora) - skipped == got


@pytest.mark.parametrize("past", [0, 5, 40])
def test_one_decode_step_with_kv_cache(llama, past):
    model, mf = llama
    with torch.no_grad():
        cache = model(torch.randint(0, 128, (1, past + 1)), use_cache=True).past_key_values
        got = counted(lambda: model(torch.tensor([[3]]), cache=cache, use_cache=True))
    # the cache holds past + 1 tokens; the new token attends to past + 2 keys
    assert forward_flops(mf, 1, past + 1) == pytest.approx(got, rel=REL)


@pytest.mark.parametrize("new_tokens", [1, 2, 7])
def test_generate_is_prefill_plus_closed_form_decode(llama, ids, new_tokens):
    model, mf = llama
    with torch.no_grad():
        got = counted(lambda: model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                             do_sample=False, pad_token_id=0))
    want = prefill_flops(mf, T) + decode_flops(mf, T, new_tokens)
    assert want == pytest.approx(got, rel=REL)


FAMILIES = {
    "qwen2 (qkv bias, GQA)": lambda: transformers.Qwen2Config(
        vocab_size=96, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=True),
    "qwen3 (qk-norm, head_dim != d/heads)": lambda: transformers.Qwen3Config(
        vocab_size=96, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, head_dim=16, tie_word_embeddings=False),
    "llama (biases)": lambda: tiny_llama_config(attention_bias=True, mlp_bias=True, tie_word_embeddings=True),
    "mistral": lambda: transformers.MistralConfig(
        vocab_size=96, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2),
    "gemma (tied, head_dim 32)": lambda: transformers.GemmaConfig(
        vocab_size=96, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32),
    "phi3 (fused qkv)": lambda: transformers.Phi3Config(
        vocab_size=96, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, pad_token_id=0, bos_token_id=1, eos_token_id=2),
    "gpt2 (plain MLP, layernorm, positions)": lambda: transformers.GPT2Config(
        vocab_size=96, n_embd=48, n_layer=2, n_head=4, n_positions=64),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_families_params_and_prefill(family, tmp_path):
    config = FAMILIES[family]()
    config._attn_implementation = "eager"
    model = build(config)
    mf = load_model_flops(config)
    assert mf.n_params == sum(p.numel() for p in model.parameters())
    ids = torch.randint(0, 96, (1, 20))
    with torch.no_grad():
        got = counted(lambda: model(ids))
    assert forward_flops(mf, 20) == pytest.approx(got, rel=REL)
    # the same config through config.json and a model directory gives the same shape
    config.save_pretrained(tmp_path)
    assert load_model_flops(tmp_path) == load_model_flops(tmp_path / "config.json")
    assert load_model_flops(tmp_path).matmul_params == mf.matmul_params
    assert load_model_flops(tmp_path).n_params == mf.n_params


def test_sequence_classification_head_as_reward_model():
    config = transformers.Qwen2Config(vocab_size=96, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, num_labels=1,
                                      pad_token_id=0, architectures=["Qwen2ForSequenceClassification"])
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.Qwen2ForSequenceClassification(config).eval()
    mf = load_model_flops(config)
    assert mf.head_params == 48 * 1
    assert mf.n_params == sum(p.numel() for p in model.parameters())
    with torch.no_grad():
        got = counted(lambda: model(torch.randint(1, 96, (1, 20))))
    assert forward_flops(mf, 20) == pytest.approx(got, rel=REL)


def test_explicit_counts_match_config_when_given_the_same_numbers(llama):
    _, mf = llama
    explicit = ModelFlops.from_params(mf.matmul_params, n_layers=2, d_attn=96, head_params=mf.head_params)
    assert forward_flops(explicit, T) == forward_flops(mf, T)
