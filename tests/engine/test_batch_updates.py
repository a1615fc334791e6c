"""A batch's later solves, corrected for the values measured before them (BatchSolve).

Each corrected BLUE is checked against the plan's copy of the index solving it from scratch
(the one-at-a-time path: the fresh vectors placed, then solved) and against dense least squares
over every row, history and fresh.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest

from proxy.engine import span
from proxy.engine.estimator import BatchSolve, HistoryIndex, Solution
from proxy.engine.factored import AnovaCoordinates
from sqlmap.vector import LinearQuery


def _from_scratch(index: HistoryIndex) -> HistoryIndex:
    """A copy of ``index`` with a cache of its own: its solves are made, not the batch's
    corrected values found again (copies share the cache, and a batch caches what it corrects)."""
    other = index.copy()
    other._solutions = OrderedDict()
    other._solutions_held = [0]
    return other


def _dense_blue(h: np.ndarray, precision: np.ndarray, q: np.ndarray) -> np.ndarray | None:
    """t = argmin sum (t_i / p_i)^2 subject to t H = q, by a dense pseudo-inverse."""
    a = (precision[:, None] * h).T
    u = np.linalg.pinv(a, rcond=1e-12) @ q
    if np.linalg.norm(a @ u - q) > 1e-6 * np.linalg.norm(q):
        return None
    return u * precision


def _weights(solution: Solution, m: int) -> np.ndarray:
    dense = np.zeros(m)
    dense[solution.rows] = solution.weights
    return dense


def _same(a: Solution | None, b: Solution | None, m: int, rtol: float = 1e-8) -> None:
    assert (a is None) == (b is None)
    if a is not None and b is not None:
        wa, wb = _weights(a, m), _weights(b, m)
        np.testing.assert_allclose(wa, wb, rtol=rtol, atol=rtol * float(np.abs(wb).max()))
        assert a.variance == pytest.approx(b.variance, rel=rtol)
        assert a.residual == pytest.approx(b.residual, abs=0.1 * rtol)  # a distance from the span


def _history(rng: np.random.Generator, n: int, factored: bool) -> tuple[HistoryIndex, list]:
    """A history over ``n`` cells (a 4 x 3 x 5 cube when factored) with uneven precisions."""
    index = HistoryIndex(n, shape=(4, 3, 5) if factored else None)
    rows = []
    for _ in range(int(rng.integers(3, 25))):
        h = np.where(rng.random(n) < 0.3, rng.choice([1.0, 2.0, -1.0], n), 0.0)
        if not np.any(h):
            continue
        query = LinearQuery.from_dense(h)
        for _ in range(int(rng.integers(1, 3))):
            alpha = float(rng.choice([1e-4, 0.05, 0.5, 3.0]))
            index.append(query, alpha=alpha, step=1e-3)
            rows.append((h, alpha / query.sensitivity))
    return index, rows


def _batch(rng: np.random.Generator, n: int, rows: list) -> list[np.ndarray]:
    """Disjoint groups, repeats of history rows, sums of earlier values, duplicates, zeros."""
    cells = rng.permutation(n)
    cuts = np.sort(rng.choice(np.arange(1, n), size=int(rng.integers(2, 7)), replace=False))
    batch = []
    for part in np.split(cells, cuts):
        q = np.zeros(n)
        q[part] = 1.0
        batch.append(q)
    for _ in range(int(rng.integers(0, 4))):
        kind = rng.random()
        if kind < 0.3 and rows:
            batch.append(rows[int(rng.integers(len(rows)))][0] * float(rng.choice([1.0, -2.0])))
        elif kind < 0.6:
            picks = rng.choice(len(batch), 2, replace=False)
            batch.append(batch[picks[0]] + 0.5 * batch[picks[1]])
        elif kind < 0.8:
            batch.append(batch[int(rng.integers(len(batch)))].copy())
        else:
            batch.append(np.zeros(n))
    order = rng.permutation(len(batch))
    return [batch[i] for i in order]


def _run(seed: int, factored: bool) -> int:
    """Measure a random part of a batch in order; every later value against both references.

    Returns how many values were corrected (not solved on the copy)."""
    rng = np.random.default_rng(seed)
    n = 60 if factored else int(rng.integers(8, 30))
    index, rows = _history(rng, n, factored)
    dense = [_batch_query(q, factored) for q in _batch(rng, n, rows)]
    corrected, _ = _measured_in_order(rng, index, rows, dense)
    return corrected


def _measured_in_order(
    rng: np.random.Generator, index: HistoryIndex, rows: list, dense: list[LinearQuery]
) -> tuple[int, int]:
    """Values corrected, and new directions the corrections took at the end (see _run)."""
    batch = index.batch(dense)
    copy = index.copy()
    corrected = 0
    for i, query in enumerate(dense):
        got = batch.solve(i)
        if i == 0 or batch._index is index:
            _same(got, index.solve(query), index.size)
        else:
            corrected += batch._updates is not None
            precision = np.array([p for _, p in rows])
            # the corrected and the from-scratch solve differ by rounding times the squared
            # spread of the rows' precisions (up to 1e6 here); both meet the dense check below
            rtol = max(1e-8, 1e-15 * (precision.max() / precision.min()) ** 2)
            _same(got, _from_scratch(copy).solve(query), copy.size, rtol)
            h = np.array([r for r, _ in rows])
            blue = _dense_blue(h, precision, query.to_dense())
            if got is not None and blue is not None and got.residual < 1e-9:
                # a fresh vector within span._INDEPENDENT of the span is taken as in it
                np.testing.assert_allclose(
                    _weights(got, copy.size), blue, rtol=1e-3, atol=1e-4 * np.abs(blue).max()
                )
        if rng.random() < 0.6 and not query.is_zero:
            alpha = float(rng.choice([0.01, 0.2, 1.0, 50.0]))
            batch.measured(i, copy, copy.append(query, alpha=alpha, step=1e-3))
            rows.append((query.to_dense(), alpha / query.sensitivity))
    updates = batch._updates
    return corrected, 0 if updates is None else updates._dims - updates._rank


def _batch_query(q: np.ndarray, factored: bool) -> LinearQuery:
    if factored:
        return LinearQuery.from_tensor((4, 3, 5), q.reshape(1, 4, 3, 5))
    return LinearQuery.from_dense(q)


@pytest.mark.parametrize("factored", [False, True])
def test_corrected_solves_are_the_copys_and_the_dense_blues(factored: bool) -> None:
    corrected = sum(_run(seed, factored) for seed in range(60))
    assert corrected > 100  # the corrections, not the fallback, were checked


def test_a_cancelling_correction_is_solved_on_the_copy() -> None:
    """A value measured far more precisely than the history, then asked again: its ``y``
    shrinks by the ratio of precisions, so the copy solves it."""
    index = HistoryIndex(4)
    for h in ([1.0, 1.0, 0.0, 0.0], [0.0, 1.0, 1.0, 0.0], [0.0, 0.0, 1.0, 1.0], [1.0, 0, 0, 1]):
        index.append(LinearQuery.from_dense(h), alpha=1e-4, step=1e-3)
    query = LinearQuery.from_dense([1.0, 0.0, 1.0, 0.0])
    batch = index.batch([query, query])
    copy = index.copy()
    batch.measured(0, copy, copy.append(query, alpha=1e4, step=1e-3))
    assert batch._updates is not None
    assert batch._updates.solve(1) is None  # the correction cancelled
    _same(batch.solve(1), _from_scratch(copy).solve(query), copy.size)


def test_a_span_past_its_bound_is_solved_on_the_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh vector that would take the copy's span past ``max_rank``: no more corrections."""
    index = HistoryIndex(6)
    index.append(LinearQuery.from_dense([1.0, 1.0, 0, 0, 0, 0]), alpha=1.0, step=1e-3)
    assert index._span is not None
    monkeypatch.setattr(index._span, "_max_rank", 2)
    groups = [LinearQuery.from_dense(np.eye(6)[k]) for k in range(2, 6)]
    batch = index.batch(groups)
    copy = index.copy()
    batch.measured(0, copy, copy.append(groups[0], alpha=1.0, step=1e-3))  # rank 2
    assert batch._updates is not None
    _same(batch.solve(1), _from_scratch(copy).solve(groups[1]), copy.size)
    batch.measured(1, copy, copy.append(groups[1], alpha=1.0, step=1e-3))  # would be rank 3
    assert batch._updates is None
    _same(batch.solve(2), _from_scratch(copy).solve(groups[2]), copy.size)


@pytest.mark.parametrize("in_history_span", [False, True])
def test_values_of_queries_outside_the_span_are_found_only_once_needed(
    monkeypatch: pytest.MonkeyPatch, in_history_span: bool
) -> None:
    """Fresh groups off the span never need their values, nor correct any. The last value,
    the sum of two groups (brought into the span by them) or a vector of the history's span
    (its values found by the batch's solve, then dropped as the first group is measured), has
    its values found when it is solved (one column), as the copy's."""
    index = HistoryIndex(6)
    index.append(LinearQuery.from_dense([1.0, 1.0, 0, 0, 0, 0]), alpha=1.0, step=1e-3)
    solver = index._span
    assert solver is not None
    found: list[int] = []  # the columns the batch's solver found values of
    values = span.SpanSolver._values

    def counted(self: span.SpanSolver, y: np.ndarray) -> np.ndarray:
        if self is solver:
            found.append(y.shape[1])
        return values(self, y)

    monkeypatch.setattr(span.SpanSolver, "_values", counted)
    groups = [LinearQuery.from_dense(np.eye(6)[k]) for k in range(2, 6)]
    last = [2.0, 2.0, 0, 0, 0, 0] if in_history_span else np.eye(6)[2] + np.eye(6)[3]
    queries = [*groups, LinearQuery.from_dense(last)]
    batch = index.batch(queries)
    assert found == ([1] if in_history_span else [])
    found.clear()
    copy = index.copy()
    for i, group in enumerate(groups):
        _same(batch.solve(i), _from_scratch(copy).solve(group), copy.size)
        batch.measured(i, copy, copy.append(group, alpha=1.0 + i, step=1e-3))
    assert batch._updates is not None and found == []
    _same(batch.solve(4), _from_scratch(copy).solve(queries[4]), copy.size)
    assert batch.solve(4) is not None and found == [1]


def test_a_batchs_vectors_are_decomposed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GROUP BY whose vectors outgrow the index's memo of coordinates (a wide cube's
    hundreds of groups): its values' solves and the copy's appends take the batch's own."""
    monkeypatch.setattr("proxy.engine.estimator._COORDINATES_MEMO", 1)
    shape = (3, 4, 2, 3)
    rng = np.random.default_rng(11)
    index = HistoryIndex(int(np.prod(shape)), shape=shape)
    history = []
    for _ in range(12):
        axes = sorted(rng.choice(4, 2, replace=False).tolist())
        history.append(_batch_query_over(shape, _cube_vector(rng, shape, axes)))
        index.append(history[-1], alpha=0.5, step=1e-3)
    groups = []
    for a in range(shape[0]):
        for b in range(shape[1]):
            tensor = np.zeros(shape)
            tensor[a, b] = 1.0
            groups.append(_batch_query_over(shape, tensor.ravel()))
    decomposed: list[LinearQuery] = []
    of_many = AnovaCoordinates.of_many

    def counted(self: AnovaCoordinates, queries: list[LinearQuery]) -> list:
        decomposed.extend(queries)
        return of_many(self, queries)

    monkeypatch.setattr(AnovaCoordinates, "of_many", counted)
    batch = index.batch(groups)
    copy = index.copy()
    for i, group in enumerate(groups):
        batch.solve(i)
        batch.measured(i, copy, copy.append(group, alpha=0.5, step=1e-3, known=batch.vectors))
    # each once; a vector the history holds (one group here) is read off its group instead
    held = {query.key for query in history}
    fresh = sorted(group.key for group in groups if group.key not in held)
    assert len(fresh) < len(groups)
    assert sorted(query.key for query in decomposed) == fresh


def test_a_batch_asked_again_solves_its_span_once_a_value_is_measured() -> None:
    """Every value cached (no solve at ``batch``): the corrections start from a solve then."""
    rng = np.random.default_rng(3)
    index, _ = _history(rng, 12, factored=False)
    groups = [LinearQuery.from_dense(np.eye(12)[k] + np.eye(12)[k + 6]) for k in range(6)]
    index.solve_many(groups)
    batch = index.batch(groups)
    assert isinstance(batch, BatchSolve) and batch._updates is None
    copy = index.copy()
    batch.measured(0, copy, copy.append(groups[0], alpha=0.3, step=1e-3))
    assert batch._updates is not None
    for i in range(1, 6):
        _same(batch.solve(i), _from_scratch(copy).solve(groups[i]), copy.size)


@pytest.mark.parametrize("fronts", [False, True])
def test_a_batchs_corrections_run_along_its_queries_columns(
    monkeypatch: pytest.MonkeyPatch, fronts: bool
) -> None:
    """y and the values are held by columns (a query's contiguous), on the span solver and
    the fronts: a measurement's rank-one corrections are then a few long runs, not one short
    run per vector (10,000 calls of OpenBLAS's dger per wide-cube GROUP BY)."""
    if fronts:
        monkeypatch.setattr("proxy.engine.estimator._FRONTS_RANK", 0)
    rng = np.random.default_rng(3)
    index, _ = _history(rng, 60, factored=True)
    assert type(index._solver()).__name__ == ("BlockFronts" if fronts else "SpanSolver")
    groups = [_batch_query(np.eye(60)[k] + np.eye(60)[k + 30], True) for k in range(6)]
    batch = index.batch(groups)
    copy = index.copy()
    batch.measured(0, copy, copy.append(groups[0], alpha=0.3, step=1e-3))
    updates = batch._updates
    assert updates is not None
    assert updates._y.flags.f_contiguous and updates._values.flags.f_contiguous
    for i in range(1, 6):
        _same(batch.solve(i), _from_scratch(copy).solve(groups[i]), copy.size)


def test_dense_blue_helper_is_the_estimators() -> None:
    """The test's dense BLUE agrees with the index on a plain history (no batch)."""
    rng = np.random.default_rng(5)
    index, rows = _history(rng, 10, factored=False)
    h = np.array([r for r, _ in rows])
    q = h[0] + h[-1]
    blue = _dense_blue(h, np.array([p for _, p in rows]), q)
    found = index.solve(LinearQuery.from_dense(q))
    assert blue is not None and found is not None
    np.testing.assert_allclose(_weights(found, index.size), blue, rtol=1e-6, atol=1e-9)


def test_a_fresh_vector_taken_as_in_the_span_has_no_coordinate_along_later_ones() -> None:
    """As the copy places it: within ``_INDEPENDENT`` of the span it is its projection there,
    and a later fresh direction (here the cell it nearly missed) gives it none."""
    index = HistoryIndex(4)
    index.append(LinearQuery.from_dense([1.0, 1.0, 0.0, 0.0]), alpha=0.5, step=1e-3)
    index.append(LinearQuery.from_dense([0.0, 0.0, 0.0, 1.0]), alpha=0.5, step=1e-3)
    near = LinearQuery.from_dense([1.0, 1.0, 1e-5, 0.0])  # 7e-6 of its norm from the span
    cell = LinearQuery.from_dense([0.0, 0.0, 1.0, 0.0])
    asked = LinearQuery.from_dense([1.0, 1.0, 1.0, 1.0])
    batch = index.batch([near, cell, asked])
    copy = index.copy()
    batch.measured(0, copy, copy.append(near, alpha=5.0, step=1e-3))
    batch.measured(1, copy, copy.append(cell, alpha=0.1, step=1e-3))
    assert batch._updates is not None
    _same(batch.solve(2), _from_scratch(copy).solve(asked), copy.size)


def test_a_fresh_group_by_over_many_cells_is_corrected_to_its_end() -> None:
    """Forty fresh groups over 32,768 cells, then their sum: the directions' coordinates come
    from the remainders' inner products, so however many cells the later groups weigh the
    batch is corrected to its end (a remainder over the cells corrected per direction and
    later group was given up past 2^20 products), each value as the copy solves it."""
    n = 2**15
    index = HistoryIndex(n)
    index.append(LinearQuery.from_dense(np.ones(n)), alpha=1.0, step=1e-3)
    groups = [np.zeros(n) for _ in range(40)]
    for k, cells in enumerate(np.array_split(np.arange(n), 40)):
        groups[k][cells] = 1.0 + k % 3
    queries = [LinearQuery.from_dense(q) for q in [*groups, sum(groups[:39])]]
    batch = index.batch(queries)
    copy = index.copy()
    for i, query in enumerate(queries[:40]):
        _same(batch.solve(i), _from_scratch(copy).solve(query), copy.size)
        batch.measured(i, copy, copy.append(query, alpha=0.5 + i % 4, step=1e-3))
    assert batch._updates is not None
    found = batch.solve(40)
    assert found is not None and found.residual < 1e-12
    _same(found, _from_scratch(copy).solve(queries[40]), copy.size)


def test_a_fresh_direction_near_the_batchs_earlier_ones_is_solved_on_the_copy() -> None:
    """A fresh vector whose remainder the batch's earlier direction nearly takes (0.25% of its
    square left) still joins the span; the later queries' coordinates along it would carry
    the remainders' rounding over that share, so the copy decides them."""
    index = HistoryIndex(4)
    index.append(LinearQuery.from_dense([1.0, 1.0, 0.0, 0.0]), alpha=1.0, step=1e-3)
    cell = LinearQuery.from_dense([0.0, 0.0, 1.0, 0.0])
    near = LinearQuery.from_dense([0.0, 0.0, 1.0, 0.05])
    asked = LinearQuery.from_dense([1.0, 1.0, 1.0, 1.0])
    batch = index.batch([cell, near, asked])
    copy = index.copy()
    batch.measured(0, copy, copy.append(cell, alpha=0.5, step=1e-3))
    assert batch._updates is not None
    _same(batch.solve(1), _from_scratch(copy).solve(near), copy.size)
    batch.measured(1, copy, copy.append(near, alpha=0.5, step=1e-3))
    assert batch._updates is None
    _same(batch.solve(2), _from_scratch(copy).solve(asked), copy.size)


def test_corrected_solves_on_the_fronts_are_the_copys(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fronts forced (``_FRONTS_RANK`` = 0): the corrections in their coordinates ``w``
    (proxy.engine.fronts, ``BlockFronts.solve_batch``) against the copy rotating each measured
    row in, inside the span and outside it."""
    monkeypatch.setattr("proxy.engine.estimator._FRONTS_RANK", 0)
    corrected = sum(_run(seed, True) for seed in range(60))
    assert corrected > 100


def _cube_vector(rng: np.random.Generator, shape: tuple[int, ...], axes: list[int]) -> np.ndarray:
    """Over ``axes``: a group (one level), a range or small integers; ones over the others."""
    tensor = np.ones(())
    for d, n in enumerate(shape):
        f = np.ones(n)
        if d in axes:
            kind = rng.random()
            f = np.zeros(n)
            if kind < 0.4:
                f[int(rng.integers(n))] = 1.0
            elif kind < 0.8:
                low = int(rng.integers(n))
                f[low : int(rng.integers(low, n)) + 1] = 1.0
            else:
                f = rng.integers(-2, 3, n).astype(float)
        tensor = np.multiply.outer(tensor, f)
    if not np.any(tensor):
        tensor.flat[0] = 1.0
    return tensor.ravel()


def test_a_cubes_group_by_on_the_fronts_is_corrected_as_the_copy_solves_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Marginals over a 4-dimension cube (several ANOVA blocks, fronts of partial rank), then a
    GROUP BY over two dimensions with sums and repeats: its groups inside the span, and fresh
    ones that join it as new directions of the fronts, each against the copy."""
    monkeypatch.setattr("proxy.engine.estimator._FRONTS_RANK", 0)
    shape = (3, 4, 2, 3)
    n = int(np.prod(shape))
    corrected = directions = 0
    for seed in range(16):
        rng = np.random.default_rng(100 + seed)
        index = HistoryIndex(n, shape=shape)
        rows = []
        for _ in range(int(rng.integers(10, 40))):
            axes = sorted(rng.choice(4, int(rng.integers(1, 4)), replace=False).tolist())
            h = _cube_vector(rng, shape, axes)
            query = _batch_query_over(shape, h)
            alpha = float(rng.choice([0.05, 0.5, 3.0]))
            index.append(query, alpha=alpha, step=1e-3)
            rows.append((h, alpha / query.sensitivity))
        first, second = sorted(rng.choice(4, 2, replace=False).tolist())
        groups = []
        for a in range(shape[first]):
            for b in range(shape[second]):
                tensor = np.zeros(shape)
                at = [slice(None)] * 4
                at[first], at[second] = a, b
                tensor[tuple(at)] = 1.0
                groups.append(tensor.ravel())
        groups += [groups[0] + groups[1], rows[0][0], groups[2]]
        dense = [_batch_query_over(shape, q) for q in groups]
        assert index.rank and index._fronts is not None
        done, joined = _measured_in_order(rng, index, rows, dense)
        corrected += done
        directions += joined
    assert corrected > 100 and directions > 20


def _batch_query_over(shape: tuple[int, ...], q: np.ndarray) -> LinearQuery:
    return LinearQuery.from_tensor(shape, q.reshape(1, *shape))


def test_a_fresh_vector_near_the_fronts_span_is_solved_on_the_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On the fronts a fresh vector within ``_RANK`` of the span is in it, one past the
    estimable residual joins it (a new direction, as the copy's front takes it), and one in
    between stops the corrections: the copy decides it."""
    monkeypatch.setattr("proxy.engine.estimator._FRONTS_RANK", 0)
    shape = (4,)
    for distance, joins in ((1e-12, False), (7e-6, True), (1e-8, None)):
        index = HistoryIndex(4, shape=shape)
        index.append(_batch_query_over(shape, np.array([1.0, 1, 0, 0])), alpha=0.5, step=1e-3)
        index.append(_batch_query_over(shape, np.array([0.0, 0, 0, 1])), alpha=0.5, step=1e-3)
        near = _batch_query_over(shape, np.array([1.0, 1.0, distance, 0.0]))
        asked = [_batch_query_over(shape, np.array(q)) for q in ([1.0, 1, 1, 1], [0.0, 0, 1, 0])]
        batch = index.batch([near, *asked])
        assert index._fronts is not None and batch._updates is not None
        copy = index.copy()
        batch.measured(0, copy, copy.append(near, alpha=5.0, step=1e-3))
        updates = batch._updates
        assert (updates is None) == (joins is None)
        if updates is not None:
            assert (updates._dims > updates._rank) == joins
        for i, query in enumerate(asked, 1):
            _same(batch.solve(i), _from_scratch(copy).solve(query), copy.size)
