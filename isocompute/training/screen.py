"""A learned screen for Pilot-Commit: do not pilot prompts that look like ones whose pilots were wasted.

Pilot-Commit learns a prompt's informativeness from its pilot and defers a hopeless prompt so that it
is not piloted again for ``staleness`` steps. On a large prompt pool a prompt seldom comes back within
a run, so that memory rarely pays — but prompts *like* it keep coming. :class:`PromptScreen` carries the
pilot's verdict over to similar prompts: every pilot is a label (*survived*: its accuracy fell in the
kept band) on the prompt's cheap text features (the policy's hand features,
:func:`isocompute.policy.features.text_stats.hand_features`: lengths, digit and operator counts, the expression
block); a small LightGBM classifier, refitted every ``refit_every`` pilot rounds, predicts every pool
prompt's chance of surviving its pilot; the allocator pilots a candidate only when that chance is at
least ``min_survival``, or, with probability ``explore``, anyway — so the screen keeps seeing, and can
correct, what it turns away. It is Solve-then-Learn turned on training: the pilot is the oracle and
the screen imitates it from prompt features.

Until it holds ``min_labels`` labels of both kinds the screen admits everything (plain Pilot-Commit).
It costs no rollouts: features are computed once for the pool (microseconds a prompt) and a fit on a
few hundred labels takes milliseconds.

Worked example: a pool where two-digit problems always fail and one-digit ones succeed half the time.
After 32 pilots the classifier has seen both kinds; it predicts survival ≈ 0 for two-digit prompts
and ≈ 0.9 for one-digit ones, so with ``min_survival`` 0.2 and ``explore`` 0.1 about nine in ten
two-digit candidates are skipped without a rollout.

Ignores: drift of the policy beyond what refits follow (labels are never forgotten), and features
beyond the prompt text.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from isocompute.errors import InputError


def check_screen_options(min_survival: float, explore: float) -> None:
    """InputError unless both are probabilities (the screen's and ``AlignedGRPOConfig``'s check)."""
    if not (0.0 <= min_survival <= 1.0 and 0.0 <= explore <= 1.0):
        raise InputError(f"min_survival and explore must be in [0, 1]; you passed {min_survival}, {explore}.")


class PromptScreen:
    """Predicts from prompt text whether a pilot would survive; see the module docstring."""

    def __init__(self, prompts: Sequence[str], *, min_survival: float = 0.2, explore: float = 0.1,
                 refit_every: int = 4, min_labels: int = 32, seed: int = 0) -> None:
        from isocompute.policy.features.text_stats import hand_features

        if not prompts:
            raise InputError("the screen needs the prompt pool's texts; it got none.")
        check_screen_options(min_survival, explore)
        if refit_every < 1 or min_labels < 2:
            raise InputError(f"refit_every must be ≥ 1 and min_labels ≥ 2; you passed {refit_every}, {min_labels}.")
        self.X = hand_features(list(prompts))
        self.min_survival, self.explore = min_survival, explore
        self.refit_every, self.min_labels, self.seed = refit_every, min_labels, seed
        self.rng = np.random.default_rng(seed)
        self._idx: list[int] = []
        self._y: list[bool] = []
        self._rounds = 0
        self.survival_: np.ndarray | None = None  # predicted survival chance of every pool prompt
        self.fits = 0
        self.skipped = 0

    @property
    def n_labels(self) -> int:
        return len(self._y)

    def admits(self, i: int) -> bool:
        """Pilot prompt ``i``? Yes while unfitted, when its predicted survival reaches ``min_survival``,
        or by exploration; a refusal is counted in ``skipped``."""
        if self.survival_ is None or self.survival_[i] >= self.min_survival:
            return True
        if self.rng.random() < self.explore:
            return True
        self.skipped += 1
        return False

    def observe(self, prompts: Sequence[int], survived: Sequence[bool]) -> None:
        """Record one pilot round's verdicts; refit every ``refit_every`` rounds once both kinds are seen."""
        if len(prompts) != len(survived):
            raise InputError(f"{len(prompts)} prompts but {len(survived)} verdicts; pass one verdict per prompt.")
        self._idx += [int(i) for i in prompts]
        self._y += [bool(s) for s in survived]
        self._rounds += 1
        if self._rounds % self.refit_every == 0:
            self.refit()

    def refit(self) -> bool:
        """Fit the classifier on every label so far; False (nothing changes) below ``min_labels`` or when
        all labels agree."""
        import lightgbm as lgb

        y = np.asarray(self._y)
        if y.size < self.min_labels or y.all() or not y.any():
            return False
        clf = lgb.LGBMClassifier(n_estimators=50, num_leaves=7, learning_rate=0.1, min_child_samples=5,
                                 random_state=self.seed, n_jobs=1, verbose=-1)
        clf.fit(self.X[self._idx], y)
        self.survival_ = clf.predict_proba(self.X)[:, 1]
        self.fits += 1
        return True
