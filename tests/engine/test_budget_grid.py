"""The budget on its grid of value classes against the cells it stands for.

Check, commit and the most spent after a batch read only the part of the grid a charge covers
and keep the most spent as charges arrive; here they are run on random factored charges (counts
and measures' sums, classes refined as charges tell values apart, refusals, numerators past
int64) beside the same charges summed cell by cell, and beside the budget by atoms (no shape),
whose refusal names the first cell, in the order cells were touched, at the worst spend.
"""

from __future__ import annotations

import copy
from fractions import Fraction

import numpy as np
import pytest

from proxy.engine.budget import CellBudget, Charges, _Box, _nested
from proxy.errors import BudgetExhausted
from sqlmap.vector import LinearQuery

SHAPE = (3, 4, 2, 5)  # 120 cells: listed by the reference
REACHES = ((0, 4), (-3, 2))
# a Mersenne prime: with it, numerators over the common denominator outgrow int64
WIDE_DENOMINATOR = 2**61 - 1


def _factored(rng: np.random.Generator, measures: tuple[tuple[int, int], ...]) -> LinearQuery:
    """A count or measures' sum over 0-3 of the dimensions (adjacent or not): masks as a
    range or IN list makes, or small weights that tell values apart."""
    while True:
        axes = sorted(rng.choice(len(SHAPE), size=int(rng.integers(0, 4)), replace=False))
        kinds = 1 + len(measures)
        shape = [SHAPE[d] if d in axes else 1 for d in range(len(SHAPE))]
        if rng.random() < 0.6:
            core = np.ones(shape)
            for d in axes:
                along = [SHAPE[d] if o == d else 1 for o in range(len(SHAPE))]
                core = core * (rng.random(SHAPE[d]) < 0.6).reshape(along)
        else:
            core = rng.integers(-2, 3, size=shape).astype(float)
        kind = np.zeros((kinds, *[1] * len(SHAPE)))
        kind[int(rng.integers(kinds))] = 1.0
        if kinds > 1 and rng.random() < 0.3:
            kind[int(rng.integers(kinds))] += 0.5  # two kinds: SUM(v) / 2 + COUNT(*)
        query = LinearQuery.from_tensor(SHAPE, kind * core, measures=measures)
        if not query.is_zero:
            return query


def _batch(rng: np.random.Generator, measures: tuple[tuple[int, int], ...]) -> Charges:
    items = []
    for _ in range(int(rng.integers(1, 4))):
        denominator = WIDE_DENOMINATOR if rng.random() < 0.1 else int(rng.choice([8, 3, 10]))
        budget = Fraction(int(rng.integers(1, 2 * denominator)), 4 * denominator)
        items.append((_factored(rng, measures), budget))
    return Charges(tuple(items))


def _plus(spent: dict[int, Fraction], charges: Charges) -> dict[int, Fraction]:
    """Each cell's spend after ``charges``, worked out cell by cell (the reference)."""
    after = dict(spent)
    for cell, charge in charges.per_cell().items():
        after[cell] = after.get(cell, Fraction(0)) + charge
    return after


def _refusal(budget: CellBudget, charges: Charges) -> str | None:
    try:
        budget.check(charges, request="q")
    except BudgetExhausted as refused:
        assert refused.detail is not None
        return refused.detail
    return None


@pytest.mark.parametrize("seed", range(6))
def test_the_grid_equals_the_cells_on_random_factored_charges(seed: int) -> None:
    rng = np.random.default_rng(seed)
    refused = 0
    for _ in range(12):
        measures = REACHES[: int(rng.integers(0, 3))]
        carried = Fraction(int(rng.integers(0, 3)), 7)
        total = carried + Fraction(int(rng.integers(2, 12)), 4)
        grid = CellBudget("t", total=total, carried=carried, shape=SHAPE)
        atoms = CellBudget("t", total=total, carried=carried)
        spent: dict[int, Fraction] = {}  # cell by cell, the sum of every committed charge
        for _ in range(10):
            charges = _batch(rng, measures)
            after = _plus(spent, charges)
            most_after = carried + max(after.values())
            # what answering deep-copied the budget and committed to learn, without the copy
            charged_copy = copy.deepcopy(grid)
            charged_copy.commit(charges)
            assert grid.spent_after(charges) == most_after == charged_copy.spent
            assert atoms.spent_after(charges) == most_after
            assert grid.per_cell() == spent  # working it out charged nothing

            worst = max(after[c] for c in charges.per_cell())
            detail = _refusal(grid, charges)
            assert (detail is not None) == (carried + worst > total)
            assert detail == _refusal(atoms, charges)  # the same cell, cost and what is left
            if detail is not None:
                refused += 1
                continue
            grid.commit(charges)
            atoms.commit(charges)
            spent = after
            assert grid.per_cell() == spent == atoms.per_cell()
            assert grid.spent == carried + max(spent.values()) == atoms.spent
            cells = np.flatnonzero(rng.random(int(np.prod(SHAPE))) < 0.2)
            assert grid.most_spent_on(cells) == carried + max(
                (spent.get(c, Fraction(0)) for c in cells.tolist()), default=Fraction(0)
            )
    assert refused > 0


def test_terms_over_different_dimensions_are_summed_while_small() -> None:
    # a grid of 1,440 cells: terms over dimensions {0} and {1} span 30 cells together (summed,
    # at most a 32nd of the grid), with {2} 120 (not); {0} is within {0, 3}
    grid_size = 6 * 5 * 4 * 4 * 3
    over = {
        axes: np.arange(1, 1 + int(np.prod(shape))).reshape(shape)
        for axes, shape in {
            (0,): (6, 1, 1, 1, 1),
            (1,): (1, 5, 1, 1, 1),
            (2,): (1, 1, 4, 1, 1),
            (0, 3): (6, 1, 1, 4, 1),
        }.items()
    }
    sums = _nested([over[(0,)], over[(1,)], over[(2,)]], False, grid_size)
    assert [s.shape for s in sums] == [(6, 5, 1, 1, 1), (1, 1, 4, 1, 1)]
    assert (sums[0] == over[(0,)] + over[(1,)]).all()
    sums = _nested([over[(0,)], over[(0, 3)]], True, grid_size)
    assert [s.shape for s in sums] == [(6, 1, 1, 4, 1)] and sums[0].dtype == object
    assert (sums[0] == over[(0,)] + over[(0, 3)]).all()


@pytest.mark.parametrize("seed", range(3))
def test_a_restart_of_many_charges_equals_the_cells(seed: int) -> None:
    # charges over one or two dimensions each, with weights that tell values apart, committed
    # at once (as a restart does): their terms are summed before they reach the grid
    shape = (6, 5, 4, 4, 3)
    rng = np.random.default_rng(seed)
    items = []
    for _ in range(40):
        axes = sorted(rng.choice(len(shape), size=int(rng.integers(1, 3)), replace=False))
        core = rng.integers(0, 4, size=[shape[d] if d in axes else 1 for d in range(5)])
        core.flat[0] = 1  # never all zero
        query = LinearQuery.from_tensor(shape, core.astype(float)[None])
        denominator = WIDE_DENOMINATOR if rng.random() < 0.1 else int(rng.choice([8, 3, 10]))
        items.append((query, Fraction(int(rng.integers(1, 2 * denominator)), 4 * denominator)))
    charges = Charges(tuple(items))
    grid = CellBudget("t", total=Fraction(10**6), shape=shape)
    grid.commit(charges)
    spent = _plus({}, charges)
    assert grid.per_cell() == spent
    assert grid.spent == max(spent.values())


def test_charges_each_within_int64_whose_sum_is_not_are_summed_exactly() -> None:
    # 16 vectors over one dimension, each charging cell 0 (value 0 of dimension 0) a
    # numerator near 2^59 over the Mersenne prime: each fits int64, their sum does not (the
    # grid's sum per set of dimensions and the cells' charges wrapped around)
    shape = (16, 3)
    items = []
    for i in range(16):
        core = np.zeros((16, 1))
        core[[0, 1 + i % 15]] = 1.0
        query = LinearQuery.from_tensor(shape, core[None])
        items.append((query, Fraction(2**59 + i, WIDE_DENOMINATOR)))
    charges = Charges(tuple(items))
    most = Fraction(16 * 2**59 + 120, WIDE_DENOMINATOR)
    assert charges.per_cell()[0] == most
    for budget in (CellBudget("t", total=most, shape=shape), CellBudget("t", total=most)):
        assert budget.spent_after(charges) == most
        budget.check(charges, request="q")
        budget.commit(charges)  # at once, as a restart commits
        assert budget.per_cell() == _plus({}, charges) and budget.spent == most


def test_a_charge_reads_only_its_part_of_the_grid() -> None:
    """A count over one value of one dimension leaves the rest of the grid as it was, and
    the most spent follows the cells charged, not a maximum over the grid."""
    shape = (4, 3, 5)
    budget = CellBudget("t", total=Fraction(10), shape=shape)

    def count(d: int, values: list[int]) -> LinearQuery:
        along = [shape[d] if o == d else 1 for o in range(3)]
        return LinearQuery.from_tensor(shape, np.isin(np.arange(shape[d]), values).reshape(along))

    budget.commit(Charges.of_query(count(0, [0, 1]), Fraction(1, 2)))
    budget.commit(Charges.of_query(count(2, [4]), Fraction(1, 3)))
    charge = Charges.of_query(count(0, [1]), Fraction(1, 6))  # the same denominator: 6
    assert budget.spent_after(charge) == Fraction(1, 2) + Fraction(1, 3) + Fraction(1, 6)
    before = budget._grid.copy()  # refined for the charge: value 1 of dimension 0 apart
    budget.commit(charge)
    changed = np.argwhere(budget._grid != before)
    assert set(budget._firsts[0][changed[:, 0]].tolist()) == {1}
    assert len(changed) == budget._grid[0].size
    assert budget.spent == Fraction(1)
    # a cell the batch does not charge stays the most spent
    assert budget.spent_after(Charges.of_query(count(0, [2]), Fraction(1, 8))) == Fraction(1)


def test_the_box_of_a_term_is_where_it_is_not_zero() -> None:
    """Picked along the dimensions where the term charges some classes only; read and written
    in the grid's order whether NumPy moves the picked dimensions first or not."""
    grid = np.arange(3 * 2 * 4).reshape(3, 2, 4)
    term = np.zeros((3, 1, 4), dtype=np.int64)
    term[1, 0, 2] = term[2, 0, 0] = 5
    box = _Box.of(term)  # dimensions 0 and 2, not adjacent: NumPy moves them first
    assert box.axes == (0, 2) and [p.tolist() for p in box.picks] == [[1, 2], [0, 2]]
    assert box.read(grid).tolist() == grid[1:, :, ::2].tolist()
    assert box.restrict(term)[:, 0, :].tolist() == [[0, 5], [5, 0]]
    box.write(grid, box.read(grid) + box.restrict(term))
    assert grid[1, :, 2].tolist() == [15, 19] and grid[0].tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    everywhere = _Box.of(np.ones((1, 2, 1), dtype=np.int64))
    assert everywhere.axes == () and everywhere.read(grid).shape == grid.shape


def test_a_cell_the_batch_does_not_charge_does_not_refuse_it() -> None:
    """Two cells of a charge's box that it does not charge may have spent past the total (an
    entry another process recorded is charged unchecked): the batch still fits."""
    shape = (2, 2, 3)
    budget = CellBudget("t", total=Fraction(1), shape=shape)
    off_diagonal = np.array([[0, 1], [0, 0]]).reshape(2, 2, 1)
    budget.commit(Charges.of_query(LinearQuery.from_tensor(shape, off_diagonal), Fraction(2)))
    diagonal = Charges.of_query(
        LinearQuery.from_tensor(shape, np.eye(2)[..., None]), Fraction(1, 2)
    )
    budget.check(diagonal, request="q")
    assert budget.spent_after(diagonal) == Fraction(2)
    budget.commit(diagonal)
    assert budget.spent_on(0) == Fraction(1, 2) and budget.spent == Fraction(2)


def _assert_maxima_current(budget: CellBudget) -> int:
    """The maxima kept for each set up to date equal the grid's over the other dimensions
    where they were read; how many cells were."""
    grid, maxima, cells = budget._grid, budget._maxima, 0
    for named, (kept, read, denominator, position) in maxima._sets.items():
        if position < maxima._start + len(maxima._log):
            continue  # brought up to date when next asked
        others = tuple(d for d in range(grid.ndim) if d not in named and grid.shape[d] > 1)
        truth = grid.max(axis=others, keepdims=True)
        assert denominator == budget._denominator
        assert kept[read].tolist() == truth[read].tolist()
        cells += int(read.sum())
    return cells


@pytest.mark.parametrize(
    ("seed", "log", "sets"), [(0, 256, 32), (1, 256, 32), (2, 3, 2), (3, 1, 1)]
)
def test_the_kept_maxima_follow_long_streams_of_charges(
    seed: int, log: int, sets: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sets of dimensions asked again and again (a dashboard's GROUP BYs) are read from the
    maxima kept for them, brought up to date from the charges since: through refinements,
    new denominators, numerators past int64 and forgotten sets, the most spent after a batch
    and the refusals are the cells' own, and every kept set equals the grid's maxima."""
    budget_module = CellBudget.__module__
    monkeypatch.setattr(f"{budget_module}._MAXIMA_SHARE", 1)  # keep sets of the small grid too
    monkeypatch.setattr(f"{budget_module}._MAXIMA_LOG", log)
    monkeypatch.setattr(f"{budget_module}._MAXIMA_SETS", sets)
    rng = np.random.default_rng(50 + seed)
    measures = REACHES[: seed % 3]
    total = Fraction(10)
    grid = CellBudget("t", total=total, shape=SHAPE)
    atoms = CellBudget("t", total=total)
    spent: dict[int, Fraction] = {}
    kept, refused = 0, 0
    for _ in range(60):
        charges = _batch(rng, measures)
        after = _plus(spent, charges)
        assert grid.spent_after(charges) == max(after.values())
        kept += _assert_maxima_current(grid)
        detail = _refusal(grid, charges)
        assert detail == _refusal(atoms, charges)
        kept += _assert_maxima_current(grid)
        if detail is not None:
            refused += 1
            continue
        grid.commit(charges)
        atoms.commit(charges)
        spent = after
        assert grid.spent == max(spent.values())
    assert grid.per_cell() == spent == atoms.per_cell()
    assert kept > 0 and refused > 0


def test_kept_maxima_split_with_the_grid(monkeypatch: pytest.MonkeyPatch) -> None:
    """A set kept over two dimensions keeps up when a later charge splits the classes of the
    second: the most spent after a GROUP BY over both is then read from the split maxima."""
    monkeypatch.setattr(f"{CellBudget.__module__}._MAXIMA_SHARE", 1)
    shape = (2, 3, 5)
    budget = CellBudget("t", total=Fraction(100), shape=shape)
    group_by = np.array([[1.0, 1.0, 2.0, 2.0, 2.0], [2.0, 2.0, 1.0, 1.0, 1.0]])[:, None, :]
    grouped = Charges.of_query(LinearQuery.from_tensor(shape, group_by), Fraction(1, 2))
    spent: dict[int, Fraction] = {}

    def charge(charges: Charges) -> None:
        budget.check(charges, request="q")
        budget.commit(charges)
        for cell, amount in charges.per_cell().items():
            spent[cell] = spent.get(cell, Fraction(0)) + amount

    charge(Charges.of_query(LinearQuery.from_tensor(shape, np.eye(3)[0][:, None]), Fraction(1)))
    charge(grouped)
    assert (0, 2) in budget._maxima._sets
    classes_before = budget._firsts[2].size
    charge(Charges.of_query(LinearQuery.from_tensor(shape, np.eye(5)[4]), Fraction(1, 3)))
    assert budget._firsts[2].size > classes_before  # value 4 split from 2 and 3
    for _ in range(2):
        after = _plus(spent, grouped)
        assert budget.spent_after(grouped) == max(after.values())
        charge(grouped)
    assert budget.per_cell() == spent


def test_a_box_of_consecutive_classes_is_a_view_of_the_grid() -> None:
    """Consecutive picks are slices: the box is read and added to in place, the same cells a
    gather would reach; picks with a gap are still gathered, moved back to the grid's order."""
    grid = np.arange(4 * 3 * 5).reshape(4, 3, 5)
    term = np.zeros((4, 1, 5), dtype=np.int64)
    term[1:3, 0, 2:5] = 7  # classes 1-2 and 2-4: slices
    box = _Box.of(term)
    assert box.meshed == () and np.shares_memory(box.read(grid), grid)
    expected = grid.copy()
    expected[1:3, :, 2:5] += 7
    assert box.add(grid, term).tolist() == expected[1:3, :, 2:5].tolist()
    assert grid.tolist() == expected.tolist()
    gaps = np.zeros((4, 1, 5), dtype=np.int64)
    gaps[0, 0, 1] = gaps[3, 0, 4] = 1  # dimensions 0 and 2 meshed, not adjacent: moved first
    box = _Box.of(gaps)
    assert box.meshed == (0, 2) and box.read(grid).tolist() == grid[::3, :, 1::3].tolist()
    box.add(grid, gaps)
    assert grid[3, :, 4].tolist() == (expected[3, :, 4] + 1).tolist()
    assert grid[3, :, 1].tolist() == expected[3, :, 1].tolist()  # (a cell of the box)


def test_a_commit_prices_what_its_check_priced_once() -> None:
    """The charges a statement's check priced are not priced again by its commit (the same
    queries at equal budgets, as the engine rebuilds them from the entries); other charges, or
    the same after the denominator changed, are; the spend is the same either way."""
    shape = (3, 4)
    first = LinearQuery.from_tensor(shape, np.array([[1.0, 1.0, 0.0, 0.0]]).repeat(3, axis=0))
    second = LinearQuery.from_tensor(shape, np.eye(3, 4))
    charges = Charges(((first, Fraction(1, 3)), (second, Fraction(1, 7))))
    budget = CellBudget("t", total=Fraction(1), shape=shape)
    budget.check(charges, request="q")
    priced = budget._priced(charges)
    again = Charges(((first, Fraction(2, 6)), (second, Fraction(1, 7))))
    assert budget._priced(again) is priced
    budget.commit(again)
    assert budget._last_priced is None  # (not held past the commit)
    plain = CellBudget("t", total=Fraction(1), shape=shape)
    plain.commit(Charges(((first, Fraction(1, 3)),)) + Charges(((second, Fraction(1, 7)),)))
    assert budget.per_cell() == plain.per_cell() and budget.spent == plain.spent
    assert budget._priced(charges) is not priced  # (priced over the grown denominator)
    priced = budget._priced(charges)
    assert budget._priced(Charges(((first, Fraction(1, 3)),))) is not priced


def test_a_commit_does_not_refine_again_for_what_its_check_refined(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Classes only split, so once a check refined the grid for its charges, their commit
    (the same queries at equal budgets) splits none: it is not asked to. Other charges are
    refined for; the spend is that of a budget refining at every commit."""
    shape = (3, 4)
    first = LinearQuery.from_tensor(shape, np.array([[1.0, 2.0, 0.0, 0.0]]).repeat(3, axis=0))
    second = LinearQuery.from_tensor(shape, np.eye(3, 4))
    budget = CellBudget("t", total=Fraction(10), shape=shape)
    refined: list[int] = []
    refine = CellBudget._refine

    def counted(self: CellBudget, terms: object) -> None:  # the method itself, counted
        refined.append(1)
        refine(self, terms)  # type: ignore[arg-type]

    monkeypatch.setattr(CellBudget, "_refine", counted)
    checked = Charges(((first, Fraction(1, 3)), (second, Fraction(1, 7))))
    budget.check(checked, request="q")
    assert len(refined) == 1
    budget.commit(Charges(((first, Fraction(2, 6)), (second, Fraction(1, 7)))))
    assert len(refined) == 1  # the check's refinement served its commit
    budget.commit(Charges(((second, Fraction(1, 5)),)))  # not checked: refined for
    assert len(refined) == 2
    budget.check(checked, request="q")
    budget.check(Charges(((second, Fraction(1, 5)),)), request="q")  # the last refined for
    budget.commit(checked)
    assert len(refined) == 5
    monkeypatch.undo()
    plain = CellBudget("t", total=Fraction(10), shape=shape)
    for charges in (checked, Charges(((second, Fraction(1, 5)),)), checked):
        plain.commit(charges)
    assert budget.per_cell() == plain.per_cell() and budget.spent == plain.spent
