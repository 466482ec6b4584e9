"""Tables of several models: outcome tables of the same prompts, one per model, joined by prompt id.

``join_tables({"gpt-oss-20b": t1, "Qwen3-14B": t2, …})`` checks that every table holds the same prompt
ids (else an error that says how many are missing where, names a few, and what to do), that the prompt
texts and golds agree, and reorders every table to the first table's order. The result,
:class:`ModelTables`, keeps each model's own :class:`~isocompute.solver.outcomes.OutcomeTable` (its
samples, verdicts, token counts, meta) and one array of answer codes per model.

Answer codes across models. A table's codes are dense per record within that table, so right after the
join the codes of two models mean different answers (``aligned`` is False): fine for single-model
plans, wrong for a vote that mixes models. :meth:`ModelTables.with_classes` installs classes computed
over the union of each prompt's answers — :func:`isocompute.tasks.answers.class_alignment.align_answers` on
:meth:`ModelTables.answers` (the solver room does not import ``tasks``; the caller passes them in)::

    joined = join_tables({"A": ta, "B": tb})
    al = align_answers(joined.answers(), joined.kind, golds=joined.golds, grader=grader, cache=path)
    joined = joined.with_classes(al.classes)            # aligned: class g is one answer for every model

After that, :meth:`ModelTables.class_values` gives each union class's value — the mean correctness of
every sample (of every model) in it; with consistent verdicts it is 1 for the gold's class, 0 otherwise
(:meth:`ModelTables.mixed_classes` counts the exceptions) — and :meth:`ModelTables.partition_changes`
counts, per model, the prompts whose own classes the union split or joined (greedy merging is not
transitive; rare).

Worked example: A answers prompt p1 with ``["4", "4", "5"]`` (table codes 0, 0, 1), B with
``["5", "4"]`` (codes 0, 1 in B's table: 5 came first there). Aligned over the union ``4 4 5 5 4``
with gold 4: A → 0, 0, 1 and B → 1, 0, so an ensemble vote counts 4 three times and 5 twice.

Ignores: costs (:mod:`isocompute.solver.models.costs`) and actions (:mod:`isocompute.solver.models.actions`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from isocompute.errors import InputError
from isocompute.solver.outcomes import NULL_CODE, PAD_CODE, OutcomeTable

MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_NAME_RULE = ("a model name is letters, digits, '.', '_' or '-' (starting with a letter or digit), "
              "e.g. gpt-oss-20b or Qwen3-14B")


def check_model_name(name: str) -> str:
    """``name`` if it is a valid model name (it appears inside action names), else an :class:`InputError`."""
    if not isinstance(name, str) or not MODEL_NAME.fullmatch(name):
        raise InputError(f"bad model name {name!r}: {_NAME_RULE}.")
    return name


@dataclass(frozen=True, eq=False)
class ModelTables:
    """Joined tables (module docstring): ``tables[name]`` in the common prompt order, ``codes[name]``
    (N, n_max of that model) answer codes (classes ≥ 0, −1 null, −2 padding), comparable across models
    exactly when ``aligned``."""

    names: tuple[str, ...]
    tables: dict[str, OutcomeTable]
    codes: dict[str, np.ndarray]
    aligned: bool = False

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def first(self) -> OutcomeTable:
        return self.tables[self.names[0]]

    @property
    def ids(self) -> list[str]:
        return self.first.ids

    @property
    def prompts(self) -> list[str]:
        return self.first.prompts

    @property
    def golds(self) -> list[str]:
        return self.first.golds

    @property
    def kind(self) -> str:
        """The answer kind (or task) the tables were graded with, from their meta (``answer_kind``, else
        ``task``); an :class:`InputError` when the tables do not say or disagree."""
        found = set()
        for name in self.names:
            meta = self.tables[name].meta
            found.add(meta.get("answer_kind") or meta.get("task"))
        if len(found) != 1 or None in found:
            raise InputError(f"the tables' meta give answer kinds {sorted(map(str, found))}; every table needs the "
                             "same meta.answer_kind or meta.task (as `isocompute import` and `sample` write), or pass "
                             "the kind explicitly.")
        return str(found.pop())

    @property
    def fingerprint(self) -> str:
        """sha256 over the model names and each table's source digest (ids where a table has none)."""
        h = hashlib.sha256()
        for name in self.names:
            t = self.tables[name]
            h.update(f"{name}\0{t.sha256 or hashlib.sha256(chr(0).join(t.ids).encode()).hexdigest()}\0".encode())
        return h.hexdigest()

    def answers(self) -> list[list[list[str | None]]]:
        """Raw answers ``[model][prompt][sample]``, the input of ``align_answers``."""
        return [[[s["answer"] for s in rec["samples"]] for rec in self.tables[name].records] for name in self.names]

    def with_classes(self, classes: Sequence[Sequence[Sequence[int | None]]] | Mapping[str, Sequence]) -> ModelTables:
        """These tables with answer classes shared by every model: ``classes[m][i][j]`` for model m (in
        :attr:`names` order, or a mapping by name), prompt i, sample j — an integer ≥ 0, None exactly
        where the answer is null."""
        by_name = dict(classes) if isinstance(classes, Mapping) else dict(zip(self.names, classes, strict=False))
        if sorted(by_name) != sorted(self.names):
            raise InputError(f"with_classes needs classes for the models {list(self.names)}; got {sorted(by_name)}.")
        codes = {}
        for name in self.names:
            t, rows = self.tables[name], by_name[name]
            if len(rows) != len(t):
                raise InputError(f"classes for {name} cover {len(rows)} prompts; the joined tables have {len(t)}.")
            out = np.full(t.answer_codes.shape, PAD_CODE, dtype=np.int64)
            for i, (row, n) in enumerate(zip(rows, t.n_samples, strict=True)):
                if len(row) != n:
                    raise InputError(f"classes for {name}, prompt {t.ids[i]!r}: {len(row)} classes for {int(n)} samples.")
                out[i, :n] = [NULL_CODE if c is None else c for c in row]
            own_null = t.answer_codes == NULL_CODE
            if ((out == NULL_CODE) != own_null).any() or (out[t.mask] < NULL_CODE).any():
                i = int(np.argmax(((out == NULL_CODE) != own_null).any(axis=1) | (out < NULL_CODE).any(axis=1)))
                raise InputError(f"classes for {name}, prompt {t.ids[i]!r}: a class must be None exactly where the "
                                 "answer is null and an integer >= 0 elsewhere; recompute them with align_answers.")
            codes[name] = out
        return replace(self, codes=codes, aligned=True)

    def class_values(self) -> np.ndarray:
        """(N, G) value of each union class: the mean correctness of every sample, of every model, in it
        (0 for a class no sample has). Needs aligned classes."""
        self._need_aligned("class values")
        G = max(int(c.max(initial=-1)) for c in self.codes.values()) + 1
        N = len(self)
        right, count = np.zeros(N * max(G, 1)), np.zeros(N * max(G, 1))
        for name in self.names:
            c, ok = self.codes[name], self.tables[name].correct
            voting = c >= 0
            key = (np.arange(N)[:, None] * G + c)[voting]
            right += np.bincount(key, weights=ok[voting], minlength=right.size)
            count += np.bincount(key, minlength=count.size)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(count > 0, right / np.maximum(count, 1), 0.0).reshape(N, max(G, 1))

    def mixed_classes(self) -> int:
        """How many (prompt, union class) pairs hold both correct and incorrect samples."""
        vals = self.class_values()
        return int(((vals > 0) & (vals < 1)).sum())

    def partition_changes(self) -> dict[str, int]:
        """Per model, the prompts whose samples the aligned classes group differently from the model's own
        table (a class split or two joined)."""
        self._need_aligned("partition changes")
        out = {}
        for name in self.names:
            own, new, mask = self.tables[name].answer_codes, self.codes[name], self.tables[name].mask
            changed = 0
            for i in range(len(self)):
                a, b = own[i][mask[i]], new[i][mask[i]]
                pairs = len(set(zip(a.tolist(), b.tolist(), strict=True)))
                changed += not (pairs == len(set(a.tolist())) == len(set(b.tolist())))
            out[name] = changed
        return out

    def subset(self, indices: Sequence[int] | np.ndarray) -> ModelTables:
        """The prompts ``indices`` (ints or a boolean mask), in that order, of every model."""
        idx = np.asarray(indices)
        idx = np.flatnonzero(idx) if idx.dtype == bool else idx.astype(np.int64)
        tables = {n: self.tables[n].subset(idx) for n in self.names}
        codes = {n: self.codes[n][idx, : tables[n].n_max] for n in self.names}
        return ModelTables(self.names, tables, codes, self.aligned)

    def _need_aligned(self, what: str) -> None:
        if not self.aligned:
            raise InputError(f"{what} need answer classes shared by every model: align them first with "
                             "isocompute.tasks.answers.class_alignment.align_answers and ModelTables.with_classes.")


def join_tables(tables: Mapping[str, OutcomeTable], *, missing: Literal["error", "drop"] = "error",
                check: Literal["prompt-gold", "gold", "ids"] = "prompt-gold") -> ModelTables:
    """Join one outcome table per model (name → table) by prompt id, in the first table's order.

    ``missing="error"`` (default) refuses prompts absent from some table; ``"drop"`` keeps only the ids
    every table has. ``check`` compares the joined prompts' texts and golds (whitespace-stripped)
    across tables: ``"prompt-gold"`` both, ``"gold"`` the golds only, ``"ids"`` neither.
    """
    if not tables:
        raise InputError("join_tables needs at least one outcome table (name → table).")
    names = tuple(check_model_name(n) for n in tables)
    first = tables[names[0]]
    common = set(first.ids)
    for n in names[1:]:
        common &= set(tables[n].ids)
    every = _union_order(tables, names)
    lacking = {n: [i for i in every if i not in have] for n in names for have in [set(tables[n].ids)]}
    if missing == "error" and any(lacking.values()):
        total = len(set().union(*(set(t.ids) for t in tables.values())))
        parts = "; ".join(f"{n} lacks {len(v)} (e.g. {', '.join(map(repr, v[:3]))})" for n, v in lacking.items() if v)
        raise InputError(f"the outcome tables do not hold the same prompts: {total - len(common)} of {total} prompt ids "
                         f"are missing from some table — {parts}. Sample or import the missing prompts for those "
                         "models, or join only the prompts every table has (join_tables(..., missing='drop')).")
    if missing not in ("error", "drop"):
        raise InputError(f"missing must be 'error' or 'drop', not {missing!r}.")
    if not common:
        raise InputError(f"the outcome tables {list(names)} have no prompt id in common; were they sampled on the "
                         "same prompts? Ids must match exactly (e.g. math500-17 in every table).")
    order = [i for i in first.ids if i in common]
    joined = {}
    for n in names:
        pos = {rid: r for r, rid in enumerate(tables[n].ids)}
        joined[n] = tables[n].subset([pos[i] for i in order])
    if check not in ("prompt-gold", "gold", "ids"):
        raise InputError(f"check must be 'prompt-gold', 'gold' or 'ids', not {check!r}.")
    fields = {"prompt-gold": ("prompts", "golds"), "gold": ("golds",), "ids": ()}[check]
    base = joined[names[0]]
    for n in names[1:]:
        for field in fields:
            mine, theirs = getattr(base, field), getattr(joined[n], field)
            bad = [r for r, (a, b) in enumerate(zip(mine, theirs, strict=True)) if a.strip() != b.strip()]
            if bad:
                what = field[:-1]
                ex = order[bad[0]]
                raise InputError(
                    f"{len(bad)} of {len(order)} prompts have a different {what} in {n} than in {names[0]} (e.g. "
                    f"{ex!r}: {getattr(base, field)[bad[0]][:60]!r} vs {getattr(joined[n], field)[bad[0]][:60]!r}). "
                    "The tables must answer the same problems; if only the formatting differs, join with "
                    f"check='{'gold' if field == 'prompts' else 'ids'}'.")
    return ModelTables(names, joined, {n: joined[n].answer_codes for n in names}, aligned=len(names) == 1)


def _union_order(tables: Mapping[str, OutcomeTable], names: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(i for n in names for i in tables[n].ids))
