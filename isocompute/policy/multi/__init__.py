"""The multi-model policy: its menu, the escalate rule, and fitting it from several tables."""
