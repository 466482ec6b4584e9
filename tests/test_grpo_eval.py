"""Held-out evaluation of a policy (sampling, grading, maj@k / pass@k, confidence intervals) and the
resumable `isocompute sweep run` that trains and evaluates grid points."""

import json

import numpy as np
import pytest

from isocompute.errors import InputError
from isocompute.solver.estimators import majority_at_k
from isocompute.tasks import arith
from isocompute.training import tiny
from isocompute.training.evaluation import EvalResult, evaluate, mean_ci, reference_probability
from isocompute.training.rewards import answer_codes


def test_mean_ci_hand_worked():
    # mean 0.5, sd (ddof 1) = 0.57735, half-width 1.96·0.57735/2 = 0.5658
    m, lo, hi = mean_ci([0.0, 1.0, 1.0, 0.0])
    assert m == 0.5 and hi - m == pytest.approx(1.959964 * np.sqrt(1 / 3) / 2, rel=1e-6) and m - lo == hi - m
    assert mean_ci([0.3]) == (0.3, 0.3, 0.3)
    with pytest.raises(InputError, match="at least one problem"):
        mean_ci([])


@pytest.mark.slow
def test_evaluate_tiny_model_shapes_and_estimators():
    model, tok = tiny.build_model(seed=0), tiny.build_tokenizer()
    problems = arith.generate(3, seed=0, mix={1: 1.0})
    res = evaluate(model, tok, problems, n=4, ks=(1, 2, 4), max_new_tokens=6, seed=1)
    assert res.correct.shape == (3, 4) and res.maj.shape == (3, 3) and res.completion_tokens.shape == (3, 4)
    assert ((res.completion_tokens >= 1) & (res.completion_tokens <= 6)).all()
    np.testing.assert_allclose(res.metric("accuracy"), res.correct.mean(axis=1))
    np.testing.assert_allclose(res.metric("maj@1"), res.metric("accuracy"))
    assert set(res.summary()) >= {"accuracy", "maj@4", "pass@4", "maj@2"}
    again = evaluate(model, tok, problems, n=4, ks=(1, 2, 4), max_new_tokens=6, seed=1)
    np.testing.assert_array_equal(again.correct, res.correct)  # seeded


def test_eval_result_metric_lookup():
    correct = np.array([[1, 0, 1, 1], [0, 0, 0, 0]], dtype=bool)
    codes = answer_codes([["3", "4", "3", "3"], ["1", "2", None, "1"]])
    res = EvalResult(4, (4,), correct, majority_at_k(codes, correct, [4]).reshape(2, 1), np.zeros((2, 1)))
    assert res.metric("maj@4").tolist() == [1.0, 0.0] and res.accuracy == 3 / 8
    with pytest.raises(InputError, match="unknown metric"):
        res.metric("maj@8")


@pytest.mark.slow
def test_sweep_run_trains_evaluates_and_resumes(tmp_path, capsys):
    pytest.importorskip("trl")
    from isocompute.cli import main

    grid = tmp_path / "grid.jsonl"
    assert main(["sweep", "grid", "--budgets", "4", "--n", "2", "--prompts-per-step", "2", "--out", str(grid)]) == 0
    args = ["sweep", "run", "--grid", str(grid), "--out", str(tmp_path / "sw"), "--eval-problems", "2",
            "--eval-n", "3", "--max-completion-length", "4"]
    assert main(args) == 0
    runs = [json.loads(line) for line in (tmp_path / "sw" / "runs.jsonl").read_text().splitlines()]
    assert len(runs) == 1
    r = runs[0]
    assert (r["n"], r["prompts_per_step"], r["steps"], r["rollouts"]) == (2, 2, 1, 4)
    assert 0 < r["rho"] < 1 and 0 < r["rho_analytic"] < 1 and {"accuracy", "maj@3", "reward"} <= set(r)
    assert r["eval_n"] == 3  # the evaluation's sample count does not overwrite the grid's n
    assert main(args) == 0  # resumes: nothing left to run
    assert len((tmp_path / "sw" / "runs.jsonl").read_text().splitlines()) == 1


def _brute_reference_probability(model, tok, prompt, ref):
    """One unpadded forward pass per reference token: the product of next-token probabilities."""
    import torch

    head = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False)
    ids = tok(head, add_special_tokens=False)["input_ids"]
    prob = 1.0
    with torch.no_grad():
        for y in tok(ref, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]:
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1].double()
            prob *= float(torch.softmax(logits, -1)[y])
            ids.append(y)
    return prob


def test_reference_probability_equals_token_by_token_product_and_ignores_padding():
    model, tok = tiny.build_model(seed=3), tiny.build_tokenizer()
    problems = arith.generate(5, seed=0, mix={1: 1.0, 3: 1.0})
    prompts = [p.prompt for p in problems]
    refs = [arith.solution_for(p) for p in problems]
    refs[1] = "7"  # mixed lengths: padding must not leak into the shorter rows
    got = reference_probability(model, tok, prompts, refs, batch_rows=3)
    brute = [_brute_reference_probability(model, tok, q, r) for q, r in zip(prompts, refs, strict=True)]
    np.testing.assert_allclose(np.log(got), np.log(brute), atol=1e-4)  # probabilities down to 1e-69
    np.testing.assert_allclose(reference_probability(model, tok, prompts, refs, batch_rows=1), got, rtol=1e-5)
    model.train()
    reference_probability(model, tok, prompts[:1], refs[:1])
    assert model.training


@pytest.mark.parametrize(("prompts", "refs", "match"), [
    (["What is 1 + 1?"], [], "one reference per prompt"),
    ([], [], "at least one prompt"),
])
def test_reference_probability_errors(prompts, refs, match):
    with pytest.raises(InputError, match=match):
        reference_probability(tiny.build_model(seed=0), tiny.build_tokenizer(), prompts, refs)
