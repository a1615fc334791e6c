"""The engine facade: plan from public inputs, measure, record, reply."""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

import numpy as np
import pytest

from proxy.engine import (
    AccuracyRequest,
    HistoryEntry,
    PrivacyEngine,
    QueryRequest,
    SeededRandomSource,
    StalePlanError,
)
from proxy.engine.budget import cell_charges
from proxy.errors import BudgetExhausted, InvalidParameterValue
from sqlmap.vector import LinearQuery
from tests.engine.recording import Recorder

X = np.array([10, 21, 37, 20, 50, 40, 53, 0, 0])


def _engine(
    total: str = "10", history: Sequence[HistoryEntry] = (), seed: int = 1, **kwargs: bool
) -> PrivacyEngine:
    return PrivacyEngine(
        "t",
        9,
        total_budget=Fraction(total),
        history=history,
        rng=SeededRandomSource(seed),
        **kwargs,
    )


def _measure(queries: Sequence[LinearQuery]) -> list[float]:
    return [q.evaluate(X) for q in queries]


def _ask(
    engine: PrivacyEngine,
    dense: list[float],
    eps: float,
    conf: float = 0.9,
    offset: float = 0.0,
    recorder: Recorder | None = None,
):  # type: ignore[no-untyped-def]
    request = QueryRequest(LinearQuery.from_dense(dense, offset=offset), AccuracyRequest(eps, conf))
    (reply,) = (recorder or Recorder()).answer(engine, [request], _measure)
    return reply


def test_fresh_then_history_for_the_same_query() -> None:
    engine = _engine()
    first = _ask(engine, [1, 1, 0, 0, 0, 0, 0, 0, 0], eps=5.0, offset=100.0)
    assert first.source == "fresh" and first.budget_charged > 0
    assert first.low < first.estimate < first.high and first.high - first.low <= 10.0
    assert 100.0 + 31 - 30 < first.estimate < 100.0 + 31 + 30  # the offset is added, no budget
    assert first.budget_remaining == Fraction(10) - first.budget_charged
    again = _ask(engine, [1, 1, 0, 0, 0, 0, 0, 0, 0], eps=5.0, offset=100.0)
    assert again.source == "history" and again.budget_charged == 0
    assert again.estimate == first.estimate  # no fresh noise for a repeat
    assert again.budget_remaining == first.budget_remaining


@pytest.mark.parametrize(
    ("confidence", "others_eps"),
    [
        (0.95, 200.0),  # barely informative overlaps: the BLUE's coupling bound misses eps
        (0.9, 200.0),
        (0.5, 15.0),  # informative ones: the BLUE's near-Gaussian error is wider than a Laplace
    ],
)
def test_a_fresh_answer_stays_free_after_overlapping_measurements(
    confidence: float, others_eps: float
) -> None:
    # Regression: the repeat was decided from the BLUE alone, whose exact interval over the
    # grown history is wider than the query's own earlier measurement; it was charged again.
    kept = Recorder()
    engine = _engine()
    query = [1, 1, 0, 0, 0, 0, 0, 0, 0]
    first = _ask(engine, query, eps=10.0, conf=confidence, offset=3.0, recorder=kept)
    assert first.source == "fresh"
    _ask(engine, [1, 0, 0, 0, 0, 0, 0, 0, 0], eps=others_eps, conf=confidence, recorder=kept)
    _ask(engine, [0, 1, 0, 0, 0, 0, 0, 0, 0], eps=others_eps, conf=confidence, recorder=kept)
    spent = engine.budget.spent
    again = _ask(engine, query, eps=10.0, conf=confidence, offset=3.0)
    assert again.source == "history" and again.budget_charged == 0
    assert engine.budget.spent == spent and again.budget_remaining == Fraction(10) - spent
    assert again.high - again.low <= 2 * 10.0 * (1 + 1e-12)
    assert again.confidence >= confidence
    if confidence > 0.9:  # nothing narrower than the earlier measurement: its very answer
        assert (again.estimate, again.low, again.high) == (first.estimate, first.low, first.high)
    # the choice is a function of the released history: a restarted engine decides alike
    request = QueryRequest(
        LinearQuery.from_dense(query, offset=3.0), AccuracyRequest(10.0, confidence)
    )
    (decision,) = _engine(history=kept.entries).plan([request]).decisions
    (same,) = engine.plan([request]).decisions
    assert decision.source == same.source == "history"
    assert decision.basis == same.basis != "blue"
    # (a rebuilt index factorizes afresh: its BLUE agrees to rounding)
    assert decision.half_width == pytest.approx(same.half_width, rel=1e-9)
    assert same.half_width == pytest.approx((again.high - again.low) / 2, rel=1e-12)


def test_a_combined_answer_asked_again_at_once_is_free() -> None:
    # Regression (found by a random search): the combination was bought to meet eps exactly,
    # and the repeat's BLUE, recomputed from the same rows, came out 1e-12 wider and paid.
    engine = _engine()
    for dense, eps in (
        ([0, 0, -1, 0, 0, 0, 0, 0, 0], 3.365039207241529),
        ([-1, 0, 0, 0, 0, 0, 0, 0, 0], 9.942741725458419),
        ([0, 1, 2, 1, 0, 0, 0, 0, 0], 5.372953067834796),
        ([-1, 1, 1, 0, 0, 0, 0, 0, 0], 8.658300507143533),
    ):
        assert _ask(engine, dense, eps=eps).source == "fresh"
    query, eps = [0, 0, 0, 2, 0, 0, 0, 0, 0], 11.565995735405785
    assert _ask(engine, query, eps=eps).source == "combined"
    again = _ask(engine, query, eps=eps)
    assert again.source == "history" and again.budget_charged == 0
    assert again.high - again.low <= 2 * eps * (1 + 1e-15) and again.confidence >= 0.9


def test_a_stricter_repeat_pays_and_combines() -> None:
    engine = _engine()
    _ask(engine, [1, 1, 0, 0, 0, 0, 0, 0, 0], eps=5.0)
    stricter = _ask(engine, [1, 1, 0, 0, 0, 0, 0, 0, 0], eps=2.0)
    assert stricter.source == "combined" and stricter.budget_charged > 0


def test_equivalence_is_decided_by_estimability_not_text() -> None:
    engine = _engine()
    _ask(engine, [1, 0, 0, 0, 0, 0, 0, 0, 0], eps=3.0)
    _ask(engine, [0, 1, 0, 0, 0, 0, 0, 0, 0], eps=3.0)
    spent = engine.budget.spent
    assert _ask(engine, [2, 2, 0, 0, 0, 0, 0, 0, 0], eps=30.0).source == "history"
    assert _ask(engine, [1, -1, 0, 0, 0, 0, 0, 0, 0], eps=15.0).source == "history"
    assert engine.budget.spent == spent


def test_group_by_batch_charges_each_cell_once() -> None:
    engine = _engine()
    groups = [[1, 1, 0, 0, 0, 0, 0, 0, 0], [0, 0, 1, 1, 0, 0, 0, 0, 0], [0, 0, 0, 0, 1, 1, 1, 0, 0]]
    accuracy = AccuracyRequest(10.0, 0.95)
    replies = engine.answer(
        [QueryRequest(LinearQuery.from_dense(g), accuracy) for g in groups], _measure
    )
    assert [r.source for r in replies] == ["fresh"] * 3
    assert len({r.budget_charged for r in replies}) == 1
    assert engine.budget.spent == replies[0].budget_charged  # parallel composition
    assert all(r.budget_remaining == Fraction(10) - replies[0].budget_charged for r in replies)


def test_a_batch_leans_on_its_own_planned_measurements() -> None:
    engine = _engine()
    _ask(engine, [1, 1, 0, 0, 0, 0, 0, 0, 0], eps=2.0)  # the total T = g1 + g2
    accuracy = AccuracyRequest(6.0, 0.9)
    batch = [
        QueryRequest(LinearQuery.from_dense(g), accuracy)
        for g in ([1, 0, 0, 0, 0, 0, 0, 0, 0], [0, 1, 0, 0, 0, 0, 0, 0, 0])
    ]
    plan = engine.plan(batch)
    assert plan.decisions[0].source == "fresh"
    # g2 = T - g1: the planned g1 plus history make it cheaper than answering it from scratch
    alone = _engine().plan(batch[1:]).decisions[0]
    assert plan.decisions[1].source in ("history", "combined")
    assert plan.decisions[1].budget < alone.budget
    replies = engine.execute(plan, _measure(plan.measurements))
    assert [r.source for r in replies] == [d.source for d in plan.decisions]


def test_a_batch_over_budget_is_refused_whole_and_charges_nothing() -> None:
    engine = _engine(total="0.5")
    accuracy = AccuracyRequest(5.0, 0.9)
    batch = [
        QueryRequest(LinearQuery.from_dense(g), accuracy)
        for g in ([1, 0, 0, 0, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0, 0, 0, 0])
    ]
    with pytest.raises(BudgetExhausted, match="exhausted") as refused:
        engine.plan(batch)
    assert "batch of 2 queries to ±5 at 0.9 confidence" in (refused.value.detail or "")
    assert engine.budget.spent == 0 and engine.history_size == 0
    # each alone fits
    assert engine.plan(batch[:1]).measurements


def test_a_stale_plan_is_refused() -> None:
    engine = _engine()
    request = [
        QueryRequest(LinearQuery.from_dense([1, 0, 0, 0, 0, 0, 0, 0, 0]), AccuracyRequest(5.0, 0.9))
    ]
    early, late = engine.plan(request), engine.plan(request)
    engine.execute(late, _measure(late.measurements))
    with pytest.raises(StalePlanError):
        engine.execute(early, _measure(early.measurements))


def test_measuring_changes_nothing_until_recorded() -> None:
    engine = _engine()
    request = [
        QueryRequest(LinearQuery.from_dense([1, 1, 0, 0, 0, 0, 0, 0, 0]), AccuracyRequest(5.0, 0.9))
    ]
    plan = engine.plan(request)
    (entry,) = engine.measure(plan, _measure(plan.measurements))
    assert engine.budget.spent == 0 and engine.history_size == 0  # a failed write loses nothing
    (reply,) = engine.record(plan, [entry])
    assert reply.source == "fresh" and engine.budget.spent == entry.budget
    assert engine.history_size == 1


def test_an_engine_of_one_table_refuses_another_tables_history() -> None:
    other = HistoryEntry("u", LinearQuery.from_dense([1.0] * 9), Fraction(1), Fraction(1), 3.0)
    with pytest.raises(ValueError, match="table 'u'"):
        _engine(history=[other])


def test_an_engine_rebuilt_from_its_history_agrees() -> None:
    kept = Recorder()
    engine = _engine()
    for dense in (
        [1, 1, 0, 0, 0, 0, 0, 0, 0],
        [0, 1, 1, 0, 0, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0, 0, 0, 0],
    ):
        _ask(engine, dense, eps=4.0, recorder=kept)
    rebuilt = _engine(history=kept.entries)
    assert rebuilt.budget.per_cell() == engine.budget.per_cell()
    query = [1, 2, 1, 0, 0, 0, 0, 0, 0]
    again, before = _ask(rebuilt, query, eps=50.0), _ask(engine, query, eps=50.0)
    assert again.source == before.source == "history"
    assert (again.estimate, again.high) == pytest.approx((before.estimate, before.high), rel=1e-12)
    # and it equals a recomputation from the entries
    expected: dict[int, Fraction] = {}
    for entry in kept.entries:
        for cell, charge in cell_charges(entry.query, entry.budget).per_cell().items():
            expected[cell] = expected.get(cell, Fraction(0)) + charge
    assert rebuilt.budget.per_cell() == expected


def test_decisions_never_see_released_values() -> None:
    # Two histories alike in everything public, unlike in every noisy answer, plan alike.
    histories = [
        [
            HistoryEntry(
                "t", LinearQuery.from_dense(row), Fraction(1, 10), Fraction(1, 1024), y + shift
            )
            for row, y in (([1, 1, 0, 0, 0, 0, 0, 0, 0], 30.0), ([0, 1, 1, 0, 0, 0, 0, 0, 0], 55.0))
        ]
        for shift in (0.0, 1e6)
    ]
    requests = [
        QueryRequest(LinearQuery.from_dense(q), AccuracyRequest(eps, 0.9))
        for q, eps in (
            ([1, 2, 1, 0, 0, 0, 0, 0, 0], 90.0),
            ([1, 0, -1, 0, 0, 0, 0, 0, 0], 20.0),
            ([1, 1, 0, 0, 0, 0, 0, 0, 0], 25.0),  # a repeat: the stored row itself is a candidate
            ([2, 2, 0, 0, 0, 0, 0, 0, 0], 42.0),  # ... and one combined with a new measurement
        )
    ]
    plans = [_engine(history=h).plan(requests) for h in histories]
    assert [(d.source, d.budget, d.half_width, d.basis) for d in plans[0].decisions] == [
        (d.source, d.budget, d.half_width, d.basis) for d in plans[1].decisions
    ]


def test_nonnegative_counts_trim_the_interval_but_not_the_spend() -> None:
    zero_cell = [0, 0, 0, 0, 0, 0, 0, 1, 0]  # x_8 = 0
    request = [QueryRequest(LinearQuery.from_dense(zero_cell), AccuracyRequest(50.0, 0.9))]
    plain, trimmed = _engine(seed=4), _engine(seed=4, nonnegative=True)
    assert [d.budget for d in plain.plan(request).decisions] == [
        d.budget for d in trimmed.plan(request).decisions
    ]
    (a,) = plain.answer(request, _measure)
    (b,) = trimmed.answer(request, _measure)
    assert b.low == max(a.low, 0.0) and b.high == a.high and b.estimate == max(a.estimate, 0.0)
    assert b.low <= 0 <= b.high


def test_queries_over_another_cube_are_refused() -> None:
    with pytest.raises(InvalidParameterValue):
        _engine().plan(
            [QueryRequest(LinearQuery.from_dense([1.0, 1.0]), AccuracyRequest(1.0, 0.9))]
        )


def test_execute_needs_one_true_answer_per_measurement() -> None:
    engine = _engine()
    plan = engine.plan(
        [
            QueryRequest(
                LinearQuery.from_dense([1, 0, 0, 0, 0, 0, 0, 0, 0]), AccuracyRequest(5.0, 0.9)
            )
        ]
    )
    with pytest.raises(ValueError):
        engine.execute(plan, [])


def test_measure_changes_nothing_until_record() -> None:
    engine = _engine()
    request = QueryRequest(
        LinearQuery.from_dense([1, 1, 1, 0, 0, 0, 0, 0, 0]), AccuracyRequest(5.0, 0.9)
    )
    plan = engine.plan([request])
    entries = engine.measure(plan, _measure(plan.measurements))
    assert len(entries) == 1 and engine.history_size == 0 and engine.budget.spent == 0
    (reply,) = engine.record(plan, entries)
    assert reply.source == "fresh" and engine.history_size == 1
    assert engine.budget.spent == entries[0].budget
    with pytest.raises(StalePlanError):
        engine.record(plan, entries)  # recording twice would double the history


def test_absorbed_entries_make_queries_free_and_are_charged() -> None:
    writer, reader = _engine(), _engine(seed=2)
    request = QueryRequest(
        LinearQuery.from_dense([0, 0, 0, 1, 1, 0, 0, 0, 0]), AccuracyRequest(5.0, 0.9)
    )
    plan = writer.plan([request])
    entries = writer.measure(plan, _measure(plan.measurements))
    writer.record(plan, entries)
    reader.absorb(entries)
    assert reader.budget.per_cell() == writer.budget.per_cell()
    (free,) = reader.answer([request], _measure)
    assert free.source == "history" and free.budget_charged == 0
