"""isocompute — inference-time compute allocation for reasoning LLMs (Solve-then-Learn).

Rooms (see DESIGN.md): tasks → engines → solver → policy → app; flops is shared; cli uses everything.
Nothing runs at import.
"""

__version__ = "0.1.0"
