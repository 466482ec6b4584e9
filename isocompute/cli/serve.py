"""``isocompute serve``: run the OpenAI-compatible gateway on uvicorn; ``isocompute refit``: refit its policy on
the traffic it captured and reload it.

    isocompute serve --policy DIR (--upstream URL … | --engine transformers --model DIR)
                     [--host 127.0.0.1 --port 8000] [--capture DIR --explore SHARE]
    isocompute serve (--policy DIR | --action ACTION) --upstream NAME=URL … [--model NAME=DIR …]
    isocompute refit CAPTURE_DIR --out DIR [--policy DIR] [--gateway URL]

Flags override the environment (``ISOCOMPUTE_*``) and the TOML config (``--config`` or
``ISOCOMPUTE_CONFIG``); every option and its default is documented once, in docs/gateway.md's
"Configuration" table. ``--upstream`` (repeatable) implies ``--engine vllm-http``; pass ``--model DIR``
with it too so the gateway has the chat template and the FLOP accounting of the served checkpoint (the
name sent upstream is ``--upstream-model``, or whatever the upstream's ``/v1/models`` lists first).
The server binds to loopback unless ``--host`` says otherwise. SIGTERM drains it before it exits
(:mod:`isocompute.app.readiness`; ``drain_timeout_s``).

Several models: ``--upstream NAME=URL`` (repeatable per name) gives model NAME its own pool of vLLM
servers, load-balanced and failed over like the bare pool; ``--model NAME=DIR`` its chat template and
FLOP accounting (or, without an upstream, an in-process engine on DIR). A policy whose actions run on
several models (or ``--action``, one fixed action such as ``"tiny-s/lead:m=2@1x2 > tiny-l/none@4"``
for every prompt) runs each stage on its model's pool; a model with no pool stops the start-up with
the flag to add.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

from isocompute.errors import InputError


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("serve", help="run the OpenAI-compatible gateway",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policy", type=Path, help="fitted policy directory (isocompute fit)")
    p.add_argument("--upstream", action="append", default=None, metavar="[NAME=]URL",
                   help="vLLM base URL, repeatable (implies --engine vllm-http); NAME=URL: a pool for model NAME")
    p.add_argument("--engine", choices=("transformers", "vllm-http", "vllm"), help="generation back-end")
    p.add_argument("--model", action="append", default=None, metavar="[NAME=]DIR",
                   help="checkpoint directory (engine model; tokenizer/config for vLLM); NAME=DIR for model NAME, "
                        "repeatable")
    p.add_argument("--action", help="serve one fixed action for every prompt instead of a policy, e.g. "
                                    "'tiny-s/lead:m=2@1x2 > tiny-l/none@4'")
    p.add_argument("--host", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="TCP port (default 8000)")
    p.add_argument("--config", type=Path, help="TOML settings file (same keys as app.settings)")
    p.add_argument("--served-model", help="model id clients send (default 'isocompute')")
    p.add_argument("--upstream-model", help="model name the vLLM upstreams serve (default: their first listed)")
    p.add_argument("--default-budget", type=float, help="budget for requests without one (default 4)")
    p.add_argument("--api-keys", type=Path, help="JSON file of hashed API keys (see app.auth)")
    p.add_argument("--quota-store", help="where keys' spend quotas are counted: memory (default) or redis://HOST:PORT/DB")
    p.add_argument("--vote", type=Path, help="fitted vote.json for strategy 'weighted' (bench_weighted_votes.py "
                   "--save-dir); see docs/policy.md, Weighted votes")
    p.add_argument("--capture", type=Path, metavar="DIR", help="write explored requests' full rows here "
                   "(capture_dir; isocompute refit reads them)")
    p.add_argument("--explore", type=float, metavar="SHARE", help="share of requests drawn in full for capture, "
                   "e.g. 0.02 (explore; needs --capture)")
    p.add_argument("--cold-start", action="store_true", default=None,
                   help="with no --policy, serve the cold-start plans (isocompute.policy.cold_start); implied by "
                        "--capture")
    p.add_argument("--capture-prompts", action="store_true", default=None,
                   help="store the prompts' text in captured rows (default: a salted hash)")
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    p.set_defaults(func=run)
    register_replay(subparsers)
    register_refit(subparsers)


def register_replay(subparsers: Any) -> None:
    """``isocompute replay TABLE… --port P``: a vLLM-compatible SIMULATOR answering from outcome tables."""
    from isocompute.replay.timing import TimingModel

    d = TimingModel()
    p = subparsers.add_parser("replay", help="a vLLM-compatible upstream answering from outcome tables (a simulator)",
                              description="Serve vLLM's OpenAI API from recorded samples: real answers and lengths, "
                                          "seconds from a stated timing model (not measurements). docs/replay.md.")
    p.add_argument("tables", nargs="+", type=Path, metavar="TABLE", help="outcome tables (JSONL) with completion_tokens")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8001, help="TCP port (default 8001)")
    p.add_argument("--model", help="model id /v1/models lists (default: the table's meta.model, else its file name)")
    p.add_argument("--prefill-s-per-token", type=float, default=d.prefill_s_per_token,
                   help=f"seconds of prefill per prompt token (default {d.prefill_s_per_token})")
    p.add_argument("--decode-tps", type=float, default=d.decode_tps,
                   help=f"decode tokens/s of one sequence (default {d.decode_tps:g})")
    p.add_argument("--max-tps", type=float, default=d.max_tps,
                   help=f"the server's aggregate decode tokens/s ceiling (default {d.max_tps:g})")
    p.add_argument("--max-seqs", type=int, default=d.max_seqs,
                   help=f"sequences in flight before requests queue (vLLM's max_num_seqs; default {d.max_seqs})")
    p.add_argument("--stream-interval", type=int, default=d.stream_interval,
                   help=f"tokens per streamed chunk per sequence (vLLM's --stream-interval; default {d.stream_interval})")
    p.set_defaults(func=run_replay)


def run_replay(args: argparse.Namespace) -> int:
    from isocompute.replay.process import serve_forever
    from isocompute.replay.table import load_tables
    from isocompute.replay.timing import TimingModel

    timing = TimingModel(prefill_s_per_token=args.prefill_s_per_token, decode_tps=args.decode_tps,
                         max_tps=args.max_tps, max_seqs=args.max_seqs, stream_interval=args.stream_interval)
    serve_forever(load_tables(args.tables, args.model), timing, host=args.host, port=args.port)
    return 0


def settings_from_args(args: argparse.Namespace) -> Any:
    """The gateway's :class:`Settings`, flags first (``None`` flags fall through to env/config/defaults)."""
    from pydantic import ValidationError

    from isocompute.app.settings import CONFIG_ENV, Settings

    if args.config is not None:
        if not args.config.is_file():
            raise InputError(f"--config {args.config} is not a file; pass a TOML settings file")
        os.environ[CONFIG_ENV] = str(args.config)
    elif os.environ.get(CONFIG_ENV) and not Path(os.environ[CONFIG_ENV]).is_file():
        raise InputError(f"{CONFIG_ENV}={os.environ[CONFIG_ENV]} is not a file; point it at a TOML settings file "
                         "or unset it")
    unknown = unknown_env(os.environ)
    if unknown:
        logging.getLogger("isocompute.serve").warning(
            "ignoring unknown environment variable(s) %s: no such setting (see the Configuration table in docs/gateway.md)",
            ", ".join(unknown))
    upstreams, model_upstreams = split_named(args.upstream or [], "--upstream")
    dirs, model_dirs = split_named(args.model or [], "--model")
    if len(dirs) > 1:
        raise InputError(f"--model DIR given {len(dirs)} times; give one bare DIR, or name each: --model NAME=DIR")
    engine = args.engine or ("vllm-http" if upstreams or model_upstreams else None)
    if engine == "vllm-http" and not (upstreams or model_upstreams):
        raise InputError("--engine vllm-http needs --upstream URL (repeatable), e.g. --upstream http://127.0.0.1:8001")
    overrides = {
        "policy_dir": args.policy, "engine": engine, "model_dir": Path(dirs[0]) if dirs else None,
        "upstreams": upstreams or None, "model_upstreams": model_upstreams or None,
        "model_dirs": {k: Path(v[0]) for k, v in model_dirs.items()} or None, "action": args.action,
        "host": args.host, "port": args.port, "served_model": args.served_model,
        "default_budget": args.default_budget, "api_keys_file": args.api_keys,
        "upstream_model": args.upstream_model, "quota_store": args.quota_store,
        "vote_file": getattr(args, "vote", None),  # a Namespace built by hand (tests, embedders) may lack it
        "capture_dir": getattr(args, "capture", None), "explore": getattr(args, "explore", None),
        "capture_prompts": getattr(args, "capture_prompts", None), "cold_start": getattr(args, "cold_start", None),
    }
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ())) or "settings"
        raise InputError(f"invalid setting {where}: {first['msg']}; fix the flag, ISOCOMPUTE_* variable "
                         "or config entry") from None


def split_named(values: list[str], flag: str) -> tuple[list[str], dict[str, list[str]]]:
    """``NAME=VALUE`` items by name (repeatable) and the bare ``VALUE`` items, in order. An item is named
    when what precedes its first ``=`` has no ``/`` or ``:`` (so ``http://h:1/?a=b`` and ``./x=y`` are bare)."""
    from isocompute.solver.models.tables import check_model_name

    bare: list[str] = []
    named: dict[str, list[str]] = {}
    for v in values:
        name, eq, rest = v.partition("=")
        if eq and name and not any(c in name for c in "/:"):
            if not rest:
                raise InputError(f"{flag} {v}: nothing after '='; give {flag} NAME=VALUE")
            named.setdefault(check_model_name(name), []).append(rest)
        else:
            bare.append(v)
    return bare, named


# ISOCOMPUTE_* variables that belong to tools around the gateway, not to its settings.
TOOL_ENV_PREFIXES = ("ISOCOMPUTE_VLLM_", "ISOCOMPUTE_DEMO_", "ISOCOMPUTE_BAKED_", "ISOCOMPUTE_ENTRYPOINT_")


def unknown_env(environ: dict[str, str] | os._Environ[str]) -> list[str]:
    """``ISOCOMPUTE_*`` variables that name no setting (typos, which pydantic-settings would ignore)."""
    from isocompute.app.settings import CONFIG_ENV, Settings

    known = {f"ISOCOMPUTE_{f.upper()}" for f in Settings.model_fields} | {CONFIG_ENV}
    return sorted(k for k in environ
                  if k.startswith("ISOCOMPUTE_") and k not in known and not k.startswith(TOOL_ENV_PREFIXES))


def preflight(s: Any) -> Any:
    """The fitted policy of ``--policy`` (loaded here, once, and handed to the app) after checking that every
    model it — or ``--action`` — runs on has a named pool; None with ``--action``. Done before uvicorn
    starts so the operator reads one line with the flags to add, not a start-up traceback."""
    from isocompute.app.runner.pools import missing_pools, missing_pools_message

    named = dict.fromkeys([*s.model_upstreams, *s.model_dirs])
    if s.action is not None:
        from isocompute.solver.models.actions import parse_action

        missing = missing_pools(parse_action(s.action).models, named)
        if missing:
            raise InputError(missing_pools_message(missing, named, f"--action {s.action!r}"))
        return None
    from isocompute.app.serving_policy import as_serving_policy, load_policy

    policy = load_policy(s.policy_dir)
    missing = missing_pools(as_serving_policy(policy).models, named)
    if missing:
        raise InputError(missing_pools_message(missing, named, f"the policy in --policy {s.policy_dir}"))
    return policy


class _Stderr(logging.StreamHandler):
    """A stream handler writing to ``sys.stderr`` as it is when a line is emitted (as logging's last-resort
    handler does), not to the stream that was ``sys.stderr`` when it was made: a caller that redirects stderr
    after :func:`log_at` (a test's capture, an embedding process) still gets the lines."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self) -> Any:  # type: ignore[override]
        return sys.stderr


def log_at(level: str) -> None:
    """The gateway's own log lines (``isocompute.*``: unknown request fields, 499s, upstream transitions) on
    stderr at ``--log-level``, as uvicorn's are; without it only warnings reached Python's last-resort handler."""
    logger = logging.getLogger("isocompute")
    if not logger.handlers:
        handler = _Stderr()
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(name)s: %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(level.upper())


def run(args: argparse.Namespace) -> int:
    from isocompute.app.accounting.admission import ConnectionGuard, guarded_protocol
    from isocompute.app.main import create_app
    from isocompute.app.readiness import run_server

    s = settings_from_args(args)
    cold = s.policy_dir is None and s.action is None
    if cold and not (s.cold_start or s.capture_dir is not None):
        raise InputError("no policy: pass --policy DIR (a directory written by `isocompute fit`), --action ACTION, "
                         "or --cold-start (the cold-start plans; implied by --capture DIR)")
    if s.engine in ("transformers", "vllm") and s.model_dir is None and not s.model_dirs:
        raise InputError(f"--engine {s.engine} needs --model DIR (a checkpoint directory)")
    log_at(args.log_level)
    policy = None if cold else preflight(s)  # cold: the app's lifespan serves the cold-start plans
    app = create_app(s, policy=policy)
    # Keep idle connections longer than common client pools do (httpx: 5 s), so a client never sends on a
    # connection the server is closing at that moment; the guard bounds connections and how long a request's
    # headers and body may take (isocompute.app.accounting.admission: uvicorn has no read timeouts).
    # On SIGTERM the app drains first (isocompute.app.readiness: /ready and new requests 503, the requests in
    # flight finish within drain_timeout_s), then uvicorn shuts down and the process exits 0.
    run_server(app, host=s.host, port=s.port, log_level=args.log_level, timeout_keep_alive=75,
               http=guarded_protocol(ConnectionGuard.of(s, app.state.metrics)))
    return 0


# ---- isocompute refit: the loop's other half (serve with capture → refit → reload) ------------------------

REFIT_DOC = ("isocompute refit CAPTURE_DIR --out DIR [--policy DIR] [--gateway URL]: the gateway's captured traffic "
             "→ a policy under the consensus target, compared with the serving one on held-out captured prompts, "
             "written only where not worse (exit 3 otherwise), reloaded (isocompute.stages.refit)")
KEPT = 3  # exit code: the new policy was worse; nothing written


def register_refit(subparsers: Any) -> None:
    p = subparsers.add_parser("refit", help="fit a policy on captured traffic (consensus target) and reload it",
                              description=REFIT_DOC,
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    from isocompute.stages.options import add_arguments
    from isocompute.stages.refit import RefitConfig

    add_arguments(p, RefitConfig)
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.set_defaults(func=run_refit)


def run_refit(args: argparse.Namespace) -> int:
    import json

    from isocompute.stages.options import from_namespace
    from isocompute.stages.refit import RefitConfig, refit

    res = refit(from_namespace(RefitConfig, args))
    if args.json:
        print(json.dumps(res.as_dict()))
        return 0 if res.written else KEPT
    print(f"captured: {res.rows} rows, {res.prompts} prompts; target: {res.target}")
    for c in res.compare:
        n, s = c["new"], c["serving"]
        print(f"budget {c['budget']:g}x: new {n['accuracy']:.4f} at {n['cost']:.2f}x tokens, serving "
              f"{s['accuracy']:.4f} at {s['cost']:.2f}x; gain at matched tokens {100 * c['gain']:+.2f} pt")
    for note in res.notes:
        print(note)
    if res.reloaded is not None:
        print(f"gateway reloaded: {res.reloaded}")
    return 0 if res.written else KEPT
