"""FastAPI gateway (OpenAI-compatible)."""
