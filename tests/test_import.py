"""``isocompute import``: the real layouts (read from ../shared/data/real, skipped when absent), the generic
mapping, token counting, unreadable golds, every input error in one table, and resuming an interrupted run."""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest

from isocompute.cli import main
from isocompute.errors import InputError
from isocompute.solver.outcomes import OutcomeWriter, read_outcomes
from isocompute.stages.import_ import ImportConfig, import_samples
from isocompute.tasks.answers.extract import normalize_answer
from isocompute.tasks.grading import math_equal

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
REAL = SHARED / "real"
MATH500 = SHARED / "math500_test.jsonl"
BOINF = {m: REAL / "boinf" / f"analysis_math500_{m}.jsonl" for m in ("Phi-4-reasoning", "Qwen3-14B", "gpt-oss-20b")}
MOT_GSM8K = REAL / "mot" / "llama2_13b_gsm8k_pot1.json"
MOT_DATE = REAL / "mot" / "llama2_13b_date_cot1.json"


def need(*paths: Path) -> None:
    for p in paths:
        if not p.is_file():
            pytest.skip(f"{p} is absent (real data lives in <repo>/../shared/data)")


def head(src: Path, dst: Path, n: int) -> Path:
    """The first n lines of a shared file, in the test's temporary directory (never in the repository)."""
    dst.write_text("".join(src.read_text(encoding="utf-8").splitlines(keepends=True)[:n]), encoding="utf-8")
    return dst


def imp(tmp_path: Path, fmt: str, *sources: Path, name: str = "t.jsonl", **kw) -> tuple:
    cfg = ImportConfig(format=fmt, sources=list(sources), out=tmp_path / name, progress=False, **kw)
    res = import_samples(cfg)
    return res, read_outcomes(res.out)


# ------------------------------------------------------------------------------------ the real layouts
@pytest.mark.data
@pytest.mark.parametrize("model", list(BOINF))
def test_boinf_layout_imports_graded_by_math_verify(tmp_path, model):
    need(BOINF[model], MATH500)
    dump, probs = head(BOINF[model], tmp_path / BOINF[model].name, 25), head(MATH500, tmp_path / "p.jsonl", 25)
    res, table = imp(tmp_path, "boinf", dump, problems=probs)
    assert len(table) == 25 and table.n_max == 80 and not table.is_ragged and table.has_token_counts is False
    assert table.ids[0] == "math-test/precalculus/807.json" and table.prompts[0].startswith("Convert the point")
    assert table.metas[0]["problem"]["level"] == 2 and table.meta["model"] == model
    raw = [json.loads(line) for line in dump.read_text().splitlines()]
    for r, rec in zip(table.records, raw, strict=True):
        gold = normalize_answer(rec["gold_answer"])
        for s, (answer, tokens) in zip(r["samples"], rec["all_answers"], strict=True):
            assert s["completion_tokens"] == tokens
            kept = answer if answer and normalize_answer(answer) else None  # "..." normalises to nothing
            assert s["answer"] == kept, "the raw answer is kept"
            want = bool(answer) and (normalize_answer(answer) == gold or math_equal(gold, normalize_answer(answer)))
            assert s["correct"] == want, (r["id"], answer, gold)
    assert res.prompts == 25 and res.unreadable == [] and res.references == 25


@pytest.mark.data
def test_phi4_problem_0_votes_52_plus_23_as_one_class(tmp_path):
    need(BOINF["Phi-4-reasoning"], MATH500)
    dump = head(BOINF["Phi-4-reasoning"], tmp_path / "dump.jsonl", 12)
    _, table = imp(tmp_path, "boinf", dump, problems=head(MATH500, tmp_path / "p.jsonl", 12))
    votes: dict[int | None, dict[str | None, int]] = {}
    for s in table.records[0]["samples"]:
        votes.setdefault(s["class"], {}).setdefault(s["answer"], 0)
        votes[s["class"]][s["answer"]] += 1
    assert votes == {0: {"(3,\\frac{\\pi}{2})": 23, "(3,\\pi/2)": 52}, None: {None: 5}}
    assert table.correct[0].sum() == 75


@pytest.mark.data
def test_mot_gsm8k_layout_fills_missing_results_with_null_samples(tmp_path):
    need(MOT_GSM8K)
    res, table = imp(tmp_path, "mot", MOT_GSM8K)
    raw = json.loads(MOT_GSM8K.read_text())
    assert len(table) == 400 and table.n_max == 24 and not table.is_ragged
    assert table.ids[0] == "gsm8k-0" and table.meta["task"] == "gsm8k" and table.meta["answer_kind"] == "number"
    right = n = 0
    for r, rec in zip(table.records, raw, strict=True):
        results = rec["results"]
        assert [s["answer"] for s in r["samples"][: len(results)]] == [str(x) for x in results]
        assert all(s["answer"] is None for s in r["samples"][len(results):])
        assert r["meta"].get("unaligned", 0) == len(rec["generated"]) - len(results)
        for x in results:  # an independent oracle: the float is within 1e-9 of the gold number
            right += math.isclose(float(x), float(rec["answer"]), rel_tol=1e-9, abs_tol=1e-9)
        n += len(rec["generated"])
    assert res.accuracy == pytest.approx(right / n) and 0.25 < res.accuracy < 0.30
    assert res.merged_prompts > 0, "85.75000000000001 meets 85.75"


@pytest.mark.data
def test_mot_date_layout_normalises_dates(tmp_path):
    need(MOT_DATE)
    res, table = imp(tmp_path, "mot", MOT_DATE)
    raw = json.loads(MOT_DATE.read_text())
    assert len(table) == 369 and table.n_max == 20 and table.meta["task"] == "date"

    def as_date(s):
        for fmt in ("%m/%d/%Y", "%B %d, %Y", "%b %d, %Y"):
            try:
                return datetime.strptime(s.split("\n")[0].strip().rstrip("."), fmt).date()
            except ValueError:
                pass
        return s

    right = sum(as_date(x) == as_date(next(k for k, v in rec["answer"].items() if v == 1))
                for rec in raw for x in rec["results"])
    assert res.accuracy == pytest.approx(right / (369 * 20)) and 0.45 < res.accuracy < 0.55
    first = table.records[0]["samples"]  # "5/1/2021" and "05/01/2021" are one class, both correct
    assert {s["class"] for s in first if s["answer"] in ("5/1/2021", "05/01/2021")} == {first[2]["class"]}
    assert all(s["correct"] for s in first if s["answer"] in ("5/1/2021", "05/01/2021"))


# ------------------------------------------------------------------------------------ the generic format
HARNESS = [
    {"doc_id": 7, "doc": {"problem": "What is half of 1?", "answer": "\\frac{1}{2}"},
     "resps": [{"text": "So \\boxed{0.5}."}, {"text": "It is \\boxed{\\frac12}"}, {"text": "no idea"},
               {"text": "\\boxed{2}"}]},
    {"doc_id": 8, "doc": {"problem": "2+2?", "answer": 4}, "resps": [{"text": "The answer is 4."}]},
]


def test_generic_mapping_extracts_from_completions_and_counts_tokens(tmp_path, tiny_dir):
    src = tmp_path / "log.json"
    src.write_text(json.dumps(HARNESS, indent=2))
    res, table = imp(tmp_path, "jsonl", src, task="math", tokenizer=tiny_dir,
                     fields=["id=doc_id", "question=doc.problem", "gold=doc.answer", "completions=resps[].text"])
    assert table.ids == ["7", "8"] and table.golds == ["\\frac{1}{2}", "4"]
    s = table.records[0]["samples"]
    assert [x["answer"] for x in s] == ["0.5", "\\frac12", None, "2"]
    assert [x["class"] for x in s] == [0, 0, None, 1] and [x["correct"] for x in s] == [True, True, False, False]
    assert table.has_token_counts, "prompt and completion tokens counted with --tokenizer"
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    assert table.prompt_tokens[1] == len(tok("2+2?", add_special_tokens=False)["input_ids"])
    assert res.accuracy == pytest.approx(3 / 5)


def test_mot_completions_are_counted_with_a_tokenizer(tmp_path, tiny_dir):
    """Fewer results than completions: nulls fill the last samples, token counts follow the completions."""
    src = tmp_path / "pot.json"
    src.write_text(json.dumps([{"question": "What is 6*3?", "answer": 18,
                                "generated": ["ans = 6*3", "ans = 6+3", "ans = 6*"], "results": "[18.0, 9.0]"}]))
    res, table = imp(tmp_path, "mot", src, tokenizer=tiny_dir)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    s = table.records[0]["samples"]
    assert [x["answer"] for x in s] == ["18.0", "9.0", None] and [x["correct"] for x in s] == [True, False, False]
    assert [x["completion_tokens"] for x in s] == [len(tok(g, add_special_tokens=False)["input_ids"])
                                                   for g in ("ans = 6*3", "ans = 6+3", "ans = 6*")]
    assert table.records[0]["meta"]["unaligned"] == 1 and table.has_token_counts


def test_generic_jsonl_with_a_mapping_file_answers_and_scores(tmp_path):
    src = tmp_path / "d.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in [
        {"q": "Which?", "g": "B", "s": [{"a": "(b)", "n": 3, "v": 0.9}, {"a": "C", "n": 4, "v": 0.1}], "kind": "choice"},
        {"q": "When?", "g": "May 1, 2021", "s": [{"a": "5/1/2021", "n": 3, "v": 0.5}], "kind": "date"},
    ]) + "\n")
    mapping = tmp_path / "map.json"
    mapping.write_text(json.dumps({"question": "q", "gold": "g", "answers": "s[].a", "completion_tokens": "s[].n",
                                   "scores": "s[].v", "task": "kind"}))
    _, table = imp(tmp_path, "jsonl", src, mapping=mapping)
    assert table.ids == ["d-0", "d-1"] and table.has_scores
    assert table.correct.tolist() == [[True, False], [True, False]]
    assert [m["answer_kind"] for m in table.metas] == ["choice", "date"]


def test_generic_import_keeps_logprob_evidence_where_the_dump_has_it(tmp_path):
    src = tmp_path / "d.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in [
        {"question": "1+1?", "gold": "2", "answers": ["2", "3"], "logprob_mean": [-0.2, -1.1],
         "confidence_min_window": [4.5, None]},
        {"question": "2+2?", "gold": "4", "answers": ["4"]},  # a record without them
    ]) + "\n")
    _, table = imp(tmp_path, "jsonl", src, task="gsm8k")
    np.testing.assert_array_equal(table.logprob_mean, [[-0.2, -1.1], [np.nan, np.nan]])
    np.testing.assert_array_equal(table.confidence_min_window, [[4.5, np.nan], [np.nan, np.nan]])
    assert "confidence_min_window" not in table.records[0]["samples"][1]
    # mapped from other names, through a nested path
    src.write_text(json.dumps({"q": "1+1?", "g": "2", "s": [{"a": "2", "lp": -0.5, "c": 2.0}]}) + "\n")
    _, table = imp(tmp_path, "jsonl", src, name="m.jsonl", task="gsm8k",
                   fields=["question=q", "gold=g", "answers=s[].a", "logprob_mean=s[].lp", "confidence_min_window=s[].c"])
    assert (table.logprob_mean.tolist(), table.confidence_min_window.tolist()) == ([[-0.5]], [[2.0]])


def test_unreadable_gold_is_reported_with_its_id_and_left_out(tmp_path, capsys):
    src = tmp_path / "d.jsonl"
    src.write_text("\n".join(json.dumps({"id": i, "question": "q", "gold": g, "answers": ["18", "7"]})
                             for i, g in [("ok", "18"), ("bad", "eighteen"), ("none", None)]) + "\n")
    out = tmp_path / "t.jsonl"
    assert main(["import", "jsonl", str(src), "--out", str(out), "--task", "gsm8k", "--no-progress"]) == 0
    assert read_outcomes(out).ids == ["ok", "none"]  # no gold at all: imported ungraded (consensus target)
    manifest = json.loads((tmp_path / "t.jsonl.manifest.json").read_text())
    assert [u["id"] for u in manifest["unreadable"]] == ["bad"] and manifest["complete"]
    err = capsys.readouterr().err
    assert "1 record(s) left out" in err and "bad (" in err and "d.jsonl, line 2" in err and "number answer" in err


# ------------------------------------------------------------------------------------ input errors
def _boinf_line(num, gold="1", answers=(("1", 5),)):
    return json.dumps({"problem_num": num, "gold_answer": gold, "all_answers": [list(a) for a in answers]})


def _problem(answer="1"):
    return json.dumps({"problem": "p", "answer": answer})


OK = json.dumps({"question": "q", "gold": "1", "answers": ["1"]})
ERRORS = [
    # (format, {file: text}, extra args, match)
    ("jsonl", {"d.jsonl": OK + "\n{bad\n"}, ["--task", "gsm8k"], r"d\.jsonl, line 2: bad JSON"),
    ("jsonl", {"d.json": f"[\n{OK},\n{OK}\n{OK}]"}, ["--task", "gsm8k"], r"d\.json, line 4: expected ',' or ']' after the record of line 3"),
    ("jsonl", {"d.jsonl": json.dumps({"gold": "1", "answers": ["1"]})}, ["--task", "gsm8k"], r"line 1: no question"),
    ("jsonl", {"d.jsonl": OK}, ["--task", "gsm8k", "--field", "gold=doc.answer"],
     r"line 1: the mapped gold path 'doc.answer' is missing"),
    ("jsonl", {"d.jsonl": json.dumps({"question": "q", "gold": "1", "answers": ["1", "2", "3"],
                                      "completion_tokens": [4, 5]})}, ["--task", "gsm8k"],
     r"line 1: completion_tokens has 2 entries but answers has 3"),
    ("jsonl", {"d.jsonl": json.dumps({"question": "q", "gold": "1"})}, ["--task", "gsm8k"], r"line 1: no samples"),
    ("jsonl", {"d.jsonl": json.dumps({"question": "q", "gold": "1", "answers": ["1"], "logprob_mean": [0.3]})},
     ["--task", "gsm8k"], r"line 1: logprob_mean must be a list of finite numbers <= 0 or null; it holds 0.3"),
    ("jsonl", {"d.jsonl": json.dumps({"question": "q", "gold": "1", "answers": ["1", "1"],
                                      "confidence_min_window": [1.0]})}, ["--task", "gsm8k"],
     r"line 1: confidence_min_window has 1 entries but answers has 2"),
    ("jsonl", {"d.jsonl": json.dumps({"question": "q", "gold": "1", "answers": [["1"]]})}, ["--task", "gsm8k"],
     r"line 1: answers must be a list of strings, numbers or null"),
    ("jsonl", {"d.jsonl": OK}, [], r"line 1: no task: the record has none and --task was not given"),
    ("jsonl", {"d.jsonl": OK}, ["--task", "poetry"], r"unknown task or answer kind 'poetry'"),
    ("jsonl", {"d.jsonl": json.dumps({"question": "q", "gold": "1", "answers": ["1"], "task": "poetry"})}, [],
     r"d\.jsonl, line 1: unknown task or answer kind 'poetry'"),
    ("jsonl", {"d.jsonl": "\n".join([json.dumps({"id": "a", **json.loads(OK)})] * 2)}, ["--task", "gsm8k"],
     r"line 2: id 'a' repeats .*line 1"),
    ("jsonl", {"d.jsonl": OK}, ["--task", "gsm8k", "--field", "answer=x"], r"unknown mapping key\(s\) \['answer'\]"),
    ("jsonl", {"d.jsonl": OK}, ["--task", "gsm8k", "--field", "question"], r"--field takes KEY=PATH"),
    ("jsonl", {"d.jsonl": ""}, ["--task", "gsm8k"], r"no records; the file is empty"),
    ("boinf", {"d.jsonl": "\n".join(_boinf_line(i) for i in range(3)), "p.jsonl": "\n".join([_problem()] * 2)},
     ["--problems", "@p.jsonl"], r"has 3 problems but the problem file .*p\.jsonl has 2"),
    ("boinf", {"d.jsonl": "\n".join(_boinf_line(i) for i in (0, 5)), "p.jsonl": "\n".join([_problem()] * 2)},
     ["--problems", "@p.jsonl"], r"line 2: problem_num 5 is outside the problem file's 0..1"),
    ("boinf", {"d.jsonl": "\n".join(_boinf_line(0) for _ in range(2)), "p.jsonl": "\n".join([_problem()] * 2)},
     ["--problems", "@p.jsonl"], r"line 2: problem_num 0 repeats .*line 1"),
    ("boinf", {"d.jsonl": _boinf_line(0, answers=(("1", 5), ("2", -1))), "p.jsonl": _problem()},
     ["--problems", "@p.jsonl"], r"line 1: all_answers\[1\] is \['2', -1\], not \[answer, output tokens\]"),
    ("boinf", {"d.jsonl": _boinf_line(0)}, [], r"pass --problems FILE"),
    ("boinf", {"d.jsonl": "\n".join(_boinf_line(i, gold=str(i)) for i in range(12)),
               "p.jsonl": "\n".join(_problem(str(i + 100)) for i in range(12))},
     ["--problems", "@p.jsonl"], r"the problem file does not line up with the dump: 12 of 12"),
    ("mot", {"d.json": json.dumps([{"question": "q", "answer": 1, "generated": ["a", "b"], "results": [1, 2, 3]}])},
     [], r"d\.json, line 1: results has 3 entries but generated has 2"),
    ("mot", {"d.json": json.dumps([{"question": "q", "answer": 1}])}, [],
     r"line 1: missing field\(s\) \['generated', 'results'\]"),
    ("mot", {"d.json": json.dumps([{"question": "q", "answer": 1, "generated": "['a'", "results": "[]"}])}, [],
     r"line 1: generated looks like a Python literal but does not parse"),
]


@pytest.mark.parametrize(("fmt", "files", "args", "match"), ERRORS)
def test_import_errors(tmp_path, fmt, files, args, match):
    for name, text in files.items():
        (tmp_path / name).write_text(text + ("\n" if text else ""))
    src = tmp_path / next(iter(files))
    args = [str(tmp_path / a[1:]) if a.startswith("@") else a for a in args]  # @name: a file written above
    with pytest.raises(InputError, match=match):
        main_args = ["import", fmt, str(src), "--out", str(tmp_path / "out.jsonl"), "--no-progress", *args]
        from isocompute.cli import build_parser

        ns = build_parser().parse_args(main_args)
        ns.func(ns)
    assert not (tmp_path / "out.jsonl").exists(), "nothing half-written is left where the table goes"


def test_config_errors(tmp_path):
    src = tmp_path / "d.jsonl"
    src.write_text(OK + "\n")
    for kwargs, match in [
        ({"sources": [tmp_path / "nope.jsonl"]}, r"source .*nope\.jsonl does not exist"),
        ({"out": src}, r"--out .* is one of the sources"),
        ({"format": "csv"}, r"FORMAT must be one of jsonl, boinf, mot"),
        ({"format": "mot", "fields": ["question=q"]}, r"--field and --mapping describe the jsonl format"),
        ({"batch": 0}, r"--batch must be >= 1"),
    ]:
        with pytest.raises(InputError, match=match):
            ImportConfig(**{"format": "jsonl", "sources": [src], "out": tmp_path / "o.jsonl", **kwargs})


# ------------------------------------------------------------------------------------ resuming
def _dump(tmp_path: Path, n: int = 7) -> Path:
    src = tmp_path / "d.jsonl"
    src.write_text("".join(json.dumps({"id": f"q{i}", "question": f"q{i}", "gold": str(i),
                                       "answers": [str(i), f"{i}.0", "x", None]}) + "\n" for i in range(n)))
    return src


def test_interrupted_import_resumes_to_the_same_file(tmp_path, monkeypatch):
    src = _dump(tmp_path)
    fresh, _ = imp(tmp_path, "jsonl", src, name="fresh.jsonl", task="gsm8k", batch=2)
    cfg = ImportConfig(format="jsonl", sources=[src], out=tmp_path / "t.jsonl", task="gsm8k", batch=2, progress=False)
    real_write, calls = OutcomeWriter.write, []

    def dying_write(self, record):
        if len(calls) == 3:
            raise KeyboardInterrupt
        calls.append(record["id"])
        real_write(self, record)

    monkeypatch.setattr(OutcomeWriter, "write", dying_write)
    with pytest.raises(KeyboardInterrupt):
        import_samples(cfg)
    monkeypatch.setattr(OutcomeWriter, "write", real_write)
    partial = tmp_path / "t.jsonl.partial"
    assert not cfg.out.exists() and partial.is_file(), "the table appears only when complete"
    assert json.loads((tmp_path / "t.jsonl.manifest.json").read_text())["complete"] is False
    with partial.open("a") as f:
        f.write('{"id": "q3", "prompt"')  # and a line cut off by the kill
    res = import_samples(cfg)
    assert (res.written, res.skipped, res.prompts) == (4, 3, 7)
    assert cfg.out.read_bytes() == fresh.out.read_bytes() and not partial.exists()
    manifest = json.loads((tmp_path / "t.jsonl.manifest.json").read_text())
    assert manifest["complete"] and manifest["prompts"] == 7 and str(src) in manifest["inputs"]
    again = import_samples(cfg)
    assert again.written == 0 and again.prompts == 7, "a finished import is not redone"


def test_rerun_with_other_sources_refuses_to_mix(tmp_path, monkeypatch):
    src = _dump(tmp_path)
    cfg = ImportConfig(format="jsonl", sources=[src], out=tmp_path / "t.jsonl", task="gsm8k", progress=False)
    import_samples(cfg)
    src.write_text(src.read_text().replace('"q0"', '"q00"'))
    with pytest.raises(InputError, match="already exists and was not imported from these sources"):
        import_samples(cfg)
    other = ImportConfig(format="jsonl", sources=[src], out=tmp_path / "u.jsonl", task="gsm8k", progress=False)
    (tmp_path / "u.jsonl.partial").write_text("")
    (tmp_path / "u.jsonl.manifest.json").write_text(json.dumps({"kind": "outcome-import", "inputs": {}}))
    with pytest.raises(InputError, match=r"u\.jsonl\.partial is left from an import of other sources"):
        import_samples(other)


def test_cli_prints_figures_and_shows_progress(tmp_path, capsys):
    src = _dump(tmp_path, 3)
    out = tmp_path / "t.jsonl"
    assert main(["import", "jsonl", str(src), "--out", str(out), "--task", "gsm8k"]) == 0
    captured = capsys.readouterr()
    assert "import jsonl" in captured.err and "3/3" in captured.err, "a progress bar on stderr"
    assert "wrote" in captured.out and "per-sample accuracy 0.5000" in captured.out
    assert "answers: 9 distinct strings in 6 classes; 3 prompts had equivalent strings merged" in captured.out
    assert main(["import", "jsonl", str(tmp_path / "none.jsonl"), "--out", str(out)]) == 2
