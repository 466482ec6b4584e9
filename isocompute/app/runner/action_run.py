"""Running a request's multi-model actions: each stage a plan on its model's pool, cascades escalating.

A prompt's :class:`~isocompute.solver.models.actions.Action` is a chain of stages, each a plan on one
model (:mod:`isocompute.solver.models.actions` states the semantics). :func:`run_actions` runs stage
s of every prompt still going, grouped by model: one :func:`isocompute.app.runner.plan_run.run_plans` per model
on that model's pool (its waves, the rule checked between them, its stop reasons), the groups
concurrently. After stage s a prompt

* **stops** when its stage's rule fired (``rule``), a cap or the deadline cut it, or a wave failed;
* **escalates** to stage s + 1 when its plan ran out without the rule firing (``plan_end``) and a next
  stage exists — the stage then reads ``escalated`` (an ensemble's stages before the last have no
  rule, so they always escalate); at the last stage it reads ``plan_end``.

**Caps across stages**: ``max_samples`` and ``max_waves`` bound the whole action. Stage s runs its plan
cut to what the earlier stages left (``Plan.capped(max_samples=cap − drawn, max_waves=wave cap −
waves)``); a stage the caps leave nothing for does not run, and the stage before it reads ``cap``
instead of ``escalated``.

**A later stage that fails** — its first wave unavailable, a bad reply, past the deadline, or no time
left to start it — does not fail the request: the stage is listed with 0 samples, ``upstream_error``
or ``deadline`` and the error, and the answer comes from the earlier stages' samples (the same
philosophy as a later wave in :mod:`isocompute.app.runner.plan_run`). Only stage 0 failing is the request's
error (502/503/504), since nothing has been drawn.

**The final vote** (:attr:`ActionRun.final`): ``vote = "last"`` over the samples of the last stage that
returned any; ``"all"`` over every stage's samples, answers merged into classes across stages (one
:class:`~isocompute.app.runner.voting.Voter` call over all of them) and each sample weighted by its stage's
weight (:func:`isocompute.app.runner.aggregate.weighted_vote`).

**Seeds**: stage 0 samples with the request's seed (a single-stage action draws exactly as its plan
alone would), stage s > 0 with ``blake2b(f"{seed}/stage{s}") mod 2³¹``; each stage's waves derive
their own from it (:func:`isocompute.app.runner.plan_run.wave_seed`).

Worked example: ``tiny-s/lead:m=2@1x2 > tiny-l/none@4`` on a prompt tiny-s answers 3, 5 → tiny-s's plan
ends with lead 1 (``escalated``, 2 samples in 2 waves), tiny-l draws 4 in one wave (``plan_end``), the
answer is tiny-l's vote: 6 samples, 3 waves. On one tiny-s answers 3, 3 the rule fires after 2 samples
(``rule``) and tiny-l is never called.

Ignores: letting a prompt start its next stage before the other prompts of its request finish theirs
(a stage round waits for its slowest group), and pricing (the gateway adds each stage's FLOPs).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from isocompute.app.errors import UpstreamTimeout
from isocompute.app.runner.execute import Backend, Deadline
from isocompute.app.runner.plan_run import PlanRun, derived_seed, run_plans
from isocompute.app.runner.voting import Voter
from isocompute.engines.base import gather_or_cancel
from isocompute.errors import EngineUnavailable
from isocompute.solver.models.actions import Action, Stage
from isocompute.tasks.answers.equivalence import Votes

__all__ = ["ActionRun", "StageRun", "run_actions", "stage_seed"]


def stage_seed(seed: int | None, stage: int) -> int | None:
    """The seed of stage ``stage`` (0-based) of a request with ``seed`` (module docstring)."""
    if seed is None or stage == 0:
        return seed
    return derived_seed(seed, f"stage{stage}")


@dataclass(slots=True)
class StageRun:
    """One stage as it ran: the policy's stage, its plan run (plan cut to the caps left), its weight in
    a vote over all samples (1 under ``"last"``) and why it stopped (``run.stopped``, or ``escalated``)."""

    stage: Stage
    run: PlanRun
    weight: float = 1.0
    stopped: str = "plan_end"

    @property
    def model(self) -> str:
        return self.stage.model


@dataclass(slots=True)
class ActionRun:
    """One prompt's action as it ran: its stages in order, and the final vote's samples — every sample
    drawn by the stages it counts (:attr:`final`), with each one's weight."""

    action: Action
    stages: list[StageRun] = field(default_factory=list)
    final: PlanRun | None = None
    weights: list[float] = field(default_factory=list)

    @property
    def drawn(self) -> int:
        return sum(s.run.drawn for s in self.stages)

    @property
    def wave_sizes(self) -> list[int]:
        return [n for s in self.stages for n in s.run.wave_sizes]

    @property
    def stopped(self) -> str:
        """Why the action stopped: the reason of the last stage that ran (never ``escalated``)."""
        return self.stages[-1].stopped

    def voting_stages(self) -> list[StageRun]:
        """The stages the final vote counts (module docstring)."""
        drew = [s for s in self.stages if s.run.usable]
        if self.action.vote == "all":
            return drew
        return drew[-1:]


async def run_actions(
    pool: Callable[[str], Backend],
    prompts: Callable[[str], list[str]],
    actions: Sequence[Action],
    *,
    cap: int,
    wave_cap: int,
    voter: Voter,
    extract: Callable[[str], str | None],
    max_tokens: int,
    temperature: float,
    seed: int | None,
    deadline: Deadline,
    logprobs: int | None = None,
) -> list[ActionRun]:
    """Run every prompt's action (module docstring). ``pool(model)`` is that model's backend,
    ``prompts(model)`` the request's prompts as that model reads them (its chat template); ``logprobs``
    asked of every wave (:func:`run_plans`); raises what stage 0 raises (502/503/504)."""
    runs = [ActionRun(a) for a in actions]
    active = list(range(len(actions)))
    s = 0
    while active:
        if s and deadline.remaining() <= 0:
            for i in active:
                _failed(runs[i], s, "deadline", f"no time left for stage {s + 1} ({runs[i].action.stages[s].name}) "
                                                f"within the request's {deadline.seconds:g} s deadline")
            break
        groups: dict[str, list[int]] = {}
        for i in active:
            groups.setdefault(actions[i].stages[s].model, []).append(i)
        calls = [_stage(pool(model), prompts(model), idx, runs, s, cap=cap, wave_cap=wave_cap, voter=voter,
                        extract=extract, max_tokens=max_tokens, temperature=temperature, seed=stage_seed(seed, s),
                        deadline=deadline, first=s == 0, logprobs=logprobs)
                 for model, idx in groups.items()]
        await gather_or_cancel(calls)  # a later stage's upstream failure is caught in _stage
        active = [i for i in active if _escalate(runs[i], s, cap, wave_cap)]
        s += 1
    await _final_votes(runs, voter, deadline)
    return runs


async def _stage(backend: Backend, prompts: list[str], idx: list[int], runs: list[ActionRun], s: int, *, cap: int,
                 wave_cap: int, voter: Voter, extract: Callable[[str], str | None], max_tokens: int,
                 temperature: float, seed: int | None, deadline: Deadline, first: bool,
                 logprobs: int | None = None) -> None:
    """Stage ``s`` of the prompts ``idx`` (all on one model) as one :func:`run_plans` on its pool."""
    stages = [runs[i].action.stages[s] for i in idx]
    plans = [st.plan.capped(max_samples=cap - runs[i].drawn, max_waves=wave_cap - len(runs[i].wave_sizes))
             for st, i in zip(stages, idx, strict=True)]
    try:
        out = await run_plans(backend, [prompts[i] for i in idx], plans, [st.plan for st in stages], voter=voter,
                              extract=extract, max_tokens=max_tokens, temperature=temperature, seed=seed,
                              deadline=deadline, logprobs=logprobs)
    except EngineUnavailable as e:
        if first:
            raise
        reason = "deadline" if isinstance(e, UpstreamTimeout) else "upstream_error"
        for i in idx:
            _failed(runs[i], s, reason, f"stage {s + 1} ({runs[i].action.stages[s].name}) failed: {e}")
        return
    for i, st, run in zip(idx, stages, out, strict=True):
        runs[i].stages.append(StageRun(st, run, _weight(runs[i].action, s), run.stopped or "plan_end"))


def _weight(action: Action, s: int) -> float:
    return action.weights[s] if action.weights else 1.0


def _failed(run: ActionRun, s: int, reason: str, detail: str) -> None:
    st = run.action.stages[s]
    pr = PlanRun(st.plan, st.plan)
    pr.stop(reason, detail)
    run.stages.append(StageRun(st, pr, _weight(run.action, s), reason))


def _escalate(run: ActionRun, s: int, cap: int, wave_cap: int) -> bool:
    """Whether the prompt goes on to stage s + 1, marking stage s ``escalated`` (or ``cap`` when the
    caps leave the next stage nothing)."""
    last = run.stages[-1]
    if last.stopped != "plan_end" or s + 1 >= len(run.action.stages):
        return False
    if run.drawn >= cap or len(run.wave_sizes) >= wave_cap:
        last.stopped = "cap"
        return False
    last.stopped = "escalated"
    return True


async def _final_votes(runs: list[ActionRun], voter: Voter, deadline: Deadline) -> None:
    """Each prompt's final vote (module docstring): the last stage's own merged vote under ``"last"``;
    one merge of every stage's answers under ``"all"``."""
    merge: list[tuple[ActionRun, PlanRun, list[float]]] = []
    for r in runs:
        voting = r.voting_stages()
        if not voting:
            continue  # nothing usable came back: the gateway answers 502
        if len(voting) == 1 and r.action.vote == "last":
            r.final, r.weights = voting[0].run, [voting[0].weight] * voting[0].run.drawn
            continue
        final = PlanRun(voting[-1].run.plan, voting[-1].run.policy_plan)
        weights: list[float] = []
        for st in voting:
            final.samples += st.run.samples
            final.answers += st.run.answers
            final.wave_sizes += st.run.wave_sizes
            weights += [st.weight] * st.run.drawn
        final.stopped = r.stopped
        merge.append((r, final, weights))
    if merge:
        votes: list[Votes] = await voter.classes([f.answers for _, f, _ in merge], deadline.at)
        for (r, final, weights), v in zip(merge, votes, strict=True):
            final.votes = v
            r.final, r.weights = final, weights
