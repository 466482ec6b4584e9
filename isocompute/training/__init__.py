"""Tiny model and tokenizer, SFT, compute-aligned GRPO, rollout allocation, sweeps."""
