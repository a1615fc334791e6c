"""Estimability of a query from the history, and its best linear unbiased estimate (BLUE).

With ``y = H x + N``, ``N_i ~ Lap(S_i / alpha_i)``, an unbiased linear estimate ``t . y`` of
``q . x`` needs ``t H = q``; its error ``sum_i t_i N_i`` has variance
``2 sum_i t_i^2 (S_i/alpha_i)^2``. Gauss-Markov (the papers' eqs. 15-17) picks the ``t`` of least
variance. Substituting ``u_i = t_i S_i / alpha_i`` turns that into the minimum-norm solution of
``(D H)^T u = q`` with ``D = diag(alpha ./ S)`` (:mod:`proxy.engine.span`, in the space the
history's vectors span); ``|u_i|`` are then exactly the Laplace scales ``b_i`` of the error.
``q`` is estimable iff that system is consistent, judged by its relative distance from the
span; a query weighing a cell no row weighs is rejected without solving.

The BLUE is not the only unbiased estimate worth having: its variance is least, but intervals
come from the exact tail of a weighted sum of Laplace noises, whose quantile is not a function
of the variance alone. :meth:`HistoryIndex.repeats` finds the rows that measured the query
itself (up to a factor), and :func:`combine` forms affine combinations of estimates, which stay
unbiased; :mod:`proxy.engine.selection` chooses among them.
"""

from __future__ import annotations

import itertools
import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from proxy.engine.factored import AnovaCoordinates
from proxy.engine.fronts import BlockFronts
from proxy.engine.snapshot import (
    FORMAT,
    Array,
    Factorization,
    FactorizationMismatch,
    Members,
    RowsDigest,
    pack,
    unpack,
)
from proxy.engine.solver import MinNormSolver
from proxy.engine.span import BatchUpdates, SpanSolver
from sqlmap.vector import LinearQuery

__all__ = [
    "Solution",
    "EveryRow",
    "RowColumns",
    "HistoryIndex",
    "BatchSolve",
    "combine",
    "ESTIMABLE_RESIDUAL",
]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

# Relative residual ||t H - q|| / ||q|| up to which q counts as in the row space of H. Distances
# from the span are computed to about 1e-8 (rounding in ||q||^2 - ||proj q||^2), so consistent
# systems land far below this and inconsistent ones far above.
ESTIMABLE_RESIDUAL = 1e-6
# A row is the query measured again when it is proportional to it up to rounding in the weights.
_REPEAT_RESIDUAL = 1e-12
# Repeat rows offered one by one (the least noisy); all of them are also offered pooled.
_REPEAT_SINGLES = 4
# The span solver keeps dense matrices of the history's rank: past this rank (rows of scattered
# cells, all independent) the index moves to the sparse solver over cells for good.
_SPAN_MAX_RANK = 1500
# A factored history past this rank moves to the fronts of ANOVA blocks (proxy.engine.fronts)
# for good: the span solver's r x r matrices cost r^2 per pass (a value reads ~8 passes, a
# restart places the basis over the coordinates), the fronts' costs follow the blocks a value
# reaches. Below it the span solver's matrices still fit the caches (a pass at rank 2,831: 1.7
# ms, at 4,645: 14.7): the demo's end-to-end history at m = 100,000 (rank 1,211) answered its
# GROUP BYs 4.7x slower on the fronts (p50 246 against 53 ms CPU; the fronts then rotated a
# batch's measured rows into a copy one by one, since corrected as the span's are: both give
# BatchUpdates). Measured in docs/benchmarks.md ("The fronts in the index", "Four branches
# merged (session 12)").
_FRONTS_RANK = 2048
# A restart with more distinct vectors than this builds the fronts first, to learn whether its
# rank passes _FRONTS_RANK (11 s at the wide cube's m = 10,000, 6,178 vectors, where placing the
# span took 86 s); with fewer it places the span (the demo cube's 1,972 vectors at m = 10,000:
# building the fronts first added 0.5 s CPU to a 1.2 s load) and the fronts only if it passes.
_FRONTS_FIRST = 4096
_CACHE_SIZE = 128  # a solution may hold a weight for every row,
_CACHE_TERMS = 2_000_000  # so the cache is also bounded in terms (about 40 bytes each)
# weights of a batch's BLUEs derived at once, at most (a chunk of values times classes of rows)
_CHUNK_TERMS = 1_000_000
# repeat estimates kept (:meth:`HistoryIndex.repeats`), by queries and by their rows in all
_REPEATS_KEPT = 1024
_REPEATS_TERMS = 1_000_000
# factored vectors' coordinates kept (a dashboard repeats its own), at most this many in all:
# a GROUP BY over three of a wide cube's dimensions has thousands per group
_COORDINATES_MEMO = 2_000_000
# rows at which the classes of rows (:class:`_RowClasses`) are first found by sorting, not a loop
_BULK_CLASSES = 4096
# Stamps are unique across copies, so a cache shared by copies never confuses two histories.
_STAMPS = itertools.count()


@dataclass(frozen=True, slots=True)
class RowColumns:
    """A partition of history rows into classes whose error scales are equal in every BLUE.

    Attributes:
        first: the first row of each class (increasing).
        counts: the rows in each class, as floats (the tails weigh terms by them).
        of_row: each row's class (its position in ``first``).
    """

    first: IntArray
    counts: FloatArray
    of_row: IntArray


class _RowClasses:
    """The history's rows by (vector, precision, factor), kept up to date as rows arrive.

    Row ``i``'s BLUE weight is ``t_i = (z_j^T y) p_i^2 f_i`` (:meth:`HistoryIndex._solutions_of`)
    and its scale ``|t_i| / p_i``: rows equal in all three get bitwise equal scales in every
    BLUE, so a batch's exact tails take each class once (2,900 of 10,000 rows on the demo
    history) without finding equal columns by hashing. The classes' first rows and counts are
    held in arrays grown in place: a GROUP BY's plan asks for them after each value it appends,
    and converting lists of 6,000 classes each time was half a millisecond per value.
    """

    __slots__ = ("_classes", "_first", "_counts", "_of_row", "_size", "_rows", "_columns")

    def __init__(self) -> None:
        self._classes: dict[tuple[int, float, float], int] = {}
        self._first = np.zeros(16, dtype=np.int64)
        self._counts = np.zeros(16)
        self._of_row = np.zeros(16, dtype=np.int64)  # each row's class
        self._size = 0  # classes so far
        self._rows = 0
        self._columns: RowColumns | None = None

    def copy(self) -> _RowClasses:
        other = _RowClasses()
        other._classes = dict(self._classes)
        other._first = self._first.copy()
        other._counts = self._counts.copy()
        other._of_row = self._of_row.copy()
        other._size = self._size
        other._rows = self._rows
        other._columns = self._columns
        return other

    def of(self, group: IntArray, precision: FloatArray, factor: FloatArray) -> RowColumns:
        """The classes of rows ``0 .. len(group)``: those since the last call are added."""
        m = group.size
        if m > self._rows:
            if self._rows or m < _BULK_CLASSES:
                self._add(group, precision, factor, m)
            else:
                self._bulk(group, precision, factor)
            self._rows = m
            self._columns = None
        if self._columns is None:
            size = self._size
            # views where only entries past them are written later (a class's first row, a
            # row's class); the counts copied: a class's count grows in place, held ones must not
            first, of_row = self._first[:size], self._of_row[:m]
            first.flags.writeable = of_row.flags.writeable = False
            self._columns = RowColumns(first, self._counts[:size].copy(), of_row)
        return self._columns

    def _add(self, group: IntArray, precision: FloatArray, factor: FloatArray, m: int) -> None:
        """Rows ``_rows .. m`` one by one (a few since the last call)."""
        classes = self._classes
        if m > self._of_row.size:  # room, doubling
            grown = np.zeros(max(m, 2 * self._of_row.size), dtype=np.int64)
            grown[: self._rows] = self._of_row[: self._rows]
            self._of_row = grown
        of_row = self._of_row
        new = zip(
            group[self._rows : m].tolist(),
            precision[self._rows : m].tolist(),
            factor[self._rows : m].tolist(),
        )
        for row, key in enumerate(new, self._rows):
            found = classes.setdefault(key, self._size)
            if found == self._size:
                if found == self._first.size:  # room, doubling
                    self._first = np.concatenate([self._first, np.zeros_like(self._first)])
                    self._counts = np.concatenate([self._counts, np.zeros_like(self._counts)])
                self._first[found] = row
                self._size += 1
            self._counts[found] += 1.0
            of_row[row] = found

    def _bulk(self, group: IntArray, precision: FloatArray, factor: FloatArray) -> None:
        """Every row at once (a restart's history): equal keys found by sorting a hash of them.

        Rows are grouped by a 64-bit mix of their three keys, then each row is checked
        against its class's first row; a collision (never seen) takes the rows one by one.
        """
        mixed = (
            group.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
            ^ precision.view(np.uint64) * np.uint64(0xBF58476D1CE4E5B9)
            ^ factor.view(np.uint64) * np.uint64(0x94D049BB133111EB)
        )
        _, leaders, of_row, sizes = np.unique(
            mixed, return_index=True, return_inverse=True, return_counts=True
        )
        owner = leaders[of_row]
        if not (
            np.array_equal(group[owner], group)
            and np.array_equal(precision[owner], precision)
            and np.array_equal(factor[owner], factor)
        ):
            self._add(group, precision, factor, group.size)
            return
        order = np.argsort(leaders)  # classes numbered by their first row
        leaders, sizes = leaders[order], sizes[order]
        numbered = np.empty_like(order)
        numbered[order] = np.arange(order.size)
        self._of_row = numbered[of_row].astype(np.int64)
        keys = zip(group[leaders].tolist(), precision[leaders].tolist(), factor[leaders].tolist())
        self._classes = dict(zip(keys, range(leaders.size)))
        self._first = leaders.astype(np.int64)
        self._counts = sizes.astype(np.float64)
        self._size = leaders.size


class EveryRow:
    """A history's rows as its BLUEs over every row read them, shared by those BLUEs.

    Such a BLUE is its per-vector coefficients ``beta`` (:mod:`proxy.engine.span`): row ``i``
    of vector ``j`` weighs ``t_i = beta_j p_i^2 f_i``, equal for the rows of a class
    (:class:`_RowClasses`). The BLUE holds its classes' weights (:meth:`column_weights`) and
    derives its rows' weights and scales from them when read, so that a GROUP BY's BLUEs, and
    the cache of them, hold a number per class of rows rather than two per history row (3.2
    MB per value at 100,000 rows).

    Attributes:
        rows: ``0 .. m``.
        precisions: ``p_i``.
        steps: ``g_i``.
        columns: the history's classes of rows (:class:`_RowClasses`).
    """

    __slots__ = (
        "rows",
        "precisions",
        "steps",
        "columns",
        "_of",
        "_by_class",
        "_lattice",
    )

    def __init__(
        self,
        group: IntArray,
        precisions: FloatArray,
        factor: FloatArray,
        steps: FloatArray,
        columns: RowColumns,
        squared: FloatArray,
        *,
        previous: EveryRow | None = None,
    ) -> None:
        """Read-only views of the history's first ``m`` rows; ``squared``: ``p_i^2``.

        ``previous``: the same history's over fewer rows (their classes a prefix of
        ``columns``'): what it summed is extended by the rows since, to the bit. A plan's copy
        appends a GROUP BY's values one at a time, and each value's BLUE reads every row
        (built anew, 0.2 ms a value on the wide cube: 4 ms of each "again" GROUP BY).
        """
        self.rows = _row_numbers(group.size)
        self.precisions = precisions
        self.steps = steps
        self.columns = columns
        done = 0 if previous is None else previous.rows.size
        known_classes = 0 if previous is None else previous.columns.first.size
        new = columns.first[known_classes:]
        # each class's vector, p_i^2, f_i and p_i: views of the classes' arrays (previous's,
        # extended in place when it holds the end of them)
        self._by_class: _ClassArrays = _ClassArrays.extended(
            None if previous is None else previous._by_class,
            known_classes,
            (group[new], squared[new], factor[new], precisions[new]),
        )
        self._of = self._by_class.views(columns.first.size)
        # per vector, sum_i p_i^2 |f_i| g_i over its rows: a shift is then |beta| times these
        terms = squared[done:] * np.abs(factor[done:]) * steps[done:]
        lattice: FloatArray
        if previous is None:
            lattice = np.asarray(np.bincount(group, terms), dtype=np.float64)
        else:  # (np.add.at adds row by row, in order, as np.bincount does)
            known: FloatArray = previous._lattice
            lattice = np.zeros(max(known.size, int(group[done:].max(initial=-1)) + 1))
            lattice[: known.size] = known
            np.add.at(lattice, group[done:], terms)
        self._lattice: FloatArray = lattice
        for array in (self.rows, precisions, steps):
            array.flags.writeable = False

    def by_row(self, by_class: FloatArray) -> FloatArray:
        """Each row's class's number (a matrix of them by class: a matrix by row).

        A row's weight or scale read as its class's, to the bit: one gather over the rows
        rather than a gather and two products.
        """
        # (taken in C order: each value's numbers contiguous)
        return np.take(by_class, self.columns.of_row, axis=-1)

    def column_weights(self, per_vector: FloatArray) -> FloatArray:
        """The weights of each class's rows (``beta_j p_i^2 f_i``), from ``beta`` (or a matrix)."""
        group, squared, factor, _ = self._of
        weights: FloatArray = per_vector[..., group] * squared * factor
        return weights

    def shift(self, per_vector: FloatArray) -> float:
        """``sum_i |t_i| g_i``, summed vector by vector.

        The row-by-row sum regrouped, to rounding (1e-16 relative): a term per distinct vector
        rather than per history row. (One value's contiguous ``beta`` at a time: a dot product
        of a matrix's rows may round otherwise.)
        """
        lattice = self._lattice
        return float(np.abs(per_vector[: lattice.size]) @ lattice)

    def column_scales(self, column_weights: FloatArray) -> FloatArray:
        """The scales ``|t_i| / p_i`` of each class's rows, from its weights."""
        scales: FloatArray = np.abs(column_weights) / self._of[3]
        return scales


class _ClassArrays:
    """Per-class arrays of a history grown in place, shared by its :class:`EveryRow` objects.

    Each holds views of the first classes, which are never written again; the classes after
    them are written only by the one extension that finds ``filled`` at its own end (a plan's
    copy appending its values one at a time). Another (the original appending other rows
    after a copy did) copies them. (Concatenated anew at each appended row, the wide cube's
    8,887 classes took the copy's history 70 us a measured value, 42 grown in place.)
    """

    __slots__ = ("arrays", "filled")

    def __init__(self, arrays: tuple[npt.NDArray[np.generic], ...], filled: int) -> None:
        self.arrays = arrays
        self.filled = filled

    @classmethod
    def extended(
        cls,
        previous: _ClassArrays | None,
        known: int,
        new: tuple[npt.NDArray[np.generic], ...],
    ) -> _ClassArrays:
        """``previous``'s first ``known`` classes then ``new``: in place if it has the room."""
        added = new[0].size
        end = known + added
        if previous is not None and not added:  # (its first classes are never written again)
            return previous
        if previous is not None and previous.filled == known and previous.arrays[0].size >= end:
            for array, part in zip(previous.arrays, new):
                array[known:end] = part
            previous.filled = end
            return previous
        room = end + end // 2 + 16
        arrays = tuple(np.empty(room, part.dtype) for part in new)
        for k, array in enumerate(arrays):
            if previous is not None:
                array[:known] = previous.arrays[k][:known]
            array[known:end] = new[k]
        return cls(arrays, end)

    def views(self, size: int) -> tuple[IntArray, FloatArray, FloatArray, FloatArray]:
        """Read-only views of the first ``size`` classes of each array."""
        views = [array[:size] for array in self.arrays]
        for view in views:
            view.flags.writeable = False
        group, squared, factor, precisions = views
        return group, squared, factor, precisions  # type: ignore[return-value]


_ROW_NUMBERS: list[IntArray] = [np.arange(0, dtype=np.int64)]


def _row_numbers(m: int) -> IntArray:
    """``0 .. m`` read-only, a view of one array shared by every history (grown by doubling)."""
    numbers = _ROW_NUMBERS[0]
    if numbers.size < m:
        numbers = _ROW_NUMBERS[0] = np.arange(max(m, 2 * numbers.size), dtype=np.int64)
        numbers.flags.writeable = False
    return numbers[:m]


class Solution:
    """An unbiased linear estimate of a query: ``estimate = sum_k weights[k] * y[rows[k]]``.

    :meth:`HistoryIndex.solve` gives the BLUE; :meth:`HistoryIndex.repeats` and :func:`combine`
    give others. Only public numbers are held: which rows, their weights, budgets and steps.
    A BLUE over every row keeps its classes' weights instead of its rows' weights and scales,
    which it derives from them each time they are read (:class:`EveryRow`); it lists every
    row, and may weigh a few of them exactly 0 (vectors its solve left out: those count in no
    term).

    Attributes:
        rows: history row indices, increasing: those of non-zero weight, or every row.
        weights: ``t_k``, so that ``t H = q`` (to ``residual``).
        precisions: ``alpha_k / S_k`` of those rows.
        steps: ``g_k``, the lattice steps of those rows' noise.
        residual: ``||t H - q|| / ||q||`` (a bound on it for a combination).
        scales: ``b_k = |t_k| S_k / alpha_k``, the Laplace scales of the error terms (derived).
        shift: ``sum_k |t_k| g_k``: how far lattice noise can move the error from its
            continuous-Laplace coupling (derived).
        widths: interval half-widths already found, by tail method and delta
            (:func:`proxy.engine.selection.interval`).
        columns: rows whose scales are equal in every BLUE of this history (one vector
            measured at one precision and factor): the first of each such class (positions in
            ``rows``) and their counts, shared by the BLUEs of one history
            (:func:`proxy.engine.selection.intervals`); None for other estimates.
    """

    __slots__ = (
        "rows",
        "precisions",
        "steps",
        "residual",
        "shift",
        "widths",
        "columns",
        "_weights",
        "_scales",
        "_column_weights",
        "_every",
        "_terms",
    )

    def __init__(
        self,
        rows: IntArray,
        weights: FloatArray,
        precisions: FloatArray,
        steps: FloatArray,
        residual: float,
    ) -> None:
        if not (rows.shape == weights.shape == precisions.shape == steps.shape):
            raise ValueError("rows, weights, precisions and steps must align")
        if not 0 <= residual <= ESTIMABLE_RESIDUAL:
            raise ValueError("the residual must be within the estimable bound")
        if rows.size > 1 and not np.all(np.diff(rows) > 0):
            raise ValueError("rows must be strictly increasing")
        self.rows, self.precisions, self.steps, self.residual = rows, precisions, steps, residual
        self._weights: FloatArray | None = weights
        self._scales: FloatArray | None = self._scales_of(weights)
        self.shift = float(np.abs(weights) @ steps)
        self.widths: dict[tuple[object, float], float] = {}
        self.columns: RowColumns | None = None
        self._column_weights: FloatArray | None = None
        self._every: EveryRow | None = None
        self._terms = int(np.count_nonzero(weights))
        for array in (rows, weights, precisions, steps):
            array.flags.writeable = False  # solutions are cached and shared

    @classmethod
    def over_every_row(
        cls, every: EveryRow, column_weights: FloatArray, residual: float, shift: float, terms: int
    ) -> Solution:
        """The BLUE over every row weighing its classes ``column_weights``, ``terms`` rows weighed.

        Its maker derived the weights (:meth:`EveryRow.column_weights`) and ``shift``
        (:meth:`EveryRow.shift`) from its coefficients, and counted the rows of non-zero weight
        (at least two: :func:`~proxy.engine.selection.interval` reads a single term's row as
        the first).
        """
        column_weights.flags.writeable = False
        columns = every.columns
        return cls._of(
            every, residual, shift, {}, columns, terms, column_weights=column_weights, every=every
        )

    @classmethod
    def _one_row(
        cls,
        rows: IntArray,
        weights: FloatArray,
        precisions: FloatArray,
        steps: FloatArray,
        scales: FloatArray,
        residual: float,
    ) -> Solution:
        """The estimate of one row (a repeat): the constructor's, to the bit, unchecked.

        The arrays hold one number each, read-only; ``scales`` is ``|weights| / precisions``.
        (A value asked again has its repeats found again, five estimates each: the
        constructor's checks and derivations cost ~2 ms of a 20-group GROUP BY on the wide
        cube.)
        """
        solution = cls.__new__(cls)
        solution.rows, solution.precisions, solution.steps = rows, precisions, steps
        solution.residual = residual
        weight = float(weights[0])
        solution.shift = abs(weight) * float(steps[0])  # (the product a 1-term dot gives)
        solution.widths, solution.columns = {}, None
        solution._weights, solution._scales = weights, scales
        solution._column_weights, solution._every = None, None
        solution._terms = int(weight != 0.0)
        return solution

    @classmethod
    def _of(
        cls,
        rows_of: Solution | EveryRow,
        residual: float,
        shift: float,
        widths: dict[tuple[object, float], float],
        columns: RowColumns | None,
        terms: int,
        *,
        weights: FloatArray | None = None,
        scales: FloatArray | None = None,
        column_weights: FloatArray | None = None,
        every: EveryRow | None = None,
    ) -> Solution:
        """A solution over the rows, precisions and steps of ``rows_of``, with the fields given.

        Either its weights and scales, or the classes' weights of a BLUE over every row;
        nothing is checked or derived (the callers' arrays already were).
        """
        solution = cls.__new__(cls)
        solution.rows, solution.precisions = rows_of.rows, rows_of.precisions
        solution.steps = rows_of.steps
        solution.residual, solution.shift = residual, shift
        solution.widths, solution.columns = widths, columns
        solution._weights, solution._scales = weights, scales
        solution._column_weights, solution._every = column_weights, every
        solution._terms = terms
        return solution

    @property
    def weights(self) -> FloatArray:
        """``t_k`` (derived each time for a BLUE over every row)."""
        if self._weights is not None:
            return self._weights
        assert self._every is not None and self._column_weights is not None
        weights = self._every.by_row(self._column_weights)
        weights.flags.writeable = False
        return weights

    @property
    def scales(self) -> FloatArray:
        """``b_k`` (derived each time for a BLUE over every row)."""
        if self._scales is not None:
            return self._scales
        assert self._every is not None
        scales = self._every.by_row(self.column_scales())
        scales.flags.writeable = False
        return scales

    def _scales_of(self, weights: FloatArray) -> FloatArray:
        scales: FloatArray = np.abs(weights) / self.precisions
        scales.flags.writeable = False
        return scales

    @property
    def terms(self) -> int:
        """The number of error terms (rows of non-zero weight)."""
        return self._terms

    @property
    def held(self) -> int:
        """The numbers this estimate holds of its own (what a cache of them counts)."""
        return int(self.rows.size if self._column_weights is None else self._column_weights.size)

    def column_scales(self) -> FloatArray:
        """The scales of each class's first row (``scales[columns.first]``); needs ``columns``."""
        assert self.columns is not None
        if self._every is not None and self._column_weights is not None:
            return self._every.column_scales(self._column_weights)
        return self.scales[self.columns.first]

    def with_weights(self) -> Solution:
        """This estimate with its weights and scales held (to read them many times)."""
        if self._weights is not None:
            return self
        return Solution._of(
            self,
            self.residual,
            self.shift,
            self.widths,
            self.columns,
            self._terms,
            weights=self.weights,
            scales=self.scales,  # (by class first: the scales of the classes, not of every row)
        )

    @property
    def variance(self) -> float:
        """``Var(t . y) = 2 sum_k b_k^2`` (the papers' eq. 17)."""
        return 2.0 * float(np.square(self.scales).sum())

    def estimate(self, noisy_answers: FloatArray) -> float:
        """``t . y`` for the vector ``y`` of all released answers, indexed by row."""
        n = self.rows.size
        if n and self.rows[-1] == n - 1:  # rows 0 .. n (increasing): no gathering
            return float(self.weights @ noisy_answers[:n])
        return float(self.weights @ noisy_answers[self.rows])

    def same_as(self, other: Solution) -> bool:
        """Whether both give the same non-zero weights to the same rows (to rounding)."""
        if self is other:
            return True
        if self.terms != other.terms:  # (a BLUE against a repeat: without deriving its weights)
            return False
        rows, weights = self._weighed()
        other_rows, other_weights = other._weighed()
        return bool(
            np.array_equal(rows, other_rows)
            and np.allclose(weights, other_weights, rtol=1e-12, atol=0.0)
        )

    def _weighed(self) -> tuple[IntArray, FloatArray]:
        """The rows of non-zero weight and their weights."""
        weights = self.weights
        if self._terms == self.rows.size:
            return self.rows, weights
        weighed = weights != 0.0
        return self.rows[weighed], weights[weighed]

    def __eq__(self, other: object) -> bool:
        """Field by field, as a dataclass's (arrays of several terms: only the same object)."""
        if self is other:
            return True
        if not isinstance(other, Solution):
            return NotImplemented
        return bool(self._fields() == other._fields())

    __hash__ = None  # type: ignore[assignment]

    def _fields(self) -> tuple[object, ...]:
        return (self.rows, self.weights, self.precisions, self.steps, self.residual, self.shift)

    def __repr__(self) -> str:
        return (
            f"Solution(terms={self.rows.size}, variance={self.variance:.6g}, "
            f"shift={self.shift:.3g}, residual={self.residual:.1e})"
        )


_EMPTY = Solution(np.zeros(0, np.int64), np.zeros(0), np.zeros(0), np.zeros(0), residual=0.0)


def combine(parts: Sequence[tuple[float, Solution]]) -> Solution:
    """``sum_j c_j t_j`` for estimates ``t_j`` of one query: unbiased when ``sum_j c_j = 1``.

    The caller keeps the coefficients summing to one (the result is then another unbiased
    estimate of the same query); its residual is bounded by ``sum_j |c_j| residual_j``, which
    for a convex combination stays within the estimable bound. Rows whose weights cancel
    exactly are dropped.

    >>> index = HistoryIndex(2)
    >>> for row in ([1.0, 1.0], [1.0, 1.0]):
    ...     _ = index.append(LinearQuery.from_dense(row), alpha=1.0, step=0.01)
    >>> first, second, _ = index.repeats(LinearQuery.from_dense([1.0, 1.0]))
    >>> average = combine([(0.5, first), (0.5, second)])
    >>> average.rows.tolist(), average.weights.tolist(), round(average.variance, 12)
    ([0, 1], [0.5, 0.5], 1.0)
    """
    if not parts:
        raise ValueError("nothing to combine")
    residual = sum(abs(c) * s.residual for c, s in parts)
    every = _every_row_part(parts)
    if every is not None:
        return _combine_over_every_row(parts, every, residual)
    rows = np.concatenate([s.rows for _, s in parts])
    weights = np.concatenate([c * s.weights for c, s in parts])
    precisions = np.concatenate([s.precisions for _, s in parts])
    steps = np.concatenate([s.steps for _, s in parts])
    unique, first, inverse = np.unique(rows, return_index=True, return_inverse=True)
    summed = np.bincount(inverse, weights=weights, minlength=unique.size)
    keep = summed != 0
    return Solution(
        unique[keep].astype(np.int64),
        summed[keep],
        precisions[first][keep],
        steps[first][keep],
        residual=residual,
    )


def _combine_over_every_row(
    parts: Sequence[tuple[float, Solution]], every: Solution, residual: float
) -> Solution:
    """:func:`combine` where ``every`` weighs rows ``0 .. n``, which hold the others' rows.

    The general case's sums to the bit (added in order into zeros, as its ``bincount`` adds),
    without sorting every row of the history.
    """
    summed = np.zeros(every.rows.size)
    for c, solution in parts:
        if solution is every:
            summed += c * solution.weights
        else:
            summed[solution.rows] += c * solution.weights
    precisions, steps = every.precisions.copy(), every.steps.copy()
    before = next(k for k, (_, solution) in enumerate(parts) if solution is every)
    for _, solution in reversed(parts[:before]):  # a row's first part gives these
        precisions[solution.rows] = solution.precisions
        steps[solution.rows] = solution.steps
    keep = summed != 0
    return Solution(
        every.rows[keep].astype(np.int64),
        summed[keep],
        precisions[keep],
        steps[keep],
        residual=residual,
    )


def _every_row_part(parts: Sequence[tuple[float, Solution]]) -> Solution | None:
    """The part weighing rows ``0 .. n`` if they hold every other part's rows (a BLUE's)."""
    every = max((solution for _, solution in parts), key=lambda solution: solution.rows.size)
    n = every.rows.size
    if n == 0 or every.rows[-1] != n - 1:  # increasing from 0 or more: 0 .. n exactly
        return None
    if any(solution.rows.size and solution.rows[-1] >= n for _, solution in parts):
        return None
    return every


class _RepeatCache:
    """Repeat estimates by query key, with the tuple of rows they were drawn from.

    A query's repeats change only when a row of its support arrives, which replaces that
    support's tuple (:meth:`HistoryIndex.append`): an entry holds while the index holds the
    very tuple it was made from. Kept alive here, the tuple's identity cannot be reused, so
    copies of an index share the cache. Each pooled estimate then keeps the intervals found
    for it (a dashboard asks its GROUP BYs again and again).
    """

    __slots__ = ("_found", "_terms")

    def __init__(self) -> None:
        self._found: OrderedDict[bytes, tuple[tuple[int, ...], tuple[Solution, ...]]] = (
            OrderedDict()
        )
        self._terms = 0

    def get(self, key: bytes, rows: tuple[int, ...]) -> tuple[Solution, ...] | None:
        entry = self._found.get(key)
        if entry is None or entry[0] is not rows:
            return None
        self._found.move_to_end(key)
        return entry[1]

    def put(self, key: bytes, rows: tuple[int, ...], found: tuple[Solution, ...]) -> None:
        old = self._found.pop(key, None)
        if old is not None:
            self._terms -= sum(s.rows.size for s in old[1])
        self._found[key] = (rows, found)
        self._terms += sum(s.rows.size for s in found)
        while len(self._found) > _REPEATS_KEPT or self._terms > _REPEATS_TERMS:
            _, (_, evicted) = self._found.popitem(last=False)
            self._terms -= sum(s.rows.size for s in evicted)


class HistoryIndex:
    """The history matrix ``H`` with budgets and noise steps, answering BLUEs and repeats.

    Rows that measured the same vector up to a factor share one column of the minimum-norm
    problem: ``k`` rows ``f_k h`` with precisions ``p_k`` are one column ``c h`` with
    ``c^2 = sum_k (p_k f_k)^2``, whose solution ``u`` splits back as ``u p_k f_k / c``. The
    problem is solved in the span of the distinct vectors (:mod:`proxy.engine.span`), so its
    size follows the history's rank, not the rows or the cells; a factored history of rank
    past ``_FRONTS_RANK``, by fronts of ANOVA blocks (:mod:`proxy.engine.fronts`). A query
    weighing a cell no row weighs is outside the span without a solve.

    >>> index = HistoryIndex(2)
    >>> for row in ([1.0, 0.0], [0.0, 1.0]):
    ...     _ = index.append(LinearQuery.from_dense(row), alpha=1.0, step=0.01)
    >>> index.solve(LinearQuery.from_dense([1.0, 1.0])).weights.round(6).tolist()
    [1.0, 1.0]
    >>> index.solve(LinearQuery.from_dense([0.0, 0.0])).rows.size  # the zero query: free
    0
    """

    def __init__(self, n_cells: int, *, shape: tuple[int, ...] | None = None) -> None:
        """``shape``: the cube's; vectors are then taken factored, in ANOVA coordinates.

        ``n_cells`` counts coordinates: a whole number of cube cells per kind (count, measures).
        """
        if n_cells <= 0:
            raise ValueError("n_cells must be positive")
        self.n_cells = n_cells
        # the space the span is solved in: the cells, or (with a shape) the coordinates of
        # proxy.engine.factored, numbered as they are met (``_space`` of them allowed for)
        self._coordinates: AnovaCoordinates | None = None
        # (oldest first: a statement's own are never the ones dropped, see _vectors)
        self._memo: OrderedDict[bytes, tuple[IntArray, FloatArray]] = OrderedDict()
        self._memo_size = [0]  # coordinates in the memo (shared with copies, like the memo)
        self._space = n_cells
        if shape is not None:
            if n_cells % int(np.prod(shape)):
                raise ValueError(f"a cube of shape {shape} does not have {n_cells} coordinates")
            self._coordinates = AnovaCoordinates(shape)
            self._space = 4096
        self._covered = np.zeros(self._space, dtype=bool)  # coordinates some row weighs
        self._size = 0
        self._precision = np.zeros(16)  # alpha_i / S_i
        self._steps = np.zeros(16)
        self._factor = np.zeros(16)  # f_i: row i is f_i times its group's vector
        self._group = np.zeros(16, dtype=np.int64)
        self._weights: list[FloatArray] = []  # H_i's non-zero weights, for repeats
        self._by_support: dict[bytes, tuple[int, ...]] = {}  # H_i's cells -> rows i
        self._groups: dict[bytes, int] = {}  # a vector scaled to first weight 1 -> its group
        self._group_vectors: list[tuple[IntArray, FloatArray]] = []
        self._plain: list[bool] = []  # per group: its vector's factor was 1 (see _of_group)
        # factored vectors never move to the sparse solver over cells (it would need the
        # cells): past _FRONTS_RANK they move to the fronts
        self._span: SpanSolver | None = SpanSolver(
            self._space,
            residual=ESTIMABLE_RESIDUAL,
            max_rank=_SPAN_MAX_RANK if shape is None else None,
        )
        # the fronts, in the span solver's stead once a factored history's rank passes
        # _FRONTS_RANK (:meth:`_spanning`)
        self._fronts: BlockFronts | None = None
        # the sparse solver over cells once the span is too large: its rows so far, and per row
        # its column and share p_i f_i / c of that column
        self._cells: MinNormSolver | None = None
        self._cell_rows = 0
        self._column = np.zeros(16, dtype=np.int64)
        self._share = np.zeros(16)
        self._stamp = next(_STAMPS)
        self._solutions: OrderedDict[tuple[int, bytes], Solution | None] = OrderedDict()
        self._solutions_held = [0]  # the numbers its solutions hold (shared with copies, as it is)
        self._repeats = _RepeatCache()
        self._classes = _RowClasses()
        self._every: EveryRow | None = None
        self._squared: tuple[FloatArray | None, int] = (None, 0)  # (buffer, rows in it)
        self._digest = RowsDigest()  # of the rows so far: a factorization's watermark

    @property
    def size(self) -> int:
        """The number of history rows ``m``."""
        return self._size

    @property
    def version(self) -> int:
        """Changes with every appended row; never equal for two different histories.

        A copy has its original's version until a row is appended to either.
        """
        return self._stamp

    @property
    def rank(self) -> int | None:
        """The dimension of the span of the history's vectors (None over the sparse solver)."""
        solver = self._solver()
        return None if solver is None else solver.rank

    @property
    def distinct(self) -> int:
        """The number of distinct history vectors (up to a factor)."""
        return len(self._group_vectors)

    def copy(self) -> HistoryIndex:
        """An independent index with the same rows (the solution cache is shared)."""
        other = HistoryIndex.__new__(HistoryIndex)
        other.n_cells = self.n_cells
        other._coordinates = self._coordinates  # numbering only grows: shared
        other._memo = self._memo
        other._memo_size = self._memo_size
        other._space = self._space
        other._covered = self._covered.copy()
        other._size = self._size
        for name in ("_precision", "_steps", "_factor", "_group", "_column", "_share"):
            setattr(other, name, getattr(self, name).copy())
        other._weights = list(self._weights)
        other._by_support = dict(self._by_support)  # values are tuples: appends replace them
        other._groups = dict(self._groups)
        other._group_vectors = list(self._group_vectors)
        other._plain = list(self._plain)
        other._span = None if self._span is None else self._span.copy()
        other._fronts = None if self._fronts is None else self._fronts.copy()
        other._cells = None if self._cells is None else self._cells.copy()
        other._cell_rows = self._cell_rows
        other._stamp = self._stamp
        other._solutions = self._solutions
        other._solutions_held = self._solutions_held
        other._repeats = self._repeats
        other._classes = self._classes.copy()
        other._every = self._every  # the same rows, until either appends one
        other._squared = (None, 0)  # (its own buffer: the rows each appends differ)
        other._digest = self._digest.copy()
        return other

    def append(
        self,
        query: LinearQuery,
        *,
        alpha: float,
        step: float,
        known: dict[bytes, tuple[IntArray, FloatArray]] | None = None,
    ) -> int:
        """Add row ``H_m = query``, measured with ``alpha`` on lattice ``step``; returns ``m``.

        ``known``: vectors' coordinates found ahead, by key (a batch's: :attr:`BatchSolve.vectors`).
        """
        if query.n_cells != self.n_cells or query.is_zero:
            raise ValueError("a history row is a non-zero vector over this table's cells")
        if not (alpha > 0 and step > 0):
            raise ValueError("alpha and step must be positive")
        row = self._size
        self._room(row + 1)
        query, weights, factor, support, group = self._grouped(query, known)
        precision = alpha / query.sensitivity
        if self._span is not None:
            self._span.weigh(group, (precision * factor) ** 2)
        if self._fronts is not None:
            self._fronts.weigh(group, (precision * factor) ** 2)
        self._precision[row] = precision
        self._steps[row] = step
        self._factor[row] = factor
        self._group[row] = group
        self._weights.append(weights)
        self._by_support[support] = self._by_support.get(support, ()) + (row,)
        self._digest.add(query.key, alpha, step)
        self._size += 1
        self._stamp = next(_STAMPS)
        return row

    def _room(self, rows: int) -> None:
        """Room for ``rows`` rows in the per-row arrays (doubling)."""
        size = self._precision.size
        if rows > size:
            while rows > size:
                size *= 2
            for name in ("_precision", "_steps", "_factor", "_group", "_column", "_share"):
                array = getattr(self, name)
                setattr(
                    self, name, np.concatenate([array, np.zeros(size - array.size, array.dtype)])
                )

    def _grouped(
        self,
        query: LinearQuery,
        known: dict[bytes, tuple[IntArray, FloatArray]] | None = None,
        restored: Sequence[tuple[IntArray, FloatArray, bool]] = (),
    ) -> tuple[LinearQuery, FloatArray, float, bytes, int]:
        """A new row's vector as this index holds it, with what its row records.

        Its non-zero weights, its factor (the first of them), its support and its group (a new
        distinct vector, queued in the span, if not yet seen). ``known``: coordinates of
        vectors decomposed ahead, by key. ``restored``: the first groups' coordinates,
        direction and whether its factor was 1, as a factorization held them (the rows
        numbered the groups in their order).
        """
        query = self._held(query)
        weights, factor, support, key = self._group_key(query)
        group = self._groups.get(key)
        if group is None:
            group = len(self._group_vectors)
            if group < len(restored):  # (never placed in the span: the fronts hold them)
                coords, direction, plain = restored[group]
                if plain != (factor == 1.0):
                    raise FactorizationMismatch(f"vector {group} is not the history's")
            else:
                found = None if known is None else known.get(query.key)
                coords, values = self._vector(query) if found is None else found
                # (shared, read-only, when the factor is 1: a count's; the wide cube's restart
                # held 68 MB of copies)
                direction = values if factor == 1.0 else values / factor
                plain = factor == 1.0
                if self._span is not None:
                    self._span.add(coords, direction, scaled_from=(values, factor))
            self._groups[key] = group
            self._group_vectors.append((coords, direction))
            self._plain.append(plain)
            if self._fronts is not None:
                self._fronts.add(coords, direction)
            self._covered[coords] = True
        return query, weights, factor, support, group

    def _group_key(self, query: LinearQuery) -> tuple[FloatArray, float, bytes, bytes]:
        """A held vector's non-zero weights, factor (the first), support and group's key."""
        weights = self._nonzero(query)
        factor = float(weights[0])
        support = self._support(query)
        return weights, factor, support, support + (weights / factor).tobytes()

    def _of_group(self, query: LinearQuery) -> tuple[IntArray, FloatArray] | None:
        """The coordinates of a held vector that is a group's, from the group (else None).

        A group whose first vector had factor 1 holds that vector's coordinates as they were
        decomposed, and a vector of the group with factor 1 has the same core: so after a
        restart the history's vectors, asked again (a dashboard's), are not decomposed again
        (the memo holds none of a restart's).
        """
        _, factor, _, key = self._group_key(query)
        group = self._groups.get(key) if factor == 1.0 else None
        return None if group is None or not self._plain[group] else self._group_vectors[group]

    def estimator(self, rows: IntArray, weights: FloatArray, residual: float) -> Solution:
        """The estimate ``sum_k weights[k] y[rows[k]]`` (rows increasing, weights non-zero)."""
        return Solution(rows, weights, self._precision[rows], self._steps[rows], residual=residual)

    def prepare(self) -> None:
        """Factor now rather than at the next solve (after loading a history)."""
        solver = self._solver()
        if solver is not None:
            solver.prepare()
        elif self._size:
            self._sync_cells().prepare()

    def solve(self, query: LinearQuery) -> Solution | None:
        """The BLUE of ``query . x`` from the history, or ``None`` if it is not estimable."""
        (solution,) = self.solve_many([query])
        return solution

    def solve_many(self, queries: Sequence[LinearQuery]) -> list[Solution | None]:
        """:meth:`solve` for a batch (a GROUP BY): the estimable ones share every solve."""
        solutions, _, _ = self._solve_many(queries, keep=False)
        return solutions

    def batch(self, queries: Sequence[LinearQuery]) -> BatchSolve:
        """The batch's BLUEs, then each on the history plus the batch's values measured before.

        See :class:`BatchSolve`.
        """
        solutions, updates, vectors = self._solve_many(queries, keep=len(queries) > 1)
        return BatchSolve(self, queries, solutions, updates, vectors)

    def _solve_many(
        self, queries: Sequence[LinearQuery], *, keep: bool
    ) -> tuple[
        list[Solution | None], BatchUpdates | None, dict[bytes, tuple[IntArray, FloatArray]]
    ]:
        """:meth:`solve_many`, and with ``keep`` the :class:`BatchUpdates` of the batch's solve.

        They hold every non-zero query, by position, if the span or the fronts solved some
        (else None: the sparse solver has none). Also the non-zero queries' vectors, by key.
        """
        found: dict[bytes, Solution | None] = {}
        pending: dict[bytes, LinearQuery] = {}
        keys = []
        if any(query.n_cells != self.n_cells for query in queries):
            raise ValueError("query is over a different number of cells")
        held = [self._held(query) for query in queries]
        nonzero = [query for query in held if not query.is_zero]
        vectors = dict(zip((q.key for q in nonzero), self._vectors(nonzero)))
        for query in held:
            key = query.key
            keys.append(key)
            if key in found or key in pending:
                continue
            if query.is_zero:
                found[key] = _EMPTY
                continue
            coords, _ = vectors[key]
            if not np.all(self._covered[coords]):
                found[key] = None  # every row vanishes on a cell the query weighs
            elif (self._stamp, key) in self._solutions:
                self._solutions.move_to_end((self._stamp, key))
                found[key] = self._solutions[(self._stamp, key)]
            else:
                pending[key] = query
        updates = None
        if pending:
            solver = self._solver()
            if solver is not None and keep:
                batch = [vectors[query.key] for query in nonzero]
                every, distances, updates = solver.solve_batch(batch)
                first = {query.key: i for i, query in reversed(list(enumerate(nonzero)))}
                per_vector = [every[first[key]] for key in pending]
                residuals = [distances[first[key]] for key in pending]
                solutions = self._solutions_of(per_vector, residuals)
            elif solver is not None:
                per_vector, residuals = solver.solve_many([vectors[key] for key in pending])
                solutions = self._solutions_of(per_vector, residuals)
            else:
                us, residuals = self._sync_cells().solve_many([vectors[k] for k in pending])
                solutions = [self._cell_solution(u, r) for u, r in zip(us, residuals)]
            solved = dict(zip(pending, solutions))
            found.update(solved)
            self._cache(solved)
        return [found[key] for key in keys], updates, vectors

    def _cache(self, found: dict[bytes, Solution | None]) -> None:
        """Keep ``found`` as the BLUEs of their keys on this history, within the cache's bounds.

        The oldest are dropped first, never those just found: a batch asked again (a
        dashboard's GROUP BY) finds all of its own, however many rows its BLUEs weigh. The
        numbers the cache holds are counted as entries come and go (summed over it, they cost
        0.18 ms a solve on the demo cube's 10,000-answer history).
        """
        cache, held = self._solutions, self._solutions_held
        if not cache:  # (emptied by clear(), which the count does not see)
            held[0] = 0
        for key, solution in found.items():
            replaced = cache.pop((self._stamp, key), None)
            held[0] += (0 if solution is None else solution.held) - (
                0 if replaced is None else replaced.held
            )
            cache[(self._stamp, key)] = solution
        while len(cache) > len(found) and (len(cache) > _CACHE_SIZE or held[0] > _CACHE_TERMS):
            _, evicted = cache.popitem(last=False)
            held[0] -= 0 if evicted is None else evicted.held

    def _held(self, query: LinearQuery) -> LinearQuery:
        """The query as this index holds vectors: factored over its cube, or cell by cell."""
        if self._coordinates is None or query.core is not None:
            return query
        shape = self._coordinates.shape
        dense = query.to_dense().reshape((query.kinds, *shape))
        return LinearQuery.from_tensor(shape, dense, query.offset, query.measures)

    def _nonzero(self, query: LinearQuery) -> FloatArray:
        """The non-zero weights, in the order :meth:`_support` lists them."""
        return query.weights if self._coordinates is None else query.nonzero_weights()

    def _support(self, query: LinearQuery) -> bytes:
        """Equal for vectors that weigh the same cells (repeats are looked up by it)."""
        if query.core is None or self._coordinates is None:
            return query.cells.tobytes()
        pattern: bytes = (query.core != 0).tobytes()
        return np.array(query.axes, dtype=np.int64).tobytes() + pattern

    def _vector(self, query: LinearQuery) -> tuple[IntArray, FloatArray]:
        """The vector's non-zero coordinates in the solver's space, and their values."""
        (vector,) = self._vectors([query])
        return vector

    def _vectors(self, queries: Sequence[LinearQuery]) -> list[tuple[IntArray, FloatArray]]:
        """:meth:`_vector` of each query; those not yet known decomposed together.

        A history's vector is read off its group (:meth:`_of_group`). They are kept in the
        memo, the least recently asked dropped first as new ones come, but never those of this
        call: a statement's values are asked for again one by one (a batch's corrected solves,
        its measured rows), and a GROUP BY over four of the wide cube's dimensions holds more
        coordinates than the memo's bound (378 groups of 9,520). Cleared whole as it filled,
        the memo dropped half of such a batch, which was then decomposed value by value (731
        decompositions, 1.07 s CPU over the bench's 40-statement stream; 170 MB more RSS at
        its end, the values' coordinates not shared).
        """
        if self._coordinates is None:
            return [(query.cells, query.weights) for query in queries]
        memo = self._memo
        keys = [query.key for query in queries]
        found: dict[bytes, tuple[IntArray, FloatArray]] = {}
        for key in keys:
            known = memo.get(key)
            if known is not None:
                memo.move_to_end(key)
                found[key] = known
        missing = {}
        for key, query in zip(keys, queries):
            if key not in found and key not in missing:
                known = self._of_group(query)
                if known is None:
                    missing[key] = query
                else:
                    found[key] = known
        found.update(self._decompose(missing))
        added = [key for key in found if key not in memo]
        for key in added:
            memo[key] = found[key]
            self._memo_size[0] += found[key][0].size
        while added and self._memo_size[0] > _COORDINATES_MEMO and len(memo) > len(found):
            _, (coords, _) = memo.popitem(last=False)
            self._memo_size[0] -= coords.size
        return [found[key] for key in keys]

    def _decompose(
        self, queries: dict[bytes, LinearQuery]
    ) -> dict[bytes, tuple[IntArray, FloatArray]]:
        """The coordinates of ``queries`` (by key), computed together; room made for them."""
        if not queries:
            return {}
        assert self._coordinates is not None
        vectors = dict(zip(queries, self._coordinates.of_many(list(queries.values()))))
        space = self._coordinates.size
        if space > self._space:  # new coordinates: room for them, doubling
            self._space = max(space, 2 * self._space)
            self._covered = np.concatenate(
                [self._covered, np.zeros(self._space - self._covered.size, dtype=bool)]
            )
            if self._span is not None:
                self._span.resize(self._space)
        return vectors

    def _decomposed(
        self, queries: Sequence[LinearQuery]
    ) -> dict[bytes, tuple[IntArray, FloatArray]]:
        """The coordinates of many vectors at once, by key, ahead of their rows (a restart's).

        Held here, not in the memo: a restart's vectors outgrow it (the wide cube's 6,178 at
        m = 10,000 hold 8.9 million coordinates, the memo 2), and the rows keep them.
        """
        if self._coordinates is None:
            return {}
        held = (self._held(query) for query in queries)
        return self._decompose({query.key: query for query in held})

    def factorization(self) -> Factorization | None:
        """The history's factorization as plain arrays, with its watermark (a restart's).

        None unless the fronts factor the history (a smaller one is placed in the span
        solver in well under a second, and one over cells has none). The arrays are views of
        what the index holds, none changed later in place: the caller may lay them out (a
        store's write) after releasing its lock. :mod:`proxy.engine.snapshot` says why.
        """
        fronts = self._fronts
        if fronts is None or self._coordinates is None or self._span is not None:
            return None
        # pending rows rotated in and every product formed, as a restart's prepare forms them
        # (formed lazily here and at once there, later extensions of them would round apart)
        fronts.prepare()
        arrays: dict[str, Array | Members] = {}
        structure = fronts.export(arrays)
        # vectors over every coordinate of the same axes share their coordinates (a GROUP BY's
        # groups, a load's): each such array once
        shared: dict[int, int] = {}
        coordinates: list[IntArray] = []
        for coords, _ in self._group_vectors:
            if id(coords) not in shared:
                shared[id(coords)] = len(coordinates)
                coordinates.append(coords)
        arrays["vectors.coordinates_of"] = np.array(
            [shared[id(coords)] for coords, _ in self._group_vectors], dtype=np.int64
        )
        pack("vectors.coordinates", coordinates, np.int64, arrays)
        pack("vectors.directions", [d for _, d in self._group_vectors], np.float64, arrays)
        arrays["vectors.plain"] = np.array(self._plain, dtype=bool)
        meta = {
            "format": FORMAT,
            "rows": self._size,
            "digest": self._digest.hexdigest(),
            "n_cells": self.n_cells,
            "shape": list(self._coordinates.shape),
            "blocks": [[list(key), first] for key, first in self._coordinates.blocks()],
            "fronts": structure,
        }
        return Factorization(meta, arrays)

    def load(
        self,
        rows: Sequence[tuple[LinearQuery, float, float]],
        factorization: Factorization | None = None,
    ) -> None:
        """Append a restart's history (``(query, alpha, step)`` per row) and factor it now.

        What :meth:`append` of each row, then :meth:`prepare`, would hold, with the vectors
        decomposed together and the span placed by :meth:`SpanSolver.place_all`, so that the
        first solve after a restart costs what later ones do.

        ``factorization``: one an index exported (:meth:`factorization`) over the first rows
        of these; taken as this index's, the rows after it folded in as appends fold them.
        Only into an empty index.

        Raises:
            FactorizationMismatch: ``factorization`` is not of these rows, or malformed. The
                index is then partly loaded: load into a new one without it.
        """
        if factorization is not None:
            self._restore(rows, factorization)
            return
        self._append_all(rows, self._decomposed([query for query, _, _ in rows]))
        if self._span is not None and self._coordinates is not None:
            if self.distinct > _FRONTS_FIRST:
                fronts = self._fronts_of_history()
                if fronts.rank > _FRONTS_RANK:
                    self._span, self._fronts = None, fronts
        if self._span is not None:
            self._span.place_all()
        self.prepare()  # (past _FRONTS_RANK, to the fronts)

    def _restore(
        self, rows: Sequence[tuple[LinearQuery, float, float]], factorization: Factorization
    ) -> None:
        """:meth:`load` from ``factorization``: its fronts, then the rows after its watermark."""
        meta, arrays = factorization.meta, factorization.arrays
        if self._size or self._coordinates is None or self._coordinates.size:
            raise ValueError("a factorization is restored into an empty factored index")
        if meta.get("format") != FORMAT:
            raise FactorizationMismatch(f"format {meta.get('format')!r}, not {FORMAT}")
        if meta.get("n_cells") != self.n_cells or meta.get("shape") != list(
            self._coordinates.shape
        ):
            raise FactorizationMismatch("another cube's (its cells or shape differ)")
        covered = factorization.rows
        if not 0 < covered <= len(rows):
            raise FactorizationMismatch(f"it covers {covered} rows, the history has {len(rows)}")
        try:
            numbering = [(tuple(key), first) for key, first in meta["blocks"]]  # type: ignore[attr-defined]
            space = AnovaCoordinates.numbered(self._coordinates.shape, numbering)
            coordinates = unpack("vectors.coordinates", arrays, np.int64)
            coordinates_of = arrays["vectors.coordinates_of"]
            directions = unpack("vectors.directions", arrays, np.float64)
            plain = arrays["vectors.plain"]
            if not (coordinates_of.size == len(directions) == plain.size):
                raise FactorizationMismatch("its vectors' parts disagree")
            vectors = [
                (coordinates[at], direction)
                for at, direction in zip(coordinates_of.tolist(), directions)
            ]
            if any(
                c.size != d.size or (c.size and not 0 <= c[0] <= c[-1] < space.size)
                for c, d in vectors
            ):
                raise FactorizationMismatch("a vector outside its space")
            fronts = BlockFronts.restored(
                space,
                list(vectors),
                meta["fronts"],  # type: ignore[arg-type]
                arrays,
                residual=ESTIMABLE_RESIDUAL,
            )
        except (KeyError, IndexError, TypeError, ValueError) as error:
            if isinstance(error, FactorizationMismatch):
                raise
            raise FactorizationMismatch(f"malformed: {error!r}") from error
        self._coordinates = space
        self._space = max(self._space, space.size)
        self._covered = np.zeros(self._space, dtype=bool)
        self._span = None
        restored = [(c, d, bool(p)) for (c, d), p in zip(vectors, plain.tolist())]
        self._append_all(rows[:covered], {}, restored)
        if self._digest.hexdigest() != meta.get("digest"):
            raise FactorizationMismatch(f"its {covered} rows are not the history's first")
        if self.distinct != len(vectors):
            raise FactorizationMismatch("its vectors are not the history's")
        self._fronts = fronts
        later = rows[covered:]
        self._append_all(later, self._decomposed([query for query, _, _ in later]))
        self.prepare()

    def _append_all(
        self,
        rows: Sequence[tuple[LinearQuery, float, float]],
        known: dict[bytes, tuple[IntArray, FloatArray]],
        restored: Sequence[tuple[IntArray, FloatArray, bool]] = (),
    ) -> None:
        """:meth:`append` of each row, a vector's work done once for the rows that share it.

        A ledger's load gives the rows of one stored vector one :class:`LinearQuery`, so rows
        are matched to their vector by identity; the per-row arrays are filled at once. The
        rows are checked before any is added. ``restored``: the first groups' vectors, as a
        factorization held them (:meth:`_grouped`).
        """
        m = len(rows)
        for query in {id(query): query for query, _, _ in rows}.values():
            if query.n_cells != self.n_cells or query.is_zero:
                raise ValueError("a history row is a non-zero vector over this table's cells")
        alphas = np.array([alpha for _, alpha, _ in rows], dtype=np.float64)
        steps = np.array([step for _, _, step in rows], dtype=np.float64)
        if not (np.all(alphas > 0) and np.all(steps > 0)):
            raise ValueError("alpha and step must be positive")
        start, end = self._size, self._size + m
        self._room(end)
        # per distinct query object: (weights, factor, support, group, sensitivity, key)
        vectors: dict[int, tuple[FloatArray, float, bytes, int, float, bytes]] = {}
        factors, sensitivities = np.zeros(m), np.zeros(m)
        groups = np.zeros(m, dtype=np.int64)
        by_support: dict[bytes, list[int]] = {}
        keys: list[bytes] = []
        for row, (query, _, _) in enumerate(rows, start):
            vector = vectors.get(id(query))
            if vector is None:
                held, weights, factor, support, group = self._grouped(query, known, restored)
                vector = vectors[id(query)] = (
                    weights,
                    factor,
                    support,
                    group,
                    held.sensitivity,
                    held.key,
                )
            weights, factor, support, group, sensitivity, key = vector
            keys.append(key)
            factors[row - start], sensitivities[row - start] = factor, sensitivity
            groups[row - start] = group
            self._weights.append(weights)
            by_support.setdefault(support, []).append(row)
        precisions = alphas / sensitivities
        for solver in (self._span, self._fronts):  # row by row: c_j^2 summed as appends sum it
            if solver is not None:
                for group, precision, factor in zip(
                    groups.tolist(), precisions.tolist(), factors.tolist()
                ):
                    solver.weigh(group, (precision * factor) ** 2)
        self._precision[start:end] = precisions
        self._steps[start:end] = steps
        self._factor[start:end] = factors
        self._group[start:end] = groups
        for support, added in by_support.items():
            self._by_support[support] = self._by_support.get(support, ()) + tuple(added)
        self._digest.add_all(keys, alphas.tolist(), steps.tolist())
        self._size = end
        self._stamp = next(_STAMPS)

    def _solutions_of(
        self, per_vector: Sequence[FloatArray | None], residuals: Sequence[float]
    ) -> list[Solution | None]:
        """Row weights ``t_i = (beta_j^T y) p_i^2 f_i`` for row ``i`` of vector ``j``, per query.

        Row ``i`` measures ``f_i h_j`` with Laplace scale ``1 / p_i``; within vector ``j`` the
        least-variance split of ``u_j c_j`` gives each row ``u_j p_i f_i / c_j``, and
        ``u_j = c_j beta_j^T y`` (:mod:`proxy.engine.span`). The estimable queries of a batch
        are weighed in one array operation over the rows.
        """
        solved = [
            i
            for i, (g, residual) in enumerate(zip(per_vector, residuals))
            if g is not None and residual <= ESTIMABLE_RESIDUAL
        ]
        found: list[Solution | None] = [None] * len(per_vector)
        if not solved:
            return found
        every = self._every_row()
        m = every.rows.size
        # a chunk of the batch at a time: its classes' weights are (values x classes) arrays
        chunk = max(1, _CHUNK_TERMS // max(1, every.columns.first.size))
        for start in range(0, len(solved), chunk):
            part = solved[start : start + chunk]
            stacked = np.stack([per_vector[i] for i in part])  # type: ignore[misc]
            column_weights = every.column_weights(stacked)
            # the rows each weighs, by class (a class's rows share its weight): a BLUE over a
            # connected history weighs most, and is then held over every row, the few of
            # vectors its solve left out exactly 0 (the fronts leave 7-9 of 2,647 vectors' so
            # on the demo cube at m = 100,000, and a 20-group GROUP BY's of age ~150 of the
            # wide cube's 10,800 rows; listed row by row, they cost 2x per batch there, and the
            # batch's tails could not take the history's classes of rows)
            weighed = (column_weights != 0.0) @ every.columns.counts
            for row, i in enumerate(part):
                terms = int(weighed[row])
                if terms >= 2 and 2 * terms >= m:
                    shift = every.shift(stacked[row])
                    found[i] = Solution.over_every_row(
                        every, column_weights[row].copy(), residuals[i], shift, terms
                    )  # (a copy: a chunk's array would be held by its last cached value)
                    continue
                weights = every.by_row(column_weights[row])
                (rows,) = np.nonzero(weights)
                rows = rows.astype(np.int64)
                found[i] = self.estimator(rows, weights[rows], residuals[i])
        return found

    def _squares(self, m: int) -> FloatArray:
        """``p_i^2`` of rows ``0 .. m``: a view of this index's own buffer, extended in place.

        A plan's copy that appends a value a time then holds one array of them, not one per
        value. Copies start their own buffer: rows past the copy differ between the two.
        """
        buffer, done = self._squared
        if buffer is None or buffer.size < m:
            grown = np.empty(max(m, 2 * (0 if buffer is None else buffer.size)))
            if buffer is not None:
                grown[:done] = buffer[:done]
            buffer = grown
        np.square(self._precision[done:m], out=buffer[done:m])
        self._squared = (buffer, m)
        squares = buffer[:m]
        squares.flags.writeable = False
        return squares

    def _every_row(self) -> EveryRow:
        """The history's rows as its BLUEs over every row read them (kept until a row arrives).

        Rows below ``size`` never change, so read-only views of them serve.
        """
        m = self._size
        every = self._every
        if every is None or every.rows.size != m:
            group, precision, factor = self._group[:m], self._precision[:m], self._factor[:m]
            columns = self._classes.of(group, precision, factor)
            every = self._every = EveryRow(
                group,
                precision,
                factor,
                self._steps[:m],
                columns,
                self._squares(m),
                previous=every if every is not None and every.rows.size < m else None,
            )
        return every

    def _cell_solution(self, u: FloatArray, residual: float) -> Solution | None:
        """Row weights from the sparse solver's ``u``: ``t_i = u_k share_i p_i``."""
        if not residual <= ESTIMABLE_RESIDUAL:
            return None
        m = self._size
        t = u[self._column[:m]] * self._share[:m] * self._precision[:m]
        (rows,) = np.nonzero(t)
        return self.estimator(rows.astype(np.int64), t[rows], residual)

    def _spanning(self) -> SpanSolver | None:
        """The span solver, or None once the history's rank has outgrown it (then for good).

        Then a factored index solves with the fronts, an index over cells with the sparse
        solver.
        """
        span = self._span
        if span is None:
            return None
        if self._coordinates is not None:
            if span.rank > _FRONTS_RANK:
                self._span, self._fronts = None, self._fronts_of_history()
        elif not span.fits():
            self._span = None
        return self._span

    def _solver(self) -> SpanSolver | BlockFronts | None:
        """The span solver, else the fronts; None once the sparse solver over cells took over."""
        span = self._spanning()
        return span if span is not None else self._fronts

    def _fronts_of_history(self) -> BlockFronts:
        """The fronts of every distinct vector, weighed with its pooled ``c_j^2``."""
        assert self._coordinates is not None
        fronts = BlockFronts(self._coordinates, residual=ESTIMABLE_RESIDUAL)
        m = self._size
        scaled = self._precision[:m] * self._factor[:m]
        pooled = np.bincount(self._group[:m], np.square(scaled), minlength=self.distinct)
        for (coords, direction), weight2 in zip(self._group_vectors, pooled.tolist()):
            fronts.weigh(fronts.add(coords, direction), weight2)
        return fronts

    def _sync_cells(self) -> MinNormSolver:
        """The sparse solver over cells with every row (pooled per vector when first built)."""
        m = self._size
        solver = self._cells
        if solver is None:
            solver = self._cells = MinNormSolver(self.n_cells)
            scaled = self._precision[:m] * self._factor[:m]
            pooled = np.sqrt(
                np.bincount(self._group[:m], np.square(scaled), minlength=len(self._group_vectors))
            )
            for cells, direction in self._group_vectors:
                solver.add_row(cells, direction * pooled[solver.rows])
            self._column[:m] = self._group[:m]
            self._share[:m] = scaled / pooled[self._group[:m]]
        else:
            for row in range(self._cell_rows, m):  # one more column of its group's vector
                cells, direction = self._group_vectors[int(self._group[row])]
                self._column[row] = solver.rows
                self._share[row] = 1.0
                solver.add_row(cells, direction * (self._precision[row] * self._factor[row]))
        self._cell_rows = m
        return solver

    def repeats(self, query: LinearQuery) -> tuple[Solution, ...]:
        """Estimates from the rows ``H_i = c q`` (``c != 0``) alone: the query measured before.

        Each such row gives ``y_i / c``, one error term whose interval is the exact lattice one
        the measurement was bought for (``t = 1/c`` is exactly 1 for a row equal to the query).
        Returned: the least noisy of them one by one (at most four, by scale), then, if there
        are several, all of them inverse-variance pooled (the BLUE over those rows alone). Rows
        are found by their cells, then checked for proportional weights.

        >>> index = HistoryIndex(3)
        >>> for row, alpha in (([1, 1, 0], 1.0), ([2, 2, 0], 2.0), ([1, 2, 0], 1.0)):
        ...     _ = index.append(LinearQuery.from_dense(row), alpha=alpha, step=0.01)
        >>> [(r.rows.tolist(), r.weights.tolist()) for r in index.repeats(
        ...     LinearQuery.from_dense([1.0, 1.0, 0.0]))]
        [([1], [0.5]), ([0], [1.0]), ([0, 1], [0.2, 0.4])]
        """
        if query.n_cells != self.n_cells:
            raise ValueError("query is over a different number of cells")
        query = self._held(query)
        support_rows = self._by_support.get(self._support(query), ())
        if not support_rows:
            return ()
        known = self._repeats.get(query.key, support_rows)
        if known is not None:
            return known
        rows = np.array(support_rows, dtype=np.int64)
        weights = np.array([self._weights[row] for row in support_rows])  # (np.stack: 5x slower)
        wanted = self._nonzero(query)
        t = wanted[0] / weights[:, 0]
        difference = t[:, None] * weights - wanted
        # the norms np.linalg.norm sums, to the bit, without its checks and dispatch (~20 us)
        residual = np.sqrt(np.add.reduce(difference * difference, axis=1))
        residual /= math.sqrt(wanted.dot(wanted))
        proportional = residual <= _REPEAT_RESIDUAL
        rows, t, residual = rows[proportional], t[proportional], residual[proportional]
        precisions, steps = self._precision[rows], self._steps[rows]
        scales = np.abs(t) / precisions
        for array in (rows, t, precisions, steps, scales):  # (and so their one-row slices)
            array.flags.writeable = False
        best = np.argsort(scales, kind="stable")[:_REPEAT_SINGLES]
        found = [
            Solution._one_row(
                rows[i : i + 1],
                t[i : i + 1],
                precisions[i : i + 1],
                steps[i : i + 1],
                scales[i : i + 1],
                float(residual[i]),
            )
            for i in best.tolist()
        ]
        if rows.size > 1:
            shares = 1.0 / np.square(scales)
            shares /= shares.sum()
            pooled = Solution(rows, shares * t, precisions, steps, float(shares @ residual))
            found.append(pooled)
        repeats = tuple(found)
        self._repeats.put(query.key, support_rows, repeats)
        return repeats


class BatchSolve:
    """A batch's BLUEs as the plan measures some of its values: each on what came before it.

    Value ``i`` is estimated from the history plus the values measured before it in the batch,
    which a plan appends to a copy of the index (:meth:`measured`). Solving each on that copy
    would place the fresh vectors (or rotate the measured rows into the fronts) and solve
    from scratch per value; the batch's first solve already holds what those solves need
    (:class:`~proxy.engine.span.BatchUpdates`, from the span solver or the fronts), so each
    is a correction of it, with the copy's rows, precisions and classes: the copy's BLUE to
    rounding. Where a correction cannot follow (the sparse solver, a cancelling correction,
    a span grown past its bound, a fresh vector neither clearly in the span nor off it) the
    value is solved on the copy.
    """

    def __init__(
        self,
        index: HistoryIndex,
        queries: Sequence[LinearQuery],
        solutions: list[Solution | None],
        updates: BatchUpdates | None,
        vectors: dict[bytes, tuple[IntArray, FloatArray]],
    ) -> None:
        """The batch's solve on ``index``.

        ``vectors``: the non-zero queries' in the index's space, by key; kept for the values'
        solves and appends (a wide cube's GROUP BY's outgrow the index's memo of them: they
        were decomposed again, twice a value).
        """
        self.solutions = solutions  # on the history alone
        self._original = index
        self._index = index  # the history plus the batch's values measured so far
        self._queries = list(queries)
        self._held = [index._held(query) for query in queries]
        self._nonzero = [i for i, query in enumerate(self._held) if not query.is_zero]
        self._column = {i: c for c, i in enumerate(self._nonzero)}
        self.vectors = vectors
        self._updates = updates
        self._solved = updates is not None  # whether the batch's span solve was made
        self._distinct = index.distinct

    def measured(self, i: int, index: HistoryIndex, row: int) -> None:
        """Value ``i`` was appended as ``row`` of ``index`` (the plan's copy of the history)."""
        self._index = index
        new_vector = index.distinct > self._distinct
        self._distinct = index.distinct
        if not self._solved:  # every value was cached: solve the batch now, once
            self._solved = True
            solver = self._original._solver()
            if solver is not None and self._nonzero:
                vectors = [self.vectors[self._held[k].key] for k in self._nonzero]
                _, _, self._updates = solver.solve_batch(vectors)
        updates = self._updates
        if updates is None or i not in self._column:
            return
        group = int(index._group[row])
        cells, _ = index._group_vectors[group]
        if not updates.measure(
            self._column[i],
            float(index._precision[row]),
            float(index._factor[row]),
            new_vector,
            cells.size,
        ):
            self._updates = None  # later values are solved on the copy

    def solve(self, i: int) -> Solution | None:
        """The BLUE of value ``i`` on the history plus the values measured before it."""
        index = self._index
        if index is self._original:
            return self.solutions[i]
        solution = self._solve(i)
        if i == len(self._queries) - 1:
            # the corrections left the copy's rows pending: taken in now, by the statement
            # that measured them (the engine keeps the copy), not by whichever comes next
            index.prepare()
        return solution

    def _solve(self, i: int) -> Solution | None:
        index = self._index
        query = self._held[i]
        updates = self._updates
        if query.is_zero or updates is None:
            return index.solve(self._queries[i])
        key = query.key
        coords, _ = self.vectors[key]
        if not np.all(index._covered[coords]):
            return None
        if (index._stamp, key) in index._solutions:
            return index._solutions[(index._stamp, key)]
        corrected = updates.solve(self._column[i])
        if corrected is None:
            return index.solve(self._queries[i])
        per_vector, residual = corrected
        (solution,) = index._solutions_of([per_vector], [residual])
        index._cache({key: solution})
        return solution
