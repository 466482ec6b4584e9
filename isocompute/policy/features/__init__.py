"""Prompt features: hand-counted text statistics, hashed n-grams, their fast paths, the optional embedding."""
