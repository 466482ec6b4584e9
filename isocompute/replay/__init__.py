"""``isocompute replay``: a vLLM-compatible upstream that answers from outcome tables — a SIMULATOR.

Real models' recorded answers and lengths, streamed at the pace of a stated timing model (its seconds are
the model's, not a measurement), with faults on request. What it is for and how to read its figures:
docs/replay.md. Modules: :mod:`~isocompute.replay.table` (rows and sample texts),
:mod:`~isocompute.replay.timing` (the timing model), :mod:`~isocompute.replay.replies` (draws and vLLM's
chunk shapes), :mod:`~isocompute.replay.faults`, :mod:`~isocompute.replay.server` (the aiohttp app),
:mod:`~isocompute.replay.process` (one in a child process, for tests and benches).
"""
