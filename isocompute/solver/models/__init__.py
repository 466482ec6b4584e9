"""Several models: actions across models (plans, cascades, ensembles), their tables, costs and estimates."""
