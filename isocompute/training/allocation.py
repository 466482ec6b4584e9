"""Budget-aware rollout allocation for group-based RL: Pilot-Commit, uniform GRPO, DAPO dynamic sampling.

A group-relative update learns nothing from a prompt whose n rollouts all agree (all right or all wrong:
every advantage is zero), yet uniform GRPO pays n rollouts for it. Three ways to fill one update with
``prompts_per_step`` (B_p) groups of ``group_size`` (n) rollouts:

* :class:`UniformAllocator` — GRPO: B_p prompts, n rollouts each, every group used.
* :class:`DynamicSamplingAllocator` — DAPO: sample B_p prompts × n, drop all-same groups, sample another
  B_p × n and keep the informative groups until B_p are kept or ``max_rounds`` rounds ran; the surplus is
  discarded. Every rollout generated is paid for, kept or not.
* :class:`PilotCommitAllocator` — Pilot-Commit: a pilot of n_p rollouts for each of ``pool_size`` prompts
  estimates each prompt's accuracy p̂; prompts with p̂ > 1 − p_hi are solved and evicted for good, prompts
  with p̂ < p_lo are hopeless for now and deferred for ``staleness`` steps (then piloted again, since the
  policy moves); the survivors (p̂ in [p_lo, 1 − p_hi]), most informative first (largest p̂(1 − p̂)), up to
  B_p of them, get n_c = n − n_p more rollouts, and their pilot rollouts join the group, so a group has n.
  When no prompt survives, another pilot round runs, up to ``max_rounds``. With a
  :class:`~isocompute.training.screen.PromptScreen`, candidates whose text looks like prompts whose pilots
  failed (or all passed) are skipped before any rollout (learned from the pilots so far).

When nothing qualifies after ``max_rounds`` (a policy that fails or solves everything it draws), both
filtering allocators fall back rather than stall: DAPO returns its last batch, Pilot-Commit commits to the
last round's piloted prompts. Those groups carry (almost) no signal, the update is then close to a no-op,
and the step is marked ``fallback``.

Each ``step(rollout, ledger)`` calls ``rollout(prompt_indices, m)`` (generate and grade m rollouts per
prompt, returning one :class:`Group` each) and charges every generated rollout to a :class:`RolloutLedger`
by phase — pilot included — with its FLOPs when the ledger knows the policy. Example of the bookkeeping:
pool 8, n_p = 4, n_c = 4, B_p = 4, of which 3 prompts survive → 8·4 = 32 pilot + 3·4 = 12 commit = 44
rollouts generated, 3 groups of 8 = 24 used; uniform GRPO with n = 8 would generate and use 4·8 = 32.

Prompts are drawn by :class:`PromptStream`: a seeded shuffle of all prompt indices, reshuffled at each
pass, skipping ineligible ones. Ignores: off-policy reuse of rollouts across steps (a survivor not chosen
this step loses its pilot), and multi-process sampling (one process decides).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from isocompute.errors import InputError
from isocompute.flops import FlopLedger, ModelFlops
from isocompute.training.screen import PromptScreen

PHASES: tuple[str, ...] = ("uniform", "dynamic", "pilot", "commit")


@dataclass
class Group:
    """The graded rollouts of one prompt: correctness, opaque per-rollout handles and token counts."""

    prompt: int
    correct: np.ndarray
    rollouts: list[Any] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.correct = np.asarray(self.correct, dtype=bool).ravel()

    @property
    def size(self) -> int:
        return int(self.correct.size)

    @property
    def accuracy(self) -> float:
        return float(self.correct.mean()) if self.size else float("nan")

    @property
    def informative(self) -> bool:
        """Some but not all rollouts correct: the group-relative advantages are not all zero."""
        return 0 < int(self.correct.sum()) < self.size

    def extend(self, more: Group) -> Group:
        """This group's rollouts followed by ``more``'s (same prompt): a pilot joined by its commit."""
        if more.prompt != self.prompt:
            raise InputError(f"cannot join rollouts of prompt {more.prompt} to prompt {self.prompt}.")
        return Group(self.prompt, np.concatenate([self.correct, more.correct]), [*self.rollouts, *more.rollouts],
                     self.prompt_tokens, [*self.completion_tokens, *more.completion_tokens])


RolloutFn = Callable[[Sequence[int], int], list[Group]]


@dataclass
class RolloutLedger:
    """Every generated rollout by phase (:data:`PHASES`), those that reached an update, and their FLOPs
    in ``flops`` (charged only when ``policy`` is known; one request per group, prefill shared or not)."""

    policy: ModelFlops | None = None
    flops: FlopLedger = field(default_factory=FlopLedger)
    prefix_sharing: bool = False
    generated: Counter = field(default_factory=Counter)
    used: int = 0
    steps: int = 0

    def charge(self, groups: Sequence[Group], phase: str) -> None:
        """Count each group's rollouts under ``phase`` and charge their FLOPs."""
        for g in groups:
            self.charge_request(g.prompt_tokens, g.completion_tokens or [0] * g.size, phase)

    def charge_request(self, prompt_tokens: int, completion_tokens: Sequence[int], phase: str) -> None:
        """One prompt sampled len(completion_tokens) times."""
        if phase not in PHASES:
            raise InputError(f"unknown rollout phase {phase!r}; use one of {PHASES}.")
        self.generated[phase] += len(completion_tokens)
        if self.policy is not None and len(completion_tokens):
            self.flops.add_rollout(self.policy, prompt_tokens, completion_tokens, prefix_sharing=self.prefix_sharing)

    @property
    def total(self) -> int:
        """All rollouts generated so far, pilot and discarded ones included."""
        return int(sum(self.generated.values()))

    def to_dict(self) -> dict[str, Any]:
        return {"generated": {p: int(self.generated[p]) for p in PHASES}, "total": self.total, "used": self.used,
                "steps": self.steps, "flops": self.flops.to_dict()}


@dataclass(frozen=True)
class AllocationStep:
    """One update's worth of groups and what it cost. ``groups`` may be empty when nothing qualified."""

    groups: list[Group]
    generated: int
    rounds: int
    evicted: tuple[int, ...] = ()
    deferred: tuple[int, ...] = ()
    fallback: bool = False
    skipped: int = 0  # candidates a Pilot-Commit screen turned away without a rollout


class Allocator(Protocol):
    group_size: int

    def step(self, rollout: RolloutFn, ledger: RolloutLedger) -> AllocationStep: ...


class PromptStream:
    """Seeded shuffled passes over ``range(n_prompts)``; :meth:`take` skips ineligible prompts."""

    def __init__(self, n_prompts: int, seed: int = 0) -> None:
        if n_prompts < 1:
            raise InputError(f"the prompt pool is empty (n_prompts={n_prompts}); give the allocator prompts.")
        self.n_prompts = n_prompts
        self._rng = np.random.default_rng(seed)
        self._order = self._rng.permutation(n_prompts)
        self._pos = 0

    def take(self, count: int, eligible: Callable[[int], bool] = lambda i: True) -> list[int]:
        """Up to ``count`` distinct eligible prompts; fewer when a whole pass finds no more."""
        out: list[int] = []
        seen = 0
        while len(out) < count and seen < self.n_prompts:
            if self._pos == self.n_prompts:
                self._order, self._pos = self._rng.permutation(self.n_prompts), 0
            i = int(self._order[self._pos])
            self._pos += 1
            seen += 1
            if i not in out and eligible(i):
                out.append(i)
        return out


def _positive(**values: int) -> None:
    for name, v in values.items():
        if v < 1:
            raise InputError(f"{name} must be ≥ 1; you passed {v}.")


class UniformAllocator:
    """GRPO: ``prompts_per_step`` prompts × ``group_size`` rollouts, all used."""

    def __init__(self, n_prompts: int, *, group_size: int, prompts_per_step: int, seed: int = 0) -> None:
        _positive(group_size=group_size, prompts_per_step=prompts_per_step)
        self.group_size, self.prompts_per_step = group_size, prompts_per_step
        self.stream = PromptStream(n_prompts, seed)

    def step(self, rollout: RolloutFn, ledger: RolloutLedger) -> AllocationStep:
        groups = rollout(self.stream.take(self.prompts_per_step), self.group_size)
        ledger.charge(groups, "uniform")
        return _finish(ledger, groups, sum(g.size for g in groups), 1)


class DynamicSamplingAllocator:
    """DAPO dynamic sampling: keep informative groups, refill with fresh batches up to ``max_rounds``."""

    def __init__(self, n_prompts: int, *, group_size: int, prompts_per_step: int, max_rounds: int = 4,
                 seed: int = 0) -> None:
        _positive(group_size=group_size, prompts_per_step=prompts_per_step, max_rounds=max_rounds)
        self.group_size, self.prompts_per_step, self.max_rounds = group_size, prompts_per_step, max_rounds
        self.stream = PromptStream(n_prompts, seed)

    def step(self, rollout: RolloutFn, ledger: RolloutLedger) -> AllocationStep:
        kept: list[Group] = []
        groups: list[Group] = []
        generated = rounds = 0
        while len(kept) < self.prompts_per_step and rounds < self.max_rounds:
            groups = rollout(self.stream.take(self.prompts_per_step), self.group_size)
            ledger.charge(groups, "dynamic")
            generated += sum(g.size for g in groups)
            kept += [g for g in groups if g.informative]
            rounds += 1
        if not kept:
            return _finish(ledger, groups, generated, rounds, fallback=True)
        return _finish(ledger, kept[: self.prompts_per_step], generated, rounds)


class PilotCommitAllocator:
    """Pilot-Commit (module docstring). ``n_pilot`` + ``n_commit`` = ``group_size``; survivors have pilot
    accuracy in [p_lo, 1 − p_hi]."""

    def __init__(self, n_prompts: int, *, n_pilot: int, n_commit: int, pool_size: int, prompts_per_step: int,
                 p_lo: float = 0.1, p_hi: float = 0.1, staleness: int = 5, max_rounds: int = 2,
                 seed: int = 0, screen: PromptScreen | None = None) -> None:
        _positive(n_pilot=n_pilot, pool_size=pool_size, prompts_per_step=prompts_per_step, max_rounds=max_rounds)
        if n_commit < 0 or staleness < 0:
            raise InputError(f"n_commit and staleness must be ≥ 0; you passed {n_commit}, {staleness}.")
        if not (0.0 <= p_lo and 0.0 <= p_hi and p_lo <= 1.0 - p_hi):
            raise InputError(f"need 0 ≤ p_lo ≤ 1 − p_hi (the kept band [p_lo, 1 − p_hi] must not be empty); "
                             f"you passed p_lo={p_lo}, p_hi={p_hi}.")
        self.n_pilot, self.n_commit, self.pool_size = n_pilot, n_commit, pool_size
        self.group_size = n_pilot + n_commit
        self.prompts_per_step, self.p_lo, self.p_hi = prompts_per_step, p_lo, p_hi
        self.staleness, self.max_rounds = staleness, max_rounds
        if screen is not None and screen.X.shape[0] != n_prompts:
            raise InputError(f"the screen holds {screen.X.shape[0]} prompts but the pool has {n_prompts}; "
                             "build it from the same prompt list.")
        self.screen = screen
        self._survival: float | None = None  # running pilot survival rate (tracked with a screen)
        self.stream = PromptStream(n_prompts, seed)
        self.evicted: set[int] = set()
        self.deferred_until: dict[int, int] = {}
        self.t = 0

    def _pool_target(self) -> int:
        """Prompts to pilot this round: ``pool_size``; with a screen, which raises the survival rate,
        only as many as are expected to yield B_p survivors at the survival rate seen so far (between
        B_p and ``pool_size``), so that fewer surplus survivors lose their pilot."""
        if self.screen is None or self._survival is None or self._survival <= 0:
            return self.pool_size
        return int(min(self.pool_size, max(self.prompts_per_step, np.ceil(self.prompts_per_step / self._survival))))

    def eligible(self, i: int) -> bool:
        return i not in self.evicted and self.deferred_until.get(i, -1) <= self.t

    def step(self, rollout: RolloutFn, ledger: RolloutLedger) -> AllocationStep:
        survivors: list[Group] = []
        pilots: list[Group] = []
        evicted: list[int] = []
        deferred: list[int] = []
        generated = rounds = 0
        skipped_before = self.screen.skipped if self.screen else 0
        piloted: set[int] = set()
        while not survivors and rounds < self.max_rounds:
            pool = self.stream.take(self._pool_target(), lambda i: self.eligible(i) and i not in piloted
                                    and (self.screen is None or self.screen.admits(i)))
            if not pool:
                break
            piloted.update(pool)
            pilots = rollout(pool, self.n_pilot)
            ledger.charge(pilots, "pilot")
            generated += sum(g.size for g in pilots)
            rounds += 1
            for g in pilots:
                if g.accuracy > 1.0 - self.p_hi:
                    self.evicted.add(g.prompt)
                    evicted.append(g.prompt)
                elif g.accuracy < self.p_lo:
                    self.deferred_until[g.prompt] = self.t + 1 + self.staleness
                    deferred.append(g.prompt)
                else:
                    survivors.append(g)
            if self.screen:
                kept = [self.p_lo <= g.accuracy <= 1.0 - self.p_hi for g in pilots]
                self.screen.observe([g.prompt for g in pilots], kept)
                rate = float(np.mean(kept)) if kept else 0.0
                self._survival = rate if self._survival is None else 0.8 * self._survival + 0.2 * rate
        fallback = not survivors and bool(pilots)
        if fallback:
            survivors = list(pilots)
        # most informative first; the stable sort keeps draw order among equals
        survivors.sort(key=lambda g: -g.accuracy * (1.0 - g.accuracy))
        chosen = survivors[: self.prompts_per_step]
        groups = chosen
        if chosen and self.n_commit:
            commits = rollout([g.prompt for g in chosen], self.n_commit)
            ledger.charge(commits, "commit")
            generated += sum(g.size for g in commits)
            groups = [p.extend(c) for p, c in zip(chosen, commits, strict=True)]
        self.t += 1
        return _finish(ledger, groups, generated, rounds, tuple(evicted), tuple(deferred), fallback=fallback,
                       skipped=self.screen.skipped - skipped_before if self.screen else 0)


def _finish(ledger: RolloutLedger, groups: list[Group], generated: int, rounds: int,
            evicted: tuple[int, ...] = (), deferred: tuple[int, ...] = (), *, fallback: bool = False,
            skipped: int = 0) -> AllocationStep:
    ledger.used += sum(g.size for g in groups)
    ledger.steps += 1
    return AllocationStep(groups, generated, rounds, evicted, deferred, fallback, skipped)


ALLOCATORS: tuple[str, ...] = ("uniform", "dynamic", "pilot-commit")


def make_allocator(name: str, n_prompts: int, *, group_size: int, prompts_per_step: int, seed: int = 0,
                   n_pilot: int | None = None, pool_size: int | None = None, **options: Any) -> Allocator:
    """An allocator by name (:data:`ALLOCATORS`). Pilot-Commit defaults: n_p = group_size // 2 and a pool
    of 2·prompts_per_step prompts; ``options`` go to the allocator (p_lo, p_hi, staleness, max_rounds, and
    for Pilot-Commit a ``screen``)."""
    if name == "uniform":
        return UniformAllocator(n_prompts, group_size=group_size, prompts_per_step=prompts_per_step, seed=seed)
    if name == "dynamic":
        return DynamicSamplingAllocator(n_prompts, group_size=group_size, prompts_per_step=prompts_per_step,
                                        seed=seed, **options)
    if name == "pilot-commit":
        n_p = n_pilot if n_pilot is not None else max(1, group_size // 2)
        if not 1 <= n_p <= group_size:
            raise InputError(f"n_pilot must be in 1..group_size={group_size}; you passed {n_p}.")
        return PilotCommitAllocator(n_prompts, n_pilot=n_p, n_commit=group_size - n_p,
                                    pool_size=pool_size or 2 * prompts_per_step, prompts_per_step=prompts_per_step,
                                    seed=seed, **options)
    raise InputError(f"unknown allocator {name!r}; use one of {', '.join(ALLOCATORS)}.")
