"""The CLI's console prints tables whole when stdout is not a terminal (a CI log, ``make demo > log``)."""

import subprocess
import sys

from rich.console import Console
from rich.table import Table

from isocompute.cli.console import console

CELLS = ["4", "0.8123", "0.7456", "0.7012", "0.6987", "0.6543", "3.998", "+6.3% [+1.2, +11.4] n.s.", "0.612",
         "0.701"]


def wide_table() -> Table:
    """The shape of `isocompute report`'s table: ten right-aligned columns, wider than 80 together."""
    t = Table(title="held-out accuracy (cv, 120 prompts) → runs/report")
    for col in ("budget", "oracle", "learned", "uniform", "heuristic", "random", "cost", "gain vs uniform [CI]",
                "imitation", "ceiling"):
        t.add_column(col, justify="right")
    t.add_row(*CELLS)
    return t


def test_rich_alone_cuts_numbers_in_a_log(capsys):
    """The failure being fixed: rich's default console assumes 80 columns off a terminal."""
    Console().print(wide_table())
    out = capsys.readouterr().out
    assert "0.81…" in out and "0.8123" not in out


def test_console_prints_every_number_in_full_when_not_a_tty(capsys):
    console().print(wide_table())
    out = capsys.readouterr().out
    assert "…" not in out
    row = next(line for line in out.splitlines() if "0.8123" in line)
    assert [c.strip() for c in row.strip("│ ").split("│")] == CELLS
    assert max(map(len, out.splitlines())) < 200  # the table keeps its natural width, not 1,000 columns


def test_console_in_a_real_pipe():
    """A child process writing into a pipe, as `make demo > log` does: full numbers, no ellipsis."""
    code = ("from tests.test_cli_console import wide_table; from isocompute.cli.console import console; "
            "console().print(wide_table())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "…" not in out and all(c in out for c in CELLS)
