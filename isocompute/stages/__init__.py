"""The five stages as library functions, each taking one typed config:

* :func:`isocompute.stages.sample.sample` (:class:`~isocompute.stages.sample.SampleConfig`): a model →
  an outcome table;
* :func:`isocompute.stages.import_.import_samples` (:class:`~isocompute.stages.import_.ImportConfig`):
  sample dumps → an outcome table;
* :func:`isocompute.stages.solve.solve` (:class:`~isocompute.stages.solve.SolveConfig`): a table → the
  oracle's solution at a budget;
* :func:`isocompute.stages.fit.fit` (:class:`~isocompute.stages.fit.FitConfig`): a table → a policy;
* :func:`isocompute.stages.report.report` (:class:`~isocompute.stages.report.ReportConfig`): a policy and
  a table → its held-out report.

Each option is documented once, on its config field (:mod:`isocompute.stages.options`), and the
``isocompute`` command's parsers are generated from the fields. Several models (``--outcomes NAME=TABLE``)
are an option group of ``solve``, ``fit`` and ``report`` (:mod:`isocompute.stages.inputs`); list-valued
options are read by :mod:`isocompute.stages.parsing`. A script runs a stage as::

    from isocompute.stages.solve import SolveConfig, solve
    summary = solve(SolveConfig(outcomes="outcomes.jsonl", budget=4, out="runs/solution"))

or from command-line arguments, ``solve(parse_config(SolveConfig, ["outcomes.jsonl", "--budget", "4", …]))``.

Ignores: printing (the CLI prints the results), serving and post-training. Nothing is imported here, so
``isocompute --help`` stays fast.
"""
