"""Cheap features, LightGBM imitation policy, budget calibration, evaluation and regret report.

Modules: ``features`` (prompt-text features, hashed n-grams + SVD), ``learners`` (budget-conditioned
oracle classifier, utility regressor, the pricing rule), ``calibration`` (requested budget → knob),
``policy`` (``Policy``, ``PolicyConfig``, ``Decision``: fit / decide / save / load), ``evaluate``
(held-out CV or holdout against oracle, uniform, heuristic and random), ``report`` (report.json,
report.md, plots), ``synthetic`` (outcome tables whose difficulty follows the text, for tests and
benchmarks). Imports only ``isocompute.solver`` (and ``flops`` through it).
"""
