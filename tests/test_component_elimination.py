"""bench.component_elimination's measurements on a small history: both solvers agree."""

import numpy as np

from bench.component_elimination import (
    agreement,
    dense_reference,
    history_and_tests,
    loaded,
    measured,
)
from bench.engine_sql_bench import cubes
from proxy.engine.estimator import ESTIMABLE_RESIDUAL
from proxy.engine.factored import AnovaCoordinates
from proxy.engine.fronts import BlockFronts
from proxy.engine.span import SpanSolver


def test_the_fronts_measure_the_span_solvers_and_the_dense_values() -> None:
    history, precisions, tests = history_and_tests("demo", 400, tests=12)
    space = AnovaCoordinates(cubes()["demo"].shape)
    coordinates = space.of_many(history + tests)
    vectors, values = coordinates[: len(history)], coordinates[len(history) :]
    fronts = BlockFronts(space, residual=ESTIMABLE_RESIDUAL)
    span = SpanSolver(space.size, residual=ESTIMABLE_RESIDUAL)
    assert loaded(fronts, vectors, precisions) >= 0.0 <= loaded(span, vectors, precisions)
    assert fronts.rank == span.rank
    ours = measured(fronts, values, values[:5], precisions)
    theirs = measured(span, values, values[:5], precisions)
    assert ours.single.size == len(values) and np.all(ours.repeat >= 0.0)
    for found, expected in (
        (ours.found, theirs.found),
        (ours.batch_found, theirs.batch_found),
        (ours.found, dense_reference(vectors, precisions, values, space.size)),
    ):
        alike, worst = agreement(found, expected, precisions)
        assert alike == len(found)
        assert worst < 1e-9
    assert 0 < sum(f is not None for f in ours.found) < len(values)
