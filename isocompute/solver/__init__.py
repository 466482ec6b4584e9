"""Outcome tables, k-sample estimators, cost tables, the Lagrangian oracle, budget search, frontier."""
