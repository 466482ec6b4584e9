"""``isocompute fit``: learn a budget-conditioned allocation policy from an outcome table.

Reads the outcome table (our JSONL schema, or a Qwen2.5-Math CoT evaluation dump, detected by its
keys), computes utilities and costs as ``isocompute solve`` does, fits the policy
(:class:`isocompute.policy.policy.Policy`: prompt features, the classifier and/or the utility learner,
cross-fitted budget calibration) and writes a ``policy`` artifact (schema 1) to ``--out``. One policy
serves every budget in ``--budgets`` (a range ``lo:hi``; a list or ``start:stop:step`` is read as the
range it spans). Ignores: evaluation (``isocompute report``) and serving (``isocompute serve``).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from isocompute.errors import InputError

STRATEGIES = ("majority", "pass", "best_of")


def parse_actions(text: str) -> tuple[int, ...]:
    """"1,2,4,8" → (1, 2, 4, 8); raises InputError on anything but distinct integers ≥ 1."""
    try:
        ks = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise InputError(f"--actions must be a comma list of sample counts like 1,2,4,8; got {text!r}.") from None
    if len(ks) < 2 or min(ks) < 1 or len(set(ks)) != len(ks):
        raise InputError(f"--actions must list at least two distinct sample counts k ≥ 1, like 1,2,4,8; "
                         f"got {text!r}.")
    return tuple(sorted(ks))


def parse_budgets(text: str) -> list[float]:
    """"1,2,4" → [1, 2, 4]; "lo:hi" → [lo, hi]; "start:stop:step" → the list (stop included)."""
    try:
        parts = [float(x) for x in text.split(":")] if ":" in text else None
        if parts is not None:
            if len(parts) == 2:
                lo, hi = parts
                if not lo < hi:
                    raise ValueError
                return [lo, hi]
            start, stop, step = parts
            if not (step > 0 and stop >= start):
                raise ValueError
            n = int(math.floor((stop - start) / step + 1e-9)) + 1
            if n > 10_000:
                raise InputError(f"--budgets {text} asks for {n} budgets; use a larger step.")
            return [start + i * step for i in range(n)]
        out = sorted({float(x) for x in text.split(",") if x.strip()})
        if not out or not all(math.isfinite(b) for b in out):
            raise ValueError
        return out
    except ValueError:
        raise InputError(f"--budgets must be a range lo:hi (e.g. 1:16), start:stop:step (e.g. 1:16:1) or a "
                         f"comma list (e.g. 1,2,4,8); got {text!r}.") from None


def read_table(path: Path) -> Any:
    """Our outcome table, or a Qwen CoT evaluation dump (lines with idx/question/pred/score)."""
    from isocompute.solver.outcomes import from_qwen_cot_table, read_outcomes

    path = Path(path)
    if not path.is_file():
        raise InputError(f"outcome table {path} does not exist; create it with `isocompute sample` or pass "
                         "the path of an existing .jsonl table.")
    with path.open(encoding="utf-8", errors="replace") as f:
        first = next((line for line in f if line.strip()), "")
    try:
        keys = set(json.loads(first)) if first else set()
    except json.JSONDecodeError:
        keys = set()
    if "id" not in keys and {"idx", "question", "pred", "score"} <= keys:
        return from_qwen_cot_table(path)
    return read_outcomes(path)


def model_flops_for(table: Any, model_config: Path | None) -> tuple[Any, dict[str, str]]:
    """The FLOP shape for cost unit flops: --model-config, else the table's meta (as `solve` does)."""
    from isocompute.artifacts import sha256_file
    from isocompute.flops import load_model_flops

    if model_config is not None:
        path = model_config if Path(model_config).is_file() else Path(model_config) / "config.json"
        return load_model_flops(model_config), {"model_config": sha256_file(path)}
    if isinstance(table.meta.get("model_config"), dict):
        return load_model_flops(table.meta["model_config"]), {}
    raise InputError("--cost-unit flops needs the policy model's config: pass --model-config PATH (a "
                     "config.json or model directory); this table's meta has none.")


def run(args: argparse.Namespace) -> int:
    from isocompute.policy.policy import Policy, PolicyConfig

    budgets = parse_budgets(args.budgets)
    config = PolicyConfig(
        actions=parse_actions(args.actions), strategy=args.strategy, budget_range=(min(budgets), max(budgets)),
        learner=args.learner, cost_unit=args.cost_unit, calibration_folds=args.calibration_folds,
        n_components=args.svd_components, n_rounds=args.n_rounds, calibrate_to=args.calibrate_to, seed=args.seed,
    )
    table = read_table(args.outcomes)
    inputs = {"outcomes": table.sha256}
    model = None
    if config.cost_unit == "flops":
        model, extra = model_flops_for(table, args.model_config)
        inputs.update(extra)
    policy = Policy(config).fit(table, model_flops=model, progress=True)
    policy.save(args.out, inputs=inputs)

    from rich.console import Console

    console = Console(stderr=False)
    console.print(f"policy → {args.out}  ({len(table)} prompts, actions k = {list(config.actions)}, "
                  f"budgets [{config.budget_range[0]:g}, {config.budget_range[1]:g}] {config.cost_unit})")
    console.print(f"default learner: [bold]{policy.default_learner_}[/bold] — "
                  f"{policy.selection_.get('why', policy.selection_['rule'])}")
    for name, f in policy.learners_.items():
        cal = f.calibration
        console.print(f"  {name}: knob {cal.knob}; out-of-fold cost within "
                      f"{100 * cal.max_relative_error(within_reach=True):.1f}% of the target up to {cal.realised.max():.4g} "
                      f"(targets to {cal.targets.max():.4g}; {cal.n_validation} prompts)")
    return 0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "fit", help="learn a budget-conditioned allocation policy from an outcome table",
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("outcomes", type=Path, help="outcome table (.jsonl; or a Qwen CoT evaluation dump)")
    p.add_argument("--actions", default="1,2,4,8,16", help="sample counts k to choose from, comma-separated")
    p.add_argument("--strategy", default="majority", choices=STRATEGIES, help="how k samples become one answer")
    p.add_argument("--budgets", default="1:16",
                   help="budget range the policy serves: lo:hi in mean cost per request (a list spans its range)")
    p.add_argument("--out", type=Path, required=True, help="artifact directory to write (replaced atomically)")
    p.add_argument("--learner", default="auto", choices=("classifier", "utility", "auto"),
                   help="auto fits both and keeps the one with the higher out-of-fold accuracy")
    p.add_argument("--seed", type=int, default=0, help="seed of splits, LightGBM and the SVD")
    p.add_argument("--cost-unit", default="samples", choices=("samples", "flops"),
                   help="samples (C = k) or analytic FLOPs from token counts and --model-config")
    p.add_argument("--model-config", type=Path, help="config.json or model directory (cost unit flops)")
    p.add_argument("--calibration-folds", type=int, default=3, help="cross-fitting folds for budget calibration")
    p.add_argument("--calibrate-to", default="budget", choices=("budget", "oracle"),
                   help="calibrated spend at budget B: B itself, or what the oracle spends at B (less where "
                        "extra samples buy nothing)")
    p.add_argument("--svd-components", type=int, default=16, help="dimensions of the hashed n-gram SVD")
    p.add_argument("--n-rounds", type=int, default=50,
                   help="LightGBM boosting rounds per member (50 matched 100 in accuracy on a 2,000-prompt "
                        "table at half the decide latency)")
    p.set_defaults(func=run)
