"""The embedded tiny model (isocompute.training.embedded) is what the default SFT recipe writes: its manifest
verifies, its recipe is today's default, and retraining the recipe's first steps here retraces its loss curve."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from isocompute.artifacts import load_manifest
from isocompute.training import sft
from isocompute.training.embedded import TINY_SFT, copy_tiny_sft


def test_the_embedded_checkpoint_is_the_default_recipe_and_copies_whole(tmp_path):
    manifest = load_manifest(TINY_SFT, kind=sft.KIND, schema_version=sft.SCHEMA_VERSION)
    recipe = {k: v for k, v in asdict(sft.SFTConfig()).items() if k != "mix"}
    assert {k: manifest["params"][k] for k in recipe} == recipe  # a changed default needs a new checkpoint
    assert "stopped_after" not in manifest["params"]
    out = copy_tiny_sft(tmp_path / "m")
    assert load_manifest(out, kind=sft.KIND, schema_version=sft.SCHEMA_VERSION)["files"] == manifest["files"]
    assert not (tmp_path / "m.copying").exists()


def test_retraining_the_first_steps_retraces_its_loss_curve(tmp_path):
    """Same data, initialisation and schedule: the first 20 steps' logged losses agree to 0.1% (float
    summation order differs between machines in the last bits, and 20 steps do not amplify that)."""
    logged = [json.loads(line) for line in (TINY_SFT / "train_log.jsonl").read_text().splitlines()]
    res = sft.train_sft(sft.SFTConfig(), tmp_path / "again", progress=False, stop_after=20)
    assert [e["step"] for e in res.log] == [1, 10, 20]
    assert json.loads((tmp_path / "again" / "manifest.json").read_text())["params"]["stopped_after"] == 20
    want = {e["step"]: e["loss"] for e in logged[:3]}
    for e in res.log:
        assert e["loss"] == pytest.approx(want[e["step"]], rel=1e-3)
