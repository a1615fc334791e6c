"""BLUEs over every history row held as their classes' weights, chunks and the cache.

A BLUE that weighs every row keeps the weights of its classes of rows (a number per class) and
derives its rows' weights and scales when read (:class:`~proxy.engine.estimator.EveryRow`); a
batch's weights are
derived a chunk of values at a time; the cache of solutions keeps a batch whole. All of it
must give, to the bit, what weights held row by row give.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from proxy.engine import estimator
from proxy.engine.engine import PrivacyEngine, QueryRequest
from proxy.engine.estimator import HistoryIndex, Solution
from proxy.engine.history import HistoryEntry
from proxy.engine.selection import error_terms, interval, intervals
from sqlmap.accuracy import AccuracyRequest
from sqlmap.vector import LinearQuery
from tests.engine.groups import first_two_dimensions

SHAPE = (4, 3, 5)


def _rows(seed: int, rows: int) -> list[tuple[LinearQuery, float]]:
    """(vector, alpha) of a history over a 4 x 3 x 5 cube: vectors repeated at a few budgets,
    some with negative factors."""
    rng = np.random.default_rng(seed)
    vectors = []
    for _ in range(120):
        axes = tuple(sorted(rng.choice(3, int(rng.integers(1, 3)), replace=False).tolist()))
        tensor = rng.random(tuple(n if d in axes else 1 for d, n in enumerate(SHAPE))) < 0.6
        tensor.flat[0] = True
        vectors.append(LinearQuery.from_tensor(SHAPE, tensor * rng.choice([1.0, 2.0, -1.0])))
    return [
        (vectors[int(rng.integers(0, len(vectors)))], float(rng.choice([0.05, 0.1, 0.2])))
        for _ in range(rows)
    ]


def _history(seed: int, rows: int = 600) -> tuple[HistoryIndex, list[LinearQuery]]:
    """That history's index, and the 12 group vectors of a GROUP BY over two dimensions."""
    index = HistoryIndex(60, shape=SHAPE)
    for vector, alpha in _rows(seed, rows):
        index.append(vector, alpha=alpha, step=1e-3)
    return index, first_two_dimensions(SHAPE)


def _stored(solution: Solution) -> Solution:
    """The same estimate with weights held row by row (what every estimate used to be)."""
    return Solution(
        solution.rows, solution.weights.copy(), solution.precisions, solution.steps,
        solution.residual,
    )  # fmt: skip


@pytest.mark.parametrize("seed", [3, 11, 29])
def test_a_blue_over_every_row_derives_what_its_weights_held_row_by_row_derive(seed: int) -> None:
    index, groups = _history(seed)
    batch = index.solve_many(groups)
    fresh = index.copy()
    fresh._solutions.clear()
    singles = [fresh.solve(group) for group in groups]  # each alone: a single value's BLUE
    answers = np.random.default_rng(seed).normal(100.0, 30.0, index.size)
    lazy = [s for s in batch + singles if s is not None and s.held < s.terms]
    assert len(lazy) > 12  # most weigh every row
    for solution in lazy:
        held = _stored(solution)
        assert solution.terms == index.size and solution.held == solution.columns.first.size
        assert np.array_equal(solution.weights, held.weights)
        assert np.array_equal(solution.scales, held.scales)
        # the shift summed vector by vector: the sum over rows regrouped
        assert solution.shift == pytest.approx(held.shift, rel=1e-13, abs=0)
        assert solution.variance == held.variance
        assert solution.estimate(answers) == held.estimate(answers)
        assert solution == solution and solution.same_as(held)
        columns = solution.columns
        assert columns is not None  # a single value's BLUE carries the classes too
        assert np.array_equal(solution.column_scales(), held.scales[columns.first])
        kept = solution.with_weights()
        assert np.array_equal(kept.scales, held.scales) and kept.widths is solution.widths
        assert not solution.weights.flags.writeable and not solution.scales.flags.writeable
        # the exact tail by classes of rows is the tail row by row, to the bit
        runs, plain = error_terms(solution), error_terms(held)
        assert np.array_equal(runs.values, plain.values)
        assert np.array_equal(runs.counts, plain.counts)
        assert interval(solution, 0.05).half_width == interval(held, 0.05).half_width


@pytest.mark.parametrize("rows", [600, 5000])  # classed row by row; all at once (a restart's)
def test_weights_read_through_the_rows_classes_are_each_rows_own_products_to_the_bit(
    rows: int,
) -> None:
    """Row ``i`` of vector ``j`` weighs ``beta_j p_i^2 f_i``: read as its class's weight, on a
    history and on a plan's copy of it appending rows (its classes extended), to the bit."""
    index, _ = _history(5, rows=rows)
    copy = index.copy()
    rng = np.random.default_rng(rows)
    for k, (vector, alpha) in enumerate([(None, 0.0), *_rows(6, 12)]):
        if vector is not None:
            copy.append(vector, alpha=alpha, step=1e-3)
        grown = index if vector is None else copy
        every, m = grown._every_row(), grown.size
        beta = rng.normal(size=(3, grown.distinct))
        beta[:, k::5] = 0.0  # (vectors a solve leaves out)
        group, precision, factor = grown._group[:m], grown._precision[:m], grown._factor[:m]
        by_row = beta[:, group] * np.square(precision) * factor
        assert np.array_equal(every.by_row(every.column_weights(beta)), by_row)
        for value in range(3):
            by_class = every.column_weights(beta[value])
            assert np.array_equal(every.by_row(by_class), by_row[value])
            scales = every.by_row(every.column_scales(by_class))
            assert np.array_equal(scales, np.abs(by_row[value]) / precision)


@pytest.mark.parametrize("seed", [3, 29])
def test_a_blue_over_every_row_weighing_some_vectors_zero_derives_what_its_other_rows_derive(
    seed: int,
) -> None:
    # The fronts leave exactly 0 the values of vectors a solve does not reach (7-9 of 2,647
    # on the demo cube at m = 100,000, 150 of the wide cube's 10,800 rows for a GROUP BY of
    # age): such a BLUE is still held over every row, its zero rows in no term, and gives
    # what the estimate listing its other rows gives. (Listed row by row it cost twice as
    # much per batch, and the batch's tails lost the history's classes of rows.)
    index, groups = _history(seed)
    rng = np.random.default_rng(seed)
    per_vector = []
    solver = index._solver()
    assert solver is not None
    for values in solver.solve_many(index._vectors(groups))[0]:
        if values is not None:
            values = values.copy()
            values[rng.choice(values.size, values.size // 10, replace=False)] = 0.0
            per_vector.append(values)
    assert len(per_vector) > 4
    found = index._solutions_of(per_vector, [0.0] * len(per_vector))
    intervals(found, [0.05] * len(found))  # the batch's quantiles, by classes of rows
    answers = rng.normal(100.0, 30.0, index.size)
    for solution in found:
        assert solution is not None and solution.held < solution.rows.size == index.size
        weights = solution.weights
        (rows,) = np.nonzero(weights)
        assert 2 <= rows.size < index.size
        listed = index.estimator(rows.astype(np.int64), weights[rows].copy(), 0.0)
        assert solution.terms == listed.terms
        assert solution.same_as(listed) and listed.same_as(solution)
        assert solution.variance == pytest.approx(listed.variance, rel=1e-13)
        assert solution.shift == pytest.approx(listed.shift, rel=1e-13)
        assert solution.estimate(answers) == pytest.approx(listed.estimate(answers), rel=1e-12)
        runs, plain = error_terms(solution), error_terms(listed)
        assert np.array_equal(runs.values, plain.values)
        assert np.array_equal(runs.counts, plain.counts)
        width = interval(listed, 0.05).half_width
        assert interval(solution, 0.05).half_width == pytest.approx(width, rel=1e-11)


def test_a_batch_derived_a_value_at_a_time_is_the_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    index, groups = _history(5)
    whole = index.copy()
    whole._solutions.clear()
    together = whole.solve_many(groups)
    monkeypatch.setattr(estimator, "_CHUNK_TERMS", 1)  # one value per chunk
    chunked = index.copy()
    chunked._solutions.clear()
    apart = chunked.solve_many(groups)
    for a, b in zip(together, apart):
        assert (a is None) == (b is None)
        if a is not None and b is not None:
            assert np.array_equal(a.rows, b.rows) and np.array_equal(a.weights, b.weights)
            assert a.shift == b.shift  # (each value's row contiguous, as a dot product reads it)
            assert a.columns is not None and b.columns is not None
            assert np.array_equal(a.columns.first, b.columns.first)


def test_a_batch_larger_than_the_cache_finds_all_of_its_blues_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # At 100,000 rows a GROUP BY's BLUEs outgrew the cache's bound in terms, so each one asked
    # again evicted the next: every value was solved again. The bound now never drops a
    # batch's own, and evicts older entries first.
    index, groups = _history(7)
    other = [LinearQuery.from_tensor(SHAPE, np.ones((4, 1, 1)))]
    index.solve_many(other)
    monkeypatch.setattr(estimator, "_CACHE_SIZE", 4)
    monkeypatch.setattr(estimator, "_CACHE_TERMS", 10)
    first = index.solve_many(groups)
    again = index.solve_many(groups)
    assert all(a is b for a, b in zip(first, again))
    assert len(index._solutions) == len(groups)  # the older entry went, the batch stayed
    index.solve_many(other)  # a later solve drops the batch's to fit its bounds
    assert list(index._solutions.values()) == index.solve_many(other)


def test_a_group_by_planned_again_on_a_large_history_reuses_its_blues_and_decides_alike(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # an engine whose cache bound a GROUP BY's BLUEs exceed (as at 100,000 rows): planned
    # again, it finds every BLUE and decides exactly as the first time and as a fresh engine
    monkeypatch.setattr(estimator, "_CACHE_TERMS", 300)  # a few BLUEs' coefficients
    monkeypatch.setattr(estimator, "_CHUNK_TERMS", 2_000)  # chunks of a few values
    entries = [
        HistoryEntry("t", vector, Fraction(alpha), Fraction(1, 1024), 50.0 + k % 7)
        for k, (vector, alpha) in enumerate(_rows(13, 1_500))
    ]
    total = Fraction(1000)
    engine = PrivacyEngine("t", 60, total_budget=total, history=entries, shape=SHAPE)
    requests = [QueryRequest(g, AccuracyRequest(40.0, 0.05)) for g in first_two_dimensions(SHAPE)]
    first = engine.plan(requests)
    cached = dict(engine._index._solutions)
    again = engine.plan(requests)
    assert dict(engine._index._solutions).keys() == cached.keys()
    assert all(engine._index._solutions[k] is v for k, v in cached.items())
    assert all(d.history is not None for d in first.decisions)
    monkeypatch.undo()  # a fresh engine at the usual bounds: whole chunks, the usual cache
    plain = PrivacyEngine("t", 60, total_budget=total, history=entries, shape=SHAPE)
    for a, b in [
        *zip(first.decisions, again.decisions),
        *zip(first.decisions, plain.plan(requests).decisions),
    ]:
        assert (a.source, a.budget, a.half_width, a.confidence, a.basis) == (
            b.source, b.budget, b.half_width, b.confidence, b.basis,
        )  # fmt: skip


def test_a_copy_and_its_original_appending_different_rows_each_weigh_their_own() -> None:
    # p_i^2 is kept in a buffer each index extends in place as rows arrive: a plan's copy
    # appending its values, and the original appending other rows after the copy was made,
    # must each weigh their own rows (a buffer shared between them would mix the two)
    index, groups = _history(17, rows=300)
    index.solve_many(groups)  # the original's buffer holds its 300 rows
    index.append(groups[0], alpha=0.2, step=1e-3)
    index.solve_many(groups)  # ... and 301, with room for 600
    copy = index.copy()
    copy.solve_many(groups)
    for k in range(3):
        copy.append(groups[k], alpha=0.5, step=1e-3)
        index.append(groups[k + 3], alpha=0.01 * (k + 1), step=1e-3)
        index.append(groups[k], alpha=3.0, step=1e-3)
        for history in (copy, index):
            m = history.size
            squared = np.square(history._precision[:m])
            solver = history._solver()
            assert solver is not None
            per_vector, _ = solver.solve_many(history._vectors(groups))
            for solution, beta in zip(history.solve_many(groups), per_vector):
                assert solution is not None and solution.terms == m and beta is not None
                weights = beta[history._group[:m]] * squared * history._factor[:m]
                assert np.array_equal(solution.weights, weights)


@pytest.mark.parametrize("seed", [2, 17])
def test_a_mixture_with_a_blue_over_every_row_is_the_general_combination_to_the_bit(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """combine() adds into the BLUE's rows in place of sorting them all: the same estimate."""
    index, _ = _history(seed)
    rng = np.random.default_rng(seed)
    mixtures = []
    for vector, _ in _rows(seed, 40):  # measured vectors: their repeats weigh some rows
        blue, repeats = index.solve(vector), index.repeats(vector)
        if blue is None or blue.held == blue.terms:
            continue
        for repeat in repeats:
            lam = float(rng.uniform(0.0, 1.0))
            mixtures.append([(1.0 - lam, repeat), (lam, blue)])
            mixtures.append([(lam, blue), (1.0 - lam, repeat)])
        mixtures.append([(0.5, blue), (0.5, blue)])
    assert sum(m[0][1] is not m[1][1] for m in mixtures) > 12
    fast = [estimator.combine(parts) for parts in mixtures]
    monkeypatch.setattr(estimator, "_every_row_part", lambda parts: None)  # always sort
    for parts, found in zip(mixtures, fast):
        general = estimator.combine(parts)
        for field in ("rows", "weights", "precisions", "steps", "scales"):
            assert np.array_equal(getattr(found, field), getattr(general, field)), field
        assert found.rows.dtype == general.rows.dtype
        assert (found.shift, found.residual) == (general.shift, general.residual)


@pytest.mark.parametrize("seed", [3, 11])
def test_the_rows_extended_as_they_arrive_are_those_read_afresh_to_the_bit(seed: int) -> None:
    """A history's rows as its BLUEs read them, extended by the rows since (a plan's copy
    appending a GROUP BY's values one at a time, the original appending others after it),
    hold what reading all of them afresh holds, to the bit."""
    index, _ = _history(seed, rows=300)
    index._every_row()
    copy = index.copy()
    rows = _rows(seed + 1, 40)
    in_place = 0
    for k, (vector, alpha) in enumerate(rows):
        for grown in (copy, index) if k % 3 else (copy,):
            grown.append(vector, alpha=alpha, step=1e-3 * (1 + k % 2))
            previous = grown._every
            every = grown._every_row()
            assert previous is not None
            # the classes' arrays extended in place (a copy's values one at a time) ...
            in_place += every._by_class is previous._by_class
            m = grown.size
            afresh = estimator.EveryRow(
                grown._group[:m], grown._precision[:m], grown._factor[:m], grown._steps[:m],
                every.columns, grown._squares(m),
            )  # fmt: skip
            extended = estimator.EveryRow(
                grown._group[:m], grown._precision[:m], grown._factor[:m], grown._steps[:m],
                every.columns, grown._squares(m), previous=previous,
            )  # fmt: skip
            # ... but never by two extensions of one history's: the second copies them
            added = every.columns.first.size > previous.columns.first.size
            assert not added or extended._by_class is not every._by_class
            for held in (every, extended):
                assert np.array_equal(held._lattice, afresh._lattice)
                assert all(np.array_equal(a, b) for a, b in zip(held._of, afresh._of))
            # (the earlier rows' classes as they were)
            assert all(np.array_equal(a, b[: a.size]) for a, b in zip(previous._of, afresh._of))
    assert in_place > 10
