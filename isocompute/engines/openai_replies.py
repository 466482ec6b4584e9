"""Reading an OpenAI-compatible server's answers: an HTTP status as a kind of failure, a completions JSON as
:class:`~isocompute.engines.base.Completion` objects.

Token counts: ``prompt_tokens`` is the request's ``usage.prompt_tokens`` (one prompt, counted once);
per-sample ``completion_tokens`` is ``len(choice.token_ids)``, which vLLM returns when asked with
``"return_token_ids": true`` (vLLM ≥ 0.10.2; its usage only carries totals). A server that ignores that
field (plain OpenAI-compatible servers) gets ``usage.completion_tokens`` split evenly over the choices,
remainder to the first ones — a last resort (the engine logs it once), since then the per-sample counts
are only right on average. Example: usage 10 over 4 choices → ``[3, 3, 2, 2]``.

Statuses: 5xx and 429 are retryable (:class:`Retryable`); 401, 403 and 404 mean this server is
configured wrong (an unknown model name, a key the upstream wants) and say what to change; any other
4xx is the caller's (:class:`~isocompute.errors.InputError`). A reply that is not the JSON expected
raises :class:`~isocompute.engines.base.UpstreamBadResponse`.

Logprobs: asked with ``"logprobs": K`` (and ``"return_tokens_as_token_ids": true``, so that two tokens
that decode to the same text stay two keys of a position's ``top_logprobs``), each choice carries
``logprobs.token_logprobs`` (the sampled tokens') and ``logprobs.top_logprobs`` (one ``{token: logprob}``
per position, the ``K`` highest plus the sampled token when it is not among them); :func:`parse_completions`
with ``logprobs=K`` turns them into each completion's ``logprob_mean`` and ``confidence_min_window``
(:func:`isocompute.tasks.confidence.sample_confidence`). A choice without them is a bad response.

Ignores: streaming replies, and the entropy probe's logprobs (it reads those itself).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import httpx

from isocompute.engines.base import Completion, UpstreamBadResponse
from isocompute.errors import InputError
from isocompute.tasks.confidence import DEFAULT_WINDOW, sample_confidence

__all__ = ["Retryable", "check_status", "describe", "parse_completions", "split_evenly"]


def split_evenly(total: int, parts: int) -> list[int]:
    """Split ``total`` into ``parts`` integers differing by at most one, larger ones first.

    >>> split_evenly(10, 4)
    [3, 3, 2, 2]
    """
    q, r = divmod(total, parts)
    return [q + 1] * r + [q] * (parts - r)


class Retryable(Exception):
    """An upstream failure worth another attempt elsewhere, of one ``kind``:

    ========== ===================================== ======== ================== =======
    kind       what happened                         opens    abandons the rest  backoff
    ========== ===================================== ======== ================== =======
    refused    no new connection (nobody listens)    at once  always             no
    dead       reset / closed mid-answer             at once  when another is up no
    down       no connection within connect_timeout  at once  no                 no
    wrong      401/403/404: this server misconfigured at once  no                 no
    slow       no answer in time                     strike   no                 no
    error      HTTP 5xx                              strike   no                 yes
    busy       HTTP 429                              no       no                 yes
    ========== ===================================== ======== ================== =======

    "Abandons the rest": the other requests waiting on that upstream are cancelled and retried on a closed
    one — ``refused`` even when there is none (they then fail fast): a server that no longer listens
    (vLLM on SIGTERM) does not answer the requests it had either (:mod:`isocompute.engines.circuit`).
    """

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind

    @property
    def hard(self) -> bool:
        return self.kind in ("refused", "dead", "down", "wrong")


def parse_completions(data: dict[str, Any], n: int, *, logprobs: int | None = None,
                      confidence_window: int = DEFAULT_WINDOW) -> tuple[list[Completion], bool]:
    """The ``n`` completions of one ``/v1/completions`` reply, in index order, and whether the per-sample
    token counts had to be split evenly from the usage totals; with ``logprobs=K`` (the request's), each
    completion's confidence too (module docstring). Raises UpstreamBadResponse when the reply cannot be
    read."""
    try:
        comps, split = _completions(data, n)
        if logprobs is None:
            return comps, split
        choices = sorted(data["choices"], key=lambda c: c.get("index", 0))
        pairs = zip(comps, choices, strict=True)
        return [_with_confidence(c, ch, logprobs, confidence_window) for c, ch in pairs], split
    except (AttributeError, LookupError, TypeError, ValueError) as e:
        raise UpstreamBadResponse(f"the upstream sent a completions reply this engine cannot read "
                                  f"({describe(e)}); is it an OpenAI-compatible completions server? "
                                  "(vLLM is)") from None


def _completions(data: dict[str, Any], n: int) -> tuple[list[Completion], bool]:
    choices = sorted(data.get("choices") or [], key=lambda c: c.get("index", 0))
    if len(choices) != n:
        raise UpstreamBadResponse(
            f"upstream returned {len(choices)} choices for n={n}; is it an OpenAI-compatible "
            "completions server that supports n? (vLLM does)"
        )
    usage = data.get("usage") or {}
    prompt_tokens = int(usage.get("prompt_tokens", 0))
    split = not all(c.get("token_ids") is not None for c in choices)
    counts = (split_evenly(int(usage.get("completion_tokens", 0)), n) if split
              else [len(c["token_ids"]) for c in choices])
    out = []
    for c, k in zip(choices, counts, strict=True):
        text = c.get("text") or ""
        if not isinstance(text, str):
            raise TypeError(f"choice text is a {type(text).__name__}, not a string")
        out.append(Completion(text, prompt_tokens, k, str(c.get("finish_reason") or "stop")))
    return out, split


def _with_confidence(c: Completion, choice: dict[str, Any], k: int, window: int) -> Completion:
    lp = choice.get("logprobs")
    if not isinstance(lp, dict) or lp.get("top_logprobs") is None:
        raise ValueError("a choice without logprobs, though they were asked for")
    tops = [list(d.values()) for d in lp["top_logprobs"]]
    stats = sample_confidence([float(x) for x in lp["token_logprobs"]], tops, k=k, window=window)
    if stats is None:
        return c
    return dataclasses.replace(c, logprob_mean=stats[0], confidence_min_window=stats[1])


def check_status(url: str, r: httpx.Response, model: Any) -> None:
    """Raise for an HTTP answer that is not a success: 5xx/429 retryable, 401/403/404 this server's
    misconfiguration (retried elsewhere, then reported as such), any other 4xx the caller's fault."""
    if r.status_code < 400:
        return
    if r.status_code >= 500:
        raise Retryable(f"HTTP {r.status_code}: {r.text[:200]}", "error")
    if r.status_code == 429:
        raise Retryable("HTTP 429 (overloaded)", "busy")
    if r.status_code == 404:
        raise Retryable(
            f"{url} answered HTTP 404 for model {model!r} ({r.text[:300]}): the gateway is misconfigured; "
            f"pass --upstream-model NAME (ISOCOMPUTE_UPSTREAM_MODEL) with a model that {url}/v1/models "
            "lists, or leave it out to use the first listed, and check that --upstream points at an "
            "OpenAI-compatible server", "wrong")
    if r.status_code in (401, 403):
        raise Retryable(
            f"{url} refused this gateway (HTTP {r.status_code}: {r.text[:200]}); the gateway sends no API "
            "key upstream: start the upstream without --api-key, or serve it on a private network", "wrong")
    raise InputError(f"upstream {url} rejected the request (HTTP {r.status_code}): {r.text[:500]}")


def describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
