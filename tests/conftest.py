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
