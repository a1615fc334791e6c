"""Ratios: the box interval, the split, and coverage of ratio intervals over seeded trials.

Every coverage trial builds an engine on a small random cube and asks, in rounds as
:class:`~proxy.engine.ratio.RatioRounds` decides them, a share of rows (``N`` within ``D``), a
mean over the same denominator (``N`` weighs values up to 90), a ratio whose numerator reaches
outside its denominator (no public bound ``R``), and a share over a second, smaller
denominator. Per kind and confidence, the empirical coverage must be at least ``c`` minus three
binomial standard errors (the union bound makes it higher in truth), no interval may be wider
than asked more often than it may miss, no cell overspends, and the ledger equals a
recomputation from the stored history.
"""

from __future__ import annotations

import math
from collections import defaultdict
from fractions import Fraction

import numpy as np
import pytest

from proxy.engine import AccuracyRequest, PrivacyEngine, SeededRandomSource
from proxy.engine.engine import Reply
from proxy.engine.ratio import Ratio, RatioRounds, ratio_bound, ratio_box
from proxy.errors import BudgetExhausted
from sqlmap.vector import LinearQuery
from tests.engine.recording import Recorder

N_CELLS = 8


def _ledger(recorder: Recorder) -> dict[int, Fraction]:
    spent: dict[int, Fraction] = defaultdict(Fraction)
    for entry in recorder.entries:
        s = max(abs(Fraction(repr(w))) for w in entry.query.weights.tolist())
        for cell, w in zip(entry.query.cells.tolist(), entry.query.weights.tolist()):
            spent[cell] += entry.budget * abs(Fraction(repr(w))) / s
    return dict(spent)


def _answer(
    engine: PrivacyEngine, recorder: Recorder, ratios: list[Ratio], x: np.ndarray, total: Fraction
) -> list[Reply | None]:
    rounds = RatioRounds(ratios, float(total))
    while requests := rounds.requests():
        plan = engine.plan(requests)
        truths = [m.evaluate(x) for m in plan.measurements]
        rounds.observe(recorder.execute(engine, plan, truths))
    return rounds.answers()


def _trial(seed: int, confidence: float) -> list[tuple[str, bool, bool]]:
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 60, N_CELLS)
    x[:4] += rng.integers(50, 5000, 4)  # the big denominator's cells
    x[4:6] += rng.integers(100, 600, 2)  # the small one's
    total = Fraction(int(rng.integers(1, 6)))
    recorder = Recorder()
    engine = PrivacyEngine("t", N_CELLS, total_budget=total, rng=SeededRandomSource(seed))
    values = rng.integers(1, 91, N_CELLS).astype(float)
    big = np.array([1, 1, 1, 1, 0, 0, 0, 0.0])
    small = np.array([0, 0, 0, 0, 1, 1, 0, 0.0])
    share = big * (rng.random(N_CELLS) < 0.5)
    share[0] = 1.0
    outside = share.copy()
    outside[6] = 1.0
    kinds = {
        "share": (share, big, float(rng.uniform(0.01, 0.1))),
        "mean": (values * big, big, float(rng.uniform(0.5, 4.0))),
        "unbounded": (outside, big, float(rng.uniform(0.02, 0.2))),
        "small group": (np.array([0, 0, 0, 0, 1, 0, 0, 0.0]), small, float(rng.uniform(0.1, 0.4))),
    }
    ratios = [
        Ratio(
            LinearQuery.from_dense(n), LinearQuery.from_dense(d), AccuracyRequest(eps, confidence)
        )
        for n, d, eps in kinds.values()
    ]
    try:
        answers = _answer(engine, recorder, ratios, x, total)
    except BudgetExhausted:
        return []
    finally:
        assert engine.budget.per_cell() == _ledger(recorder)
        assert engine.budget.spent <= total
    outcomes = []
    for kind, ratio, reply in zip(kinds, ratios, answers):
        if reply is None:
            outcomes.append(("null", True, False))
            continue
        truth = ratio.numerator.evaluate(x) / ratio.denominator.evaluate(x)
        wide = (reply.high - reply.low) / 2 > ratio.accuracy.eps * (1 + 1e-9)
        outcomes.append((kind, reply.low <= truth <= reply.high, wide))
    return outcomes


def _check(trials: int, confidence: float, first_seed: int) -> dict[str, int]:
    tally: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for seed in range(first_seed, first_seed + trials):
        for kind, covered, wide in _trial(seed, confidence):
            tally[kind][0] += covered
            tally[kind][1] += wide
            tally[kind][2] += 1
    delta = 1 - confidence
    for kind, (covered, wide, n) in tally.items():
        se = math.sqrt(delta * (1 - delta) / n)
        assert covered / n >= confidence - 3 * se, (kind, covered / n, n)
        assert wide / n <= delta + 3 * se, (kind, wide / n, n)
    return {kind: n for kind, (_, _, n) in tally.items()}


def test_ratio_coverage_quick() -> None:
    counts = _check(trials=40, confidence=0.9, first_seed=30_000)
    assert min(counts[k] for k in ("share", "mean", "unbounded", "small group")) >= 25, counts


@pytest.mark.slow
@pytest.mark.timeout(3600)  # about 0.2 s of CPU per trial, the engine's exact tails mostly
@pytest.mark.parametrize("confidence", [0.9, 0.95])
def test_ratio_coverage_two_thousand_trials(confidence: float) -> None:
    counts = _check(trials=2_100, confidence=confidence, first_seed=0)
    assert min(counts[k] for k in ("share", "mean", "unbounded")) >= 2_000, counts
    assert counts["small group"] >= 1_700, counts  # the rest NULL: too few rows for the budget


def test_box_is_the_range_of_the_quotient_and_null_when_the_denominator_reaches_zero() -> None:
    assert ratio_box(-2.0, 3.0, 4.0, 8.0) == (-0.5, 0.75)
    assert ratio_box(1.0, 2.0, -4.0, -2.0) == (-1.0, -0.25)
    assert ratio_box(1.0, 2.0, 0.0, 3.0) is None
    assert ratio_box(1.0, 2.0, -1.0, 3.0) is None


def test_public_bound_of_a_ratio() -> None:
    d = LinearQuery.from_dense([1.0, 2.0, 1.0, 0.0])
    assert ratio_bound(LinearQuery.from_dense([1.0, 0.0, -3.0, 0.0]), d) == 3.0
    assert ratio_bound(LinearQuery.from_dense([0.0, 1.0, 0.0, 0.0]), d) == 0.5
    assert ratio_bound(LinearQuery.from_dense([0.0, 0.0, 0.0, 1.0]), d) is None
    assert ratio_bound(LinearQuery.from_dense([1.0, 0.0, 0.0, 0.0], offset=1.0), d) is None
