"""The span solver against dense linear algebra: basis, distances and minimum-norm weights."""

from __future__ import annotations

import numpy as np
import pytest

from proxy.engine.span import SpanSolver


def _dense_min_norm(vectors: np.ndarray, weights2: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``u_j / c_j`` for the minimum-norm ``u`` with ``sum_j u_j c_j h_j = q`` (SVD)."""
    c = np.sqrt(weights2)
    u = np.linalg.pinv(vectors.T * c, rcond=1e-10) @ q
    return u / c


@pytest.mark.parametrize("seed", range(12))
def test_span_solver_agrees_with_dense_least_squares(seed: int) -> None:
    """Interleaved new vectors (some dependent), repeat weights and solves, as a history grows."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(6, 40))
    solver = SpanSolver(n, residual=1e-6)
    vectors: list[np.ndarray] = []
    weights2: list[float] = []
    for _ in range(int(rng.integers(20, 80))):
        action = rng.random()
        if action < 0.4 or not vectors:
            if len(vectors) > 2 and rng.random() < 0.3:  # a combination of earlier vectors
                picks = rng.choice(len(vectors), 2, replace=False)
                h = vectors[picks[0]] - 2.0 * vectors[picks[1]]
            else:
                h = np.where(rng.random(n) < 0.4, rng.choice([1.0, 0.5, 2.0, -1.0], n), 0.0)
            if not np.any(h):
                continue
            (cells,) = np.nonzero(h)
            j = solver.add(cells.astype(np.int64), h[cells])
            assert j == len(vectors)
            vectors.append(h)
            weights2.append(0.0)
            action = 0.0  # measured at once, as the history does
        if action < 0.7:
            j = len(vectors) - 1 if action == 0.0 else int(rng.integers(len(vectors)))
            w = float(rng.choice([0.01, 1.0, 30.0]))
            solver.weigh(j, w)
            weights2[j] += w
            continue
        stacked = np.array(vectors)
        if rng.random() < 0.5:  # a query in the span, or (likely) outside it
            q = rng.standard_normal(len(vectors)) @ stacked
        else:
            q = np.where(rng.random(n) < 0.5, 1.0, 0.0)
        if not np.any(q):
            continue
        (cells,) = np.nonzero(q)
        (found,), (distance,) = solver.solve_many([(cells.astype(np.int64), q[cells])])
        least = np.linalg.lstsq(stacked.T, q, rcond=None)[0]
        truth = np.linalg.norm(stacked.T @ least - q) / np.linalg.norm(q)
        assert distance == pytest.approx(truth, abs=1e-9)
        assert solver.rank == np.linalg.matrix_rank(stacked)
        if truth > 1e-6:
            assert found is None
            continue
        assert found is not None
        expected = _dense_min_norm(stacked, np.array(weights2), q)
        u, u_expected = found * np.sqrt(weights2), expected * np.sqrt(weights2)
        assert np.allclose(u, u_expected, rtol=1e-8, atol=1e-9 * np.abs(u_expected).max())


def test_copies_are_independent() -> None:
    solver = SpanSolver(3, residual=1e-6)
    for cells in ([0, 1], [1]):
        solver.weigh(solver.add(np.array(cells), np.ones(len(cells))), 1.0)
    other = solver.copy()
    other.weigh(other.add(np.array([2]), np.ones(1)), 1.0)
    assert (solver.rank, solver.size, other.rank, other.size) == (2, 2, 3, 3)
    (outside,), _ = solver.solve_many([(np.array([2]), np.ones(1))])
    (inside,), _ = other.solve_many([(np.array([2]), np.ones(1))])
    assert outside is None and inside is not None


@pytest.mark.parametrize("seed", range(6))
def test_a_restart_places_blocks_as_one_by_one_placement_would(seed: int) -> None:
    """Vectors placed in blocks (a restart) give the rank and solutions of placing each at once.

    Blocks hold new directions, vectors dependent on earlier ones of the same block and
    repeats, so the block's own Gram-Schmidt decides as the grown basis would.
    """
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(30, 90))
    vectors: list[np.ndarray] = []
    for _ in range(int(rng.integers(100, 220))):
        if len(vectors) > 3 and rng.random() < 0.35:
            picks = rng.choice(len(vectors), 2, replace=False)
            h = vectors[picks[0]] + float(rng.choice([1.0, -2.0])) * vectors[picks[1]]
        else:
            h = np.where(rng.random(n) < 0.2, rng.choice([1.0, 2.0, -1.0]), 0.0)
        if np.any(h):
            vectors.append(h)
    weights2 = rng.choice([0.01, 1.0, 30.0], len(vectors))
    restart, one_by_one = SpanSolver(n, residual=1e-6), SpanSolver(n, residual=1e-6)
    probe = (np.arange(n, dtype=np.int64), np.ones(n))
    for h, w in zip(vectors, weights2):
        (cells,) = np.nonzero(h)
        for solver in (restart, one_by_one):
            solver.weigh(solver.add(cells.astype(np.int64), h[cells]), float(w))
        one_by_one.solve_many([probe])  # places the vector now
    stacked = np.array(vectors)
    assert restart.rank == one_by_one.rank == np.linalg.matrix_rank(stacked)
    queries = [rng.standard_normal(len(vectors)) @ stacked for _ in range(4)]
    as_pairs = [(np.flatnonzero(q).astype(np.int64), q[q != 0]) for q in queries]
    found, distances = restart.solve_many(as_pairs)
    expected, expected_distances = one_by_one.solve_many(as_pairs)
    assert distances == pytest.approx(expected_distances, abs=1e-9)
    for g, e in zip(found, expected):
        assert g is not None and e is not None
        u, u_expected = g * np.sqrt(weights2), e * np.sqrt(weights2)
        assert np.allclose(u, u_expected, rtol=1e-8, atol=1e-9 * np.abs(u_expected).max())


def test_terms_one_at_a_time_are_kept_as_updates_while_the_inverse_is_accurate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A GROUP BY planned on a copy adds its groups one solve at a time: ``K^{-1}`` follows by
    updates (no inversion of order r^3 every few dozen), stays at rounding, and is inverted
    anew once its error passes the bound."""
    inversions: list[int] = []
    invert = SpanSolver._invert_k

    def counted(solver: SpanSolver) -> None:
        inversions.append(solver.rank)
        invert(solver)

    monkeypatch.setattr(SpanSolver, "_invert_k", counted)
    rng = np.random.default_rng(42)
    n = 120
    solver = SpanSolver(n, residual=1e-6)
    vectors: list[np.ndarray] = []
    weights2: list[float] = []

    def grow(count: int) -> None:
        for _ in range(count):
            if not vectors or (len(vectors) < 90 and rng.random() < 0.5):
                h = np.where(rng.random(n) < 0.3, rng.choice([1.0, 2.0, -1.0], n), 0.0)
                (cells,) = np.nonzero(h)
                j = solver.add(cells.astype(np.int64), h[cells])
                vectors.append(h)
                weights2.append(0.0)
            else:
                j = int(rng.integers(len(vectors)))
            w = float(rng.choice([0.01, 1.0, 30.0]))
            solver.weigh(j, w)
            weights2[j] += w
            solver.prepare()  # as the solve after each group does

    grow(1)
    assert inversions == [1]
    grow(300)
    assert inversions == [1]  # 300 updates, every one kept
    r = solver.rank
    error = np.eye(r) - solver._k_inv[:r, :r] @ solver._k[:r, :r]
    assert np.linalg.norm(error, 2) < 1e-8
    stacked = np.array(vectors)
    q = rng.standard_normal(len(vectors)) @ stacked
    (found,), _ = solver.solve_many([(np.arange(n, dtype=np.int64), q)])
    assert found is not None
    expected = _dense_min_norm(stacked, np.array(weights2), q)
    u, u_expected = found * np.sqrt(weights2), expected * np.sqrt(weights2)
    assert np.allclose(u, u_expected, rtol=1e-8, atol=1e-9 * np.abs(u_expected).max())

    solver._k_inv[:r, :r] *= 1.0 + 1e-6  # an inverse drifted past the bound
    grow(60)
    assert len(inversions) == 2


def test_the_row_index_takes_in_new_basis_vectors_as_building_it_afresh_would() -> None:
    # More than _PENDING basis vectors joining between solves: the index takes them in
    # beside its columns; it must be the index built from all the basis vectors at once.
    from proxy.engine.span import _PENDING, _row_index

    rng = np.random.default_rng(17)
    n = 300
    solver = SpanSolver(n, residual=1e-6)
    for batch in (10, _PENDING + 5, 3, 2 * _PENDING + 1):
        for _ in range(batch):
            h = np.where(rng.random(n) < 0.05, rng.choice([1.0, 2.0, -1.0], n), 0.0)
            h[int(rng.integers(n))] = 1.0
            (cells,) = np.nonzero(h)
            solver.weigh(solver.add(cells.astype(np.int64), h[cells]), 1.0)
        (cells,) = np.nonzero(rng.random(n) < 0.1)
        solver.solve_many([(cells.astype(np.int64), np.ones(cells.size))])
        index, recent, indexed = solver._basis_index()
        fresh = _row_index(solver._vectors[:indexed], n)
        assert (index != fresh).nnz == 0 and index.has_sorted_indices
        assert np.array_equal(index.indptr, fresh.indptr)
        assert np.array_equal(index.indices, fresh.indices)
        assert np.array_equal(index.data, fresh.data)
        assert indexed + (0 if recent is None else recent.shape[1]) == solver.rank
