"""The stages' list-valued options, from their command-line text to typed values.

Each function takes the text of one option and returns its value, or raises
:class:`~isocompute.errors.InputError` with a message that shows the expected form (the CLI prints it and
exits 2). They are the ``parse`` of the config fields (:mod:`isocompute.stages.options`).

``solve`` and ``fit`` read ``--actions`` and ``--budgets`` differently, on purpose: ``solve`` takes any set of
sample counts (sorted, deduplicated) and a list or ``start:stop:step`` of budgets to solve at;
``fit`` needs at least two distinct actions to choose between and a budget *range* (``lo:hi``).
Ignores: what the stages do with the values.
"""

from __future__ import annotations

import math

from isocompute.errors import InputError

__all__ = ["Multiple", "parse_action_set", "parse_actions", "parse_budget", "parse_budget_range", "parse_budgets",
           "parse_features", "parse_names", "parse_plans", "parse_seeds", "resolve_budgets"]


class Multiple(float):
    """A budget written as a multiple of one sample's mean completion tokens on the table (``4x``), for the
    tokens cost unit; the stage that has read the table turns it into tokens (:func:`resolve_budgets`)."""

    def __repr__(self) -> str:
        return f"{float(self):g}x"


def _number(text: str) -> float:
    """``"4"`` → 4.0, ``"4x"`` → Multiple(4.0); ValueError otherwise."""
    t = text.strip()
    return Multiple(float(t[:-1])) if t.lower().endswith("x") else float(t)


def parse_budget(text: str) -> float:
    """``solve --budget``: a number (``4``), or a multiple of one sample's mean tokens (``4x``, tokens unit)."""
    try:
        value = _number(text)
    except ValueError:
        raise InputError(f"--budget must be a number (e.g. 4) or, in the tokens unit, a multiple of one "
                         f"sample's mean completion tokens (e.g. 4x); got {text!r}.") from None
    return value


def resolve_budgets(values: list[float], cost_unit: str, tokens_per_sample: float | None) -> list[float]:
    """Budgets with multiples (``4x``) turned into tokens: ``tokens_per_sample`` × the multiple. Plain numbers
    pass unchanged. InputError when multiples are mixed with plain numbers or used outside the tokens unit."""
    multiples = [isinstance(v, Multiple) for v in values]
    if not any(multiples):
        return [float(v) for v in values]
    if not all(multiples):
        raise InputError("write every budget as a multiple (e.g. 1x:16x) or none of them (e.g. 300:4800).")
    if cost_unit != "tokens":
        raise InputError(f"budgets written as multiples (e.g. 4x) are multiples of one sample's mean completion "
                         f"tokens: add --cost-unit tokens (this run's unit is {cost_unit}).")
    if tokens_per_sample is None:
        raise InputError("budgets written as multiples (e.g. 4x) need the table's completion_tokens.")
    return [float(v) * tokens_per_sample for v in values]


def parse_actions(text: str) -> list[int]:
    """``solve --actions``: "1,2,4,8" → [1, 2, 4, 8] (sorted, deduplicated); raise InputError on anything but
    integers ≥ 1."""
    try:
        ks = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise InputError(f"--actions must be a comma list of sample counts like 1,2,4,8; got {text!r}.") from None
    if not ks or ks[0] < 1:
        raise InputError(f"--actions must list sample counts k ≥ 1, like 1,2,4,8; got {text!r}.")
    return ks


def parse_budgets(text: str) -> list[float]:
    """``solve --budgets``: "1:16:0.5" (start:stop:step, stop included) or "1,2,4" → a list of budgets."""
    try:
        if ":" in text:
            start, stop, step = (_number(x) for x in text.split(":"))
            if not (step > 0 and stop >= start and math.isfinite(start) and math.isfinite(stop)):
                raise ValueError
            n = int(math.floor((stop - start) / step + 1e-9)) + 1
            if n > 100_000:
                raise InputError(f"--budgets {text} asks for {n} budgets; use a larger step (at most 100,000).")
            kind = Multiple if isinstance(start, Multiple) else float
            return [kind(start + i * step) for i in range(n)]
        out = [_number(x) for x in text.split(",") if x.strip()]
        if not out:
            raise ValueError
        return out
    except ValueError:
        raise InputError(f"--budgets must be start:stop:step with step > 0 and stop ≥ start (e.g. 1:16:0.5) "
                         f"or a comma list (e.g. 1,2,4); got {text!r}.") from None


def parse_action_set(text: str) -> tuple[int, ...]:
    """``fit --actions``: "1,2,4,8" → (1, 2, 4, 8); raises InputError on anything but distinct integers ≥ 1."""
    try:
        ks = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise InputError(f"--actions must be a comma list of sample counts like 1,2,4,8; got {text!r}.") from None
    if len(ks) < 2 or min(ks) < 1 or len(set(ks)) != len(ks):
        raise InputError(f"--actions must list at least two distinct sample counts k ≥ 1, like 1,2,4,8; "
                         f"got {text!r}.")
    return tuple(sorted(ks))


def parse_budget_range(text: str) -> list[float]:
    """``fit``/``report --budgets``: "1,2,4" → [1, 2, 4]; "lo:hi" → [lo, hi]; "start:stop:step" → the list
    (stop included)."""
    try:
        parts = [_number(x) for x in text.split(":")] if ":" in text else None
        if parts is not None:
            if len(parts) == 2:
                lo, hi = parts
                if not lo < hi:
                    raise ValueError
                return [lo, hi]
            start, stop, step = parts
            if not (step > 0 and stop >= start):
                raise ValueError
            n = int(math.floor((stop - start) / step + 1e-9)) + 1
            if n > 10_000:
                raise InputError(f"--budgets {text} asks for {n} budgets; use a larger step.")
            kind = Multiple if isinstance(start, Multiple) else float
            return [kind(start + i * step) for i in range(n)]
        out = sorted({_number(x) for x in text.split(",") if x.strip()})
        if not out or not all(math.isfinite(b) for b in out):
            raise ValueError
        return out
    except ValueError:
        raise InputError(f"--budgets must be a range lo:hi (e.g. 1:16), start:stop:step (e.g. 1:16:1) or a "
                         f"comma list (e.g. 1,2,4,8), in the tokens unit also as multiples of one sample's mean "
                         f"tokens (e.g. 1x:16x); got {text!r}.") from None


def parse_seeds(text: str) -> tuple[int, ...]:
    """``report --seeds``: "3" → (0, 1, 2); "0,5,7" → (0, 5, 7)."""
    try:
        if "," in text:
            seeds = tuple(int(x) for x in text.split(",") if x.strip())
        else:
            seeds = tuple(range(int(text)))
    except ValueError:
        raise InputError(f"--seeds must be a count (e.g. 3) or a comma list (e.g. 0,5,7); got {text!r}.") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise InputError(f"--seeds must name at least one distinct seed; got {text!r} (a single number is a count: "
                         "--seeds 1 runs seed 0; for one specific seed write it with a comma, e.g. --seeds 7,).")
    return seeds


def parse_plans(text: str | None, actions: tuple[int, ...], strategy: str, *,
                parallel: bool = False) -> tuple[str, ...]:
    """``--plans SPEC`` → the menu's plan names (``()``: the one-wave actions). Without the flag:
    ``default`` for majority voting, ``none`` for the other strategies (plans vote by majority).
    ``parallel``: ``default`` also holds the parallel-stop plans (cost in tokens or FLOPs, or a latency
    budget: :func:`isocompute.policy.plans.menu.resolve_plans`)."""
    from isocompute.policy.plans.menu import resolve_plans

    spec = text if text is not None else ("default" if strategy == "majority" else "none")
    if spec.strip() == "none":
        return ()
    if strategy != "majority":
        raise InputError(f"plans vote by majority; --strategy {strategy} needs --plans none (k samples at once).")
    return tuple(p.name for p in resolve_plans(spec, actions, parallel=parallel))


def parse_features(text: str | None) -> tuple[str, ...]:
    """``fit --features``: "minilm" → ("minilm",); None or "" → (); names are checked by PolicyConfig."""
    return tuple(part.strip() for part in (text or "").split(",") if part.strip())


def parse_names(text: str) -> tuple[str, ...]:
    """A comma list of names: "escalate,single_model" → ("escalate", "single_model")."""
    return tuple(r.strip() for r in text.split(",") if r.strip())
