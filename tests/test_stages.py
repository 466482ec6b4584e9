"""The stages as a library: each option documented once on its config field and argparse generated from
it (every field shows in ``isocompute X --help`` with its help), configs built back from the arguments
with the CLI's defaults and messages, a stage called as a function writing what the command writes, and
the stages importing neither the CLI nor the gateway."""

import argparse
import ast
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from isocompute.cli import build_parser, main
from isocompute.errors import InputError
from isocompute.stages.fit import FitConfig
from isocompute.stages.import_ import ImportConfig
from isocompute.stages.inputs import ModelInputs
from isocompute.stages.options import add_arguments, option, parse_config
from isocompute.stages.parsing import Multiple
from isocompute.stages.report import ReportConfig
from isocompute.stages.sample import SampleConfig
from isocompute.stages.solve import SolveConfig, solve

CONFIGS = {"sample": SampleConfig, "import": ImportConfig, "solve": SolveConfig, "fit": FitConfig,
           "report": ReportConfig}
STAGES = Path(__file__).resolve().parents[1] / "isocompute" / "stages"


def options_of(cls):
    """(field, metadata) of every option of ``cls``, nested groups included."""
    for f in dataclasses.fields(cls):
        if "nested" in f.metadata:
            yield from options_of(f.metadata["nested"])
        else:
            yield f, f.metadata


@pytest.mark.parametrize("command", list(CONFIGS))
def test_every_field_is_an_option_with_its_help(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for f, md in options_of(CONFIGS[command]):
        assert md.get("help"), f"{command}: field {f.name} has no help"
        flag = md.get("flag", "--" + f.name.replace("_", "-"))
        flag = flag if flag.startswith("-") else md.get("metavar", flag)  # a positional shows as its metavar
        assert flag in text, f"{command} --help does not show {flag}"
        assert " ".join(md["help"].split()[:6]) in text, f"{command} --help lacks the help of {flag}"


def test_generated_parser_keeps_the_cli_spelling_and_defaults():
    ns = build_parser().parse_args(["solve", "t.jsonl", "--budget", "4", "--out", "o", "--no-prefix-sharing",
                                    "--outcomes", "a=x", "--outcomes", "b=y"])
    assert ns.outcomes == Path("t.jsonl") and ns.budget == "4" and ns.actions == "1,2,4,8,16"  # parsed by the config
    assert ns.prefix_sharing is False and ns.model_outcomes == ["a=x", "b=y"] and ns.orders == 200
    cfg = parse_config(SolveConfig, ["t.jsonl", "--budget", "4", "--out", "o", "--actions", "8,2,2,1",
                                     "--budgets", "1:2:0.5"])
    assert cfg.actions == [1, 2, 8] and cfg.budgets == [1.0, 1.5, 2.0] and cfg.prefix_sharing is True
    assert cfg.budget == 4.0 and not isinstance(cfg.budget, Multiple)
    assert cfg.models == ModelInputs() and cfg.out == Path("o")
    fit = parse_config(FitConfig, ["t.jsonl", "--out", "p", "--features", "minilm", "--fallback-rules", "escalate"])
    assert fit.actions == (1, 2, 4, 8, 16) and fit.features == ("minilm",) and fit.fallback_rules == ("escalate",)
    assert parse_config(FitConfig, ["t.jsonl", "--out", "p"]).features == ()
    rep = parse_config(ReportConfig, ["t.jsonl", "--policy", "p", "--out", "r"])
    assert (rep.seeds, rep.budgets, rep.folds) == ("3", None, 5)


@pytest.mark.parametrize(("cls", "argv", "match"), [
    (SolveConfig, ["t.jsonl", "--budget", "4", "--out", "o", "--actions", "0,1"], r"sample counts k ≥ 1"),
    (SolveConfig, ["t.jsonl", "--budget", "4", "--out", "o", "--budgets", "3:1"], r"--budgets must be start:stop"),
    (SolveConfig, ["--budget", "4", "--out", "o"], r"pass an outcome table \(positional\)"),
    (SolveConfig, ["t.jsonl", "--budget", "4", "--out", "o", "--model-params", "a=1"], r"apply to several models"),
    (FitConfig, ["t.jsonl", "--out", "p", "--actions", "4"], r"at least two distinct sample counts"),
    (FitConfig, ["--outcomes", "a=x", "--out", "p", "--features", "minilm"], r"reads the prompt text only"),
])
def test_bad_values_raise_the_stage_message(cls, argv, match):
    with pytest.raises(InputError, match=match):
        parse_config(cls, argv)


def test_options_metadata_and_required_fields():
    @dataclasses.dataclass(kw_only=True)
    class Toy:
        table: Path = option(flag="table", type=Path, help="the table")
        out: Path = option(type=Path, help="where")
        ks: list[int] = option([1, 2], text="1,2", parse=lambda t: [int(x) for x in t.split(",")], help="ks")
        tags: list[str] = option([], flag="--tag", action="append", help="tags")

    p = argparse.ArgumentParser(formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_arguments(p, Toy)
    assert "(default: 1,2)" in p.format_help()
    with pytest.raises(SystemExit):  # --out is required
        p.parse_args(["t"])
    a, b = parse_config(Toy, ["t", "--out", "o"]), parse_config(Toy, ["t", "--out", "o", "--tag", "x", "--ks", "3"])
    assert (a.ks, a.tags, b.ks, b.tags) == ([1, 2], [], [3], ["x"])
    assert Toy(table=Path("t"), out=Path("o")).tags is not Toy(table=Path("t"), out=Path("o")).tags


def test_solve_as_a_function_writes_what_the_command_writes(tmp_path):
    rng = np.random.default_rng(0)
    table = tmp_path / "t.jsonl"
    with table.open("w") as f:
        for i in range(30):
            p = rng.beta(0.7, 0.7)
            samples = [{"answer": "42" if ok else "7", "correct": bool(ok), "completion_tokens": 50}
                       for ok in rng.random(8) < p]
            f.write(json.dumps({"id": f"q{i}", "prompt": f"q {i}", "gold": "42", "prompt_tokens": 10,
                                "samples": samples}) + "\n")
    argv = [str(table), "--actions", "1,2,4,8", "--budget", "3", "--budgets", "1:8:1"]
    assert main(["solve", *argv, "--out", str(tmp_path / "cli")]) == 0
    summary = solve(SolveConfig(outcomes=table, actions=[1, 2, 4, 8], budget=3.0,
                                budgets=[float(b) for b in range(1, 9)], out=tmp_path / "lib"))
    assert summary["out"] == str(tmp_path / "lib") and summary["plans"]
    for name in ("solution.jsonl", "summary.json", "frontier.json"):
        assert (tmp_path / "cli" / name).read_bytes() == (tmp_path / "lib" / name).read_bytes()
    params = [json.loads((tmp_path / d / "manifest.json").read_text())["params"] for d in ("cli", "lib")]
    assert params[0] == params[1]


def test_stages_import_neither_the_cli_nor_the_gateway():
    for path in STAGES.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                assert not name.startswith(("isocompute.cli", "isocompute.app")), f"{path.name} imports {name}"
