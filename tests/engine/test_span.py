"""The span solver against dense linear algebra: basis, distances and minimum-norm weights."""

from __future__ import annotations

import numpy as np
import pytest

from proxy.engine import span
from proxy.engine.span import SpanSolver


def _dense_min_norm(vectors: np.ndarray, weights2: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``u_j / c_j`` for the minimum-norm ``u`` with ``sum_j u_j c_j h_j = q`` (SVD)."""
    c = np.sqrt(weights2)
    u = np.linalg.pinv(vectors.T * c, rcond=1e-10) @ q
    return u / c


def _symmetric(lower: np.ndarray) -> np.ndarray:
    """The symmetric matrix whose lower triangle ``lower`` holds (K and K^{-1} are kept so)."""
    return np.tril(lower) + np.tril(lower, -1).T


def _held(solver: SpanSolver, name: str, n: int) -> np.ndarray:
    """K (``"_k"``) or K^{-1} (``"_k_inv"``) of order ``n``: the lower triangle kept plus the
    rank-one terms held apart."""
    out = _symmetric(getattr(solver, name)[:n, :n])
    terms = getattr(solver, f"{name}_terms")
    for k in range(terms.count):
        v = terms._columns[:n, k]
        out[: v.size, : v.size] += terms._coefficients[k] * np.outer(v, v)
    return out


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


def _history(
    rng: np.random.Generator,
    n: int,
    count: int,
    near: tuple[int, ...] = (),
    combined: float = 0.4,
) -> list[np.ndarray]:
    """Lattice vectors over ``n`` cells: new directions and, with probability ``combined``,
    combinations of earlier ones (often of the same block of 64); those at ``near`` barely off
    the span (the one before moved by 5e-3 of its norm)."""
    vectors: list[np.ndarray] = []
    while len(vectors) < count:
        if len(vectors) in near:
            step = rng.choice([-1.0, 1.0], n)
            h = vectors[-1] + 5e-3 * float(np.linalg.norm(vectors[-1])) * step / np.sqrt(n)
        elif len(vectors) > 3 and rng.random() < combined:
            picks = rng.choice(len(vectors), 2, replace=False)
            h = vectors[picks[0]] + float(rng.choice([1.0, -2.0])) * vectors[picks[1]]
        else:
            h = np.where(rng.random(n) < 0.2, rng.choice([1.0, 2.0, -1.0]), 0.0)
        if np.any(h):
            vectors.append(h)
    return vectors


@pytest.mark.parametrize("seed", range(6))
def test_a_restart_places_blocks_as_one_by_one_placement_would(seed: int) -> None:
    """Vectors placed in blocks (a restart) give the rank and solutions of placing each at once.

    Blocks hold new directions, vectors dependent on earlier ones of the same block and
    repeats, so the block's own Gram-Schmidt decides as the grown basis would.
    """
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(30, 90))
    vectors = _history(rng, n, int(rng.integers(100, 220)), combined=0.35)
    weights2 = rng.choice([0.01, 1.0, 30.0], len(vectors))
    restart, one_by_one = SpanSolver(n, residual=1e-6), SpanSolver(n, residual=1e-6)
    probe = (np.arange(n, dtype=np.int64), np.ones(n))
    for h, w in zip(vectors, weights2):
        (cells,) = np.nonzero(h)
        for solver in (restart, one_by_one):
            solver.weigh(solver.add(cells.astype(np.int64), h[cells]), float(w))
        one_by_one.solve_many([probe])  # places the vector now
    assert restart.rank == one_by_one.rank == np.linalg.matrix_rank(np.array(vectors))
    _assert_solve_alike(restart, one_by_one, vectors, rng, scale=np.sqrt(weights2))


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
    error = np.eye(r) - _held(solver, "_k_inv", r) @ _held(solver, "_k", r)
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


@pytest.mark.parametrize("seed", range(4))
def test_a_vector_solved_then_added_is_placed_from_that_solve(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a batch's fresh groups are: solved alone, added scaled, placed at the next solve.

    The placement reuses the solve's projection (no projection of its own) and gives the basis
    and solutions of placing it afresh; a vector other than the one solved is projected anew.
    """
    rng = np.random.default_rng(200 + seed)
    n = int(rng.integers(30, 80))
    reusing, afresh = SpanSolver(n, residual=1e-6), SpanSolver(n, residual=1e-6)
    projected = [0]
    project = SpanSolver._project

    def counting(self: SpanSolver, *args: object, **kwargs: object) -> object:
        projected[0] += bool(kwargs.get("residuals")) and self is reusing
        return project(self, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(SpanSolver, "_project", counting)
    vectors: list[np.ndarray] = []
    for step in range(int(rng.integers(40, 90))):
        if len(vectors) > 3 and rng.random() < 0.3:  # in the span of earlier ones
            picks = rng.choice(len(vectors), 2, replace=False)
            h = vectors[picks[0]] - vectors[picks[1]]
        else:
            h = np.where(rng.random(n) < 0.2, rng.choice([1.0, 2.0, -1.0]), 0.0)
        if not np.any(h):
            continue
        (cells,) = np.nonzero(h)
        cells = cells.astype(np.int64)
        values = 3.0 * h[cells]  # solved as the query, added scaled to a first weight of 1
        f = float(values[0])
        solved = values if step % 5 else values.copy()  # every fifth: another array, no reuse
        reused = step % 5 != 0 and reusing.rank > 0  # (no basis yet: nothing solved)
        for solver in (reusing, afresh):
            solver.solve_many([(cells, solved)])
        before = projected[0]
        reusing.weigh(reusing.add(cells, values / f, scaled_from=(values, f)), 1.0)
        afresh.weigh(afresh.add(cells, values / f), 1.0)
        probe = [(np.arange(n, dtype=np.int64), np.ones(n))]
        reusing.solve_many(probe), afresh.solve_many(probe)  # place it
        assert projected[0] - before == (0 if reused else 1)
        vectors.append(h)
    assert reusing.rank == afresh.rank == np.linalg.matrix_rank(np.array(vectors))
    _assert_solve_alike(reusing, afresh, vectors, rng)


@pytest.mark.parametrize("seed", range(8))
def test_copies_sharing_matrices_solve_as_solvers_of_their_own(seed: int) -> None:
    """A family of copies grown, weighed, solved and dropped in any order (a plan's copy, plans
    abandoned, the original appending after them): each solves as a solver that never shared
    its matrices, built from the same vectors and weights."""
    rng = np.random.default_rng(300 + seed)
    n = int(rng.integers(100, 200))  # the span keeps growing: a copy's rows are past the others'
    solvers = [SpanSolver(n, residual=1e-6)]
    logs: list[list[tuple[np.ndarray | int, float]]] = [[]]  # per solver: adds and weighs
    for _ in range(int(rng.integers(150, 300))):
        action, k = rng.random(), int(rng.integers(len(solvers)))
        solver, log = solvers[k], logs[k]
        if action < 0.1 and len(solvers) < 4:
            solvers.append(solver.copy())
            logs.append(list(log))
        elif action < 0.16 and len(solvers) > 1:
            del solvers[k], logs[k]
        elif action < 0.55 or solver.size == 0:
            added = [v for v, _ in log if not isinstance(v, int)]
            if len(added) > 1 and rng.random() < 0.3:  # in the span: coordinates, no new row
                picks = rng.choice(len(added), 2, replace=False)
                h = added[int(picks[0])] - 2.0 * added[int(picks[1])]
            else:
                h = np.where(rng.random(n) < 0.1, rng.choice([1.0, 2.0, -1.0], n), 0.0)
            if np.any(h):
                (cells,) = np.nonzero(h)
                w = float(rng.choice([0.5, 1.0, 20.0]))
                solver.weigh(solver.add(cells.astype(np.int64), h[cells]), w)
                log.append((h, w))
        elif action < 0.75:
            j, w = int(rng.integers(solver.size)), float(rng.choice([0.5, 1.0, 20.0]))
            solver.weigh(j, w)
            log.append((j, w))
        else:
            alone = SpanSolver(n, residual=1e-6)
            for vector, w in log:
                if isinstance(vector, int):
                    alone.weigh(vector, w)
                else:
                    (cells,) = np.nonzero(vector)
                    alone.weigh(alone.add(cells.astype(np.int64), vector[cells]), w)
            added = [v for v, _ in log if not isinstance(v, int)]
            q = rng.standard_normal(len(added)) @ np.array(added)  # in the span
            pair = [_as_pair(q)]
            (found,), distances = solver.solve_many(pair)
            (expected,), expected_distances = alone.solve_many(pair)
            assert solver.rank == alone.rank
            assert distances == pytest.approx(expected_distances, abs=1e-9)
            assert found is not None and expected is not None
            assert np.allclose(found, expected, rtol=1e-8, atol=1e-9 * np.abs(expected).max())


def _as_pair(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A dense vector as the solver takes it: its non-zero cells and their weights."""
    return np.flatnonzero(q).astype(np.int64), q[q != 0]


def _assert_solve_alike(
    solver: SpanSolver,
    reference: SpanSolver,
    vectors: list[np.ndarray],
    rng: np.random.Generator,
    scale: np.ndarray | float = 1.0,
) -> None:
    """Same distances, and weights (times ``scale``), on four random queries in the span."""
    stacked = np.array(vectors)
    queries = [rng.standard_normal(len(vectors)) @ stacked for _ in range(4)]
    as_pairs = [_as_pair(q) for q in queries]
    found, distances = solver.solve_many(as_pairs)
    expected, expected_distances = reference.solve_many(as_pairs)
    assert distances == pytest.approx(expected_distances, abs=1e-9)
    for g, e in zip(found, expected):
        assert g is not None and e is not None
        u, u_expected = g * scale, e * scale
        assert np.allclose(u, u_expected, rtol=1e-8, atol=1e-9 * np.abs(u_expected).max())


def _assert_placed_alike(bulk: SpanSolver, cellwise: SpanSolver, vectors: list[np.ndarray]) -> None:
    """Bulk placement found the rank, basis, Gram factors and coordinates of placement over
    the cells, to rounding."""
    r = bulk.rank
    assert r == cellwise.rank == np.linalg.matrix_rank(np.array(vectors))
    assert [c.tolist() for c, _ in bulk._vectors] == [c.tolist() for c, _ in cellwise._vectors]
    for name in ("_gram", "_lower", "_lower_inv"):
        a, b = getattr(bulk, name)[:r, :r], getattr(cellwise, name)[:r, :r]
        assert np.allclose(a, b, rtol=0, atol=1e-9 * np.abs(b).max()), name
    a, b = bulk._coords[:r, : len(vectors)], cellwise._coords[:r, : len(vectors)]
    assert np.allclose(a, b, rtol=0, atol=1e-9 * np.abs(b).max())


@pytest.mark.parametrize("seed", range(6))
def test_place_all_places_as_the_cells_would(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A restart's placement through inner products gives the basis, borders and coordinates
    of placement over the cells, block by block, to rounding; blocks it cannot decide (a vector
    near the span) go over the cells."""
    rng = np.random.default_rng(300 + seed)
    n = int(rng.integers(400, 600))
    vectors = _history(rng, n, int(rng.integers(200, 320)), near=(70, 150))
    weights2 = rng.choice([0.01, 1.0, 30.0], len(vectors))
    over_cells = SpanSolver._place
    blocks_over_cells: list[int] = []

    def counted(solver: SpanSolver) -> None:
        blocks_over_cells.append(len(solver._queue))
        over_cells(solver)

    monkeypatch.setattr(SpanSolver, "_place", counted)
    bulk, cellwise = SpanSolver(n, residual=1e-6), SpanSolver(n, residual=1e-6)
    for h, w in zip(vectors, weights2):
        (cells,) = np.nonzero(h)
        for solver in (bulk, cellwise):
            solver.weigh(solver.add(cells.astype(np.int64), h[cells]), float(w))
    cellwise._place()
    del blocks_over_cells[:]
    bulk.place_all()
    assert blocks_over_cells == [64, 64]  # the two blocks with a vector near the span
    _assert_placed_alike(bulk, cellwise, vectors)
    stacked = np.array(vectors)
    queries = [rng.standard_normal(len(vectors)) @ stacked for _ in range(4)]
    queries.append(np.where(rng.random(n) < 0.3, 1.0, 0.0))  # mostly outside the span
    as_pairs = [_as_pair(q) for q in queries]
    found, distances = bulk.solve_many(as_pairs)
    expected, expected_distances = cellwise.solve_many(as_pairs)
    assert distances == pytest.approx(expected_distances, abs=1e-9)
    # the vectors near the span raise cond(L) to ~1e4: both routes' rounding is the problem's,
    # so the bulk one is held to the dense solutions about as closely as the other is
    c = np.sqrt(weights2)
    errors: dict[str, list[float]] = {"bulk": [], "cells": []}
    for g, e, q in zip(found, expected, queries):
        assert (g is None) == (e is None)
        if g is not None and e is not None:
            u = _dense_min_norm(stacked, weights2, q) * c
            errors["bulk"].append(np.abs(g * c - u).max() / np.abs(u).max())
            errors["cells"].append(np.abs(e * c - u).max() / np.abs(u).max())
    assert len(errors["bulk"]) == 4
    assert max(errors["bulk"]) <= 10 * max(errors["cells"]) + 1e-9


def test_place_all_goes_over_the_cells_when_l_is_ill_conditioned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past ``_SCREEN_COND`` every later block is placed over the cells."""
    monkeypatch.setattr(span, "_SCREEN_COND", 0.0)
    rng = np.random.default_rng(7)
    vectors = _history(rng, 400, 200)
    placed: list[int] = []
    over_cells = SpanSolver._place

    def counted(solver: SpanSolver) -> None:
        placed.append(len(solver._queue))
        over_cells(solver)

    monkeypatch.setattr(SpanSolver, "_place", counted)
    solver = SpanSolver(400, residual=1e-6)
    for h in vectors:
        (cells,) = np.nonzero(h)
        solver.weigh(solver.add(cells.astype(np.int64), h[cells]), 1.0)
    solver.place_all()
    assert placed == [64, 64, 8]  # the first block has no basis yet: by inner products
    assert solver.rank == np.linalg.matrix_rank(np.array(vectors))


def test_the_row_index_takes_in_new_basis_vectors_as_building_it_afresh_would() -> None:
    # More than _PENDING basis vectors joining between solves: the index's parts take them in
    # beside their columns; each part must be the index built from its basis vectors at once,
    # and the parts must cover the basis in order.
    from proxy.engine.span import _PENDING, _row_index

    rng = np.random.default_rng(17)
    n = 500
    solver = SpanSolver(n, residual=1e-6)
    counts = []
    for batch in (10, 200, _PENDING + 8, 3, 2 * _PENDING + 1):
        for _ in range(batch):
            h = np.where(rng.random(n) < 0.05, rng.choice([1.0, 2.0, -1.0], n), 0.0)
            h[int(rng.integers(n))] = 1.0
            (cells,) = np.nonzero(h)
            solver.weigh(solver.add(cells.astype(np.int64), h[cells]), 1.0)
        (cells,) = np.nonzero(rng.random(n) < 0.1)
        solver.solve_many([(cells.astype(np.int64), np.ones(cells.size))])
        parts = solver._basis_index()
        counts.append([columns.stop - columns.start for _, columns in parts])
        assert parts[0][1].start == 0 and parts[-1][1].stop == solver.rank
        for (part, columns), following in zip(parts, [*parts[1:], None]):
            assert following is None or following[1].start == columns.stop
            fresh = _row_index(solver._vectors[columns], n)
            assert (part != fresh).nnz == 0 and part.has_sorted_indices
            assert np.array_equal(part.indptr, fresh.indptr)
            assert np.array_equal(part.indices, fresh.indices)
            assert np.array_equal(part.data, fresh.data)
    assert solver.rank == 318  # every vector joined the basis
    # a middle part kept beside the first, with the last ones after it, then joining the first
    assert counts == [[10], [202, 8], [202, 48], [202, 48, 3], [317, 1]]


def test_a_copy_changing_k_copies_only_its_order() -> None:
    """A copy that weighs a vector takes K and K^{-1} of order r (and a block of room), not
    the original's buffers; the original keeps its own, and both solve as before."""
    solver = SpanSolver(30, residual=1e-9)
    rng = np.random.default_rng(3)
    vectors = []
    for _ in range(20):
        cells = np.sort(rng.choice(30, size=5, replace=False))
        vectors.append((cells, rng.integers(1, 4, size=5).astype(float)))
        solver.weigh(solver.add(*vectors[-1]), 1.0)
    query = [vectors[0]]  # in the span: solved through K
    before, _ = solver.solve_many(query)
    copy = solver.copy()
    copy.weigh(0, 2.0)
    copy.solve_many(query)
    r = solver.rank
    assert copy._k is not solver._k and copy._k.shape == (r + span._BLOCK,) * 2
    assert copy._k_inv.shape == (r + span._BLOCK,) * 2
    after, _ = solver.solve_many(query)
    assert before[0] is not None and after[0] is not None
    assert np.array_equal(before[0], after[0])


def test_inner_products_read_the_index_rows_of_the_cells_touched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """H_B^T v from the index's rows (`_row_entries`), for one vector and a batch, with basis
    vectors both in the index and in the recent part, and cells no basis vector weighs."""
    from proxy.engine.span import _PENDING

    rng = np.random.default_rng(23)
    n = 400
    solver = SpanSolver(n, residual=1e-6)
    for batch in (2 * _PENDING + 3, 5):
        for _ in range(batch):
            h = np.where(rng.random(n - 50) < 0.04, rng.choice([1.0, 2.0, -1.0], n - 50), 0.0)
            h[int(rng.integers(n - 50))] = 3.0
            (cells,) = np.nonzero(h)
            solver.weigh(solver.add(cells.astype(np.int64), h[cells]), 1.0)
        solver.solve_many([(np.array([0]), np.array([1.0]))])
    assert len(solver._basis_index()) == 2  # both parts are read
    basis = np.zeros((n, solver.rank))
    for k, (cells, weights) in enumerate(solver._vectors):
        basis[cells, k] = weights
    queries = []
    for size in (1, 9, 60, 120):
        cells = np.sort(rng.choice(n, size=size, replace=False)).astype(np.int64)
        queries.append((cells, rng.standard_normal(size)))
    queries.append((np.arange(n - 50, n, dtype=np.int64), np.ones(50)))  # no basis cell
    dense = np.zeros((n, len(queries)))
    for k, (cells, weights) in enumerate(queries):
        dense[cells, k] = weights
    np.testing.assert_allclose(solver._inner(queries), basis.T @ dense, atol=1e-12)
    for gathered in (span._GATHERED, 0):  # gathered by hand, then by scipy's row indexing
        monkeypatch.setattr(span, "_GATHERED", gathered)
        for k, query in enumerate(queries):
            inner = solver._inner([query])[:, 0]
            np.testing.assert_allclose(inner, basis.T @ dense[:, k], atol=1e-12)
        assert not np.any(solver._inner([queries[-1]]))


def test_k_formed_anew_in_blocks_is_the_weighed_sum_of_every_vector(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Many terms at once (a restart) form K from every vector, a few columns at a time; it
    must be sum_j c_j^2 z_j z_j^T, symmetric, and the inverse kept must be its inverse."""
    monkeypatch.setattr(span, "_SCALED_COLUMNS", 7)
    rng = np.random.default_rng(29)
    solver = SpanSolver(60, residual=1e-9)
    for _ in range(45):
        cells = np.sort(rng.choice(60, size=6, replace=False)).astype(np.int64)
        solver.weigh(solver.add(cells, rng.integers(1, 4, size=6).astype(float)), 1.0)
        solver.weigh(int(rng.integers(solver.size)), float(rng.choice([0.5, 2.0])))
    solver.prepare()
    r = solver.rank
    z = solver._coords[:r, : solver.size]
    expected = (z * solver._weight2[: solver.size]) @ z.T
    k = _held(solver, "_k", r)
    np.testing.assert_allclose(k, expected, rtol=1e-12, atol=1e-12 * np.abs(expected).max())
    np.testing.assert_allclose(_held(solver, "_k_inv", r) @ k, np.eye(r), atol=1e-8)


def test_values_read_only_the_rows_each_block_of_vectors_reaches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """z_j^T y per block of placed vectors over the rows they reach: the full product's
    values, as the span grows after the reach of earlier blocks was found, and in a copy
    that places vectors of its own."""
    monkeypatch.setattr(span, "_STAIR", 4)
    rng = np.random.default_rng(31)
    n = 80
    solver = SpanSolver(n, residual=1e-9)

    def grow(target: SpanSolver, count: int) -> None:
        for _ in range(count):
            cells = np.sort(rng.choice(n, size=5, replace=False)).astype(np.int64)
            target.weigh(target.add(cells, rng.integers(1, 4, size=5).astype(float)), 1.0)

    def check(target: SpanSolver) -> None:
        r = target.rank
        y = rng.standard_normal((r, 3))
        full = target._coords[:r, : target.size].T @ y
        np.testing.assert_allclose(target._values(y), full, atol=1e-12)
        assert len(target._stairs) == target.size // 4
        assert max(target._stairs, default=0) <= r

    grow(solver, 9)
    check(solver)
    assert solver._stairs[0] < solver.rank  # the first block's reach stops below the rank
    grow(solver, 30)
    check(solver)
    copy = solver.copy()
    grow(copy, 11)
    check(copy)
    check(solver)


def _blocked_vectors(rng: np.random.Generator, count: int) -> tuple[list[np.ndarray], int]:
    """Vectors over blocks of cells, as ANOVA coordinates are: each weighs every cell of the
    blocks of one of a few patterns (some blocks shared by most patterns, some by few), with
    a zero here and there."""
    sizes = [1, 3, 5, 15, 4, 12, 60]
    starts = np.concatenate([[0], np.cumsum(sizes)])
    patterns = [(0,), (0, 1), (0, 1, 2, 3), (0, 4), (0, 1, 4, 5), (0, 2, 4, 6)]
    vectors = []
    for _ in range(count):
        h = np.zeros(int(starts[-1]))
        for b in patterns[int(rng.integers(len(patterns)))]:
            h[starts[b] : starts[b + 1]] = rng.standard_normal(sizes[b])
        h[rng.random(h.size) < 0.02] = 0.0
        h[0] = 1.0 + rng.random()
        vectors.append(h)
    return vectors, int(starts[-1])


@pytest.mark.parametrize("scatter", [0.0, 1000.0, 1e12])
def test_a_restarts_inner_products_are_those_over_the_cells(
    scatter: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Grouped by the vectors that weigh them, taken into one dense product or added group by
    group (``_SCATTER`` 0: every group added; 1e12: every cell in the dense product), the
    cells give every inner product as the product over the cells does (to rounding)."""
    monkeypatch.setattr(span, "_SCATTER", scatter)
    monkeypatch.setattr(span, "_DENSE_BYTES", 8 * 150 * 7)  # the dense product in parts
    rng = np.random.default_rng(41)
    vectors, n = _blocked_vectors(rng, 150)
    stacked = np.array(vectors)
    found = span._inner_products([_as_pair(h) for h in vectors], n)
    expected = stacked @ stacked.T
    assert np.allclose(found, expected, rtol=0, atol=1e-12 * np.abs(expected).max())
    assert span._inner_products([], n).shape == (0, 0)


def test_groups_whose_keys_collide_still_give_the_inner_products(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every vector's key equal: all cells one group, its vectors the union; still exact."""
    monkeypatch.setattr(span, "_SCATTER", 0.0)
    monkeypatch.setattr(span, "_mixed", lambda values: np.zeros_like(values))
    rng = np.random.default_rng(43)
    vectors, n = _blocked_vectors(rng, 40)
    stacked = np.array(vectors)
    found = span._inner_products([_as_pair(h) for h in vectors], n)
    assert np.allclose(found, stacked @ stacked.T, rtol=0, atol=1e-12 * np.abs(found).max())


@pytest.mark.parametrize("seed", range(3))
def test_place_all_after_a_basis_places_as_the_cells_would(seed: int) -> None:
    """A queue placed in bulk onto a basis already there (and blocks of it over the cells,
    whose basis vectors later blocks read): the same basis, borders and coordinates."""
    rng = np.random.default_rng(700 + seed)
    n = int(rng.integers(300, 400))
    vectors = _history(rng, n, 260, near=(150,))
    bulk, cellwise = SpanSolver(n, residual=1e-6), SpanSolver(n, residual=1e-6)
    for i, h in enumerate(vectors):
        (cells,) = np.nonzero(h)
        for solver in (bulk, cellwise):
            solver.weigh(solver.add(cells.astype(np.int64), h[cells]), 1.0)
        if i == 90:
            bulk._place()
    cellwise._place()
    bulk.place_all()
    _assert_placed_alike(bulk, cellwise, vectors)


@pytest.mark.parametrize(
    ("rounds", "terms", "held"),
    # held apart at the end: 1 and 1; of 21, K's added at 18, K^{-1}'s at 16; K formed anew
    [(1, 1, (1, 1)), (7, 3, (3, 5)), (1, 40, (0, 8))],
)
def test_k_and_its_inverse_are_read_from_their_lower_triangles_alone(
    rounds: int, terms: int, held: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """After new terms (held apart, added by dsyrk once _LOW_RANK are held, or K formed anew)
    and Sherman-Morrison updates of K^{-1}, NaN above the kept matrices' diagonals changes no
    solve, of one query or many, and the solves still agree with dense least squares."""
    monkeypatch.setattr(span, "_HELD_FROM", 0)  # held apart at any rank
    rng = np.random.default_rng(rounds * terms)
    n = 40
    vectors = _history(rng, n, 60)
    solver = SpanSolver(n, residual=1e-9)
    weights2 = np.zeros(len(vectors))
    for h in vectors:
        solver.weigh(solver.add(*_as_pair(h)), 1.0)
    weights2 += 1.0
    solver.prepare()
    for _ in range(rounds):
        for j in rng.integers(len(vectors), size=terms).tolist():
            w = float(rng.choice([0.5, 4.0]))
            solver.weigh(j, w)
            weights2[j] += w
        solver.prepare()
    assert (solver._k_terms.count, solver._k_inv_terms.count) == held
    r = solver.rank
    stacked = np.array(vectors)
    queries = [_as_pair(rng.standard_normal(len(vectors)) @ stacked) for _ in range(6)]
    before = [solver.solve_many(queries[:1])[0][0], *solver.solve_many(queries)[0]]
    for name in ("_k", "_k_inv"):
        getattr(solver, name)[:r, :r][np.triu_indices(r, 1)] = np.nan
    after = [solver.solve_many(queries[:1])[0][0], *solver.solve_many(queries)[0]]
    for g, h in zip(before, after):
        assert g is not None and h is not None
        np.testing.assert_array_equal(g, h)
    for (cells, weights), found in zip(queries, after[1:]):
        q = np.zeros(n)
        q[cells] = weights
        expected = _dense_min_norm(stacked, weights2, q)
        u, u_expected = found * np.sqrt(weights2), expected * np.sqrt(weights2)
        assert np.allclose(u, u_expected, rtol=1e-8, atol=1e-9 * np.abs(u_expected).max())


@pytest.mark.parametrize("seed", range(3))
def test_terms_held_apart_solve_as_terms_added_at_once(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A history weighed answer by answer (new directions among them) solves the same, to
    rounding, whether K's and K^{-1}'s rank-one terms are held apart or added at once."""
    monkeypatch.setattr(span, "_HELD_FROM", 0)
    rng = np.random.default_rng(300 + seed)
    n = 50
    vectors = _history(rng, n, 70)
    steps = [(int(rng.integers(k + 1)), float(rng.choice([0.3, 1.0, 5.0]))) for k in range(70)]
    solvers, held_apart = [], 0
    for low_rank in (span._LOW_RANK, 1):
        monkeypatch.setattr(span, "_LOW_RANK", low_rank)
        solver = SpanSolver(n, residual=1e-9)
        for k, (j, w) in enumerate(steps):
            solver.weigh(solver.add(*_as_pair(vectors[k])), 1.0)
            solver.weigh(j, w)
            solver.solve_many([_as_pair(vectors[j])])  # prepared answer by answer
            held_apart += solver._k_terms.count + solver._k_inv_terms.count
        solvers.append(solver)
        if low_rank == 1:
            assert held_apart == 0
        else:
            assert held_apart > 0
            held_apart = 0
    held, added = solvers
    _assert_solve_alike(held, added, vectors, rng)


def test_terms_are_held_apart_from_rank_held_from_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Below _HELD_FROM a fresh answer's terms go into K and K^{-1} at once; from it they are
    held (and the solves agree either way)."""
    rng = np.random.default_rng(41)
    n = 30
    vectors = _history(rng, n, 40)
    solvers = []
    for held_from in (span._HELD_FROM, 10):
        monkeypatch.setattr(span, "_HELD_FROM", held_from)
        solver = SpanSolver(n, residual=1e-9)
        for h in vectors:
            solver.weigh(solver.add(*_as_pair(h)), 1.0)
        solver.prepare()
        assert solver.rank >= 10
        solver.weigh(3, 2.0)
        solver.solve_many([_as_pair(vectors[3])])
        counts = solver._k_terms.count, solver._k_inv_terms.count
        assert counts == ((0, 0) if held_from > solver.rank else (1, 1))
        solvers.append(solver)
    _assert_solve_alike(solvers[0], solvers[1], vectors, rng)


def test_a_grown_buffer_copies_only_the_block_written() -> None:
    """Room is made by copying the leading block a solver wrote (its rank, its vectors placed):
    not the room past it, which a restart leaves for every vector it placed to join the basis
    (never written, so no memory backs it until a copy touches it), nor what a dropped copy
    wrote there (zero in the new buffer, as in a solver of its own)."""
    buffer = np.arange(1.0, 37.0).reshape(6, 6)
    grown = span._grown(buffer, 4, 9, (2, 3))
    assert grown.shape == (6, 12)
    assert np.array_equal(grown[:2, :3], buffer[:2, :3])
    assert np.count_nonzero(grown) == 6
    assert span._grown(buffer, 6, 6, (2, 3)) is buffer  # room enough: the buffer itself
