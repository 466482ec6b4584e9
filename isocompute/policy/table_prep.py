"""A table made ready for :meth:`Policy.fit <isocompute.policy.policy.Policy.fit>`: every plan estimated on every
kept prompt (a ragged table cut as the config says), per-prompt inputs cut to the kept prompts, one
sample's FLOPs for extra features priced in samples, and the shrunk training labels (``shrinkage="eb"``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from isocompute.errors import InputError


def task_groups(table: Any) -> list[str]:
    """Each prompt's task (its meta's ``task``, else one group): what shrinkage shrinks toward."""
    return [str(m.get("task", "")) for m in table.metas]


def prepare_table(cfg: Any, table: Any, *, costs: np.ndarray | None, probe: np.ndarray | None,
                  sample_flops: np.ndarray | None, model_flops: Any, arrays: Any) -> tuple[Any, ...]:
    """``(prep, costs, probe, sample_flops, labels)`` for fitting ``cfg`` on ``table``: ``prep`` the plan
    arrays (:func:`~isocompute.policy.plans.arrays.table_arrays`, or ``arrays`` when the caller has them),
    the per-prompt inputs cut to ``prep.table``'s prompts, and the learners' labels (None: the raw U)."""
    from isocompute.policy.plans.arrays import table_arrays
    from isocompute.solver.costs import cost_table
    from isocompute.solver.votes.consensus import with_target

    table = with_target(table, cfg.target)  # a library caller's table of raw verdicts gets the config's target
    prep = arrays if arrays is not None else table_arrays(table, cfg, model=model_flops if cfg.cost_unit == "flops"
                                                          else None)
    full, table = len(table), prep.table

    def rows(x: Any) -> Any:
        """A per-prompt array of the input table, cut to the kept prompts (a wrong shape is left for
        fit_arrays to report)."""
        if x is None or not prep.dropped or np.shape(x)[:1] != (full,):
            return x
        return np.asarray(x)[prep.kept]

    costs, probe, sample_flops = rows(costs), rows(probe), rows(sample_flops)
    if costs is None:
        costs = prep.cost
    if (sample_flops is None and cfg.feature_extras and cfg.cost_unit == "samples"
            and cfg.feature_cost is None and model_flops is not None):
        sample_flops = cost_table(table.prompt_tokens, table.mean_completion_tokens, (1,), unit="flops",
                                  model=model_flops)[:, 0]
    labels = None
    if cfg.shrinkage == "eb":
        if cfg.plans:
            raise InputError("shrinkage='eb' shrinks k-sample utilities; it works with the one-wave actions "
                             "only (--plans none).")
        from isocompute.policy.learn.shrinkage import sampling_variance, shrink_utilities

        var = sampling_variance(table, cfg.actions, cfg.strategy, seed=cfg.seed)
        labels = shrink_utilities(prep.utility, var, task_groups(table))
    return prep, costs, probe, sample_flops, labels


def check_arrays(cfg: Any, n_plans: int, prompts: Any, U: Any, C: Any) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Prompts as a list and U, C as float arrays of shape (prompts × plans), or InputError."""
    U, C = np.asarray(U, dtype=np.float64), np.asarray(C, dtype=np.float64)
    prompts = list(prompts)
    n = len(prompts)
    if U.shape != (n, n_plans) or C.shape != U.shape:
        raise InputError(f"utilities and costs must be (prompts × {'plans' if cfg.plans else 'actions'}) = "
                         f"({n}, {n_plans}); got {U.shape} and {C.shape}.")
    if n < 4 * cfg.calibration_folds:
        raise InputError(f"a policy with {cfg.calibration_folds} calibration folds needs at least "
                         f"{4 * cfg.calibration_folds} prompts; the table has {n}. Sample more prompts.")
    return prompts, U, C
