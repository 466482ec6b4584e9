"""The one ``isocompute`` command.

Each subcommand lives in its own module of this package and exposes ``register(subparsers)``, which adds
its parser and sets ``func`` (a callable taking the parsed ``argparse.Namespace`` and returning an exit
code). Imports of heavy libraries happen inside ``func`` so ``isocompute --help`` stays fast.
User errors (:class:`isocompute.errors.IsoComputeError`) print their message and exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from isocompute import __version__
from isocompute.cli.running import run_parsed

# Order is the order shown by --help. A module listed here must exist.
SUBCOMMANDS: tuple[str, ...] = ("sample", "import", "solve", "fit", "report", "vote", "evidence", "serve", "replay",
                                 "train", "sweep", "demo")
# `import` is a Python keyword, so its module is import_; vote and evidence both fit on a table's answers
_MODULES = {"import": "import_", "vote": "answers", "evidence": "answers", "replay": "serve"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="isocompute",
        description="Inference-time compute allocation for reasoning LLMs (Solve-then-Learn).",
    )
    parser.add_argument("--version", action="version", version=f"isocompute {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    done: set[str] = set()
    for name in SUBCOMMANDS:
        module = _MODULES.get(name, name)
        if module not in done:  # a module registers every subcommand it holds
            importlib.import_module(f"isocompute.cli.{module}").register(sub)
            done.add(module)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return run_parsed(args, args.command)


if __name__ == "__main__":
    sys.exit(main())
