"""In-process sampling with a local Hugging Face checkpoint — the embedded default engine.

``TransformersEngine(model_path)`` loads a causal LM and its tokenizer once and samples ``n`` completions per prompt
with ``model.generate``: every prompt is repeated ``n`` times as its own row (``n`` rows share no KV cache, unlike
vLLM's prefix sharing, but the rows run as one padded batch), rows are padded on the left so new tokens line up, and
rows go through in micro-batches of at most ``micro_batch`` rows.

Token counts follow vLLM's usage: ``prompt_tokens`` is the prompt's length without padding, reported once per prompt
(each of its completions carries the same number); ``completion_tokens`` counts generated tokens up to and including
the first end-of-sequence token. Worked example: with eos id 2 and generated row ``[17, 5, 2, 0, 0]`` (0 is padding
after the row finished) the completion has 3 tokens, the text is the decoding of ``[17, 5]`` and ``finish_reason`` is
``"stop"``; a row with no eos within ``max_tokens`` counts all ``max_tokens`` tokens with ``finish_reason ==
"length"``.

Sampling is plain temperature sampling (top-k and top-p off, as in vLLM's defaults); ``temperature == 0`` is greedy
decoding. A ``seed`` makes a call reproducible for the same prompts, ``n`` and ``micro_batch``; it seeds a forked RNG,
so the process's global torch RNG is left as it was.

``generate`` runs the model in a worker thread (``asyncio.to_thread``) behind a lock: the event loop stays free, and
concurrent calls run one after the other, never interleaved on the same model. A cancelled ``generate`` (its client
went away) stops its batch at the next decode step, as ``stream_wave`` does.

``stream_wave`` (:func:`isocompute.engines.base.stream_wave`) really stops its batch: the ``n`` rows run as one
``model.generate`` call (rows, kwargs and seeding as ``generate([prompt], n, …)``: with no stop the samples are
identical) whose stopping criterion sees each row finish at the step it emits eos or reaches ``max_tokens`` and hands
it to the event loop, where ``on_finish`` is awaited while decoding goes on; once it returns True every row stops at
the next step. Rows still running are aborted with empty text and the tokens they had when ``generate`` stopped; rows
that finished meanwhile stay finished (in ``finish_order``, not shown to ``on_finish``). Worked example: rows finish
at 6 and 9 tokens, stop at the second, the thread notices at step 10: a row ending at 10 is finished, the five others
are aborted at 10 tokens each. A wave wider than ``micro_batch`` is generated whole and replayed
(:func:`~isocompute.engines.base.replay_finishes`).

``generate(…, logprobs=K)`` also returns every step's raw logits (``output_logits=True``: the model's own
distribution, before temperature, as vLLM's default ``raw_logprobs``) and sets each completion's ``logprob_mean`` and
``confidence_min_window`` from their log-softmax (:mod:`isocompute.tasks.confidence`); a micro-batch then holds rows ×
steps × vocab floats (lower ``micro_batch`` for a large vocabulary). ``stream_wave(…, logprobs=K)`` gives each
finished row the same figures, kept step by step as it decodes (:class:`~isocompute.engines.streaming.StepConfidence`:
rows × steps × (K + 1) floats).

Ignores: stop strings, top-k/top-p/repetition penalties, and freeing a finished row's slot before its whole batch ends
(it decodes padding until then).
"""

from __future__ import annotations

import asyncio
import copy
import threading
import weakref
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from isocompute.engines import streaming
from isocompute.engines.base import Completion, OnFinish, WaveStream, check_generate_args, replay_finishes
from isocompute.engines.probe import ProbeResult, entropy_from_logits, mean_entropy
from isocompute.engines.streaming import Finish, Put, StepConfidence, batch_finish_watch, consume_finishes
from isocompute.errors import EngineUnavailable, InputError
from isocompute.tasks.confidence import DEFAULT_WINDOW, stats_from_logits

__all__ = ["TransformersEngine", "apply_chat_template", "count_completion", "resolve_device"]

_Conf = tuple[int | None, int]  # (top logprobs asked, confidence window); None: not asked


def resolve_device(device: str) -> str:
    """``"auto"`` → ``"cuda"`` when a GPU is visible, else ``"cpu"``; anything else passes through."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def count_completion(token_ids: Sequence[int], eos_ids: Iterable[int], max_tokens: int) -> tuple[int, str]:
    """Return ``(completion_tokens, finish_reason)`` for one generated row (padding may follow eos).

    >>> count_completion([17, 5, 2, 0, 0], {2}, 5)
    (3, 'stop')
    >>> count_completion([17, 5, 9], {2}, 3)
    (3, 'length')
    """
    eos = set(eos_ids)
    for i, tok in enumerate(token_ids):
        if tok in eos:
            return i + 1, "stop"
    n = len(token_ids)
    # generate() stops early only when every row has finished, so a short row without eos can only
    # mean it ran into max_new_tokens.
    return n, "length" if n >= max_tokens else "stop"


def apply_chat_template(tokenizer: Any, user_message: str, *, system: str | None = None) -> str:
    """Wrap one user message in the tokenizer's chat template, ending with the assistant's turn.

    Raises :class:`InputError` when the tokenizer has no chat template (use plain prompts then).
    """
    if not getattr(tokenizer, "chat_template", None):
        raise InputError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', '?')!r} has no chat template; "
            "send plain prompts, or set tokenizer.chat_template before calling apply_chat_template"
        )
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": user_message}
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    # Templates often render the BOS token themselves while encoding adds it again; a doubled BOS is
    # a sequence the model never saw in training, so drop the rendered one when encoding adds it.
    bos = getattr(tokenizer, "bos_token", None)
    if bos and text.startswith(bos) and _encoding_adds_bos(tokenizer):
        text = text[len(bos) :]
    return text


_ADDS_BOS: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def _encoding_adds_bos(tokenizer: Any) -> bool:
    """Whether encoding with special tokens prepends BOS; asked once per tokenizer, because every call
    resets the tokenizer's padding state, which other threads may be relying on at that moment."""
    try:
        return _ADDS_BOS[tokenizer]
    except (KeyError, TypeError):
        pass
    added = tokenizer("")["input_ids"]
    adds = bool(added) and added[0] == tokenizer.bos_token_id
    try:
        _ADDS_BOS[tokenizer] = adds
    except TypeError:  # not weak-referenceable: just don't cache
        pass
    return adds


class TransformersEngine:
    """A local HF causal LM behind the async :class:`~isocompute.engines.base.Engine` protocol.

    ``model_path`` is a directory with ``config.json``, weights and a tokenizer (e.g. what
    ``isocompute train sft`` writes). ``device`` is ``"cpu"``, ``"cuda"`` or ``"auto"``; ``dtype`` a torch
    dtype name (``float32`` on CPU; ``bfloat16`` is the usual choice on a GPU). ``micro_batch`` caps the
    rows (prompt × sample) per ``model.generate`` call and so the memory of one step. ``threads`` sets
    torch's intra-op threads for the duration of each call (restored after); on a small, shared CPU
    ``threads=1`` can be several times faster than OpenMP threads spinning against other processes.
    """

    name = "transformers"

    def __init__(self, model_path: str | Path, *, device: str = "cpu", dtype: str = "float32", micro_batch: int = 64,
                 threads: int | None = None) -> None:
        if micro_batch < 1:
            raise InputError(f"micro_batch must be >= 1; you passed {micro_batch}")
        if threads is not None and threads < 1:
            raise InputError(f"threads must be >= 1 (or None for torch's default); you passed {threads}")
        self.threads = threads
        self.model_path = Path(model_path)
        if not (self.model_path / "config.json").is_file():
            raise EngineUnavailable(
                f"no Hugging Face checkpoint at {self.model_path} (config.json missing); "
                "pass --model DIR with a saved model, e.g. one written by `isocompute train sft`"
            )
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.device = resolve_device(device)
        self.micro_batch = micro_batch
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            # Padding positions are masked out, so any id works; eos is the conventional choice.
            self.tokenizer.pad_token = self.tokenizer.eos_token
        try:
            torch_dtype = getattr(torch, dtype)
        except AttributeError:
            raise InputError(f"unknown dtype {dtype!r}; use float32, bfloat16 or float16") from None
        self.model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch_dtype)
        self.model.to(self.device).eval()
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        self.eos_ids: frozenset[int] = frozenset([eos] if isinstance(eos, int) else (eos or []))
        if not self.eos_ids:
            raise EngineUnavailable(
                f"model at {self.model_path} defines no eos token; set eos_token_id in its "
                "generation_config.json or tokenizer"
            )
        self._lock = threading.Lock()
        self._stop: threading.Event | None = None  # the running generate call's cancel flag
        # A fast tokenizer keeps padding/truncation as mutable state that every call resets, and callers
        # use ``engine.tokenizer`` from other threads (chat templates, prompt-token counts) while a
        # generation runs in a worker thread: a call there could switch padding off between our
        # ``padding=True`` and the encoding, and a batch of unequal prompts then fails to stack. The
        # engine encodes with its own copy, which nobody else touches.
        self._encoder = copy.deepcopy(self.tokenizer)

    async def generate(self, prompts: list[str], n: int, max_tokens: int, temperature: float, seed: int | None = None,
                       *, logprobs: int | None = None, confidence_window: int = DEFAULT_WINDOW
                       ) -> list[list[Completion]]:
        """Sample ``n`` completions for each prompt (module docstring: counts, seeding, logprobs)."""
        check_generate_args(n, max_tokens, temperature, logprobs, confidence_window)
        if not prompts:
            return []
        stop = threading.Event()
        try:
            return await asyncio.to_thread(self._generate_locked, list(prompts), n, max_tokens, temperature, seed,
                                           (logprobs, confidence_window), stop)
        finally:
            stop.set()  # cancelled (the client went away): the batch ends at its next decode step, freeing the model

    async def stream_wave(self, prompt: str, n: int, max_tokens: int, temperature: float, seed: int | None,
                          on_finish: OnFinish, *, logprobs: int | None = None,
                          confidence_window: int = DEFAULT_WINDOW) -> WaveStream:
        """``n`` samples of ``prompt`` in one batch, stopped when ``on_finish`` says so (module docstring)."""
        check_generate_args(n, max_tokens, temperature, logprobs, confidence_window)
        conf = (logprobs, confidence_window)
        if n > self.micro_batch:
            [comps] = await self.generate([prompt], n, max_tokens, temperature, seed, logprobs=logprobs,
                                          confidence_window=confidence_window)
            return await replay_finishes(comps, on_finish)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Finish | None] = asyncio.Queue()
        stop = threading.Event()

        def put(item: Finish | None) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the loop has closed: nobody listens any more
                stop.set()

        worker = asyncio.ensure_future(
            asyncio.to_thread(self._stream_locked, prompt, n, max_tokens, temperature, seed, stop, put, conf))
        worker.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved even if nobody awaits
        try:
            return await consume_finishes(queue, worker, stop, on_finish, n)
        except Exception:
            stop.set()
            await asyncio.wait([worker])  # the thread ends within a step; the lock is free on return
            raise
        finally:
            stop.set()  # cancelled: generate ends at its next step and releases the lock

    def generate_sync(
        self, prompts: list[str], n: int, max_tokens: int, temperature: float, seed: int | None = None,
        *, logprobs: int | None = None, confidence_window: int = DEFAULT_WINDOW,
    ) -> list[list[Completion]]:
        """The blocking form of :meth:`generate`, for scripts and benchmarks without an event loop."""
        check_generate_args(n, max_tokens, temperature, logprobs, confidence_window)
        conf = (logprobs, confidence_window)
        return self._generate_locked(list(prompts), n, max_tokens, temperature, seed, conf)

    @contextmanager
    def _running(self) -> Iterator[None]:
        """One call's hold on the model: the lock, inference mode, ``threads`` (restored after)."""
        import torch

        with self._lock, torch.inference_mode():
            previous_threads = torch.get_num_threads()
            if self.threads is not None:
                torch.set_num_threads(self.threads)
            try:
                yield
            finally:
                torch.set_num_threads(previous_threads)

    @contextmanager
    def _seeded(self, seed: int | None) -> Iterator[None]:
        """``torch.manual_seed(seed)`` in a forked RNG (the global one is left as it was); None: unseeded."""
        import torch

        if seed is None:
            yield
            return
        devices = [torch.cuda.current_device()] if self.device.startswith("cuda") else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            yield

    def _generate_locked(self, prompts: list[str], n: int, max_tokens: int, temperature: float,
                         seed: int | None, conf: _Conf = (None, DEFAULT_WINDOW),
                         stop: threading.Event | None = None) -> list[list[Completion]]:
        with self._running(), self._seeded(seed):
            self._stop = stop  # this call's, read by its micro-batches (calls run one at a time, under the lock)
            return self._generate_rows(prompts, n, max_tokens, temperature, conf)

    def _stream_locked(self, prompt: str, n: int, max_tokens: int, temperature: float, seed: int | None,
                       stop: threading.Event, put: Put, conf: _Conf) -> tuple[int, int]:
        """One prompt's ``n`` rows in one ``generate`` call, each finish ``put`` as it happens (with its
        confidence when ``conf`` asks), all rows stopped once ``stop`` is set; returns (prompt tokens, tokens
        every unfinished row had then)."""
        from transformers import LogitsProcessorList, StoppingCriteriaList

        steps = None if conf[0] is None else StepConfidence(conf[0], conf[1])
        processors = LogitsProcessorList([] if steps is None else [steps.processor()])

        try:
            with self._running(), self._seeded(seed):
                enc = self._encoder([prompt] * n, return_tensors="pt", padding=True).to(self.device)
                width, plen = enc["input_ids"].shape[1], int(enc["attention_mask"][0].sum())
                if stop.is_set():  # stopped (cancelled) while waiting for the lock
                    return plen, 0
                watch = batch_finish_watch(self._completion, self.eos_ids, width, plen, max_tokens, stop, put, steps)
                out = self._run_generate(enc, max_tokens, temperature, StoppingCriteriaList([watch]), processors=processors)
                return plen, out.shape[1] - width
        finally:
            put(None)

    def _generate_rows(self, prompts: list[str], n: int, max_tokens: int, temperature: float,
                       conf: _Conf) -> list[list[Completion]]:
        # Row r samples prompt r // n; rows are contiguous per prompt so results regroup by slicing.
        rows = [p for p in prompts for _ in range(n)]
        flat: list[Completion] = []
        for start in range(0, len(rows), self.micro_batch):
            if self._stop is not None and self._stop.is_set():
                break  # cancelled: nobody reads the rest
            batch = rows[start : start + self.micro_batch]
            flat.extend(self._generate_batch(batch, max_tokens, temperature, conf))
        return [flat[i * n : (i + 1) * n] for i in range(len(prompts))]

    def _generate_batch(self, rows: list[str], max_tokens: int, temperature: float,
                        conf: _Conf) -> list[Completion]:
        k, window = conf
        enc = self._encoder(rows, return_tensors="pt", padding=True).to(self.device)
        out = self._run_generate(enc, max_tokens, temperature, streaming.stop_when(self._stop), logits=k is not None)
        width = enc["input_ids"].shape[1]
        seqs = out if k is None else out.sequences
        new_tokens = seqs[:, width:].tolist()
        prompt_lens = enc["attention_mask"].sum(dim=1).tolist()
        comps = [self._completion(ids, int(plen), max_tokens)
                 for ids, plen in zip(new_tokens, prompt_lens, strict=True)]
        if k is None:
            return comps
        # out.logits: one (rows, vocab) tensor of raw logits (before temperature) per step
        return [_with_confidence(c, out.logits, r, new_tokens[r], k, window) for r, c in enumerate(comps)]

    def _run_generate(self, enc: Any, max_tokens: int, temperature: float, stopping: Any = None,
                      logits: bool = False, processors: Any = None) -> Any:
        """``model.generate`` on encoded rows: plain temperature sampling, or greedy at 0; ``logits``: return
        the ``generate`` output object with every step's raw logits (``output_logits=True``); ``processors``:
        extra logits processors (they run before the temperature)."""
        sampling: dict[str, Any] = ({"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
                                    if temperature > 0 else {"do_sample": False})
        extra = {"output_logits": True, "return_dict_in_generate": True} if logits else {}
        return self.model.generate(**enc, max_new_tokens=max_tokens, eos_token_id=sorted(self.eos_ids),
                                   pad_token_id=self.tokenizer.pad_token_id, stopping_criteria=stopping,
                                   logits_processor=processors, **sampling, **extra)

    def _completion(self, ids: list[int], prompt_tokens: int, max_tokens: int) -> Completion:
        """One generated row as a :class:`Completion` (:func:`count_completion`; eos not in the text)."""
        count, reason = count_completion(ids, self.eos_ids, max_tokens)
        kept = ids[: count - 1] if count > 0 and ids[count - 1] in self.eos_ids else ids[:count]
        return Completion(self._encoder.decode(kept, skip_special_tokens=True), prompt_tokens, count, reason)

    async def probe_entropy(self, prompts: list[str], max_tokens: int) -> ProbeResult:
        """Exact mean token entropy of one greedy answer per prompt, from every step's full logits
        (:mod:`isocompute.engines.probe`); never interleaved with a generation."""
        return await asyncio.to_thread(self._probe_locked, list(prompts), max_tokens)

    def _probe_locked(self, prompts: list[str], max_tokens: int) -> ProbeResult:
        with self._running():
            return ProbeResult.concat([self._probe_batch(prompts[s : s + self.micro_batch], max_tokens)
                                       for s in range(0, len(prompts), self.micro_batch)])

    def _probe_batch(self, rows: list[str], max_tokens: int) -> ProbeResult:
        import torch

        enc = self._encoder(rows, return_tensors="pt", padding=True).to(self.device)
        out = self.model.generate(
            **enc, max_new_tokens=max_tokens, do_sample=False, output_logits=True, return_dict_in_generate=True,
            pad_token_id=self.tokenizer.pad_token_id, eos_token_id=sorted(self.eos_ids),
        )
        # (steps, rows, vocab) raw logits → (rows, steps) entropies; positions after a row's eos are padding.
        step_h = entropy_from_logits(torch.stack(out.logits).to(torch.float64).cpu().numpy()).T
        new = out.sequences[:, enc["input_ids"].shape[1] :].tolist()
        counts = [count_completion(ids, self.eos_ids, max_tokens)[0] for ids in new]
        values = [mean_entropy(h[:m]) for h, m in zip(step_h, counts, strict=True)]
        return ProbeResult.of(values, enc["attention_mask"].sum(dim=1).tolist(), counts, "exact")

    def model_config(self) -> dict[str, Any]:
        """The model's ``config.json`` as a dict (for FLOP accounting)."""
        return self.model.config.to_dict()

    async def aclose(self) -> None:
        """Drop the model so its memory can be reclaimed."""
        with self._lock:
            self.model = None  # type: ignore[assignment]


def _with_confidence(c: Completion, logits: Any, row: int, ids: list[int], k: int, window: int) -> Completion:
    """``c`` with its confidence from row ``row`` of the steps' raw ``logits`` and its generated ``ids``
    (eos included; the steps after it are padding)."""
    import torch

    m = c.completion_tokens
    mine = torch.stack([step[row] for step in logits[:m]]).float().cpu().numpy() if m else None
    stats = stats_from_logits(mine, ids[:m], k=k, window=window) if m else None
    return c if stats is None else replace(c, logprob_mean=stats[0], confidence_min_window=stats[1])
