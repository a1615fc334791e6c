"""An engine restarted from its history holds what the engine that released it held.

The restart decomposes the history's vectors together and places their span in bulk
(:meth:`~proxy.engine.span.SpanSolver.place_all`, through inner products, blocks of 64);
the engine that released them placed each batch's vectors at its next solve. Over the demo
cube with its measures, with a history of hundreds of distinct SQL vectors (many blocks), both
must hold the same history, spend per cell and decisions.
"""

from __future__ import annotations

import random
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from proxy.config import load_config
from proxy.engine import PrivacyEngine, QueryRequest, SeededRandomSource
from proxy.engine.history import HistoryEntry
from sqlmap.vector import LinearQuery
from tests.engine.recording import Recorder

CONFIG = load_config(Path(__file__).parent.parent.parent / "config.yaml")
TRANSLATOR = CONFIG.translator()
(CUBE,) = CONFIG.cubes
AGES = (17, 25, 35, 45, 55, 65, 91)
RACES = ("White", "Black", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other")
EDUCATION = ("HS-grad", "Some-college", "Bachelors", "Masters", "Doctorate", "11th")
STATEMENTS, PROBES = 120, 20
# one step of the 12-digit grid a combined budget is found on (at most 1e-11 of it)
_ONE_STEP = 1.01e-11


def _filter(rng: random.Random) -> str:
    lo, hi = sorted(rng.sample(AGES, 2))
    return rng.choice(
        (
            f"age >= {lo} AND age < {hi}",
            f"sex = '{rng.choice(('Male', 'Female'))}'",
            f"race = '{rng.choice(RACES)}'",
            f"income = '{rng.choice(('>50K', '<=50K'))}'",
            f"education IN ('{rng.choice(EDUCATION)}', '{rng.choice(EDUCATION)}')",
            "hours_per_week >= 41",
        )
    )


def _statement(rng: random.Random) -> str:
    """A dashboard's statement: counts and sums, GROUP BYs over 1-3 columns, SUM(CASE ...)."""
    kind = rng.random()
    where = f" WHERE {_filter(rng)}" if rng.random() < 0.6 else ""
    if kind < 0.3:
        accuracy = rng.choice((15, 40, 200))
        return f"SELECT COUNT(*) FROM adult WHERE {_filter(rng)} WITH ACCURACY {accuracy}"
    if kind < 0.7:
        keys = ", ".join(rng.sample(("sex", "race", "income"), rng.randint(1, 3)))
        value = rng.choice(("COUNT(*)", "COUNT(*)", "SUM(hours_per_week)"))
        accuracy = rng.choice((30, 100)) if value == "COUNT(*)" else rng.choice((5000, 50000))
        return f"SELECT {keys}, {value} FROM adult{where} GROUP BY {keys} WITH ACCURACY {accuracy}"
    if kind < 0.85:
        return (
            f"SELECT SUM(capital_gain) FROM adult{where} WITH ACCURACY {rng.choice((10**5, 10**6))}"
        )
    return (
        f"SELECT SUM(CASE WHEN {_filter(rng)} THEN age ELSE 0 END) FROM adult{where} "
        f"WITH ACCURACY {rng.choice((3000, 30000))}"
    )


def _requests(sql: str) -> list[QueryRequest]:
    spec = TRANSLATOR.translate(sql)
    assert spec.accuracy is not None
    return [QueryRequest(q, spec.accuracy) for q in spec.queries]


def _engine(history: list[HistoryEntry] | None = None) -> PrivacyEngine:
    return PrivacyEngine(
        CUBE.qualified_name,
        CUBE.n_coordinates,
        total_budget=Fraction(10**6),
        history=history or (),
        rng=SeededRandomSource(3),
        measures=CUBE.measure_reach,
        shape=CUBE.shape,
    )


@pytest.mark.parametrize("seed", [0, 1])
def test_a_restarted_engine_holds_and_decides_as_the_one_that_released_its_history(
    seed: int,
) -> None:
    rng = random.Random(seed)
    histogram = np.random.default_rng(seed).integers(0, 40, CUBE.n_coordinates).astype(float)

    def measure(queries: list[LinearQuery]) -> list[float]:
        return [q.evaluate(histogram) for q in queries]

    live, kept = _engine(), Recorder()
    for _ in range(STATEMENTS):
        kept.answer(live, _requests(_statement(rng)), measure)
    restarted = _engine(kept.entries)
    size, distinct, rank = live.history_shape
    assert restarted.history_shape == (size, distinct, rank)
    assert distinct > 2 * 64 and rank is not None and rank > 64  # blocks against a basis
    # nothing is left for the first decision to place or factor
    span = restarted._index._span
    assert span is not None and not span._queue and not span._k_pending
    assert span._index is not None and span._indexed + 32 >= span.rank
    assert restarted.budget.spent == live.budget.spent
    assert restarted.budget.per_cell() == live.budget.per_cell()
    sources = set()
    for _ in range(PROBES):
        requests = _requests(_statement(rng))
        planned, replanned = live.plan(requests), restarted.plan(requests)
        assert replanned.measurements == planned.measurements
        # Inherent, not a defect of either side: the two engines factor the same history in
        # different orders (the live one bordered K^-1 term by term, the restart inverts K at
        # once), so their BLUEs agree to rounding (half-widths to ~1e-12), not bitwise. A
        # combined answer's budget is where its miss bound crosses the target on the 12-digit
        # grid (decision._least_on_grid); a bound within rounding of the target at a grid
        # point can put it one step higher on one side: over seeds 0-9 two budgets were one
        # step apart (1.0e-12, 1.1e-12), the rest equal. (When a root rounded up was raised by
        # 1e-9 while it missed, they were apart by 4e-12 to 9.998e-10.)
        for a, b in zip(planned.decisions, replanned.decisions, strict=True):
            sources.add(a.source)
            assert b.source == a.source
            assert float(b.budget) == pytest.approx(float(a.budget), rel=_ONE_STEP)
            assert float(b.step) == pytest.approx(float(a.step), rel=_ONE_STEP)
            assert b.half_width == pytest.approx(a.half_width, rel=1e-9)
            assert b.confidence == pytest.approx(a.confidence, rel=1e-9)
    assert sources == {"history", "fresh", "combined"}
