"""The refit stage: captured traffic → a policy fitted under the consensus target → compared → written → reloaded.

``isocompute refit CAPTURE_DIR --out DIR [--policy SERVING_DIR] [--gateway URL]``:

1. **read** the gateway's shards (:func:`isocompute.stages.captured.read_shards`: a torn last line is named
   and skipped) and merge them into one outcome table, one record per prompt
   (:func:`~isocompute.stages.captured.captured_table`), written to ``table`` (default
   ``CAPTURE_DIR/captured.jsonl``, mode 0600); prompts with fewer samples than the largest action are left out;
2. **compare** on captured prompts neither policy was fitted on: a seeded ``holdout`` share is drawn among
   the prompts the serving policy was not fitted on (a refit records its prompts' digests in the policy's
   ``training_data``), a policy is fitted on the rest under the table's target (consensus for traffic:
   :mod:`isocompute.solver.votes.consensus`), and on the held-out part (``holdout``, 30%) the new policy and
   the serving one (``policy``; the cold-start plans, :mod:`isocompute.policy.cold_start`, when there is
   none) each decide at every budget of ``budgets`` (in x: one sample's mean completion tokens); each
   prompt's chosen plan is scored exactly on its samples (accuracy under the target, expected tokens).
   The policy is fitted in the tokens unit over the default and parallel-stop plans, as the cold start is
   priced, so a client's ``"4x"`` means the same before and after the reload;
3. **write** only where the new policy is not worse: its held-out accuracy, averaged over the budgets, at
   least the serving one's at matched tokens (the serving policy's accuracy-vs-tokens curve, traced at
   budgets × 0.7 … 1.4, read at the new policy's realised tokens). Then the policy is refitted on every captured prompt
   (the comparison chose the recipe; the written policy uses all the data) and saved to ``out``;
4. **reload**: with ``gateway``, ``POST {gateway}/admin/reload {"policy_dir": out}`` with the admin key
   from ``$ISOCOMPUTE_ADMIN_KEY`` — the gateway swaps the policy between requests (a request holds the policy
   it started with), so none is dropped or answered twice.

A policy whose prompts were captured as salted hashes (no ``capture_prompts``) sees no prompt text: its
learned rule cannot beat the fixed plan there, and the never-worse chain serves the fixed plan.

Ignores: traffic drift between the capture and the reload (the gateway's budget controller absorbs it).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from isocompute.errors import InputError
from isocompute.stages.inputs import target_option
from isocompute.stages.options import option
from isocompute.stages.parsing import parse_action_set, parse_budgets

__all__ = ["RefitConfig", "RefitResult", "refit"]

ADMIN_KEY_ENV = "ISOCOMPUTE_ADMIN_KEY"


@dataclass(kw_only=True)
class RefitConfig:
    """One refit: the options of ``isocompute refit`` (each documented on its field)."""

    capture: Path = option(flag="capture", type=Path, help="the gateway's capture directory (serve --capture DIR)")
    out: Path = option(type=Path, help="policy directory to write when the new policy is not worse")
    policy: Path | None = option(None, type=Path, help="the policy the gateway serves now (default: the cold-start "
                                                       "plans, what a gateway without one serves)")
    table: Path | None = option(None, type=Path, help="where to write the captured outcome table (default "
                                                      "CAPTURE/captured.jsonl)")
    actions: tuple[int, ...] = option((1, 2, 4, 8, 16), text="1,2,4,8,16", parse=parse_action_set,
                                      help="sample counts k of the uniform ladder; plans are capped at the largest")
    budgets: list[float] = option([2.0, 4.0, 8.0], text="2,4,8", parse=parse_budgets,
                                  help="budgets the two policies are compared at, in multiples of one sample's mean "
                                       "completion tokens on the captured table (2 = 2x)")
    target: str | None = target_option()
    holdout: float = option(0.3, type=float, help="share of captured prompts held out for the comparison")
    seed: int = option(0, type=int, help="seed of the split and the fits")
    n_rounds: int = option(50, type=int, help="LightGBM boosting rounds per member")
    gateway: str | None = option(None, help=f"a running gateway's base URL to reload (admin key in ${ADMIN_KEY_ENV})")
    force: bool = option(False, action="store_true", help="write (and reload) the new policy even when it is worse")

    def __post_init__(self) -> None:
        self.capture, self.out = Path(self.capture), Path(self.out)
        if not 0.05 <= self.holdout <= 0.5:
            raise InputError(f"--holdout must be in [0.05, 0.5] (a share of the captured prompts); got {self.holdout}")


@dataclass
class RefitResult:
    """What the refit did: the table's size and target, the comparison per budget, whether it wrote and
    reloaded, and the lines skipped reading the shards."""

    prompts: int
    rows: int
    target: str
    compare: list[dict[str, Any]]
    written: bool
    reloaded: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"prompts": self.prompts, "rows": self.rows, "target": self.target, "compare": self.compare,
                "written": self.written, "reloaded": self.reloaded, "notes": self.notes}


def refit(cfg: RefitConfig) -> RefitResult:
    """Run the stage (module docstring)."""
    import numpy as np

    from isocompute.policy.cold_start import ColdStartPolicy
    from isocompute.policy.loading import load_policy
    from isocompute.solver.costs import token_multiple_of
    from isocompute.solver.votes.consensus import with_target
    from isocompute.stages.captured import captured_table, read_shards

    shards = read_shards(cfg.capture)
    table = captured_table(shards.rows)
    k_max = max(cfg.actions)
    keep = np.flatnonzero(table.n_samples >= k_max)
    if keep.size < 20:
        raise InputError(f"{keep.size} captured prompts have {k_max} samples or more; refit needs at least 20 "
                         "(raise --explore, or capture_samples to the largest action, and send more traffic).")
    table = with_target(table.subset(keep), cfg.target)
    path = _write_table(table, cfg.table or cfg.capture / "captured.jsonl")
    unit = token_multiple_of(table.mean_completion_tokens)  # one sample's mean tokens: what 1x is
    serving = load_policy(cfg.policy) if cfg.policy is not None else ColdStartPolicy(unit)
    keys = [prompt_key(p) for p in table.prompts]
    seen = set((getattr(getattr(serving, "policy", serving), "training_data_", None) or {}).get("captured_prompts") or ())
    fresh = np.flatnonzero([k not in seen for k in keys])  # prompts the serving policy was not fitted on
    n_test = max(4, int(round(cfg.holdout * len(table))))
    if fresh.size < n_test:
        raise InputError(f"only {fresh.size} captured prompts are new to the serving policy {cfg.policy}; the "
                         f"comparison holds out {n_test}: send more traffic (or lower --holdout).")
    test = np.sort(np.random.default_rng(cfg.seed).permutation(fresh)[:n_test])
    train = np.setdiff1d(np.arange(len(table)), test)
    new = _fit(table.subset(train), cfg)
    held = table.subset(test)
    compare = _compare(new, serving, held, cfg.budgets, unit)
    d_acc = float(np.mean([c["gain"] for c in compare]))
    better = d_acc >= 0
    result = RefitResult(len(table), len(shards.rows), table.target, compare, False, notes=shards.notes())
    result.notes.append(f"held out {len(test)} of {len(table)} captured prompts: accuracy {100 * d_acc:+.2f} pt "
                        "against the serving policy at the new one's tokens → "
                        + ("not worse: written" if better else "worse: kept the serving policy")
                        + (" (written anyway: --force)" if cfg.force and not better else ""))
    if not (better or cfg.force):
        return result
    final = _fit(table, cfg)
    final.training_data_["captured_prompts"] = keys  # a later refit holds out only prompts this one never saw
    final.save(cfg.out, inputs={"captured": _sha256(path)})
    result.written = True
    if cfg.gateway:
        result.reloaded = reload_gateway(cfg.gateway, cfg.out)
    return result


def prompt_key(text: str) -> str:
    """A short digest of a captured prompt (its text, or the gateway's salted hash of it)."""
    import hashlib

    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def _fit(table: Any, cfg: RefitConfig) -> Any:
    from isocompute.policy.fitting import fit_policy
    from isocompute.policy.policy import PolicyConfig
    from isocompute.stages.parsing import parse_plans

    config = PolicyConfig(actions=cfg.actions, plans=parse_plans(None, cfg.actions, "majority", parallel=True),
                          cost_unit="tokens", seed=cfg.seed, n_rounds=cfg.n_rounds, target=table.target)
    return fit_policy(table, config, feasible_budgets=True)


def _compare(new: Any, serving: Any, held: Any, budgets: list[float], unit: float) -> list[dict[str, Any]]:
    """Per budget both policies' held-out scores and the new one's gain at matched tokens: the serving policy's
    accuracy interpolated at the new one's realised tokens on its own curve (budgets × 0.7 … 1.4, running
    maximum: a policy can always spend less for no more accuracy), held at its ends."""
    import numpy as np

    pts = sorted((s["cost"], s["accuracy"]) for b in budgets for f in (0.7, 0.85, 1.0, 1.2, 1.4)
                 for s in [_score(serving, held, b * f, unit)])
    xs, ys = np.array([p[0] for p in pts]), np.maximum.accumulate(np.array([p[1] for p in pts]))
    out = []
    for b in budgets:
        n, s = _score(new, held, b, unit), _score(serving, held, b, unit)
        out.append({"budget": b, "new": n, "serving": s, "gain": n["accuracy"] - float(np.interp(n["cost"], xs, ys))})
    return out


def _score(policy: Any, table: Any, budget: float, unit: float) -> dict[str, float]:
    """Accuracy (under the table's target) and expected tokens (in ``unit``: x) of the plans ``policy``
    chooses on ``table``'s prompts at ``budget`` x (clipped to its range), each scored exactly on the
    prompt's samples."""
    import numpy as np

    from isocompute.policy.plans.arrays import plan_arrays
    from isocompute.solver.plans.plan import Plan

    lo, hi = policy.budget_range
    cost_unit = getattr(policy, "cost_unit", None) or policy.config.cost_unit
    if cost_unit == "flops":
        raise InputError("the serving policy prices in FLOPs; refit compares policies in tokens — refit it with "
                         "--cost-unit tokens first (isocompute fit), or compare with --policy omitted.")
    b = budget * unit if cost_unit == "tokens" else budget  # a samples policy: b samples ≈ b x tokens
    d = policy.decide(table.prompts, float(min(max(b, lo), hi)))
    plans = list(d.plans) or [Plan((int(k),)) for k in d.k]
    menu = {p.name: p for p in plans}
    arr = plan_arrays(table, list(menu.values()), cost_unit="tokens")
    col = np.array([list(menu).index(p.name) for p in plans])
    rows = np.arange(len(table))
    return {"accuracy": float(arr.utility[rows, col].mean()), "cost": float(arr.cost[rows, col].mean()) / unit,
            "plans": len(menu)}


def _write_table(table: Any, path: Path) -> Path:
    """The captured table as an outcome table (JSONL, mode 0600: it may hold prompts)."""
    from isocompute.solver.outcomes import record_to_json

    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        for r in table.records:
            f.write(record_to_json(r) + "\n")
    os.replace(tmp, path)
    return path


def _sha256(path: Path) -> str:
    from isocompute.artifacts import sha256_file

    return sha256_file(path)


def reload_gateway(url: str, policy_dir: Path, *, timeout: float = 60.0) -> dict[str, Any]:
    """``POST {url}/admin/reload`` with the admin key from ``$ISOCOMPUTE_ADMIN_KEY``; its JSON answer."""
    import httpx

    key = os.environ.get(ADMIN_KEY_ENV)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        r = httpx.post(url.rstrip("/") + "/admin/reload", json={"policy_dir": str(Path(policy_dir).resolve())},
                       headers=headers, timeout=timeout)
    except httpx.HTTPError as e:
        raise InputError(f"could not reach the gateway at {url} to reload ({e}); the policy is written at "
                         f"{policy_dir}: reload it with POST /admin/reload.") from None
    if r.status_code != 200:
        raise InputError(f"the gateway at {url} refused the reload ({r.status_code}: {r.text[:300]}); set "
                         f"${ADMIN_KEY_ENV} to its admin key. The policy is written at {policy_dir}.")
    return json.loads(r.text)
