"""Cheap prompt features: hand-counted text statistics plus hashed word n-grams reduced by a fitted SVD.

Everything is computed from the prompt text alone — no model call, no model tokenizer — so the gateway
pays microseconds per request. Two blocks, concatenated in this order:

* **hand features** (:data:`HAND_FEATURES`): length in characters and in regex tokens, counts of words,
  numbers, digits, operators (``+ - * / ^ = < >`` and their Unicode/LaTeX forms), ``+``/``-``/``×``
  separately, LaTeX commands, ``$`` signs, question marks and question words, the most digits in one
  number and log10 of the largest number's magnitude; and, for the first inline integer expression
  (``47 + 385 - 12``), its operands, carries/borrows, result digits and whether it goes negative
  (:func:`expression_features`; zeros when there is none).
* **n-gram block** ``svd_0 … svd_{d-1}``: unigrams and bigrams of normalised tokens (words lower-cased,
  each number replaced by its shape ``<num3>`` = "3 digits", since raw numbers are almost all unique and
  would share nothing), hashed exactly as scikit-learn's ``HashingVectorizer(n_features,
  alternate_sign=False, norm="l2")`` does (murmurhash3, seed 0), then projected on the components of a
  ``TruncatedSVD`` fitted on the training prompts.

Worked example: ``"What is 47 + 385 - 12?"`` has 22 characters; its tokens are ``What is 47 + 385 - 12
?`` (8 tokens: 2 words, 3 numbers, 2 operators, 1 question mark), 7 digits, at most 3 digits in one
number, log10(1 + 385) = 2.587, one question word ("what"); its expression has 3 operands, 2 carries
(7 + 5, 4 + 8 + 1) and a 3-digit result, 420.

:class:`PromptFeatures` follows scikit-learn habits: ``__init__`` stores parameters, ``fit`` fits the
SVD and sets attributes ending in ``_``, ``transform`` is pure. The fitted state is a small JSON config
plus one ``.npz`` array (no pickle), so serving computes exactly what training computed. The functions
here are the reference; the rules they apply (tokenizer, counted symbols, expression pattern, n-gram
bucket) live in :mod:`isocompute.policy.features.text_rules`, shared with the fast path. ``transform`` computes the same numbers bit for bit, faster, through tables of
tokens and whitespace chunks (:mod:`isocompute.policy.features.chunk_cache`; tests compare both on arbitrary
text, and the hashing with ``HashingVectorizer``). Measured on a busy 2-core machine: one MATH-500
prompt ~0.1-0.4 ms (by length); 1,024 of them ~20 ms once their chunks were seen, ~70 ms the first time.

Optional extra blocks (``extras=("minilm",)``) append columns that cost a model call per prompt — a
sentence embedding (:mod:`isocompute.policy.features.embedding`); the config names them and their declared cost,
:meth:`PromptFeatures.feature_cost_per_prompt`, which a policy adds to every action's cost.

Ignores: semantics beyond n-grams (unless an extra adds them), non-ASCII digits, numbers written in
words, and a probe call to a model (the policy's probe feature).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from isocompute.errors import ArtifactError, InputError
from isocompute.policy.features.text_stats import (  # noqa: F401  (re-exported)
    FEATURE_SET,
    FEATURE_VERSION,
    HAND_FEATURES,
    _BucketCache,
    _hand_row,
    _with_bigrams,
    expression_features,
    hand_features,
    hashed_matrix,
    ngrams,
)


def _chunk_table(n_features: int) -> Any:
    from isocompute.policy.features.chunk_cache import ChunkTable  # deferred: builds tables only when used

    return ChunkTable(n_features)


def _fit_extras(extras: tuple[str, ...], n_components: int, seed: int, prompts: Sequence[str]) -> list[Any]:
    if not extras:
        return []
    from isocompute.policy.features.embedding import EMBEDDINGS, EmbeddingBlock

    unknown = [e for e in extras if e not in EMBEDDINGS]
    if unknown or len(set(extras)) != len(extras):
        raise InputError(f"extras must be distinct names among {', '.join(EMBEDDINGS)}; you passed {list(extras)}.")
    return [EmbeddingBlock(name, n_components=n_components, seed=seed).fit(prompts) for name in extras]


def _check_prompts(prompts: Sequence[str]) -> None:
    if isinstance(prompts, str):
        raise InputError("prompts must be a list of strings, not one string; wrap it: [prompt].")
    for p in prompts:
        if not isinstance(p, str):
            raise InputError(f"every prompt must be a string; got {type(p).__name__}. Pass the prompt text.")


class PromptFeatures:
    """Hand features + SVD-reduced hashed n-grams (the ``prompt-text`` feature set, version 2), plus
    optional extra blocks, each with a declared cost.

    Parameters: ``n_components`` SVD dimensions (reduced to ``n_prompts - 1`` on tiny training sets),
    ``n_features`` hashing buckets, ``seed`` for the randomised SVD; ``extras``: names of extra blocks
    appended in order (``"minilm"``: a sentence embedding, :mod:`isocompute.policy.features.embedding`, which
    costs a model call per prompt) and ``extra_components`` columns each. After ``fit``:
    ``components_`` (shape ``(n_components_, n_features)``), ``n_components_``, ``extras_`` (the fitted
    blocks), ``feature_names_``. A policy whose features have extras must add
    :meth:`feature_cost_per_prompt` to every action's cost: each request pays for them.
    """

    def __init__(self, *, n_components: int = 16, n_features: int = 1 << 13, seed: int = 0,
                 extras: Sequence[str] = (), extra_components: int = 8) -> None:
        self.n_components = n_components
        self.n_features = n_features
        self.seed = seed
        self.extras = tuple(extras)
        self.extra_components = extra_components

    # ------------------------------------------------------------------------------------------ fitting
    def fit(self, prompts: Sequence[str]) -> PromptFeatures:
        _check_prompts(prompts)
        if self.n_components < 0:
            raise InputError(f"n_components must be ≥ 0; you passed {self.n_components}.")
        if self.n_features < 2:
            raise InputError(f"n_features must be ≥ 2; you passed {self.n_features}.")
        d = min(self.n_components, len(prompts) - 1, self.n_features - 1)
        if d >= 1:
            from sklearn.decomposition import TruncatedSVD
            from sklearn.feature_extraction.text import HashingVectorizer

            hv = HashingVectorizer(analyzer=ngrams, n_features=self.n_features, alternate_sign=False,
                                   norm="l2", dtype=np.float64)
            x = hv.transform(list(prompts))
            if _rows_all_equal(x):  # e.g. a dump without prompt text: no direction separates the prompts
                d = 0
            else:
                svd = TruncatedSVD(n_components=d, algorithm="randomized", random_state=self.seed)
                svd.fit(x)
                self.components_ = np.ascontiguousarray(svd.components_, dtype=np.float64)
        if d < 1:
            self.components_ = np.zeros((0, self.n_features), dtype=np.float64)
        self.n_components_ = int(self.components_.shape[0])
        self._components_t = np.ascontiguousarray(self.components_.T)
        self._table = _chunk_table(self.n_features)
        self.extras_ = _fit_extras(self.extras, self.extra_components, self.seed, prompts)
        self.feature_names_ = self._names()
        return self

    def _names(self) -> list[str]:
        return (list(HAND_FEATURES) + [f"svd_{j}" for j in range(self.n_components_)]
                + [name for block in self.extras_ for name in block.feature_names_])

    # ------------------------------------------------------------------------------------ extra blocks
    @property
    def extra_flops_per_prompt_(self) -> float:
        """Declared FLOPs per prompt of the extra blocks: their mean over the training prompts (0 without)."""
        self._check_fitted()
        return float(sum(block.flops_per_prompt_ for block in self.extras_))

    def extra_flops(self, prompts: Sequence[str]) -> np.ndarray:
        """FLOPs per prompt of computing the extra blocks for these prompts (zeros without extras)."""
        self._check_fitted()
        out = np.zeros(len(prompts))
        for block in self.extras_:
            out += block.flops(prompts)
        return out

    def feature_cost_per_prompt(self, cost_unit: str, sample_flops: Any = None) -> float:
        """What every request pays for the extra blocks, in a policy's cost unit: 0 without extras; in
        ``flops`` :attr:`extra_flops_per_prompt_`; in ``samples`` that over one sample's mean FLOPs
        (``sample_flops``: one sample's FLOPs per training prompt on the served model, e.g. the
        ``flops`` cost table's k = 1 column). Example: minilm, 2.1e8 FLOPs, against 6.8e7 per sample → 3.1."""
        flops = self.extra_flops_per_prompt_
        if flops == 0 or cost_unit == "flops":
            return flops
        if cost_unit != "samples":
            raise InputError(f"unknown cost unit {cost_unit!r}; use samples or flops.")
        if sample_flops is None:
            raise InputError("the extra features' cost in samples needs one sample's FLOPs on the served model "
                             "(sample_flops=, e.g. the flops cost table's k = 1 column of the training prompts).")
        from isocompute.policy.features.embedding import cost_in_samples

        return cost_in_samples(flops, sample_flops)

    def _check_fitted(self) -> None:
        if not hasattr(self, "components_"):
            raise InputError("PromptFeatures is not fitted; call fit(prompts) or load a fitted config first.")

    # ---------------------------------------------------------------------------------------- transform
    def transform(self, prompts: Sequence[str]) -> np.ndarray:
        """Feature matrix ``(len(prompts), len(feature_names_))``, float64. Pure.

        Equal bit for bit to :func:`hand_features` and ``hashed_matrix(...) @ components_.T``, computed
        through a cache of whitespace chunks and tokens (:mod:`isocompute.policy.features.chunk_cache`)."""
        self._check_fitted()
        _check_prompts(prompts)
        comp = self._components_t if self.n_components_ else None
        X = self._table.one(prompts[0], comp) if len(prompts) == 1 else self._table.transform(list(prompts), comp)
        if self.extras_:
            X = np.hstack([X, *(block.transform(prompts) for block in self.extras_)])
        return X

    def fit_transform(self, prompts: Sequence[str]) -> np.ndarray:
        return self.fit(prompts).transform(prompts)

    # --------------------------------------------------------------------------------- persistence
    def config(self) -> dict[str, Any]:
        """The named, versioned config (JSON-able) that identifies what ``transform`` computes."""
        self._check_fitted()
        return {
            "name": FEATURE_SET,
            "version": FEATURE_VERSION,
            "params": {"n_components": self.n_components, "n_features": self.n_features, "seed": self.seed,
                       "extras": list(self.extras), "extra_components": self.extra_components},
            "n_components_": self.n_components_,
            "feature_names": self.feature_names_,
            "ngrams": "unigrams+bigrams of lower-cased regex tokens, numbers as <numD>",
            "hashing": "sklearn HashingVectorizer(alternate_sign=False, norm='l2'), murmurhash3 seed 0",
            "extras": [block.config() for block in self.extras_],
        }

    def save(self, directory: str | Path, stem: str = "features") -> None:
        d = Path(directory)
        (d / f"{stem}.json").write_text(json.dumps(self.config(), indent=2) + "\n")
        np.savez(d / f"{stem}_svd.npz", components=self.components_)
        for block in self.extras_:
            block.save(d, stem)

    @classmethod
    def load(cls, directory: str | Path, stem: str = "features") -> PromptFeatures:
        d = Path(directory)
        try:
            cfg = json.loads((d / f"{stem}.json").read_text())
            with np.load(d / f"{stem}_svd.npz", allow_pickle=False) as z:
                components = np.asarray(z["components"], dtype=np.float64)
        except (OSError, KeyError, ValueError) as e:
            raise ArtifactError(f"{d}: cannot read the feature config ({e}); re-create the policy with "
                                "`isocompute fit`.") from e
        if cfg.get("name") != FEATURE_SET or cfg.get("version") != FEATURE_VERSION:
            raise ArtifactError(
                f"{d}: feature set {cfg.get('name')!r} version {cfg.get('version')} is not the "
                f"{FEATURE_SET!r} version {FEATURE_VERSION} this isocompute computes; re-fit the policy "
                "with this version (`isocompute fit`)."
            )
        obj = cls(**cfg["params"])
        if components.shape != (cfg["n_components_"], obj.n_features):
            raise ArtifactError(f"{d}: SVD components have shape {components.shape}, the config says "
                                f"({cfg['n_components_']}, {obj.n_features}); re-create the policy.")
        obj.components_ = np.ascontiguousarray(components)
        obj.n_components_ = int(components.shape[0])
        obj._components_t = np.ascontiguousarray(components.T)
        obj._table = _chunk_table(obj.n_features)
        from isocompute.policy.features.embedding import EmbeddingBlock

        obj.extras_ = [EmbeddingBlock.load(d, stem, block) for block in cfg.get("extras", [])]
        obj.feature_names_ = obj._names()
        if list(cfg["feature_names"]) != obj.feature_names_:
            raise ArtifactError(f"{d}: the stored feature names differ from what this isocompute computes for "
                                f"{FEATURE_SET!r} version {FEATURE_VERSION}; re-fit the policy (`isocompute fit`).")
        return obj


def _rows_all_equal(x: Any) -> bool:
    """Whether every row of the sparse matrix ``x`` equals its first (no variance for an SVD to find)."""
    return (x != x[np.zeros(x.shape[0], dtype=np.intp)]).nnz == 0
