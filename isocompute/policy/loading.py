"""Loading a policy artifact whichever kind it holds: :class:`~isocompute.policy.policy.Policy` (one model)
or :class:`~isocompute.policy.multi.policy.MultiPolicy` (several), read from its config. The gateway and the
report load through :func:`load_policy`; ``Policy.load`` and ``MultiPolicy.load`` read their own kind only.
A policy directory with ``evidence.json`` loads as :class:`~isocompute.policy.evidence.serving.EvidencePolicy`.
"""

from __future__ import annotations

import json
from pathlib import Path

from isocompute.policy.cold_start import ColdStartPolicy  # noqa: F401  (re-exported: the gateway's cold start)
from isocompute.policy.evidence.serving import EvidencePolicy, read_evidence
from isocompute.policy.multi.policy import MultiPolicy
from isocompute.policy.policy import Policy


def load_policy(artifact_dir: str | Path) -> Policy:
    """The fitted policy in ``artifact_dir``: a :class:`MultiPolicy` when its config names model actions,
    else a :class:`Policy`. Raises :class:`~isocompute.errors.ArtifactError` with the fix when the
    directory is not a valid policy artifact."""
    meta = Path(artifact_dir) / "policy.json"
    try:
        multi = bool(json.loads(meta.read_text())["config"].get("model_actions"))
    except (OSError, KeyError, TypeError, ValueError, AttributeError):
        multi = False  # Policy.load says what is wrong with the artifact
    policy = (MultiPolicy if multi else Policy).load(artifact_dir)
    evidence = read_evidence(artifact_dir)  # evidence plans fitted into it (isocompute evidence)
    return policy if evidence is None else EvidencePolicy(policy, evidence)  # type: ignore[return-value]
