"""ANOVA coordinates of a batch (a GROUP BY's vectors, a restart's history) decomposed together."""

from __future__ import annotations

import numpy as np

from proxy.engine.factored import AnovaCoordinates
from sqlmap.vector import LinearQuery

SHAPE = (2, 3, 4, 5)
MEASURES = ((0, 10),)


def _random_queries(rng: np.random.Generator, count: int) -> list[LinearQuery]:
    """Vectors over random axes: counts, measures' sums, mixtures, zeros and repeats."""
    queries = []
    for _ in range(count):
        axes = sorted(rng.choice(len(SHAPE), size=int(rng.integers(0, 4)), replace=False))
        sizes = [SHAPE[d] if d in axes else 1 for d in range(len(SHAPE))]
        kinds = int(rng.integers(1, 3))
        tensor = rng.integers(-2, 3, size=(kinds, *sizes)).astype(np.float64)
        if rng.random() < 0.2:
            tensor = np.where(rng.random(tensor.shape) < 0.5, 0.0, tensor * 0.5)
        if kinds == 1 and rng.random() < 0.5:  # a count alone: the measure's kind is zero
            tensor = np.concatenate([tensor, np.zeros_like(tensor)])
        queries.append(LinearQuery.from_tensor(SHAPE, tensor, measures=MEASURES))
        if rng.random() < 0.1:
            queries.append(queries[-1])
    return queries


def test_a_batch_has_the_coordinates_and_numbering_of_one_vector_at_a_time() -> None:
    rng = np.random.default_rng(5)
    for _ in range(20):
        queries = _random_queries(rng, int(rng.integers(1, 40)))
        one_by_one, together = AnovaCoordinates(SHAPE), AnovaCoordinates(SHAPE)
        warm = _random_queries(rng, 3)  # blocks already numbered before the batch
        for space in (one_by_one, together):
            for query in warm:
                space.of(query)
        expected = [one_by_one.of(query) for query in queries]
        found = together.of_many(queries)
        assert together.size == one_by_one.size
        for (cells, values), (cells_found, values_found) in zip(expected, found):
            assert np.array_equal(cells, cells_found)
            assert np.array_equal(values, values_found)  # bitwise: the same arithmetic


def test_batch_coordinates_keep_inner_products_over_cells() -> None:
    rng = np.random.default_rng(8)
    queries = _random_queries(rng, 30)
    space = AnovaCoordinates(SHAPE)
    coordinates = space.of_many(queries)
    dense = [q.to_dense() for q in queries]
    for i in range(len(queries)):
        for j in range(i, len(queries)):
            a, b = np.zeros(space.size), np.zeros(space.size)
            a[coordinates[i][0]], b[coordinates[j][0]] = coordinates[i][1], coordinates[j][1]
            assert np.isclose(a @ b, dense[i] @ dense[j], rtol=1e-12, atol=1e-9)
