"""A routed request's answers from multi-model actions: each stage run on its model's pool, voted, summed.

For a request whose policy decided an action per prompt (``Routing.model_actions``), the gateway's
steps 3–5 (:mod:`isocompute.app.gateway`) are :meth:`ActionAnswers.answer`:

3. **run** (:func:`isocompute.app.runner.action_run.run_actions`): each action's stages on their models' pools —
   a chat rendered in each model's own chat template (:meth:`ActionAnswers.prompts_for`); cascades
   escalate when a stage's plan ran out without its rule firing; the request's caps bound the whole
   action;
4. **vote** (:func:`isocompute.app.runner.answer.pick_sample`): over the last stage's samples, or over all of them
   with per-model weights (the action's ``vote``); the winning sample's text is the answer;
5. **account** (:class:`isocompute.app.accounting.ledger.Ledger`): the stages summed — samples, prompt and
   completion tokens (each model reads the prompt), and FLOPs each on its own model's FLOP model
   (:func:`isocompute.app.runner.answer.stage_costs`; unknown when one stage's model has no config).

Worked example: the cascade ``s/lead:m=2@1x2 > l/none@4`` whose two ``s`` samples split 12 / 7 escalates
to ``l``'s four samples; the answer is ``l``'s vote, ``k`` = 6, and ``usage.flops`` = F_s(2 samples) +
F_l(4 samples).

Failures: when the final vote has no usable sample the answer is a 502 (counted
``isocompute_upstream_errors_total{kind="bad_response"}`` under the last stage's pool); samples lost
upstream count ``{kind="partial"}`` once per answer under each pool that lost some. Before anything is drawn, each
prompt is checked against the context length of every model its action may reach
(:meth:`ActionAnswers.check_context`: a 400 naming the model, as vLLM itself would refuse it).

Ignores: the single-model plans (the gateway runs those itself) and stage-level retries.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from isocompute.app.accounting.ledger import Ledger
from isocompute.app.chat import render_chat
from isocompute.app.routing import Routing
from isocompute.app.runner.action_run import ActionRun, run_actions
from isocompute.app.runner.answer import Answer, Verifier, action_info, pick_sample, stage_costs
from isocompute.app.runner.execute import Deadline
from isocompute.app.runner.pools import Pool, check_context
from isocompute.app.runner.voting import Voter
from isocompute.app.schemas import ChatMessage
from isocompute.app.settings import Settings
from isocompute.engines.base import UpstreamBadResponse
from isocompute.solver.models.actions import Action

__all__ = ["ActionAnswers"]


class ActionAnswers:
    """Steps 3–5 of a request routed to multi-model actions (module docstring); one per gateway."""

    def __init__(self, pools: Mapping[str, Pool], default: Pool, *, settings: Settings, voter: Voter,
                 extract: Callable[[str], str | None], verifier: Verifier | None, ledger: Ledger) -> None:
        self.pools = pools
        self.default = default
        self.settings = settings
        self.voter = voter
        self.extract = extract
        self.verifier = verifier
        self.ledger = ledger
        self._model_flops = {m: p.model_flops for m, p in pools.items()}

    async def answer(self, prompts: list[str], routing: Routing, *, max_tokens: int, temperature: float,
                     seed: int | None, strategy: str, deadline: Deadline,
                     messages: Sequence[ChatMessage] | None = None) -> list[Answer]:
        """Every prompt's answer; raises InputError (400) for a prompt too long for a model its action may
        reach, and what the first stage raises (502/503/504)."""
        actions = routing.model_actions
        prompts_of = self.prompts_for(prompts, messages)
        self.check_context(prompts_of, actions, max_tokens)
        runs = await run_actions(
            lambda m: self.pools[m].backend, prompts_of, actions, cap=routing.plan.cap,
            wave_cap=routing.plan.wave_cap, voter=self.voter, extract=self.extract, max_tokens=max_tokens,
            temperature=temperature, seed=seed, deadline=deadline)
        return [self._answer(prompts[i], runs[i], routing, i, strategy, seed) for i in range(len(prompts))]

    def prompts_for(self, prompts: list[str], messages: Sequence[ChatMessage] | None) -> Callable[[str], list[str]]:
        """Each model's prompts: a chat rendered in that pool's own chat template, else the text as sent."""
        def of(model: str) -> list[str]:
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
        m, book = self.ledger.metrics, self.ledger
        final = run.final
        if final is None or not final.usable:
            last = run.stages[-1].model if run.stages else run.action.models[0]
            m.upstream_errors.labels("bad_response", self.pools[last].backend.pool).inc()
            raise UpstreamBadResponse(f"the pools of {', '.join(run.action.models)} returned no usable sample of "
                                      f"{run.drawn}; check those upstream servers and retry")
        for pool in dict.fromkeys(self.pools[st.model].backend.pool for st in run.stages
                                  if st.run.lost):
            m.upstream_errors.labels("partial", pool).inc()
        picked = pick_sample(final, strategy, tie_break=self.settings.tie_break, seed=seed, prompt=prompt,
                             verifier=self.verifier, weights=run.weights)
        chosen = final.samples[picked.index]
        assert chosen is not None
        costs = stage_costs(run, self._model_flops, prefix_caching=self.settings.prefix_caching)
        stage_flops = [c.flops for c in costs]
        known = [f for f in stage_flops if f is not None]
        flops = book.paid_flops(routing, i, sum(known)) if len(known) == len(costs) else None
        book.count(run.drawn, len(run.wave_sizes), run.stopped)
        completion_tokens = sum(c.completion_tokens for c in costs)
        book.charge(routing, i, run.drawn, flops, completion_tokens)
        info = action_info(run, routing, i, picked, strategy=strategy, flops=flops, stage_flops=stage_flops)
        return Answer(chosen.text, chosen.finish_reason, sum(c.prompt_tokens for c in costs), completion_tokens,
                      flops, info)
