"""Symmetric and triangular products that read one triangle, against numpy's full products."""

from __future__ import annotations

import numpy as np
import pytest

from proxy.engine import blas
from proxy.engine.blas import (
    add_gram,
    lower_product,
    rank_one_update,
    symmetric_product,
)


def _in_room(block: np.ndarray, room: int) -> np.ndarray:
    """``block`` as the span solver holds its matrices: the leading block of a larger buffer."""
    n = block.shape[0]
    buffer = np.zeros((n + room, n + room))
    buffer[:n, :n] = block
    return buffer[:n, :n]


@pytest.mark.parametrize("n", [0, 1, 2, 7, 130])
@pytest.mark.parametrize("columns", [None, 1, blas._VECTORS, blas._VECTORS + 1, 20])
def test_products_agree_with_numpy(n: int, columns: int | None) -> None:
    rng = np.random.default_rng(n + (columns or 0))
    square = rng.standard_normal((n, n))
    symmetric = _in_room(np.tril(square) + np.tril(square, -1).T, 5)
    lower = _in_room(np.tril(square), 3)
    x = rng.standard_normal(n if columns is None else (n, columns))
    tolerance = 1e-12 * max(1.0, float(np.abs(square).sum()))
    np.testing.assert_allclose(symmetric_product(symmetric, x), symmetric @ x, atol=tolerance)
    np.testing.assert_allclose(
        symmetric_product(symmetric, x, whole=True), symmetric @ x, atol=tolerance
    )
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
    many = rng.standard_normal((n, blas._VECTORS + 5))  # one dtrmm or dsymm, not per column
    np.testing.assert_allclose(symmetric_product(poisoned, many), symmetric @ many, rtol=1e-12)
    np.testing.assert_allclose(lower_product(poisoned, many), square @ many, rtol=1e-12)
    np.testing.assert_allclose(
        lower_product(poisoned, many, transpose=True), square.T @ many, rtol=1e-12
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


def test_updates_in_place_write_through_views_of_a_larger_buffer() -> None:
    """A rank-one term and a product added to a block of a buffer: that block changes as
    numpy's outer and matrix products say, and nothing around it."""
    rng = np.random.default_rng(11)
    buffer = rng.standard_normal((50, 70))
    expected = buffer.copy()
    view = buffer[3:40, 5:60]
    x, y = rng.standard_normal(37), rng.standard_normal(55)
    rank_one_update(view, -0.5, x, y)
    expected[3:40, 5:60] += -0.5 * np.outer(x, y)
    np.testing.assert_allclose(buffer, expected, atol=1e-13)
    rank_one_update(buffer[:, 70:], 1.0, np.ones(50), np.ones(0))  # no columns: nothing
    rank_one_update(np.zeros((0, 3))[:, 1:], 1.0, np.ones(0), np.ones(2))  # no rows
    np.testing.assert_allclose(buffer, expected, atol=1e-13)
    with pytest.raises(ValueError, match="match"):
        rank_one_update(view, 1.0, y, x)
    with pytest.raises(ValueError, match="contiguous rows"):
        rank_one_update(buffer[:, ::2], 1.0, np.ones(50), np.ones(35))


def test_a_gram_term_added_in_blocks_fills_the_lower_triangle_only() -> None:
    rng = np.random.default_rng(13)
    buffer = np.full((30, 40), 7.0)
    block = buffer[2:27, 4:29]
    a = rng.standard_normal((25, 60))
    for start in range(0, 60, 16):
        add_gram(block, a[:, start : start + 16])
    expected = 7.0 + a @ a.T
    lower = np.tril_indices(25)
    np.testing.assert_allclose(block[lower], expected[lower], rtol=1e-12)
    assert np.all(block[np.triu_indices(25, 1)] == 7.0)  # above the diagonal: untouched
    assert np.all(buffer[:2] == 7.0) and np.all(buffer[:, 29:] == 7.0)
