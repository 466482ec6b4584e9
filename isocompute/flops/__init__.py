"""FLOP accounting from a model config: prefill, decode, updates, LoRA, reward model, ledgers.

- :mod:`~isocompute.flops.model` — :class:`ModelFlops` (the FLOP-relevant shape of a model) and
  :func:`load_model_flops` (config.json path, model directory, ``PretrainedConfig``);
- :mod:`~isocompute.flops.analytic` — matmul + attention counts of prefill, decode, requests with and
  without prefix sharing, full and LoRA updates, reward-model passes;
- :mod:`~isocompute.flops.race` — the RACE parameter–token convention (c_fwd, c_bwd, f_eff, a);
- :mod:`~isocompute.flops.logprobs` — the measured price of asking an engine for logprobs, a factor on tokens;
- :mod:`~isocompute.flops.breakdown` / :mod:`~isocompute.flops.ledger` — rollout / update / reward
  totals with the update fraction ρ, accumulated, merged and saved as JSON.
"""

from isocompute.flops.analytic import (
    attention_flops,
    decode_flops,
    forward_flops,
    lora_update_flops,
    prefill_flops,
    request_flops,
    reward_flops,
    train_flops,
)
from isocompute.flops.breakdown import FlopBreakdown
from isocompute.flops.ledger import FlopLedger
from isocompute.flops.model import LORA_TARGETS_ALL, ModelFlops, load_model_flops
from isocompute.flops.race import RaceConvention, race_flops

__all__ = [
    "LORA_TARGETS_ALL",
    "FlopBreakdown",
    "FlopLedger",
    "ModelFlops",
    "RaceConvention",
    "attention_flops",
    "decode_flops",
    "forward_flops",
    "load_model_flops",
    "lora_update_flops",
    "prefill_flops",
    "race_flops",
    "request_flops",
    "reward_flops",
    "train_flops",
]
