"""The per-cell budget: what each cell has spent, and refusals when a charge won't fit.

Not to be confused with the ledger *store*, where measurements are recorded
(`proxy.storage.ledger_store`), or the ``dpproxy ledger`` admin commands.

A measurement of ``H_i`` with budget ``alpha_i`` costs cell ``j`` exactly ``alpha_i |H_ij| / S_i``
(a record in cell ``j`` moves the answer by at most ``|H_ij|``); costs add up per cell, and the
table has spent ``max_j B_j`` (the papers' Thm 3.8). The arithmetic is exact: charges are
``Fraction``s, one per distinct weight of a measurement, and the budget keeps every cell's spend
as an integer over one common denominator, so it equals a recomputation from the history
exactly, and a charge fits only if no cell would go past the DBA's total.

Over a cube with measures, a vector's coordinates are cell counts and per-cell sums; a row of
cell ``j`` moves the answer by at most the cell's sensitivity ``s_ij`` (the box maximum of
:meth:`~sqlmap.vector.LinearQuery.cell_sensitivities`), and the charge is ``alpha_i s_ij / S_i``
with ``S_i = max_j s_ij``: for counts alone ``s_ij = |H_ij|``. Every charge goes through
:func:`_charged`, the one place that maps coordinates to the cells that own them.

Cells that every charged vector weighs alike have spent the same, so the budget keeps one
number per atom (:class:`~proxy.engine.atoms.Partition`): a commit costs the atoms it touches,
a check the cells of the batch, both as array operations. Given the cube's shape, it keeps
the spend on a grid instead (per dimension, classes of values no charge has told apart: its
size follows what charges distinguish, not the cube) and charges factored vectors as tensors
broadcast over it (a wide cube's range count covers a million cells, which a partition would
have to list). A check, a commit and :meth:`CellBudget.spent_after` read and write only each
charge's box of the grid (the classes where it is not zero along the dimensions it names, every
class of the others), and the most spent is kept as charges arrive (spend only grows), so
their cost follows what a statement charges, not the grid. A check and
:meth:`CellBudget.spent_after` need only the grid's maxima over the dimensions a statement
does not name; those are kept per set of dimensions asked (a dashboard's GROUP BYs ask the
same sets again) and brought up to date from the charges since (:class:`_Maxima`), so that a
GROUP BY with no WHERE, whose box is the whole grid, reads it once rather than at each check.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt

from proxy.engine.atoms import Partition
from proxy.engine.history import HistoryEntry
from proxy.engine.noise import public_fraction
from proxy.errors import BudgetExhausted
from sqlmap.vector import LinearQuery

__all__ = ["Charges", "CellBudget", "UserCaps", "cell_charges", "float_up", "format_budget"]

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
Numerators = npt.NDArray[Any]  # int64, or Python integers (object) once they outgrow it
# Spends are int64 numerators while they stay below this; past it, Python integers.
_INT64_ROOM = 2**62
# The grid's maxima over the dimensions outside a set (_Maxima): kept for this many sets, while
# the grid is at least _MAXIMA_SHARE times larger, and with at most _MAXIMA_LOG charges pending.
_MAXIMA_SETS = 32
_MAXIMA_SHARE = 8
_MAXIMA_LOG = 256
# A term whose box (not a view) holds at least this share of the grid is added to the whole grid
# in place.
_WHOLE_GRID = 4
# Terms of a commit are summed while their sum spans at most this share of the grid (_nested).
_SUMMED_SHARE = 32


def float_up(value: Fraction) -> float:
    """The least float8 at or above ``value``: spend shown is never less than spent.

    >>> float_up(Fraction(1, 10)) >= Fraction(1, 10), float_up(Fraction(1, 3)) >= Fraction(1, 3)
    (True, True)
    """
    nearest = float(value)
    return math.nextafter(nearest, math.inf) if nearest < value else nearest


def _charged(query: LinearQuery) -> tuple[IntArray, npt.NDArray[np.float64]]:
    """The cells a measurement of ``query`` charges and their sensitivities ``s_ij``."""
    return query.cell_sensitivities()


def _distinct_charges(
    magnitudes: npt.NDArray[np.float64], sensitivity: float, budget: Fraction
) -> tuple[IntArray, list[Fraction]]:
    """Per cell of ``magnitudes`` (its ``s_ij``), an index into its distinct value's charge."""
    distinct, inverse = np.unique(magnitudes, return_inverse=True)
    return inverse, [_charge(budget, sensitivity, s) for s in distinct.tolist()]


@functools.lru_cache(maxsize=4096)
def _charge(budget: Fraction, sensitivity: float, magnitude: float) -> Fraction:
    """``alpha_i s_ij / S_i``: kept, since a batch's values (a GROUP BY's groups) share them."""
    return budget * public_fraction(magnitude) / public_fraction(sensitivity)


def _over(charges: list[Fraction], denominator: int) -> Numerators:
    """``charges`` as numerators over ``denominator`` (a multiple of theirs), int64 if they fit."""
    nums = [c.numerator * (denominator // c.denominator) for c in charges]
    fits = max(map(abs, nums), default=0) < _INT64_ROOM // 4  # as _narrowed
    return np.array(nums, dtype=np.int64 if fits else object)


@dataclass(frozen=True, slots=True)
class Charges:
    """What measurements cost the cells they touch: ``(query, budget)`` pairs, kept sparse.

    >>> Charges.of_query(LinearQuery.from_dense([2.0, 1.0, 0.0]), Fraction(1, 20)).per_cell()
    {0: Fraction(1, 20), 1: Fraction(1, 40)}
    """

    items: tuple[tuple[LinearQuery, Fraction], ...] = ()

    @classmethod
    def of_query(cls, query: LinearQuery, budget: Fraction) -> Charges:
        """What measuring ``query`` with ``budget`` costs."""
        return cls(((query, budget),))

    @classmethod
    def of(cls, entries: Iterable[HistoryEntry]) -> Charges:
        """What ``entries`` cost; entries of one vector are merged (their budgets add up).

        Equal budgets of a vector are counted, then multiplied: a ledger's load gives them one
        ``Fraction`` (compared by identity here, kept alive by ``budgets``), and a rational sum
        per row was most of replaying 100,000 rows.
        """
        queries: dict[bytes, LinearQuery] = {}
        budgets: dict[int, Fraction] = {}
        counts: Counter[tuple[bytes, int]] = Counter()
        for entry in entries:
            query, budget = entry.query, entry.budget
            key = query.key
            queries.setdefault(key, query)
            budgets.setdefault(id(budget), budget)
            counts[key, id(budget)] += 1
        merged: dict[bytes, Fraction] = {}  # (a vector's first pair comes in its order)
        for (key, which), count in counts.items():
            # most vectors have one row: its budget as it is (a sum with zero cost a restart
            # 0.1 s of Fraction arithmetic)
            charge = budgets[which] if count == 1 else budgets[which] * count
            known = merged.get(key)
            merged[key] = charge if known is None else known + charge
        return cls(tuple((queries[key], total) for key, total in merged.items()))

    def __add__(self, other: Charges) -> Charges:
        return Charges(self.items + other.items)

    def __bool__(self) -> bool:
        return bool(self.items)

    def numerators(self, denominator: int = 1) -> tuple[IntArray, Numerators, int]:
        """Every touched cell (in order of first touch), its charge's numerator, their denominator.

        The denominator is common to all and a multiple of ``denominator``.
        """
        parts = []
        for query, budget in self.items:
            cells, magnitudes = _charged(query)
            inverse, charges = _distinct_charges(magnitudes, query.sensitivity, budget)
            parts.append((cells, inverse, charges))
            for charge in charges:
                denominator = math.lcm(denominator, charge.denominator)
        if not parts:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), denominator
        values = [_over(charges, denominator)[inverse] for _, inverse, charges in parts]
        cells = np.concatenate([c for c, _, _ in parts])
        # a cell is charged at most once per charge
        nums = _summable(_narrowed(np.concatenate(values)), len(parts))
        unique, first, inverse = np.unique(cells, return_index=True, return_inverse=True)
        totals: Numerators = np.zeros(unique.size, dtype=nums.dtype)
        np.add.at(totals, inverse, nums)
        order = np.argsort(first, kind="stable")
        return unique[order], _narrowed(totals[order]), denominator

    def per_cell(self) -> dict[int, Fraction]:
        """Every touched cell's exact charge (for tests and inspection: one entry per cell)."""
        cells, nums, denominator = self.numerators()
        return {c: Fraction(int(n), denominator) for c, n in zip(cells.tolist(), nums.tolist())}

    def __iter__(self) -> Iterator[tuple[LinearQuery, Fraction]]:
        return iter(self.items)


def _merged(
    terms: list[tuple[tuple[int, ...], Numerators]],
) -> dict[tuple[int, ...], Numerators]:
    """Terms over the same dimensions added up (one tensor per set of dimensions)."""
    merged: dict[tuple[int, ...], Numerators] = {}
    for axes, tensor in terms:
        if axes in merged:  # kept an array: two 0-d object arrays add up to a Python int
            total = _plus(merged[axes], tensor)
            tensor = np.asarray(total, object if isinstance(total, int) else total.dtype)
        merged[axes] = tensor
    return merged


# charges priced by CellBudget._priced: per group, its axes, members and numerators; and the
# denominator of all
_Prices = tuple[list[tuple[tuple[int, ...], list[int], Numerators]], int]


def _same_charges(first: Charges, second: Charges) -> bool:
    """Whether two charges are of the same query objects at equal budgets, in order."""
    return len(first.items) == len(second.items) and all(
        query is other and budget == other_budget
        for (query, budget), (other, other_budget) in zip(first.items, second.items)
    )


def _nested(on_grid: list[Numerators], wide: bool, grid_size: int) -> list[Numerators]:
    """Terms on the grid added up into few, each still far smaller than the grid.

    A restart commits a term per set of dimensions its history named (164 on the wide
    cube's m = 10,000, 2.2 M grid cells): each added to the grid alone is a pass over it.
    A term over dimensions within another's is added to that one; else to the sum whose
    dimensions, with its own, span the fewest grid cells, if at most a ``_SUMMED_SHARE``-th of
    the grid (on that cube: 6 passes, not 62). ``wide``: the sums may not fit int64 (taken in
    Python integers).
    """
    sums: list[Numerators] = []
    for term in sorted(on_grid, key=lambda t: -t.size):
        term = term.astype(object) if wide else term
        spans = [math.prod(map(max, s.shape, term.shape)) for s in sums]
        into = min(range(len(sums)), key=spans.__getitem__, default=None)
        if into is not None and (
            spans[into] == sums[into].size or spans[into] * _SUMMED_SHARE <= grid_size
        ):
            sums[into] = sums[into] + term
        else:
            sums.append(term)
    return sums


def _narrowed(values: Numerators) -> Numerators:
    """``values`` as int64 when every one fits with room to add, else as Python integers."""
    if values.size == 0 or values.dtype == np.int64:
        return values
    if max(abs(int(values.max())), abs(int(values.min()))) < _INT64_ROOM // 4:
        return values.astype(np.int64)
    return values.astype(object)


def _summable(values: Numerators, count: int) -> Numerators:
    """``values`` as Python integers if a sum of ``count`` of them might not fit int64.

    Charges are never negative: the largest times ``count`` bounds every such sum.
    """
    if values.dtype == np.int64 and int(values.max(initial=0)) * count >= _INT64_ROOM // 4:
        return values.astype(object)
    return values


def cell_charges(query: LinearQuery, budget: Fraction) -> Charges:
    """What measuring ``query`` with ``budget`` costs each cell it touches.

    >>> cell_charges(LinearQuery.from_dense([2.0, 1.0, 0.0]), Fraction(1, 20)).per_cell()
    {0: Fraction(1, 20), 1: Fraction(1, 40)}
    """
    return Charges.of_query(query, budget)


def format_budget(value: Fraction, *, up: bool) -> str:
    """A budget to 6 significant digits, rounded against the analyst (costs up, funds down).

    >>> format_budget(Fraction(1, 3), up=True), format_budget(Fraction(1, 3), up=False)
    ('0.333334', '0.333333')
    """
    if value == 0:
        return "0"
    unit = Fraction(10) ** (math.floor(math.log10(abs(value))) - 5)
    scaled = value / unit
    digits = math.ceil(scaled) if up else math.floor(scaled)
    return f"{float(digits * unit):.6g}"


class CellBudget:
    """Per-cell spending ``B_j`` for one table against the DBA's ``total``.

    >>> budget = CellBudget("t", total=Fraction(1))
    >>> budget.commit(cell_charges(LinearQuery.from_dense([1.0, 2.0]), Fraction(1, 2)))
    >>> budget.spent, budget.remaining, budget.spent_on(0)
    (Fraction(1, 2), Fraction(1, 2), Fraction(1, 4))
    """

    def __init__(
        self,
        table: str,
        *,
        total: Fraction,
        carried: Fraction = Fraction(0),
        user: str | None = None,
        shape: tuple[int, ...] | None = None,
    ) -> None:
        """``user``: this budget is one analyst's share of the table (a per-user cap).

        ``shape``: the cube's; the spend is then kept per cell, charged tensor by tensor.
        """
        if not isinstance(total, Fraction) or total <= 0:
            raise ValueError("total budget must be a positive Fraction")
        if carried < 0:
            raise ValueError("carried budget cannot be negative")
        self.table = table
        self.user = user
        self.total = total
        # spent before the table's cube was redefined: charged to every cell, since the old
        # cells cannot be mapped onto the new ones
        self.carried = carried
        self._partition: Partition | None = None  # made at the first charge (it knows n_cells)
        self._denominator = 1
        self._spent: Numerators = np.zeros(1, dtype=np.int64)
        self._max = 0  # the largest numerator of any atom
        self._shape = None if shape is None else tuple(int(s) for s in shape)
        # with a shape: per dimension, each value's class (values no charge has told apart
        # share one) and each class's smallest value; the spend per cell of the classes' grid
        self._classes = [np.zeros(n, dtype=np.int64) for n in self._shape or ()]
        self._firsts = [np.zeros(1, dtype=np.int64) for _ in self._shape or ()]
        self._grid: Numerators = np.zeros((1,) * len(self._shape or ()), dtype=np.int64)
        # the grid's maxima over the dimensions outside a set (see _Maxima), by the set
        self._maxima = _Maxima()
        # the charges last priced, the denominator they were priced for and their prices: a
        # statement's commit prices what its check priced (see _priced)
        self._last_priced: tuple[Charges, int, _Prices] | None = None
        # the charges the grid was last refined for (a check's, a spent_after's): classes only
        # split, so their commit's refinement would split none (see _commit_tensors)
        self._refined: Charges | None = None

    def __getstate__(self) -> dict[str, object]:
        """The budget's state for a copy: the spend, not the pricing kept for a commit."""
        state = dict(self.__dict__)
        state["_last_priced"] = None
        state["_refined"] = None
        return state

    @property
    def spent(self) -> Fraction:
        """The table's privacy loss so far, ``max_j B_j``."""
        return self.carried + Fraction(self._max, self._denominator)

    @property
    def remaining(self) -> Fraction:
        """``total - max_j B_j``."""
        return self.total - self.spent

    def spent_on(self, cell: int) -> Fraction:
        """``B_j``."""
        if self._shape is not None:
            spent = self._grid[self._grid_cells(np.array([cell], dtype=np.int64))][0]
            return self.carried + Fraction(int(spent), self._denominator)
        if self._partition is None:
            return self.carried
        return self.carried + Fraction(
            int(self._spent[self._partition.atom_of[cell]]), self._denominator
        )

    def most_spent_on(self, cells: IntArray) -> Fraction:
        """``max_j B_j`` over ``cells`` (``carried`` if none was charged).

        >>> budget = CellBudget("t", total=Fraction(1), carried=Fraction(1, 10))
        >>> budget.commit(cell_charges(LinearQuery.from_dense([1.0, 2.0, 0.0]), Fraction(1, 2)))
        >>> budget.most_spent_on(np.array([0, 2])), budget.most_spent_on(np.array([2]))
        (Fraction(7, 20), Fraction(1, 10))
        """
        if cells.size == 0:
            return self.carried
        if self._shape is not None:
            most = int(self._grid[self._grid_cells(cells)].max())
        elif self._partition is None:
            return self.carried
        else:
            most = int(self._spent[self._partition.atom_of[cells]].max())
        return self.carried + Fraction(most, self._denominator)

    def most_spent_by(self, query: LinearQuery) -> Fraction:
        """:meth:`most_spent_on` the cells a row of which moves ``query``.

        On the grid a factored query's cells are never listed (a wide cube's range count
        covers a million): the grid's most over the dimensions the query does not name, read
        at the classes of the values it weighs.
        """
        if self._shape is None or not query.factored:
            return self.most_spent_on(_charged(query)[0])
        magnitudes = query.sensitivity_tensor()
        if not magnitudes.any():
            return self.carried
        axes = query.axes
        if not axes:
            return self.spent  # every cell
        weighed = np.nonzero(magnitudes)
        # the classes of the values it weighs, on the grid; the grid read only in their box
        classes = np.zeros([self._firsts[d].size for d in axes], dtype=bool)
        classes[tuple(self._classes[d][v] for d, v in zip(axes, weighed))] = True
        term = classes.reshape(
            [self._firsts[d].size if d in axes else 1 for d in range(len(self._shape))]
        )
        box = _Box.of(term)
        others = tuple(d for d in range(len(self._shape)) if d not in axes)
        spent = box.read(self._grid).max(axis=others, keepdims=True)
        most = spent[np.broadcast_to(box.restrict(term), spent.shape)].max()
        return self.carried + Fraction(int(most), self._denominator)

    def per_cell(self) -> dict[int, Fraction]:
        """A copy of every ``B_j`` charged since the cube was last defined (without ``carried``)."""
        if self._shape is not None:  # every cell of the cube: for tests and reports
            per_cell = self._grid[np.ix_(*self._classes)].ravel()
        elif self._partition is None:
            return {}
        else:
            per_cell = self._spent[self._partition.atom_of]
        (cells,) = np.nonzero(per_cell)
        return {
            c: Fraction(int(n), self._denominator)
            for c, n in zip(cells.tolist(), per_cell[cells].tolist())
        }

    def check(self, charges: Charges, *, request: str) -> None:
        """Raise :class:`BudgetExhausted` unless every cell can pay its charge.

        Args:
            charges: cost of everything about to be measured (one batch).
            request: what was asked, for the error message.
        """
        if self._shape is not None:
            self._check_tensors(charges, request)
            return
        cells, nums, after, denominator = self._after_cells(charges)
        if cells.size == 0:
            return
        worst = int(np.argmax(after))  # the first of equals, in the order cells were touched
        if self.carried + Fraction(int(after[worst]), denominator) <= self.total:
            return
        self._refuse(int(cells[worst]), Fraction(int(nums[worst]), denominator), request)

    def spent_after(self, charges: Charges) -> Fraction:
        """:attr:`spent` once ``charges`` are committed, without committing them.

        Only the cells they charge are read: the others keep their spend, and spend only grows.

        >>> budget = CellBudget("t", total=Fraction(1), carried=Fraction(1, 10))
        >>> budget.commit(cell_charges(LinearQuery.from_dense([1.0, 0.0]), Fraction(1, 2)))
        >>> budget.spent_after(cell_charges(LinearQuery.from_dense([0.0, 1.0]), Fraction(1, 4)))
        Fraction(3, 5)
        >>> budget.spent_after(cell_charges(LinearQuery.from_dense([1.0, 1.0]), Fraction(1, 4)))
        Fraction(17, 20)
        """
        if self._shape is not None:
            merged, denominator = self._summed(charges)
            most = 0
            if merged:
                self._refine(merged.items())  # a finer grid of the same spend: nothing charged
                self._refined = charges
                most = self._most_after(self._all_on_grid(merged), denominator)
        else:
            cells, _, after, denominator = self._after_cells(charges)
            most = int(after.max()) if cells.size else 0
        scale = denominator // self._denominator
        return self.carried + Fraction(max(self._max * scale, most), denominator)

    def _after_cells(self, charges: Charges) -> tuple[IntArray, Numerators, Numerators, int]:
        """By atoms: the cells ``charges`` touch, their charges and their spend with them.

        The numerators are over the returned denominator, a multiple of the budget's.
        """
        cells, nums, denominator = charges.numerators(self._denominator)
        if cells.size == 0 or self._partition is None:
            return cells, nums, nums, denominator
        spent = self._spent[self._partition.atom_of[cells]]
        if denominator != self._denominator:
            spent = spent.astype(object) * (denominator // self._denominator)
        return cells, nums, _narrowed(spent + nums), denominator

    def _refuse(self, worst_cell: int, need: Fraction, request: str) -> None:
        left = self.total - self.spent_on(worst_cell)
        holder = "table" if self.user is None else "user"
        whose = "table" if self.user is None else f'user "{self.user}" on table'
        raise BudgetExhausted(
            f'privacy budget of {whose} "{self.table}" exhausted',
            detail=(
                f"Answering {request} needs a fresh measurement costing "
                f"{format_budget(need, up=True)} on cell {worst_cell}, which has "
                f"{format_budget(left, up=False)} of its {format_budget(self.total, up=False)} "
                f"left (the {holder} has spent "
                f"{format_budget(self.spent, up=True)})."
            ),
            hint="Ask for a wider interval or a lower confidence, or a query that earlier "
            "answers already determine.",
        )

    def commit(self, charges: Charges) -> None:
        """Add ``charges`` to the cells (call :meth:`check` first)."""
        if self._shape is not None:
            self._commit_tensors(charges)
            return
        for query, budget in charges:
            cells, magnitudes = _charged(query)
            if self._partition is None:
                self._partition = Partition(query.cube_cells)
            if self._partition.refine(cells, magnitudes):
                # a split atom's parts have spent what it had
                parent = self._partition.parent
                grown = self._spent[parent[self._spent.size :]]
                self._spent = np.concatenate([self._spent, grown])
            located = self._partition.locate(cells, magnitudes)
            assert located is not None  # just refined by this vector
            atoms, atom_magnitudes = located
            inverse, distinct = _distinct_charges(atom_magnitudes, query.sensitivity, budget)
            denominator = self._denominator
            for charge in distinct:
                denominator = math.lcm(denominator, charge.denominator)
            if denominator != self._denominator:
                self._spent = _rescaled(self._spent, self._denominator, denominator, most=self._max)
                self._max *= denominator // self._denominator
                self._denominator = denominator
            adds = _over(distinct, denominator)
            if self._spent.dtype == np.int64 and self._max + int(adds.max()) >= _INT64_ROOM // 4:
                self._spent = self._spent.astype(object)
            self._spent[atoms] += adds[inverse].astype(self._spent.dtype)
            self._max = max(self._max, int(self._spent[atoms].max()))

    # -- the spend per cell, charged by tensors (with the cube's shape) ---------------------

    def _tensors(self, charges: Charges) -> tuple[list[tuple[tuple[int, ...], Numerators]], int]:
        """Per charge, in order: its axes and numerators per cell of them; their denominator.

        The denominator is common to all and a multiple of the budget's.
        """
        priced, denominator = self._priced(charges)
        terms: list[tuple[tuple[int, ...], Numerators]] = [((), np.zeros(0))] * len(charges.items)
        for axes, members, values in priced:
            for j, i in enumerate(members):
                terms[i] = (axes, values[j, ...])  # an array, even over no dimension
        return terms, denominator

    def _summed(self, charges: Charges) -> tuple[dict[tuple[int, ...], Numerators], int]:
        """:func:`_merged` of :meth:`_tensors`: the terms over each set of dimensions summed.

        Each group of charges priced together is summed at once (a restart's 6,182 charges on
        the wide cube at m = 10,000: 164 sums, not an addition per charge), exactly: in int64
        while the sum is bound to fit, else in Python integers.
        """
        priced, denominator = self._priced(charges)
        sums = []
        for axes, _, values in priced:
            values = _summable(values, values.shape[0])
            sums.append((axes, np.asarray(values.sum(axis=0), dtype=values.dtype)))
        return _merged(sums), denominator

    def _priced(self, charges: Charges) -> _Prices:
        """The charges priced in groups of one shape and sensitivity, and their denominator.

        Per group: its axes, its members (positions in ``charges``) and their numerators per
        cell of the axes, stacked (members first). The denominator is common to all and a
        multiple of the budget's. The same queries at the same budgets as the last priced (a
        statement's commit after its check) are not priced again: they were 0.2-0.6 ms of a
        fresh statement's commit on the wide cube.
        """
        last = self._last_priced
        if last is not None and last[1] == self._denominator and _same_charges(last[0], charges):
            return last[2]
        prices = self._prices(charges)
        self._last_priced = (charges, self._denominator, prices)
        return prices

    def _prices(self, charges: Charges) -> _Prices:
        """:meth:`_priced`, computed."""
        assert self._shape is not None
        # charges of one shape and sensitivity (a GROUP BY's groups; a restart's vectors over
        # the same dimensions) priced together: their cells' distinct sensitivities at once, then
        # per distinct budget among them (keyed by integers: a Fraction's hash is slow)
        alike: dict[tuple[tuple[int, ...], float], list[int]] = {}
        magnitudes = []
        for i, (query, _) in enumerate(charges):
            if query.core is None:
                full = (query.kinds, *self._shape)
                query = LinearQuery.from_tensor(
                    self._shape, query.to_dense().reshape(full), measures=query.measures
                )
            # the cells' sensitivities s_ij (measures: by the box of bounds) over its axes
            magnitudes.append(query.sensitivity_tensor())
            alike.setdefault((query.axes, query.sensitivity), []).append(i)
        budgets = [budget for _, budget in charges]
        parts = []
        denominator = self._denominator
        for (axes, sensitivity), members in alike.items():
            stacked = np.stack([magnitudes[i] for i in members])
            charged = stacked != 0  # a group's cells are few of its tensor's: the rest pay 0
            distinct, inverse = np.unique(stacked[charged], return_inverse=True)
            which: dict[tuple[int, int], int] = {}  # a distinct budget's row in the table
            priced: list[Fraction] = []
            of_member = []
            for i in members:
                key = (budgets[i].numerator, budgets[i].denominator)
                if key not in which:
                    which[key] = len(priced)
                    priced.append(budgets[i])
                of_member.append(which[key])
            # each charged entry's budget (entries are member by member, in C order) and
            # sensitivity: the pairs that occur, each priced once
            per_entry = np.repeat(of_member, charged.reshape(len(members), -1).sum(axis=1))
            pairs, pair_of = np.unique(
                per_entry * distinct.size + inverse.ravel(), return_inverse=True
            )
            values_of = distinct.tolist()
            prices = [
                _charge(priced[p // distinct.size], sensitivity, values_of[p % distinct.size])
                for p in pairs.tolist()
            ]
            for charge in prices:
                denominator = math.lcm(denominator, charge.denominator)
            parts.append((axes, members, charged, pair_of.ravel(), prices))
        priced_parts = []
        for axes, members, charged, pair_of, prices in parts:
            over = _over(prices, denominator)
            values = np.zeros(charged.shape, dtype=over.dtype)
            values[charged] = over[pair_of]
            values.flags.writeable = False  # (kept for the commit: read, never changed)
            priced_parts.append((axes, members, values))
        return priced_parts, denominator

    def _grid_cells(self, cells: IntArray) -> tuple[IntArray, ...]:
        """The grid's index of each of ``cells``."""
        assert self._shape is not None
        values = np.unravel_index(cells, self._shape)
        return tuple(c[v] for c, v in zip(self._classes, values))

    def _refine(self, terms: Iterable[tuple[tuple[int, ...], Numerators]]) -> None:
        """Split classes of values that ``terms`` tell apart (the grid's spend is copied).

        Two values of a dimension stay in one class while the charges over each set of
        dimensions, summed, have the same slice at both, so every cell's spend is the same with
        either: the spend is constant on the grid's cells, and the grid grows with what charges
        distinguish, not with the cube. ``terms``: the charges summed over each set of
        dimensions (:func:`_merged`), or each alone (a term's own cells, which a refusal names).
        """
        for axes, tensor in terms:
            codes = np.unique(tensor.ravel(), return_inverse=True)[1].reshape(tensor.shape)
            for position, d in enumerate(axes):
                rows = np.moveaxis(codes, position, 0).reshape(codes.shape[position], -1)
                keyed = np.ascontiguousarray(np.column_stack([self._classes[d], rows]))
                as_bytes = keyed.view(np.dtype((np.void, keyed.dtype.itemsize * keyed.shape[1])))
                _, first, classes = np.unique(
                    as_bytes.ravel(), return_index=True, return_inverse=True
                )
                if first.size == self._firsts[d].size:
                    continue  # nothing split
                self._grid = np.take(self._grid, self._classes[d][first], axis=d)
                self._maxima.split(d, self._classes[d][first])
                self._classes[d] = classes.ravel().astype(np.int64)
                self._firsts[d] = first.astype(np.int64)  # first occurrences: smallest values

    def _on_grid(self, axes: tuple[int, ...], tensor: Numerators) -> Numerators:
        """A term over ``axes`` (refined for) at each grid cell, broadcasting to the grid."""
        for position, d in enumerate(axes):
            tensor = np.take(tensor, self._firsts[d], axis=position)
        shape = [self._firsts[d].size if d in axes else 1 for d in range(len(self._classes))]
        return tensor.reshape(shape)

    def _all_on_grid(self, merged: dict[tuple[int, ...], Numerators]) -> list[Numerators]:
        """The terms summed over each set of dimensions (:func:`_merged`), on the grid."""
        return [self._on_grid(axes, tensor) for axes, tensor in merged.items()]

    def _scaled(self, spent: Numerators, denominator: int, *, own: bool = False) -> Numerators:
        """Numerators of the budget's as numerators over ``denominator`` (a multiple of it).

        ``spent`` is part of the grid, or maxima of it, so the most spent bounds it without a
        pass over it (a restart's grid has millions of cells); ``own``: it is ours to change
        (the grid itself), multiplied in place rather than copied.
        """
        return _rescaled(spent, self._denominator, denominator, most=self._max, in_place=own)

    def _after(
        self, box: _Box, on_grid: list[Numerators], denominator: int
    ) -> tuple[Numerators, npt.NDArray[np.bool_]]:
        """The spend in ``box`` with the terms ``on_grid`` added, and the cells they charge.

        The second is a mask that broadcasts to the first.
        """
        after = self._scaled(box.read(self._grid), denominator)
        in_box = [box.restrict(t) for t in on_grid]
        most = self._max * (denominator // self._denominator)  # the grid's, so the box's too
        return _added(after, in_box, most)

    def _most_after(self, on_grid: list[Numerators], denominator: int) -> int:
        """The most any cell the terms ``on_grid`` charge will have spent, over ``denominator``.

        The terms are constant along the dimensions none of them names, so only the grid's
        maxima over those count: kept per set of named dimensions (:class:`_Maxima`), they are
        read instead of the grid. A cell no term charges keeps its spend.
        """
        named = tuple(sorted({d for t in on_grid for d, size in enumerate(t.shape) if size > 1}))
        boxes = [_Box.of(t) for t in on_grid]
        spent = self._maxima.of(named, boxes, self._grid, self._denominator)
        after = self._scaled(spent, denominator)
        most = self._max * (denominator // self._denominator)  # the grid's, so the maxima's too
        after, support = _added(after, on_grid, most)
        charged = after[np.broadcast_to(support, after.shape)]
        return int(charged.max()) if charged.size else 0

    def _check_tensors(self, charges: Charges, request: str) -> None:
        # summed per group priced together (exact integers, as the terms one by one would add)
        merged, denominator = self._summed(charges)
        if not merged:
            return
        self._refine(merged.items())  # only a finer grid of the same spend: nothing is charged
        self._refined = charges
        worst = self._most_after(self._all_on_grid(merged), denominator)
        if self.carried + Fraction(worst, denominator) <= self.total:
            return
        # the first of equals in the order cells were touched (charge by charge, cells
        # increasing), as the partition's check reports it: on a grid fine enough for each
        # term's cells, a grid cell's first cell has each class's smallest value, and cells
        # increase as their values do (C order)
        terms, _ = self._tensors(charges)  # (priced above: each charge's own term)
        self._refine(terms)
        on_grid = self._all_on_grid(merged)
        for axes, term in terms:
            own = self._on_grid(axes, term)
            box = _Box.of(own)
            after, _ = self._after(box, on_grid, denominator)
            hit = np.nonzero((after == worst) & (box.restrict(own) != 0))
            if hit[0].size:
                at = box.position(hit)
                values = [f[h] for f, h in zip(self._firsts, at)]
                first = int(np.lexsort(values[::-1])[0])
                assert self._shape is not None
                cell = int(np.ravel_multi_index([v[first] for v in values], self._shape))
                in_box = tuple(h[first] for h in hit)
                break
        spent = int(self._grid[tuple(a[first] for a in at)]) * (denominator // self._denominator)
        self._refuse(cell, Fraction(int(after[in_box]) - spent, denominator), request)

    def _commit_tensors(self, charges: Charges) -> None:
        merged, denominator = self._summed(charges)
        self._last_priced = None  # (kept for this commit only: a 378-group batch's are 18 MB)
        if not merged:
            return
        if self._refined is None or not _same_charges(self._refined, charges):
            self._refine(merged.items())  # (else its check refined for them: nothing splits)
        self._refined = None
        if denominator != self._denominator:
            self._grid = self._scaled(self._grid, denominator, own=True)
            self._max *= denominator // self._denominator
            self._denominator = denominator
        on_grid = self._all_on_grid(merged)
        largest = sum(int(t.max()) for t in on_grid)
        wide = self._max + largest >= _INT64_ROOM // 4 or any(t.dtype == object for t in on_grid)
        if self._grid.dtype == np.int64 and wide:
            self._grid = self._grid.astype(object)
        grid = self._grid
        whole = False
        # spend only grows: the most is the old most or a charged cell's new spend
        for term in _nested(on_grid, wide, grid.size):
            box = _Box.of(term)
            size = box.size(grid.shape)
            if size == grid.size or (box.meshed and size * _WHOLE_GRID >= grid.size):
                # all of the grid (a restart's terms: their maximum taken once), or most of it
                # and not a view: added in place, not read and written. (A view, such as a
                # range's third of the wide cube's grid, is added at its own size: the whole
                # grid's add and maximum took 2 of the 4.7 ms of its first GROUP BY's commit.)
                np.add(grid, term.astype(grid.dtype), out=grid)
                whole = True
            else:
                self._max = max(self._max, int(box.add(grid, term).max()))
            self._maxima.charged(box, term, denominator)
        if whole:
            self._max = max(self._max, int(grid.max()))


class _Maxima:
    """The grid's maxima over the dimensions outside a set ``U``, kept per set as charges come.

    A check whose terms name the dimensions ``U`` needs, per class of ``U`` a term charges, the
    most any cell of it has spent (the maximum ``M_U`` over the other dimensions); read off the
    grid, that costs the terms' boxes, and a GROUP BY with no WHERE has the whole grid in its
    box (a wide cube's: millions of cells). So ``M_U`` is kept, for the last ``_MAXIMA_SETS``
    sets asked, where it was read, with the charges committed since it was last brought up to
    date (their boxes and terms, on the grid). Spend only grows, and a charge is zero outside
    its box: ``M_U`` after them is ``M_U`` plus the charges over dimensions within ``U``
    (constant along the others), raised to the grid's maxima over the boxes of the others, read
    from the grid when the set is next asked. Integers over the budget's denominators, exactly
    as the grid's.
    """

    def __init__(self) -> None:
        # U -> (M_U, where it was read, its denominator, the log position it is up to date with)
        self._sets: dict[tuple[int, ...], tuple[Numerators, BoolArray, int, int]] = {}
        self._log: list[tuple[_Box, Numerators, int]] = []  # charges: box, term, denominator
        self._start = 0  # the log position of _log[0]

    def of(
        self, named: tuple[int, ...], boxes: list[_Box], grid: Numerators, denominator: int
    ) -> Numerators:
        """``M_U`` for ``U = named`` over ``denominator`` (the grid's), keeping the grid's dims.

        Exact in ``boxes`` (along the dimensions of ``U``: those of terms over ``U``), and
        wherever it was read and is kept; the grid itself when every dimension it splits is
        in ``U``.
        """
        others = tuple(d for d in range(grid.ndim) if d not in named and grid.shape[d] > 1)
        if not others:
            return grid
        kept = self._sets.pop(named, None)
        pending = [] if kept is None else self._log[kept[3] - self._start :]
        foreign = [(box, term) for box, term, _ in pending if _names_outside(term, named)]
        # re-read where the others charged unless reading the boxes afresh costs less
        afresh = sum(box.within(named).size(grid.shape) for box in boxes)
        if kept is None or sum(box.size(grid.shape) for box, _ in foreign) >= afresh:
            shape = [n if d in named else 1 for d, n in enumerate(grid.shape)]
            maxima: Numerators = np.zeros(shape, dtype=grid.dtype)
            read = np.zeros(shape, dtype=bool)
        else:
            maxima, read, scale = kept[0], kept[1], kept[2]
            for _, term, over in pending:
                maxima = _rescaled(maxima, scale, over)
                scale = over
                if not _names_outside(term, named):  # constant along the others: it adds
                    maxima = _plus(maxima, term)
            maxima = _rescaled(maxima, scale, denominator)
            for box, _ in foreign:  # where it charged, the grid as it is now
                maxima = _raised(maxima, box, grid, others, named)
        for box in boxes:
            within = box.within(named)
            if not within.read(read).all():
                maxima = _raised(maxima, box, grid, others, named, exactly=True)
                within.write(read, np.ones_like(within.read(read)))
        if maxima.size * _MAXIMA_SHARE <= grid.size:  # far smaller than the grid: worth keeping
            self._sets[named] = (maxima, read, denominator, self._start + len(self._log))
            while len(self._sets) > _MAXIMA_SETS:
                del self._sets[next(iter(self._sets))]  # the least recently asked
        self._prune()
        return maxima

    def charged(self, box: _Box, term: Numerators, denominator: int) -> None:
        """A term committed to ``box`` of the grid, over ``denominator``."""
        if self._sets:
            self._log.append((box, term, denominator))
            if len(self._log) > _MAXIMA_LOG:  # a set not asked for long: made afresh if asked
                oldest = min(kept[3] for kept in self._sets.values())
                self._sets = {u: kept for u, kept in self._sets.items() if kept[3] != oldest}
                self._prune()

    def split(self, d: int, parents: IntArray) -> None:
        """Dimension ``d``'s classes split: new class ``i`` was class ``parents[i]``."""
        self._sets = {
            named: (
                (np.take(m, parents, axis=d), np.take(read, parents, axis=d), over, position)
                if d in named
                else (m, read, over, position)
            )
            for named, (m, read, over, position) in self._sets.items()
        }
        for i, (_, term, over) in enumerate(self._log):
            if term.shape[d] > 1:
                term = np.take(term, parents, axis=d)
                self._log[i] = (_Box.of(term), term, over)

    def _prune(self) -> None:
        """Forget the charges every kept set is up to date with."""
        upto = min((kept[3] for kept in self._sets.values()), default=None)
        if upto is None:
            self._start += len(self._log)
            self._log = []
        elif upto > self._start:
            del self._log[: upto - self._start]
            self._start = upto


def _names_outside(term: Numerators, named: tuple[int, ...]) -> bool:
    """Whether ``term`` (on the grid) varies along a dimension outside ``named``."""
    return any(size > 1 and d not in named for d, size in enumerate(term.shape))


def _plus(values: Numerators, term: Numerators) -> Numerators:
    """``values + term``, as Python integers if int64 might not hold it."""
    if values.dtype != object and (
        term.dtype == object or int(values.max()) + int(term.max()) >= _INT64_ROOM // 4
    ):
        values = values.astype(object)
    return values + term


def _raised(
    maxima: Numerators,
    box: _Box,
    grid: Numerators,
    others: tuple[int, ...],
    named: tuple[int, ...],
    *,
    exactly: bool = False,
) -> Numerators:
    """``maxima`` raised to the grid's maxima over ``others`` in ``box`` (set to, ``exactly``).

    ``box`` picks along ``named`` only, if ``exactly``: every class of the others.
    """
    part = box.read(grid).max(axis=others, keepdims=True)
    if part.dtype == object and maxima.dtype != object:
        maxima = maxima.astype(object)
    within = box.within(named)
    within.write(maxima, part if exactly else np.maximum(within.read(maxima), part))
    return maxima


def _rescaled(
    values: Numerators,
    denominator: int,
    to: int,
    *,
    most: int | None = None,
    in_place: bool = False,
) -> Numerators:
    """Numerators over ``denominator`` as numerators over ``to`` (a multiple of it).

    ``most``: a known bound on the values' magnitudes (else found by a pass over them);
    ``in_place``: ``values`` may be multiplied where they lie.
    """
    if to == denominator:
        return values
    factor = to // denominator
    if values.dtype == np.int64 and factor < _INT64_ROOM // 4:
        # in int64 when the products fit as :func:`_narrowed` would keep them (a restart's
        # grid: millions of cells, converted to Python integers and back for nothing)
        if most is None:
            most = int(np.abs(values).max(initial=0))
        if most * factor < _INT64_ROOM // 4:
            return np.multiply(values, factor, out=values) if in_place else values * factor
    return _narrowed(values.astype(object) * factor)


@dataclass(frozen=True, slots=True)
class _Box:
    """The part of the grid a term charges.

    Along each dimension it names, the classes where it is not zero (``picks``); along the
    others, every class.

    Read and written with one index: a pick of consecutive classes as a slice, the other picks
    as an open mesh, slices elsewhere. A box of slices alone is a view of the grid, read and
    added to in place (a GROUP BY over a range of age charges a third of the wide cube's grid:
    gathered and scattered back, that took 2-6 ms of its commit and check). NumPy puts the
    meshed dimensions first when they are not adjacent; :meth:`read` and :meth:`write` hand
    over arrays in the grid's order of dimensions.
    """

    axes: tuple[int, ...]  # the dimensions picked from (a term's, unless it charges them all)
    picks: tuple[IntArray, ...]
    index: tuple[Any, ...]
    meshed: tuple[int, ...]  # the dimensions of axes indexed by arrays (the rest by slices)

    @classmethod
    def of(cls, term: Numerators) -> _Box:
        """The box of ``term`` on the grid (1 along a dimension it is constant on)."""
        nonzero = term != 0
        picked = []
        for d, size in enumerate(term.shape):
            if size == 1:
                continue
            along = nonzero.any(axis=tuple(o for o in range(term.ndim) if o != d))
            if not along.all():
                picked.append((d, np.flatnonzero(along)))
        return cls.along(picked, term.ndim)

    @classmethod
    def along(cls, picked: list[tuple[int, IntArray]], ndim: int) -> _Box:
        """The box of classes ``picks`` along each of its dimensions, every class elsewhere."""
        axes = tuple(d for d, _ in picked)
        picks = tuple(p for _, p in picked)
        index: list[Any] = [slice(None)] * ndim
        meshed = []
        for d, pick in picked:
            if pick.size and int(pick[-1]) - int(pick[0]) == pick.size - 1:  # (picks increase)
                index[d] = slice(int(pick[0]), int(pick[-1]) + 1)
            else:
                meshed.append((d, pick))
        for (d, _), mesh in zip(meshed, np.ix_(*(pick for _, pick in meshed))):
            index[d] = mesh
        return cls(axes, picks, tuple(index), tuple(d for d, _ in meshed))

    def within(self, named: tuple[int, ...]) -> _Box:
        """The box's picks along the dimensions ``named`` only."""
        return _Box.along(
            [(d, p) for d, p in zip(self.axes, self.picks) if d in named], len(self.index)
        )

    def size(self, shape: tuple[int, ...]) -> int:
        """The number of cells of the box on a grid of ``shape``."""
        picked = dict(zip(self.axes, self.picks))
        return math.prod(picked[d].size if d in picked else n for d, n in enumerate(shape))

    @property
    def _moved(self) -> bool:
        """Whether NumPy moves the meshed dimensions first (they are not adjacent)."""
        meshed = self.meshed
        return len(meshed) > 1 and meshed[-1] - meshed[0] != len(meshed) - 1

    def read(self, grid: Numerators) -> Numerators:
        """The box's part of ``grid``: a copy, or a view when no pick is meshed (not to write)."""
        part = grid[self.index]
        return np.moveaxis(part, range(len(self.meshed)), self.meshed) if self._moved else part

    def write(self, grid: Numerators, part: Numerators) -> None:
        """Set the box's part of ``grid`` to ``part`` (the box's shape)."""
        grid[self.index] = (
            np.moveaxis(part, self.meshed, range(len(self.meshed))) if self._moved else part
        )

    def add(self, grid: Numerators, term: Numerators) -> Numerators:
        """Add ``term`` (on the grid) to the box's part of ``grid``; that part, after."""
        part = self.read(grid)  # a copy, or a view of the grid when no pick is meshed
        np.add(part, self.restrict(term).astype(grid.dtype), out=part)
        if self.meshed:
            self.write(grid, part)
        return part

    def restrict(self, term: Numerators) -> Numerators:
        """``term`` (on the grid, broadcasting) at the box's cells, broadcasting to them."""
        for d, pick in zip(self.axes, self.picks):
            if term.shape[d] > 1:
                term = np.take(term, pick, axis=d)
        return term

    def position(self, where: tuple[IntArray, ...]) -> tuple[IntArray, ...]:
        """The grid's index of cells of the box (indices into :meth:`read`'s array)."""
        picked = dict(zip(self.axes, self.picks))
        return tuple(picked[d][w] if d in picked else w for d, w in enumerate(where))


@dataclass(frozen=True, slots=True)
class UserCaps:
    """Per-user privacy budgets, on top of each table's total (docs/config.md).

    A user's spend on a table is measured like the table's: per cell, summing what that user's
    fresh measurements charged it, and the most any cell has. ``default`` applies to every user
    without an entry in ``per_user``; ``None`` means no cap.

    >>> caps = UserCaps(Fraction(1, 4), {"dba": Fraction(1)})
    >>> caps.cap("alice"), caps.cap("dba"), UserCaps().cap("alice")
    (Fraction(1, 4), Fraction(1, 1), None)
    """

    default: Fraction | None = None
    per_user: Mapping[str, Fraction] = field(default_factory=dict)

    def cap(self, user: str | None) -> Fraction | None:
        """The cap of ``user`` on each table, if any."""
        if user is not None and user in self.per_user:
            return self.per_user[user]
        return self.default


def _added(
    spent: Numerators, terms: Sequence[Numerators], most: int
) -> tuple[Numerators, npt.NDArray[np.bool_]]:
    """``spent`` with ``terms`` added, and a mask (broadcasting to it) of the cells they charge.

    ``most`` bounds ``spent``: past int64's room the sum is taken in Python ints.
    """
    if spent.dtype != object and (
        any(t.dtype == object for t in terms)
        or most + sum(int(t.max()) for t in terms) >= _INT64_ROOM // 4
    ):
        spent = spent.astype(object)
    support = np.zeros((1,) * spent.ndim, dtype=bool)
    for term in terms:
        spent = spent + term
        support = support | (term != 0)
    return spent, support
