"""The report's plan parts: fixed-plan baselines, latency, and the accuracy-vs-cost plot of every method.

For a policy over plans (:mod:`isocompute.policy.plans.menu`) :func:`plans_section` adds to ``report.md``:

* per budget, every method at its realised cost — the hindsight oracle over plans, the policy as served,
  its own fixed-plan rule, the best fixed plan of each stopping-rule family (lead, ESC window,
  Adaptive-Consistency Beta / Dirichlet, Best-of-∞ Bayes factor; each chosen on the training folds only:
  :mod:`isocompute.evaluation.baselines`) and of all of them, and uniform — with accuracy, realised cost and
  expected waves (upstream requests per prompt, the latency a plan adds), and with token counts expected
  tokens generated and latency per prompt (in ``latency_unit_tokens``: 1.0 = one sample's mean length;
  decode time plus ``wave_overhead`` per expected wave), and in seconds with ``decode_speed``;
* the policy's gain over the best fixed plan with its paired bootstrap 95% CI, the part no fixed rule has;
* what each fixed rule plays at each budget.

:func:`plot_accuracy_cost` draws accuracy against *realised* cost for every method (``accuracy_cost.png``),
the fair axis when methods spend slightly different amounts; when the rows have ``tokens`` and ``latency``
(:func:`accuracy_cost_figure`) two panels side by side: accuracy vs realised tokens (log2 axis) and accuracy
vs latency (in sample lengths, or seconds when the rows have ``latency_s``), same methods and legend. :func:`action_groups` lets the action plots
group a large plan menu by rule kind. Ignores: one-wave reports (nothing here applies; the plot still
draws).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from isocompute.policy.plans.menu import FAMILY_BASELINES, PARALLEL_BASELINES

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ROWS = ("oracle", "learned", "fixed_plan", *(f"fixed_{f}" for f in (*FAMILY_BASELINES, *PARALLEL_BASELINES)),
        "fixed_best", "uniform")
LABELS = {"oracle": "oracle over plans (hindsight)", "learned": "policy as served", "fixed_plan": "policy's fixed plan",
          "fixed_best": "best fixed plan (all families)", "uniform": "uniform maj@k",
          **{f"fixed_{f}": f"best {label}" for f, (label, _) in FAMILY_BASELINES.items()},
          **{f"fixed_{f}": f"best {label}" for f, (label, _, _) in PARALLEL_BASELINES.items()}}
MAX_GROUPS = 8  # action plots show at most this many plans, else one bar per rule kind


def _pct(x: float | None) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:+.2f}%"


def _num(x: float | None, fmt: str) -> str:
    return "—" if x is None else format(x, fmt)


def plans_section(report: dict[str, Any]) -> list[str]:
    """Markdown lines of the plan parts (empty for a one-wave report)."""
    if not report.get("plans"):
        return []
    unit = report["cost_unit"]
    lines = ["## Plans: fixed stopping rules and latency", "",
             f"The policy chooses among {len(report['plans'])} plans (`report.json` → `plans`). Each fixed rule plays "
             "one plan, or a budget-matched mix of two, for every prompt, chosen on the training folds only and "
             "scored on the held-out fold; the family rows are the ESC / Adaptive-Consistency / Best-of-∞ "
             f"baselines. Cost is the realised mean {unit} per prompt, waves the expected upstream requests per "
             "prompt (latency).", ""]
    timed = report.get("latency_unit_tokens") is not None
    secs = timed and report.get("decode_speed") is not None
    if timed:
        o = report.get("wave_overhead") or 0.0
        lines[-2] += (" Tokens: expected completion tokens generated per prompt; latency: expected decode time "
                      f"per prompt, 1.0 = one sample's mean length ({report['latency_unit_tokens']:.6g} tokens), "
                      + (f"plus {o:g} per expected wave (prefill and queueing, `--wave-overhead`)." if o else
                         "with no per-wave overhead.")
                      + (f" Latency (s): the same at {report['decode_speed']:g} decode tokens per second "
                         "(`--decode-speed`)." if secs else ""))
        if src := report.get("wave_overhead_source"):
            lines[-2] += (f" The overhead was measured on the gateway metrics scrape `{src['scrape']}`: "
                          f"{src['overhead_s']:.4g} s to a streamed wave's first token ({src['waves']} waves), "
                          f"{src['s_per_token']:.4g} s per decode token, so {o:g} samples at "
                          f"{src['tokens_per_sample']:.4g} tokens per sample.")
    for e in report["budgets"]:
        m = e["methods"]
        lines += [f"**Budget {e['budget']:.4g}**", "", "| method | accuracy [95% CI] | cost | waves | "
                  + ("tokens | latency | " if timed else "") + ("latency (s) | " if secs else "")
                  + "gain vs uniform |", "|---|---|---:|---:|" + ("---:|---:|" if timed else "")
                  + ("---:|" if secs else "") + "---:|"]
        by = e.get("gain_vs_uniform_by_method", {})
        for name in ROWS:
            if name not in m:
                continue
            x = m[name]
            g = e["gain_vs_uniform"]["relative"] if name == "learned" else (by.get(name) or {}).get("relative")
            lines.append(f"| {LABELS.get(name, name)} | {x['accuracy']:.4f} [{x['ci95'][0]:.4f}, {x['ci95'][1]:.4f}] | "
                         f"{x['cost']:.4g} | {x.get('waves', 1.0):.2f} | "
                         + (f"{_num(x.get('tokens'), '.4g')} | {_num(x.get('latency'), '.3f')} | " if timed else "")
                         + (f"{_num(x.get('latency_s'), '.4g')} | " if secs else "")
                         + f"{_pct(g) if name != 'uniform' else '—'} |")
        for base, g in e.get("gain_vs_fixed", {}).items():
            sig = "" if g["significant"] else " (*not significant*: the CI contains 0)"
            lines.append("")
            lines.append(f"Policy vs {LABELS.get(base, base)}: {_pct(g['relative'])} [95% CI {_pct(g['ci95'][0])}, "
                         f"{_pct(g['ci95'][1])}]{sig}.")
        lines.append("")
    choices = report.get("baseline_choices") or []
    fixed = {round(x["budget"], 9): x["plays"] for x in report.get("fixed_plans") or []}
    if choices:
        names = list(choices[0]["plays"])
        lines += ["What each fixed rule plays, chosen on every prompt of the table (each fold chose on its own "
                  "training part):", "", "| budget | policy's fixed plan | " + " | ".join(names) + " |",
                  "|---:|---|" + "---|" * len(names)]
        for c in choices:
            lines.append(f"| {c['budget']:.4g} | `{fixed.get(round(c['budget'], 9), '—')}` | "
                         + " | ".join(f"`{c['plays'][n]}`" for n in names) + " |")
        lines.append("")
    return lines


def plot_accuracy_cost(report: dict[str, Any], path: Path) -> None:
    """Write :func:`accuracy_cost_figure` to ``path`` (PNG)."""
    accuracy_cost_figure(report).savefig(path, dpi=110)


def accuracy_cost_figure(report: dict[str, Any]) -> Figure:
    """Accuracy against realised cost, one line per method over the report's budgets; when every plotted
    method's rows have ``tokens`` and ``latency``, two panels instead: accuracy vs realised tokens and vs
    latency (seconds when the rows have ``latency_s``), the legend on the first."""
    from matplotlib.figure import Figure

    entries = report["budgets"]
    names = [m for m in (*ROWS, "heuristic", "random") if all(m in e["methods"] for e in entries)]
    timed = [m for m in names if all(e["methods"][m].get(k) is not None for e in entries for k in ("tokens", "latency"))]
    n = report["n_prompts"]
    if not timed:
        fig = Figure(figsize=(7.5, 5))
        ax = fig.subplots()
        _panel(ax, entries, names, "cost", f"realised cost (mean {report['cost_unit']} per prompt)", log2=True)
        ax.set_title(f"accuracy vs cost, every method ({n} prompts, held out)")
    else:
        fig = Figure(figsize=(13, 5))
        axes = fig.subplots(1, 2, sharey=True)
        secs = all(e["methods"][m].get("latency_s") is not None for e in entries for m in timed)
        o = report.get("wave_overhead") or 0.0
        extra = f", overhead {o:g} per wave" if o else ""
        unit = report.get("latency_unit_tokens")
        label = (f"latency (s per prompt at {report.get('decode_speed', 0):g} tokens/s{extra})" if secs else
                 f"latency (× one sample's mean length{'' if unit is None else f', {unit:.4g} tokens'}{extra})")
        _panel(axes[0], entries, timed, "tokens", "realised tokens (mean completion tokens per prompt)", log2=True)
        _panel(axes[1], entries, timed, "latency_s" if secs else "latency", label, log2=False)
        ax = axes[0]
        fig.suptitle(f"accuracy vs tokens and latency, every method ({n} prompts, held out)")
    ax.set_ylabel("accuracy (mean utility)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _panel(ax: Any, entries: list[dict[str, Any]], names: list[str], key: str, xlabel: str, *, log2: bool) -> None:
    """One method line per name: accuracy against its rows' ``key`` (log2 x when every value is > 0)."""
    xs = []
    for m in names:
        x = np.array([np.nan if (v := e["methods"][m].get(key)) is None else v for e in entries], dtype=float)
        acc = [e["methods"][m]["accuracy"] for e in entries]
        style = "-" if m in ("learned", "oracle", "uniform", "fixed_best") else "--"
        ax.plot(x, acc, style, marker="o", ms=3, lw=1.6 if style == "-" else 1.0, label=LABELS.get(m, m))
        xs.append(x)
    if log2 and xs and np.nanmin(np.concatenate(xs)) > 0:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.grid(alpha=0.3)


def action_groups(report: dict[str, Any]) -> tuple[list[str], np.ndarray]:
    """(labels, group of each action): the actions themselves (k, or plan names) for small menus, else one
    group per rule kind (``none``, ``lead``, …) for menus above :data:`MAX_GROUPS` plans."""
    plans = report.get("plans")
    if not plans:
        return [str(k) for k in report["actions"]], np.arange(len(report["actions"]))
    if len(plans) <= MAX_GROUPS:
        return list(plans), np.arange(len(plans))
    kinds = [p.partition("@")[0].partition(":")[0] for p in plans]
    labels = list(dict.fromkeys(kinds))
    return labels, np.array([labels.index(k) for k in kinds])
