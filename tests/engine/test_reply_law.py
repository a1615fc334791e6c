"""The error law a reply exposes, and what is computed from it: probabilities and ranges.

Calibration runs through the engine itself: per trial a fresh engine (seeded noise) answers a
count whose true value is drawn from the flat prior on its feasible range ``[0, N]``; among the
answers given probability ``p`` the comparison must hold a fraction ``p`` of the time, for a
fresh answer (one noise term) and, in the slow suite (minutes: three-term tails), for one
combined with history (three terms).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from proxy.engine.engine import PrivacyEngine, QueryRequest, Reply
from proxy.engine.history import HistoryEntry
from proxy.engine.noise import SeededRandomSource
from proxy.engine.posterior import REAL_LINE, Interval, comparison, feasible_range
from proxy.engine.tails import EXACT
from sqlmap.accuracy import AccuracyRequest
from sqlmap.vector import LinearQuery
from tests.engine.calibration import assert_calibrated
from tests.paper_examples import (
    EIGHT_BY_FOUR_ALPHA,
    EIGHT_BY_FOUR_H,
    EIGHT_BY_FOUR_PR_THETA_POSITIVE,
    EIGHT_BY_FOUR_Y,
)

ROWS = 200  # the table's public row count N
CELLS = 4
PAIR = LinearQuery.from_dense([1.0, 1.0, 0.0, 0.0])  # x0 + x1: feasible [0, N]
EVENTS = (
    comparison(">", 20.0),
    comparison("<=", 150.0),
    comparison("between", 5.0, 40.0),
    comparison(">=", 100.0),
)


def _engine(seed: int) -> PrivacyEngine:
    return PrivacyEngine("t", CELLS, total_budget=Fraction(1000), rng=SeededRandomSource(seed))


def _ask(engine: PrivacyEngine, query: LinearQuery, eps: float, truth: float) -> Reply:
    request = QueryRequest(query, AccuracyRequest(eps, 0.95))
    (reply,) = engine.answer([request], lambda measured: [truth] * len(measured))
    return reply


def test_a_fresh_reply_carries_its_noise_scale() -> None:
    query = LinearQuery.from_dense([2.0, 0.0, 1.0, 0.0])
    reply = _ask(_engine(1), query, 30.0, 17.0)
    (scale,) = reply.scales
    assert scale == pytest.approx(2.0 / float(reply.budget_charged))
    # the interval the engine computed on the lattice is the continuous law's, to its step
    miss = EXACT.tail(np.array(reply.scales), (reply.high - reply.low) / 2)
    assert miss == pytest.approx(1 - reply.confidence, abs=2e-3)


def test_a_reply_from_history_and_a_combined_one_carry_every_term() -> None:
    engine = _engine(2)
    first = _ask(engine, LinearQuery.from_dense([1.0, 0.0, 0.0, 0.0]), 30.0, 5.0)
    second = _ask(engine, LinearQuery.from_dense([0.0, 1.0, 0.0, 0.0]), 30.0, 7.0)
    loose = _ask(engine, PAIR, 60.0, 12.0)
    assert loose.source == "history"
    both = np.concatenate([first.scales, second.scales])
    assert sorted(loose.scales) == pytest.approx(sorted(both))
    assert loose.center == pytest.approx(first.estimate + second.estimate)
    tight = _ask(engine, PAIR, 30.0, 12.0)
    assert tight.source == "combined" and len(tight.scales) == 3
    # the combined interval meets the stated confidence under the exposed law
    assert EXACT.tail(np.array(tight.scales), 30.0) <= 1 - tight.confidence + 1e-6


def test_the_papers_probability_that_theta_is_positive_from_the_engine() -> None:
    """Sec. 5.2: the 8 x 4 example's history answers x1 + x3 (42); Pr(theta > 0) is 0.96."""
    history = [
        HistoryEntry("t", LinearQuery.from_dense(row), Fraction(a), Fraction(1, 10), y)
        for row, a, y in zip(EIGHT_BY_FOUR_H, EIGHT_BY_FOUR_ALPHA, EIGHT_BY_FOUR_Y)
    ]
    engine = PrivacyEngine("t", 4, total_budget=Fraction(10), history=history)
    reply = _ask(engine, LinearQuery.from_dense([1.0, 0.0, 1.0, 0.0]), 100.0, 0.0)
    assert reply.source == "history" and round(reply.center, 1) == 42.0
    said = reply.probability(comparison(">", 0.0), REAL_LINE)  # the paper's flat prior
    assert round(said, 2) == EIGHT_BY_FOUR_PR_THETA_POSITIVE


def test_within_moves_the_estimate_into_the_range_and_cuts_the_interval() -> None:
    reply = Reply(-12.0, -62.0, 38.0, 0.95, "fresh", Fraction(1), Fraction(1), (16.7,))
    moved = reply.within(Interval(0.0, 30.0))
    assert (moved.estimate, moved.low, moved.high) == (0.0, 0.0, 30.0)
    assert moved.unbiased == moved.center == -12.0
    assert moved.probability(comparison("<", 10.0), Interval(0.0, 30.0)) == pytest.approx(
        reply.probability(comparison("<", 10.0), Interval(0.0, 30.0))
    )
    with pytest.raises(ValueError, match="already"):
        moved.within(Interval(0.0, 30.0))


def test_feasible_range_of_counts_sums_and_negative_weights() -> None:
    assert feasible_range(PAIR, ROWS) == Interval(0.0, ROWS)
    assert feasible_range(PAIR) == Interval(0.0, math.inf)
    difference = LinearQuery.from_dense([1.0, -1.0, 0.0, 0.0], offset=2.0)
    assert feasible_range(difference, ROWS) == Interval(2.0 - ROWS, 2.0 + ROWS)
    assert feasible_range(difference) == Interval(-math.inf, math.inf)
    negated = LinearQuery.from_dense([-3.0, -1.0, 0.0, 0.0])
    assert feasible_range(negated) == Interval(-math.inf, 0.0)
    assert feasible_range(negated, ROWS) == Interval(-3.0 * ROWS, 0.0)


@pytest.mark.parametrize(
    "combined",
    [pytest.param(False, id="fresh"), pytest.param(True, id="combined", marks=pytest.mark.slow)],
)
def test_probability_is_calibrated_through_the_engine(combined: bool) -> None:
    rng = np.random.default_rng(15 + combined)
    trials = 2000
    feasible = feasible_range(PAIR, ROWS)
    said = np.empty((trials, len(EVENTS)))
    held = np.empty((trials, len(EVENTS)), dtype=bool)
    for t in range(trials):
        truth = int(rng.integers(0, ROWS + 1))
        split = int(rng.integers(0, truth + 1))
        engine = _engine(10_000 * combined + t)
        if combined:
            _ask(engine, LinearQuery.from_dense([1.0, 0.0, 0.0, 0.0]), 40.0, split)
            _ask(engine, LinearQuery.from_dense([0.0, 1.0, 0.0, 0.0]), 40.0, truth - split)
        reply = _ask(engine, PAIR, 40.0, truth)
        assert reply.source == ("combined" if combined else "fresh")
        said[t] = [reply.probability(event, feasible) for event in EVENTS]
        held[t] = [event.contains(truth) for event in EVENTS]
    for e in range(len(EVENTS)):
        assert 0.05 < said[:, e].mean() < 0.95  # informative, not foregone
        assert_calibrated(said[:, e], held[:, e], slack=1e-9)
