"""Artifact directories: a manifest plus payload files, written atomically, verified on load.

Layout of an artifact directory::

    DIR/manifest.json   {"kind", "schema_version", "package_version", "created_at",
                         "inputs": {name: sha256}, "params": {...}, "files": {name: sha256}}
    DIR/<payload files>

Writing happens in a sibling temporary directory that is renamed over ``DIR`` only when every file
and the manifest are complete, so an interrupted stage never leaves a half-written artifact behind.
Loading checks the kind, the schema version and every payload file's sha256.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from isocompute import __version__
from isocompute.errors import ArtifactError

MANIFEST = "manifest.json"


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same directory and an atomic rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def artifact_writer(
    out_dir: str | os.PathLike[str],
    *,
    kind: str,
    schema_version: int,
    inputs: dict[str, str] | None = None,
    params: dict[str, Any] | None = None,
) -> Iterator[Path]:
    """Yield a temporary directory to fill with payload files; on success, add the manifest and move it
    to ``out_dir`` (replacing an older artifact there). On any exception nothing is left behind.

    ``inputs`` maps an input's name to its sha256 (see :func:`sha256_file`).
    """
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
    # mkdtemp makes 0700; an artifact is meant to be read by others (e.g. mounted into the gateway's
    # container, which runs as another user), so give it a normal directory's mode.
    tmp.chmod(0o755)
    try:
        yield tmp
        files = {
            p.relative_to(tmp).as_posix(): sha256_file(p)
            for p in sorted(tmp.rglob("*"))
            if p.is_file() and p.name != MANIFEST
        }
        manifest = {
            "kind": kind,
            "schema_version": schema_version,
            "package_version": __version__,
            "created_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "inputs": inputs or {},
            "params": params or {},
            "files": files,
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        if out.exists():
            old = out.with_name(f".{out.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def load_manifest(artifact_dir: str | os.PathLike[str], *, kind: str, schema_version: int) -> dict[str, Any]:
    """Read and verify an artifact's manifest: kind, schema version and every payload checksum.

    Raises :class:`ArtifactError` with a message naming the fix when anything does not match.
    """
    d = Path(artifact_dir)
    mpath = d / MANIFEST
    if not mpath.is_file():
        raise ArtifactError(f"{d} is not a {kind} artifact: {MANIFEST} is missing. Re-create it with the "
                            f"command that writes {kind} artifacts.")
    try:
        manifest = json.loads(mpath.read_text())
    except json.JSONDecodeError as e:
        raise ArtifactError(f"{mpath} is not valid JSON ({e}); re-create the artifact.") from e
    if manifest.get("kind") != kind:
        raise ArtifactError(f"{d} holds a {manifest.get('kind')!r} artifact, expected {kind!r}.")
    if manifest.get("schema_version") != schema_version:
        raise ArtifactError(
            f"{d} has schema version {manifest.get('schema_version')} (written by isocompute "
            f"{manifest.get('package_version')}); this isocompute {__version__} reads version "
            f"{schema_version}. Re-create the artifact with this version."
        )
    for name, digest in manifest.get("files", {}).items():
        p = d / name
        if not p.is_file():
            raise ArtifactError(f"{d}: payload file {name} listed in the manifest is missing; re-create the artifact.")
        if sha256_file(p) != digest:
            raise ArtifactError(f"{d}: checksum of {name} does not match its manifest (the file was changed "
                                "after it was written); re-create the artifact.")
    return manifest
