"""Cheap features, LightGBM imitation policy, budget calibration, evaluation and regret report."""
