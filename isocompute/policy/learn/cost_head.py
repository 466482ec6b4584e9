"""The utility learner's cost head: each adaptive plan's expected cost on *this* prompt.

"k samples at once" costs k on every prompt, so the utility learner can price its predictions with one
number per action (``argmax_a Û(x, a) − λ·c_a``). An adaptive plan stops early where the votes agree,
so its cost depends on the prompt: ``lead:m=2@1x16`` draws 2 samples on a prompt the model always gets
the same answer for and up to 16 on a split one. Priced at the plan's *mean* cost, a policy that sends
hard prompts to an adaptive plan would underrate what they cost. The head predicts, per prompt and
plan, where between its first wave w₁ and its most samples K the plan stops,

    y[i, p] = (E[samples_ip] − w₁(p)) / (K(p) − w₁(p)) ∈ [0, 1]      (one LightGBM model, cross-entropy,
                                                                    rows [x_i, descriptors_p] stacked)

and maps it to the cost unit with the plan's own training ratio of cost to samples,

    Ŝ[i, p] = w₁ + ŷ·(K − w₁),      Ĉ[i, p] = paid + Ŝ[i, p] · r_p,    r_p = mean_i (C[i, p] − paid) / mean_i S[i, p]

(``paid``: what every request pays first, the probe and extra features; r_p = 1 in samples). One-wave
plans (K = w₁) cost what they cost: they get no rows and Ŝ = K exactly.

Worked example: ``lead:m=2@1x16`` (w₁ = 1, K = 16) and ŷ = 0.2 → Ŝ = 4 samples; in samples with no
paid costs Ĉ = 4, while ``none@4`` is 4 on every prompt.

Ignores: the variance of the cost (the budget is on the mean) and completion lengths that vary with
the prompt beyond the plan's average (FLOPs are scaled per plan, not per prompt).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from isocompute.policy.learn.booster_head import BoosterHead, stack_rows
from isocompute.policy.learn.booster_predict import BoosterPredictor


class SampleCostRegressor(BoosterHead):
    """Per-prompt expected samples (and cost) of every plan; see the module docstring."""

    def fit(self, X: np.ndarray, S: np.ndarray, C: np.ndarray, descriptors: np.ndarray, first_wave: np.ndarray,
            max_samples: np.ndarray, paid: float = 0.0) -> SampleCostRegressor:
        """``S``, ``C``: (N, P) expected samples and cost of each training prompt and plan;
        ``descriptors``: (P, d); ``first_wave`` / ``max_samples``: (P,) w₁ and K of each plan."""
        P = S.shape[1]
        self.first_wave_ = np.asarray(first_wave, dtype=np.float64)
        self.max_samples_ = np.asarray(max_samples, dtype=np.float64)
        self.descriptors_ = np.asarray(descriptors, dtype=np.float64).reshape(P, -1)
        self.paid_ = float(paid)
        s_bar = S.mean(axis=0)
        self.ratio_ = np.where(s_bar > 0, (C.mean(axis=0) - paid) / np.maximum(s_bar, 1e-300), 1.0)
        self.adaptive_ = np.flatnonzero(self.max_samples_ > self.first_wave_)
        self.booster_ = None
        self.predictor_ = None
        if self.adaptive_.size:
            a = self.adaptive_
            span = self.max_samples_[a] - self.first_wave_[a]
            y = np.clip((S[:, a] - self.first_wave_[a]) / span, 0.0, 1.0).reshape(-1)
            self._train(stack_rows(X, self.descriptors_[a]), y)
        return self

    def predict_samples(self, X: np.ndarray) -> np.ndarray:
        """(N, P) predicted expected samples Ŝ."""
        n = X.shape[0]
        out = np.broadcast_to(self.max_samples_, (n, self.max_samples_.size)).copy()
        if self.predictor_ is not None and n:
            a = self.adaptive_
            y = self.predictor_(stack_rows(X, self.descriptors_[a])).reshape(n, a.size)
            out[:, a] = self.first_wave_[a] + y * (self.max_samples_[a] - self.first_wave_[a])
        return out

    def predict_costs(self, X: np.ndarray) -> np.ndarray:
        """(N, P) predicted expected cost Ĉ in the cost unit, paid costs included."""
        return self.paid_ + self.predict_samples(X) * self.ratio_[None, :]

    def state(self) -> dict[str, Any]:
        return {"params": self.hyper_params(),
                "first_wave": self.first_wave_.tolist(), "max_samples": self.max_samples_.tolist(),
                "descriptors": self.descriptors_.tolist(), "paid": self.paid_, "ratio": self.ratio_.tolist()}

    @classmethod
    def from_state(cls, state: dict[str, Any], model_text: str | None) -> SampleCostRegressor:
        import lightgbm as lgb

        obj = cls(**state["params"])
        obj.first_wave_ = np.asarray(state["first_wave"], dtype=np.float64)
        obj.max_samples_ = np.asarray(state["max_samples"], dtype=np.float64)
        obj.descriptors_ = np.asarray(state["descriptors"], dtype=np.float64).reshape(obj.max_samples_.size, -1)
        obj.paid_ = float(state["paid"])
        obj.ratio_ = np.asarray(state["ratio"], dtype=np.float64)
        obj.adaptive_ = np.flatnonzero(obj.max_samples_ > obj.first_wave_)
        obj.booster_ = None if model_text is None else lgb.Booster(model_str=model_text)
        obj.predictor_ = None if obj.booster_ is None else BoosterPredictor(obj.booster_)
        return obj
