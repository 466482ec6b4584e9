"""A policy's artifact directory: what :meth:`Policy.save` writes and :meth:`Policy.load` reads back.

Manifest kind ``policy``, schema 1: ``policy.json`` (config — with the
probe spec or null —, actions, action costs (probe and extra features included), the extra
features' cost per request ``feature_cost``, budget range, default learner and why,
feature names, the training prompt lengths the heuristic baseline uses, per learner the never-worse
chain ``fallback`` — rule and tests at each grid budget —, and ``training_data``: what a ragged table
lost, :mod:`isocompute.solver.ragged`; ``tokens_per_sample``: one sample's mean completion tokens on the
training table, or null; ``latency``: the latency tables of :mod:`isocompute.policy.latency`, or null),
the plan menu ``plans`` by stable names (``RULE@SCHEDULE``,
read back by :func:`isocompute.solver.plans.plan.parse_plan`; action a is ``plans[a]``) with each plan's mean
training utility, expected samples and waves (``plan_utility``, ``plan_samples``, ``plan_waves``),
``features.json`` + ``features_svd.npz``, and per learner ``<learner>/model_<j>.txt`` (LightGBM text,
one per member; a utility member with a cost head also ``<learner>/cost_<j>.txt``) +
``<learner>/state.json`` (hyper-parameters, calibration table), plus any ``extra_files`` the caller
adds (``isocompute fit`` caches the training prompts' probe values there). No pickle. ``load``
refuses another kind, schema or a checksum mismatch; artifacts written before the probe, the extra
features or the fallback existed load with ``probe=None``, ``feature_extras=()``, ``feature_cost_ = 0``
and the learned rule serving every budget; artifacts written before plans (integer actions) load as
the one-wave plans ``none@k`` (samples k, one wave). A multi-model policy (config ``models`` and
``model_actions``) stores its actions by stable names in ``plans`` too (``MODEL/PLAN`` stages,
:func:`isocompute.solver.models.actions.parse_action`) and loads as
:class:`~isocompute.policy.multi.policy.MultiPolicy` only (:func:`isocompute.policy.loading.load_policy`
reads either kind).

Ignores: how the policy was fitted (:mod:`isocompute.policy.policy`); the files are only read back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from isocompute.artifacts import artifact_writer, load_manifest
from isocompute.errors import ArtifactError, InputError
from isocompute.policy.config import PolicyConfig
from isocompute.policy.fallback import LEARNED, RuleChain
from isocompute.policy.features.prompt import PromptFeatures
from isocompute.policy.latency import LatencyTables
from isocompute.policy.learn.calibration import Calibration
from isocompute.policy.learn.crossfit import N_CALIBRATION, FittedLearner
from isocompute.policy.learn.learners import OracleClassifier, UtilityRegressor, budget_grid

KIND = "policy"
SCHEMA_VERSION = 1


def save_policy(policy: Any, out_dir: str | Path, *, inputs: dict[str, str] | None = None,
                extra_files: Mapping[str, bytes] | None = None) -> Path:
    """Write a fitted policy's artifact atomically (nothing is left behind if any part fails)."""
    with artifact_writer(out_dir, kind=KIND, schema_version=SCHEMA_VERSION, inputs=inputs,
                         params=policy.config.to_dict()) as d:
        policy.features_.save(d)
        meta = {
            "config": policy.config.to_dict(),
            "actions": list(policy.config.actions),
            "plans": [p.name for p in policy.plans],
            "plan_utility": policy.plan_utility_.tolist(),
            "plan_samples": policy.plan_samples_.tolist(),
            "plan_waves": policy.plan_waves_.tolist(),
            "action_costs": policy.action_costs_.tolist(),
            "cost_unit": policy.config.cost_unit,
            "budget_range": list(policy.config.budget_range),
            "default_learner": policy.default_learner_,
            "selection": policy.selection_,
            "learners": sorted(policy.learners_),
            "n_train": policy.n_train_,
            "probe": None if policy.config.probe is None else asdict(policy.config.probe),
            "feature_cost": policy.feature_cost_,
            "feature_names": policy.feature_names,
            "heuristic": {"train_prompt_lengths": policy.train_lengths_.tolist()},
            "fallback": {name: chain.to_dict() for name, chain in policy.fallback_.items()},
            "training_data": getattr(policy, "training_data_", None),
            "tokens_per_sample": getattr(policy, "tokens_per_sample_", None),
            "latency": None if getattr(policy, "latency_", None) is None else policy.latency_.to_dict(),
            "fixed_budgets": getattr(policy, "fixed_budgets_", None),
        }
        (d / "policy.json").write_text(json.dumps(meta, indent=2) + "\n")
        for name, f in policy.learners_.items():
            (d / name).mkdir()
            for j, model in enumerate(f.models):
                (d / name / f"model_{j}.txt").write_text(model.booster_.model_to_string())
                head = getattr(model, "cost_head_", None)
                if head is not None and head.booster_ is not None:
                    (d / name / f"cost_{j}.txt").write_text(head.booster_.model_to_string())
            state = {"models": [m.state() for m in f.models], "calibration": f.calibration.to_dict()}
            (d / name / "state.json").write_text(json.dumps(state, indent=2) + "\n")
        for fname, data in (extra_files or {}).items():
            if Path(fname).name != fname or (d / fname).exists():
                raise InputError(f"extra file {fname!r} must be a new plain file name in the artifact.")
            (d / fname).write_bytes(data)
    return Path(out_dir)


def load_policy(cls: Any, artifact_dir: str | Path) -> Any:
    """Read an artifact into a new ``cls`` (:class:`Policy`); ArtifactError on a kind/schema/checksum
    mismatch or a malformed file."""
    d = Path(artifact_dir)
    manifest = load_manifest(d, kind=KIND, schema_version=SCHEMA_VERSION)
    try:
        meta = json.loads((d / "policy.json").read_text())
        config = PolicyConfig.from_dict(meta["config"])
        if config.model_actions and not getattr(cls, "MULTI_MODEL", False):
            raise ArtifactError(f"{d} holds a multi-model policy; load it with "
                                "isocompute.policy.loading.load_policy(DIR), which returns whichever kind it holds.")
        obj = cls(config)
        obj.features_ = PromptFeatures.load(d)
        obj.action_costs_ = np.asarray(meta["action_costs"], dtype=np.float64)
        if [p.name for p in obj.plans] != meta.get("plans", [p.name for p in obj.plans]):
            raise ValueError("policy.json's plans differ from its config's")
        ks = np.asarray(obj.actions, dtype=np.float64)  # before plans: one-wave plans, k samples, one wave
        obj.plan_samples_ = np.asarray(meta.get("plan_samples", ks), dtype=np.float64)
        obj.plan_waves_ = np.asarray(meta.get("plan_waves", np.ones_like(ks)), dtype=np.float64)
        obj.plan_utility_ = np.asarray(meta.get("plan_utility", np.full_like(ks, np.nan)), dtype=np.float64)
        obj.feature_cost_ = float(meta.get("feature_cost", 0.0))  # absent before the extra features
        obj.default_learner_ = meta["default_learner"]
        obj.selection_ = meta["selection"]
        obj.n_train_ = meta["n_train"]
        obj.training_data_ = meta.get("training_data")
        obj.tokens_per_sample_ = meta.get("tokens_per_sample")  # absent before latency budgets
        obj.latency_ = LatencyTables.from_dict(meta["latency"]) if meta.get("latency") else None
        obj.fixed_budgets_ = meta.get("fixed_budgets")  # absent before the held-out search: the budget itself
        obj.train_lengths_ = np.asarray(meta["heuristic"]["train_prompt_lengths"], dtype=np.int64)
        grid = budget_grid(*obj.config.budget_range, N_CALIBRATION)
        chains = meta.get("fallback") or {}  # absent before the fallback: the learned rule everywhere
        obj.fallback_ = {name: RuleChain.from_dict(chains[name]) if name in chains else RuleChain.single(LEARNED, grid)
                         for name in meta["learners"]}
        obj.learners_ = {}
        for name in meta["learners"]:
            state = json.loads((d / name / "state.json").read_text())
            if name == "classifier":
                models = [OracleClassifier.from_state(st, (d / name / f"model_{j}.txt").read_text())
                          for j, st in enumerate(state["models"])]
            else:
                models = [UtilityRegressor.from_state(st, (d / name / f"model_{j}.txt").read_text(),
                                                      _read_if(d / name / f"cost_{j}.txt"))
                          for j, st in enumerate(state["models"])]
            if len(models) != obj.config.calibration_folds:
                raise ValueError(f"{name} has {len(models)} members, the config says "
                                 f"{obj.config.calibration_folds}")
            obj.learners_[name] = FittedLearner(models, Calibration.from_dict(state["calibration"]))
    except (OSError, KeyError, TypeError, ValueError, InputError) as e:
        raise ArtifactError(f"{d}: the policy artifact is incomplete or malformed ({type(e).__name__}: {e}); "
                            "re-create it with `isocompute fit`.") from e
    obj.manifest_ = manifest
    if hasattr(obj, "load_extras"):  # a multi-model policy's escalate scores
        obj.load_extras(d)
    return obj


def _read_if(path: Path) -> str | None:
    return path.read_text() if path.is_file() else None
