"""The tiny model and its offline tokenizer: round-trips, chat template, save/load with Auto classes."""

from __future__ import annotations

import json

import pytest

from isocompute.errors import InputError
from isocompute.tasks import arith
from isocompute.training import tiny


@pytest.fixture(scope="module")
def tok():
    return tiny.build_tokenizer()


def test_vocabulary_layout_is_fixed():
    v = tiny.vocabulary()
    assert (v["<pad>"], v["<s>"], v["<|end|>"], v["<unk>"]) == (0, 1, 2, 3)
    assert len(v) == len(set(v.values())) == len(tiny.SPECIAL_TOKENS) + len(tiny.CHARACTERS)
    assert all(c in v for c in "0123456789+-*=. ?\nWhatisTheanswer×")


def test_every_character_of_problems_and_solutions_round_trips(tok):
    problems = arith.generate(300, seed=0)
    texts = [p.prompt for p in problems] + [arith.solution_for(p) for p in problems] + ["".join(tiny.CHARACTERS)]
    for text in texts:
        ids = tok(text)["input_ids"]
        assert ids[0] == tok.bos_token_id
        assert len(ids) == len(text) + 1  # one token per character
        assert tok.unk_token_id not in ids
        assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok("7+5")["input_ids"] == [1, 14, 79, 12]  # hand-worked: <s> '7' '+' '5'


def test_unknown_characters_become_unk(tok):
    ids = tok("2€3", add_special_tokens=False)["input_ids"]
    assert ids == [tiny.vocabulary()["2"], tok.unk_token_id, tiny.vocabulary()["3"]]


def test_chat_template_renders_and_tokenizes(tok):
    messages = [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "The answer is 5."}]
    text = tok.apply_chat_template(messages, tokenize=False)
    assert text == "<s><|user|>What is 2 + 3?<|end|><|assistant|>The answer is 5.<|end|>"
    prompt = tok.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True)
    assert prompt == "<s><|user|>What is 2 + 3?<|end|><|assistant|>"
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    v = tiny.vocabulary()
    assert ids[:2] == [v["<s>"], v["<|user|>"]] and ids[-2:] == [v["<|end|>"], v["<|assistant|>"]]
    assert len(ids) == 2 + len("What is 2 + 3?") + 2  # role markers are single tokens


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"hidden_size": 64, "num_heads": 4, "head_dim": 16}, "not supported by vLLM's CPU attention"),
        ({"hidden_size": 96, "num_heads": 4, "head_dim": 24}, "not supported by vLLM's CPU attention"),
        ({"hidden_size": 128, "num_heads": 2, "head_dim": 32}, "must equal hidden_size"),
    ],
)
def test_config_errors(kwargs, match):
    with pytest.raises(InputError, match=match):
        tiny.tiny_config(**kwargs)


def test_default_config_meets_vllm_cpu_constraint():
    cfg = tiny.tiny_config()
    assert cfg.head_dim in tiny.VLLM_CPU_HEAD_DIMS and cfg.head_dim >= 32
    assert cfg.num_attention_heads * cfg.head_dim == cfg.hidden_size
    assert cfg.vocab_size == len(tiny.vocabulary())


@pytest.mark.slow
def test_save_load_with_auto_classes(tmp_path, tok):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = tiny.build_model(tiny.tiny_config(num_layers=1), seed=3)
    tiny.save_tiny(tmp_path, model, tok)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ltok = AutoTokenizer.from_pretrained(tmp_path)
    text = "What is 47 + 385 - 12?"
    assert ltok(text)["input_ids"] == tok(text)["input_ids"]
    assert ltok.chat_template == tiny.CHAT_TEMPLATE
    assert ltok.eos_token == "<|end|>" and ltok.padding_side == "left"
    ids = torch.tensor([tok(text)["input_ids"]])
    with torch.no_grad():
        assert torch.allclose(model.eval()(ids).logits, loaded(ids).logits, atol=1e-6)
    assert loaded.generation_config.eos_token_id == tok.eos_token_id == 2
    # files an older transformers (inside vLLM) reads
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast" and cfg["chat_template"] == tiny.CHAT_TEMPLATE
    assert json.loads((tmp_path / "config.json").read_text())["torch_dtype"] == "float32"
    assert (tmp_path / "model.safetensors").is_file()
    # batched generation with left padding stops at the eos id or the length limit
    enc = ltok(["What is 1 + 2?", "Hi"], return_tensors="pt", padding=True)
    out = loaded.generate(**enc, max_new_tokens=4, do_sample=False)
    assert out.shape[0] == 2 and enc["input_ids"].shape[1] < out.shape[1] <= enc["input_ids"].shape[1] + 4
    assert (out[:, : enc["input_ids"].shape[1]] == enc["input_ids"]).all()


def test_random_model_is_seeded():
    a = tiny.build_model(tiny.tiny_config(num_layers=1), seed=5)
    b = tiny.build_model(tiny.tiny_config(num_layers=1), seed=5)
    c = tiny.build_model(tiny.tiny_config(num_layers=1), seed=6)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all((sa[k] == sb[k]).all() for k in sa)
    assert any((sa[k] != sc[k]).any() for k in sa)
