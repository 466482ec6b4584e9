"""What the deploy tests share: finding the tools (``make deploy-tools`` installs them) and rendering the
manifests. A missing tool skips a test here and fails it in CI (``CI`` set), where the Makefile installed it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
OVERLAYS = ("cpu", "gpu", "keda", "capture")
DASHBOARD = K8S / "base" / "isocompute-dashboard.json"
RULES = K8S / "base" / "prometheusrule.yaml"


def tool(name: str) -> str:
    """The path of ``name``: beside this Python first (pip-installed kubectl, yamllint), then on PATH."""
    local = Path(sys.executable).parent / name
    found = str(local) if local.is_file() else shutil.which(name)
    if found is None:
        msg = f"{name} is not installed; run `make deploy-tools` (Debian packages and the dev extra)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return found


def render(overlay: str) -> list[dict]:
    """``kubectl kustomize deploy/k8s/overlays/<overlay>``'s objects."""
    out = subprocess.run([tool("kubectl"), "kustomize", str(K8S / "overlays" / overlay)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def find(objs: list[dict], kind: str, name: str) -> dict:
    hits = [o for o in objs if o["kind"] == kind and o["metadata"]["name"].startswith(name)]
    assert len(hits) == 1, f"{kind} {name}: {len(hits)} found"
    return hits[0]


def alert_rules() -> list[dict]:
    """The PrometheusRule's rules, in order."""
    spec = yaml.safe_load(RULES.read_text())["spec"]
    return [r for g in spec["groups"] for r in g["rules"]]
