"""Fixtures shared across test modules: the random tiny model (weights seeded, saved once per session)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A saved random tiny Llama checkpoint (config, safetensors, tokenizer with chat template); read-only."""
    from isocompute.training.tiny import save_tiny

    return save_tiny(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="session")
def engine(tiny_dir):
    """The transformers engine on :func:`tiny_dir`, one torch thread."""
    from isocompute.engines.transformers_engine import TransformersEngine

    return TransformersEngine(tiny_dir, threads=1)


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory):
    """The two tiny arith models of :mod:`isocompute.training.tiny_world` (trained once per session, ~15 s
    CPU) and their outcome tables on the same 16 arith prompts × 8 samples (transformers engine):
    ``{name: (model_dir, table_path)}``; read-only."""
    from isocompute.stages.sample import SampleConfig, sample
    from isocompute.training.tiny_world import train_tiny_world

    root = tmp_path_factory.mktemp("tiny_world")
    out = {}
    for name in train_tiny_world(root):
        table = root / f"{name}.jsonl"
        sample(SampleConfig(task="arith", out=table, model=str(root / name), limit=16, n=8, max_tokens=64,
                                threads=1, grade_workers=1, progress=False))
        out[name] = (root / name, table)
    return out
