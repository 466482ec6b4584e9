"""Checkpoints the engines serve on CPU machines, built on this machine: the optional real small model
(:mod:`isocompute.engines.checkpoints.real_model`, ``make real-model``). The tiny random model of the tests
and the demo is :mod:`isocompute.training.tiny`."""
