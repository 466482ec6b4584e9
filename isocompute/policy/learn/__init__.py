"""The LightGBM learners of a policy, cross-fitted, with their budget calibration and label shrinkage."""
