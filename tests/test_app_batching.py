"""Request batching: the worked example with a recording fake, then the real tiny transformers engine."""

from __future__ import annotations

import asyncio

import pytest

from isocompute.app.runner.batching import BatchingEngine
from isocompute.engines.base import Completion
from isocompute.errors import EngineUnavailable


class SlowEcho:
    """Answers each prompt with its own text n times, after a short sleep; records every call."""

    name = "transformers"

    def __init__(self, fail: bool = False):
        self.calls: list[tuple[list[str], int]] = []
        self.fail = fail

    async def generate(self, prompts, n, max_tokens, temperature, seed=None):
        self.calls.append((list(prompts), n))
        await asyncio.sleep(0.05)
        if self.fail:
            raise EngineUnavailable("model gone")
        return [[Completion(p, 1, 1) for _ in range(n)] for p in prompts]

    async def aclose(self):
        pass


def test_worked_example_merges_by_key_oldest_first():
    inner = SlowEcho()
    eng = BatchingEngine(inner, max_rows=64)

    async def go():
        first = asyncio.create_task(eng.generate(["x"], 1, 8, 0.7))  # runs alone: the engine was idle
        await asyncio.sleep(0.01)
        a = asyncio.create_task(eng.generate(["a"], 4, 8, 0.7))
        b = asyncio.create_task(eng.generate(["b1", "b2"], 4, 8, 0.7))
        c = asyncio.create_task(eng.generate(["c"], 2, 8, 0.7))
        seeded = asyncio.create_task(eng.generate(["s"], 4, 8, 0.7, seed=1))
        return await asyncio.gather(first, a, b, c, seeded)

    first, a, b, c, seeded = asyncio.run(go())
    assert sorted(inner.calls) == sorted([(["x"], 1), (["s"], 4), (["a", "b1", "b2"], 4), (["c"], 2)])
    assert [x.text for x in a[0]] == ["a"] * 4 and [[x.text for x in r] for r in b] == [["b1"] * 4, ["b2"] * 4]
    assert [x.text for x in c[0]] == ["c"] * 2 and eng.calls == 4


def test_max_rows_splits_the_queue():
    inner = SlowEcho()
    eng = BatchingEngine(inner, max_rows=8)

    async def go():
        await asyncio.gather(*(eng.generate([f"p{i}"], 4, 8, 0.7) for i in range(5)))

    asyncio.run(go())
    # All five are queued before the worker first runs: 4 + 4, 4 + 4, then the last one.
    assert [len(p) * n for p, n in inner.calls] == [8, 8, 4]


def test_errors_reach_every_merged_request():
    eng = BatchingEngine(SlowEcho(fail=True))

    async def go():
        return await asyncio.gather(*(eng.generate([f"p{i}"], 2, 8, 0.7) for i in range(3)),
                                    return_exceptions=True)

    assert all(isinstance(r, EngineUnavailable) for r in asyncio.run(go()))


@pytest.mark.slow
def test_real_tiny_engine_answers_each_request_with_its_own_rows(tmp_path):
    from isocompute.engines.transformers_engine import TransformersEngine
    from isocompute.training.tiny import save_tiny

    inner = TransformersEngine(save_tiny(tmp_path / "m", seed=0))
    eng = BatchingEngine(inner)
    prompts = [f"What is {i} + {i}?\n" for i in range(12)]

    async def go():
        return await asyncio.gather(*(eng.generate([p], 3, 5, 0.0) for p in prompts))

    out = asyncio.run(go())
    assert eng.calls < len(prompts)
    # Greedy decoding: each request's rows equal what the engine gives that prompt alone.
    alone = inner.generate_sync(prompts[:3], 1, 5, 0.0)
    for i in range(3):
        assert len(out[i]) == 1 and len(out[i][0]) == 3
        assert {c.text for c in out[i][0]} == {alone[i][0].text}
        assert out[i][0][0].prompt_tokens == alone[i][0].prompt_tokens


def test_oldest_request_first_across_keys():
    """a1, c, a2 queue behind a running call with room for one request per call: c (a different key)
    goes before a2 although a's key was queued first — a busy key cannot starve the others."""
    inner = SlowEcho()
    eng = BatchingEngine(inner, max_rows=4)

    async def go():
        busy = asyncio.create_task(eng.generate(["x"], 4, 8, 0.7))
        await asyncio.sleep(0.01)
        tasks = [asyncio.create_task(eng.generate(p, n, 8, 0.7)) for p, n in ((["a1"], 4), (["c"], 2), (["a2"], 4))]
        await asyncio.gather(busy, *tasks)

    asyncio.run(go())
    assert inner.calls == [(["x"], 4), (["a1"], 4), (["c"], 2), (["a2"], 4)]
