"""A stage's options, documented once: on the fields of its config dataclass, argparse generated from them.

Each field carries its help (and how it is spelled on the command line) in its metadata, the way TRL's
``GRPOConfig`` does for ``HfArgumentParser``; :func:`option` writes that metadata::

    @dataclass(kw_only=True)
    class SolveConfig:
        budget: float = option(help="mean cost per prompt, in the cost unit")             # required
        actions: list[int] = option([1, 2, 4, 8, 16], text="1,2,4,8,16", parse=parse_actions,
                                    help="sample counts k to choose from, comma-separated")
        prefix_sharing: bool = option(True, flag="--no-prefix-sharing", action="store_false", help="…")

:func:`add_arguments` adds one argparse argument per field (in field order); :func:`from_namespace` builds
the config back from the parsed namespace; :func:`parse_config` does both for an argument list. The
metadata keys:

``help``      the help text (``ArgumentDefaultsHelpFormatter`` appends the default)
``flag``      the spelling: ``--no-prefix-sharing``, or a bare name for a positional; default ``--field-name``
``type``      argparse's converter of the text (``Path``, ``int``, ``float``): a bad value is argparse's
              error (usage, exit 2)
``parse``     a converter run after argparse on the text (``parse_actions``): its
              :class:`~isocompute.errors.InputError` is a stage error with our message (exit 2)
``text``      with ``parse``: the default as typed on the command line (what ``--help`` shows)
``choices``, ``action`` (``store_true``, ``store_false``, ``append``), ``nargs``, ``metavar``
``nested``    a config dataclass whose fields are added in this field's place (shared option groups)

A field without a default is a required option (or a required positional). Ignores: subcommands and
output-only flags (``--json``), which the CLI adds itself.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["add_arguments", "from_namespace", "group", "option", "parse_config"]

_ARGPARSE_KEYS = ("choices", "action", "nargs", "metavar", "type")


def option(default: Any = dataclasses.MISSING, *, help: str, **meta: Any) -> Any:
    """A dataclass field documented for the command line (module docstring). A list default is copied
    for each instance."""
    metadata = {"help": help, **meta}
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def group(cls: type) -> Any:
    """A field holding a nested config whose options are added in its place (``--outcomes NAME=TABLE …``)."""
    return dataclasses.field(default_factory=cls, metadata={"nested": cls})


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def add_arguments(parser: argparse.ArgumentParser, cls: type, *, groups: bool = True) -> None:
    """One argument per field of the config dataclass ``cls`` (and of its nested groups, unless ``groups``
    is false: a caller that places them itself), in field order."""
    for f in dataclasses.fields(cls):
        md = f.metadata
        if "nested" in md:
            if groups:
                add_arguments(parser, md["nested"])
            continue
        if "help" not in md:
            continue  # not an option: set by the stage or by a library caller
        flag = md.get("flag", "--" + f.name.replace("_", "-"))
        kwargs: dict[str, Any] = {k: md[k] for k in _ARGPARSE_KEYS if k in md}
        kwargs["help"] = md["help"]
        default = md["text"] if "text" in md else _default(f)
        positional = not flag.startswith("-")
        if default is not dataclasses.MISSING:
            kwargs["default"] = default
        elif not positional:
            kwargs["required"] = True
        if positional:
            parser.add_argument(flag, **kwargs)
        else:
            parser.add_argument(flag, dest=f.name, **kwargs)


def from_namespace(cls: type, ns: argparse.Namespace) -> Any:
    """The config ``cls`` from a namespace parsed by :func:`add_arguments`' arguments: each field's value,
    through its ``parse`` when it has one (its errors are the stage's), then the config's own checks."""
    return cls(**_values(cls, ns))


def _values(cls: type, ns: argparse.Namespace) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        md = f.metadata
        if "nested" in md:
            values[f.name] = from_namespace(md["nested"], ns)
        elif "help" in md:
            value = getattr(ns, f.name)
            parse: Callable[[str], Any] | None = md.get("parse")
            values[f.name] = parse(value) if parse is not None and value is not None else value
    return values


def parse_config(cls: type, argv: Sequence[str], *, prog: str | None = None) -> Any:
    """The config ``cls`` from command-line arguments (what the CLI does, for scripts and benchmarks):
    argparse errors exit 2 with the usage, a bad value raises the stage's InputError."""
    parser = argparse.ArgumentParser(prog=prog, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_arguments(parser, cls)
    return from_namespace(cls, parser.parse_args(list(argv)))
