"""The shape of a decoder-only transformer, as far as FLOPs care: :class:`ModelFlops`.

A :class:`ModelFlops` holds the numbers every FLOP formula in this room needs:

* ``body_params`` — weights of the matrix multiplies each token passes through in the decoder blocks
  (Q, K, V, O projections; the MLP's gate/up/down or up/down). Grouped-query attention shrinks K and V
  to ``num_key_value_heads · head_dim`` columns; ``head_dim`` is taken from the config when it is set,
  because it may differ from ``hidden_size / num_attention_heads`` (Gemma, Qwen3).
* ``head_params`` — the output head (``lm_head``, d·V, a matmul even when tied to the embeddings; or a
  reward model's scoring MLP).
* ``n_layers`` and ``d_attn = num_attention_heads · head_dim`` — the width of the QK^T and AV products,
  whose cost grows with context (after ``repeat_kv`` every query head attends, so GQA does not shrink it).
* ``n_params`` — every parameter, embeddings, norms and biases included: the N of parameter–token
  conventions such as RACE (:mod:`isocompute.flops.race`). Tied embeddings are counted once.
* ``layer_linears`` — (name, d_in, d_out) of one block's projections, for LoRA adapter counts.

Four ways in: :meth:`ModelFlops.from_config` (a ``transformers`` ``PretrainedConfig`` or the dict of a
config.json), :func:`load_model_flops` (a config.json path, a model directory, a config object, or a
ModelFlops), :meth:`ModelFlops.from_params` (explicit counts, e.g. "a 1.5B model": every parameter
is then treated as a matmul weight and the attention term is dropped unless ``n_layers``/``d_attn`` are
given) and :meth:`ModelFlops.from_active_params` (only the parameters a token passes through are known,
e.g. a mixture-of-experts model's active count: 2 FLOPs per active parameter per token).

Supported families: llama, mistral, qwen2, qwen3, gemma, phi3 (gated MLP: 3 matrices) and gpt2 (plain
MLP: 2 matrices); multimodal configs are read through their ``text_config``. Mixture-of-experts configs
are refused — pass explicit counts instead. Reading a config.json does not import ``transformers``;
keys a hand-written config omits get the family's default (e.g. ``tie_word_embeddings`` is True for
gpt2/gemma, False for the rest).

Example (Qwen2.5-0.5B: d=896, 24 layers, 14 heads, 2 KV heads, d_ff=4864, V=151936, tied)::

    body = 24 · (896·896 + 2·896·128 + 896·896 + 3·896·4864) = 357,826,560
    head = 896 · 151936 = 136,134,656;   n_params = 494,032,768 (embeddings counted once)
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from isocompute.errors import InputError

LORA_TARGETS_ALL = ("q", "k", "v", "o", "gate", "up", "down")


@dataclass(frozen=True)
class _Family:
    gated: bool  # gate, up, down (3 matrices) vs up, down (2)
    tie_default: bool = False  # tie_word_embeddings when the config omits it
    layernorm: bool = False  # LayerNorm (weight+bias) instead of RMSNorm (weight)
    qkv_bias: bool = False  # Q, K, V always carry a bias (qwen2)
    all_bias: bool = False  # every linear carries a bias (gpt2)
    qk_norm: bool = False  # per-head RMSNorm on Q and K (qwen3)
    learned_positions: bool = False  # an extra n_positions × d table (gpt2)


_FAMILIES: dict[str, _Family] = {
    "llama": _Family(gated=True),
    "mistral": _Family(gated=True),
    "qwen2": _Family(gated=True, qkv_bias=True),
    "qwen3": _Family(gated=True, qk_norm=True),
    "gemma": _Family(gated=True, tie_default=True),
    "phi3": _Family(gated=True),
    "gpt2": _Family(gated=False, tie_default=True, layernorm=True, all_bias=True, learned_positions=True),
}

_MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size")


@dataclass(frozen=True)
class ModelFlops:
    """FLOP-relevant shape of one model; see the module docstring for each field's meaning."""

    body_params: int
    head_params: int
    n_layers: int
    d_attn: int
    n_params: int
    layer_linears: tuple[tuple[str, int, int], ...] = ()
    name: str = ""

    @property
    def matmul_params(self) -> int:
        """N_matmul = body + head: a forward pass costs 2·N_matmul FLOPs per token plus attention."""
        return self.body_params + self.head_params

    @classmethod
    def from_params(
        cls, n_params: int, *, n_layers: int = 0, d_attn: int = 0, head_params: int = 0, name: str = ""
    ) -> ModelFlops:
        """Explicit counts: all of ``n_params`` but ``head_params`` is charged as body matmul weights.

        >>> ModelFlops.from_params(1_500_000_000).matmul_params
        1500000000
        """
        if n_params <= 0 or head_params < 0 or head_params > n_params or n_layers < 0 or d_attn < 0:
            raise InputError(
                f"explicit counts must satisfy n_params > 0, 0 <= head_params <= n_params, n_layers >= 0, "
                f"d_attn >= 0; got n_params={n_params}, head_params={head_params}, n_layers={n_layers}, "
                f"d_attn={d_attn}. Fix the numbers, or load the model's config.json instead."
            )
        return cls(int(n_params) - int(head_params), int(head_params), int(n_layers), int(d_attn),
                   int(n_params), (), name)

    @classmethod
    def from_active_params(cls, active_params: float, *, total_params: float | None = None,
                           name: str = "") -> ModelFlops:
        """A model known only by the parameters each token passes through: FLOPs = 2 · active per token,
        prefill and decode alike (the 2N convention of Kaplan et al. 2020).

        For a mixture-of-experts model pass the *active* count (gpt-oss-20b: 3.6e9 of 21e9 total;
        ``total_params`` is kept as :attr:`n_params`, for parameter–token conventions, and costs nothing
        per token). What this ignores: attention's context-dependent QK^T and AV products, 4·L·d_attn·ctx
        per token (the number of layers and the attention width are unknown) — on long reasoning traces
        that is not small: for Qwen3-14B (L = 40, d_attn = 5,120) at its MATH-500 mean of 11,859
        completion tokens it would add about 16% to 2·14.8e9 per token; also the embedding lookup, which
        is no matmul but is usually inside a published count (for Qwen3-14B 0.78e9, about 5%), and
        everything :mod:`isocompute.flops.analytic` ignores.

        >>> m = ModelFlops.from_active_params(3.6e9, total_params=21e9)
        >>> m.matmul_params, m.n_params, m.n_layers
        (3600000000, 21000000000, 0)
        """
        active = float(active_params)
        total = active if total_params is None else float(total_params)
        if not (0 < active < float("inf")) or not total >= active:
            raise InputError(f"active parameters must be a positive number and total_params (if given) at least as "
                             f"large; got active_params={active_params!r}, total_params={total_params!r}. For a "
                             "mixture-of-experts model pass the active count, e.g. 3.6e9 for gpt-oss-20b.")
        return cls(int(round(active)), 0, 0, 0, int(round(total)), (), name)

    @classmethod
    def from_config(cls, config: Any, *, name: str = "") -> ModelFlops:
        """Read a ``transformers`` ``PretrainedConfig`` or a config.json dict (see module docstring)."""
        return _from_config(config, name)

    def lora_params(self, rank: int, targets: tuple[str, ...] = LORA_TARGETS_ALL) -> int:
        """N_LoRA: rank·(d_in + d_out) per adapted projection per layer.

        ``targets`` uses the projection names q, k, v, o, gate, up, down (a ``_proj`` suffix is accepted).
        For Qwen2.5-0.5B at rank 8 on all seven projections this is 24 · 183,296 = 4,399,104
        (0.89% of N).
        """
        if not self.layer_linears:
            raise InputError(
                "LoRA parameter counts need the layer shapes, which explicit counts lack; load the model "
                "with load_model_flops(config.json) or pass N_LoRA directly."
            )
        if rank <= 0:
            raise InputError(f"LoRA rank must be a positive integer; got {rank}.")
        shapes = {n: (i, o) for n, i, o in self.layer_linears}
        wanted = [t.removesuffix("_proj") for t in targets]
        unknown = sorted(set(wanted) - set(shapes))
        if unknown:
            raise InputError(
                f"unknown LoRA target(s) {unknown} for this model; choose from {sorted(shapes)}."
            )
        return self.n_layers * sum(rank * (shapes[t][0] + shapes[t][1]) for t in set(wanted))


def load_model_flops(source: Any) -> ModelFlops:
    """A :class:`ModelFlops` from a config.json path, a model directory, a config object or dict.

    Raises :class:`InputError` (saying how to fix it) for a missing or unreadable file, invalid JSON,
    an unsupported architecture or missing size fields.
    """
    if isinstance(source, ModelFlops):
        return source
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if path.is_dir():
            path = path / "config.json"
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise InputError(
                f"cannot read model config {path}: {e.strerror or e}. Pass a config.json file or a model "
                f"directory that contains one (e.g. a snapshot downloaded with huggingface-cli)."
            ) from None
        try:
            config = json.loads(text)
        except json.JSONDecodeError as e:
            raise InputError(f"{path} is not valid JSON ({e}); re-download or fix the config file.") from None
        if not isinstance(config, dict):
            raise InputError(f"{path} holds a JSON {type(config).__name__}, not an object; pass a model config.")
        return _from_config(config, name=path.parent.name)
    if isinstance(source, Mapping) or hasattr(source, "model_type"):
        return _from_config(source, name="")
    raise InputError(
        f"cannot build model FLOPs from a {type(source).__name__}; pass a config.json path, a model "
        f"directory, a transformers PretrainedConfig, or ModelFlops.from_params(...)."
    )


def _get(config: Any, *names: str, default: Any = None) -> Any:
    """First present, non-None value among ``names`` (dict key or attribute)."""
    for n in names:
        v = config.get(n) if isinstance(config, Mapping) else getattr(config, n, None)
        if v is not None:
            return v
    return default


def _text_config(config: Any) -> Any:
    if isinstance(config, Mapping):
        return config.get("text_config") or config
    get_text = getattr(config, "get_text_config", None)
    return get_text() if callable(get_text) else config


def _head(config: Any, d: int, vocab: int) -> tuple[int, int, bool]:
    """(matmul params, extra non-matmul params, is an lm_head) of the output head."""
    archs = _get(config, "architectures", default=None) or []
    arch = archs[0] if archs else ""
    id2label = _get(config, "id2label", default=None)
    if arch.endswith("RewardModel"):
        # Qwen2 reward/PRM heads: Linear(d, d) → ReLU → Linear(d, labels), both with bias.
        labels = len(id2label) if id2label else (2 if "Process" in arch else 1)
        return d * d + d * labels, d + labels, False
    if arch.endswith(("ForSequenceClassification", "ForTokenClassification")):
        labels = len(id2label) if id2label else 2
        return d * labels, 0, False
    return d * vocab, 0, True


def _from_config(config: Any, name: str) -> ModelFlops:
    outer = config
    config = _text_config(config)
    model_type = _get(config, "model_type", default=None) or _get(outer, "model_type", default="")
    model_type = str(model_type).removesuffix("_text")
    family = _FAMILIES.get(model_type)
    if family is None or any(_get(config, k) for k in _MOE_KEYS):
        kind = "mixture-of-experts " if family else ""
        raise InputError(
            f"unsupported {kind}model_type {model_type!r}: analytic FLOPs know {sorted(_FAMILIES)} "
            f"(dense). Pass explicit counts instead: ModelFlops.from_params(n_params=..., n_layers=..., "
            f"d_attn=...) (for MoE use the active parameters per token)."
        )
    d = _get(config, "hidden_size", "n_embd", "d_model")
    n_layers = _get(config, "num_hidden_layers", "n_layer", "num_layers")
    heads = _get(config, "num_attention_heads", "n_head")
    vocab = _get(config, "vocab_size")
    missing = [k for k, v in (("hidden_size", d), ("num_hidden_layers", n_layers),
                              ("num_attention_heads", heads), ("vocab_size", vocab)) if v is None]
    if missing:
        raise InputError(
            f"model config ({model_type}) lacks {missing}; pass the model's full config.json, or explicit "
            f"counts with ModelFlops.from_params(...)."
        )
    kv = _get(config, "num_key_value_heads", default=heads)
    hd = _get(config, "head_dim", default=d // heads)
    ff = _get(config, "intermediate_size", "n_inner", default=4 * d)
    tied = bool(_get(config, "tie_word_embeddings", default=family.tie_default))
    q, k = heads * hd, kv * hd
    linears = [("q", d, q), ("k", d, k), ("v", d, k), ("o", q, d)]
    linears += [("gate", d, ff), ("up", d, ff), ("down", ff, d)] if family.gated else [
        ("up", d, ff), ("down", ff, d)]
    body = n_layers * sum(i * o for _, i, o in linears)

    attn_bias = bool(_get(config, "attention_bias", default=False))
    biases = 0
    if family.all_bias:
        biases = sum(o for _, _, o in linears)
    else:
        if family.qkv_bias or attn_bias:
            biases += q + 2 * k
        if attn_bias:
            biases += d
        if _get(config, "mlp_bias", default=False):
            biases += (2 * ff if family.gated else ff) + d
    norm = 2 * d if family.layernorm else d
    per_layer_extra = biases + 2 * norm + (2 * hd if family.qk_norm else 0)
    head, head_extra, is_lm = _head(outer, d, vocab)
    embed = vocab * d + (_get(config, "n_positions", default=0) * d if family.learned_positions else 0)
    n_params = (body + n_layers * per_layer_extra + norm + embed + head_extra
                + (0 if (tied and is_lm) else head))
    return ModelFlops(int(body), int(head), int(n_layers), int(q), int(n_params), tuple(linears),
                      name or str(_get(outer, "_name_or_path", default="") or model_type))
