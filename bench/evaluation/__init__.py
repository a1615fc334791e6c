"""Evaluation of dpproxy against the papers' baselines and methods (issue 6).

Run ``uv run python -m bench.evaluation`` (``--quick`` for a smoke run); docs/benchmarks.md,
section "Evaluation", describes the workloads, the six systems and the results.

Modules, one concern each:

* :mod:`bench.evaluation.workload`: the papers' multinomial query generator, DPBench data,
  the hierarchical tree history;
* :mod:`bench.evaluation.adult`: range and GROUP BY SQL workloads on the Adult cube;
* :mod:`bench.evaluation.ledger`: per-cell privacy cost (the papers' Thm 3.8), in floats;
* :mod:`bench.evaluation.linear`: BLUE (GLS) and OLS weights over a dense history;
* :mod:`bench.evaluation.greedy`: the first paper's greedy linear representations and
  Bayesian posterior (its Alg. 2-6);
* :mod:`bench.evaluation.systems`: the six systems behind one interface;
* :mod:`bench.evaluation.run`: settings, the runner and the metrics (R_a, R_i, E, alpha_bar);
* :mod:`bench.evaluation.report`: tables and plots;
* :mod:`bench.evaluation.wire`: the same Adult stream through a real ``dpproxy serve``.
"""
