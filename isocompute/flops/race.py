"""The RACE parameter–token FLOP convention (seed 002, "Compute Accounting"), as a named alternative.

RACE decomposes post-training compute as F_total = F_rollout + F_update + F_reward with

    F_rollout = c_fwd · (N + R) · T_rollout
    F_update  = c_bwd · N · f_eff · T_update,   f_eff = a + (1 − a) · N_LoRA / N
    ρ         = F_update / F_total

N is the policy's parameter count, R the reward model's (0 for rule-based rewards), T_rollout and
T_update the tokens generated and trained on, and a (default 0.85) the share of update cost that
depends on the frozen backbone (forward passes, activations, shared computation). The paper leaves the
constants unstated; we take c_fwd = 2 and c_bwd = 6 so that full fine-tuning (N_LoRA = N → f_eff = 1)
gives the familiar 6·N·T.

Reading the formulas: the paper folds reward inference into the rollout term via (N + R). We report it
separately — rollout = c_fwd·N·T_rollout, reward = c_fwd·R·T_reward — so that F_total is not counted
twice; with T_reward = T_rollout the two add up to the paper's F_rollout exactly. In the ledger
(:mod:`isocompute.flops.ledger`) T_rollout is every token the policy processes while sampling
(prefilled prompt tokens plus completion tokens) and T_reward every token the reward model reads.

How it differs from the analytic count (:mod:`isocompute.flops.analytic`):

* N is all parameters (embeddings included), not the matmul weights; there is no attention term, so
  cost does not grow with context; a prompt costs the same per token as a completion.
* LoRA: the analytic count charges the frozen base 4·N_matmul per token (forward + activation
  backward) and the adapters 6·N_LoRA, i.e. f_eff = 2/3 + N_LoRA/N in RACE's terms; RACE charges
  a = 0.85 of 6N, about 28% more for the base, and only 0.9·N_LoRA for the adapters.
* Reward: RACE charges R per rollout token; the analytic count runs the reward model over each
  prompt + completion.

Example: N = 1.5e9, LoRA N_LoRA = 1.5e7 (f_LoRA = 0.01, f_eff = 0.85 + 0.15·0.01 = 0.8515),
T_rollout = 1e6, T_update = 1e6, no reward model:
rollout = 2·1.5e9·1e6 = 3e15, update = 6·1.5e9·0.8515·1e6 = 7.6635e15, ρ = 7.6635 / 10.6635 ≈ 0.7187.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from isocompute.errors import InputError
from isocompute.flops.breakdown import FlopBreakdown


@dataclass(frozen=True)
class RaceConvention:
    """Constants of the RACE convention; see the module docstring."""

    c_fwd: float = 2.0
    c_bwd: float = 6.0
    a: float = 0.85

    def __post_init__(self) -> None:
        if not 0.0 <= self.a <= 1.0:
            raise InputError(
                f"RACE's a is the frozen-backbone share of update cost and must lie in [0, 1]; got {self.a}."
            )
        if self.c_fwd <= 0 or self.c_bwd <= 0:
            raise InputError(
                f"c_fwd and c_bwd must be positive FLOPs per parameter-token; got {self.c_fwd}, {self.c_bwd}."
            )

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    def f_eff(self, n_params: float, n_lora: float | None = None) -> float:
        """a + (1 − a)·N_LoRA/N; ``n_lora=None`` means full fine-tuning (f_eff = 1)."""
        if n_lora is None:
            return 1.0
        if n_params <= 0 or not 0 <= n_lora <= n_params:
            raise InputError(
                f"need 0 <= N_LoRA <= N and N > 0; got N_LoRA={n_lora}, N={n_params}. Pass n_lora=None "
                f"for full fine-tuning."
            )
        return self.a + (1.0 - self.a) * n_lora / n_params

    def rollout(self, n_params: float, tokens: float) -> float:
        """c_fwd · N · T_rollout (the policy's share of the paper's F_rollout)."""
        return self.c_fwd * n_params * tokens

    def reward(self, reward_params: float, tokens: float) -> float:
        """c_fwd · R · T_reward."""
        return self.c_fwd * reward_params * tokens

    def update(self, n_params: float, tokens: float, n_lora: float | None = None) -> float:
        """c_bwd · N · f_eff · T_update."""
        return self.c_bwd * n_params * self.f_eff(n_params, n_lora) * tokens


def race_flops(
    n_params: float,
    *,
    rollout_tokens: float,
    update_tokens: float,
    n_lora: float | None = None,
    reward_params: float = 0.0,
    reward_tokens: float | None = None,
    convention: RaceConvention | None = None,
) -> FlopBreakdown:
    """RACE's rollout / update / reward split of one run; ``reward_tokens`` defaults to ``rollout_tokens``.

    >>> b = race_flops(1.5e9, rollout_tokens=1e6, update_tokens=1e6, n_lora=1.5e7)
    >>> round(b.rho, 4)
    0.7187
    """
    conv = convention or RaceConvention()
    t_reward = rollout_tokens if reward_tokens is None else reward_tokens
    return FlopBreakdown(
        rollout=conv.rollout(n_params, rollout_tokens),
        update=conv.update(n_params, update_tokens, n_lora),
        reward=conv.reward(reward_params, t_reward),
    )
