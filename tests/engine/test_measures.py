"""Sums of measures in the engine: what one row can move decides the noise, the charges and
what history can answer; vectors must carry the table's measures."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from proxy.engine import AccuracyRequest, PrivacyEngine, QueryRequest, SeededRandomSource
from proxy.engine.budget import cell_charges
from proxy.engine.posterior import Interval, feasible_range
from proxy.errors import InvalidParameterValue
from sqlmap.vector import LinearQuery
from tests.engine.recording import Recorder

#: two cells; one measure whose rows add 0..1000 (a NULL adds 0)
REACH = ((0, 1000),)
COUNTS = np.array([30, 12])
X = np.concatenate([COUNTS, [21_000, 5_500]])  # counts, then the cells' sums


def vector(counts: list[float], sums: list[float]) -> LinearQuery:
    return LinearQuery.from_dense(counts + sums, measures=REACH)


def engine(seed: int = 0, total: str = "10") -> PrivacyEngine:
    return PrivacyEngine(
        "t", 4, total_budget=Fraction(total), rng=SeededRandomSource(seed), measures=REACH
    )


def test_a_cell_is_charged_by_what_one_of_its_rows_can_move() -> None:
    total = vector([0, 0], [1, 1])  # SUM(m): a row moves it by up to 1000 in either cell
    assert total.sensitivity == 1000
    assert cell_charges(total, Fraction(1, 10)).per_cell() == {
        0: Fraction(1, 10),
        1: Fraction(1, 10),
    }
    excess = vector([-40, 0], [1, 1])  # SUM(m) - 40 COUNT(*) in cell 0: -40 .. 960
    assert excess.sensitivity == 1000  # cell 1 still reaches 1000
    assert cell_charges(excess, Fraction(1, 10)).per_cell() == {
        0: Fraction(96, 1000),
        1: Fraction(1, 10),
    }
    mixed = vector([1, 2], [0, 0.5])  # a count in cell 0, 2 COUNT + 0.5 SUM in cell 1
    assert mixed.sensitivity == 502
    assert cell_charges(mixed, Fraction(1)).per_cell() == {0: Fraction(1, 502), 1: Fraction(1)}


def test_the_noise_is_as_wide_as_the_measures_bound() -> None:
    """A fresh SUM(m) answer strays from the truth by the scale its sensitivity of 1000 needs
    (the mean |error| of Laplace noise is its scale), not by a count's."""
    query = vector([0, 0], [1, 1])
    accuracy = AccuracyRequest(20_000, 0.9)
    errors = []
    for seed in range(400):
        e = engine(seed)
        plan = e.plan([QueryRequest(query, accuracy)])
        (budget,) = {d.budget for d in plan.decisions}
        (entry,) = e.measure(plan, [query.evaluate(X)])
        errors.append(entry.noisy_answer - query.evaluate(X))
    scale = 1000 / float(budget)
    assert scale == pytest.approx(20_000 / math.log(10), rel=0.01)  # +-20000 at 0.9
    assert np.mean(np.abs(errors)) == pytest.approx(scale, rel=0.12)


def test_history_answers_a_total_from_its_parts() -> None:
    e, kept = engine(), Recorder()
    parts = [vector([0, 0], [1, 0]), vector([0, 0], [0, 1])]  # SUM(m) GROUP BY cell
    requests = [QueryRequest(q, AccuracyRequest(10_000, 0.95)) for q in parts]
    first = kept.answer(e, requests, lambda qs: [q.evaluate(X) for q in qs])
    assert [r.source for r in first] == ["fresh", "fresh"]
    spent = e.budget.spent
    total = vector([0, 0], [1, 1])
    (reply,) = kept.answer(e, [QueryRequest(total, AccuracyRequest(20_000, 0.95))], lambda qs: [])
    assert reply.source == "history" and reply.budget_charged == 0 and e.budget.spent == spent
    assert e.budget.per_cell() == {
        c: sum(
            (cell_charges(x.query, x.budget).per_cell().get(c, Fraction(0)) for x in kept.entries),
            Fraction(0),
        )
        for c in (0, 1)
    }


def test_vectors_must_carry_the_tables_measures() -> None:
    e = engine()
    for foreign in (
        LinearQuery.from_dense([0, 0, 1, 1]),  # the coordinates, but read as counts
        LinearQuery.from_dense([0, 0, 1, 1], measures=((0, 10),)),  # other bounds
    ):
        with pytest.raises(InvalidParameterValue):
            e.plan([QueryRequest(foreign, AccuracyRequest(100, 0.9))])


def test_the_feasible_range_of_a_sum_is_the_box_of_its_bounds() -> None:
    """Answers are kept in what a table's rows can add up to: for a measure, its bounds."""
    gains = vector([0, 0], [1, 1])
    assert feasible_range(gains) == Interval(0.0, math.inf)
    assert feasible_range(gains, 10) == Interval(0.0, 10_000.0)
    signed = LinearQuery.from_dense([0, 0, 1, 1], measures=((-3, 5),))
    assert feasible_range(signed) == Interval(-math.inf, math.inf)
    assert feasible_range(signed, 10) == Interval(-30.0, 50.0)
    excess = vector([-40, 0], [1, 0])  # SUM(m) - 40 COUNT(*): -40 .. 960 per row
    assert feasible_range(excess, 2) == Interval(-80.0, 1920.0)
