"""The plain cell-level engine the atom engine must agree with (tests only, never the product).

This is the engine as it was before atoms: a BLUE over every cell through the minimum-norm
solver, per-cell ``Fraction`` charges, a per-cell ledger. The equivalence tests run it side by
side with :class:`proxy.engine.PrivacyEngine` on random workloads.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction

import numpy as np

from proxy.engine.budget import format_budget
from proxy.engine.decision import Decision, decide
from proxy.engine.engine import (
    Plan,
    QueryRequest,
    Reply,
    StalePlanError,
    TrueAnswer,
    describe_batch,
)
from proxy.engine.estimator import (
    _EMPTY,
    ESTIMABLE_RESIDUAL,
    FloatArray,
    IntArray,
    Solution,
)
from proxy.engine.history import HistoryEntry
from proxy.engine.noise import (
    RandomSource,
    SystemRandomSource,
    granularity,
    noisy_value,
    public_fraction,
)
from proxy.engine.posterior import feasible_range
from proxy.engine.solver import MinNormSolver
from proxy.engine.tails import EXACT, TailMethod
from proxy.errors import BudgetExhausted, InvalidParameterValue
from sqlmap.vector import LinearQuery

_REPEAT_RESIDUAL = 1e-12
_REPEAT_SINGLES = 4
_CACHE_SIZE = 128
_STAMPS = itertools.count()


class CellIndex:
    """The history matrix ``H`` with budgets and noise steps, answering BLUEs and repeats."""

    def __init__(self, n_cells: int) -> None:
        if n_cells <= 0:
            raise ValueError("n_cells must be positive")
        self.n_cells = n_cells
        self._solver = MinNormSolver(n_cells)
        self._size = 0
        self._precision = np.zeros(16)  # alpha_i / S_i
        self._steps = np.zeros(16)
        self._weights: list[FloatArray] = []  # H_i's non-zero weights, for repeats
        self._by_support: dict[bytes, tuple[int, ...]] = {}  # H_i's cells -> rows i
        self._stamp = next(_STAMPS)
        self._solutions: OrderedDict[tuple[int, bytes], Solution | None] = OrderedDict()

    @property
    def size(self) -> int:
        """The number of history rows ``m``."""
        return self._size

    def copy(self) -> CellIndex:
        """An independent index with the same rows (the solution cache is shared)."""
        other = CellIndex.__new__(CellIndex)
        other.n_cells = self.n_cells
        other._solver = self._solver.copy()
        other._size = self._size
        other._precision = self._precision.copy()
        other._steps = self._steps.copy()
        other._weights = list(self._weights)
        other._by_support = dict(self._by_support)  # values are tuples: appends replace them
        other._stamp = self._stamp
        other._solutions = self._solutions
        return other

    def append(self, query: LinearQuery, *, alpha: float, step: float) -> int:
        """Add row ``H_m = query``, measured with ``alpha`` on lattice ``step``; returns ``m``."""
        if query.n_cells != self.n_cells or query.cells.size == 0:
            raise ValueError("a history row is a non-zero vector over this table's cells")
        if not (alpha > 0 and step > 0):
            raise ValueError("alpha and step must be positive")
        precision = alpha / float(sensitivity(query))
        self._solver.add_row(query.cells, query.weights * precision)
        row = self._size
        if row == self._precision.size:
            self._precision = np.concatenate([self._precision, np.zeros(row)])
            self._steps = np.concatenate([self._steps, np.zeros(row)])
        self._precision[row] = precision
        self._steps[row] = step
        self._weights.append(query.weights)
        support = query.cells.tobytes()
        self._by_support[support] = self._by_support.get(support, ()) + (row,)
        self._size += 1
        self._stamp = next(_STAMPS)
        return row

    def estimator(self, rows: IntArray, weights: FloatArray, residual: float) -> Solution:
        """The estimate ``sum_k weights[k] y[rows[k]]`` (rows increasing, weights non-zero)."""
        return Solution(rows, weights, self._precision[rows], self._steps[rows], residual=residual)

    def solve(self, query: LinearQuery) -> Solution | None:
        """The BLUE of ``query . x`` from the history, or ``None`` if it is not estimable."""
        if query.n_cells != self.n_cells:
            raise ValueError("query is over a different number of cells")
        if query.cells.size == 0:
            return _EMPTY
        if not self._solver.covered(query.cells):
            return None
        key = (self._stamp, query.cells.tobytes() + query.weights.tobytes())
        if key in self._solutions:
            self._solutions.move_to_end(key)
            return self._solutions[key]
        solution = self._solve(query)
        self._solutions[key] = solution
        if len(self._solutions) > _CACHE_SIZE:
            self._solutions.popitem(last=False)
        return solution

    def _solve(self, query: LinearQuery) -> Solution | None:
        u, residual = self._solver.solve(query.cells, query.weights)
        if not residual <= ESTIMABLE_RESIDUAL:
            return None
        (rows,) = np.nonzero(u)
        rows = rows.astype(np.int64)
        return self.estimator(rows, u[rows] * self._precision[rows], residual)

    def repeats(self, query: LinearQuery) -> tuple[Solution, ...]:
        """Estimates from the rows ``H_i = c q`` (``c != 0``) alone: the query measured before.

        Each such row gives ``y_i / c``, one error term whose interval is the exact lattice one
        the measurement was bought for (``t = 1/c`` is exactly 1 for a row equal to the query).
        Returned: the least noisy of them one by one (at most four, by scale), then, if there
        are several, all of them inverse-variance pooled (the BLUE over those rows alone). Rows
        are found by their cells, then checked for proportional weights.

        """
        if query.n_cells != self.n_cells:
            raise ValueError("query is over a different number of cells")
        rows = np.array(self._by_support.get(query.cells.tobytes(), ()), dtype=np.int64)
        if rows.size == 0:
            return ()
        weights = np.stack([self._weights[row] for row in rows.tolist()])
        t = query.weights[0] / weights[:, 0]
        residual = np.linalg.norm(t[:, None] * weights - query.weights, axis=1)
        residual /= float(np.linalg.norm(query.weights))
        proportional = residual <= _REPEAT_RESIDUAL
        rows, t, residual = rows[proportional], t[proportional], residual[proportional]
        scales = np.abs(t) / self._precision[rows]
        best = np.argsort(scales, kind="stable")[:_REPEAT_SINGLES]
        found = [self.estimator(rows[[i]], t[[i]], float(residual[i])) for i in best.tolist()]
        if rows.size > 1:
            shares = 1.0 / np.square(scales)
            shares /= shares.sum()
            found.append(self.estimator(rows, shares * t, float(shares @ residual)))
        return tuple(found)


def cell_sensitivities(query: LinearQuery) -> dict[int, Fraction]:
    """How much one row of each cell can move ``query``'s answer, exactly.

    Over measure coordinates, a row of cell ``c`` adds 1 to ``c``'s count and some ``v_m`` in
    measure ``m``'s reach to ``c``'s sum of it: the most the answer moves is found by trying
    every corner of the box of reaches (the extremes of a linear function).
    """
    kinds = 1 + len(query.measures)
    n = query.n_cells // kinds
    weights: dict[int, list[Fraction]] = {}
    for coordinate, weight in zip(query.cells.tolist(), query.weights.tolist()):
        cell, kind = coordinate % n, coordinate // n
        weights.setdefault(cell, [Fraction(0)] * kinds)[kind] = public_fraction(weight)
    sensitivities = {}
    for cell, (count, *sums) in weights.items():
        corners = itertools.product(*(((Fraction(lo), Fraction(hi))) for lo, hi in query.measures))
        sensitivities[cell] = max(
            abs(count + sum((w * v for w, v in zip(sums, corner)), Fraction(0)))
            for corner in corners
        )
    return sensitivities


def sensitivity(query: LinearQuery) -> Fraction:
    """The query's sensitivity: the most one row of any cell moves it."""
    return max(cell_sensitivities(query).values(), default=Fraction(0))


def cell_charges(query: LinearQuery, budget: Fraction) -> dict[int, Fraction]:
    """What measuring ``query`` with ``budget`` costs each cell it touches: ``budget s_c / S``."""
    per_cell = cell_sensitivities(query)
    largest = max(per_cell.values())
    # the engine reads the sensitivity as a float8 rounded up: the same where it is exact
    assert public_fraction(query.sensitivity) == largest
    return {cell: budget * s / largest for cell, s in per_cell.items()}


class CellLedger:
    """Per-cell spending ``B_j`` for one table against the DBA's ``total``."""

    def __init__(
        self,
        table: str,
        *,
        total: Fraction,
        carried: Fraction = Fraction(0),
        user: str | None = None,
    ) -> None:
        """``user``: this ledger is one analyst's share of the table (a per-user cap)."""
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
        self._spent: dict[int, Fraction] = {}
        self._max = carried

    @property
    def spent(self) -> Fraction:
        """The table's privacy loss so far, ``max_j B_j``."""
        return self._max

    @property
    def remaining(self) -> Fraction:
        """``total - max_j B_j``."""
        return self.total - self._max

    def spent_on(self, cell: int) -> Fraction:
        """``B_j``."""
        return self.carried + self._spent.get(cell, Fraction(0))

    def per_cell(self) -> dict[int, Fraction]:
        """A copy of every ``B_j`` charged since the cube was last defined (without ``carried``)."""
        return dict(self._spent)

    def check(self, charges: Mapping[int, Fraction], *, request: str) -> None:
        """Raise :class:`BudgetExhausted` unless every cell can pay its charge.

        Args:
            charges: cost per cell of everything about to be measured (one batch).
            request: what was asked, for the error message.
        """
        worst_cell, worst_total = -1, Fraction(0)
        for cell, charge in charges.items():
            after = self.spent_on(cell) + charge
            if after > worst_total:
                worst_cell, worst_total = cell, after
        if worst_total <= self.total:
            return
        need = charges[worst_cell]
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
                f"{format_budget(self._max, up=True)})."
            ),
            hint="Ask for a wider interval or a lower confidence, or a query that earlier "
            "answers already determine.",
        )

    def commit(self, charges: Mapping[int, Fraction]) -> None:
        """Add ``charges`` to the cells (call :meth:`check` first)."""
        for cell, charge in charges.items():
            spent = self._spent.get(cell, Fraction(0)) + charge
            self._spent[cell] = spent
            self._max = max(self._max, self.carried + spent)


class CellEngine:
    """Answers linear queries on one protected table within the DBA's total budget.

    Args:
        table: the protected table's name.
        n_cells: the number of coordinates of its vectors (cells, times one plus the measures).
        total_budget: the DBA's total privacy budget for the table.
        history: the measurements released before this engine started.
        rng: noise source; the OS CSPRNG unless a test passes a seeded one.
        nonnegative: intersect intervals with the range counts allow (a post-processing of the
            reply only; it never influences what is spent).
        tail: how error tails are computed (the exact method; others are for benchmarks).
        carried: budget spent on every cell before the table's cube was last redefined.
        measures: per measure, what one row can add to its cell's sum.
    """

    def __init__(
        self,
        table: str,
        n_cells: int,
        *,
        total_budget: Fraction,
        history: Sequence[HistoryEntry] = (),
        rng: RandomSource | None = None,
        nonnegative: bool = False,
        tail: TailMethod = EXACT,
        carried: Fraction = Fraction(0),
        measures: tuple[tuple[int, int], ...] = (),
    ) -> None:
        self.table = table
        self.n_cells = n_cells
        self.measures = measures
        self._rng: RandomSource = rng if rng is not None else SystemRandomSource()
        self._nonnegative = nonnegative
        self._tail = tail
        self._index = CellIndex(n_cells)
        self._budget = CellLedger(table, total=total_budget, carried=carried)
        self._answers = np.zeros(16)
        for entry in history:
            self._record(entry)

    @property
    def budget(self) -> CellLedger:
        """The per-cell budget (read it; only the engine charges it)."""
        return self._budget

    @property
    def history_size(self) -> int:
        """The number of released measurements."""
        return self._index.size

    def _record(self, entry: HistoryEntry) -> None:
        if entry.query.n_cells != self.n_cells or entry.query.measures != self.measures:
            raise ValueError(
                f"history entry over {entry.query.n_cells} cells, table has {self.n_cells}"
            )
        row = self._index.append(entry.query, alpha=float(entry.budget), step=float(entry.step))
        if row >= self._answers.size:
            self._answers = np.concatenate([self._answers, np.zeros(self._answers.size)])
        self._answers[row] = entry.noisy_answer
        self._budget.commit(cell_charges(entry.query, entry.budget))

    def plan(self, requests: Sequence[QueryRequest]) -> Plan:
        """Decide a batch from public inputs; refuse it whole if it does not fit the budget.

        Raises:
            InvalidParameterValue: a query is over a different cube.
            BudgetExhausted: the fresh measurements would overspend some cell.
        """
        index = self._index
        decisions: list[Decision] = []
        measurements: list[LinearQuery] = []
        measured_by: list[int] = []
        charges: dict[int, Fraction] = {}
        for i, request in enumerate(requests):
            vector = self._vector(request.query)
            decision = decide(
                vector, request.accuracy, index.solve(vector), self._tail, index.repeats(vector)
            )
            decisions.append(decision)
            if decision.budget == 0:
                continue
            measurements.append(vector)
            measured_by.append(i)
            for cell, charge in cell_charges(vector, decision.budget).items():
                charges[cell] = charges.get(cell, Fraction(0)) + charge
            if i + 1 < len(requests):  # later queries of the batch may lean on this one
                if index is self._index:
                    index = index.copy()
                index.append(vector, alpha=float(decision.budget), step=float(decision.step))
        self._budget.check(charges, request=describe_batch(requests))
        return Plan(
            tuple(requests),
            tuple(decisions),
            tuple(measurements),
            tuple(measured_by),
            self._index.size,
            charges,
        )

    def _vector(self, query: LinearQuery) -> LinearQuery:
        if query.n_cells != self.n_cells:
            raise InvalidParameterValue(
                f"query is over {query.n_cells} cells but table {self.table} has {self.n_cells}"
            )
        if query.measures != self.measures:
            raise InvalidParameterValue("the query's measures are not the table's")
        return LinearQuery(query.n_cells, query.cells, query.weights, measures=query.measures)

    def execute(self, plan: Plan, true_answers: Sequence[TrueAnswer]) -> tuple[Reply, ...]:
        """Measure and record at once: :meth:`measure`, then :meth:`record`.

        Args:
            plan: from :meth:`plan`, with no other batch executed since.
            true_answers: ``plan.measurements[i].evaluate(histogram)`` for each ``i``.

        Raises:
            StalePlanError: the history changed since the plan was made.
        """
        return self.record(plan, self.measure(plan, true_answers))

    def measure(self, plan: Plan, true_answers: Sequence[TrueAnswer]) -> tuple[HistoryEntry, ...]:
        """Draw the noise of every measurement of ``plan``: the entries to record.

        Raises:
            StalePlanError: the history changed since the plan was made.
        """
        self._check_fresh(plan)
        if len(true_answers) != len(plan.measurements):
            raise ValueError(f"need {len(plan.measurements)} true answers, got {len(true_answers)}")
        entries = []
        for vector, i, truth in zip(plan.measurements, plan.measured_by, true_answers):
            decision = plan.decisions[i]
            value = noisy_value(
                truth,
                sensitivity=sensitivity(vector),
                budget=decision.budget,
                lattice=granularity(vector),
                step=decision.step,
                rng=self._rng,
            )
            entries.append(
                HistoryEntry(self.table, vector, decision.budget, decision.step, float(value))
            )
        return tuple(entries)

    def record(self, plan: Plan, entries: Sequence[HistoryEntry]) -> tuple[Reply, ...]:
        """Add the (now durable) entries of ``plan`` to the history and ledger; build replies.

        Raises:
            StalePlanError: the history changed since the plan was made.
        """
        self._check_fresh(plan)
        if len(entries) != len(plan.measurements):
            raise ValueError(f"need {len(plan.measurements)} entries, got {len(entries)}")
        fresh_rows = {}
        for i, entry in zip(plan.measured_by, entries):
            fresh_rows[i] = self._index.size
            self._record(entry)
        answers = self._answers[: self._index.size]
        return tuple(
            self._reply(request, decision, answers, fresh_rows.get(i))
            for i, (request, decision) in enumerate(zip(plan.requests, plan.decisions))
        )

    def absorb(self, entries: Sequence[HistoryEntry]) -> None:
        """Add entries that another process released (read back from a shared ledger)."""
        for entry in entries:
            self._record(entry)

    def charge_only(self, entries: Sequence[HistoryEntry]) -> None:
        """Charge entries that may no longer be reused: they measured data that has changed.

        Their budget stays spent; their answers no longer describe the table, so they never
        enter an estimate.
        """
        for entry in entries:
            self._budget.commit(cell_charges(entry.query, entry.budget))

    def _check_fresh(self, plan: Plan) -> None:
        if plan.history_size != self._index.size:
            raise StalePlanError("the history changed since this batch was planned; plan again")

    def answer(
        self,
        requests: Sequence[QueryRequest],
        measure: Callable[[Sequence[LinearQuery]], Sequence[TrueAnswer]],
    ) -> tuple[Reply, ...]:
        """``plan``, then ``execute`` with ``measure(plan.measurements)`` (skipped if empty)."""
        plan = self.plan(requests)
        truths = measure(plan.measurements) if plan.measurements else ()
        return self.execute(plan, truths)

    def _reply(
        self, request: QueryRequest, decision: Decision, answers: FloatArray, fresh_row: int | None
    ) -> Reply:
        estimate = request.query.offset
        if decision.history is not None:
            estimate += (1.0 - decision.fresh_weight) * decision.history.estimate(answers)
        if fresh_row is not None:
            estimate += decision.fresh_weight * float(answers[fresh_row])
        reply = Reply(
            estimate,
            estimate - decision.half_width,
            estimate + decision.half_width,
            decision.confidence,
            decision.source,
            decision.budget,
            self._budget.remaining,
        )
        return reply.within(feasible_range(request.query)) if self._nonnegative else reply
