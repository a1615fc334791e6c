"""The BLUE from history: the papers' worked example, and agreement with dense GLS."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.engine.estimator import HistoryIndex, combine
from sqlmap.vector import LinearQuery
from tests.engine.groups import first_two_dimensions
from tests.paper_examples import (
    EIGHT_BY_FOUR_ALPHA,
    EIGHT_BY_FOUR_H,
    EIGHT_BY_FOUR_Y,
    RUNNING_ALPHA,
    RUNNING_H,
    RUNNING_Q,
)

# "Bayesian inference under DP", eqs. (11)-(14): H, alpha and the noisy answers y.
PAPER_H = np.array(EIGHT_BY_FOUR_H, dtype=float)
PAPER_ALPHA = [float(a) for a in EIGHT_BY_FOUR_ALPHA]
PAPER_Y = np.array(EIGHT_BY_FOUR_Y)


def _index(h: np.ndarray, alpha: list[float]) -> HistoryIndex:
    index = HistoryIndex(h.shape[1])
    for row, a in zip(h, alpha):
        index.append(LinearQuery.from_dense(row), alpha=a, step=1e-3)
    return index


def _dense_blue(h: np.ndarray, alpha: np.ndarray, q: np.ndarray) -> np.ndarray | None:
    """t = argmin sum (t_i S_i/alpha_i)^2 subject to t H = q, by a dense pseudo-inverse."""
    d = alpha / np.abs(h).max(axis=1)
    a = (d[:, None] * h).T
    u = np.linalg.pinv(a) @ q
    if np.linalg.norm(a @ u - q) > 1e-9 * np.linalg.norm(q):
        return None
    return u * d


def test_papers_eight_by_four_example() -> None:
    index = _index(PAPER_H, PAPER_ALPHA)
    estimates = []
    for j in range(4):
        solution = index.solve(LinearQuery.from_dense(np.eye(4)[j]))
        assert solution is not None
        estimates.append(solution.estimate(PAPER_Y))
    assert np.round(estimates, 2).tolist() == [24.99, 10.18, 17.02, 19.50]

    solution = index.solve(LinearQuery.from_dense([1.0, 0.0, 1.0, 0.0]))
    assert solution is not None
    assert round(solution.estimate(PAPER_Y), 1) == 42.0
    weights = np.zeros(8)
    weights[solution.rows] = solution.weights
    # eq. (26); the paper rounds 0.477, 0.364, -0.033, 0.495, 0.262, 0.238 to two places
    assert np.round(weights, 2).tolist() == pytest.approx(
        [0.48, 0.36, -0.03, 0.50, -0.50, 0.26, 0.07, 0.24], abs=0.011
    )
    # b_k = |t_k| S_k / alpha_k, and eq. (17): Var = 2 sum b_k^2 = 2 Q (H^T W H)^-1 Q^T
    s = np.abs(PAPER_H).max(axis=1)
    assert solution.scales == pytest.approx(np.abs(weights) * s / PAPER_ALPHA)
    w = np.diag((np.array(PAPER_ALPHA) / s) ** 2)
    q = np.array([1.0, 0.0, 1.0, 0.0])
    assert solution.variance == pytest.approx(2 * q @ np.linalg.inv(PAPER_H.T @ w @ PAPER_H) @ q)


def test_running_example_query_is_estimable_but_a_lone_cell_is_not() -> None:
    # "Online query answering", eq. (10): x5 + x6 has linear representations (eqs. 20-27).
    h = np.array(RUNNING_H, dtype=float)
    index = _index(h, [float(a) for a in RUNNING_ALPHA])
    q = np.array(RUNNING_Q, dtype=float)
    solution = index.solve(LinearQuery.from_dense(q))
    assert solution is not None
    weights = np.zeros(7)
    weights[solution.rows] = solution.weights
    assert weights @ h == pytest.approx(q, abs=1e-12)
    assert index.solve(LinearQuery.from_dense(np.eye(9)[0])) is None  # cell 1: never touched
    assert index.solve(LinearQuery.from_dense(np.eye(9)[7])) is None  # covered, not estimable


def test_zero_query_is_exact_and_free() -> None:
    solution = HistoryIndex(3).solve(LinearQuery.from_dense([0.0, 0.0, 0.0], offset=4.0))
    assert solution is not None and solution.rows.size == 0 and solution.variance == 0


@st.composite
def _histories(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    n = draw(st.integers(2, 7))
    m = draw(st.integers(1, 45))  # crosses the factorization/bordering switch-over points
    values = st.sampled_from([-2.0, -1.0, 1.0, 1.0, 1.0, 2.0, 0.5])
    rows = []
    for _ in range(m):
        cells = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=3, unique=True))
        row = np.zeros(n)
        row[cells] = [draw(values) for _ in cells]
        rows.append(row)
    alpha = np.array([draw(st.sampled_from([0.01, 0.1, 0.3, 1.0])) for _ in range(m)])
    queries = [np.array([draw(st.sampled_from([0.0, 0.0, 1.0, -1.0, 3.0])) for _ in range(n)])]
    queries.append(rows[draw(st.integers(0, m - 1))] + rows[draw(st.integers(0, m - 1))])
    return np.array(rows), alpha, queries


@settings(max_examples=80, deadline=None)
@given(history=_histories(), solve_every=st.integers(1, 9))
def test_blue_matches_dense_gls(
    history: tuple[np.ndarray, np.ndarray, list[np.ndarray]], solve_every: int
) -> None:
    h, alpha, queries = history
    index = HistoryIndex(h.shape[1])
    for i, (row, a) in enumerate(zip(h, alpha)):
        index.append(LinearQuery.from_dense(row), alpha=float(a), step=1e-3)
        if i % solve_every == 0:  # solving mid-way factorizes, later rows then border it
            index.solve(LinearQuery.from_dense(row))
    for q in queries:
        if not q.any():
            continue
        expected = _dense_blue(h, alpha, q)
        solution = index.solve(LinearQuery.from_dense(q))
        assert (solution is None) == (expected is None)
        if solution is not None and expected is not None:
            weights = np.zeros(len(h))
            weights[solution.rows] = solution.weights
            assert weights == pytest.approx(expected, abs=1e-9 * np.abs(expected).max())


def test_copy_is_independent() -> None:
    index = _index(PAPER_H[:2], PAPER_ALPHA[:2])
    q = LinearQuery.from_dense([1.0, 1.0, 1.0, 1.0])
    assert index.solve(q) is not None
    scratch = index.copy()
    scratch.append(LinearQuery.from_dense([1.0, 0.0, 0.0, 0.0]), alpha=0.5, step=1e-3)
    assert scratch.solve(LinearQuery.from_dense([1.0, 0.0, 0.0, 0.0])) is not None
    assert index.solve(LinearQuery.from_dense([1.0, 0.0, 0.0, 0.0])) is None
    assert index.size == 2 and scratch.size == 3


def test_repeats_are_the_rows_proportional_to_the_query() -> None:
    index = HistoryIndex(4)
    rows = (
        [1.0, 2.0, 0.0, 0.0],
        [2.0, 4.0, 0.0, 0.0],
        [1.0, 1.0, 0.0, 0.0],
        [-0.5, -1.0, 0.0, 0.0],
    )
    for row, alpha in zip(rows, (0.1, 0.3, 0.2, 0.4)):
        index.append(LinearQuery.from_dense(row), alpha=alpha, step=1e-3)
    query = LinearQuery.from_dense([1.0, 2.0, 0.0, 0.0], offset=7.0)  # the offset is no matter
    *singles, pooled = index.repeats(query)
    # one by one, least noisy first: b = |t| S / alpha, the query's own scale at each measurement
    assert [int(r.rows[0]) for r in singles] == [3, 1, 0]
    assert [float(r.weights[0]) for r in singles] == [-2.0, 0.5, 1.0]  # t H_i = q exactly
    assert [float(r.scales[0]) for r in singles] == pytest.approx([5.0, 20.0 / 3, 20.0])
    assert [r.shift for r in singles] == pytest.approx([2e-3, 0.5e-3, 1e-3])
    # pooled: inverse-variance weights over the three rows, the BLUE over them alone
    precision = np.array([1 / 20.0**2, 1 / (20.0 / 3) ** 2, 1 / 5.0**2])
    assert pooled.rows.tolist() == [0, 1, 3]
    assert pooled.weights == pytest.approx(precision / precision.sum() * [1.0, 0.5, -2.0])
    assert pooled.variance == pytest.approx(2 / precision.sum())
    assert index.repeats(LinearQuery.from_dense([0.0, 0.0, 1.0, 0.0])) == ()
    scratch = index.copy()
    scratch.append(LinearQuery.from_dense([3.0, 6.0, 0.0, 0.0]), alpha=0.1, step=1e-3)
    assert len(scratch.repeats(query)) == 5 and len(index.repeats(query)) == 4


def test_a_repeat_of_one_row_is_what_the_estimate_of_its_row_holds_to_the_bit() -> None:
    # (a repeat of one row is made without the constructor's checks and derivations)
    from proxy.engine.estimator import Solution

    rng = np.random.default_rng(4)
    index = HistoryIndex(3)
    for _ in range(40):
        factor = float(rng.choice([1.0, -0.5, 3.0, 0.1]))
        index.append(
            LinearQuery.from_dense([factor, 2 * factor, 0.0]),
            alpha=float(rng.uniform(0.01, 2.0)),
            step=float(rng.choice([1e-3, 2.5e-4, 0.1])),
        )
    *singles, _ = index.repeats(LinearQuery.from_dense([0.3, 0.6, 0.0]))
    assert len(singles) == 4
    for single in singles:
        made = Solution(
            single.rows.copy(),
            single.weights.copy(),
            single.precisions.copy(),
            single.steps.copy(),
            residual=single.residual,
        )
        for field in ("rows", "weights", "precisions", "steps", "scales"):
            assert np.array_equal(getattr(single, field), getattr(made, field)), field
            assert not getattr(single, field).flags.writeable
        assert single.rows.dtype == made.rows.dtype
        assert (single.shift, single.terms, single.residual) == (
            made.shift,
            made.terms,
            made.residual,
        )


def test_only_the_four_least_noisy_repeats_come_one_by_one() -> None:
    index = HistoryIndex(2)
    alphas = [0.1, 0.5, 0.2, 0.9, 0.3, 0.05, 0.7]
    for alpha in alphas:
        index.append(LinearQuery.from_dense([1.0, 1.0]), alpha=alpha, step=1e-3)
    *singles, pooled = index.repeats(LinearQuery.from_dense([1.0, 1.0]))
    assert [int(r.rows[0]) for r in singles] == [3, 6, 1, 4]
    assert pooled.rows.tolist() == list(range(7))
    assert pooled.weights == pytest.approx(np.square(alphas) / np.square(alphas).sum())


def test_affine_combinations_stay_unbiased() -> None:
    index = _index(PAPER_H, PAPER_ALPHA)
    query = LinearQuery.from_dense([1.0, 1.0, 0.0, 0.0])
    blue = index.solve(query)
    (repeat,) = index.repeats(query)  # one row: no pooled estimate
    assert blue is not None and not blue.same_as(repeat)
    for lam in (0.0, 0.3, 1.0):
        mixed = combine([(1 - lam, repeat), (lam, blue)])
        weights = np.zeros(len(PAPER_H))
        weights[mixed.rows] = mixed.weights
        assert weights @ PAPER_H == pytest.approx([1.0, 1.0, 0.0, 0.0], abs=1e-12)
        s = np.abs(PAPER_H).max(axis=1)
        assert mixed.scales == pytest.approx(
            np.abs(mixed.weights) * s[mixed.rows] / np.array(PAPER_ALPHA)[mixed.rows]
        )
        assert mixed.shift == pytest.approx(1e-3 * np.abs(mixed.weights).sum())
    assert combine([(1.0, repeat)]).same_as(repeat)
    assert combine([(0.0, repeat), (1.0, blue)]).same_as(blue)


def _group_by_history(rng: np.random.Generator) -> tuple[HistoryIndex, list[LinearQuery]]:
    """A factored history over a 4 x 3 x 5 cube (vectors repeated at a few budgets), and the
    12 group vectors of a GROUP BY over its first two dimensions."""
    shape = (4, 3, 5)
    index = HistoryIndex(60, shape=shape)
    vectors = []
    for _ in range(120):
        axes = tuple(sorted(rng.choice(3, int(rng.integers(1, 3)), replace=False).tolist()))
        tensor = rng.random(tuple(n if d in axes else 1 for d, n in enumerate(shape))) < 0.6
        tensor.flat[0] = True
        vectors.append(LinearQuery.from_tensor(shape, tensor * rng.choice([1.0, 2.0])))
    for _ in range(500):
        vector = vectors[int(rng.integers(0, len(vectors)))]
        index.append(vector, alpha=float(rng.choice([0.05, 0.1, 0.2])), step=1e-3)
    return index, first_two_dimensions(shape)


def _row_classes_hold(solutions: list) -> None:  # type: ignore[type-arg]
    columns = solutions[0].columns
    assert columns is not None and all(s.columns is columns for s in solutions)
    m = solutions[0].rows.size
    assert columns.counts.sum() == m
    # each row's scale is its class's first row's in every solution: the classes are equal
    # columns (distinct classes may still have equal columns: the tails take them apart)
    scales = np.stack([s.scales for s in solutions])
    first = columns.first.tolist()
    assert first == sorted(first) and first[0] == 0
    expanded = np.concatenate(
        [np.flatnonzero(np.all(scales == scales[:, [k]], axis=0)) for k in first]
    )
    assert np.unique(expanded).size == m  # every row is in a class whose column it equals
    for k, count in zip(first, columns.counts.tolist()):
        assert np.count_nonzero(np.all(scales == scales[:, [k]], axis=0)) >= count


def test_a_batch_of_blues_is_each_blue_to_the_bit_and_shares_its_row_classes() -> None:
    rng = np.random.default_rng(41)
    index, groups = _group_by_history(rng)
    together = index.solve_many(groups)
    for group, batch in zip(groups, together):
        alone = index.copy()
        alone._solutions.clear()  # solved afresh, on its own
        (single,) = alone.solve_many([group])
        assert (batch is None) == (single is None)
        if batch is None or single is None:
            continue
        assert np.array_equal(batch.rows, single.rows)
        # the span solves of a batch and of one vector round differently (matrix products)
        np.testing.assert_allclose(
            batch.weights, single.weights, rtol=0, atol=1e-12 * np.abs(single.weights).max()
        )
        # what a solution derives from its weights, a batch derives to the bit (its shift
        # summed vector by vector: to rounding)
        built = index.estimator(batch.rows, batch.weights.copy(), batch.residual)
        assert np.array_equal(built.precisions, batch.precisions)
        assert np.array_equal(built.steps, batch.steps)
        assert np.array_equal(built.scales, batch.scales)
        assert built.shift == pytest.approx(batch.shift, rel=1e-13, abs=0)
    solutions = [s for s in together if s is not None]
    assert len(solutions) > 4
    _row_classes_hold(solutions)
    # rows appended to a copy extend its classes (a new vector, and a known one at a known
    # budget), and leave the original's as they were
    copy = index.copy()
    copy.append(groups[0], alpha=0.1, step=1e-3)
    copy.append(LinearQuery.from_tensor((4, 3, 5), np.ones((1, 1, 5))), alpha=0.1, step=1e-3)
    grown = [s for s in copy.solve_many(groups) if s is not None]
    _row_classes_hold(grown)
    assert grown[0].columns is not None and grown[0].columns.counts.sum() == index.size + 2
    assert solutions[0].columns is not None
    assert index.solve_many(groups)[0].columns is solutions[0].columns  # type: ignore[union-attr]


def test_a_statements_coordinates_are_kept_whole_though_they_outgrow_the_memo(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 12 groups of 20 coordinates each, the memo bounded to 30: the batch's values are asked
    # for again one by one (its corrected solves, its measured rows), and find what the batch
    # decomposed; the next statement drops the oldest, down to the bound
    monkeypatch.setattr("proxy.engine.estimator._COORDINATES_MEMO", 30)
    index, groups = _group_by_history(np.random.default_rng(43))
    together = index._vectors(groups)
    assert sum(coords.size for coords, _ in together) == 240
    for group, (coords, values) in zip(groups, together):
        again = index._vector(group)
        assert again[0] is coords and again[1] is values
    later = index._vector(LinearQuery.from_tensor((4, 3, 5), np.arange(5.0) + 1.0))
    assert index._memo_size[0] == sum(c.size for c, _ in index._memo.values()) <= 30
    assert list(index._memo.values())[-1] is later


def test_a_restarts_vectors_asked_again_are_read_off_their_groups() -> None:
    # the restart's coordinates are held by its groups, not the memo: a dashboard asking its
    # statements again after a restart finds them there rather than decomposing them anew
    shape = (4, 3, 5)
    rng = np.random.default_rng(44)
    counts = []
    for axes in ((0,), (1, 2), (0, 2), (0, 1, 2)):
        tensor = rng.random([n if d in axes else 1 for d, n in enumerate(shape)]) < 0.5
        tensor.flat[0] = True
        counts.append(LinearQuery.from_tensor(shape, tensor.astype(float)))
    doubled = LinearQuery.from_tensor(shape, 2.0 * counts[0].tensor())  # factor 2: its own
    index = HistoryIndex(60, shape=shape)
    index.load([(query, 0.1, 1e-3) for query in [*counts, doubled, counts[1]]])
    assert index.distinct == len(counts) and not index._memo
    assert index._coordinates is not None
    for group, query in enumerate(counts):
        coords, values = index._vector(query)
        assert coords is index._group_vectors[group][0]
        assert values is index._group_vectors[group][1]
        expected = index._coordinates.of(query)
        assert np.array_equal(coords, expected[0]) and np.array_equal(values, expected[1])
    coords, values = index._vector(doubled)
    assert values is not index._group_vectors[0][1]
    assert np.array_equal(values, index._coordinates.of(doubled)[1])


def test_classes_of_a_whole_history_at_once_are_those_found_row_by_row() -> None:
    # A restart's rows are classed by sorting a hash of their keys, later rows one by one;
    # both must give the classes a plain dictionary over (vector, precision, factor) gives.
    from proxy.engine.estimator import _BULK_CLASSES, _RowClasses

    rng = np.random.default_rng(8)
    m = 3 * _BULK_CLASSES
    group = rng.integers(0, 900, m)
    precision = rng.choice([0.05, 0.1, 0.2, 0.3], 900)[group] * rng.choice([1.0, 1.0, 2.0], m)
    factor = rng.choice([1.0, 1.0, 2.0, -1.0], m)
    seen: dict[tuple[int, float, float], int] = {}
    first: list[int] = []
    counts: list[int] = []
    for row, key in enumerate(zip(group.tolist(), precision.tolist(), factor.tolist())):
        found = seen.setdefault(key, len(first))
        if found == len(first):
            first.append(row)
            counts.append(0)
        counts[found] += 1
    of_row = [seen[key] for key in zip(group.tolist(), precision.tolist(), factor.tolist())]
    at_once = _RowClasses().of(group, precision, factor)
    assert at_once.first.tolist() == first and at_once.counts.tolist() == counts
    assert at_once.of_row.tolist() == of_row
    growing = _RowClasses()
    for cut in (_BULK_CLASSES + 1, _BULK_CLASSES + 2, 2 * _BULK_CLASSES, m):
        classes = growing.of(group[:cut], precision[:cut], factor[:cut])
        assert classes.of_row.tolist() == of_row[:cut]
    assert classes.first.tolist() == first and classes.counts.tolist() == counts


def test_repeat_estimates_are_kept_until_a_row_of_their_cells_arrives() -> None:
    # a dashboard's GROUP BY asks the same groups again: their pooled repeats (and the
    # intervals found for them) are the same objects until the history adds a row over the
    # same cells, in this index or, independently, in a copy of it
    index = HistoryIndex(3)
    for row, alpha in (([1, 1, 0], 1.0), ([2, 2, 0], 2.0), ([0, 1, 1], 1.0)):
        index.append(LinearQuery.from_dense(row), alpha=alpha, step=0.01)
    query = LinearQuery.from_dense([1.0, 1.0, 0.0])
    first = index.repeats(query)
    assert [r.rows.tolist() for r in first] == [[1], [0], [0, 1]]
    assert index.repeats(LinearQuery.from_dense([1.0, 1.0, 0.0])) is first
    index.append(LinearQuery.from_dense([0, 1, 1]), alpha=3.0, step=0.01)  # other cells
    assert index.repeats(query) is first
    copy = index.copy()
    copy.append(LinearQuery.from_dense([3, 3, 0]), alpha=1.0, step=0.01)  # row 4 of the copy
    index.append(LinearQuery.from_dense([1, 2, 0]), alpha=1.0, step=0.01)  # row 4: not a repeat
    in_copy, in_index = copy.repeats(query), index.repeats(query)
    assert [r.rows.tolist() for r in in_copy] == [[1], [0], [4], [0, 1, 4]]
    assert [r.rows.tolist() for r in in_index] == [[1], [0], [0, 1]]
    assert in_index is not first
    assert [r.rows.tolist() for r in copy.repeats(query)] == [[1], [0], [4], [0, 1, 4]]
    for found, again in zip(in_index, first):  # the same estimates, found again
        assert np.array_equal(found.weights, again.weights)


def test_a_loaded_history_holds_what_its_rows_appended_one_by_one_hold() -> None:
    # A restart appends its rows in bulk, a vector's work once for the rows that share its
    # object (as a ledger's load gives them); the rows, groups (a multiple of a vector is its
    # group), repeats' supports and span weights must be those of appending row by row.
    rng = np.random.default_rng(5)
    shape = (4, 3, 5)
    vectors = [
        LinearQuery.from_tensor(shape, rng.integers(-2, 3, size).astype(float))
        for size in ((4, 1, 1), (1, 3, 5), (4, 3, 1), (1, 1, 5), (4, 1, 5))
    ]
    vectors = [v for v in vectors if not v.is_zero]
    doubled = LinearQuery.from_tensor(shape, 2.0 * vectors[0].to_dense().reshape((1, *shape)))
    rows = [
        (vectors[i] if i < len(vectors) else doubled, float(rng.choice([0.1, 0.25])), 1e-3)
        for i in rng.integers(0, len(vectors) + 1, 60).tolist()
    ]
    loaded, appended = HistoryIndex(60, shape=shape), HistoryIndex(60, shape=shape)
    loaded.load(rows)
    for query, alpha, step in rows:
        appended.append(query, alpha=alpha, step=step)
    appended.prepare()
    assert loaded.size == appended.size == 60 and loaded.distinct == appended.distinct
    for name in ("_precision", "_steps", "_factor", "_group"):
        assert np.array_equal(getattr(loaded, name), getattr(appended, name)), name
    assert loaded._by_support == appended._by_support and loaded._groups == appended._groups
    assert all(a is b for a, b in zip(loaded._weights, appended._weights, strict=True))
    assert loaded._span is not None and appended._span is not None
    assert np.array_equal(loaded._span._weight2, appended._span._weight2)  # summed in order
    for query in vectors:  # placed in bulk or at a solve: the same BLUE to rounding
        a, b = loaded.solve(query), appended.solve(query)
        assert a is not None and b is not None
        dense_a, dense_b = np.zeros(60), np.zeros(60)
        dense_a[a.rows], dense_b[b.rows] = a.weights, b.weights
        np.testing.assert_allclose(dense_a, dense_b, rtol=0, atol=1e-12 * np.abs(dense_b).max())
    # a bad row anywhere refuses the whole load, before anything is added
    empty = HistoryIndex(60, shape=shape)
    with pytest.raises(ValueError, match="positive"):
        empty.load([*rows[:5], (vectors[0], 0.0, 1e-3)])
    assert empty.size == 0 and empty.distinct == 0


def _dense_weights(solution: object, m: int) -> np.ndarray | None:
    if solution is None:
        return None
    dense = np.zeros(m)
    dense[solution.rows] = solution.weights  # type: ignore[attr-defined]
    return dense


def test_past_the_fronts_rank_a_factored_index_solves_by_fronts_as_the_span_did(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A history whose rank passes the threshold midway moves to the fronts (at a solve, or at
    # a load): ranks, estimability and BLUEs are the span solver's, and copies stay apart.
    rng = np.random.default_rng(11)
    shape = (4, 3, 5)
    n = int(np.prod(shape))

    def vector(axes: tuple[int, ...]) -> LinearQuery:
        size = [shape[d] if d in axes else 1 for d in range(3)]
        return LinearQuery.from_tensor(shape, rng.integers(-2, 3, size).astype(float))

    pool = [vector(axes) for axes in [(0,), (1,), (2,), (0, 1), (1, 2)] * 3]
    pool = [v for v in pool if not v.is_zero]
    rows = [(pool[i], float(rng.choice([0.1, 0.25])), 1e-3) for i in rng.integers(0, len(pool), 40)]
    queries = [vector(axes) for axes in [(0,), (1,), (0, 1), (1, 2), (0, 2), (0, 1, 2)]]
    added = vector((0, 2))

    def solved(index: HistoryIndex) -> list[np.ndarray | None]:
        return [_dense_weights(s, index.size) for s in index.solve_many(queries)]

    span = HistoryIndex(n, shape=shape)
    for query, alpha, step in rows[:20]:
        span.append(query, alpha=alpha, step=step)
    early, early_rank = solved(span), span.rank
    for query, alpha, step in rows[20:]:
        span.append(query, alpha=alpha, step=step)
    late = solved(span)
    grown = span.copy()
    grown.append(added, alpha=0.5, step=1e-3)
    with_added = solved(grown)
    assert span._fronts is None and early_rank is not None and span.rank is not None
    assert span.rank > early_rank

    monkeypatch.setattr("proxy.engine.estimator._FRONTS_RANK", early_rank)
    index = HistoryIndex(n, shape=shape)
    for query, alpha, step in rows[:20]:
        index.append(query, alpha=alpha, step=step)
    assert index.rank == early_rank and index._fronts is None
    found = [early, solved(index)]
    for query, alpha, step in rows[20:]:
        index.append(query, alpha=alpha, step=step)
    assert index.rank == span.rank and index.distinct == span.distinct
    assert index._span is None and index._fronts is not None
    found += [late, solved(index)]
    copy = index.copy()
    copy.append(added, alpha=0.5, step=1e-3)
    found += [with_added, solved(copy), late, solved(index)]  # the original as it was
    loaded = HistoryIndex(n, shape=shape)
    loaded.load(rows)
    assert loaded._span is None and loaded.rank == span.rank
    found += [late, solved(loaded)]
    monkeypatch.setattr("proxy.engine.estimator._FRONTS_FIRST", 0)  # the fronts tell the rank
    for part, reference, fronts_kept in ((rows, late, True), (rows[:20], early, False)):
        loaded = HistoryIndex(n, shape=shape)
        loaded.load(part)
        assert (loaded._fronts is not None) == fronts_kept == (loaded._span is None)
        found += [reference, solved(loaded)]
    for reference, fronts in zip(found[::2], found[1::2], strict=True):
        assert [w is None for w in reference] == [w is None for w in fronts]
        assert any(w is None for w in reference) and any(w is not None for w in reference)
        for a, b in zip(reference, fronts, strict=True):
            if a is not None and b is not None:
                np.testing.assert_allclose(b, a, rtol=0, atol=1e-9 * np.abs(a).max())
