"""The gateway's one runner: a routed request's actions run, voted on, charged and described.

Every request runs here (:meth:`Answers.answer`), whatever its policy: a single-model policy's plan is a
one-stage action on the default pool (:func:`actions_of`), a multi-model policy's cascades and ensembles
are more stages, each on its model's pool. The gateway's steps 3–5 (:mod:`isocompute.app.gateway`):

3. **run** (:func:`isocompute.app.runner.action_run.run_actions`): each action's stages, each stage's
   waves on its model's pool (:func:`isocompute.app.runner.plan_run.run_plans`: waiting waves as one
   ``generate`` call, parallel-stop waves streamed and aborted when the rule fires) — a chat rendered in
   each model's own chat template (:meth:`Answers.prompts_for`); cascades escalate when a stage's plan
   ran out without its rule firing; the request's caps bound the whole action;
4. **vote** (:func:`isocompute.app.runner.answer.pick_sample`): over the last stage's samples, or over all
   of them with per-model weights (the action's ``vote``); the winning sample's text is the answer;
5. **charge** (:meth:`isocompute.app.accounting.ledger.Ledger.book`): the stages summed — samples, prompt
   and completion tokens (aborted samples' partial tokens included), FLOPs each on its own model's FLOP
   model, latency — to the metrics and the key's controllers; then the ``isocompute`` object
   (:func:`isocompute.app.runner.answer.describe`).

Worked example: the cascade ``s/lead:m=2@1x2 > l/none@4`` whose two ``s`` samples split 12 / 7 escalates
to ``l``'s four samples; the answer is ``l``'s vote, ``k`` = 6, and ``usage.flops`` = F_s(2 samples) +
F_l(4 samples). The single-model plan ``lead:m=2@1x2`` is the action ``lead:m=2@1x2`` on the default pool:
on answers 3, 3 it stops after 2 samples (``rule``).

Failures: when the final vote has no usable sample the answer is a 502 (counted
``isocompute_upstream_errors_total{kind="bad_response"}`` under the last stage's pool); samples lost
upstream count ``{kind="partial"}`` once per answer under each pool that lost some. Before anything is
drawn, each prompt is checked against the context length of every model its action may reach
(:meth:`Answers.check_context`: a 400 naming the model, as vLLM itself would refuse it).

Ignores: stage-level retries.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from isocompute.app.accounting.ledger import Ledger
from isocompute.app.accounting.metrics import Metrics
from isocompute.app.accounting.tracing import span
from isocompute.app.chat import render_chat
from isocompute.app.routing import Routing
from isocompute.app.runner.action_run import ActionRun, run_actions
from isocompute.app.runner.answer import Answer, Verifier, describe, pick_sample
from isocompute.app.runner.execute import Backend, Deadline
from isocompute.app.runner.parallel_wave import CONFIDENCE_TOP_K
from isocompute.app.runner.pools import DEFAULT, Pool, check_context
from isocompute.app.runner.voting import Voter
from isocompute.app.schemas import ChatMessage
from isocompute.app.settings import Settings
from isocompute.engines.base import UpstreamBadResponse
from isocompute.errors import InputError
from isocompute.flops.logprobs import LOGPROB_COST_FACTOR
from isocompute.solver.models.actions import Action, Stage
from isocompute.solver.votes.weights import load_vote

__all__ = ["Answers", "actions_of"]


def actions_of(routing: Routing) -> tuple[Action, ...]:
    """Each prompt's action: a multi-model policy's, else its plan as a one-stage action on the default
    pool (the policy's plan: the stage is cut to the request's caps as it runs, as ``routing.plans`` is)."""
    if routing.model_actions:
        return routing.model_actions
    return tuple(Action((Stage(DEFAULT, p),)) for p in routing.policy_plans)


class Answers:
    """Steps 3–5 of every routed request (module docstring); one per gateway. ``pools``: the named
    pools (model name → pool), ``default`` the default pool, where one-stage actions run."""

    def __init__(self, pools: Mapping[str, Pool], default: Pool, *, settings: Settings, voter: Voter,
                 extract: Callable[[str], str | None], verifier: Verifier | None, ledger: Ledger) -> None:
        self.pools = {**pools, DEFAULT: default}
        self.default = default
        self.settings = settings
        self.voter = voter
        self.extract = extract
        self.verifier = verifier
        self.ledger = ledger
        self.vote = None if settings.vote_file is None else load_vote(settings.vote_file)
        if self.vote is not None and self.vote.reads_confidence:
            logging.getLogger("isocompute.gateway").info(
                "%s weighs by confidence (gamma = %g, %s): strategy 'weighted' asks every wave for %d logprobs "
                "per token, whose tokens cost %.2fx", settings.vote_file, self.vote.gamma,
                self.vote.confidence_field, CONFIDENCE_TOP_K, LOGPROB_COST_FACTOR)

    async def answer(self, prompts: list[str], routing: Routing, *, max_tokens: int, temperature: float,
                     seed: int | None, strategy: str, deadline: Deadline,
                     messages: Sequence[ChatMessage] | None = None,
                     on_runs: Callable[[list[ActionRun]], None] | None = None) -> list[Answer]:
        """Every prompt's answer; raises InputError (400) for ``best_of`` without a verifier, ``weighted``
        without a vote file, or a prompt too
        long for a model its action may reach, and what the first stage raises (502/503/504). ``on_runs``
        sees the runs as soon as they are back, before any vote (what they generated, even when a vote then
        fails)."""
        self.check_strategy(strategy)
        actions = actions_of(routing)
        prompts_of = self.prompts_for(prompts, messages)
        if routing.model_actions:
            self.check_context(prompts_of, actions, max_tokens)
        runs = await run_actions(
            lambda m: self.pools[m].backend, prompts_of, actions, cap=routing.plan.cap,
            wave_cap=routing.plan.wave_cap, voter=self.voter, extract=self.extract, max_tokens=max_tokens,
            temperature=temperature, seed=seed, deadline=deadline, logprobs=self.logprobs_for(strategy))
        if on_runs is not None:
            on_runs(runs)
        return [self._answer(prompts[i], runs[i], routing, i, strategy, seed) for i in range(len(prompts))]

    def check_strategy(self, strategy: str) -> None:
        """400 for a ``strategy`` this server cannot serve (checked before anything runs or streams)."""
        if strategy == "best_of" and self.verifier is None:
            raise InputError("strategy 'best_of' needs a verifier and this server has none configured; "
                             "use strategy 'majority'")
        if strategy == "weighted" and self.vote is None:
            raise InputError("strategy 'weighted' needs a fitted vote and this server has none configured (serve "
                             "--vote vote.json, or ISOCOMPUTE_VOTE_FILE); use strategy 'majority'")

    def logprobs_for(self, strategy: str) -> int | None:
        """The logprobs every wave asks for: a weighted vote whose weights read confidence needs them."""
        weighted = strategy == "weighted" and self.vote is not None and self.vote.reads_confidence
        return CONFIDENCE_TOP_K if weighted else None

    def prompts_for(self, prompts: list[str], messages: Sequence[ChatMessage] | None) -> Callable[[str], list[str]]:
        """Each model's prompts: a chat rendered in that pool's own chat template, else the text as sent."""
        def of(model: str) -> list[str]:
            if model == DEFAULT:
                return prompts
            tok = self.pools[model].tokenizer
            if messages is None or tok is None or tok is self.default.tokenizer:
                return prompts
            return [render_chat(tok, messages)]

        return of

    def check_context(self, prompts_of: Callable[[str], list[str]], actions: Sequence[Action],
                      max_tokens: int) -> None:
        """Each prompt, as each model reads it, against the context length of every model its action may
        reach — a cascade's later stages too: whether they run is known only after the earlier ones, and a
        refusal then would waste those. A model with the default pool's tokenizer and context was checked
        already (``Gateway.check_prompts``); one without a tokenizer or a known context is not checked."""
        d = self.default
        for model in dict.fromkeys(m for a in actions for m in a.models):
            pool = self.pools[model]
            if pool is d:
                continue
            if pool.tokenizer is None or pool.context_limit is None:
                continue
            if pool.tokenizer is d.tokenizer and pool.context_limit == d.context_limit:
                continue
            texts = prompts_of(model)
            idx = [i for i, a in enumerate(actions) if model in a.models]
            ids = pool.tokenizer([texts[i] for i in idx], add_special_tokens=True)["input_ids"]
            check_context([len(x) for x in ids], max_tokens, pool.context_limit, model=model, index=idx)

    def _answer(self, prompt: str, run: ActionRun, routing: Routing, i: int, strategy: str,
                seed: int | None) -> Answer:
        m = self.ledger.metrics
        final = run.final
        if final is None or not final.usable:
            last = run.stages[-1].model if run.stages else run.action.models[0]
            pool = self.pools[last].backend
            raise UpstreamBadResponse(self._unusable(run, pool, m))
        for name in dict.fromkeys(self.pools[st.model].backend.pool for st in run.stages if st.run.lost):
            m.upstream_errors.labels("partial", name).inc()
        picked = pick_sample(final, strategy, tie_break=self.settings.tie_break, seed=seed, prompt=prompt,
                             verifier=self.verifier, weights=run.weights, vote_weights=self.vote)
        chosen = final.samples[picked.index]
        assert chosen is not None
        with span("isocompute.charge", drawn=run.drawn):
            bill = self.ledger.book(run, routing, i)
        info = describe(run, routing, i, picked, strategy=strategy, flops=bill.flops, stage_flops=bill.stage_flops,
                        latency=bill.latency)
        return Answer(chosen.text, chosen.finish_reason, bill.prompt_tokens, bill.completion_tokens, bill.flops,
                      info)

    @staticmethod
    def _unusable(run: ActionRun, backend: Backend, metrics: Metrics) -> str:
        """Count a final vote with no usable sample, and say so (502)."""
        metrics.upstream_errors.labels("bad_response", backend.pool).inc()
        if run.action.models == (DEFAULT,):
            return (f"upstream {backend.engine.name} returned no usable sample of {run.drawn}; check the upstream "
                    "server and retry")
        return (f"the pools of {', '.join(run.action.models)} returned no usable sample of {run.drawn}; check "
                "those upstream servers and retry")
