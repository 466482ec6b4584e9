import json

import pytest

from isocompute.artifacts import artifact_writer, atomic_write_text, load_manifest, sha256_file
from isocompute.errors import ArtifactError


def test_roundtrip_and_checksum(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text('{"a": 1}\n')
    out = tmp_path / "art"
    with artifact_writer(out, kind="solution", schema_version=1, inputs={"in": sha256_file(src)},
                         params={"budget": 4}) as d:
        (d / "payload.json").write_text("[1, 2]")
    m = load_manifest(out, kind="solution", schema_version=1)
    assert m["params"] == {"budget": 4}
    assert m["inputs"]["in"] == sha256_file(src)
    assert set(m["files"]) == {"payload.json"}
    (out / "payload.json").write_text("[1, 3]")
    with pytest.raises(ArtifactError, match="checksum of payload.json"):
        load_manifest(out, kind="solution", schema_version=1)


@pytest.mark.parametrize(
    ("kind", "version", "match"),
    [("policy", 1, "expected 'policy'"), ("solution", 2, "schema version 1")],
)
def test_refuses_wrong_kind_or_version(tmp_path, kind, version, match):
    out = tmp_path / "art"
    with artifact_writer(out, kind="solution", schema_version=1) as d:
        (d / "x").write_text("x")
    with pytest.raises(ArtifactError, match=match):
        load_manifest(out, kind=kind, schema_version=version)


def test_failure_leaves_nothing_behind(tmp_path):
    out = tmp_path / "art"
    with pytest.raises(RuntimeError):
        with artifact_writer(out, kind="solution", schema_version=1) as d:
            (d / "x").write_text("x")
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_failure_keeps_previous_artifact(tmp_path):
    out = tmp_path / "art"
    with artifact_writer(out, kind="solution", schema_version=1) as d:
        (d / "x").write_text("old")
    with pytest.raises(RuntimeError):
        with artifact_writer(out, kind="solution", schema_version=1) as d:
            (d / "x").write_text("new")
            raise RuntimeError("boom")
    assert (out / "x").read_text() == "old"
    assert json.loads((out / "manifest.json").read_text())["kind"] == "solution"


def test_missing_manifest(tmp_path):
    with pytest.raises(ArtifactError, match="manifest.json is missing"):
        load_manifest(tmp_path, kind="solution", schema_version=1)


def test_atomic_write_text(tmp_path):
    p = tmp_path / "sub" / "f.txt"
    atomic_write_text(p, "hello")
    assert p.read_text() == "hello"
    assert [q.name for q in p.parent.iterdir()] == ["f.txt"]


def test_artifact_directory_is_readable_by_others(tmp_path):
    """mkdtemp's 0700 made artifacts unreadable to the gateway's non-root container user."""
    with artifact_writer(tmp_path / "a", kind="demo", schema_version=1) as d:
        (d / "x.txt").write_text("x")
    assert (tmp_path / "a").stat().st_mode & 0o777 == 0o755
