"""Running a request's plans upstream: waves of samples, the stopping rule checked between them.

Each prompt of a request has a plan (:class:`isocompute.solver.plans.plan.Plan`: waves w₁ … w_L and a
stopping rule), already cut to the request's caps (``Plan.capped(max_samples=…, max_waves=…)``).
:func:`run_plans` runs the prompts in lock-step rounds. Round r sends every prompt still sampling its
r-th wave (:func:`isocompute.app.runner.execute.run_wave`: one ``generate(n = wave size)`` call per distinct
size, so prompts with the same wave share a call; a *parallel-stop* wave instead streams one request per
prompt, its rule checked at every finish and the rest aborted when it fires —
:mod:`isocompute.app.runner.parallel_wave`), then merges each prompt's answers so far into
classes (:class:`isocompute.app.runner.voting.Voter`) and asks the plan (:meth:`Plan.step` — the very code the
offline plan estimators enumerate) whether to stop. A sample that failed or never came back is drawn
but has no answer (``None``): it is paid for and does not vote, as in the estimators; so is an aborted
sample (its partial tokens are charged). ``PlanRun.wave_runs`` records each wave
(:class:`~isocompute.app.runner.parallel_wave.WaveRecord`: with its seconds, first-token seconds and
longest sample), observed after each round by :meth:`~isocompute.app.accounting.metrics.Metrics.observe_wave`
(labelled by the plan's family, its rule's kind); each prompt's plan latency (from the first wave's send to
the round it stopped in) is observed when it stops (:meth:`~isocompute.app.accounting.metrics.Metrics.observe_plan`).

Why a prompt stops (``PlanRun.stopped``):

==================  ===========================================================================
``rule``            the plan's stopping rule fired on the vote
``plan_end``        the plan has no waves left
``cap``             no waves left of the plan as capped: ``max_samples`` / ``max_waves`` cut it
``deadline``        a later wave ran past the request's deadline (or none was left to start one)
``upstream_error``  a later wave failed upstream (502/503: bad reply, unavailable, circuit open)
==================  ===========================================================================

**A later wave that fails** does not fail the request: the prompt is answered from the waves before it
(its samples were drawn and paid for; the vote over them is the vote of a shorter plan), with
``stopped`` saying why, ``stop_detail`` the error and ``partial`` true. The failed wave is not charged:
the upstream returned no tokens to count. Only a failure of the *first* wave is the request's error
(502/503/504 as in :mod:`isocompute.app.runner.execute`), since there is nothing to answer from.

**Seeds**: wave 0 gets the request's seed (so a one-wave plan samples exactly as before plans), wave
r > 0 ``blake2b(f"{seed}/{r}") mod 2³¹`` — a replay with the same seed draws the same waves, and no two
waves share a random stream; the k-th prompt streaming a parallel-stop wave of n gets that seed + k·n (as
one ``generate`` call seeds its prompts). No seed: every wave is unseeded.

**The deadline** is the request's one :class:`~isocompute.app.runner.execute.Deadline`: every wave and every
merge of answers runs within it; a client that disconnects cancels the task, and with it the wave in
flight and every wave after it.

Worked example: plan ``lead:m=2@1x2,2,4`` on answers a, a → round 0 draws 1 (a), round 1 draws 1 (a):
lead 2, ``stopped = "rule"`` after 2 waves and 2 samples. Capped at ``max_samples = 3`` on a, b, a, …:
waves 1, 1, 1 (the third shrunk to fit), lead 1 after 3 samples → ``stopped = "cap"``.

Ignores: letting a prompt run ahead of the other prompts of its request (a round waits for its
slowest call), and reusing a wave's samples across requests.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from isocompute.app.accounting.tracing import span
from isocompute.app.errors import UpstreamTimeout
from isocompute.app.runner.execute import GENERATED, Backend, Deadline, run_wave
from isocompute.app.runner.parallel_wave import FAILED_REASONS, StreamOutcome, WaveRecord, stream_prompt
from isocompute.app.runner.voting import Voter
from isocompute.engines.base import Completion, gather_or_cancel
from isocompute.errors import EngineUnavailable
from isocompute.solver.plans.plan import Plan, PlanStep
from isocompute.tasks.answers.equivalence import Votes

__all__ = ["FAILED_REASONS", "SEED_MODULUS", "PlanRun", "derived_seed", "run_plans", "wave_seed"]  # FAILED_REASONS: parallel_wave

SEED_MODULUS = 2**31


def derived_seed(seed: int, tag: str) -> int:
    """``blake2b(f"{seed}/{tag}") mod 2³¹``: the random stream of part ``tag`` of a request with ``seed``
    (a wave here, a stage in :mod:`isocompute.app.runner.action_run`)."""
    digest = hashlib.blake2b(f"{seed}/{tag}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % SEED_MODULUS


def wave_seed(seed: int | None, wave: int) -> int | None:
    """The seed of wave ``wave`` (0-based) of a request with ``seed`` (module docstring)."""
    if seed is None or wave == 0:
        return seed
    return derived_seed(seed, str(wave))


@dataclass(slots=True)
class PlanRun:
    """One prompt's plan as it ran: the plan (capped) and the policy's; every sample drawn, in order
    (None where the upstream returned fewer than asked) and its extracted answer (None: none, or a failed
    sample); the wave sizes drawn; the class-merged vote after the last wave; why it stopped, the
    rule's statistic then, and the error that stopped it early (``deadline``/``upstream_error``)."""

    plan: Plan
    policy_plan: Plan
    samples: list[Completion | None] = field(default_factory=list)
    answers: list[str | None] = field(default_factory=list)
    wave_sizes: list[int] = field(default_factory=list)
    votes: Votes | None = None
    stopped: str | None = None
    statistic: float | None = None
    detail: str | None = None
    wave_runs: list[WaveRecord] = field(default_factory=list)
    evidence: dict | None = None  # an evidence rule's last verdict: what it saw and priced

    def spent(self) -> dict:
        """What an evidence rule reads at a wave's start: the lengths of the samples so far (in the order of
        :attr:`answers`), the tokens they generated and the latency so far (each wave's longest sample);
        ``confidence``: their ``confidence_min_window`` (None where a sample has none), aligned with lengths."""
        lengths = [0 if c is None else c.completion_tokens for c in self.samples]
        return {"lengths": lengths, "tokens": float(sum(lengths)), "latency": float(sum(w.longest for w in self.wave_runs)),
                "wave": len(self.wave_sizes),
                "confidence": [None if c is None else c.confidence_min_window for c in self.samples]}

    @property
    def drawn(self) -> int:
        """Samples drawn (asked upstream in waves that answered)."""
        return len(self.samples)

    @property
    def usable(self) -> list[int]:
        """Indices of the samples that came back and did not fail."""
        return [j for j, c in enumerate(self.samples) if c is not None and c.finish_reason not in FAILED_REASONS]

    @property
    def lost(self) -> int:
        """Samples drawn that did not come back or failed (aborted ones were stopped, not lost)."""
        return sum(c is None or c.finish_reason == "error" for c in self.samples)

    @property
    def next_parallel(self) -> bool:
        """Whether the next wave is parallel-stop."""
        return self.plan.parallel[len(self.wave_sizes)]

    @property
    def next_wave(self) -> int | None:
        """Size of the next wave, None once stopped."""
        return None if self.stopped is not None else self.plan.waves[len(self.wave_sizes)]

    def add(self, wave: int, comps: Sequence[Completion], extract: Callable[[str], str | None], *,
            seconds: float | None = None, first_token_s: float | None = None,
            saved_tokens: int | None = None, logprobs: int | None = None) -> None:
        """Record a wave of ``wave`` samples of which ``comps`` came back (its timing and the logprobs it
        asked: :class:`WaveRecord`)."""
        got = list(comps)[:wave]
        self.samples += got + [None] * (wave - len(got))
        self.answers += [None if c.finish_reason in FAILED_REASONS else extract(c.text) for c in got]
        self.answers += [None] * (wave - len(got))
        self.wave_sizes.append(wave)
        mode = self.plan.modes[len(self.wave_sizes) - 1]
        self.wave_runs.append(WaveRecord.of(mode, wave, got, stopped=False, seconds=seconds,
                                            first_token_s=first_token_s, saved_tokens=saved_tokens,
                                            logprobs=logprobs))

    def stopped_mid_wave(self, votes: Votes, step: PlanStep) -> None:
        """The plan's rule fired mid-wave (``step``, from :meth:`Plan.on_finish`); ``votes`` over every
        sample drawn, the aborted ones voting None."""
        self.votes, self.stopped = votes, "rule"
        self.evidence = step.decision.detail or self.evidence
        prob = float(step.decision.prob)
        self.statistic = prob if math.isfinite(prob) else None
        self.wave_runs[-1] = dataclasses.replace(self.wave_runs[-1], ended="rule")

    def check(self, votes: Votes) -> None:
        """The plan's step on the merged classes of every sample so far."""
        self.votes = votes
        evidence = None
        if getattr(self.plan.rule, "needs_evidence", False):
            evidence = {**self.spent(), "running": 0, "wave": len(self.wave_sizes) - 1}
            if not getattr(self.plan.rule, "needs_confidence", False):
                del evidence["confidence"]  # read only by a rule trained with it
        step = self.plan.step(votes.classes, evidence)
        self.evidence = step.decision.detail or self.evidence
        prob = float(step.decision.prob)
        self.statistic = prob if math.isfinite(prob) else None  # the rule none's is −inf
        if step.stop:
            cut = self.plan.max_samples < self.policy_plan.max_samples
            self.stopped = "rule" if step.reason == "rule" else ("cap" if cut else "plan_end")

    def stop(self, reason: str, detail: str | None = None) -> None:
        self.stopped, self.detail = reason, detail


async def run_plans(
    backend: Backend,
    prompts: list[str],
    plans: Sequence[Plan],
    policy_plans: Sequence[Plan],
    *,
    voter: Voter,
    extract: Callable[[str], str | None],
    max_tokens: int,
    temperature: float,
    seed: int | None,
    deadline: Deadline,
    logprobs: int | None = None,
) -> list[PlanRun]:
    """Run every prompt's plan (module docstring); raises what the first wave raises (502/503/504).
    ``logprobs=K``: every wave asks for them (a confidence-weighted vote), and is priced so."""
    runs = [PlanRun(p, q) for p, q in zip(plans, policy_plans, strict=True)]
    active = list(range(len(prompts)))
    wave = 0
    started = time.perf_counter()
    while active:
        if wave and deadline.remaining() <= 0:
            for i in active:
                runs[i].stop("deadline", f"no time left for wave {wave + 1} within the request's "
                                         f"{deadline.seconds:g} s deadline")
            _observe_ends(backend, [runs[i] for i in active], started)
            break
        par = [i for i in active if runs[i].next_parallel]
        wait = [i for i in active if i not in par]
        t0 = time.perf_counter()
        meter, worst = GENERATED.get(), max_tokens * sum(runs[i].next_wave or 0 for i in active)
        if meter is not None:
            meter.inflight += worst  # until the round is back (kept when cancelled): the most it may generate
        try:
            with span("isocompute.wave", wave=wave + 1, pool=backend.pool, prompts=len(active), parallel=len(par)):
                (waited, wait_s), streamed = await backend.call(
                    _round(backend, prompts, runs, wait, par, voter=voter, extract=extract, max_tokens=max_tokens,
                           temperature=temperature, seed=wave_seed(seed, wave), deadline_at=deadline.at,
                           logprobs=logprobs),
                    deadline=deadline, what="the sampling call" if wave == 0 else f"wave {wave + 1} of the sampling")
        except EngineUnavailable as e:
            if meter is not None:
                meter.inflight -= worst
            if wave == 0:
                raise
            reason = "deadline" if isinstance(e, UpstreamTimeout) else "upstream_error"
            for i in active:
                runs[i].stop(reason, str(e))
            _observe_ends(backend, [runs[i] for i in active], started)
            break
        backend.metrics.upstream_latency.labels(backend.pool).observe(time.perf_counter() - t0)
        if meter is not None:
            meter.inflight -= worst
            meter.done += sum(c.completion_tokens for comps in waited for c in comps if c is not None) + sum(
                c.completion_tokens for out in streamed for c in out.completions if c is not None)
        for i, comps in zip(wait, waited, strict=True):
            runs[i].add(runs[i].next_wave or 0, comps, extract, seconds=wait_s, logprobs=logprobs)
        for i, out in zip(par, streamed, strict=True):
            runs[i].add(runs[i].next_wave or 0, out.completions, extract, seconds=out.seconds,
                        first_token_s=out.first_token_s, saved_tokens=out.saved_tokens, logprobs=out.logprobs)
        with span("isocompute.vote", wave=wave + 1):
            votes = await voter.classes([runs[i].answers for i in active], deadline.at)
        mid = {i: out for i, out in zip(par, streamed, strict=True) if out.step is not None}
        for i, v in zip(active, votes, strict=True):
            if i in mid:
                runs[i].stopped_mid_wave(v, mid[i].step)  # type: ignore[arg-type]
                backend.metrics.waves_stopped.labels(backend.pool).inc()
                backend.metrics.aborted_samples.labels(backend.pool).inc(runs[i].wave_runs[-1].aborted)
            else:
                runs[i].check(v)
            backend.metrics.observe_wave(runs[i].wave_runs[-1], runs[i].plan.rule.kind, backend.pool)
        _observe_ends(backend, [runs[i] for i in active if runs[i].stopped is not None], started)
        active = [i for i in active if runs[i].stopped is None]
        wave += 1
    return runs


def _observe_ends(backend: Backend, ended: list[PlanRun], started: float) -> None:
    """The plan latency of the prompts whose runs just stopped: from the first wave's send until now."""
    seconds = time.perf_counter() - started
    for run in ended:
        backend.metrics.observe_plan(run.plan.rule.kind, backend.pool, seconds)


async def _round(backend: Backend, prompts: list[str], runs: list[PlanRun], wait: list[int], par: list[int], *,
                 voter: Voter, extract: Callable[[str], str | None], max_tokens: int, temperature: float,
                 seed: int | None, deadline_at: float, logprobs: int | None = None
                 ) -> tuple[tuple[list[list[Completion]], float | None], list[StreamOutcome]]:
    """One round: the waiting waves (:func:`run_wave`) with the seconds their call took, and the
    parallel-stop ones (one stream per prompt)."""
    async def waiting() -> tuple[list[list[Completion]], float | None]:
        if not wait:
            return [], None
        t0 = time.perf_counter()
        comps = await run_wave(backend.engine, [prompts[i] for i in wait], [runs[i].next_wave or 0 for i in wait],
                               max_tokens=max_tokens, temperature=temperature, seed=seed, logprobs=logprobs)
        return comps, time.perf_counter() - t0

    streams = [stream_prompt(backend.engine, prompts[i], runs[i].next_wave or 0, runs[i].plan, runs[i].answers,
                             voter=voter, extract=extract, max_tokens=max_tokens, temperature=temperature,
                             seed=None if seed is None else seed + k * (runs[i].next_wave or 0),
                             deadline_at=deadline_at,
                             spent=runs[i].spent() if getattr(runs[i].plan.rule, "needs_evidence", False) else None,
                             logprobs=logprobs)
               for k, i in enumerate(par)]
    waited, *streamed = await gather_or_cancel([waiting(), *streams])
    return waited, streamed
