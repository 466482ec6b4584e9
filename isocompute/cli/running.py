"""Running one parsed subcommand as the ``isocompute`` command does: its exit code, a user error printed as
one line (exit 2), an interrupt as a note that finished work is kept (exit 130). ``isocompute`` itself
(:func:`isocompute.cli.main`) and the demo's chained stages (:mod:`isocompute.cli.demo`) both run through it.
"""

from __future__ import annotations

import argparse
import sys

from isocompute.errors import IsoComputeError


def run_parsed(args: argparse.Namespace, command: str) -> int:
    """``args.func(args)`` as an exit code, errors printed to stderr as ``isocompute COMMAND: error: …``."""
    try:
        return int(args.func(args) or 0)
    except IsoComputeError as e:
        print(f"isocompute {command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"isocompute {command}: interrupted; finished work is kept.", file=sys.stderr)
        return 130
