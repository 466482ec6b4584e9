"""Answers: extraction from completions, canonical math forms, equivalence classes and their alignment across models."""
