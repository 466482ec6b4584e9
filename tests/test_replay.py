"""``isocompute replay`` (the simulated upstream) through the gateway's own vLLM engine: recorded answers and
lengths come back as the engine reads them, streams finish in length order and stop when closed, usage and
metrics count what was decoded, every fault mode does what it says. The servers run in the test's event
loop at fast modelled rates; no assertion bounds wall-clock time except where a fault's stall is the point
(and then only from below)."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import pytest

from isocompute.engines.vllm_http import VLLMHTTPEngine
from isocompute.engines.vllm_server import free_port
from isocompute.errors import EngineUnavailable, InputError
from isocompute.replay.faults import Faults, parse_header
from isocompute.replay.server import ReplayServer
from isocompute.replay.table import answer_text, load_tables
from isocompute.replay.timing import Scheduler, TimingModel
from isocompute.tasks.answers.extract import extract_answer

PROMPT = "What is 2 + 3?"
ROWS = [
    {"id": "p0", "prompt": PROMPT, "gold": "5", "prompt_tokens": 7, "meta": {"task": "gsm8k", "model": "m"},
     "samples": [{"answer": "5", "correct": True, "completion_tokens": 30, "logprob_mean": -0.3,
                  "confidence_min_window": 2.5},
                 {"answer": "6", "correct": False, "completion_tokens": 10, "logprob_mean": -0.9,
                  "confidence_min_window": 1.5},
                 {"answer": None, "correct": False, "completion_tokens": 50, "logprob_mean": -1.2,
                  "confidence_min_window": 1.0},
                 {"answer": "5", "correct": True, "completion_tokens": 20, "logprob_mean": -0.4,
                  "confidence_min_window": 2.2}]},
    {"id": "p1", "prompt": "Yesterday was May 1, 2021. Today?", "meta": {"task": "date"},
     "samples": [{"answer": "May 2, 2021", "completion_tokens": 3}]},
]
FAST = TimingModel(decode_tps=20000.0, max_tps=1e6, stream_interval=4)


@pytest.fixture
def table(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return load_tables([path])


def run(table, body, timing=FAST):
    """``body(server, engine)`` with a replay server on ``table`` and the engine over it, in one loop."""
    async def go():
        srv = ReplayServer(table, timing, port=free_port())
        await srv.start()
        eng = VLLMHTTPEngine([f"http://127.0.0.1:{srv.port}"], retries=0, stall_s=None, cooldown=0.05)
        try:
            return await body(srv, eng)
        finally:
            await eng.aclose()
            await srv.stop()
    return asyncio.run(go())


def metric(text, name, label=""):
    m = re.search(rf"^{re.escape(name)}\{{[^}}]*{re.escape(label)}[^}}]*\}} (\S+)$", text, re.M)
    assert m, (name, text)
    return float(m.group(1))


# ---- the table ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("task,answer,fmt", [("gsm8k", "18", "#### 18"), ("math", "\\frac{1}{2}", "\\boxed{"),
                                             ("date", "05/01/2021", "The answer is"), ("date", "May 2, 2021", "\\boxed{")])
def test_each_answer_reads_back_through_the_gateways_extraction(task, answer, fmt):
    text, exact = answer_text(task, answer)
    assert exact and fmt in text and extract_answer(" step on step" + text) == answer


def test_the_filler_reads_as_no_answer():
    from isocompute.replay.table import FILLER, FIRST_FILLER
    assert extract_answer(FIRST_FILLER) is None and extract_answer(FIRST_FILLER + FILLER * 40) is None


@pytest.mark.parametrize("rows,match", [
    ([{"id": "a", "prompt": "x", "samples": [{"answer": "1"}]}], "completion_tokens"),
    ([{"id": "a", "prompt": "x", "samples": [{"answer": "1", "completion_tokens": -1}]}], "completion_tokens"),
    ([{"id": "a", "prompt": "x", "samples": []}], "no samples"),
    ([{"id": "a", "prompt": "x", "samples": [{"completion_tokens": 2}]}] * 2, "already served"),
    ([{"prompt": "x"}], "not an outcome-table row"),
])
def test_bad_tables_are_refused_with_the_fix(tmp_path, rows, match):
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(InputError, match=match):
        load_tables([path])


def test_a_prompt_is_found_by_text_id_or_inside_a_chat_template(table):
    assert table.find(PROMPT).id == "p0" and table.find("p1").id == "p1"
    assert table.find(f"<|user|>\n{PROMPT}<|end|>\n<|assistant|>").id == "p0" and table.find("nope") is None
    assert table.model == "m"


# ---- streams through the engine ------------------------------------------------------------------------


def test_a_wave_streams_the_recorded_samples_in_length_order(table):
    async def body(srv, eng):
        seen = []

        async def on_finish(j, c):
            seen.append((c.completion_tokens, extract_answer(c.text), c.finish_reason))
            return False
        wave = await eng.stream_wave(PROMPT, 4, 100, 1.0, 7, on_finish)
        return seen, wave, (await httpx.AsyncClient().get(f"http://127.0.0.1:{srv.port}/metrics")).text
    seen, wave, metrics = run(table, body)
    # n = 4 of 4 recorded samples without replacement: each once, finishing shortest first
    assert seen == [(10, "6", "stop"), (20, "5", "stop"), (30, "5", "stop"), (50, None, "stop")]
    assert not wave.stopped and sum(c.completion_tokens for c in wave.completions) == 110
    assert all(c.prompt_tokens == 7 for c in wave.completions)
    assert metric(metrics, "vllm:generation_tokens_total") == 110
    assert metric(metrics, "vllm:request_success_total", 'finished_reason="stop"') == 1
    assert metric(metrics, "vllm:num_requests_running") == 0 and metric(metrics, "vllm:num_requests_waiting") == 0


def test_the_same_seed_draws_the_same_samples_and_max_tokens_cuts_without_an_answer(table):
    async def body(srv, eng):
        a = await eng.generate([PROMPT], 2, 100, 1.0, seed=3)
        b = await eng.generate([PROMPT], 2, 100, 1.0, seed=3)
        cut = await eng.generate([PROMPT], 4, 25, 1.0, seed=3)
        return a, b, cut
    a, b, [cut] = run(table, body)
    assert [c.completion_tokens for c in a[0]] == [c.completion_tokens for c in b[0]]
    by_len = sorted((c.completion_tokens, c.finish_reason, extract_answer(c.text)) for c in cut)
    assert by_len == [(10, "stop", "6"), (20, "stop", "5"), (25, "length", None), (25, "length", None)]


def test_the_waves_of_one_plan_draw_without_replacement_across_waves(table):
    from isocompute.app.runner.plan_run import wave_seed as gateway_wave_seed
    from isocompute.replay.replies import wave_seed

    assert [wave_seed(7, w) for w in (1, 2, 9)] == [gateway_wave_seed(7, w) for w in (1, 2, 9)]

    async def body(srv, eng):
        first = await eng.generate([PROMPT], 2, 100, 1.0, seed=5)
        second = await eng.generate([PROMPT], 2, 100, 1.0, seed=wave_seed(5, 1))
        again = await eng.generate([PROMPT], 2, 100, 1.0, seed=5)  # a new request with that seed: a fresh draw
        return first[0] + second[0], again[0]
    both, again = run(table, body)
    assert sorted(c.completion_tokens for c in both) == [10, 20, 30, 50]  # all four, none twice
    assert [c.completion_tokens for c in again] == [c.completion_tokens for c in both[:2]]


def test_closing_a_stream_stops_its_samples_at_once(table):
    slow = TimingModel(decode_tps=400.0, stream_interval=1)  # the 50-token sample would take 0.125 s

    async def body(srv, eng):
        async def on_finish(j, c):
            return True  # the first finish (10 tokens) decides
        wave = await eng.stream_wave(PROMPT, 4, 100, 1.0, 7, on_finish)
        for _ in range(100):  # the server sees the close as soon as its handler is cancelled
            if srv.sched.running == 0:
                break
            await asyncio.sleep(0.01)
        return wave, srv
    wave, srv = run(table, body, slow)
    assert wave.stopped and [c.finish_reason for c in wave.completions].count("abort") == 3
    assert srv.sched.running == 0 and srv.sched.requests_running == 0
    assert srv.success["abort"] == 1 and srv.generation_tokens < 110


def test_logprobs_carry_the_recorded_confidence(table):
    async def body(srv, eng):
        comps = []

        async def on_finish(j, c):
            comps.append(c)
            return False
        await eng.stream_wave(PROMPT, 4, 100, 1.0, 1, on_finish, logprobs=5)
        [whole] = await eng.generate([PROMPT], 4, 100, 1.0, seed=1, logprobs=5)
        return comps, whole
    streamed, whole = run(table, body)
    for comps in (streamed, whole):
        got = sorted((c.completion_tokens, round(c.logprob_mean, 6), round(c.confidence_min_window, 6)) for c in comps)
        assert got == [(10, -0.9, 1.5), (20, -0.4, 2.2), (30, -0.3, 2.5), (50, -1.2, 1.0)]


def test_an_unknown_prompt_is_a_clear_400_and_the_readiness_check_is_answered(table):
    async def body(srv, eng):
        ready = await eng.wait_ready(timeout=5)
        with pytest.raises(InputError, match="not in the replay's tables"):
            await eng.generate(["an unknown question"], 1, 10, 1.0)
        return ready
    assert len(run(table, body)) == 1


def test_a_recorded_sample_of_zero_tokens_finishes_at_once_with_no_tokens(tmp_path):
    path = tmp_path / "z.jsonl"
    path.write_text(json.dumps({"id": "z", "prompt": PROMPT, "meta": {"task": "gsm8k"}, "samples": [
        {"answer": None, "completion_tokens": 0}, {"answer": "5", "completion_tokens": 6}]}) + "\n")

    async def body(srv, eng):
        seen = []

        async def on_finish(j, c):
            seen.append((c.completion_tokens, extract_answer(c.text)))
            return False
        await eng.stream_wave(PROMPT, 2, 100, 1.0, 0, on_finish)
        return seen
    assert run(load_tables([path]), body) == [(0, None), (6, "5")]


def test_chat_completions_stream_and_answer_whole_in_vllms_shapes(table):
    async def body(srv, eng):
        url = f"http://127.0.0.1:{srv.port}/v1/chat/completions"
        msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}]
        async with httpx.AsyncClient(timeout=10) as c:
            whole = (await c.post(url, json={"messages": msgs, "n": 4, "seed": 1, "max_tokens": 100})).json()
            streamed = (await c.post(url, json={"messages": msgs, "n": 1, "seed": 1, "stream": True,
                                                "stream_options": {"include_usage": True}})).text
        return whole, streamed
    whole, streamed = run(table, body)
    assert whole["object"] == "chat.completion" and whole["usage"]["completion_tokens"] == 110
    assert sorted(extract_answer(ch["message"]["content"]) or "-" for ch in whole["choices"]) == ["-", "5", "5", "6"]
    events = [json.loads(x[6:]) for x in streamed.split("\n\n") if x.startswith("data: {")]
    assert all(e["object"] == "chat.completion.chunk" for e in events) and streamed.endswith("data: [DONE]\n\n")
    assert events[0]["choices"][0]["delta"]["role"] == "assistant" and events[-1]["choices"] == []
    text = "".join(e["choices"][0]["delta"]["content"] for e in events[:-1])
    # no max_tokens on chat: the whole recorded sample, its answer at its end
    tokens = events[-1]["usage"]["completion_tokens"]
    assert {10: "6", 20: "5", 30: "5", 50: None}[tokens] == extract_answer(text)
    assert events[-2]["choices"][0]["finish_reason"] == "stop"
def test_the_timing_model_shares_the_aggregate_rate_and_queues_beyond_max_seqs():
    sched = Scheduler(TimingModel(decode_tps=50.0, max_tps=200.0, max_seqs=8))

    async def go():
        await sched.admit(2)
        r2 = sched.rate()
        await sched.admit(6)
        r8 = sched.rate()
        waiter = asyncio.ensure_future(sched.admit(1))
        await asyncio.sleep(0)
        queued = (sched.requests_waiting, sched.running)
        sched.release(2, request_done=True)
        await waiter
        return r2, r8, queued, sched.running, sched.requests_waiting
    # the module docstring's worked example: 50 tok/s each with 2 running, 200/8 = 25 with 8
    assert asyncio.run(go()) == (50.0, 25.0, (1, 8), 7, 0)


# ---- faults ----------------------------------------------------------------------------------------------


def post_faults(srv, **faults):
    return httpx.post(f"http://127.0.0.1:{srv.port}/admin/faults", json=faults, timeout=5)


def test_fault_status_answers_5xx_then_clears(table):
    async def body(srv, eng):
        async with httpx.AsyncClient() as c:
            r = await c.post(f"http://127.0.0.1:{srv.port}/admin/faults", json={"status": 503, "requests": 1})
            assert r.status_code == 200
            with pytest.raises(EngineUnavailable, match="503"):
                await eng.generate([PROMPT], 1, 100, 1.0)
            [ok] = await eng.generate([PROMPT], 1, 100, 1.0)
            return ok
    assert run(table, body)[0].finish_reason == "stop"


def test_fault_drop_cuts_the_stream_mid_way(table):
    async def body(srv, eng):
        async def on_finish(j, c):
            return False
        async with httpx.AsyncClient() as c:
            await c.post(f"http://127.0.0.1:{srv.port}/admin/faults", json={"drop": True, "after_tokens": 12})
        with pytest.raises(EngineUnavailable):
            await eng.stream_wave(PROMPT, 4, 100, 1.0, 1, on_finish)
        return srv
    srv = run(table, body)
    assert srv.success["abort"] == 1 and srv.sched.running == 0


def test_fault_stall_holds_the_stream_and_a_header_sets_it_for_one_request(table):
    async def body(srv, eng):
        async with httpx.AsyncClient(timeout=10) as c:
            url = f"http://127.0.0.1:{srv.port}/v1/completions"
            req = {"prompt": PROMPT, "n": 1, "max_tokens": 100, "stream": True, "seed": 0}
            t0 = asyncio.get_running_loop().time()
            r = await c.post(url, json=req, headers={"x-replay-fault": "stall_s=0.3,after_tokens=4"})
            stalled = asyncio.get_running_loop().time() - t0
            bad = await c.post(url, json=req, headers={"x-replay-fault": "refuse_s=1"})
            return r, stalled, bad
    r, stalled, bad = run(table, body)
    assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n") and stalled >= 0.3
    assert bad.status_code == 400 and "POST /admin/faults" in bad.json()["error"]["message"]


def test_fault_refuse_stops_listening_then_listens_again(table):
    async def body(srv, eng):
        url = f"http://127.0.0.1:{srv.port}"
        async with httpx.AsyncClient(timeout=5) as c:
            await c.post(f"{url}/admin/faults", json={"refuse_s": 60})
        await asyncio.sleep(0.05)
        async with httpx.AsyncClient(timeout=5) as c:  # a new connection
            with pytest.raises(httpx.ConnectError):
                await c.get(f"{url}/health")
        await srv.clear_faults(None)  # what DELETE /admin/faults does; the refusal ends at once
        async with httpx.AsyncClient(timeout=5) as c:
            return (await c.get(f"{url}/health")).status_code
    assert run(table, body) == 200


def test_fault_slowdown_divides_the_rate(table):
    async def body(srv, eng):
        async with httpx.AsyncClient(timeout=5) as c:
            await c.post(f"http://127.0.0.1:{srv.port}/admin/faults", json={"slowdown": 4})
            slow = srv.sched.rate()
            await c.delete(f"http://127.0.0.1:{srv.port}/admin/faults")
            return slow, srv.sched.rate()
    assert run(table, body) == (FAST.decode_tps / 4, FAST.decode_tps)


@pytest.mark.parametrize("value,match", [("stall_s", "key=value"), ("bogus=1", "unknown fault"),
                                         ("slowdown=2", "whole server"), ("status=200", "HTTP error status")])
def test_bad_fault_headers_say_what_to_send(value, match):
    with pytest.raises(InputError, match=match):
        parse_header(value)


def test_faults_apply_to_the_next_requests_only():
    f = Faults.from_mapping({"status": 500, "requests": 2}, where="t")
    assert [f.take() is not None for _ in range(3)] == [True, True, False]
