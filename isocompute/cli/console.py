"""The CLI's rich console: tables and messages for people, whole in a log file too.

On a terminal rich fits a table to the terminal's width. Anywhere else — a file, a pipe, a CI log,
``make demo > log`` — rich assumes 80 columns, and a wide table (``report`` prints ten columns) gets its
cells cut to ``0.81…``: the numbers a reader came for are lost. So when the stream is not a TTY the
console is :data:`LOG_WIDTH` columns wide: tables keep their natural width (rich does not stretch
them) and every number is printed in full; a long message is one line in the log.

Ignores: narrow terminals (a person can widen the window), colours in logs (rich writes none to a
non-terminal anyway).
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["LOG_WIDTH", "console"]

LOG_WIDTH = 1000  # columns when the output is not a terminal: wider than any table the CLI prints


def console(*, stderr: bool = False) -> Any:
    """A ``rich.console.Console`` on stdout (or stderr): the terminal's width on a TTY, else
    :data:`LOG_WIDTH` columns so that no table cell is cut."""
    from rich.console import Console  # rich costs ~0.1 s; `isocompute --help` should not pay it

    stream = sys.stderr if stderr else sys.stdout
    if getattr(stream, "isatty", lambda: False)():
        return Console(stderr=stderr)
    return Console(stderr=stderr, width=LOG_WIDTH)
