"""Each model's compute: its FLOP shape (from a config, or from an active parameter count) and the FLOPs
of every sample in its outcome table.

Where a model's :class:`~isocompute.flops.ModelFlops` comes from (:func:`resolve_model_flops`), first
match wins and two explicit sources for one model are refused:

1. an active parameter count (``--model-params NAME=ACTIVE_PARAMS``; :func:`parse_model_params` reads
   ``3.6e9``, ``3.6B``, ``800M``): :meth:`ModelFlops.from_active_params`, 2 FLOPs per active parameter
   per token — for a mixture-of-experts model the *active* count (gpt-oss-20b 3.6e9, not 21e9);
2. a config (a config.json path, a model directory, a dict): :func:`~isocompute.flops.load_model_flops`;
3. the table's own ``meta.model_config`` (``isocompute sample`` stores the model's config.json there).

Per-sample FLOPs (:func:`sample_flops`), for prompt i with p_i prompt tokens and sample j with m_ij
completion tokens:

    decode_ij = decode(p_i, m_ij)        (m − 1 decode steps after the prefill, :mod:`isocompute.flops.analytic`)
    prefill_i = prefill(p_i)             (once per request, or once per plan with prefix caching)

Without prompt token counts (the MATH-500 dumps have none) the cost is *completion-only*: the prompt
is taken as empty and every completion token is charged one forward step over the completion so far,

    decode_ij = decode(0, m_ij + 1),     prefill_i = 0,

which for an active-parameter model is exactly 2 · N_active · m_ij. Example: gpt-oss-20b (3.6e9
active), a 1,735-token sample: 2 · 3.6e9 · 1,735 = 1.25e13 FLOPs (the issue's table).
:attr:`SampleFlops.completion_only` records which case applied, for the report to say so.

Ignores: the prompt's cost when its length is unknown (above), batching and queueing, and every term
:mod:`isocompute.flops.analytic` ignores.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from isocompute.errors import InputError
from isocompute.flops import ModelFlops, decode_flops, load_model_flops, prefill_flops
from isocompute.solver.models.tables import ModelTables, check_model_name
from isocompute.solver.outcomes import OutcomeTable

_SUFFIX = {"": 1.0, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}
_COUNT = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([KMBGT]?)\s*", re.IGNORECASE)


def parse_param_count(text: str) -> float:
    """``"3.6e9"``, ``"3.6B"``, ``"800M"``, ``"14b"`` → the number of parameters."""
    m = _COUNT.fullmatch(str(text))
    if not m or float(m.group(1)) <= 0:
        raise InputError(f"bad parameter count {text!r}: use a positive number such as 3.6e9, 3.6B or 800M.")
    return float(m.group(1)) * _SUFFIX[m.group(2).upper()]


def parse_model_params(items: Iterable[str]) -> dict[str, float]:
    """``["gpt-oss-20b=3.6e9", "Qwen3-14B=14.8B"]`` (the ``--model-params`` values) → name → active count."""
    out: dict[str, float] = {}
    for item in items:
        name, eq, value = str(item).partition("=")
        if not eq:
            raise InputError(f"bad --model-params {item!r}: write NAME=ACTIVE_PARAMS, e.g. gpt-oss-20b=3.6e9 "
                             "(for a mixture-of-experts model the active parameters per token).")
        name = check_model_name(name.strip())
        if name in out:
            raise InputError(f"--model-params gives {name} twice; keep one.")
        out[name] = parse_param_count(value)
    return out


def resolve_model_flops(tables: ModelTables, *, params: Mapping[str, float] | None = None,
                        configs: Mapping[str, Any] | None = None) -> dict[str, ModelFlops]:
    """Each joined model's FLOP shape (module docstring: active count, config, or the table's meta), named
    after the model."""
    params, configs = dict(params or {}), dict(configs or {})
    unknown = sorted((set(params) | set(configs)) - set(tables.names))
    if unknown:
        raise InputError(f"costs given for {unknown}, which are not among the joined models {list(tables.names)}; "
                         "use the names the tables were joined under.")
    out = {}
    for name in tables.names:
        if name in params and name in configs:
            raise InputError(f"model {name} has both an active parameter count and a config; pass one of them.")
        if name in params:
            out[name] = ModelFlops.from_active_params(params[name], name=name)
        elif name in configs:
            out[name] = replace(load_model_flops(configs[name]), name=name)
        elif isinstance(cfg := tables.tables[name].meta.get("model_config"), Mapping):
            out[name] = replace(load_model_flops(cfg), name=name)
        else:
            raise InputError(f"model {name} has no cost: its table carries no meta.model_config; pass "
                             f"--model-params {name}=ACTIVE_PARAMS (e.g. 3.6e9; for MoE the active parameters) or "
                             f"the model's config.json.")
    return out


@dataclass(frozen=True, eq=False)
class SampleFlops:
    """``decode`` (N, n_max) FLOPs of each sample (0 on padding), ``prefill`` (N,) of one prefill of each
    prompt, and whether the prompt was left out for want of its token count (module docstring)."""

    decode: np.ndarray
    prefill: np.ndarray
    completion_only: bool


def sample_flops(table: OutcomeTable, model: ModelFlops) -> SampleFlops:
    """Per-sample decode FLOPs and per-prompt prefill FLOPs of ``table`` under ``model``."""
    ct = table.completion_tokens
    if np.isnan(ct[table.mask]).any():
        i = int(np.argmax(np.isnan(np.where(table.mask, ct, 0.0)).any(axis=1)))
        raise InputError(f"{table.source}: prompt {table.ids[i]!r} has samples without completion_tokens; FLOP "
                         "costs need them on every sample (re-import with --tokenizer, or use the samples unit).")
    m = np.where(table.mask, ct, 0.0)
    p = table.prompt_tokens
    if np.isnan(p).any():
        decode = np.asarray(decode_flops(model, 0.0, m + 1.0))
        return SampleFlops(np.where(table.mask, decode, 0.0), np.zeros(len(table)), completion_only=True)
    decode = np.asarray(decode_flops(model, p[:, None], m))
    return SampleFlops(np.where(table.mask, decode, 0.0), np.asarray(prefill_flops(model, p), dtype=np.float64),
                       completion_only=False)
