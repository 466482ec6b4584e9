"""The transformers engine on the real tiny model (random weights), the engine registry and helpers."""

from __future__ import annotations

import asyncio
import json
import shutil
import threading

import pytest

from isocompute.engines.base import Completion, Engine
from isocompute.engines.registry import ENGINE_NAMES, make_engine
from isocompute.engines.transformers_engine import (
    TransformersEngine,
    apply_chat_template,
    count_completion,
)
from isocompute.errors import EngineUnavailable, InputError

PROMPTS = ["What is 12 + 30?", "What is 7 * 6?", "1+1="]


def greedy_reference(model, tokenizer, prompt: str, eos: set[int], max_tokens: int) -> list[int]:
    """Independent greedy decoding: full forward pass per step, no KV cache, no generate()."""
    import torch

    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    out: list[int] = []
    with torch.inference_mode():
        for _ in range(max_tokens):
            nxt = int(model(ids).logits[0, -1].argmax())
            out.append(nxt)
            if nxt in eos:
                break
            ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    return out


# ------------------------------------------------------------------------------------ count_completion


@pytest.mark.parametrize(
    ("ids", "max_tokens", "expected"),
    [
        ([17, 5, 2, 0, 0], 5, (3, "stop")),  # eos counted, padding after it not
        ([2, 0, 0], 3, (1, "stop")),  # immediate eos: one token
        ([17, 5, 9], 3, (3, "length")),
        ([17, 2, 2], 3, (2, "stop")),  # first eos wins (pad id may equal eos id)
        ([17, 9], 5, (2, "stop")),  # cannot happen with generate(); counted as what was produced
    ],
)
def test_count_completion_hand_cases(ids, max_tokens, expected):
    assert count_completion(ids, {2}, max_tokens) == expected


def test_count_completion_multiple_eos_ids():
    assert count_completion([4, 7, 9, 3], {9, 3}, 10) == (3, "stop")


# ------------------------------------------------------------------------------------ engine


def test_protocol_shape_and_counts(engine, tiny_dir):
    assert isinstance(engine, Engine)
    out = asyncio.run(engine.generate(PROMPTS, n=3, max_tokens=12, temperature=1.0, seed=0))
    assert [len(o) for o in out] == [3, 3, 3]
    tok = engine.tokenizer
    for prompt, comps in zip(PROMPTS, out, strict=True):
        expected_prompt = len(tok(prompt)["input_ids"])  # <s> + one token per character
        assert expected_prompt == len(prompt) + 1
        for c in comps:
            assert isinstance(c, Completion)
            assert c.prompt_tokens == expected_prompt
            assert 1 <= c.completion_tokens <= 12
            assert c.finish_reason in ("stop", "length")
            if c.finish_reason == "length":
                assert c.completion_tokens == 12


def test_greedy_matches_independent_decoder_and_stops_at_eos(tiny_dir, tmp_path):
    """Hand-built case: make the 3rd greedy token the EOS, so greedy output must stop right there."""
    from isocompute.training.tiny import load_tiny

    model, tok = load_tiny(tiny_dir)
    prompt = PROMPTS[0]
    free = greedy_reference(model, tok, prompt, eos=set(), max_tokens=6)
    # the first position at which a token not seen before appears, at least 2 tokens in
    cut = next((i for i in range(2, 6) if free[i] not in free[:i]), 0)
    eos_dir = tmp_path / "eos"
    shutil.copytree(tiny_dir, eos_dir)
    gen = json.loads((eos_dir / "generation_config.json").read_text())
    gen["eos_token_id"] = free[cut]
    (eos_dir / "generation_config.json").write_text(json.dumps(gen))

    eng = TransformersEngine(eos_dir, threads=1)
    [[c1, c2]] = eng.generate_sync([prompt], n=2, max_tokens=6, temperature=0.0)
    assert c1 == c2  # greedy: all n samples agree
    assert c1.completion_tokens == cut + 1 and c1.finish_reason == "stop"
    assert c1.text == tok.decode(free[:cut], skip_special_tokens=True)
    # and without the forced EOS, the engine's greedy text equals the reference decoder's
    [[g]] = TransformersEngine(tiny_dir, threads=1).generate_sync([prompt], 1, 6, 0.0)
    assert g.completion_tokens == 6 and g.finish_reason == "length"
    assert g.text == tok.decode(free, skip_special_tokens=True)


def test_seeded_calls_reproduce_and_seeds_differ(engine):
    a = engine.generate_sync(PROMPTS, 4, 10, 1.0, seed=123)
    b = engine.generate_sync(PROMPTS, 4, 10, 1.0, seed=123)
    c = engine.generate_sync(PROMPTS, 4, 10, 1.0, seed=124)
    assert a == b
    assert a != c
    # samples of one prompt are not copies of each other
    assert len({x.text for x in a[0]}) > 1


def test_seed_leaves_global_rng_alone(engine):
    import torch

    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    engine.generate_sync(PROMPTS[:1], 2, 4, 1.0, seed=99)
    assert torch.equal(torch.rand(3), expected)


def test_micro_batching_does_not_change_greedy_results(tiny_dir, engine):
    small = TransformersEngine(tiny_dir, micro_batch=2, threads=1)
    assert small.generate_sync(PROMPTS, 3, 8, 0.0) == engine.generate_sync(PROMPTS, 3, 8, 0.0)


def test_concurrent_calls_serialise_and_match_sequential(engine):
    async def both():
        return await asyncio.gather(
            engine.generate(PROMPTS[:2], 2, 8, 1.0, seed=5),
            engine.generate(PROMPTS[2:], 3, 8, 1.0, seed=6),
        )

    x, y = asyncio.run(both())
    assert x == engine.generate_sync(PROMPTS[:2], 2, 8, 1.0, seed=5)
    assert y == engine.generate_sync(PROMPTS[2:], 3, 8, 1.0, seed=6)


def test_other_threads_using_the_tokenizer_cannot_break_a_padded_batch(engine):
    """Regression: a fast tokenizer's padding is mutable state reset by every call. `sample` renders chat
    templates (and the gateway counts prompt tokens) with `engine.tokenizer` on the event loop while a
    generation encodes a padded batch in a worker thread; that once failed a demo mid-run with "Unable
    to create tensor ... padding=True". The engine now encodes with a private copy."""
    prompts = ["1+1=", "What is 12 + 345 - 6?", "7", "A much longer prompt with many characters in it: 98 * 7"]
    stop = threading.Event()

    def hammer():
        while not stop.is_set():
            engine.tokenizer("x")  # no padding: switches the shared tokenizer's padding off

    t = threading.Thread(target=hammer)
    t.start()
    try:
        for _ in range(30):
            out = engine.generate_sync(prompts, 2, 2, 1.0, seed=1)
            assert [len(c) for c in out] == [2] * len(prompts)
    finally:
        stop.set()
        t.join()


def test_empty_prompt_list(engine):
    assert asyncio.run(engine.generate([], 4, 8, 1.0)) == []


def test_chat_template_single_bos(engine):
    text = apply_chat_template(engine.tokenizer, "What is 2 + 3?")
    assert text == "<|user|>What is 2 + 3?<|end|><|assistant|>"
    ids = engine.tokenizer(text)["input_ids"]
    assert ids[0] == engine.tokenizer.bos_token_id and ids[1] != engine.tokenizer.bos_token_id


def test_model_config(engine):
    cfg = engine.model_config()
    assert cfg["head_dim"] == 32 and cfg["num_hidden_layers"] == 4


# ------------------------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"n": 0}, InputError, "n >= 1"),
        ({"max_tokens": 0}, InputError, "max_tokens >= 1"),
        ({"temperature": -0.5}, InputError, "temperature >= 0"),
    ],
)
def test_generate_rejects_bad_arguments(engine, kwargs, exc, match):
    args = {"prompts": PROMPTS, "n": 2, "max_tokens": 4, "temperature": 1.0} | kwargs
    with pytest.raises(exc, match=match):
        asyncio.run(engine.generate(**args))


@pytest.mark.parametrize(
    ("call", "exc", "match"),
    [
        (lambda d: TransformersEngine(d / "nowhere"), EngineUnavailable, "config.json missing"),
        (lambda d: TransformersEngine(d, micro_batch=0), InputError, "micro_batch must be >= 1"),
        (lambda d: TransformersEngine(d, threads=0), InputError, "threads must be >= 1"),
        (lambda d: TransformersEngine(d, dtype="float7"), InputError, "unknown dtype"),
        (lambda d: make_engine("sglang"), InputError, "unknown engine 'sglang'"),
        (lambda d: make_engine("transformers"), InputError, "needs --model DIR"),
        (lambda d: make_engine("vllm-http"), InputError, "needs --upstream URL"),
        (lambda d: make_engine("vllm"), InputError, "needs --model DIR"),
        (lambda d: make_engine("vllm-http", upstreams=["localhost:8000"]), InputError, "not an http"),
    ],
)
def test_construction_errors(tiny_dir, call, exc, match):
    with pytest.raises(exc, match=match):
        call(tiny_dir)


def test_chat_template_missing_says_how_to_fix(engine):
    class NoTemplate:
        chat_template = None
        name_or_path = "x"

    with pytest.raises(InputError, match="send plain prompts"):
        apply_chat_template(NoTemplate(), "hi")


def test_vllm_engine_without_vllm_says_how_to_get_it(tiny_dir):
    try:
        import vllm  # noqa: F401
    except ImportError:
        with pytest.raises(EngineUnavailable, match="make vllm-env"):
            make_engine("vllm", model=tiny_dir)
    else:
        pytest.skip("vllm is importable here; the in-process engine is exercised in test_vllm_server.py")


def test_registry_names_and_builds(tiny_dir):
    assert ENGINE_NAMES == ("transformers", "vllm-http", "vllm")
    assert make_engine("transformers", model=tiny_dir, threads=1).name == "transformers"
    eng = make_engine("vllm-http", upstreams=["http://127.0.0.1:1/v1/"])
    assert eng.name == "vllm-http" and eng.upstreams[0].url == "http://127.0.0.1:1"
