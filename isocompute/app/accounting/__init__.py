"""What a request may spend and what it spent: pricing, API keys, online budget control, ledger, metrics, traces."""
