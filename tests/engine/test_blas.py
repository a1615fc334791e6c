"""Symmetric and triangular products that read one triangle, against numpy's full products."""

from __future__ import annotations

import numpy as np
import pytest

from proxy.engine import blas
from proxy.engine.blas import lower_product, symmetric_product


def _in_room(block: np.ndarray, room: int) -> np.ndarray:
    """``block`` as the span solver holds its matrices: the leading block of a larger buffer."""
    n = block.shape[0]
    buffer = np.zeros((n + room, n + room))
    buffer[:n, :n] = block
    return buffer[:n, :n]


@pytest.mark.parametrize("n", [0, 1, 2, 7, 130])
@pytest.mark.parametrize("columns", [None, 1, 3, blas._VECTORS + 2])
def test_products_agree_with_numpy(n: int, columns: int | None) -> None:
    rng = np.random.default_rng(n + (columns or 0))
    square = rng.standard_normal((n, n))
    symmetric = _in_room(np.tril(square) + np.tril(square, -1).T, 5)
    lower = _in_room(np.tril(square), 3)
    x = rng.standard_normal(n if columns is None else (n, columns))
    tolerance = 1e-12 * max(1.0, float(np.abs(square).sum()))
    np.testing.assert_allclose(symmetric_product(symmetric, x), symmetric @ x, atol=tolerance)
    np.testing.assert_allclose(lower_product(lower, x), lower @ x, atol=tolerance)
    np.testing.assert_allclose(lower_product(lower, x, transpose=True), lower.T @ x, atol=tolerance)


def test_one_vector_reads_only_the_lower_triangle() -> None:
    """Entries above the diagonal are never read: NaN there changes nothing."""
    rng = np.random.default_rng(3)
    n = 40
    square = np.tril(rng.standard_normal((n, n)))
    symmetric = square + np.tril(square, -1).T
    poisoned = _in_room(square, 4)
    poisoned[np.triu_indices(n, 1)] = np.nan
    x = rng.standard_normal(n)
    columns = rng.standard_normal((n, 2))
    np.testing.assert_allclose(symmetric_product(poisoned, x), symmetric @ x, rtol=1e-12)
    np.testing.assert_allclose(
        symmetric_product(poisoned, columns), symmetric @ columns, rtol=1e-12
    )
    np.testing.assert_allclose(lower_product(poisoned, x), square @ x, rtol=1e-12)
    np.testing.assert_allclose(
        lower_product(poisoned, columns, transpose=True), square.T @ columns, rtol=1e-12
    )


def test_inputs_are_left_unchanged_and_views_rejected_when_rows_are_strided() -> None:
    rng = np.random.default_rng(5)
    lower = np.tril(rng.standard_normal((6, 6)))
    x = rng.standard_normal(6)
    kept = x.copy()
    lower_product(lower, x)
    symmetric_product(lower + lower.T, x)
    np.testing.assert_array_equal(x, kept)
    with pytest.raises(ValueError, match="contiguous rows"):
        symmetric_product(np.zeros((6, 12))[:, ::2], x)
    with pytest.raises(ValueError, match="square"):
        lower_product(np.zeros((6, 5)), x)
