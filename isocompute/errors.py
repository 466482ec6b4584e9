"""One family of domain errors.

Every error a user can cause derives from :class:`IsoComputeError` and carries a message that says what
was wrong and how to fix it. The CLI prints the message and exits 2; the gateway maps each subclass to an
HTTP status in one handler.
"""

from __future__ import annotations


class IsoComputeError(Exception):
    """Base class: a problem the user can fix (bad input, missing artifact, unreachable upstream)."""


class InputError(IsoComputeError, ValueError):
    """A file, argument or request field is malformed or out of range."""


class BudgetError(InputError):
    """A budget is outside the feasible range of the current action set or policy."""


class ArtifactError(IsoComputeError):
    """An artifact directory is missing, from another schema version, or fails its checksum."""


class DependencyError(IsoComputeError):
    """A library the job needs is missing or broken (it does not import, or fails a known-answer check)."""


class EngineUnavailable(IsoComputeError):
    """A generation back-end cannot serve (down, timing out, or not installed)."""
