"""AVG of a measure through the service: a ratio of the clamped sum and the count, with an
interval that holds PostgreSQL's clamped average, charged by the measure's bound."""

from __future__ import annotations

from collections import defaultdict
from fractions import Fraction

from tests.engine.reference import cell_charges

from .test_ratios import CONFIG, Run, answer, run, truth

__all__ = ["run"]  # the fixture, shared with test_ratios


def test_average_of_a_measure_per_group(run: Run, adult_dsn: str) -> None:
    sql = (
        "SELECT sex, AVG(hours_per_week) AS h, DP_INTERVAL_LOW(AVG(hours_per_week)), "
        "DP_INTERVAL_HIGH(AVG(hours_per_week)) FROM adult GROUP BY sex "
        "WITH ACCURACY 0.5 CONFIDENCE 0.95"
    )
    result = answer(run, sql)
    expected = dict(
        truth(  # type: ignore[arg-type]
            adult_dsn,
            "SELECT sex, avg(least(greatest(hours_per_week, 1), 99)) FROM adult GROUP BY sex",
        )
    )
    assert [r[0] for r in result.rows] == ["Male", "Female"]
    for sex, value, low, high in result.rows:
        assert isinstance(low, float) and isinstance(high, float) and value is not None
        assert low <= float(expected[sex]) <= high and high - low <= 1.0
    # the sums were measured with the measure's sensitivity, and charged to the cells that own
    # their coordinates
    entries = run[2].entries
    assert any(e.query.sensitivity == 99 for e in entries)
    spent: dict[int, Fraction] = defaultdict(Fraction)
    for entry in entries:  # recomputed by the reference's own charges (box corners)
        for cell, charge in cell_charges(entry.query, entry.budget).items():
            spent[cell] += charge
    assert run[1].engine(CONFIG.cubes[0]).budget.per_cell() == dict(spent)
