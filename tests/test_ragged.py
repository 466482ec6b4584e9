"""Ragged outcome tables: drop short prompts or mark actions above a prompt's samples infeasible for it only."""

import json

import numpy as np
import pytest

from isocompute.cli import main
from isocompute.errors import InputError
from isocompute.policy.synthetic import synthetic_records
from isocompute.solver.allocate import allocate
from isocompute.solver.estimators import utilities
from isocompute.solver.outcomes import from_records
from isocompute.solver.ragged import drop_short, prepare, ragged_utilities

ACTIONS = (1, 2, 4, 8)


def _ragged_records(n_prompts: int = 60, seed: int = 0) -> list[dict]:
    """Synthetic records with 8 samples, every third prompt cut to 5 and every seventh to 3."""
    recs = synthetic_records(n_prompts, 8, seed=seed, noise=0.3)
    for i, r in enumerate(recs):
        if i % 7 == 0:
            r["samples"] = r["samples"][:3]
        elif i % 3 == 0:
            r["samples"] = r["samples"][:5]
    return recs


@pytest.fixture(scope="module")
def table():
    return from_records(_ragged_records())


@pytest.mark.parametrize("strategy", ["majority", "pass"])
def test_ragged_utilities_equal_each_prompt_alone(table, strategy):
    U, feasible = ragged_utilities(table, ACTIONS, strategy)
    for i in range(len(table)):
        n = int(table.n_samples[i])
        ks = [k for k in ACTIONS if k <= n]
        alone = utilities(table.subset([i]), ks, strategy)[0]
        np.testing.assert_allclose(U[i, : len(ks)], alone, atol=1e-12)
        assert (U[i, len(ks):] == alone[-1]).all()  # infeasible: the largest feasible action's utility
        assert feasible[i].tolist() == [k <= n for k in ACTIONS]


def test_the_solver_never_picks_an_infeasible_action(table):
    U, feasible = ragged_utilities(table, ACTIONS, "majority")
    C = np.broadcast_to(np.asarray(ACTIONS, dtype=float), U.shape).copy()
    for b in np.linspace(1.0, C[:, -1].mean(), 40):
        for rounding in ("mix", "deterministic"):
            res = allocate(U, C, float(b), rounding=rounding)
            probs = res.action_probs()
            assert (probs[~feasible] == 0).all()


def test_drop_short_counts_and_names_what_it_drops(table):
    sub, kept, dropped, floor = drop_short(table, ACTIONS, min_samples=8)
    assert floor == 8 and len(sub) + len(dropped) == len(table) and (sub.n_samples == 8).all()
    assert dropped == [table.ids[i] for i in range(len(table)) if table.n_samples[i] < 8]
    assert [table.ids[i] for i in kept] == sub.ids
    prep = prepare(table, ACTIONS, "majority", ragged="infeasible")
    assert prep.dropped == [] and prep.n_ragged == int((table.n_samples < 8).sum())
    assert "marked infeasible" in prep.summary()
    prep = prepare(table, (4, 8), "majority", ragged="infeasible")  # n = 3 cannot play k = 4: dropped
    assert len(prep.dropped) == int((table.n_samples < 4).sum()) and prep.min_samples == 4


@pytest.mark.parametrize("kwargs, match", [
    (dict(), r"have fewer samples than the largest action k = 8.*--min-samples 8.*--ragged infeasible"),
    (dict(ragged="maybe"), "ragged must be one of error, infeasible"),
    (dict(min_samples=-1), "min_samples must be an integer"),
    (dict(min_samples=99), "no prompt .* has at least 99 samples"),
])
def test_drop_short_errors(table, kwargs, match):
    with pytest.raises(InputError, match=match):
        drop_short(table, ACTIONS, **kwargs)


FIT = ["--actions", "1,2,4,8", "--n-rounds", "10", "--svd-components", "4", "--calibration-folds", "2"]


def test_cli_fit_and_report_keep_a_ragged_table(table, tmp_path, capsys):
    path = tmp_path / "ragged.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _ragged_records(90, seed=1)))
    assert main(["fit", str(path), "--out", str(tmp_path / "p0"), *FIT]) == 2
    err = capsys.readouterr().err
    assert "--min-samples 8" in err and "--ragged infeasible" in err
    assert main(["fit", str(path), "--out", str(tmp_path / "p1"), *FIT, "--min-samples", "8"]) == 0
    out = capsys.readouterr().out
    n_short = sum(1 for i in range(90) if i % 7 == 0 or i % 3 == 0)
    assert f"dropped {n_short} of 90 prompts with fewer than 8 samples" in out
    meta = json.loads((tmp_path / "p1" / "policy.json").read_text())
    assert meta["training_data"]["dropped"] == n_short and meta["n_train"] == 90 - n_short
    assert main(["fit", str(path), "--out", str(tmp_path / "p2"), *FIT, "--ragged", "infeasible"]) == 0
    assert "marked infeasible" in capsys.readouterr().out
    assert main(["report", str(path), "--policy", str(tmp_path / "p2"), "--out", str(tmp_path / "r2"), "--folds",
                 "3", "--seeds", "1", "--bootstrap", "100", "--label-reps", "2", "--budgets", "2,4"]) == 0
    rep = json.loads((tmp_path / "r2" / "report.json").read_text())
    assert rep["n_prompts"] == 90 and rep["ragged"]["ragged_prompts"] == n_short
    assert main(["solve", str(path), "--actions", "1,2,4,8", "--budget", "3", "--ragged", "infeasible",
                 "--out", str(tmp_path / "s"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["ragged_prompts"] == n_short and summary["dropped"] == 0
