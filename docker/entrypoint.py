"""The container's entrypoint: serve the gateway, on the embedded default unless told otherwise.

    entrypoint.py [SERVE FLAGS…]     isocompute serve, with what the settings leave unset filled in
    entrypoint.py COMMAND [ARGS…]    run COMMAND instead (e.g. `isocompute demo …`, `sh`)

Settings come first from the environment (``ISOCOMPUTE_<FIELD>``) and the TOML file in
``ISOCOMPUTE_CONFIG``, as for ``isocompute serve`` anywhere; extra flags are appended to serve's command
line and win over both. The entrypoint resolves them with serve's own parser and settings, then fills in
only what none of them set:

* no ``policy_dir``: the embedded default — ``--policy DEMO/policy`` and, if ``model_dir`` is unset
  too, ``--model DEMO/tiny-sft``. When those artifacts are missing it first runs
  ``isocompute demo --out DEMO`` (about 3 minutes on 2 CPU cores, once: the demo skips finished stages
  and resumes an interrupted one). ``ISOCOMPUTE_DEMO_ARGS`` adds flags to that run.
* no ``host``: ``--host 0.0.0.0`` (serve's own default, loopback, is unreachable from outside a container).

DEMO is ``$ISOCOMPUTE_DEMO_DIR`` if set, else the demo baked into the image at build time
(``$ISOCOMPUTE_BAKED_DEMO_DIR``, default ``/opt/isocompute/demo``) if it is complete, else ``/data/demo``
(mount a volume at ``/data`` to keep it across containers). ``ISOCOMPUTE_ENTRYPOINT_DRY_RUN=1`` prints
the commands it would run, one per line, and exits.

Ignores: a ``--policy``/``--model`` of the user's that does not exist (serve reports it), concurrent
first starts on one volume (each would run the demo; its artifacts are written atomically).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

DEFAULT_DEMO_DIR = Path("/data/demo")
DEFAULT_BAKED_DEMO_DIR = Path("/opt/isocompute/demo")
# what `isocompute demo` writes last for the two artifacts serve reads (its own "stage done" markers)
DEMO_MARKERS = ("policy/manifest.json", "tiny-sft/manifest.json")


def demo_complete(d: Path) -> bool:
    return all((d / m).is_file() for m in DEMO_MARKERS)


def demo_dir(env: dict[str, str]) -> Path:
    """Where the embedded default lives: see the module docstring for the order."""
    if env.get("ISOCOMPUTE_DEMO_DIR"):
        return Path(env["ISOCOMPUTE_DEMO_DIR"])
    baked = Path(env.get("ISOCOMPUTE_BAKED_DEMO_DIR") or DEFAULT_BAKED_DEMO_DIR)
    return baked if demo_complete(baked) else DEFAULT_DEMO_DIR


def fields_set(serve_args: list[str]) -> set[str]:
    """The settings that flags, ``ISOCOMPUTE_*`` variables or the config file set, resolved by serve itself.

    Raises :class:`isocompute.errors.InputError` (or exits 2 on an unknown flag) as serve would.
    """
    from isocompute.cli import build_parser
    from isocompute.cli.serve import settings_from_args

    args = build_parser().parse_args(["serve", *serve_args])
    return set(settings_from_args(args).model_fields_set)


def plan(serve_args: list[str], env: dict[str, str]) -> tuple[list[str] | None, list[str]]:
    """``(demo command or None, serve command)`` for these serve flags and environment."""
    given = fields_set(serve_args)
    fill: list[str] = []
    demo: list[str] | None = None
    if "policy_dir" not in given:
        d = demo_dir(env)
        fill += ["--policy", str(d / "policy")]
        if "model_dir" not in given:
            fill += ["--model", str(d / "tiny-sft")]
        if not demo_complete(d):
            demo = ["isocompute", "demo", "--out", str(d), *shlex.split(env.get("ISOCOMPUTE_DEMO_ARGS", ""))]
    if "host" not in given:
        fill += ["--host", "0.0.0.0"]
    # serve's flags after ours: argparse keeps the last value, so anything the user passed wins
    return demo, ["isocompute", "serve", *fill, *serve_args]


def run_forwarding_signals(cmd: list[str]) -> int:
    """Run ``cmd`` to completion; SIGTERM/SIGINT (``docker stop``, Ctrl-C) go to it, not to us.

    As PID 1 this process would otherwise ignore SIGTERM, and ``docker stop`` would wait for its SIGKILL.
    """
    child = subprocess.Popen(cmd)

    def forward(signum: int, _frame: object) -> None:
        child.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    rc = child.wait()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
    return rc


def main(argv: list[str]) -> int:
    if argv and not argv[0].startswith("-"):
        os.execvp(argv[0], argv)
    from isocompute.errors import IsoComputeError

    env = dict(os.environ)
    try:
        demo, serve = plan(argv, env)
    except (IsoComputeError, ValueError) as e:  # ValueError: the settings' own check of ISOCOMPUTE_CONFIG
        print(f"entrypoint: error: {e}", file=sys.stderr)
        return 2
    if env.get("ISOCOMPUTE_ENTRYPOINT_DRY_RUN") == "1":
        for cmd in (demo, serve):
            if cmd is not None:
                print(shlex.join(cmd))
        return 0
    if demo is not None:
        print(f"entrypoint: the embedded default is not in {demo[3]} yet; running `{shlex.join(demo)}` "
              "(about 3 minutes on 2 CPU cores, once; mount a volume at /data to keep it)",
              file=sys.stderr, flush=True)
        rc = run_forwarding_signals(demo)
        if rc != 0:
            print(f"entrypoint: the demo {'exited with ' + str(rc) if rc > 0 else 'was stopped'}; "
                  "the next start resumes it (finished stages are kept)", file=sys.stderr)
            return rc if rc > 0 else 128 - rc  # killed by signal N: the shell's 128 + N, not N's byte
    print(f"entrypoint: {shlex.join(serve)}", file=sys.stderr, flush=True)
    os.execvp(serve[0], serve)
    return 0  # not reached: execvp replaces this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
