"""Held-out evaluation: cross-validated scores, baselines at matched realised cost, summaries, report artifacts."""
