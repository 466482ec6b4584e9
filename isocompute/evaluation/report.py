"""Render an evaluation summary as a report artifact: report.json, report.md and three PNG plots.

``write_report(out_dir, report)`` writes, atomically (one ``artifact_writer`` directory, kind
``report``, schema 1):

* ``report.json`` — the summary of :func:`isocompute.evaluation.evaluate.summarise` plus the run's
  seeds, inputs' sha256 and parameters; top-level ``budgets`` is a list of
  ``{"budget", "methods": {method: {"accuracy", "cost", "ci95"}}, "gain_vs_uniform": {"relative",
  "ci95", ...}, "imitation_accuracy", "regret", "bound", ...}``.
* ``report.md`` — the same numbers as tables, with the significance of every gain spelled out
  ("not significant" when the 95% CI contains 0) and a warning when the sample is small.
* ``accuracy.png`` (accuracy vs budget per method with bootstrap CI bands), ``accuracy_cost.png``
  (accuracy vs realised cost, every method, or with token counts two panels, vs realised tokens and vs
  latency: :mod:`isocompute.evaluation.report_plans`), ``actions.png``
  (oracle vs learned action histograms per budget), ``confusion.png`` (learned vs oracle actions at the
  reference budget: 4 if evaluated, else the middle one). Plan menus above eight plans are grouped by
  rule kind in the last two; a plan policy's report also has the section *Plans: fixed stopping rules
  and latency*.

Ignores: styling beyond legibility; plots use matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from isocompute.artifacts import artifact_writer
from isocompute.evaluation.channels import target_section
from isocompute.evaluation.reach import reach_section
from isocompute.evaluation.report_plans import action_groups, plans_section, plot_accuracy_cost

KIND = "report"
SCHEMA_VERSION = 1
SMALL_SAMPLE = 300  # below this many prompts the report warns that its CIs are wide
PLOT_METHODS = ("oracle", "learned", "uniform", "heuristic", "random")


def reference_budget(report: dict[str, Any]) -> float:
    budgets = [e["budget"] for e in report["budgets"]]
    return 4.0 if any(abs(b - 4.0) < 1e-9 for b in budgets) else budgets[len(budgets) // 2]


def _pct(x: float | None, digits: int = 1) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:+.{digits}f}%"


def _acc(x: float) -> str:
    return f"{x:.4f}"


def render_markdown(report: dict[str, Any]) -> str:
    """The human-readable report (GitHub-flavoured Markdown)."""
    lines = _intro(report) + _learners_section(report) + _accuracy_section(report)
    lines += plans_section(report) + _fallback_section(report) + _same_accuracy_section(report) + reach_section(report)
    lines += _not_binding_note(report) + _spend_section(report) + _ceiling_section(report)
    lines += _both_learners_section(report) + _targets_section(report) + target_section(report)
    lines += ["## Plots", "", "![accuracy vs budget](accuracy.png)", "",
              "![accuracy vs realised cost, every method](accuracy_cost.png)", "", "![actions per budget](actions.png)", "",
              f"![learned vs oracle actions at budget {reference_budget(report):g}](confusion.png)", ""]
    return "\n".join(lines)


def _intro(report: dict[str, Any]) -> list[str]:
    """Title, what was evaluated and how, the probe feature, a small-sample warning and the inputs."""
    n = report["n_prompts"]
    lines = [f"# isocompute report — {report['mode']}", ""]
    if report["mode"] == "cv":
        lines.append(f"{report['folds']}-fold cross-validation over {n} prompts, seeds {report['seeds']}: every "
                     "prompt is scored once per seed by a policy refitted without it.")
    else:
        lines.append(f"Holdout: the policy scored on {n} prompts it never saw.")
    acts = (f"{len(report['plans'])} plans (uniform ladder k = {report['actions']})" if report.get("plans")
            else f"Actions k = {report['actions']}")
    lines += ["", f"{acts}, strategy `{report['strategy']}`, cost unit "
              f"`{report['cost_unit']}`; bootstrap: {report['bootstrap']} resamples of prompts (seed "
              f"{report['bootstrap_seed']}).", ""]
    pr = report.get("probe")
    if pr:
        flops = "" if pr.get("flops") is None else f", {pr['flops']:.4g} FLOPs"
        lines += [f"**Probe feature** `{pr['name']}`: mean token entropy of a greedy answer of at most {pr['max_tokens']} tokens "
                  f"of `{pr['model']}` ({pr['prompt_format']} prompt, {pr['method']}; {pr['source']}). Declared cost "
                  f"**{pr['cost']:.4g} {report['cost_unit']} per request**{flops}, added to every action of the "
                  "learned policy: its accuracy and cost columns are net of the probe, while the oracle and the "
                  f"baselines neither use nor pay for it. Values: mean {pr['mean']:.3f} nats (sd {pr['std']:.3f}); "
                  f"Spearman ρ with 1-sample accuracy {pr['spearman_vs_accuracy_k1']:+.3f}.", ""]
    if n < SMALL_SAMPLE:
        lines += [f"> **Small sample ({n} prompts).** Confidence intervals are wide and a difference whose CI "
                  "contains 0 is *not significant*; read the numbers as a pipeline check, not as evidence.", ""]
    lines += ["## Inputs", ""] + [f"- `{k}`: `{v}`" for k, v in report["inputs"].items()] + [""]
    return lines


def _learners_section(report: dict[str, Any]) -> list[str]:
    """Which learner the policy defaults to, and why."""
    lc = report["learner_comparison"]
    return ["## Learners", "", f"- Default learner of the policy: **{report['policy']['default_learner']}** — "
            f"{report['policy']['selection'].get('why', report['policy']['selection'].get('rule', ''))}.",
            f"- On these held-out prompts: {lc['why']}." if lc.get("better") else "", ""]


def _accuracy_section(report: dict[str, Any]) -> list[str]:
    """Accuracy of every method at each matched budget, with the gain over uniform."""
    lines = ["## Accuracy at matched budgets", "",
             "| budget | oracle | learned | uniform | heuristic | random | learned cost (vs budget) | oracle cost "
             "| gain vs uniform [95% CI] | imitation | regret ≤ bound | APGR |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---|---:|"]
    for e in report["budgets"]:
        m = e["methods"]
        g = e["gain_vs_uniform"]
        sig = "" if g["significant"] else " *not significant*"
        apgr = "—" if e["apgr"] is None else f"{e['apgr']:.2f}"
        lines.append(
            f"| {e['budget']:.4g} | {_acc(m['oracle']['accuracy'])} | {_acc(m['learned']['accuracy'])} | "
            f"{_acc(m['uniform']['accuracy'])} | {_acc(m['heuristic']['accuracy'])} | "
            f"{_acc(m['random']['accuracy'])} | {m['learned']['cost']:.4g} ({_pct(e['cost_error'])}) | "
            f"{m['oracle']['cost']:.4g} | "
            f"{_pct(g['relative'])} [{_pct(g['ci95'][0])}, {_pct(g['ci95'][1])}]{sig} | "
            f"{e['imitation_accuracy']:.3f} | {e['regret']:.4f} ≤ {e['bound']:.4f} "
            f"{'✓' if e['regret_le_bound_all_folds'] else '✗ (a fold violates it: a bug)'} | {apgr} |")
    lines += ["", "Accuracy is the mean utility (expected correctness under the strategy); costs are realised "
              "mean costs on the held-out prompts. The oracle solves the held-out prompts in hindsight (an upper "
              "reference, not achievable); `oracle_lp` in report.json is its LP bound. Uniform mixes the two "
              "k adjacent to the budget; the heuristic gives the larger k to the longest prompts; random deals "
              "the oracle's action histogram to random prompts. The bound is (1 − imitation) × the worst "
              "per-prompt gap; it holds by construction, so ✗ would flag a bug.", ""]
    return lines


def _not_binding_note(report: dict[str, Any]) -> list[str]:
    """Why the oracle may spend less than the budget (only when it does)."""
    lines: list[str] = []
    not_binding = [e["budget"] for e in report["budgets"] if not e["oracle_budget_binding"]]
    if not_binding:
        lines += [f"At budgets {', '.join(f'{b:.4g}' for b in not_binding)} the oracle spends less than the budget "
                  "(see its cost column): in hindsight extra samples buy nothing on these prompts. A learned policy "
                  "cannot know which prompts those are; calibrated to the budget it spends the spare samples as "
                  "insurance (or less, if its learner cannot find a use for them — then its cost column shows it), "
                  "and its imitation accuracy there measures agreement with an oracle that spends less.", ""]
    return lines


def _spend_section(report: dict[str, Any]) -> list[str]:
    """Realised cost against the budget, per prompt and batch-matched."""
    lines = ["## Spend on budget", "",
             "| budget | learned cost [95% CI] | error | mixes at their share | error | learned (batch) acc "
             "| learned (batch) cost | error |",
             "|---:|---|---:|---:|---:|---:|---:|---:|"]
    excluded = []
    for e in report["budgets"]:
        m, mb, mm = e["methods"]["learned"], e["methods"].get("learned_batch"), e["methods"].get("learned_mix")
        ci = m.get("cost_ci95", [float("nan")] * 2)
        flag = " **CI excludes the budget**" if not ci[0] <= e["budget"] <= ci[1] else ""
        excluded += [e["budget"]] if flag else []
        lines.append(f"| {e['budget']:.4g} | {m['cost']:.4g} [{ci[0]:.4g}, {ci[1]:.4g}]{flag} | {_pct(e['cost_error'], 2)} | "
                     + (f"{mm['cost']:.4g} | {_pct(mm['cost'] / e['budget'] - 1, 2)} | " if mm else "— | — | ")
                     + (f"{_acc(mb['accuracy'])} | {mb['cost']:.4g} | {_pct(e['cost_error_batch'], 2)} |" if mb
                        else "— | — | — |"))
    lines += ["", "`learned` decides each prompt alone through the calibration table, so its realised cost on a "
              "held-out sample moves with which prompts the sample holds (the bootstrap CI over prompts shows "
              "that noise). `learned (batch)` solves the same learner's knob on the held-out prompts themselves "
              "(`Policy.decide(..., match=\"batch\")`, what an offline batch job uses); the gateway holds a "
              "stream of single requests on budget with its online controller instead. *Mixes at their share*: a "
              "fallback's two-plan mix scored at its share, not drawn by each prompt's hash (issue 32).", ""]
    if excluded:
        lines += [f"At {', '.join(f'{b:.4g}' for b in excluded)} the realised cost's 95% CI excludes the budget: the "
                  "policy as served does not spend what it was given there.", ""]
    return lines


def _ceiling_section(report: dict[str, Any]) -> list[str]:
    """The label-noise ceiling on imitation (when the summary has it)."""
    lines: list[str] = []
    if all("imitation_ceiling" in e for e in report["budgets"]):
        lines += ["## How far can imitation go?", "",
                  "Each oracle label comes from one finite set of samples per prompt; redraw those samples "
                  "(bootstrap, `policy.label_noise`) and labels change. No learner that sees only the prompt can "
                  "match the labels more often than by answering each prompt's most likely label: the *ceiling*. "
                  "*Agreement* is how often two draws of the labels agree. The bootstrap treats the samples as "
                  "the population, so both overstate how reproducible the labels really are.", "",
                  "| budget | imitation | ceiling | agreement |", "|---:|---:|---:|---:|"]
        lines += [f"| {e['budget']:.4g} | {e['imitation_accuracy']:.3f} | {e['imitation_ceiling']:.3f} | "
                  f"{e['label_agreement']:.3f} |" for e in report["budgets"]]
        lines.append("")
    return lines


def _both_learners_section(report: dict[str, Any]) -> list[str]:
    """Accuracy, cost and imitation of both learners at each budget."""
    lines = ["## Both learners", "", "| budget | classifier acc | classifier cost | classifier imitation | "
             "utility acc | utility cost | utility imitation |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for e in report["budgets"]:
        row = [f"{e['budget']:.4g}"]
        for name in ("classifier", "utility"):
            x = e["learners"].get(name)
            row += ([_acc(x["accuracy"]), f"{x['cost']:.4g}", f"{x['imitation_accuracy']:.3f}"] if x
                    else ["—", "—", "—"])
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    return lines


def _targets_section(report: dict[str, Any]) -> list[str]:
    """Whether the headline targets are met at the reference budget (when evaluated)."""
    lines: list[str] = []
    t = report.get("targets")
    if t:
        lines += [f"## Targets at budget {t['budget']:g}", "",
                  f"- imitation accuracy ≥ 91%: {t['imitation_ge_91pct']['value']:.3f} — "
                  f"{'met' if t['imitation_ge_91pct']['pass'] else 'not met'}"
                  + (f" (label-noise ceiling on this table: {t['imitation_ge_91pct']['ceiling']:.3f}, see \"How far can imitation go?\")"
                     if t["imitation_ge_91pct"].get("ceiling") is not None else ""),
                  f"- gain over uniform ≥ 5% with CI excluding 0: {_pct(t['gain_ge_5pct_ci_excludes_0']['value'])} "
                  f"[{_pct(t['gain_ge_5pct_ci_excludes_0']['ci95'][0])}, "
                  f"{_pct(t['gain_ge_5pct_ci_excludes_0']['ci95'][1])}] — "
                  f"{'met' if t['gain_ge_5pct_ci_excludes_0']['pass'] else 'not met'}",
                  f"- realised cost within ±2%: per prompt {_pct(t['cost_within_2pct']['value'], 2)} — "
                  f"{'met' if t['cost_within_2pct']['pass'] else 'not met'}; batch-matched "
                  + (f"{_pct(t['batch_cost_within_2pct']['value'], 2)} — "
                     f"{'met' if t['batch_cost_within_2pct']['pass'] else 'not met'}"
                     if "batch_cost_within_2pct" in t else "—"), ""]
    return lines


def _fallback_section(report: dict[str, Any]) -> list[str]:
    """The never-worse chain: what the fitted policy serves where, and what the fallback did in the refits."""
    if not all(e.get("rules") for e in report["budgets"]):
        return []
    fb = report["policy"].get("fallback")
    plans = bool(report.get("plans"))
    lines = ["## Never worse than " + ("the fixed plan and uniform" if plans else "uniform"), ""]
    if fb:
        spans = ", ".join(f"**{rule}** on [{lo:.4g}, {hi:.4g}]" for rule, lo, hi in fb["ranges"])
        nxt = "the next rule of its chain (learned → fixed plan → uniform)" if plans else "uniform"
        lines += [f"The fitted policy serves {spans}: at each budget of its grid a rule serves only where "
                  f"its gain over {nxt}, measured on the training prompts out of fold (paired bootstrap), has a "
                  "one-sided lower confidence bound above the margin; elsewhere the next rule serves.", ""]
    lines += ["| budget | served (learned / no fallback / uniform) | gain as served [95% CI] | learned rule alone "
              "[95% CI] | refits serving the learned rule" + (" / the fixed plan" if plans else "") + " |",
              "|---:|---|---|---|---:|"]
    for e in report["budgets"]:
        m, g, gn = e["methods"], e["gain_vs_uniform"], e.get("gain_no_fallback")
        nf = m.get("learned_no_fallback")
        alone = "—" if gn is None else f"{_pct(gn['relative'])} [{_pct(gn['ci95'][0])}, {_pct(gn['ci95'][1])}]"
        lines.append(f"| {e['budget']:.4g} | {_acc(m['learned']['accuracy'])} / "
                     f"{_acc(nf['accuracy']) if nf else '—'} / {_acc(m['uniform']['accuracy'])} | "
                     f"{_pct(g['relative'])} [{_pct(g['ci95'][0])}, {_pct(g['ci95'][1])}] | {alone} | "
                     f"{100 * e['rules'].get('learned', 0.0):.0f}%"
                     + (f" / {100 * e['rules'].get('fixed_plan', 0.0):.0f}%" if plans else "") + " |")
    lines += ["", "*As served* is the policy with its chain (the `learned` column everywhere in this report); *the "
              "learned rule alone* is the same refits with the fallback switched off. Each refit decides its chain "
              "on its own training part only.", ""]
    return lines


def _same_accuracy_section(report: dict[str, Any]) -> list[str]:
    """"Same accuracy for N× less": cost to reach uniform's accuracy at the largest k, per method."""
    same = report.get("same_accuracy")
    if not same:
        return []
    ref, alt, unit = same["reference"], same["alt_unit"], report["cost_unit"]
    lines = ["## Same accuracy for less", "",
             f"Target: the accuracy of uniform k = {ref['k']}, **{_acc(ref['accuracy'])}**, which costs "
             f"{ref['cost']:.4g} {unit}" + (f" ({ref['cost_alt']:.4g} {alt})" if alt and ref.get("cost_alt") else "")
             + " per request. Per method, the least realised cost at which it reaches that accuracy over this "
             "report's budgets (interpolated between adjacent budgets, which a hashed mix of the two realises; "
             "≤ when already reached at the lowest budget).", "",
             f"| method | {unit} to reach | × less |" + (f" {alt} to reach | × less |" if alt else ""),
             "|---|---:|---:|" + ("---:|---:|" if alt else "")]
    for m, hit in same["methods"].items():
        if hit is None:
            lines.append(f"| {m} | not reached | — |" + (" — | — |" if alt else ""))
            continue
        le = "≤ " if hit["at_lowest"] else ""
        row = f"| {m} | {le}{hit['cost']:.4g} | {hit['times_less']:.2f}× |" if hit["times_less"] else f"| {m} | — | — |"
        if alt:
            row += (f" {le}{hit['cost_alt']:.4g} | {hit['times_less_alt']:.2f}× |" if hit.get("times_less_alt")
                    else " — | — |")
        lines.append(row)
    return lines + [""]


def plot_accuracy(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    budgets = [e["budget"] for e in report["budgets"]]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for m in PLOT_METHODS:
        acc = [e["methods"][m]["accuracy"] for e in report["budgets"]]
        lo = [e["methods"][m]["ci95"][0] for e in report["budgets"]]
        hi = [e["methods"][m]["ci95"][1] for e in report["budgets"]]
        (line,) = ax.plot(budgets, acc, marker="o", ms=3, label=m)
        ax.fill_between(budgets, lo, hi, color=line.get_color(), alpha=0.15, lw=0)
    if min(budgets) > 0:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(f"budget (mean {report['cost_unit']} per request)")
    ax.set_ylabel("accuracy (mean utility)")
    ax.set_title(f"held-out accuracy at matched budgets ({report['n_prompts']} prompts, 95% CI)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_actions(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    entries = report["budgets"]
    ks, group = action_groups(report)
    cols = min(len(entries), 5)
    rows = math.ceil(len(entries) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.8 * cols, 2.4 * rows), squeeze=False)
    x = np.arange(len(ks))
    for ax, e in zip(axes.ravel(), entries, strict=False):
        o = np.bincount(group, weights=np.asarray(e["action_histogram"]["oracle"], dtype=float), minlength=len(ks))
        learned = np.bincount(group, weights=np.asarray(e["action_histogram"]["learned"], dtype=float),
                              minlength=len(ks))
        ax.bar(x - 0.2, o / max(o.sum(), 1), 0.4, label="oracle")
        ax.bar(x + 0.2, learned / max(learned.sum(), 1), 0.4, label="learned")
        ax.set_xticks(x, ks, fontsize=7 if report.get("plans") else None, rotation=60 if report.get("plans") else 0)
        ax.set_title(f"budget {e['budget']:.4g}", fontsize=9)
    for ax in axes.ravel()[len(entries):]:
        ax.axis("off")
    axes[0, 0].legend(fontsize=7)
    fig.supxlabel("plan (rule kind)" if report.get("plans") else "k (samples)")
    fig.supylabel("share of prompts")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_confusion(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    b = reference_budget(report)
    e = next(e for e in report["budgets"] if abs(e["budget"] - b) < 1e-9)
    ks, group = action_groups(report)
    full = np.asarray(e["confusion_learned_vs_oracle"], dtype=float)
    cm = np.zeros((len(ks), len(ks)))
    np.add.at(cm, (group[:, None], group[None, :]), full)
    fig, ax = plt.subplots(figsize=(4.6, 4))
    ax.imshow(cm, cmap="Blues")
    for i in range(cm.shape[0]):
        for j in range(cm.shape[1]):
            ax.text(j, i, f"{int(cm[i, j])}", ha="center", va="center", fontsize=8,
                    color="white" if cm[i, j] > cm.max() / 2 else "black")
    ax.set_xticks(range(len(ks)), ks, rotation=60 if report.get("plans") else 0)
    ax.set_yticks(range(len(ks)), ks)
    what = "plan" if report.get("plans") else "k"
    ax.set_xlabel(f"oracle {what}")
    ax.set_ylabel(f"learned {what}")
    ax.set_title(f"budget {b:.4g}: imitation {e['imitation_accuracy']:.3f}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _finite(obj: Any) -> Any:
    """NaN/inf → None, recursively, so report.json is strict JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def write_report(out_dir: str | Path, report: dict[str, Any], *, inputs: dict[str, str],
                 params: dict[str, Any]) -> Path:
    """Write the report artifact atomically; nothing is left behind if any part fails."""
    report = _finite(report)
    with artifact_writer(out_dir, kind=KIND, schema_version=SCHEMA_VERSION, inputs=inputs, params=params) as d:
        (d / "report.json").write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
        plot_accuracy(report, d / "accuracy.png")
        plot_accuracy_cost(report, d / "accuracy_cost.png")
        plot_actions(report, d / "actions.png")
        plot_confusion(report, d / "confusion.png")
        md = render_markdown(report)
        if report.get("evidence"):  # a policy with evidence plans (isocompute evidence)
            from isocompute.evaluation.evidence_report import evidence_markdown, plot_calibration

            plot_calibration(report["evidence"], d / "calibration.png")
            md += "\n" + evidence_markdown(report["evidence"]) + "\n![calibration](calibration.png)\n"
        (d / "report.md").write_text(md)
    return Path(out_dir)
