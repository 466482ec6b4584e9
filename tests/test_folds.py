"""The CV folds in worker processes give the same evaluation as in one process, and ``run_jobs`` keeps the
order of its jobs, passes the shared context, and says what to fix for a bad worker count."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from isocompute.errors import InputError
from isocompute.evaluation.evaluate import cross_validate
from isocompute.evaluation.folds import resolve_workers, run_jobs
from isocompute.policy.policy import PolicyConfig
from isocompute.policy.synthetic import synthetic_records
from isocompute.solver.estimators import utilities
from isocompute.solver.outcomes import from_records

ACTIONS = (1, 2, 4, 8)


def _scaled(ctx: dict, job: int) -> float:
    return ctx["scale"] * job + ctx["offset"]


def _fails(ctx: dict, job: int) -> int:
    if job == 2:
        raise ValueError("job 2 broke")
    return job


@pytest.mark.parametrize("workers", [1, 2])
def test_run_jobs_keeps_order_and_context(workers):
    done = []
    out = run_jobs(_scaled, {"scale": 2.0, "offset": 1.0}, [3, 1, 2, 0], workers=workers,
                   done=lambda: done.append(1))
    assert out == [7.0, 3.0, 5.0, 1.0] and len(done) == 4


def test_run_jobs_raises_the_first_failure_of_a_worker():
    with pytest.raises(ValueError, match="job 2 broke"):
        run_jobs(_fails, None, [0, 1, 2, 3], workers=2)


def test_worker_count_is_checked():
    assert resolve_workers(3) == 3 and resolve_workers(0) >= 1
    with pytest.raises(InputError, match="workers must be an integer ≥ 0"):
        resolve_workers(-1)


def test_cross_validate_in_two_processes_equals_one():
    table = from_records(synthetic_records(72, 8, seed=5, noise=0.3))
    U = utilities(table, ACTIONS, "majority")
    C = np.broadcast_to(np.asarray(ACTIONS, float), U.shape).copy()
    config = PolicyConfig(actions=ACTIONS, budget_range=(1.0, 8.0), n_rounds=10, calibration_folds=2, seed=1)
    args = (table.prompts, U, C, config, [1.5, 3.0, 6.0])
    one = cross_validate(*args, folds=3, seeds=(0, 1), workers=1)
    two = cross_validate(*args, folds=3, seeds=(0, 1), workers=2)
    for f in dataclasses.fields(one):
        a, b = getattr(one, f.name), getattr(two, f.name)
        if isinstance(a, np.ndarray):
            np.testing.assert_array_equal(a, b, err_msg=f.name)
        else:
            assert a == b, f.name
