"""The "Configuration" table of docs/gateway.md is the one place the gateway's settings are documented: it
must list exactly the fields of :class:`isocompute.app.settings.Settings`, each with its ``ISOCOMPUTE_<FIELD>``
variable and its real default, and the section's TOML example must load. A new setting without a row, a
changed default or a renamed field fails here.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from isocompute.app.settings import Settings

DOC = Path(__file__).resolve().parents[1] / "docs" / "gateway.md"


def config_section(text: str) -> str:
    m = re.search(r"^## Configuration\n(.*?)(?=^## )", text, flags=re.MULTILINE | re.DOTALL)
    assert m, 'docs/gateway.md has no "## Configuration" section followed by another section'
    return m.group(1)


def split_row(line: str) -> list[str]:
    """Cells of a Markdown table row; ``\\|`` inside a cell is a literal bar."""
    cells = re.split(r"(?<!\\)\|", line.strip().strip("|"))
    return [c.strip().replace("\\|", "|") for c in cells]


def parse_table(section: str) -> tuple[list[str], list[list[str]]]:
    lines = [ln for ln in section.splitlines() if ln.startswith("|")]
    assert len(lines) >= 3, "no Markdown table in the Configuration section"
    header = split_row(lines[0])
    assert set("".join(split_row(lines[1]))) <= set("-: "), "second table line is not the |---| rule"
    return header, [split_row(ln) for ln in lines[2:]]


def parse_default(cell: str) -> object:
    """The documented default as a value: ``none`` → None, else the JSON inside the backticks (``true``,
    ``4.0``, ``[]``), else the text (``127.0.0.1``, ``first``)."""
    if cell == "none":
        return None
    m = re.fullmatch(r"`([^`]*)`", cell)
    assert m, f"default {cell!r} is neither `value` nor none"
    try:
        return json.loads(m.group(1))
    except json.JSONDecodeError:
        return m.group(1)


def real_default(name: str) -> object:
    return Settings.model_fields[name].get_default(call_default_factory=True)


@pytest.fixture
def no_isocompute_env(monkeypatch):
    """Settings as the defaults and the test make them, not a developer's own ISOCOMPUTE_* variables."""
    for k in [k for k in os.environ if k.startswith("ISOCOMPUTE_")]:
        monkeypatch.delenv(k)


@pytest.fixture(scope="module")
def rows():
    header, rows = parse_table(config_section(DOC.read_text()))
    assert header == ["setting", "env var", "default", "meaning"]
    assert all(len(r) == 4 for r in rows), [r for r in rows if len(r) != 4]
    return rows


def test_parsers_on_a_hand_written_table():
    section = "x\n| a | b |\n|---|:-:|\n| `p` \\| `q` | `4.0` |\n\ntext\n"
    header, body = parse_table(section)
    assert header == ["a", "b"] and body == [["`p` | `q`", "`4.0`"]]
    assert [parse_default(c) for c in ("none", "`true`", "`4.0`", "`[]`", "`127.0.0.1`", "`first`")] == [
        None, True, 4.0, [], "127.0.0.1", "first"]
    with pytest.raises(AssertionError, match="neither"):
        parse_default("4.0")


def test_table_lists_exactly_the_settings(rows):
    names = [re.fullmatch(r"`(\w+)`", r[0]).group(1) for r in rows]
    assert len(names) == len(set(names)), "a setting is listed twice"
    assert set(names) == set(Settings.model_fields), (
        f"undocumented: {sorted(set(Settings.model_fields) - set(names))}; "
        f"no such setting: {sorted(set(names) - set(Settings.model_fields))}")


def test_env_vars_and_defaults_are_the_real_ones(rows):
    for setting, env, default, meaning in rows:
        name = setting.strip("`")
        assert env == f"`ISOCOMPUTE_{name.upper()}`", name
        documented, real = parse_default(default), real_default(name)
        # the type too: a float default is written `4.0`, not `4`
        assert documented == real and type(documented) is type(real), (
            f"{name}: docs/gateway.md says {default}, Settings says {real!r}")
        assert meaning, f"{name} has no meaning"


def test_the_documented_env_var_is_read(rows, monkeypatch, no_isocompute_env):
    """Two rows taken at their word: setting the variable the table names changes the setting."""
    env = dict((r[0].strip("`"), r[1].strip("`")) for r in rows)
    monkeypatch.setenv(env["max_samples"], "7")
    monkeypatch.setenv(env["upstreams"], '["http://a:1"]')
    s = Settings()
    assert s.max_samples == 7 and s.upstreams == ["http://a:1"]


def test_the_toml_example_loads(tmp_path, monkeypatch, no_isocompute_env):
    section = config_section(DOC.read_text())
    m = re.search(r"```toml\n(.*?)```", section, flags=re.DOTALL)
    assert m, "the Configuration section has no ```toml example"
    cfg = tmp_path / "gateway.toml"
    cfg.write_text(m.group(1))
    monkeypatch.setenv("ISOCOMPUTE_CONFIG", str(cfg))
    s = Settings()
    assert s.engine == "vllm-http" and len(s.upstreams) == 2 and s.policy_dir is not None
    assert s.model_fields_set >= {"engine", "upstreams", "policy_dir", "model_dir"}


def test_serve_warns_about_unknown_isocompute_variables():
    from isocompute.cli.serve import unknown_env

    env = {"ISOCOMPUTE_PORT": "1", "ISOCOMPUTE_POLICYDIR": "x", "ISOCOMPUTE_CONFIG": "c.toml",
           "ISOCOMPUTE_VLLM_PYTHON": "p", "ISOCOMPUTE_DEMO_DIR": "d", "PATH": "/bin"}
    assert unknown_env(env) == ["ISOCOMPUTE_POLICYDIR"]
