"""The probe's values for a set of prompts, computed once and cached beside an artifact.

:mod:`isocompute.engines.probe` measures the probe (mean token entropy of a short greedy answer). This
module decides *whether it has to run*: the values of ``prompts`` on a checkpoint are identified by a
key — the prompts' sha256, the model's fingerprint, the probe's token count and the prompt format —
and stored as two files that any artifact directory can hold (``isocompute fit`` writes them into the
policy artifact, ``isocompute report`` reads them back):

``probe.npy``   N × 3 float64: value, prompt tokens, probe tokens per prompt (no pickle)
``probe.json``  the key, the model path and the probe method (``exact`` or ``top20``)

:func:`compute_probe` returns the first cache whose key matches, else runs the probe on the
transformers engine with a progress bar. :func:`declared_probe_cost` prices what the probe calls cost
per request, from the analytic FLOPs of those calls.

Example: fitting a 800-prompt table with ``--probe-model runs/demo/tiny-sft`` runs 800 greedy calls
once; re-fitting the same table into the same directory, or reporting on it, finds the key in
``probe.json`` and reads ``probe.npy`` instead.

Ignores: a checkpoint rewritten in place with the same file sizes (the fingerprint hashes config.json
and the weight files' names and sizes, not the weights), and probes on other engines (the cache is
filled by the transformers engine; the gateway computes values per request).
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from isocompute.engines.probe import ProbeResult, probe_cost, run_probe
from isocompute.errors import InputError

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


def load_probe_cache(directory: Path, key: dict[str, Any]) -> ProbeResult | None:
    """The cached :class:`~isocompute.engines.probe.ProbeResult` in ``directory`` if its key matches, else None."""
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


def probe_cache_files(result: ProbeResult, key: dict[str, Any], model_dir: Path) -> dict[str, bytes]:
    """``probe.npy`` (N × 3: value, prompt tokens, probe tokens) and ``probe.json`` (key, model, method)."""
    buf = io.BytesIO()
    np.save(buf, np.column_stack([result.values, result.prompt_tokens, result.completion_tokens]).astype(np.float64),
            allow_pickle=False)
    meta = {**key, "model": str(model_dir), "method": result.method}
    return {PROBE_VALUES: buf.getvalue(), PROBE_META: (json.dumps(meta, indent=2) + "\n").encode()}


def resolve_prompt_format(model_dir: Path, prompt_format: str) -> str:
    """``chat`` / ``plain`` as given; ``auto`` → chat when the checkpoint's tokenizer has a chat template."""
    if prompt_format != "auto":
        return prompt_format
    cfg = Path(model_dir) / "tokenizer_config.json"
    has_template = (Path(model_dir) / "chat_template.jinja").is_file() or (
        cfg.is_file() and bool(json.loads(cfg.read_text()).get("chat_template")))
    return "chat" if has_template else "plain"


def compute_probe(prompts: Sequence[str], model_dir: Path, max_tokens: int, prompt_format: str, *,
                  cache_dirs: Sequence[Path] = (), threads: int | None = None,
                  progress: bool = True) -> tuple[ProbeResult, dict[str, Any], str]:
    """(ProbeResult, its cache key, how it was obtained) for ``prompts``: from the first matching cache in
    ``cache_dirs``, else by running the probe on the transformers engine (a progress bar with ``progress``).

    ``prompt_format``: ``chat`` / ``plain`` / ``auto`` (chat when the tokenizer has a chat template), the
    text ``isocompute sample`` sends: the prompt in the chat template, or the prompt and a newline.
    """
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise InputError(f"probe model {model_dir} is not a Hugging Face checkpoint (config.json missing); pass "
                         "the directory of the model the outcome table was sampled with.")
    prompt_format = resolve_prompt_format(model_dir, prompt_format)
    key = probe_key(prompts, model_dir, max_tokens, prompt_format)
    for d in cache_dirs:
        cached = load_probe_cache(d, key)
        if cached is not None:
            return cached, key, f"cached in {d}"
    from isocompute.engines.transformers_engine import TransformersEngine, apply_chat_template

    engine = TransformersEngine(model_dir, device="auto", threads=threads)
    if prompt_format == "chat":
        texts = [apply_chat_template(engine.tokenizer, p) for p in prompts]
    else:
        texts = [p + "\n" for p in prompts]
    result = run_probe(engine, texts, max_tokens, progress=progress)
    return result, key, f"computed with {model_dir} ({result.method})"


def declared_probe_cost(result: ProbeResult, model_dir: Path, table: Any, unit: str,
                        sample_model: Any) -> tuple[float, float]:
    """(cost per request in ``unit``, mean FLOPs per request) of the probe calls in ``result``.

    In ``samples`` the FLOPs are divided by one sample's FLOPs on ``sample_model`` (the table's model;
    None: the probe model stands for it), at the table's token counts (:func:`~isocompute.engines.probe.probe_cost`).
    """
    from isocompute.flops import load_model_flops

    model = load_model_flops(Path(model_dir))
    flops = probe_cost(model, result.prompt_tokens, result.completion_tokens, unit="flops")
    if unit == "flops":
        return flops, flops
    if not table.has_token_counts:
        raise InputError("the probe's cost in samples needs the table's prompt_tokens and completion_tokens; this "
                         "table lacks some. Declare the cost yourself (isocompute fit --probe-cost).")
    cost = probe_cost(model, result.prompt_tokens, result.completion_tokens, unit="samples",
                      mean_completion_tokens=table.mean_completion_tokens, sample_model=sample_model,
                      sample_prompt_tokens=table.prompt_tokens)
    return cost, flops
