"""The generation protocol every back-end implements.

``generate(prompts, n, max_tokens, temperature, seed)`` returns, for each prompt, ``n`` completions with
their text and token counts. Prompts are plain strings (already chat-templated where needed); an engine
that shares the prompt prefix across the ``n`` samples reports ``prompt_tokens`` once per prompt.
Engines are async so the gateway can serve many requests on one event loop; CPU-bound engines run their
work in a thread.

``probe_entropy(prompts, max_tokens)`` is the policy's probe feature, one greedy answer per prompt and its
mean token entropy (:mod:`isocompute.engines.probe`); each back-end computes it its own way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from isocompute.errors import InputError

if TYPE_CHECKING:
    from isocompute.engines.probe import ProbeResult


@dataclass(frozen=True, slots=True)
class Completion:
    """One sampled completion.

    ``finish_reason`` follows OpenAI: ``"stop"`` (an end token or stop string) or ``"length"``
    (``max_tokens`` reached).
    """

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str = "stop"


def check_generate_args(n: int, max_tokens: int, temperature: float) -> None:
    """Every engine's argument check, so a bad request fails the same way on every back-end."""
    if n < 1 or max_tokens < 1 or temperature < 0:
        raise InputError(
            f"need n >= 1, max_tokens >= 1 and temperature >= 0; got n={n}, "
            f"max_tokens={max_tokens}, temperature={temperature}"
        )


@runtime_checkable
class Engine(Protocol):
    """A generation back-end. ``name`` identifies it in logs, outcome tables and metrics."""

    name: str

    async def generate(
        self,
        prompts: list[str],
        n: int,
        max_tokens: int,
        temperature: float,
        seed: int | None = None,
    ) -> list[list[Completion]]:
        """Return ``len(prompts)`` lists of ``n`` completions each, in prompt order.

        Raises :class:`isocompute.errors.EngineUnavailable` when the back-end cannot serve.
        """
        ...

    async def aclose(self) -> None:
        """Release connections, threads or model memory."""
        ...

    async def probe_entropy(self, prompts: list[str], max_tokens: int) -> ProbeResult:
        """Mean per-token entropy of one greedy answer of at most ``max_tokens`` tokens per prompt, with
        the calls' token counts (:mod:`isocompute.engines.probe` defines it; call it through
        :func:`isocompute.engines.probe.probe_entropy`, which checks the arguments).

        Raises :class:`isocompute.errors.EngineUnavailable` when the back-end cannot serve it.
        """
        ...
