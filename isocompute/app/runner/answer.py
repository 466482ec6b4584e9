"""One prompt's answer from its plan's samples: the sample that represents the vote, and what it cost.

* :func:`pick_sample`: ``strategy="majority"`` votes over the samples' **answer classes** (the merge of
  :mod:`isocompute.app.runner.voting`: equivalent answers are one class) with :func:`isocompute.app.runner.aggregate.majority_vote`
  — ties by ``tie_break`` — and represents the winning class by its first sample; ``"best_of"`` takes the
  sample the verifier scores highest. Only usable samples (returned, not failed) take part.
* :func:`answer_info`: the response's ``isocompute`` object — the decision, the plan as it ran, the vote;
  :func:`action_info` the same for a multi-model action, with each stage that ran;
* :func:`plan_flops`: the FLOPs of a plan's samples — every decode step, and the prompt's prefill once
  per plan when the upstream caches prefixes across requests (vLLM's automatic prefix caching), else
  once per wave (each wave is one request with n = wave size, whose samples share one prefill).

Worked example: waves 1, 1, 2 with 10 prompt tokens and completions of 5, 6, 5, 7 tokens → with
prefix caching ``prefill(10) + Σ decode``; without it ``3 · prefill(10) + Σ decode``.

Ignores: the probe call's and extra features' FLOPs (the gateway adds them) and tie-breaking best-of by
anything but sample order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from isocompute.app.routing import Routing
from isocompute.app.runner.action_run import ActionRun
from isocompute.app.runner.aggregate import Vote, best_of, majority_vote, weighted_vote
from isocompute.app.runner.plan_run import PlanRun
from isocompute.app.schemas import IsoComputeInfo, ProbeInfo, StageInfo, WaveInfo

__all__ = ["Answer", "Picked", "StageCost", "Verifier", "action_info", "answer_info", "pick_sample", "plan_flops",
           "stage_costs", "wave_infos", "wave_tokens"]


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
    answer), and whether a tie-break chose it."""

    index: int
    answer: str | None
    tied: bool


def pick_sample(run: PlanRun, strategy: str, *, tie_break: Any, seed: int | None, prompt: str,
                verifier: Verifier | None, weights: Sequence[float] | None = None) -> Picked:
    """The answering sample of ``run`` (module docstring); ``run`` has at least one usable sample and a vote.
    ``weights`` (one per sample: a vote over several models' samples) weight the majority vote."""
    assert run.votes is not None
    ok = run.usable
    classes = [run.votes.classes[j] for j in ok]
    vote: Vote
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


def wave_tokens(run: PlanRun) -> list[list[int]]:
    """Per wave of ``run``, the completion tokens of its samples that came back."""
    waves, start = [], 0
    for n in run.wave_sizes:
        waves.append([c.completion_tokens for c in run.samples[start:start + n] if c is not None])
        start += n
    return waves


def plan_flops(model: Any, prompt_tokens: int, run: PlanRun, *, prefix_caching: bool) -> float:
    """FLOPs of ``run``'s samples that came back (module docstring)."""
    from isocompute.flops import request_flops

    waves = wave_tokens(run)
    if prefix_caching:
        return float(request_flops(model, prompt_tokens, [m for w in waves for m in w]))
    return float(sum(request_flops(model, prompt_tokens, w) for w in waves))


def answer_info(run: PlanRun, routing: Routing, i: int, picked: Picked, *, strategy: str,
                flops: float | None, latency: float | None = None) -> IsoComputeInfo:
    """Prompt ``i``'s ``isocompute`` object (fields documented on :class:`IsoComputeInfo`); ``latency`` its
    realised latency under a latency budget."""
    assert run.votes is not None
    received = len(run.usable)
    return IsoComputeInfo(
        plan=run.plan.name, policy_plan=run.policy_plan.name,
        waves=len(run.wave_sizes), wave_sizes=run.wave_sizes, stopped=run.stopped,  # type: ignore[arg-type]
        wave_runs=wave_infos([run]), tokens=sum(w.tokens for w in run.wave_runs),
        stop_statistic=run.statistic, stop_detail=run.detail, k=run.drawn,
        answer=picked.answer, votes=run.votes.as_dict(), votes_complete=run.votes.complete,
        samples_received=received, partial=run.lost > 0 or run.stopped in ("deadline", "upstream_error"),
        latency=latency, **_routing_info(routing, i, strategy=strategy, flops=flops),
    )


def wave_infos(runs: Sequence[PlanRun]) -> list[WaveInfo]:
    """Every wave of ``runs`` (a plan's, or an action's stages' in order) as the response shows it."""
    return [WaveInfo(mode=w.mode, started=w.started, finished=w.finished, aborted=w.aborted,  # type: ignore[arg-type]
                     tokens=w.tokens, ended=w.ended) for r in runs for w in r.wave_runs]


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


@dataclass(frozen=True, slots=True)
class StageCost:
    """What one stage of an action spent: its prompt's tokens (each model reads the prompt), its samples'
    completion tokens, and their FLOPs on that stage's model (None without its config)."""

    prompt_tokens: int
    completion_tokens: int
    flops: float | None


def stage_costs(run: ActionRun, model_flops: Mapping[str, Any], *, prefix_caching: bool) -> list[StageCost]:
    """Each stage's :class:`StageCost`: :func:`plan_flops` of its waves on ``model_flops[its model]``."""
    out = []
    for st in run.stages:
        got = [c for c in st.run.samples if c is not None]
        p = max((c.prompt_tokens for c in got), default=0)
        mf = model_flops.get(st.model)
        out.append(StageCost(p, sum(c.completion_tokens for c in got),
                             None if mf is None else plan_flops(mf, p, st.run, prefix_caching=prefix_caching)))
    return out


def action_info(run: ActionRun, routing: Routing, i: int, picked: Picked, *, strategy: str, flops: float | None,
                stage_flops: Sequence[float | None]) -> IsoComputeInfo:
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
        model_action=run.action.name, vote=run.action.vote, stages=stages,
        **_routing_info(routing, i, strategy=strategy, flops=flops),
    )
