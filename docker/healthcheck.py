"""The image's HEALTHCHECK: exit 0 when the gateway's ``GET /health`` answers 200, else 1. Stdlib only.

The port is ``$ISOCOMPUTE_PORT``, else ``port`` in the TOML file named by ``$ISOCOMPUTE_CONFIG``, else
8000 — the order the gateway's settings use. A ``--port`` flag given to the container is not seen here:
set the port through the environment or the config file. ``/health`` says the process is alive; readiness
(policy loaded, upstream answered) is ``/ready``, for a load balancer, not for restarts.
"""

from __future__ import annotations

import os
import sys
import tomllib
import urllib.request


def port(env: dict[str, str]) -> int:
    if env.get("ISOCOMPUTE_PORT"):
        return int(env["ISOCOMPUTE_PORT"])
    config = env.get("ISOCOMPUTE_CONFIG")
    if config:
        try:
            with open(config, "rb") as fh:
                return int(tomllib.load(fh).get("port", 8000))
        except (OSError, tomllib.TOMLDecodeError, TypeError, ValueError):
            pass  # the gateway itself reports a bad config file
    return 8000


def main() -> int:
    url = f"http://127.0.0.1:{port(dict(os.environ))}/health"
    try:
        with urllib.request.urlopen(url, timeout=4) as r:
            return 0 if r.status == 200 else 1
    except OSError as e:  # URLError and HTTPError are OSErrors
        print(f"healthcheck: {url}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
