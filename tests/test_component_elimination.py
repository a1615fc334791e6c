"""bench.component_elimination's block-by-block substitution against a dense minimum-norm solve."""

import numpy as np

from bench.component_elimination import (
    Blocks,
    against_reference,
    eliminate,
    history_and_tests,
    variance,
)
from bench.engine_sql_bench import cubes
from proxy.engine.factored import AnovaCoordinates


def test_fronts_give_the_dense_variances_and_estimability() -> None:
    history, precisions, tests = history_and_tests("demo", 600, tests=20)
    space = AnovaCoordinates(cubes()["demo"].shape)
    coordinates = space.of_many(history + tests)
    blocks = Blocks(space)
    rows = [blocks.row(c, v, float(np.sqrt(p))) for (c, v), p in zip(coordinates, precisions)]
    fronts = eliminate(rows, blocks.sizes)
    order = {S: i for i, S in enumerate(sorted(blocks.sizes, key=lambda S: (-len(S), S)))}
    results = [
        (*variance(blocks.row(c, v), fronts, order), 0.0) for c, v in coordinates[len(history) :]
    ]
    estimable = sum(r[0] is not None for r in results)
    assert 0 < estimable < len(results)  # both kinds occur, so the comparison means something
    # the ranks absorbed are the history's rank
    dense = np.zeros((len(history), blocks.size))
    for i, (c, v) in enumerate(coordinates[: len(history)]):
        dense[i, c] = v
    assert sum(s.size for s, _, _ in fronts.values()) == np.linalg.matrix_rank(dense)
    agree, worst = against_reference(coordinates, precisions, results, blocks.size)
    assert agree == len(results)
    assert worst < 1e-10
