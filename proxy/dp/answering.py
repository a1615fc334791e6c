"""Answers a translated DP query: the engine decides, the reader measures, the result is built.

This is where the three parts meet: the :class:`~sqlmap.translate.AnswerSpec` says what to
compute, the table's :class:`~proxy.engine.engine.PrivacyEngine` decides what it costs from public
inputs only, and only then, if a fresh measurement is needed, does the privileged
:class:`~proxy.storage.reader.Reader` compute the true answers of the measured vectors.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol, TypeVar

from proxy.engine.budget import CellBudget, Charges, UserCaps, cell_charges, format_budget
from proxy.engine.engine import Plan, PrivacyEngine, QueryRequest, Reply, describe_batch
from proxy.engine.history import HistoryEntry
from proxy.engine.noise import RandomSource
from proxy.engine.posterior import comparison, feasible_range
from proxy.engine.ratio import Ratio, RatioRounds
from proxy.engine.snapshot import Factorization
from proxy.errors import (
    BudgetExhausted,
    DomainViolation,
    InvalidParameterValue,
    QueryCanceled,
    UnsupportedQuery,
)
from proxy.heap import give_back_free_heap
from proxy.logs import event
from proxy.storage.factorization_checkpoints import (
    Checkpoint,
    CheckpointUnusable,
    FactorizationCheckpoints,
)
from proxy.storage.ledger_store import (
    AnswerRecord,
    LedgerStore,
    MemoryLedgerStore,
    NewMeasurement,
    StoredEntry,
)
from proxy.storage.postgres_ledger import PostgresLedgerStore
from proxy.workers import Workers
from sqlmap.cube import CategoricalDimension, Cube
from sqlmap.postprocess import Wrapped, WrapperColumnType, values_relation
from sqlmap.translate import AnswerSpec, OutputKind
from sqlmap.vector import LinearQuery

__all__ = [
    "ColumnType",
    "ResultColumn",
    "DpResult",
    "MeasurementSource",
    "DpService",
    "notice_text",
    "result_columns",
    "WrappedAnswer",
    "described",
]

T = TypeVar("T")


# engine work running this long (s) is followed by a trim (the large GROUP BYs): after each
# statement, trimming cost 3-4 ms of CPU a statement at 100,000 answers, on 13 ms counts
_TRIM_AFTER = 0.25


def _planning_timeout() -> QueryCanceled:
    return QueryCanceled(
        "canceling statement due to planning time limit",
        hint="ask for fewer values or a coarser accuracy (the DBA sets limits.planning_timeout)",
    )


class ColumnType:
    """The PostgreSQL types of DP result columns (OIDs)."""

    TEXT = 25
    FLOAT8 = 701


@dataclass(frozen=True, slots=True)
class ResultColumn:
    """A column of a DP result: its name and PostgreSQL type OID."""

    name: str
    type_oid: int


@dataclass(frozen=True, slots=True)
class DpResult:
    """What the client receives.

    Columns, rows (str | float | None values), one notice per answered value, and the engine's
    replies row by row (for logs and the ledger views).
    """

    columns: tuple[ResultColumn, ...]
    rows: tuple[tuple[str | float | None, ...], ...]
    notices: tuple[str, ...]
    replies: tuple[Reply, ...]
    #: one line for the whole statement, sent instead of ``notices`` when there are several
    summary: str = ""
    #: what the analyst should know though the query was answered (sent in every case)
    warnings: tuple[str, ...] = ()
    #: the CommandComplete tag: ``SELECT n`` for answers, ``EXPLAIN`` for a preview
    tag: str = "SELECT"

    @property
    def command_tag(self) -> str:
        """What CommandComplete says after the rows."""
        return f"SELECT {len(self.rows)}" if self.tag == "SELECT" else self.tag


@dataclass(frozen=True, slots=True)
class WrappedAnswer:
    """A statement with post-processing: its cores' results and the wrapper to run.

    ``sql`` holds only released values and the analyst's own SQL: it runs under the
    pass-through role, which returns its rows (and its errors) to the client.
    """

    sql: str
    results: tuple[DpResult, ...]

    @property
    def notices(self) -> tuple[str, ...]:
        """One notice per released value, naming its row, before the wrapper's rows."""
        return tuple(n for r in self.results for n in r.notices)

    @property
    def replies(self) -> tuple[Reply, ...]:
        """The engine's replies, for logs."""
        return tuple(r for result in self.results for r in result.replies)


_RELATION_TYPES = {
    ColumnType.TEXT: WrapperColumnType.TEXT,
    ColumnType.FLOAT8: WrapperColumnType.FLOAT8,
}


def relation(result: DpResult) -> str:
    """A core's released rows as the VALUES list the wrapper reads."""
    return values_relation(result.rows, [_RELATION_TYPES[c.type_oid] for c in result.columns])


def described(wrapped: Wrapped, specs: Sequence[AnswerSpec]) -> str:
    """The wrapper over empty relations of the cores' types, answered by nobody.

    PostgreSQL describes it (its parameters and row description) before anything is spent:
    the extended protocol's Parse and Describe.
    """
    translated = iter(specs)
    relations = []
    for core in wrapped.cores:
        types = (
            core.types
            if core.rows is not None
            else [_RELATION_TYPES[c.type_oid] for c in result_columns(next(translated))]
        )
        nulls = ", ".join(f"NULL::{t}" for t in types)
        relations.append(f"(VALUES ({nulls}) LIMIT 0)")
    return wrapped.render(relations)


class MeasurementSource(Protocol):
    """Whatever computes true answers: the privileged :class:`~proxy.storage.reader.Reader`."""

    async def measure(self, cube: Cube, queries: tuple[LinearQuery, ...]) -> list[float]:
        """``q . x`` for each offset-free query over ``cube``."""
        ...


class DpService:
    """One engine per protected table; spends through its ledger store.

    Engine work runs in a worker thread (:class:`~proxy.workers.Workers`), never on the event
    loop, and each table's engine runs one call at a time (its gate): a free answer (from
    history) is planned and executed in one call, so it sees one history and changes nothing. A
    fresh measurement also holds this process's spending lock on the table and the ledger
    store's (shared by every process with a PostgreSQL store); it absorbs what other processes
    wrote, plans again, measures, writes, and only once the write has committed records the
    entries and releases the answer.

    Planning may run ``planning_timeout`` seconds (waiting for the engine does not count); then
    the statement fails with 57014 and the session goes on. A thread cannot be stopped, so the
    abandoned plan finishes in the background and keeps its table's gate until then; other
    tables and pass-through never wait for it.

    Args:
        cubes: the protected tables.
        source: computes true answers, only after the engine decided to measure.
        rng: the noise source; the OS CSPRNG unless a test passes a seeded one.
        ledger: where measurements and answers are recorded (this process's memory only, by
            default).
        history: per table, the measurements loaded from ``ledger`` (see :meth:`open_durable`);
            ``last_ids`` says up to which of its ids.
        carried: per table, budget spent before its cube was redefined (from the ledger).
        caps: per-user budgets on top of the tables' totals.
        workers: the threads engine work runs in (a pool of its own if None).
        planning_timeout: seconds the engine may plan one statement.
        factorizations: per table, the factorization of its ``history``'s first rows that a
            checkpoint held (taken if the engine finds it is theirs).
        checkpoints: where each table's factorization is kept for the next restart: written
            once ``checkpoint_every`` rows are new since the last (and after a restart that
            factored them, and at :meth:`close`); None: not kept.
    """

    def __init__(
        self,
        cubes: Iterable[Cube],
        source: MeasurementSource,
        rng: RandomSource | None = None,
        ledger: LedgerStore | None = None,
        *,
        history: Mapping[str, Sequence[HistoryEntry]] | None = None,
        last_ids: dict[str, int] | None = None,
        carried: dict[str, Fraction] | None = None,
        caps: UserCaps | None = None,
        workers: Workers | None = None,
        planning_timeout: float = 10.0,
        factorizations: Mapping[str, Factorization] | None = None,
        checkpoints: FactorizationCheckpoints | None = None,
        checkpoint_every: int = 1000,
    ) -> None:
        self._cubes = list(cubes)
        cubes = self._cubes
        self.workers = workers or Workers()
        self._planning_timeout = planning_timeout
        self._source = source
        self._caps = caps or UserCaps()
        # (table, user) -> what that user's measurements charged each cell
        self._user_ledgers: dict[tuple[str, str], CellBudget] = {}
        self._ledger: LedgerStore = MemoryLedgerStore() if ledger is None else ledger
        self._last_ids = dict(last_ids or {})
        self._engines = {
            c.qualified_name: PrivacyEngine(
                c.qualified_name,
                c.n_coordinates,
                total_budget=Fraction(c.total_budget),
                history=(history or {}).get(c.qualified_name, ()),
                rng=rng,
                nonnegative=False,
                carried=(carried or {}).get(c.qualified_name, Fraction(0)),
                measures=c.measure_reach,
                shape=c.shape,
                factorization=(factorizations or {}).get(c.qualified_name),
            )
            for c in cubes
        }
        self._locks = {name: asyncio.Lock() for name in self._engines}
        self._gates = {name: asyncio.Lock() for name in self._engines}
        self._checkpoints = checkpoints
        self._checkpoint_every = checkpoint_every
        # per table, the rows its checkpoint covers (what a restart took, else none), and the
        # write under way
        self._checkpointed = {name: e.restored_rows for name, e in self._engines.items()}
        # per table, the history's size when a write last failed or another process held the
        # directory: tried again only checkpoint_every rows later (each try exports under the
        # gate)
        self._tried: dict[str, int] = {}
        self._writer_elsewhere: int | None = None  # the pid last found holding the directory
        self._writing: dict[str, asyncio.Task[None]] = {}

    @classmethod
    async def open_durable(
        cls,
        cubes: Iterable[Cube],
        source: MeasurementSource,
        ledger: PostgresLedgerStore,
        rng: RandomSource | None = None,
        caps: UserCaps | None = None,
        workers: Workers | None = None,
        planning_timeout: float = 10.0,
        checkpoints: FactorizationCheckpoints | None = None,
        checkpoint_every: int = 1000,
    ) -> DpService:
        """A service whose engines start from, and spend through, the durable ledger.

        With ``checkpoints``, each engine starts from its table's checkpoint if the ledger's
        rows up to its last id are the ones it covers (the engine checks their digest), and
        logs which way it started and why.
        """
        cubes = list(cubes)
        last_ids = {}
        stored = {}
        factorizations = {}
        unused: dict[str, str] = {}
        for cube in cubes:
            name = cube.qualified_name
            loaded = stored[name] = await ledger.load(cube)
            last_ids[name] = loaded[-1].id if loaded else 0
            if checkpoints is not None:
                try:
                    checkpoint = await asyncio.to_thread(checkpoints.read, name)
                except CheckpointUnusable as why:
                    unused[name] = str(why)
                else:
                    covered = sum(1 for s in loaded if s.id <= checkpoint.last_id)
                    if covered == checkpoint.factorization.meta.get("rows"):
                        factorizations[name] = checkpoint.factorization
                    else:
                        unused[name] = (
                            f"the ledger has {covered} rows up to id {checkpoint.last_id}, "
                            f"the checkpoint covers {checkpoint.factorization.meta.get('rows')}"
                        )
            del loaded  # the entries are dropped once charged, before the trim
        service = cls(
            cubes,
            source,
            rng,
            ledger,
            history={name: [s.entry for s in entries] for name, entries in stored.items()},
            last_ids=last_ids,
            carried={c.qualified_name: ledger.carried(c) for c in cubes},
            caps=caps,
            workers=workers,
            planning_timeout=planning_timeout,
            factorizations=factorizations,
            checkpoints=checkpoints,
            checkpoint_every=checkpoint_every,
        )
        del factorizations
        for cube in cubes:
            outdated = await ledger.load_outdated(cube)
            service._charge_loaded(cube, stored.pop(cube.qualified_name), outdated)
            name = cube.qualified_name
            event(
                "engine_restarted",
                table=name,
                how=service.engine(cube).restart,
                checkpoint="off: ledger.checkpoints is not set"
                if checkpoints is None
                else unused.get(name, "read"),
            )
            service._checkpoint_if_due(cube)  # (a restart that factored: at once)
        give_back_free_heap()  # the rows and entries read: the load's transient heap
        return service

    def _checkpoint_if_due(self, cube: Cube) -> None:
        """Write the table's checkpoint in the background if enough rows are new since the last.

        After a restart that factored its history (none covered), that is at once.
        """
        name = cube.qualified_name
        if self._checkpoints is None or name in self._writing:
            return
        engine = self._engines[name]
        last = max(self._checkpointed[name], self._tried.get(name, 0))
        if engine.history_size and (
            not last or engine.history_size - last >= self._checkpoint_every
        ):
            task = asyncio.get_running_loop().create_task(self._checkpoint(cube))
            self._writing[name] = task
            task.add_done_callback(lambda _: self._writing.pop(name, None))

    async def _checkpoint(self, cube: Cube) -> None:
        """Write the table's factorization, taken under its gate, to its checkpoint file.

        The engine exports views of what it holds (the gate held only for that); they are laid
        out and written in another thread, while the engine answers on. A failed write is
        logged, never raised: the ledger is the record, the checkpoint a cache. Only the
        directory's writer writes (:meth:`FactorizationCheckpoints.claim`): another process on
        the same directory is logged once and left to it.
        """
        checkpoints = self._checkpoints
        assert checkpoints is not None
        name = cube.qualified_name
        engine = self._engines[name]
        try:
            holder = await asyncio.to_thread(checkpoints.claim)
        except OSError as error:
            self._tried[name] = engine.history_size
            event("checkpoint_failed", logging.WARNING, table=name, error=repr(error))
            return
        if holder is not None:
            self._tried[name] = engine.history_size
            if holder != self._writer_elsewhere:
                event(
                    "checkpoint_skipped",
                    table=name,
                    directory=str(checkpoints.directory),
                    reason=f"process {holder or '(unknown)'} writes the checkpoints here "
                    "(it holds writer.lock); this one reads them when it starts",
                )
            self._writer_elsewhere = holder
            return
        gate = await self._enter(cube)
        last_id = self._last_ids.get(name, 0)  # (fixed while the gate is held: see _spend)

        def export() -> tuple[Factorization | None, float]:
            started = time.perf_counter()
            return engine.factorization(), time.perf_counter() - started

        factorization, held = await asyncio.shield(self._start(gate, export))
        if factorization is None:  # (nothing worth keeping: a small history)
            self._checkpointed[name] = engine.history_size
            return
        started = time.perf_counter()
        try:
            size = await asyncio.to_thread(
                checkpoints.write, name, Checkpoint(last_id, factorization)
            )
        except Exception as error:  # (a disk full, or a bug): logged; a cache never stops serving
            self._tried[name] = engine.history_size
            event("checkpoint_failed", logging.WARNING, table=name, error=repr(error))
            return
        self._checkpointed[name] = factorization.rows
        event(
            "checkpoint_written",
            table=name,
            rows=factorization.rows,
            last_id=last_id,
            bytes=size,
            held_ms=round(held * 1000, 1),
            write_ms=round((time.perf_counter() - started) * 1000, 1),
        )

    async def close(self) -> None:
        """Write the checkpoints that are behind their engines (a clean shutdown's).

        Then the directory's writer lock is released, for the process that starts next.
        """
        if self._checkpoints is None:
            return
        await asyncio.gather(*self._writing.values(), return_exceptions=True)
        for cube in self._cubes:
            if (
                self._engines[cube.qualified_name].history_size
                != self._checkpointed[cube.qualified_name]
            ):
                await self._checkpoint(cube)
        self._checkpoints.release()

    def _charge_loaded(
        self, cube: Cube, stored: list[StoredEntry], outdated: list[StoredEntry]
    ) -> None:
        """Charge what the engine's load does not: ``outdated`` measurements, capped users'."""
        # measurements of data that has since changed: charged, not reused
        self.engine(cube).charge_only([s.entry for s in outdated])
        by_user: dict[str | None, list[HistoryEntry]] = {}
        for s in [*stored, *outdated]:
            by_user.setdefault(s.user, []).append(s.entry)
        for user, charged in by_user.items():
            if self._caps.cap(user) is not None:  # only capped users keep a ledger
                self._charge_user(cube, user, Charges.of(charged))

    def engine(self, cube: Cube) -> PrivacyEngine:
        """The engine of a protected table."""
        return self._engines[cube.qualified_name]

    async def answer(
        self,
        spec: AnswerSpec,
        user: str | None = None,
        sql: str | None = None,
        unbiased: bool = False,
    ) -> DpResult:
        """Answer every value of ``spec`` as one atomic batch.

        Estimates and intervals lie in the values each answer can take (``Reply.within``),
        unless ``unbiased`` (``SET dp.estimate = unbiased``) asks for the raw ones.

        Raises:
            InvalidParameterValue: the query states no accuracy and no default applies.
            BudgetExhausted: the fresh measurements would overspend some cell (nothing is spent).
        """
        (result,) = await self.answer_batch((spec,), user, sql, unbiased)
        return result

    async def answer_batch(
        self,
        specs: Sequence[AnswerSpec],
        user: str | None = None,
        sql: str | None = None,
        unbiased: bool = False,
    ) -> tuple[DpResult, ...]:
        """Answer the cores of one statement (`sqlmap.postprocess`) as one atomic batch.

        They must read the same table: the engine decides, charges and refuses them together.
        """
        cube, requests = _batch(specs)
        engine = self.engine(cube)
        ratios = [
            Ratio(numerator, denominator, spec.accuracy)
            for spec in specs
            if spec.accuracy is not None
            for row in spec.rows
            for numerator, denominator in row.ratios
        ]
        try:
            if ratios:
                replies, ratio_replies = await self._answer_rounds(
                    cube, engine, requests, ratios, user, sql
                )
            else:
                replies = await self._answer(cube, engine, requests, user, sql)
                ratio_replies = []
        except BudgetExhausted:
            await self._log(cube, specs[0], None, user, sql)
            raise
        except DomainViolation as e:  # the count is for the DBA: the analyst's error has none
            event("domain_violation", logging.WARNING, table=e.table, rows=e.rows, user=user)
            raise
        if not unbiased:  # post-processing of released values, from the public row count
            replies = tuple(
                reply.within(feasible_range(request.query, cube.public_rows))
                for reply, request in zip(replies, requests)
            )
        parts, ratio_parts, start, ratio_start = [], [], 0, 0
        for spec in specs:
            parts.append(replies[start : start + len(spec.queries)])
            start += len(spec.queries)
            asked = sum(len(row.ratios) for row in spec.rows)
            ratio_parts.append(tuple(ratio_replies[ratio_start : ratio_start + asked]))
            ratio_start += asked
        results = await self.workers.run(
            lambda: tuple(
                _result(spec, part, ratio_part)
                for spec, part, ratio_part in zip(specs, parts, ratio_parts)
            )
        )
        for spec, result in zip(specs, results):
            await self._log(cube, spec, result.replies, user, sql)
        return results

    async def _answer(
        self,
        cube: Cube,
        engine: PrivacyEngine,
        requests: list[QueryRequest],
        user: str | None,
        sql: str | None,
    ) -> tuple[Reply, ...]:
        """One atomic batch: from history if it can, else planned, measured, recorded."""

        def answer_free() -> tuple[Reply, ...] | Plan | None:
            """The replies if history answers the batch, else the plan of its measurements."""
            try:
                plan = engine.plan(requests)
            except BudgetExhausted:
                # this process's view may be stale: entries other processes wrote can make the
                # query free (a cell this process exhausted, plus cells only they measured);
                # spending plans again with them and refuses if it still must
                return None
            return plan if plan.measurements else engine.execute(plan, ())

        outcome = await self._in_gate(cube, answer_free, self._planning_timeout)
        if isinstance(outcome, tuple):
            return outcome
        async with self._locks[cube.qualified_name]:
            return await self._spend(cube, engine, requests, user, sql, outcome)

    async def _answer_rounds(
        self,
        cube: Cube,
        engine: PrivacyEngine,
        requests: list[QueryRequest],
        ratios: list[Ratio],
        user: str | None,
        sql: str | None,
    ) -> tuple[tuple[Reply, ...], list[tuple[Reply | None, str]]]:
        """A statement with ratios: batches in rounds, each decided from released answers.

        The statement's other values go with the first round. Each round is an atomic batch
        (recorded before release); a refusal in a later round leaves earlier rounds spent.
        """
        budget = engine.budget
        rounds = RatioRounds(ratios, float(budget.total))
        linear: tuple[Reply, ...] = ()
        first = True

        def left(query: LinearQuery) -> float:
            return float(budget.total - budget.most_spent_by(query))

        while True:
            asked = rounds.requests(left)
            if not asked:
                break
            batch = [*requests, *asked] if first else asked
            replies = await self._answer(cube, engine, batch, user, sql)
            if first:
                linear, replies = replies[: len(requests)], replies[len(requests) :]
                first = False
            rounds.observe(replies)
        if first and requests:  # every ratio was settled without asking: the rest still is
            linear = await self._answer(cube, engine, requests, user, sql)
        return linear, list(zip(rounds.answers(), rounds.reasons()))

    async def preview(self, specs: Sequence[AnswerSpec]) -> DpResult:
        """``EXPLAIN`` of a DP statement: how it would be answered and what it would cost.

        The engine plans the batch as ``answer_batch`` would, from public inputs only (the
        history's noisy answers, the requested accuracy, the budget), and nothing is measured,
        charged or recorded. Another statement answered meanwhile can change the plan.
        """
        if not specs:  # only declared values (SELECT DISTINCT dim)
            return _plan_result(["DP plan: the dimension's declared values, no budget"])
        cube, requests = _batch(specs)
        engine = self.engine(cube)
        labels = [label for spec in specs for label in _value_labels(spec)]

        def plan_lines() -> list[str]:
            lines = [f"DP plan for {cube.qualified_name} (EXPLAIN spends nothing)"]
            try:
                plan = engine.plan(requests)
            except BudgetExhausted as e:
                return [*lines, f"  refused: {e.message}"]
            for label, decision in zip(labels, plan.decisions):
                cost = (
                    "free"
                    if decision.source == "history"
                    else f"a measurement of budget {format_budget(decision.budget, up=True)}"
                )
                lines.append(
                    f"  {label}: {decision.source} ({cost}), "
                    f"±{decision.half_width:.6g} at confidence {decision.confidence:.6g}"
                )
            # what a ratio costs depends on answers released in its rounds: not known ahead
            lines.extend(
                f"  {label}: a ratio, answered in rounds (denominator first); not in the charge"
                for spec in specs
                for label in _value_labels(spec, OutputKind.RATIO)
            )
            # the most a cell pays: charged on a budget of its own, cell by cell never listed
            alone = CellBudget(cube.qualified_name, total=engine.budget.total, shape=cube.shape)
            alone.commit(plan.charges)  # a budget of this plan's alone: no copy needed
            charged = alone.spent
            lines.append(
                f"Budget: charges up to {format_budget(charged, up=True)} on the cells "
                f"it reads; remaining now {format_budget(engine.budget.remaining, up=False)} "
                "for the most-charged cell"
            )
            return lines

        return _plan_result(await self._in_gate(cube, plan_lines, self._planning_timeout))

    async def answer_wrapped(
        self,
        wrapped: Wrapped,
        specs: Sequence[AnswerSpec],
        user: str | None = None,
        sql: str | None = None,
        unbiased: bool = False,
    ) -> WrappedAnswer:
        """Answer a statement's cores and fill its wrapper in.

        ``specs`` are the translations of the cores that ask the engine, in order; the others
        list declared values and cost nothing.
        """
        results = await self.answer_batch(specs, user, sql, unbiased) if specs else ()
        answered = iter(results)
        relations = [
            relation(next(answered))
            if core.rows is None
            else values_relation(core.rows, core.types)
            for core in wrapped.cores
        ]
        return WrappedAnswer(wrapped.render(relations), results)

    async def _enter(self, cube: Cube) -> asyncio.Lock:
        """Wait for the table's gate: its engine runs one call at a time."""
        gate = self._gates[cube.qualified_name]
        await gate.acquire()
        return gate

    def _start(self, gate: asyncio.Lock, work: Callable[[], T]) -> asyncio.Future[T]:
        """Start engine work in a worker behind the gate the caller holds.

        The gate opens when the work ends; once started, the work runs to its end whatever
        happens to the caller (a thread cannot be stopped), so state the caller keeps beside
        the engine may be updated at once.
        """

        def trimmed() -> T:
            started = time.perf_counter()
            try:
                return work()
            finally:  # after work long enough to have freed large temporaries: quick work
                if time.perf_counter() - started >= _TRIM_AFTER:  # pays nothing
                    give_back_free_heap()  # in this thread: its arena's free pages

        try:
            running = self.workers.submit(trimmed)
        except BaseException:
            gate.release()
            raise
        running.add_done_callback(lambda _: gate.release())
        return running

    async def _in_gate(
        self, cube: Cube, work: Callable[[], T], time_limit: float | None = None
    ) -> T:
        """Run engine work in a worker, alone on its table's engine.

        Past ``time_limit`` seconds of running (waiting for the gate does not count), 57014.
        """
        running = self._start(await self._enter(cube), work)
        try:
            async with asyncio.timeout(time_limit):
                return await asyncio.shield(running)
        except TimeoutError:
            raise _planning_timeout() from None

    async def log_repeat(
        self, spec: AnswerSpec, result: DpResult, user: str | None, sql: str | None
    ) -> None:
        """Record an answer the server sent again from its memo (same history, same replies)."""
        await self._log(spec.cube, spec, result.replies, user, sql)

    async def _spend(
        self,
        cube: Cube,
        engine: PrivacyEngine,
        requests: list[QueryRequest],
        user: str | None,
        sql: str | None,
        planned_before: Plan | None = None,
    ) -> tuple[Reply, ...]:
        """Plan (again, unless ``planned_before`` is still current), measure, write, record."""

        def plan() -> Plan:
            # the engine's own staleness rule: a plan holds while its history is unchanged (no
            # entry from this process or another since); planning again would decide the same
            if planned_before is not None and planned_before.history_size == engine.history_size:
                return planned_before
            return engine.plan(requests)

        name = cube.qualified_name
        held: asyncio.Lock | None = None
        try:
            async with self._ledger.spending(cube) as spend:
                others = await spend.since(self._last_ids.get(name, 0))
                if others:
                    absorbed = self._start(
                        await self._enter(cube),
                        lambda: engine.absorb([s.entry for s in others]),
                    )
                    for s in others:
                        charges = cell_charges(s.entry.query, s.entry.budget)
                        self._charge_user(cube, s.user, charges)
                    self._last_ids[name] = others[-1].id
                    await asyncio.shield(absorbed)
                planned = await self._in_gate(cube, plan, self._planning_timeout)
                self._check_user(cube, user, planned)
                true_answers = await self._measure(cube, planned)
                entries, most_spent = await self._in_gate(
                    cube,
                    lambda: (
                        engine.measure(planned, true_answers),
                        _most_spent_after(engine.budget, planned.charges),
                    ),
                )
                ids = await spend.append(_new_measurements(planned, entries, user, sql), most_spent)
                # held from the commit to the record, with no wait in between
                held = await self._enter(cube)
        except BaseException:
            if held is not None:
                held.release()
            raise
        # committed: only now may the entries shape answers
        if ids:
            self._last_ids[name] = max(ids)
        gate = held
        self._charge_user(cube, user, planned.charges)
        recording = self._start(gate, lambda: engine.record(planned, entries))
        replies = await asyncio.shield(recording)  # once committed, a cancel does not stop it
        self._checkpoint_if_due(cube)
        return replies

    def _user_ledger(self, cube: Cube, user: str | None) -> CellBudget | None:
        """The user's share of the table, if the user has a cap."""
        cap = self._caps.cap(user)
        if user is None or cap is None:
            return None
        key = (cube.qualified_name, user)
        if key not in self._user_ledgers:
            self._user_ledgers[key] = CellBudget(
                cube.qualified_name, total=cap, user=user, shape=cube.shape
            )
        return self._user_ledgers[key]

    def _check_user(self, cube: Cube, user: str | None, plan: Plan) -> None:
        """Refuse a plan that would take its user past the user's cap (nothing is spent)."""
        ledger = self._user_ledger(cube, user)
        if ledger is not None and plan.measurements:
            ledger.check(plan.charges, request=describe_batch(plan.requests))

    def _charge_user(self, cube: Cube, user: str | None, charges: Charges) -> None:
        ledger = self._user_ledger(cube, user)
        if ledger is not None:
            ledger.commit(charges)

    async def _measure(self, cube: Cube, plan: Plan) -> list[float]:
        if not plan.measurements:
            return []
        return await self._source.measure(cube, plan.measurements)

    async def _log(
        self,
        cube: Cube,
        spec: AnswerSpec,
        replies: tuple[Reply, ...] | None,
        user: str | None,
        sql: str | None,
    ) -> None:
        """Append the answers (or the refusal) to the ledger store's audit log."""
        accuracy = spec.accuracy
        eps = accuracy.eps if accuracy else None
        confidence = accuracy.confidence if accuracy else None
        if replies is None:
            records = [
                AnswerRecord(
                    "refused", Fraction(0), None, None, None, None, eps, confidence, user, sql
                )
            ]
        else:
            records = [
                AnswerRecord(
                    r.source,
                    r.budget_charged,
                    r.estimate,
                    r.low,
                    r.high,
                    r.confidence,
                    eps,
                    confidence,
                    user,
                    sql,
                )
                for r in replies
            ]
        await self._ledger.record_answers(cube, records)


def _most_spent_after(budget: CellBudget, charges: Charges) -> Fraction:
    """The most any cell will have spent once ``charges`` are committed, carried aside.

    The budget itself is charged only once the write has committed.
    """
    return budget.spent_after(charges) - budget.carried


def _new_measurements(
    plan: Plan, entries: Iterable[HistoryEntry], user: str | None, sql: str | None
) -> list[NewMeasurement]:
    """The ledger rows of a plan's measurements, each with the answer it serves."""
    rows = []
    for entry, i in zip(entries, plan.measured_by):
        request, decision = plan.requests[i], plan.decisions[i]
        rows.append(
            NewMeasurement(
                uuid.uuid4(),
                entry,
                request.accuracy.eps,
                request.accuracy.confidence,
                user,
                sql,
                decision.source,
                request.query.offset,
                decision.half_width,
                decision.confidence,
            )
        )
    return rows


def result_columns(spec: AnswerSpec) -> tuple[ResultColumn, ...]:
    """The columns a DP query returns, known before it is answered (Describe needs them).

    Group keys of text dimensions are text; every other value is float8.
    """
    columns = []
    for output in spec.columns:
        dim = spec.cube.dimension(output.dimension) if output.dimension else None
        text_key = output.kind is OutputKind.GROUP_KEY and (
            output.text or (isinstance(dim, CategoricalDimension) and not dim.numeric)
        )
        columns.append(
            ResultColumn(output.name, ColumnType.TEXT if text_key else ColumnType.FLOAT8)
        )
    return tuple(columns)


def _batch(specs: Sequence[AnswerSpec]) -> tuple[Cube, list[QueryRequest]]:
    """The table a statement's cores read and the engine's requests for their values.

    The cores must read one table, so the engine decides, charges and refuses them together,
    and every value needs an accuracy.
    """
    cube = specs[0].cube
    if any(s.cube.qualified_name != cube.qualified_name for s in specs):
        raise UnsupportedQuery(
            "a statement may read only one protected table",
            hint="send one statement per protected table",
        )
    requests: list[QueryRequest] = []
    for spec in specs:
        if spec.accuracy is None:
            raise InvalidParameterValue(
                "no accuracy requested",
                hint="append WITH ACCURACY <eps> [CONFIDENCE <c>], or SET dp.accuracy = <eps>",
            )
        requests.extend(QueryRequest(q, spec.accuracy) for q in spec.queries)
    return cube, requests


def _plan_result(lines: list[str]) -> DpResult:
    """EXPLAIN's reply: one text column named as PostgreSQL names it, a row per line."""
    return DpResult(
        (ResultColumn("QUERY PLAN", ColumnType.TEXT),),
        tuple((line,) for line in lines),
        (),
        (),
        tag="EXPLAIN",
    )


def _value_labels(spec: AnswerSpec, kind: OutputKind = OutputKind.AGGREGATE) -> list[str]:
    """What each of a spec's values (or ratios) is called in notices: the column and its group."""
    aggregates = [c for c in spec.columns if c.kind is kind]
    labels: list[str] = []
    for row in spec.rows:
        keys = ", ".join(f"{d}={k.label}" for d, k in zip(spec.group_dims, row.keys))
        labels.extend(c.name + (f" [{keys}]" if keys else "") for c in aggregates)
    return labels


def _result(
    spec: AnswerSpec,
    replies: tuple[Reply, ...],
    ratios: tuple[tuple[Reply | None, str], ...] = (),
) -> DpResult:
    columns = result_columns(spec)
    per_row = len(spec.rows[0].queries)
    per_row_ratios = len(spec.rows[0].ratios)
    rows: list[tuple[str | float | None, ...]] = []
    for r, row in enumerate(spec.rows):
        keys = dict(zip(spec.group_dims, row.keys))
        row_replies = replies[r * per_row : (r + 1) * per_row]
        row_ratios = [reply for reply, _ in ratios[r * per_row_ratios : (r + 1) * per_row_ratios]]
        values: list[str | float | None] = []
        answers = iter(row_replies)
        for column in spec.columns:
            if column.kind is OutputKind.GROUP_KEY:
                key = keys[column.dimension or ""].value
                values.append(None if key is None else key if isinstance(key, str) else float(key))
            elif column.kind is OutputKind.AGGREGATE:
                values.append(next(answers).estimate)
            elif column.ratio is not None:  # a ratio, or its interval; NULL without one
                ratio = row_ratios[column.ratio]
                values.append(
                    None
                    if ratio is None
                    else ratio.estimate
                    if column.kind is OutputKind.RATIO
                    else ratio.low
                    if column.kind is OutputKind.INTERVAL_LOW
                    else ratio.high
                )
            elif column.kind is OutputKind.PROBABILITY and column.comparison is not None:
                index = column.aggregate or 0
                feasible = feasible_range(row.queries[index], spec.cube.public_rows)
                event = comparison(*column.comparison.arguments())
                values.append(row_replies[index].probability(event, feasible))
            else:
                reply = row_replies[column.aggregate or 0]
                values.append(reply.low if column.kind is OutputKind.INTERVAL_LOW else reply.high)
        rows.append(tuple(values))
    notices = [notice_text(label, reply) for label, reply in zip(_value_labels(spec), replies)]
    warnings = [f"dp: warning: {w}" for w in spec.warnings]
    for label, (ratio, reason) in zip(_value_labels(spec, OutputKind.RATIO), ratios):
        if ratio is None:
            warnings.append(f"dp: warning: {label} is NULL: {reason}")
        else:
            notices.append(notice_text(label, ratio))
    released = (*replies, *(r for r, _ in ratios if r is not None))
    return DpResult(
        columns,
        tuple(rows),
        tuple(notices),
        released,
        summary_text(spec.cube.qualified_name, released),
        tuple(warnings),
    )


def summary_text(table: str, replies: Sequence[Reply]) -> str:
    """The one NOTICE of a statement with several values (``SET dp.notices = rows`` for each).

    Budgets are per cell: a statement charges the cells it reads, and "remaining" is what the
    most-charged cell of the table has left, so it moves only when that cell is charged.

    >>> from fractions import Fraction
    >>> replies = [Reply(1.0, 0.0, 2.0, 0.95, s, Fraction(1, 8), Fraction(3, 4))
    ...            for s in ("fresh", "fresh", "history")]
    >>> for part in summary_text("public.adult", replies).split("; "):
    ...     print(part)
    dp: 3 values from public.adult, each within ±1 with confidence 0.95 (fresh 2, history 1)
    budget charged 0.125 on the cells they read, remaining 0.75 for the most-charged cell
    SET dp.notices = rows for each interval
    """
    sources = Counter(r.source for r in replies)
    charged = max((r.budget_charged for r in replies), default=Fraction(0))
    remaining = min((r.budget_remaining for r in replies), default=Fraction(0))
    half_width = max(((r.high - r.low) / 2 for r in replies), default=0.0)
    confidence = min((r.confidence for r in replies), default=1.0)
    return (
        f"dp: {len(replies)} values from {table}, each within ±{half_width:.6g} "
        f"with confidence {confidence:.6g} "
        f"({', '.join(f'{source} {n}' for source, n in sources.items())}); "
        f"budget charged {format_budget(charged, up=True)} on the cells they read, "
        f"remaining {format_budget(remaining, up=False)} for the most-charged cell; "
        "SET dp.notices = rows for each interval"
    )


def notice_text(what: str, reply: Reply) -> str:
    """The NoticeResponse that accompanies every DP value.

    An estimate moved into its feasible range (:meth:`Reply.within`) also shows the unbiased one.

    >>> from fractions import Fraction
    >>> reply = Reply(10.0, 5.0, 15.0, 0.95, "fresh", Fraction(1, 3), Fraction(2, 3))
    >>> print(notice_text("count", reply))
    dp: count = 10 in [5, 15] with confidence 0.95; source fresh;
    budget charged 0.333334, remaining 0.666666
    """
    charged = format_budget(reply.budget_charged, up=True)  # rounded against the analyst
    remaining = format_budget(reply.budget_remaining, up=False)
    moved = (
        f"; unbiased estimate {reply.unbiased:.6g} (SET dp.estimate = unbiased)"
        if reply.unbiased is not None and reply.unbiased != reply.estimate
        else ""
    )
    return (
        f"dp: {what} = {reply.estimate:.6g} in [{reply.low:.6g}, {reply.high:.6g}] "
        f"with confidence {reply.confidence:.6g}; source {reply.source}; "
        f"budget charged {charged}, remaining {remaining}{moved}"
    )
