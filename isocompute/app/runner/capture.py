"""Capture: a seeded share of the traffic drawn in full, in the background, and written as outcome-table rows.

With ``capture_dir`` set and ``explore`` = s > 0, a prompt is *explored* when a seeded hash of the request
(``explore_seed``, its text, its seed — or, without one, the gateway's request count) falls below s, and its
key has not opted out (``capture: false`` on its record). Nothing changes for its client: the answer is the
one the plan's rule decided, sent when it fired. Once it is sent, a background task draws the prompt's full
row — ``N = max(capture_samples, the policy plan's most samples)`` samples in one streamed wave that is
never stopped — and appends it to a shard: every sample's answer, class (the gateway's own vote merging),
completion tokens and finish position, its confidence when the request asked for logprobs, the plan served
and the model. The row is a fresh draw rather than the served wave finished: a parallel-stop wave's
aborted samples are its longest, and a row made of the served finishers plus replacements would lean
toward short answers. Its tokens are *exploration*: charged to the key's budget controller as extra cost
of the request (:meth:`~isocompute.app.accounting.budget_control.BudgetController.charge`: in the mean at
once, in the correction over the next requests), so the key's
mean cost, exploration included, still meets its budget; counted in ``isocompute_explore_*`` and shown
in the response's ``isocompute.explore``.

Storage (:class:`ShardWriter`): ``capture-<utc>-<host>-<pid>-<n>.jsonl`` files of mode 0600 in a 0700 directory,
each line written by one ``os.write`` on an ``O_APPEND`` descriptor — a line is *acknowledged* when that
call returned, and the kernel then holds it whatever happens to the process (SIGKILL included); a crash
mid-call can leave only that one line torn, which the reader names and skips
(:func:`isocompute.stages.captured.read_shards`). A shard is rotated past ``capture_max_bytes / 8`` and the
oldest shards are deleted while all of them exceed ``capture_max_bytes``. Prompt text is stored only with
``capture_prompts``; otherwise ``prompt`` is ``"hash:"`` + a blake2b of the text under a random salt kept
in the directory (``.salt``, 0600), so equal prompts share a key and nothing readable leaves the request.
On drain the background draws in flight finish (within ``drain_timeout_s``) and the shard is closed.

Ignores: multi-model actions (not captured: a row is one model's samples) and batches of prompts beyond the
first ``capture_max_inflight`` rows in flight (the rest are dropped and counted, never queued without bound).
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import hashlib
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from isocompute.engines.base import Engine, stream_wave

__all__ = ["Capture", "ShardWriter", "explored"]

log = logging.getLogger("isocompute.capture")
SHARD_GLOB = "capture-*.jsonl"


def explored(share: float, seed: int, text: str, request_seed: int | None, count: int) -> bool:
    """Whether a prompt is explored: ``blake2b(seed/text/request seed or count) / 2⁶⁴ < share``."""
    if share <= 0:
        return False
    tag = f"s{request_seed}" if request_seed is not None else f"n{count}"
    h = hashlib.blake2b(f"{seed}/{tag}/{text}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2**64 < share


class ShardWriter:
    """Append-only, rotated, bounded shards of JSON lines (module docstring). Not thread-safe: the gateway
    writes from its event loop only."""

    def __init__(self, directory: str | Path, *, max_bytes: int) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.dir, 0o700)
        self.max_bytes = int(max_bytes)
        self.shard_bytes = max(64 * 1024, self.max_bytes // 8)
        self.fd: int | None = None
        self.path: Path | None = None
        self.size = 0
        self.count = 0
        self.salt = self._salt()

    def _salt(self) -> bytes:
        p = self.dir / ".salt"
        if not p.exists():  # written whole, then linked: replicas sharing the directory all read one full salt
            tmp = self.dir / f".salt.{socket.gethostname()}.{os.getpid()}"
            with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
                f.write(secrets.token_bytes(16).hex())
            try:
                os.link(tmp, p)  # atomic, and refused when another process linked its salt first
            except FileExistsError:
                pass
            finally:
                tmp.unlink(missing_ok=True)
        return bytes.fromhex(p.read_text().strip())

    def prompt_key(self, text: str) -> str:
        """The salted hash that stands for a prompt's text (module docstring)."""
        return "hash:" + hashlib.blake2b(text.encode(), key=self.salt, digest_size=16).hexdigest()

    def write(self, record: dict[str, Any]) -> int:
        """Append one record as one line; returns its bytes once acknowledged (the ``os.write`` returned)."""
        data = (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
        if self.fd is None or self.size + len(data) > self.shard_bytes:
            self._rotate()
        assert self.fd is not None
        view = memoryview(data)
        while view:  # a regular file takes it in one call; a short write is resumed, never interleaved
            view = view[os.write(self.fd, view):]
        self.size += len(data)
        return len(data)

    def _rotate(self) -> None:
        self.close()
        stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%S")
        self.count += 1
        host = socket.gethostname()  # replicas sharing one volume (the k8s capture overlay) never share a shard
        self.path = self.dir / f"capture-{stamp}-{host}-{os.getpid()}-{self.count:05d}.jsonl"
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.size = os.fstat(self.fd).st_size
        self._bound()

    def _bound(self) -> None:
        """Delete the oldest shards (never the open one) while all of them exceed ``max_bytes``."""
        shards = sorted(self.dir.glob(SHARD_GLOB), key=lambda p: p.stat().st_mtime)
        total = sum(p.stat().st_size for p in shards)
        for p in shards:
            if total <= self.max_bytes or p == self.path:
                break
            total -= p.stat().st_size
            p.unlink(missing_ok=True)
            log.warning("capture: %s deleted to keep the shards under capture_max_bytes=%d", p.name, self.max_bytes)

    def close(self) -> None:
        """Flush the open shard to disk and close it."""
        if self.fd is not None:
            os.fsync(self.fd)
            os.close(self.fd)
            self.fd = None


class Capture:
    """The gateway's capture: which prompts are explored, their background draws, and the shards."""

    def __init__(self, settings: Any, *, voter: Any, extract: Callable[[str], str | None], metrics: Any,
                 model: str) -> None:
        s = settings
        self.share, self.seed, self.samples = float(s.explore), int(s.explore_seed), int(s.capture_samples)
        self.prompts, self.inflight_max = bool(s.capture_prompts), int(s.capture_max_inflight)
        self.writer = ShardWriter(s.capture_dir, max_bytes=s.capture_max_bytes)
        self.voter, self.extract, self.metrics, self.model = voter, extract, metrics, model
        self.kind = s.answer_kind
        self.requests = 0
        self.tasks: set[asyncio.Task] = set()

    def select(self, texts: Sequence[str], ask: Any, principal: Any) -> list[bool]:
        """Which of a request's prompts (``texts``: what the policy reads) are explored (module docstring);
        none for a key that opted out (``capture: false``). Counts the request."""
        self.requests += 1
        if not principal.capture:
            return [False] * len(texts)
        return [explored(self.share, self.seed, t, ask.seed, self.requests) for t in texts]

    def start(self, engine: Engine, prompt: str, policy_text: str, row: dict[str, Any], *, n: int, max_tokens: int,
              temperature: float, seed: int | None, logprobs: int | None, charge: Callable[[int, int], None]) -> bool:
        """Draw and write one explored prompt's row in the background; False when too many are in flight."""
        if len(self.tasks) >= self.inflight_max:
            self.metrics.capture_dropped.labels("inflight").inc()
            return False
        task = asyncio.create_task(self._draw(engine, prompt, policy_text, row, n, max_tokens, temperature,
                                              seed, logprobs, charge))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return True

    async def _draw(self, engine: Engine, prompt: str, policy_text: str, row: dict[str, Any], n: int,
                    max_tokens: int, temperature: float, seed: int | None, logprobs: int | None,
                    charge: Callable[[int, int], None]) -> None:
        async def never(j: int, c: Any) -> bool:
            return False

        try:
            ws = await stream_wave(engine, prompt, n, max_tokens, temperature, seed, never, logprobs=logprobs)
        except Exception as e:  # noqa: BLE001 — a failed exploration costs the client nothing; counted
            self.metrics.capture_dropped.labels("upstream").inc()
            log.warning("capture: an exploration draw failed upstream (%s: %s)", type(e).__name__, e)
            return
        done = set(ws.finish_order)
        order = ws.finish_order + [j for j in range(len(ws.completions)) if j not in done]
        comps = [ws.completions[j] for j in order]
        tokens = sum(c.completion_tokens for c in comps)
        charge(len(comps), tokens)  # drawn and paid, whether or not the row can be written
        answers = [None if c.finish_reason in ("error", "abort") else self.extract(c.text) for c in comps]
        [votes] = await self.voter.classes([answers], time.monotonic() + 30.0)
        samples = []
        for j, (c, a, k) in enumerate(zip(comps, answers, votes.classes, strict=True)):
            s: dict[str, Any] = {"answer": a, "class": None if a is None else k,
                                 "completion_tokens": c.completion_tokens, "finish": j}
            if c.confidence_min_window is not None:
                s["confidence_min_window"] = c.confidence_min_window
            samples.append(s)
        text = policy_text if self.prompts else self.writer.prompt_key(policy_text)
        rec = {"id": f"{self.writer.prompt_key(policy_text)[5:21]}-{os.getpid()}-{time.time_ns()}",
               "prompt": text, "samples": samples,
               "meta": {**row, "source": "capture", "model": self.model, "answer_kind": self.kind, "temperature": temperature,
                        "max_tokens": max_tokens, "captured_at": _dt.datetime.now(_dt.UTC).isoformat()}}
        if comps and comps[0].prompt_tokens:
            rec["prompt_tokens"] = int(comps[0].prompt_tokens)
        try:
            size = self.writer.write(rec)
        except OSError as e:
            self.metrics.capture_dropped.labels("write").inc()
            log.error("capture: could not write to %s (%s)", self.writer.dir, e)
            return
        self.metrics.capture_lines.inc()
        self.metrics.capture_bytes.inc(size)

    async def drain(self, timeout: float) -> None:
        """Let the draws in flight finish (within ``timeout`` seconds; the rest are cancelled), then close."""
        if self.tasks:
            _, late = await asyncio.wait(set(self.tasks), timeout=timeout)
            for t in late:
                t.cancel()
            if late:
                self.metrics.capture_dropped.labels("drain").inc(len(late))
                await asyncio.wait(late, timeout=5.0)
        self.writer.close()

    def after(self, prompts: Sequence[str], routing: Any, ask: Any, answers: Sequence[Any], gateway: Any) -> None:
        """Start the background draw of every explored prompt of an answered request (``routing.explore``) on
        the gateway's default pool, charged by its ledger (:meth:`~isocompute.app.accounting.ledger.Ledger.explore`);
        stores the text the policy read (or its hash); marks each explored answer's ``isocompute.explore``."""
        from isocompute.app.runner.plan_run import derived_seed

        texts, seed = ask.policy_prompts or prompts, ask.seed
        for i, go in enumerate(routing.explore or ()):
            if not go:
                continue
            info = answers[i].info
            n = max(self.samples, routing.policy_plans[i].max_samples)
            row = {"plan": routing.policy_plans[i].name, "served_plan": routing.plans[i].name,
                   "budget": routing.plan.budget, "budget_unit": routing.plan.unit,
                   "served": {"answer": info.answer, "samples": info.k, "tokens": info.tokens}}
            if self.start(gateway.engine, prompts[i], texts[i], row, n=n, max_tokens=ask.max_tokens,
                          temperature=ask.temperature, seed=None if seed is None else derived_seed(seed, f"explore/{i}"),
                          logprobs=gateway.answers.logprobs_for(ask.strategy),
                          charge=lambda d, t: gateway.ledger.explore(routing, d, t)):
                self.metrics.explore_prompts.inc()
                info.explore = {"samples": n, "share": self.share}
