"""The privacy engine of one protected table: plan a batch, measure what it needs, reply.

Answering is two steps so that cost stays apart from data:

1. :meth:`PrivacyEngine.plan` (public inputs only) decides every query of a batch: from history,
   fresh, or combined, and what it costs. The batch is refused as a whole
   (:class:`~proxy.errors.BudgetExhausted`) if any cell would overspend; nothing is charged then.
2. The caller computes the true answers of exactly ``plan.measurements`` (offset-free vectors;
   ``m.evaluate(histogram)`` or the equivalent SQL) and passes them to
   :meth:`PrivacyEngine.measure`, which draws the noise: the new history entries. The caller makes
   them durable (the service writes them to its ledger store) *before* anything is released, then
   passes them to :meth:`PrivacyEngine.record`, which charges the per-cell budget and builds the
   replies. :meth:`PrivacyEngine.execute` does both at once, for callers that keep no record
   (benchmarks, the evaluation, tests of the math).

The engine keeps no store of its own: it starts from the entries it is given (a restart passes
what the ledger store loaded) and grows only through :meth:`record` and :meth:`absorb`.

Queries of one batch are planned in order, each seeing the measurements planned before it, so a
GROUP BY whose groups together with the history determine one another pays only for what is new.
The plan appends those measurements to a copy of the history index and solves each later query
as a correction of the batch's first solve (:class:`~proxy.engine.estimator.BatchSolve`), or on
the copy where a correction cannot follow; :meth:`record` takes that copy as the engine's index
when the entries it records are the ones the copy holds (same vectors, budgets and steps) and the
history has not changed since, so whatever the copy placed is not placed again.
Callers must not interleave plan and execute of two batches on one engine (hold a per-table
lock across the database round trip); :meth:`execute` refuses a plan made before another batch
changed the history.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction

import numpy as np

from proxy.engine.budget import CellBudget, Charges
from proxy.engine.decision import Decision, Source, decide
from proxy.engine.estimator import FloatArray, HistoryIndex
from proxy.engine.history import HistoryEntry
from proxy.engine.noise import (
    RandomSource,
    SystemRandomSource,
    granularity,
    noisy_value,
    public_fraction,
)
from proxy.engine.posterior import (
    Interval,
    cut_to_range,
    feasible_range,
    posterior_mode,
    probability,
)
from proxy.engine.selection import intervals
from proxy.engine.snapshot import Factorization, FactorizationMismatch
from proxy.engine.tails import EXACT, TailMethod
from proxy.errors import InvalidParameterValue
from sqlmap.accuracy import AccuracyRequest
from sqlmap.vector import LinearQuery

__all__ = [
    "QueryRequest",
    "Reply",
    "Plan",
    "StalePlanError",
    "PrivacyEngine",
    "describe_batch",
]

TrueAnswer = float | int | Fraction

_NO_SCALES: FloatArray = np.zeros(0)  # an exact reply's error law
_NO_SCALES.flags.writeable = False


class StalePlanError(RuntimeError):
    """A plan was executed after another batch changed the history (a caller bug: re-plan)."""


@dataclass(frozen=True, slots=True)
class QueryRequest:
    """One linear query with the accuracy the analyst asks of it."""

    query: LinearQuery
    accuracy: AccuracyRequest

    def __post_init__(self) -> None:
        if not isinstance(self.query, LinearQuery) or not isinstance(
            self.accuracy, AccuracyRequest
        ):
            raise TypeError("a QueryRequest pairs a LinearQuery with an AccuracyRequest")


@dataclass(frozen=True, slots=True)
class Reply:
    """The answer to one query.

    Attributes:
        estimate: the point estimate (includes the query's constant part).
        low: lower end of the interval.
        high: upper end of the interval.
        confidence: a lower bound on ``P(low <= true answer <= high)``.
        source: ``history`` (free), ``fresh`` or ``combined``.
        budget_charged: ``alpha`` of the fresh measurement made for this query (0 if none).
        budget_remaining: the table's total minus its spent budget, after this batch.
        scales: the answer's exact error law: the unbiased estimate is the true answer plus
            ``sum_k scales[k] L_k`` for independent standard Laplace ``L_k`` (empty: exact).
            The noise lies on a lattice whose step is far below these scales
            (:func:`~proxy.engine.noise.noise_step`); the law is that of its continuous twin.
            A read-only array (a BLUE's has a term per history row): not compared by ``==``.
        unbiased: the unbiased estimate, once :meth:`within` moved ``estimate`` into the
            values the true answer can take (None: ``estimate`` is the unbiased one).
    """

    estimate: float
    low: float
    high: float
    confidence: float
    source: Source
    budget_charged: Fraction
    budget_remaining: Fraction
    scales: FloatArray = field(default_factory=lambda: _NO_SCALES, compare=False)
    unbiased: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.scales, np.ndarray) or self.scales.flags.writeable:
            scales = np.array(self.scales, dtype=np.float64)
            scales.flags.writeable = False
            object.__setattr__(self, "scales", scales)
        if not all(math.isfinite(v) for v in (self.estimate, self.low, self.high)):
            raise ValueError("estimate and interval must be finite")
        if not self.low <= self.estimate <= self.high:
            raise ValueError("the interval must contain the estimate")
        if not 0 < self.confidence <= 1:
            raise ValueError("confidence must lie in (0, 1]")
        if self.source not in ("history", "fresh", "combined"):
            raise ValueError(f"unknown source {self.source!r}")
        if self.budget_charged < 0 or self.budget_remaining < 0:
            raise ValueError("budgets cannot be negative")

    @property
    def center(self) -> float:
        """The unbiased estimate: where the error law of :attr:`scales` is centred."""
        return self.estimate if self.unbiased is None else self.unbiased

    def within(self, feasible: Interval) -> Reply:
        """This reply with its estimate and interval in the values the true answer can take.

        The estimate becomes the posterior mode under a flat prior on ``feasible`` (the unbiased
        estimate moved into the range: never farther from any feasible truth), the interval is
        cut to the range (coverage kept, since the truth is in it). Post-processing of the
        reply: what was spent and why is unchanged. docs/probabilistic.md says why these.

        >>> from fractions import Fraction
        >>> r = Reply(-4.0, -54.0, 46.0, 0.95, "fresh", Fraction(1, 8), Fraction(3, 4))
        >>> r.within(Interval(0.0, math.inf))
        Reply(0 in [0, 46] at 0.95, fresh, charged 0.125, remaining 0.75)
        """
        if self.unbiased is not None:
            raise ValueError("the reply is already within its range")
        low, high = cut_to_range(self.estimate, self.low, self.high, feasible)
        return replace(
            self,
            estimate=posterior_mode(self.estimate, feasible),
            low=low,
            high=high,
            unbiased=self.estimate,
        )

    def probability(self, event: Interval, feasible: Interval) -> float:
        """The posterior probability that the true answer lies in ``event``.

        Under a flat prior on ``feasible`` and the exact error law (:attr:`scales`); see
        :func:`~proxy.engine.posterior.probability`.
        """
        return probability(self.scales, self.center, event, feasible)

    def __repr__(self) -> str:
        return (
            f"Reply({self.estimate:.6g} in [{self.low:.6g}, {self.high:.6g}] "
            f"at {self.confidence:.6g}, {self.source}, charged {float(self.budget_charged):.6g}, "
            f"remaining {float(self.budget_remaining):.6g})"
        )


@dataclass(slots=True)
class _Workspace:
    """The index a plan decided on: the engine's at ``version``, then ``placed`` appended.

    ``placed``: the measurements appended to it, in order, as (vector, alpha, step): the first
    of the plan's (a batch's last measurement is not, no later query leaning on it). ``index``
    is None once :meth:`PrivacyEngine.record` has taken it.
    """

    index: HistoryIndex | None
    version: int
    placed: list[tuple[LinearQuery, float, float]]


@dataclass(frozen=True, slots=True)
class Plan:
    """A batch's public decisions. Pass true answers of ``measurements`` to ``execute``.

    Attributes:
        requests: the batch, in order.
        decisions: one per request.
        measurements: the offset-free query vectors whose true answers ``execute`` needs.
        measured_by: for each measurement, the index of the request it serves.
        history_size: rows in the history when planned (guards against stale plans).
        charges: what the measurements cost the cells they touch.
    """

    requests: tuple[QueryRequest, ...]
    decisions: tuple[Decision, ...]
    measurements: tuple[LinearQuery, ...]
    measured_by: tuple[int, ...]
    history_size: int
    charges: Charges = field(default_factory=Charges)
    # the index the batch was decided on, if it holds some of the measurements (for record)
    _workspace: _Workspace | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if len(self.requests) != len(self.decisions):
            raise ValueError("one decision per request")
        if len(self.measurements) != len(self.measured_by):
            raise ValueError("one request per measurement")


class PrivacyEngine:
    """Answers linear queries on one protected table within the DBA's total budget.

    Args:
        table: the protected table's name.
        n_cells: the number of coordinates of its vectors (the cells of its cube, times one
            plus its number of measures).
        total_budget: the DBA's total privacy budget for the table.
        history: the measurements released before this engine started (a ledger store's load).
        rng: noise source; the OS CSPRNG unless a test passes a seeded one.
        nonnegative: move replies into the range counts allow without a public row count
            (:meth:`Reply.within`; a post-processing of the reply only, it never influences
            what is spent). The service does this itself, with the table's ``public_rows``.
        tail: how error tails are computed (the exact method; others are for benchmarks).
        carried: budget spent on every cell before the table's cube was last redefined.
        measures: per measure of the cube, what one row can add to its cell's sum; every
            vector must carry exactly these (they decide its sensitivity).
        shape: the cube's shape: vectors are then worked on factored (the history's span in
            :mod:`proxy.engine.factored`'s coordinates, the budget as a tensor over the cells),
            so that a decision never enumerates the cells a query covers (a wide cube's
            millions). Measure coordinates are one more axis of those tensors.
        factorization: the factorization of the first rows of ``history`` that an engine
            exported (:meth:`factorization`, a checkpoint's): taken rather than factoring
            those rows again if it is theirs (its watermark matches), else ignored.
            :attr:`restart` says which, and why.
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
        shape: tuple[int, ...] | None = None,
        factorization: Factorization | None = None,
    ) -> None:
        self.table = table
        self.n_cells = n_cells
        self.measures = measures
        self._rng: RandomSource = rng if rng is not None else SystemRandomSource()
        self._nonnegative = nonnegative
        self._tail = tail
        self._index = HistoryIndex(n_cells, shape=shape)
        self._budget = CellBudget(table, total=total_budget, carried=carried, shape=shape)
        for entry in history:
            if entry.table != table:
                raise ValueError(f"history entry of table {entry.table!r}, engine of {table!r}")
            self._check_fits(entry)
        # factored now, in bulk: the first decision then costs what later ones do; a ledger's
        # load shares each distinct budget and step (``history`` keeps them, and their ids)
        floats: dict[int, float] = {}

        def as_float(value: Fraction) -> float:
            known = floats.get(id(value))
            if known is None:
                known = floats[id(value)] = float(value)
            return known

        rows = [(e.query, as_float(e.budget), as_float(e.step)) for e in history]
        # how the history was loaded (a service logs it), and the rows a factorization covered
        self.restart, self.restored_rows = self._load(rows, factorization, shape)
        self._answers = np.zeros(max(16, len(history)))
        self._answers[: len(history)] = [e.noisy_answer for e in history]
        self._budget.commit(Charges.of(history))  # one charge per distinct vector

    def _load(
        self,
        rows: list[tuple[LinearQuery, float, float]],
        factorization: Factorization | None,
        shape: tuple[int, ...] | None,
    ) -> tuple[str, int]:
        """Load the history into the index, from ``factorization`` if it is the history's.

        Returns how (what a service logs at a restart) and the rows restored (0: factored).
        """
        if factorization is not None:
            if factorization.meta.get("measures") != [list(m) for m in self.measures]:
                why = "another cube's (its measures differ)"
            else:
                try:
                    self._index.load(rows, factorization)
                    return (
                        f"restored {factorization.rows} rows' factorization, folded "
                        f"{len(rows) - factorization.rows} after it"
                    ), factorization.rows
                except FactorizationMismatch as mismatch:
                    why = str(mismatch)
                except Exception as error:  # a cache never stops a restart: factored instead
                    why = f"restoring it failed: {error!r}"
            self._index = HistoryIndex(self.n_cells, shape=shape)
            self._index.load(rows)
            return f"factored {len(rows)} rows: the factorization given was ignored: {why}", 0
        self._index.load(rows)
        return f"factored {len(rows)} rows", 0

    def factorization(self) -> Factorization | None:
        """The history's factorization, for a restart to take (None: nothing worth keeping).

        A function of public inputs only (the vectors, budgets and steps: never a noisy
        value). The arrays are views that nothing changes later: copy or write them after
        releasing whatever lock serialises this engine (:mod:`proxy.engine.snapshot`).
        """
        found = self._index.factorization()
        if found is None:
            return None
        return found.with_meta(measures=[list(m) for m in self.measures])

    @property
    def budget(self) -> CellBudget:
        """The per-cell budget (read it; only the engine charges it)."""
        return self._budget

    @property
    def history_size(self) -> int:
        """The number of released measurements."""
        return self._index.size

    @property
    def history_shape(self) -> tuple[int, int, int | None]:
        """Released measurements, their distinct vectors, and the dimension of their span.

        The dimension is None once it has outgrown the span solver (the sparse one answers).
        """
        return self._index.size, self._index.distinct, self._index.rank

    def _record(self, entry: HistoryEntry) -> None:
        self._append(entry)
        self._budget.commit(Charges.of_query(entry.query, entry.budget))

    def _check_fits(self, entry: HistoryEntry) -> None:
        if entry.query.n_cells != self.n_cells or entry.query.measures != self.measures:
            raise ValueError(
                f"history entry over {entry.query.n_cells} cells, table has {self.n_cells}"
                if entry.query.n_cells != self.n_cells
                else f"history entry with measures {entry.query.measures}, table has "
                f"{self.measures}"
            )

    def _append(self, entry: HistoryEntry) -> None:
        self._check_fits(entry)
        row = self._index.append(entry.query, alpha=float(entry.budget), step=float(entry.step))
        self._keep_answer(row, entry.noisy_answer)

    def _keep_answer(self, row: int, noisy_answer: float) -> None:
        if row >= self._answers.size:
            self._answers = np.concatenate([self._answers, np.zeros(self._answers.size)])
        self._answers[row] = noisy_answer

    def plan(self, requests: Sequence[QueryRequest]) -> Plan:
        """Decide a batch from public inputs; refuse it whole if it does not fit the budget.

        Raises:
            InvalidParameterValue: a query is over a different cube.
            BudgetExhausted: the fresh measurements would overspend some cell.
        """
        index = self._index
        vectors = [self._vector(r.query) for r in requests]
        # the batch shares each solve; once values are measured, later ones are solved as
        # corrections of that solve
        batch = index.batch(vectors)
        deltas = [r.accuracy.delta for r in requests]
        # The exact tails of the BLUEs are found together (where the loop then finds them) once
        # the first value is answered from history: a value that measures re-solves every later
        # one, and a GROUP BY asked more accurately than its history answers measures them all
        # (its 20 tails found together cost 100 ms on the wide cube, all unused).
        widths_shared = False
        decisions: list[Decision] = []
        measurements: list[LinearQuery] = []
        measured_by: list[int] = []
        charges: list[tuple[LinearQuery, Fraction]] = []
        workspace: _Workspace | None = None
        for i, (request, vector) in enumerate(zip(requests, vectors)):
            decision = decide(
                vector, request.accuracy, batch.solve(i), self._tail, index.repeats(vector)
            )
            decisions.append(decision)
            if decision.budget == 0:
                if workspace is None and not widths_shared:
                    intervals(batch.solutions[i + 1 :], deltas[i + 1 :], self._tail)
                    widths_shared = True
                continue
            measurements.append(vector)
            measured_by.append(i)
            charges.append((vector, decision.budget))
            if i + 1 < len(requests):  # later queries of the batch may lean on this one
                if workspace is None:
                    copy = index.copy()
                    workspace = _Workspace(copy, index.version, [])
                    index = copy
                alpha, step = float(decision.budget), float(decision.step)
                row = index.append(vector, alpha=alpha, step=step, known=batch.vectors)
                batch.measured(i, index, row)
                workspace.placed.append((vector, alpha, step))
        cost = Charges(tuple(charges))
        self._budget.check(cost, request=describe_batch(requests))
        return Plan(
            tuple(requests),
            tuple(decisions),
            tuple(measurements),
            tuple(measured_by),
            self._index.size,
            cost,
            workspace,
        )

    def _vector(self, query: LinearQuery) -> LinearQuery:
        if query.n_cells != self.n_cells:
            raise InvalidParameterValue(
                f"query is over {query.n_cells} cells but table {self.table} has {self.n_cells}"
            )
        if query.measures != self.measures:  # they decide the sensitivity: never guess them
            raise InvalidParameterValue(
                f"query has measures {query.measures} but table {self.table} has {self.measures}"
            )
        return query.without_offset()

    def execute(self, plan: Plan, true_answers: Sequence[TrueAnswer]) -> tuple[Reply, ...]:
        """Measure and record at once (nothing durable in between): :meth:`measure`, :meth:`record`.

        Args:
            plan: from :meth:`plan`, with no other batch executed since.
            true_answers: ``plan.measurements[i].evaluate(histogram)`` for each ``i``.

        Raises:
            StalePlanError: the history changed since the plan was made.
        """
        return self.record(plan, self.measure(plan, true_answers))

    def measure(self, plan: Plan, true_answers: Sequence[TrueAnswer]) -> tuple[HistoryEntry, ...]:
        """Draw the noise of every measurement of ``plan``: the entries to make durable.

        Nothing changes in the engine: the caller writes the entries (the service, to its ledger
        store), and only once they are durable passes them to :meth:`record`.

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
                sensitivity=public_fraction(vector.sensitivity),
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
        first = self._index.size
        adopted = self._adopt(plan, entries)
        fresh_rows = {}
        for k, (i, entry) in enumerate(zip(plan.measured_by, entries)):
            fresh_rows[i] = first + k
            if k < adopted:  # already a row of the adopted index
                self._keep_answer(first + k, entry.noisy_answer)
            else:
                self._append(entry)
        # charged together: the budget prices a GROUP BY's groups of one shape and budget at
        # once (20 charges one by one were 18 ms of the wide cube's first 20-group GROUP BY)
        self._budget.commit(Charges(tuple((entry.query, entry.budget) for entry in entries)))
        answers = self._answers[: self._index.size]
        remaining = self._budget.remaining  # (a rational sum over the ledger: once per batch)
        return tuple(
            self._reply(request, decision, answers, fresh_rows.get(i), remaining)
            for i, (request, decision) in enumerate(zip(plan.requests, plan.decisions))
        )

    def _adopt(self, plan: Plan, entries: Sequence[HistoryEntry]) -> int:
        """Take the index ``plan`` was decided on if it holds the first ``entries``; how many.

        It must have been copied from this engine's index as it is now (no row appended since:
        the staleness rule, by version rather than size), and have appended exactly those
        entries' vectors at their budgets and steps. Otherwise 0: the entries are appended.
        """
        workspace = plan._workspace
        if (
            workspace is None
            or workspace.index is None
            or workspace.version != self._index.version
            or len(workspace.placed) > len(entries)
        ):
            return 0
        for (vector, alpha, step), entry in zip(workspace.placed, entries):
            if not (
                float(entry.budget) == alpha
                and float(entry.step) == step
                and (entry.query is vector or entry.query == vector)
            ):
                return 0
        self._index, workspace.index = workspace.index, None
        return len(workspace.placed)

    def absorb(self, entries: Sequence[HistoryEntry]) -> None:
        """Add entries that another process released (read back from a shared ledger)."""
        for entry in entries:
            self._record(entry)

    def charge_only(self, entries: Sequence[HistoryEntry]) -> None:
        """Charge entries that may no longer be reused: they measured data that has changed.

        Their budget stays spent; their answers no longer describe the table, so they never
        enter an estimate.
        """
        self._budget.commit(Charges.of(entries))

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
        self,
        request: QueryRequest,
        decision: Decision,
        answers: FloatArray,
        fresh_row: int | None,
        remaining: Fraction,
    ) -> Reply:
        estimate = request.query.offset
        if decision.history is not None:  # (its weights read here, its scales below: each once)
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
            remaining,
            _error_scales(request.query, decision),
        )
        return reply.within(feasible_range(request.query)) if self._nonnegative else reply


def _error_scales(query: LinearQuery, decision: Decision) -> FloatArray:
    """The Laplace scales of a reply's error: the history estimate's and the fresh answer's.

    The reply weighs them ``1 - fresh_weight`` and ``fresh_weight``; the fresh measurement's
    noise has scale ``S / alpha``.
    """
    if decision.history is not None and decision.budget == 0:  # history alone (weight 1)
        scales = decision.history.scales
        positive = scales > 0
        if positive.all():
            return scales  # read-only, as a reply's are
        scales = scales[positive]
        scales.flags.writeable = False
        return scales
    parts = []
    if decision.history is not None:
        parts.append((1.0 - decision.fresh_weight) * decision.history.scales)
    if decision.budget > 0:
        parts.append(np.array([decision.fresh_weight * query.sensitivity / float(decision.budget)]))
    if not parts:
        return _NO_SCALES
    scales = np.concatenate(parts)
    scales = scales[scales > 0]
    scales.flags.writeable = False
    return scales


def describe_batch(requests: Sequence[QueryRequest]) -> str:
    """How refusals name a batch: "this query to ±25 at 0.95 confidence", "this batch of 3 ..."."""
    accuracies = {str(r.accuracy) for r in requests}
    within = f" to {accuracies.pop()}" if len(accuracies) == 1 else ""
    if len(requests) == 1:
        return f"this query{within}"
    return f"this batch of {len(requests)} queries{within}"
