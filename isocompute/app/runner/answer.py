"""One prompt's answer from its plan's samples: the sample that represents the vote, and what it cost.

* :func:`pick_sample`: ``strategy="majority"`` votes over the samples' **answer classes** (the merge of
  :mod:`isocompute.app.runner.voting`: equivalent answers are one class) with :func:`isocompute.app.runner.aggregate.majority_vote`
  — ties by ``tie_break`` — and represents the winning class by its first sample; ``"best_of"`` takes the
  sample the verifier scores highest; ``"weighted"`` weighs each class's votes by the server's fitted
  :class:`~isocompute.solver.votes.weights.VoteWeights` of its samples' lengths and, when the weights read
  confidence (γ ≠ 0), their confidence — every wave then asked for logprobs (``Answers.logprobs_for``) — and
  says so in ``vote_weights``. Only usable samples (returned, not failed) take part.
* :func:`describe`: the response's ``isocompute`` object — the decision, the plan as it ran (every wave:
  samples started, finished, aborted, tokens, why it ended), the vote, what it cost; for a multi-model
  policy's action also each stage that ran (:func:`action_info`), for a single-model policy's one-stage
  action the plan's fields alone (:func:`plan_info`), as the response has always shown them.

Worked example: a one-stage action ``lead:m=2@1x2`` whose two samples say 3, 3 → ``plan`` ``lead:m=2@1x2``,
``waves`` 2, ``stopped`` ``rule``, ``votes`` ``{"3": 2}``, ``answer`` ``"3"``; as a cascade's first stage
the same run is ``stages[0]`` and the top level sums the stages.

Ignores: what the answer cost (:class:`isocompute.app.accounting.ledger.Ledger` measures and charges it)
and tie-breaking best-of by anything but sample order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from isocompute.app.routing import Routing
from isocompute.app.runner.action_run import ActionRun
from isocompute.app.runner.aggregate import Vote, best_of, majority_vote, weighted_vote
from isocompute.app.runner.plan_run import PlanRun
from isocompute.app.schemas import IsoComputeInfo, ProbeInfo, StageInfo, WaveInfo
from isocompute.solver.votes.weights import VoteWeights

__all__ = ["Answer", "Picked", "Verifier", "action_info", "describe", "pick_sample", "plan_info", "wave_infos"]


class Verifier(Protocol):
    """Scores complete samples for ``strategy="best_of"`` (higher is better)."""

    def score(self, prompt: str, texts: list[str]) -> list[float]: ...


@dataclass(frozen=True, slots=True)
class Answer:
    """One prompt's aggregated answer, ready to become a response choice."""

    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    flops: float | None
    info: IsoComputeInfo


@dataclass(frozen=True, slots=True)
class Picked:
    """The sample that answers (``index`` into ``PlanRun.samples``), its class's answer (None: no
    answer), whether a tie-break chose it, and (``strategy="weighted"``) the weights it voted with."""

    index: int
    answer: str | None
    tied: bool
    vote_weights: dict[str, Any] | None = None


def pick_sample(run: PlanRun, strategy: str, *, tie_break: Any, seed: int | None, prompt: str,
                verifier: Verifier | None, weights: Sequence[float] | None = None,
                vote_weights: VoteWeights | None = None) -> Picked:
    """The answering sample of ``run`` (module docstring); ``run`` has at least one usable sample and a vote.
    ``weights`` (one per sample: a vote over several models' samples) weight the majority vote; with
    ``strategy="weighted"`` they multiply ``vote_weights``' evidence weights."""
    assert run.votes is not None
    ok = run.usable
    classes = [run.votes.classes[j] for j in ok]
    vote: Vote
    if strategy == "weighted":
        assert vote_weights is not None  # the gateway refuses weighted without a vote file
        return _pick_weighted(run, ok, classes, vote_weights, weights, tie_break=tie_break, seed=seed)
    if strategy == "best_of":
        assert verifier is not None  # the gateway refuses best_of without one
        texts = [c.text for c in (run.samples[j] for j in ok) if c is not None]
        vote = best_of(classes, verifier.score(prompt, texts))
    elif weights is not None and len(set(weights)) > 1:
        vote = weighted_vote(classes, [weights[j] for j in ok], tie_break=tie_break, seed=seed)
    else:
        vote = majority_vote(classes, tie_break=tie_break, seed=seed)
    cls = vote.answer
    return Picked(ok[vote.index], None if cls is None else run.votes.representatives[int(cls)], vote.tied)


def _pick_weighted(run: PlanRun, ok: list[int], classes: list[Any], vw: VoteWeights,
                   weights: Sequence[float] | None, *, tie_break: Any, seed: int | None) -> Picked:
    """``strategy="weighted"``: the vote by evidence weights (module docstring), and what it weighed."""
    assert run.votes is not None
    voting = [run.samples[j] for j in ok]
    tokens = [float("nan") if s is None else float(s.completion_tokens) for s in voting]
    conf = ([None if s is None else getattr(s, vw.confidence_field or "", None) for s in voting]
            if vw.reads_confidence else None)
    used = conf is not None and any(c is not None for c in conf)
    w = vw.weights(tokens, conf if used else None)
    if weights is not None:
        w = [a * weights[j] for a, j in zip(w, ok, strict=True)]
    vote = (weighted_vote(classes, w, tie_break=tie_break, seed=seed) if len(set(w)) > 1
            else majority_vote(classes, tie_break=tie_break, seed=seed))
    reps = run.votes.representatives
    scores: dict[str, float] = {}
    for c, x in zip(classes, w, strict=True):
        if c is not None:
            scores[reps[int(c)]] = scores.get(reps[int(c)], 0.0) + x
    info = {"beta": vw.beta, "gamma": vw.gamma, "typical_tokens": vw.typical_tokens,
            "evidence": ["length", "confidence"] if used else ["length"],
            "confidence_used": used, "fitted_k": (vw.fit or {}).get("k"), "kept": (vw.fit or {}).get("kept"),
            "weights": w, "scores": scores}
    cls = vote.answer
    return Picked(ok[vote.index], None if cls is None else reps[int(cls)], vote.tied, info)


def describe(run: ActionRun, routing: Routing, i: int, picked: Picked, *, strategy: str, flops: float | None,
             stage_flops: Sequence[float | None], latency: float | None) -> IsoComputeInfo:
    """Prompt ``i``'s ``isocompute`` object (module docstring; fields documented on :class:`IsoComputeInfo`):
    ``flops`` its FLOPs, ``stage_flops`` each stage's, ``latency`` its realised latency under a latency
    budget (None without one)."""
    if not routing.model_actions:
        [stage] = run.stages
        return plan_info(stage.run, routing, i, picked, strategy=strategy, flops=flops, latency=latency)
    return action_info(run, routing, i, picked, strategy=strategy, flops=flops, stage_flops=stage_flops,
                       latency=latency)


def plan_info(run: PlanRun, routing: Routing, i: int, picked: Picked, *, strategy: str,
              flops: float | None, latency: float | None = None) -> IsoComputeInfo:
    """A single-model plan's ``isocompute`` object; ``latency`` its realised latency under a latency budget."""
    assert run.votes is not None
    received = len(run.usable)
    return IsoComputeInfo(
        plan=run.plan.name, policy_plan=run.policy_plan.name,
        waves=len(run.wave_sizes), wave_sizes=run.wave_sizes, stopped=run.stopped,  # type: ignore[arg-type]
        wave_runs=wave_infos([run]), tokens=sum(w.tokens for w in run.wave_runs),
        stop_statistic=run.statistic, stop_detail=run.detail, k=run.drawn,
        answer=picked.answer, votes=run.votes.as_dict(), votes_complete=run.votes.complete,
        samples_received=received, partial=run.lost > 0 or run.stopped in ("deadline", "upstream_error"),
        latency=latency, latency_s=wave_seconds([run]), vote_weights=picked.vote_weights, evidence=run.evidence,
        **_routing_info(routing, i, strategy=strategy, flops=flops),
    )


def wave_infos(runs: Sequence[PlanRun]) -> list[WaveInfo]:
    """Every wave of ``runs`` (a plan's, or an action's stages' in order) as the response shows it."""
    return [WaveInfo(mode=w.mode, started=w.started, finished=w.finished, aborted=w.aborted,  # type: ignore[arg-type]
                     tokens=w.tokens, decode_tokens=longest, ended=w.ended, seconds=w.seconds)
            for r in runs for w, longest in zip(r.wave_runs, _decode_lengths(r), strict=False)]


def _decode_lengths(run: PlanRun) -> list[int]:
    """Per wave of ``run``, its longest returned sample's completion tokens (0 when none came back)."""
    out, start = [], 0
    for n in run.wave_sizes:
        out.append(max((c.completion_tokens for c in run.samples[start:start + n] if c is not None), default=0))
        start += n
    return out


def wave_seconds(runs: Sequence[PlanRun]) -> float | None:
    """The wall-clock seconds of every wave of ``runs``, summed (None when a wave was not timed)."""
    secs = [w.seconds for r in runs for w in r.wave_runs]
    return None if not secs or any(x is None for x in secs) else float(sum(secs))  # type: ignore[arg-type]


def _routing_info(routing: Routing, i: int, *, strategy: str, flops: float | None) -> dict[str, Any]:
    """The fields of prompt ``i``'s ``isocompute`` object that come from its routing (the policy's
    decision, budget, probe) and its FLOPs, the same for a plan and a multi-model action."""
    pr, es, ew, el = routing.probe, routing.expected_samples, routing.expected_waves, routing.expected_latency
    return dict(
        action=routing.actions[i], policy_k=routing.policy_ks[i],
        expected_samples=None if es is None else es[i], expected_waves=None if ew is None else ew[i],
        rule=routing.rule, rule_evidence=routing.rule_evidence, strategy=strategy,
        lambda_=routing.lam, budget=routing.plan.budget, budget_unit=routing.plan.unit,
        budget_written=routing.plan.written, latency_budget=routing.latency_budget,
        expected_latency=None if el is None else el[i],
        internal_latency_budget=None if routing.latency_control is None else routing.latency_control.internal,
        internal_budget=routing.internal_budget, expected_cost=routing.costs[i],
        policy_unit=routing.plan.policy_unit, flops=flops,
        probe=None if pr is None else ProbeInfo(name=pr.name, value=pr.values[i], tokens=pr.tokens[i],
                                                cost=pr.declared_cost, flops=pr.flops[i]),
    )


def action_info(run: ActionRun, routing: Routing, i: int, picked: Picked, *, strategy: str, flops: float | None,
                stage_flops: Sequence[float | None], latency: float | None = None) -> IsoComputeInfo:
    """Prompt ``i``'s ``isocompute`` object for a multi-model action: each stage that ran, and the totals
    (waves, samples, FLOPs) over them; ``votes`` is the final vote's (over the last stage or all)."""
    final = run.final
    assert final is not None and final.votes is not None
    last = run.stages[-1].run
    received = sum(len(st.run.usable) for st in run.stages)
    lost = sum(st.run.lost for st in run.stages)
    stages = [StageInfo(model=st.model, plan=st.run.plan.name, policy_plan=st.stage.plan.name,
                        waves=len(st.run.wave_sizes), wave_sizes=st.run.wave_sizes, samples=st.run.drawn,
                        samples_received=len(st.run.usable), stopped=st.stopped,  # type: ignore[arg-type]
                        stop_statistic=st.run.statistic, stop_detail=st.run.detail,
                        votes={} if st.run.votes is None else st.run.votes.as_dict(), weight=st.weight, flops=f)
              for st, f in zip(run.stages, stage_flops, strict=True)]
    failed = any(st.stopped in ("deadline", "upstream_error") for st in run.stages)
    return IsoComputeInfo(
        plan=run.action.name, policy_plan=run.action.name,
        waves=len(run.wave_sizes), wave_sizes=run.wave_sizes, stopped=run.stopped,  # type: ignore[arg-type]
        wave_runs=wave_infos([st.run for st in run.stages]),
        tokens=sum(w.tokens for st in run.stages for w in st.run.wave_runs),
        stop_statistic=last.statistic, stop_detail=last.detail, k=run.drawn,
        answer=picked.answer, votes=final.votes.as_dict(), votes_complete=final.votes.complete,
        samples_received=received, partial=lost > 0 or failed,
        model_action=run.action.name, vote=run.action.vote, stages=stages, latency=latency,
        latency_s=wave_seconds([st.run for st in run.stages]), vote_weights=picked.vote_weights,
        **_routing_info(routing, i, strategy=strategy, flops=flops),
    )
