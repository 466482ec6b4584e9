"""The fixed plan's held-out budget search (isocompute.policy.plans.heldout, issue 32) and the latency
chain's levels at the uniform ladder's own latencies (issue 36): the vectorised hull agrees with the solver,
the search undoes a known overspend, a policy stores and serves it, and — on hard subsets of the real
MATH-500 tables when ../shared/data is present — the budget is kept out of fold and uniform@k at its own
latency is never beaten by what the chain serves there."""

from pathlib import Path

import numpy as np
import pytest

from isocompute.policy.fallback import UNIFORM
from isocompute.policy.latency import latency_levels, quick_ladder
from isocompute.policy.plans.fixed import choose_fixed_plans, fold_assignment
from isocompute.policy.plans.fixed_rule import fixed_plan_scores
from isocompute.policy.plans.heldout import budget_table, heldout_budgets, hull_mix, internal_budget
from isocompute.policy.policy import Policy, PolicyConfig

REAL = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"


def _heavy(n: int, P: int = 12, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """U, C of n prompts × P plans whose costs share a heavy-tailed per-prompt length (log-normal, σ = 1)
    and a per-plan noise: the regime where training means understate held-out cost."""
    rng = np.random.default_rng(seed)
    length = rng.lognormal(0.0, 1.0, n)
    k = np.geomspace(1, 16, P)
    C = length[:, None] * k[None, :] * rng.lognormal(0.0, 0.5, (n, P))
    U = np.clip(0.5 + 0.1 * np.log2(k)[None, :] + rng.normal(0, 0.2, (n, P)), 0, 1)
    return U, C


@pytest.mark.parametrize("seed", range(6))
def test_hull_mix_is_the_solvers_choice(seed):
    U, C = _heavy(30, seed=seed)
    budgets = np.geomspace(C.mean(axis=0).min(), C.mean(axis=0).max() * 1.2, 41)
    lo, hi, p = hull_mix(U.mean(axis=0), C.mean(axis=0), budgets)
    for bi, ch in enumerate(choose_fixed_plans(U, C, budgets)):
        assert ((1 - p[bi]) * C[:, lo[bi]] + p[bi] * C[:, hi[bi]]).mean() == pytest.approx(ch.cost(C).mean())
        assert ((1 - p[bi]) * U[:, lo[bi]] + p[bi] * U[:, hi[bi]]).mean() == pytest.approx(ch.utility(U).mean())


def test_without_noise_the_search_changes_nothing():
    """Identical prompts: every fold's means are the table's, so held-out cost is training cost."""
    U, C = _heavy(1, seed=3)
    U, C = np.repeat(U, 40, axis=0), np.repeat(C, 40, axis=0)
    budgets = np.geomspace(C.mean(axis=0).min() * 1.01, C.mean(axis=0).max() * 0.99, 9)
    assert heldout_budgets(U, C, budgets) == pytest.approx(budgets, rel=2e-2)


def test_the_search_is_monotone_and_its_table_round_trips():
    U, C = _heavy(60, seed=1)
    budgets = np.geomspace(C.mean(axis=0).min() * 1.1, C.mean(axis=0).max() * 0.5, 17)
    g = heldout_budgets(U, C, budgets)
    assert (np.diff(g) >= 0).all()
    table = budget_table(U, C, budgets)
    for b, gi in zip(budgets, g, strict=True):
        assert internal_budget(table, float(b)) == pytest.approx(gi)
    assert internal_budget(None, 3.5) == 3.5


def _cv_spend(U, C, budgets, heldout: bool, seed: int) -> np.ndarray:
    fold = fold_assignment(U.shape[0], 5, seed)
    folds = [(np.flatnonzero(fold != f), np.flatnonzero(fold == f)) for f in range(5)]
    return fixed_plan_scores(U, C, folds, budgets, heldout=heldout, seed=seed, cost=True).mean(axis=1) / budgets


def test_the_search_removes_the_overspend_on_small_heavy_tailed_tables():
    """30 prompts, 60 tables: the plain fixed plan overspends out of fold at every budget; the searched one
    lands within ±5% on the mean over tables."""
    plain, searched = [], []
    for s in range(60):
        U, C = _heavy(30, seed=100 + s)
        budgets = np.array([2.0, 3.0, 4.0]) * C[:, 0].mean()
        plain.append(_cv_spend(U, C, budgets, False, s))
        searched.append(_cv_spend(U, C, budgets, True, s))
    plain_err, searched_err = np.mean(plain, axis=0) - 1, np.mean(searched, axis=0) - 1
    assert (plain_err > 0.05).all(), plain_err
    assert (np.abs(searched_err) < 0.05).all(), searched_err


def test_levels_hold_every_ladder_latency_in_range():
    levels = latency_levels(1.0, 4.0, np.array([1.0, 1.37, 1.81, 2.6, 5.0]))
    for x in (1.0, 1.37, 1.81, 2.6):
        assert x in levels
    assert levels.max() == pytest.approx(4.0) and 5.0 not in levels
    assert (np.diff(levels) > 0).all()


def _synthetic_policy_table():
    from isocompute.policy.plans.arrays import table_arrays
    from isocompute.policy.synthetic import synthetic_records
    from isocompute.solver.outcomes import from_records

    recs = synthetic_records(80, 8, seed=2, noise=0.3)
    rng = np.random.default_rng(2)
    for r in recs:
        base = int(rng.integers(50, 2000))
        for s in r["samples"]:
            s["completion_tokens"] = int(base * rng.lognormal(0, 0.6))
    table = from_records(recs)
    kw = dict(actions=(1, 2, 4, 8), plans=("none@1", "none@2", "none@4", "none@8", "lead:m=2@1x8", "lead:m=2@4s,4s"),
              cost_unit="tokens", n_rounds=4, calibration_folds=2, n_components=4, seed=0)
    arr = table_arrays(table, PolicyConfig(**kw, budget_range=(1.0, 2.0)))
    lo, hi = arr.cost.mean(axis=0).min() * 1.05, arr.cost.mean(axis=0).max() * 0.9
    return table, arr, PolicyConfig(**kw, budget_range=(lo, hi))


def test_config_and_artifacts_say_which_search_served(tmp_path):
    import dataclasses

    table, _, cfg = _synthetic_policy_table()
    lo, hi = cfg.budget_range
    pol = Policy(cfg).fit(table)
    assert pol.config.fixed_budget == "heldout" and pol.fixed_budgets_ is not None
    old = Policy(dataclasses.replace(cfg, fixed_budget="train")).fit(table)
    assert old.fixed_budgets_ is None
    b = float(np.sqrt(lo * hi))
    assert old.fixed_plan_at(b).train_cost == pytest.approx(b, rel=1e-6)  # the budget itself, on training means
    pol.save(tmp_path / "p")
    back = Policy.load(tmp_path / "p")
    assert back.fixed_budgets_ == pol.fixed_budgets_
    assert back.fixed_plan_at(b) == pol.fixed_plan_at(b)
    with pytest.raises(Exception, match="fixed_budget"):
        dataclasses.replace(cfg, fixed_budget="nope")
    d = pol.config.to_dict()
    d.pop("fixed_budget")
    assert PolicyConfig.from_dict(d).fixed_budget == "train"  # an artifact saved before the search


# ------------------------------------------------------------------------------------ real tables (skip if absent)
MODELS = ("gpt-oss-20b", "Qwen3-14B", "Phi-4-reasoning")
HEAD = 100


@pytest.fixture(scope="module")
def math500(tmp_path_factory):
    dumps = {m: REAL / "real" / "boinf" / f"analysis_math500_{m}.jsonl" for m in MODELS}
    if not (REAL / "math500_test.jsonl").exists() or not all(p.exists() for p in dumps.values()):
        pytest.skip("the MATH-500 dumps are absent (real data lives in <repo>/../shared/data)")
    from isocompute.policy.plans.arrays import plan_arrays
    from isocompute.policy.plans.menu import resolve_plans
    from isocompute.solver.outcomes import read_outcomes
    from isocompute.stages.import_ import ImportConfig, import_samples

    def head(src: Path, dst: Path) -> Path:  # the first HEAD problems: grading all 500 takes a minute per model
        dst.write_text("".join(src.read_text(encoding="utf-8").splitlines(keepends=True)[:HEAD]), encoding="utf-8")
        return dst

    out = {}
    plans = resolve_plans("default", (1, 2, 4, 8, 16), parallel=True)
    tmp = tmp_path_factory.mktemp("math500")
    problems = head(REAL / "math500_test.jsonl", tmp / "problems.jsonl")
    for m, path in dumps.items():
        res = import_samples(ImportConfig(format="boinf", sources=[head(path, tmp / path.name)], progress=False,
                                          out=tmp / f"{m}.jsonl", problems=problems))
        table = read_outcomes(res.out)
        out[m] = (table, plan_arrays(table, plans, cost_unit="tokens"))
    return out


def _hard(arrays, n: int, pool: int, seed: int) -> np.ndarray:
    lengths = arrays.tokens[:, 0]  # none@1: each prompt's mean sample length
    return np.sort(np.random.default_rng(seed).choice(np.argsort(-lengths)[:pool], n, replace=False))


def _served_spend(U: np.ndarray, C: np.ndarray, bx: np.ndarray, seed: int, search: bool) -> np.ndarray:
    """Realised tokens / budget per x-budget, 5-fold, as the report serves it: each refit at the budget in its
    own 1x (none@1's mean tokens), at its held-out-searched internal budget when ``search``."""
    unit = C[:, 0]
    fold = fold_assignment(U.shape[0], 5, seed)
    spent = np.zeros(bx.size)
    for f in range(5):
        tr, te = fold != f, fold == f
        b = bx * unit[tr].mean()
        g = heldout_budgets(U[tr], C[tr], b, seed=seed, unit=unit[tr]) if search else b
        lo, hi, p = hull_mix(U[tr].mean(axis=0), C[tr].mean(axis=0), g)
        spent += ((1 - p) * C[te][:, lo] + p * C[te][:, hi]).sum(axis=0)
    return spent / U.shape[0] / (bx * unit.mean())


@pytest.mark.data
@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
def test_on_hard_math500_subsets_the_overspend_shrinks(math500, model):
    """30 of the 60 longest of the first 100 problems, 40 subsets, 5-fold: the fixed plan chosen at the
    budget overspends at 2x and 3x (the bias of issue 32, +20% to +27% here); served as the report now serves
    it, the overspend at 2x falls by at least 5 points (to +2% to +14%: not all of it on these subsets,
    docs/policy.md)."""
    _, arr = math500[model]
    bx = np.array([2.0, 3.0, 4.0])
    plain, searched = [], []
    for s in range(40):
        rows = _hard(arr, 30, 60, s)
        U, C = arr.utility[rows], arr.cost[rows]
        plain.append(_cv_spend(U, C, bx * C[:, 0].mean(), False, s))  # before: the budget on training means
        searched.append(_served_spend(U, C, bx, s, search=True))
    plain_err, searched_err = np.mean(plain, axis=0) - 1, np.mean(searched, axis=0) - 1
    assert (plain_err[:2] > 0.05).all(), plain_err
    assert searched_err[0] < plain_err[0] - 0.05, (plain_err, searched_err)


@pytest.mark.data
@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
def test_uniform_at_its_own_latency_is_never_beaten_by_the_served_rule(math500, model):
    """A policy fitted with latency budgets on the 50 hardest of the first 100 problems, asked for uniform@k's
    own latency and tokens (k = 4, 8): the chain there holds none@k in its uniform ladder, and serves uniform
    (none@k everywhere) or a rule whose out-of-fold test beat it."""
    table, arr = math500[model]
    rows = _hard(arr, 50, 50, 0)
    sub = table.subset(rows)
    per = float(np.mean(sub.completion_tokens[sub.mask]))
    names = [p.name for p in arr.plans]
    lat = arr.total_latency(0.0)[rows] / per
    C = arr.cost[rows]
    cfg = PolicyConfig(plans=tuple(names), cost_unit="tokens", n_rounds=4, n_components=4, seed=0,
                       budget_range=(float(C.mean(axis=0).min()) * 1.001, 16 * per * 0.999),
                       latency_range=(float(lat.mean(axis=0).min()) * 1.001, 4.0))
    pol = Policy(cfg).fit_arrays([sub.prompts[i] for i in range(len(sub))], arr.utility[rows], C,
                                 samples=arr.samples[rows], waves=arr.waves[rows], latency=lat)
    t = pol.latency_
    for k in (4, 8):
        j = names.index(f"none@{k}")
        L, B = float(t.plan_latency[j]), float(pol.sample_action_costs[j])
        m = t.level(L)
        assert j in quick_ladder(pol.ladder, t.plan_latency, float(t.levels[m]))
        choice = t.chains[m].at(B)
        if choice.rule == UNIFORM:
            d = pol.decide([sub.prompts[i] for i in range(len(sub))], B, latency_budget=L)
            assert (d.action_index == j).mean() > 0.95
        else:  # the rule that serves was admitted by its out-of-fold test against the one after it
            assert any(x.rule == choice.rule and x.accepted for x in choice.tests), choice.why


# ------------------------------------------------------------------ the chain's spend check and ladder points
def test_the_spend_check_demotes_a_rule_that_overspends_out_of_fold():
    """A rule +10% better than uniform is kept while its out-of-fold cost is within 5% of the budget, and
    demoted (uniform serves) once it is 8% over on every prompt (significantly); the test records its spend."""
    from isocompute.policy.fallback import RuleTest, choose_rules

    rng = np.random.default_rng(0)
    n, budgets = 200, np.array([2.0, 4.0])
    base = rng.uniform(0.3, 0.7, (2, n))
    scores = {"fixed_plan": base + 0.06, UNIFORM: base}
    for over, kept in ((1.02, True), (1.08, False)):
        chain = choose_rules(scores, budgets, costs={"fixed_plan": np.outer(budgets * over, np.ones(n))})
        for c in chain.choices:
            assert c.rule == ("fixed_plan" if kept else UNIFORM)
            (t,) = c.tests
            assert t.spend == pytest.approx(over) and t.accepted == kept and t.gain > 0.05
            assert RuleTest.from_dict(t.to_dict()) == t
    noisy = np.outer(budgets, rng.lognormal(0.0, 1.5, n))  # heavy-tailed: +8% on the mean is not significant
    noisy *= 1.08 * budgets[:, None] / noisy.mean(axis=1, keepdims=True)
    assert all(c.rule == "fixed_plan" for c in choose_rules(scores, budgets, costs={"fixed_plan": noisy}).choices)
    plain = choose_rules(scores, budgets, costs={"fixed_plan": np.outer(budgets * 1.08, np.ones(n))},
                         spend_tolerance=None)
    assert all(c.rule == "fixed_plan" and c.tests[0].spend is None for c in plain.choices)


def test_the_report_flags_a_budget_whose_realised_cost_ci_excludes_it():
    from isocompute.evaluation.report import _spend_section

    def entry(budget, cost, ci):
        return {"budget": budget, "cost_error": cost / budget - 1,
                "methods": {"learned": {"cost": cost, "cost_ci95": ci}}}

    lines = "\n".join(_spend_section({"budgets": [entry(2.0, 2.05, [1.9, 2.2]), entry(4.0, 4.6, [4.2, 5.0])]}))
    assert lines.count("**CI excludes the budget**") == 1 and "| 4 | 4.6 [4.2, 5]" in lines
    assert "At 4 the realised cost's 95% CI excludes the budget" in lines


def test_the_fixed_mixture_is_searched_on_held_out_cost():
    """Equal costs on every prompt: held-out cost is training cost, the search returns the budget; heavy
    per-prompt costs: the searched mixture's nested held-out tokens land nearer the budget than the LP's."""
    from isocompute.policy.evidence.chain import _inner_folds, _mix_or_cheapest, heldout_mix_budget

    n = 60
    FT = np.tile([1.0, 2.0, 4.0, 8.0], (n, 1))
    FU = np.tile([0.5, 0.6, 0.66, 0.7], (n, 1))
    assert heldout_mix_budget((FU, FT, FT), 3.0, None) == pytest.approx(3.0, rel=1e-6)
    errs = {"lp": [], "searched": []}
    for s in range(8):
        U, C = _heavy(n, P=8, seed=200 + s)
        b = 3.0 * C[:, 0].mean()
        fold = _inner_folds(n, s + 1)  # an outer split the search never saw
        for name, g in (("lp", b), ("searched", None)):
            spent = 0.0
            for f in range(5):
                tr, te = fold != f, fold == f
                gf = g if g is not None else heldout_mix_budget((U[tr], C[tr], C[tr]), b, None, seed=s)
                p, w = _mix_or_cheapest(U[tr], C[tr], C[tr], gf, None)
                spent += (C[te][:, p] @ w).sum()
            errs[name].append(spent / n / b - 1)
    lp, searched = np.mean(errs["lp"]), np.mean(errs["searched"])
    assert lp > 0.05 and abs(searched) < lp - 0.03, (lp, searched)  # measured: lp, searched printed on failure


def _ladder_cv(table, arr, rows: np.ndarray, ks=(4, 8), folds=range(5)) -> list[tuple[int, float, float, float, float, str]]:
    """5-fold CV of a latency policy on ``rows`` (the utility learner alone; ``folds``: which to hold out): per fold and k, (k, served accuracy, uniform@k's, served
    tokens, uniform@k's) on the held-out prompts at uniform@k's own latency and tokens on the training part,
    and the rule that served."""
    names = [p.name for p in arr.plans]
    per = float(arr.tokens[rows, names.index("none@1")].mean())
    lat_all = arr.total_latency(0.0)[rows] / per
    U, C, T = arr.utility[rows], arr.cost[rows], arr.tokens[rows]
    prompts = [table.prompts[i] for i in arr.kept[rows]]
    fold = fold_assignment(rows.size, 5, 0)
    out = []
    for f in folds:
        tr, te = np.flatnonzero(fold != f), np.flatnonzero(fold == f)
        lat = lat_all[tr]
        cfg = PolicyConfig(plans=tuple(names), cost_unit="tokens", n_rounds=4, n_components=4, seed=f, learner="utility",
                           budget_range=(float(C[tr].mean(axis=0).min()) * 1.001,
                                         16 * float(T[tr, names.index("none@1")].mean()) * 0.999),
                           latency_range=(float(lat.mean(axis=0).min()) * 1.001, 4.0))
        pol = Policy(cfg).fit_arrays([prompts[i] for i in tr], U[tr], C[tr], samples=arr.samples[rows][tr],
                                     waves=arr.waves[rows][tr], latency=lat)
        for k in ks:
            j = names.index(f"none@{k}")
            L, B = float(pol.latency_.plan_latency[j]), float(pol.sample_action_costs[j])
            d = pol.decide([prompts[i] for i in te], B, latency_budget=L)
            a = d.action_index
            for t in d.rule_evidence["tests"]:  # the kept rule spends within tolerance out of fold
                assert not t["accepted"] or t["spend"] is None or t["spend"] <= 1.05, t
            out.append((k, float(U[te, a].mean()), float(U[te, j].mean()), float(T[te, a].mean()),
                        float(T[te, j].mean()), d.rule))
    return out


@pytest.mark.data
@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
def test_at_uniforms_own_latency_and_tokens_the_chain_is_not_worse_held_out(math500, model):
    """40 of the 60 longest of the first 100 problems, one fold of five held out (one fit, the utility learner: a
    few seconds per model): a policy fitted with latency budgets, asked for uniform@k's own latency and tokens
    (k = 4, 8; the refit's own), scores at least uniform@k's accuracy (within the report's 0.2 pt) on the
    held-out prompts, spending no more than 5% over uniform@k's tokens there, and every rule it keeps spends
    within 5% of the budget out of fold."""
    from isocompute.evaluation.reach import TOLERANCE

    table, arr = math500[model]
    rows = _hard(arr, 40, 60, 3)  # a subset where the chain before this test served gpt-oss-20b +18% tokens
    res = _ladder_cv(table, arr, rows, folds=(0,))
    for k in (4, 8):
        acc, ref, tok, ref_tok = (np.mean([r[i] for r in res if r[0] == k]) for i in (1, 2, 3, 4))
        assert acc >= ref - TOLERANCE, (k, acc, ref, [r[5] for r in res if r[0] == k])
        assert tok <= ref_tok * 1.05, (k, tok, ref_tok)


MOT = {"gsm8k": "llama2_13b_gsm8k_pot1.json", "date": "llama2_13b_date_cot1.json"}


@pytest.fixture(scope="module")
def mot_tokens(tmp_path_factory):
    """GSM8K and Date (Llama-2-13B, MoT dumps) with token counts from the embedded tiny model's tokenizer: a
    stand-in for Llama-2's (not available offline), right in proportion to the answers' lengths."""
    dumps = {t: REAL / "real" / "mot" / f for t, f in MOT.items()}
    if not all(p.exists() for p in dumps.values()):
        pytest.skip("the MoT dumps are absent (real data lives in <repo>/../shared/data)")
    from isocompute.policy.plans.arrays import plan_arrays
    from isocompute.policy.plans.menu import resolve_plans
    from isocompute.solver.outcomes import read_outcomes
    from isocompute.stages.import_ import ImportConfig, import_samples
    from isocompute.training.embedded import TINY_SFT

    plans = resolve_plans("default", (1, 2, 4, 8, 16), parallel=True)
    tmp = tmp_path_factory.mktemp("mot")
    out = {}
    for task, path in dumps.items():
        res = import_samples(ImportConfig(format="mot", sources=[path], task=task, tokenizer=TINY_SFT, progress=False,
                                          out=tmp / f"{task}.jsonl"))
        table = read_outcomes(res.out)
        out[task] = (table, plan_arrays(table, plans, cost_unit="tokens"))
    return out


@pytest.mark.data
@pytest.mark.slow
@pytest.mark.parametrize("task", MOT)
def test_on_gsm8k_and_date_at_uniforms_own_latency_and_tokens_the_chain_is_not_worse_held_out(mot_tokens, task):
    """The MATH-500 test above on the other two real tables (issue 36: every real table), 40 of their 60
    longest-answered questions: at uniform@k's own latency and tokens the chain serves at least uniform@k's
    accuracy (within the report's 0.2 pt) on the held-out fold, spending no more than 5% over its tokens."""
    from isocompute.evaluation.reach import TOLERANCE

    table, arr = mot_tokens[task]
    res = _ladder_cv(table, arr, _hard(arr, 40, 60, 3), folds=(0,))
    for k in (4, 8):
        acc, ref, tok, ref_tok = (np.mean([r[i] for r in res if r[0] == k]) for i in (1, 2, 3, 4))
        assert acc >= ref - TOLERANCE, (k, acc, ref, [r[5] for r in res if r[0] == k])
        assert tok <= ref_tok * 1.05, (k, tok, ref_tok)


def test_a_fallbacks_mix_is_what_its_hashed_actions_realise():
    """Policy.fallback_mix (lo, hi, q) is the mix fallback_actions draws prompt by prompt: on evenly spread
    hash uniforms the share of ``hi`` is q to one prompt, and no other plan is served."""
    from isocompute.policy.fallback import FIXED_PLAN

    table, _, cfg = _synthetic_policy_table()
    pol = Policy(cfg).fit(table)
    u = (np.arange(400) + 0.5) / 400
    lo_b, hi_b = cfg.budget_range
    for rule in (UNIFORM, FIXED_PLAN):
        for b in np.geomspace(lo_b, hi_b, 7):
            lo, hi, q = pol.fallback_mix(rule, float(b))
            a = pol.fallback_actions(rule, u, float(b))
            assert set(np.unique(a)) <= {lo, hi} and 0.0 <= q <= 1.0
            share = (a == hi).mean() if hi != lo else q
            assert abs(share - q) <= 1 / 400 + 1e-12, (rule, b, share, q)


def test_the_report_scores_a_fallbacks_mix_at_its_share():
    """The report's ``learned_mix`` (isocompute.evaluation.evaluate) is ``learned`` where the learned rule
    serves, and where a fallback serves, each held-out prompt's cost and utility under the fallback's mix at
    its share: (1 − q)·C[lo] + q·C[hi], the expectation of what the hashed ``learned`` draws."""
    from isocompute.evaluation.evaluate import METHODS, _score

    table, arr, cfg = _synthetic_policy_table()
    tr, te = np.arange(60), np.arange(60, arr.utility.shape[0])
    prompts = [table.prompts[i] for i in arr.kept]
    pol = Policy(cfg).fit_arrays([prompts[i] for i in tr], arr.utility[tr], arr.cost[tr], samples=arr.samples[tr],
                                 waves=arr.waves[tr])
    budgets = np.geomspace(*cfg.budget_range, 9)
    sc = _score(pol, [prompts[i] for i in te], arr.utility[te], arr.cost[te], budgets, pol.train_lengths_,
                pol.default_learner_)
    li, mi = METHODS.index("learned"), METHODS.index("learned_mix")
    U, C = arr.utility[te], arr.cost[te]
    fallback = 0
    for bi, (b, rule) in enumerate(zip(budgets, sc["rules"], strict=True)):
        if rule == "learned":
            np.testing.assert_array_equal(sc["cost"][li, bi], sc["cost"][mi, bi])
            continue
        fallback += 1
        lo, hi, q = pol.fallback_mix(rule, pol.check_budget(float(b)))
        np.testing.assert_allclose(sc["cost"][mi, bi], (1 - q) * C[:, lo] + q * C[:, hi])
        np.testing.assert_allclose(sc["utility"][mi, bi], (1 - q) * U[:, lo] + q * U[:, hi])
        assert set(np.unique(sc["learned_actions"][bi])) <= {lo, hi}  # the hashed draw of the same mix
    assert fallback > 0  # a fallback served somewhere, so the test saw a mix
