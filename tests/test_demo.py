"""``isocompute demo`` chains the ordinary subcommands: which stages it runs, and the embedded checkpoint it starts
from unless told to train (the whole loop runs end to end in test_docker's first-start test)."""

from __future__ import annotations

import json

import pytest

from isocompute.cli import demo


@pytest.fixture
def invoked(monkeypatch):
    """The stages' argv in order; each 'succeeds' by writing the marker the demo checks (the subcommands
    themselves have their own tests)."""
    calls: list[list[str]] = []

    def fake(commands, argv):
        calls.append(argv)
        out = argv[argv.index("--out") + 1]
        from pathlib import Path

        if argv[0] == "sample":
            Path(out).write_text("".join(json.dumps({"id": f"p{i}"}) + "\n" for i in range(20)))
        else:
            Path(out).mkdir(parents=True, exist_ok=True)
            (Path(out) / "manifest.json").write_text("{}")
        return 0

    monkeypatch.setattr(demo, "_invoke", fake)
    return calls


def run(tmp_path, *extra):
    import argparse

    parser = argparse.ArgumentParser()
    demo.register(parser.add_subparsers())
    args = parser.parse_args(["demo", "--out", str(tmp_path), "--prompts", "20", "--workers", "1", *extra])
    return demo.run(args, {})


def test_the_default_demo_starts_from_the_embedded_checkpoint_and_says_so(tmp_path, invoked, capsys):
    assert run(tmp_path) == 0
    assert [a[0] for a in invoked] == ["sample", "solve", "fit", "report"]
    assert (tmp_path / "tiny-sft" / "model.safetensors").is_file()
    assert "shortened — copied the embedded checkpoint" in capsys.readouterr().out
    invoked.clear()
    assert run(tmp_path) == 0 and invoked == []  # everything done: a second run redoes nothing


@pytest.mark.parametrize("extra, steps", [(["--train"], None), (["--sft-steps", "3"], "3"), (["--seed", "1"], None)])
def test_train_sft_steps_or_another_seed_train_from_scratch(tmp_path, invoked, extra, steps):
    assert run(tmp_path, *extra) == 0
    sft = invoked[0]
    assert sft[:2] == ["train", "sft"] and (steps is None) == ("--steps" not in sft)
    if steps:
        assert sft[sft.index("--steps") + 1] == steps
