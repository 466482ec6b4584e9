"""FLOP accounting from a model config: prefill, decode, updates, LoRA, reward model, ledgers."""
