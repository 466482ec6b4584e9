"""Problem sets, answer extraction and grading. Imports nothing else from isocompute."""
