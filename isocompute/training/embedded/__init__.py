"""The embedded tiny model: the ``tiny-sft`` artifact that ``isocompute train sft --task arith --seed 0`` wrote
(the default recipe, 1200 steps, one thread: 196 s of training on this project's 2-core machine), shipped with the
package so the demo's loop starts from a trained model without spending most of its five minutes training it.

Its ``manifest.json`` holds the recipe and the checksum of every file; ``train_log.jsonl`` its loss curve
(``tests/test_embedded_sft.py`` retrains the first steps and finds the same curve). A model trained again here
differs from it in the last bits: float summation order differs between machines and thread counts, and the
tiny model's accuracy at 1200 steps is sensitive to it (docs/results.md, the demo).
"""

from __future__ import annotations

import shutil
from pathlib import Path

TINY_SFT = Path(__file__).parent / "tiny-sft"


def copy_tiny_sft(dest: str | Path) -> Path:
    """Copy the embedded checkpoint to ``dest`` (checked against its manifest first; written atomically)."""
    from isocompute.artifacts import load_manifest
    from isocompute.training.sft import KIND, SCHEMA_VERSION

    load_manifest(TINY_SFT, kind=KIND, schema_version=SCHEMA_VERSION)
    dest = Path(dest)
    tmp = dest.with_name(dest.name + ".copying")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(TINY_SFT, tmp, ignore=shutil.ignore_patterns("__init__.py", "__pycache__"))
    shutil.rmtree(dest, ignore_errors=True)
    tmp.replace(dest)
    return dest
