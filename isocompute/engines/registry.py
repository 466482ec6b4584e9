"""Build an engine from its name: the one place the CLI and the gateway turn settings into a back-end.

Names: ``transformers`` (in-process HF model, the embedded default), ``vllm-http`` (one or more vLLM /
OpenAI-compatible servers), ``vllm`` (``vllm.LLM`` in this process). Each back-end module is imported
only when chosen, so ``vllm`` and ``torch`` stay unimported until needed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from isocompute.engines.base import Engine
from isocompute.errors import InputError

__all__ = ["ENGINE_NAMES", "make_engine"]

ENGINE_NAMES: tuple[str, ...] = ("transformers", "vllm-http", "vllm")


def make_engine(
    name: str,
    *,
    model: str | Path | None = None,
    upstreams: list[str] | None = None,
    **options: Any,
) -> Engine:
    """Return the engine ``name`` built from ``model`` (a checkpoint directory; for ``vllm-http`` the
    served model name, optional) or ``upstreams`` (``vllm-http`` only); ``options`` go to its constructor.

    Raises :class:`InputError` for an unknown name or a missing ``model``/``upstreams``.
    """
    if name == "transformers":
        if model is None:
            raise InputError("--engine transformers needs --model DIR (a Hugging Face checkpoint directory)")
        from isocompute.engines.transformers_engine import TransformersEngine

        return TransformersEngine(model, **options)
    if name == "vllm-http":
        if not upstreams:
            raise InputError(
                "--engine vllm-http needs --upstream URL (repeatable), e.g. --upstream http://127.0.0.1:8000"
            )
        from isocompute.engines.vllm_http import VLLMHTTPEngine

        return VLLMHTTPEngine(upstreams, model=None if model is None else str(model), **options)
    if name == "vllm":
        if model is None:
            raise InputError("--engine vllm needs --model DIR (a checkpoint vLLM can load)")
        from isocompute.engines.vllm_inprocess import VLLMEngine

        return VLLMEngine(model, **options)
    raise InputError(f"unknown engine {name!r}; choose one of {', '.join(ENGINE_NAMES)}")
