"""A parallel-stop wave of one prompt, run as one stream: the vote updated at every finish, the wave aborted
when the plan's rule fires.

:func:`stream_prompt` asks the engine for the wave's ``n`` samples through
:func:`isocompute.engines.base.stream_wave` (vllm-http: ONE streamed request with n = the wave, closed on
stop, so vLLM aborts the rest; transformers: one batch, stopped mid-decode; engines without a stream of
their own: the whole batch replayed in length order). At each finish but the wave's last, the sample's
answer is extracted, every answer finished so far (earlier waves' and this wave's, in finish order) is
merged into classes (:class:`~isocompute.app.runner.voting.Voter`) and
:meth:`isocompute.solver.plans.plan.Plan.on_finish` decides: ``"rule"`` stops the wave. The wave's last
finish is not checked here: the round checks it with :meth:`Plan.step`, as it checks a waiting wave.

The samples come back in finish order, the aborted ones after them (``finish_reason == "abort"``, their
partial tokens counted: they are paid for and do not vote). :class:`WaveRecord` is what the response's
``isocompute.wave_runs`` shows of each wave, and what the wave metrics read
(:meth:`isocompute.app.accounting.metrics.Metrics.observe_wave`): its wall-clock seconds (from when its
request was sent to when it ended), the seconds to its first streamed token (None for a wave not streamed
— a waiting wave, a replayed one), its longest sample's completion tokens (the length that sets its decode
time) and the tokens its stop saved where known (:class:`~isocompute.engines.base.WaveStream`).

Confidence: when the plan's rule reads it (``needs_confidence``: an evidence rule whose heads were trained
with confidence, :class:`~isocompute.policy.evidence.rule.EvidenceRule`), the stream is asked for the top
:data:`CONFIDENCE_TOP_K` logprobs of every token (``stream_wave(…, logprobs=5)``) and the evidence gets
``confidence``: each finished sample's ``confidence_min_window`` (None where it has none), aligned with
``lengths`` — earlier waves' from :meth:`~isocompute.app.runner.plan_run.PlanRun.spent`. Those tokens cost
more: the server decodes :data:`isocompute.flops.logprobs.LOGPROB_COST_FACTOR` (1.07) times slower with
them, so the wave's :class:`WaveRecord` says ``logprobs`` and the ledger prices its tokens at that factor
(:class:`~isocompute.app.accounting.ledger.Ledger`).

Worked example: ``first:m=2@8s`` — samples finish at 7 and 9 tokens; at the second finish the rule fires,
the six others are aborted at about 9 tokens each: started 8, finished 2, aborted 6, tokens ≈ 7 + 9 + 6·9.

Ignores: checking a waiting wave's rule before it completes (the plan says to wait).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from isocompute.app.runner.voting import Voter
from isocompute.engines.base import Completion, Engine, stream_wave
from isocompute.solver.plans.plan import Plan, PlanStep
from isocompute.tasks.answers.equivalence import Votes

__all__ = ["CONFIDENCE_TOP_K", "FAILED_REASONS", "StreamOutcome", "WaveRecord", "stream_prompt"]

FAILED_REASONS = frozenset({"error", "abort"})
CONFIDENCE_TOP_K = 5  # the top logprobs a confidence-reading rule's stream asks (DeepConf's k; the tables')


@dataclass(frozen=True, slots=True)
class WaveRecord:
    """One wave as it ran: its mode, samples started, finished (came back complete), aborted, their
    completion tokens (aborted partials included) and why it ended (``rule``: stopped mid-wave;
    ``finished``: every sample ended); its timing and longest sample; ``logprobs``: the top logprobs its
    request asked per token (None: none; its tokens are then priced at the logprob factor, module docstring)."""

    mode: str
    started: int
    finished: int
    aborted: int
    tokens: int
    ended: str
    longest: int = 0
    seconds: float | None = None
    first_token_s: float | None = None
    saved_tokens: int | None = None
    logprobs: int | None = None

    @classmethod
    def of(cls, mode: str, started: int, comps: list[Completion], *, stopped: bool, seconds: float | None = None,
           first_token_s: float | None = None, saved_tokens: int | None = None,
           logprobs: int | None = None) -> WaveRecord:
        aborted = sum(c.finish_reason == "abort" for c in comps)
        return cls(mode, started, len(comps) - aborted, aborted, sum(c.completion_tokens for c in comps),
                   "rule" if stopped else "finished", max((c.completion_tokens for c in comps), default=0),
                   seconds, first_token_s, saved_tokens, logprobs)


@dataclass(frozen=True, slots=True)
class StreamOutcome:
    """A streamed wave: its samples in finish order, the aborted after them; the step that stopped it
    mid-wave and the vote then (None when it ran to its end); its seconds, first-token seconds, saved
    tokens and the logprobs it asked (:class:`WaveRecord`)."""

    completions: list[Completion]
    step: PlanStep | None
    votes: Votes | None
    seconds: float | None = None
    first_token_s: float | None = None
    saved_tokens: int | None = None
    logprobs: int | None = None


def _evidence(spent: dict | None, lengths: list[int], n: int, before: int,
              confidence: list[float | None] | None = None) -> dict | None:
    """The evidence at a finish of this wave: every running sample has generated the last finisher's
    tokens (lock-step decoding), so tokens = earlier waves' + this wave's finished + running × that;
    ``confidence`` (aligned with ``lengths``) where the rule reads it."""
    if spent is None:
        return None
    here = lengths[before:]
    running = n - len(here)
    out = {"lengths": lengths, "running": running, "wave": spent["wave"],
           "tokens": spent["tokens"] + sum(here) + running * here[-1], "latency": spent["latency"] + here[-1]}
    return out if confidence is None else {**out, "confidence": confidence}


async def stream_prompt(engine: Engine, prompt: str, n: int, plan: Plan, earlier: list[str | None], *,
                        voter: Voter, extract: Callable[[str], str | None], max_tokens: int, temperature: float,
                        seed: int | None, deadline_at: float, spent: dict | None = None,
                        logprobs: int | None = None) -> StreamOutcome:
    """Run one prompt's parallel-stop wave of ``n`` (module docstring); ``earlier``: its answers so far;
    ``spent``: for a rule that reads evidence, what the earlier waves drew (:meth:`PlanRun.spent`);
    ``logprobs``: asked of the stream anyway (a confidence-weighted vote reads them)."""
    answers = list(earlier)
    stop: dict[str, object] = {}
    lengths = list(spent["lengths"]) if spent else []
    asks = spent is not None and bool(getattr(plan.rule, "needs_confidence", False))
    logprobs = CONFIDENCE_TOP_K if asks else logprobs
    confidence = list(spent.get("confidence") or [None] * len(lengths)) if spent and asks else None

    async def on_finish(j: int, c: Completion) -> bool:
        answers.append(None if c.finish_reason in FAILED_REASONS else extract(c.text))
        lengths.append(c.completion_tokens)
        if confidence is not None:
            confidence.append(c.confidence_min_window)
        if len(answers) >= len(earlier) + n:
            return False  # the wave's last finish: the round's Plan.step checks it
        [votes] = await voter.classes([answers], deadline_at)
        step = plan.on_finish(votes.classes, running=True,
                              evidence=_evidence(spent, lengths, n, len(earlier), confidence))
        if step.stop:
            stop.update(step=step, votes=votes)
        return step.stop

    t0 = time.perf_counter()
    ws = await stream_wave(engine, prompt, n, max_tokens, temperature, seed, on_finish, logprobs=logprobs)
    seconds = time.perf_counter() - t0
    done = set(ws.finish_order)
    order = ws.finish_order + [j for j in range(len(ws.completions)) if j not in done]
    return StreamOutcome([ws.completions[j] for j in order], stop.get("step"), stop.get("votes"),  # type: ignore[arg-type]
                         seconds, ws.first_token_s, ws.saved_tokens, logprobs)
