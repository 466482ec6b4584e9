"""``isocompute refit``: the gateway's captured traffic → a policy under the consensus target → reload.

The options are :class:`isocompute.stages.refit.RefitConfig`'s fields; the work is
:func:`isocompute.stages.refit.refit`. Prints the comparison on held-out captured prompts, whether the
policy was written, and the gateway's answer to the reload. Exit 0 when written, 3 when the new policy was
worse and the serving one kept. Example::

    isocompute refit runs/capture --policy runs/policy --out runs/policy-2 --gateway http://127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from isocompute.stages.options import add_arguments, from_namespace
from isocompute.stages.refit import RefitConfig

KEPT = 3  # exit code: the new policy was worse; nothing written


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("refit", help="fit a policy on captured traffic (consensus target) and reload it",
                              description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_arguments(p, RefitConfig)
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from isocompute.stages.refit import refit

    res = refit(from_namespace(RefitConfig, args))
    if args.json:
        print(json.dumps(res.as_dict()))
        return 0 if res.written else KEPT
    print(f"captured: {res.rows} rows, {res.prompts} prompts; target: {res.target}")
    for c in res.compare:
        n, s = c["new"], c["serving"]
        print(f"budget {c['budget']:g}x: new {n['accuracy']:.4f} at {n['cost']:.2f}x tokens, serving "
              f"{s['accuracy']:.4f} at {s['cost']:.2f}x")
    for note in res.notes:
        print(note)
    if res.reloaded is not None:
        print(f"gateway reloaded: {res.reloaded}")
    return 0 if res.written else KEPT
