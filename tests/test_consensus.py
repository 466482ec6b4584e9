"""The consensus target: credit by agreement with a prompt's plurality class, ties split evenly — a
hand-worked case, the estimators against brute force over subsets and orders averaged over the tied
references, tables without gold through the reader and the stages, and the agreement with gold."""

import functools
import itertools
import json
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isocompute.errors import InputError
from isocompute.solver.estimators import utilities
from isocompute.solver.outcomes import from_records, read_outcomes
from isocompute.solver.plans.estimates import estimate_table
from isocompute.solver.plans.plan import parse_plan
from isocompute.solver.votes.consensus import agreement, consensus_credit, resolve_target, with_target


def table_of(rows, graded=True, scores=None):
    recs = []
    for i, codes in enumerate(rows):
        samples = []
        for j, c in enumerate(codes):
            s = {"answer": None if c < 0 else f"a{c}"}
            if graded:
                s["correct"] = c == 0
            if scores is not None:
                s["score"] = scores[i][j]
            samples.append(s)
        recs.append({"id": f"p{i}", "prompt": f"q{i}", **({"gold": "a0"} if graded else {}), "samples": samples})
    return from_records(recs)


def references(codes):
    """The tied plurality classes of a row (empty when no sample has an answer)."""
    votes = [c for c in codes if c >= 0]
    if not votes:
        return []
    top = max(votes.count(c) for c in set(votes))
    return sorted(c for c in set(votes) if votes.count(c) == top)


def brute(codes, k, strategy, scores=None):
    """Exact consensus utility: for each tied reference r, the strategy's exact expectation over all k-subsets
    when a sample is right iff its class is r; averaged over the references (ties split evenly)."""
    refs = references(codes)
    if not refs:
        return 0.0
    subsets = list(itertools.combinations(range(len(codes)), k))
    total = Fraction(0)
    for r in refs:
        right = [c == r for c in codes]
        acc = Fraction(0)
        for s in subsets:
            if strategy == "pass":
                acc += any(right[i] for i in s)
            elif strategy == "best_of":
                top = max(scores[i] for i in s)
                tied = [i for i in s if scores[i] == top]
                acc += Fraction(sum(right[i] for i in tied), len(tied))
            else:
                votes = {}
                for i in s:
                    if codes[i] >= 0:
                        votes.setdefault(codes[i], []).append(i)
                if votes:
                    top = max(map(len, votes.values()))
                    win = [v for v in votes.values() if len(v) == top]
                    acc += sum(Fraction(right[v[0]]) for v in win) / len(win)
        total += acc / len(subsets)
    return float(total / len(refs))


def test_hand_worked_credit_and_majority():
    # [a, a, b, b, c, null]: a and b tie at the top → each is the reference half the time
    credit = consensus_credit([[0, 0, 1, 1, 2, -1]])
    np.testing.assert_allclose(credit, [[0.5, 0.5, 0.5, 0.5, 0, 0]])
    t = with_target(table_of([[0, 0, 1, 1, 2, -1]], graded=False))
    assert t.target == "consensus"
    np.testing.assert_allclose(utilities(t, [6], "majority"), [[0.5]])
    # one clear plurality: the a's are right, maj@1 = 3/5 (nulls never right), pass@2 = 1 − C(2,2)/C(5,2)
    t = with_target(table_of([[0, 0, 0, 1, -1]], graded=False))
    np.testing.assert_allclose(utilities(t, [1], "majority"), [[0.6]])
    np.testing.assert_allclose(utilities(t, [2], "pass"), [[0.9]])


rows = st.integers(1, 7).flatmap(lambda n: st.tuples(
    st.lists(st.integers(-1, 3), min_size=n, max_size=n),
    st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=n, max_size=n)))


@settings(max_examples=120, deadline=None)
@given(rows, st.sampled_from(["majority", "pass", "best_of"]))
def test_estimators_under_consensus_equal_brute_force(row, strategy):
    codes, scores = row
    t = with_target(table_of([codes], graded=False, scores=[scores]))
    ks = list(range(1, len(codes) + 1))
    got = utilities(t, ks, strategy)[0]
    want = [brute(codes, k, strategy, scores) for k in ks]
    np.testing.assert_allclose(got, want, atol=1e-12)


def brute_plan(codes, plan):
    """Consensus utility of a plan over all n! orders, averaged over the tied references."""
    refs = references(codes)
    if not refs:
        return 0.0
    answers = [None if c < 0 else c for c in codes]

    @functools.cache
    def stop(labels):
        for K in plan.boundaries:
            if plan.step(list(labels[:K])).stop:
                return K
        raise AssertionError("a plan stops at its last wave")

    total = Fraction(0)
    perms = list(itertools.permutations(range(len(codes))))
    for perm in perms:
        K = stop(tuple(answers[i] for i in perm[: plan.max_samples]))
        votes = {}
        for i in perm[:K]:
            if answers[i] is not None:
                votes[answers[i]] = votes.get(answers[i], 0) + 1
        if votes:
            top = max(votes.values())
            win = [c for c, v in votes.items() if v == top]
            total += Fraction(sum(c in refs for c in win), len(win) * len(refs))
    return float(total / len(perms))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(-1, 2), min_size=5, max_size=5))
def test_plans_under_consensus_equal_brute_force(codes):
    plans = [parse_plan(p) for p in ("lead:m=2@1x5", "window:w=2@2x2,1", "none@3", "beta:p=0.75@1x5")]
    t = with_target(table_of([codes], graded=False))
    est = estimate_table(t, plans, method="exact")
    np.testing.assert_allclose(est.utility[0], [brute_plan(codes, p) for p in plans], atol=1e-12)


def test_gold_and_consensus_agree_when_the_plurality_is_gold():
    # every prompt's plurality class is the correct one and grading is consistent: the targets coincide
    rows_ = [[0, 0, 1, -1], [0, 0, 0, 2], [1, 0, 0, 0]]
    gold = table_of(rows_)
    cons = with_target(gold, "consensus")
    np.testing.assert_allclose(utilities(gold, [1, 3], "majority"), utilities(cons, [1, 3], "majority"))
    ag = agreement(gold)
    assert ag.sample_flip == 0 and ag.plurality_right == 1 and ag.n_samples == 12


def test_agreement_counts_flips_and_wrong_pluralities():
    # prompt 0: plurality b (wrong) → the 2 b's and the a flip; prompt 1: a/b tie → right half the time
    t = table_of([[1, 1, 0, 2], [0, 1, -1, -1]])
    ag = agreement(t)
    assert ag.plurality_right == pytest.approx(0.25)
    assert ag.sample_flip == pytest.approx(4 / 8)  # 3 in prompt 0, the tied wrong b of prompt 1


def test_rows_without_gold_are_read_and_default_to_consensus(tmp_path):
    p = tmp_path / "t.jsonl"
    lines = [{"id": "a", "prompt": "x", "samples": [{"answer": "1"}, {"answer": "1"}, {"answer": "2"}]},
             {"id": "b", "prompt": "y", "gold": None, "samples": [{"answer": "3", "correct": None}]}]
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    t = read_outcomes(p)
    assert not t.has_gold and t.golds == [None, None] and t.target == "gold"
    assert resolve_target(t, None) == "consensus"
    with pytest.raises(InputError, match=r"--target gold needs a verdict .* 4 samples .* --target consensus"):
        with_target(t, "gold")
    c = with_target(t)
    np.testing.assert_allclose(c.correct[0], [1, 1, 0])
    assert c.n_correct.tolist() == [2, 1]
    assert with_target(c, "consensus") is c
    graded = table_of([[0, 1]])
    assert graded.has_gold and resolve_target(graded, None) == "gold"
    with pytest.raises(InputError, match="unknown target 'silver'"):
        resolve_target(graded, "silver")


def unlabelled_table(path, n=48, seed=0):
    """A synthetic table without gold: easy prompts agree, hard ones scatter."""
    rng = np.random.default_rng(seed)
    with path.open("w") as f:
        for i in range(n):
            p = 0.3 + 0.65 * rng.random()
            ans = [("7" if rng.random() < p else str(rng.integers(0, 5))) for _ in range(8)]
            f.write(json.dumps({"id": f"q{i}", "prompt": f"what is {i} + {'x ' * int(10 * p)}?", "prompt_tokens": 9,
                                "samples": [{"answer": a, "completion_tokens": int(rng.integers(50, 200))}
                                            for a in ans]}) + "\n")
    return path


def test_solve_and_fit_read_a_table_without_gold_and_record_the_target(tmp_path):
    from isocompute.policy.loading import load_policy
    from isocompute.stages.fit import FitConfig, fit
    from isocompute.stages.options import parse_config
    from isocompute.stages.solve import SolveConfig, solve

    t = unlabelled_table(tmp_path / "t.jsonl")
    s = solve(parse_config(SolveConfig, [str(t), "--budget", "2", "--out", str(tmp_path / "s"), "--plans", "none",
                                         "--actions", "1,2,4"]))
    assert s["target"] == "consensus"
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert manifest["params"]["target"] == "consensus"
    with pytest.raises(InputError, match="--target gold needs a verdict"):
        solve(parse_config(SolveConfig, [str(t), "--budget", "2", "--out", str(tmp_path / "s2"), "--plans", "none",
                                         "--actions", "1,2,4", "--target", "gold"]))
    res = fit(parse_config(FitConfig, [str(t), "--out", str(tmp_path / "p"), "--plans", "none", "--actions", "1,2,4",
                                       "--n-rounds", "5", "--calibration-folds", "2"]))
    assert res.target_note.startswith("target: consensus")
    assert load_policy(tmp_path / "p").config.target == "consensus"
    assert res.policy.decide(["what is 1 + 1?"], budget=2.0).k[0] in (1, 2, 4)


def test_import_writes_rows_without_gold_with_classes_and_no_verdicts(tmp_path):
    from isocompute.stages.import_ import ImportConfig, import_samples

    src = tmp_path / "d.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in [
        {"q": "Which?", "s": ["(b)", "B", "C"]},  # no gold: classes only
        {"q": "Also?", "gold": "C", "s": ["C", "(c)", "A"]},
    ]) + "\n")
    res = import_samples(ImportConfig(format="jsonl", sources=[src], out=tmp_path / "t.jsonl", progress=False,
                                      task="choice", fields=["question=q", "answers=s"]))
    t = read_outcomes(tmp_path / "t.jsonl")
    assert res.target == "consensus" and not t.has_gold and t.golds == [None, "C"]
    assert [s.get("correct") for s in t.records[0]["samples"]] == [None, None, None]
    assert [s["class"] for s in t.records[0]["samples"]] == [0, 0, 1]  # (b) and B are one class
    assert res.accuracy == pytest.approx(4 / 6)  # two of three agree with each prompt's plurality


def test_sample_grades_labelled_prompts_and_leaves_unlabelled_ones_ungraded(tmp_path):
    from isocompute.engines.base import Completion
    from isocompute.solver.outcomes import OutcomeRecord, Sample, record_to_json
    from isocompute.stages.sample import _grade_and_classify
    from isocompute.tasks.base import Problem
    from isocompute.tasks.grading import Grader
    from isocompute.tasks.gsm8k import load

    data = tmp_path / "g.jsonl"
    data.write_text(json.dumps({"question": "q1", "answer": "x\n#### 18"}) + "\n" + json.dumps({"question": "q2"}) + "\n")
    problems = load(data)
    assert [p.gold for p in problems] == ["18", None]
    bad = tmp_path / "b.jsonl"
    bad.write_text(json.dumps({"question": "q", "answer": "no marker"}) + "\n")
    with pytest.raises(InputError, match="no '#### <final answer>' line"):
        load(bad)  # an answer that does not parse is still an error, not an unlabelled prompt
    outs = [[Completion(t, 5, 3) for t in ("#### 18", "The answer is 7.")],
            [Completion(t, 5, 3) for t in ("The answer is 4.", "so 4.0", "I give up")]]
    problems = [Problem("a", "q1", "18", "gsm8k"), Problem("b", "q2", None, "gsm8k")]
    with Grader(workers=1) as grader:
        graded, classes = _grade_and_classify(grader, problems, outs)
    assert graded.correct == [True, False, None, None, None]
    assert graded.answers[2:] == ["4", "4.0", None] and classes[1] == [0, 0, None]
    line = record_to_json(OutcomeRecord("b", "q2", None, tuple(Sample(a, None) for a in ("4", "4.0"))))
    assert "correct" not in line and "gold" not in line


def test_report_scores_every_method_under_both_targets(tmp_path):
    from isocompute.cli import main

    rng = np.random.default_rng(1)
    t = tmp_path / "t.jsonl"
    with t.open("w") as f:
        for i in range(60):
            p = 0.2 + 0.75 * rng.random()
            ans = [("7" if rng.random() < p else str(rng.integers(0, 3))) for _ in range(8)]
            f.write(json.dumps({"id": f"q{i}", "prompt": f"q {i} " + "hard " * int(8 * (1 - p)), "gold": "7",
                                "samples": [{"answer": a, "correct": a == "7", "completion_tokens": 40 + 10 * j}
                                            for j, a in enumerate(ans)]}) + "\n")
    assert main(["fit", str(t), "--target", "consensus", "--out", str(tmp_path / "pol"), "--plans", "lead",
                 "--actions", "1,2,4,8", "--n-rounds", "5", "--calibration-folds", "2"]) == 0
    for target, other in (("consensus", "gold"), ("gold", "consensus")):
        out = tmp_path / f"rep-{target}"
        assert main(["report", str(t), "--policy", str(tmp_path / "pol"), "--out", str(out), "--folds", "2",
                     "--seeds", "1", "--budgets", "2,4", "--bootstrap", "100", "--target", target]) == 0
        rep = json.loads((out / "report.json").read_text())
        assert rep["target"]["scored_on"] == target and rep["target"]["also"] == other
        assert json.loads((out / "manifest.json").read_text())["params"]["target"] == target
        for e in rep["budgets"]:
            assert all(0 <= row[other] <= 1 for row in e["methods"].values())
            assert "fixed_best" in e["methods"] and "uniform" in e["methods"]
        assert f"| {other} |" in (out / "report.md").read_text()


def test_evidence_walks_and_vote_evidence_credit_consensus_values():
    from isocompute.policy.evidence.walks import walk
    from isocompute.solver.votes.evidence import evidence

    # a and b tie over all samples: each is worth ½ under consensus, so a finished tie is worth ½, not 1
    codes = np.array([[0, 1, 0, 1]])
    w = walk(codes, consensus_credit(codes), np.array([[1.0, 2.0, 3.0, 4.0]]), np.array([4]), (4,), unit=1.0,
             draws=8, seed=0)
    assert np.allclose(w.utility[:, -1], 0.5) and np.allclose(w.utility[:, 0], 0.5)
    ev = evidence(with_target(table_of([[0, 1, 0, 1, 2]], graded=False)))
    np.testing.assert_allclose(ev.value[0], [0.5, 0.5, 0.5, 0.5, 0.0])
