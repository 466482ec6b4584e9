"""Weighted votes: a sample's vote weighted by its evidence (length, confidence), fitted per model and kept
only where cross-validation supports it, plus DeepConf's offline confidence filter as a baseline.

``weights`` (the weight function and the vote rule, also used by the gateway), ``evidence`` (a table's
per-sample evidence and the shared k-subsets), ``credits`` (vectorised scoring of votes on the subsets),
``study`` (cross-fitted comparison of methods), ``fit`` (``fit_vote``, the kept choice and ``vote.json``).
Import the modules themselves: the gateway loads ``weights`` alone, without the fitting code.
"""
