"""Coverage: over seeded random workloads, intervals hold the truth as often as they claim.

Every trial builds its own engine on a small random cube and asks three fresh queries, then
combinations of them loosely (answered from history) and tightly (history plus a fresh
measurement), one more fresh query, and the first three again at their first accuracy. Those
repeats are answered from a history estimate chosen by its exact interval: the BLUE, the
query's own earlier measurement, or a mixture of the two (``history+repeat``,
``history+mixture``; a ``+basis`` suffix marks any estimate other than the BLUE). The noise
comes from a seeded source, so a failure reproduces. Mixtures are chosen only when neither
end of the segment suffices, which such workloads rarely reach, so a second kind of trial
aims at them: ``x0 + x1`` measured, then ``x0`` and ``x1`` alone, then ``x0 + x1`` again at a
half-width between the narrowest mixture and the narrower end (computed, as the engine
would, from the stored history's public numbers). Per kind of answer and delta, the
empirical coverage must be at least ``1 - delta`` minus three binomial standard errors, and
(the intervals being the narrowest the engine can justify) at most ``1 - delta`` plus five.
Every trial also checks that no cell overspent and that the ledger equals a recomputation
from the stored history (by the reference engine's charges). Measured trials do the same with
sums of measures beside counts, at accuracies in the sums' units.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from fractions import Fraction

import numpy as np
import numpy.typing as npt
import pytest

from proxy.engine import (
    AccuracyRequest,
    HistoryEntry,
    PrivacyEngine,
    QueryRequest,
    SeededRandomSource,
)
from proxy.engine.estimator import HistoryIndex, combine
from proxy.engine.selection import interval
from proxy.errors import BudgetExhausted
from sqlmap.vector import LinearQuery
from tests.engine.recording import Recorder
from tests.engine.reference import cell_charges

Measures = tuple[tuple[int, int], ...]

N_CELLS = 6
Outcomes = list[tuple[str, bool]]
#: Measures of the measured trials: what one row adds to its cell's sum of each
MEASURES = ((0, 50), (-3, 7))


def _random_query(rng: np.random.Generator, measures: Measures = ()) -> LinearQuery:
    """Counts of a few cells (weighted), or with measures, sums of them beside counts."""
    dense = np.zeros(N_CELLS * (1 + len(measures)))
    cells = rng.choice(N_CELLS, size=int(rng.integers(1, 4)), replace=False)
    weights = rng.choice([1.0, 1.0, 1.0, 2.0, -1.0, 0.5], size=cells.size)
    kind = int(rng.integers(1 + len(measures))) if measures else 0
    dense[kind * N_CELLS + cells] = weights
    if kind and rng.random() < 0.5:  # SUM(m) - k COUNT(*)
        dense[cells] -= float(rng.choice([1.0, 10.0]))
    return LinearQuery.from_dense(dense, offset=float(rng.integers(-5, 6)), measures=measures)


def _combination(rng: np.random.Generator, queries: Sequence[LinearQuery]) -> LinearQuery:
    picked = rng.choice(len(queries), size=2, replace=False)
    dense = sum(float(rng.choice([1, -1, 2])) * queries[i].to_dense() for i in picked)
    if not np.any(dense):
        dense = queries[picked[0]].to_dense()
    return LinearQuery.from_dense(dense, measures=queries[0].measures)


def _recomputed_ledger(entries: list[HistoryEntry]) -> dict[int, Fraction]:
    spent: dict[int, Fraction] = defaultdict(Fraction)
    for entry in entries:
        for cell, charge in cell_charges(entry.query, entry.budget).items():
            spent[cell] += charge
    return dict(spent)


def _histogram(rng: np.random.Generator, measures: Measures) -> npt.NDArray[np.int64]:
    """Counts, then per measure sums that the cell's rows could add up to."""
    counts = rng.integers(0, 60, N_CELLS)
    sums = [[int(rng.integers(lo * c, hi * c + 1)) for c in counts] for lo, hi in measures]
    return np.concatenate([counts, *(np.array(s, dtype=np.int64) for s in sums)])


def _trial(seed: int, delta: float, measures: Measures = ()) -> list[tuple[str, bool]]:
    rng = np.random.default_rng(seed)
    x = _histogram(rng, measures) if measures else rng.integers(0, 60, N_CELLS)
    kept = Recorder()
    total = Fraction(int(rng.integers(5, 40)), 10)
    n = N_CELLS * (1 + len(measures))
    engine = PrivacyEngine(
        "t", n, total_budget=total, rng=SeededRandomSource(seed), measures=measures
    )
    outcomes = []

    def ask(query: LinearQuery, eps: float) -> None:
        request = QueryRequest(query, AccuracyRequest(eps, 1 - delta))
        try:
            plan = engine.plan([request])
        except BudgetExhausted:
            return
        (reply,) = kept.execute(engine, plan, [m.evaluate(x) for m in plan.measurements])
        (decision,) = plan.decisions
        kind = (
            reply.source if decision.basis in (None, "blue") else f"{reply.source}+{decision.basis}"
        )
        outcomes.append((kind, reply.low <= query.evaluate(x) <= reply.high))

    base = [_random_query(rng, measures) for _ in range(3)]
    scale = max(q.sensitivity for q in base) if measures else 1.0  # in the sums' units
    widths = rng.uniform(2.0, 20.0, size=3) * scale
    for query, eps in zip(base, widths):
        ask(query, float(eps))
    for factor in (3.0, 3.0, 0.4, 0.4):  # loose: history; tight: combined
        ask(_combination(rng, base), float(factor * widths.mean()))
    ask(_random_query(rng, measures), float(rng.uniform(2.0, 20.0) * scale))
    for query, eps in zip(base, widths):  # repeats, after overlapping measurements
        ask(query, float(eps))

    assert engine.budget.per_cell() == _recomputed_ledger(kept.entries)
    assert engine.budget.spent <= total
    return outcomes


def _mixture_trial(seed: int, delta: float) -> list[tuple[str, bool]]:
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 60, 3)
    kept = Recorder()
    engine = PrivacyEngine("t", 3, total_budget=Fraction(100), rng=SeededRandomSource(seed))

    def ask(dense: list[float], eps: float) -> tuple[str, bool]:
        query = LinearQuery.from_dense(dense, offset=float(rng.integers(-5, 6)))
        plan = engine.plan([QueryRequest(query, AccuracyRequest(eps, 1 - delta))])
        (reply,) = kept.execute(engine, plan, [m.evaluate(x) for m in plan.measurements])
        (decision,) = plan.decisions
        kind = (
            reply.source if decision.basis in (None, "blue") else f"{reply.source}+{decision.basis}"
        )
        return kind, reply.low <= query.evaluate(x) <= reply.high

    eps = float(rng.uniform(2.0, 20.0))
    ask([1.0, 1.0, 0.0], eps)
    ask([1.0, 0.0, 0.0], eps * float(rng.uniform(1.0, 1.5)))
    ask([0.0, 1.0, 0.0], eps * float(rng.uniform(1.0, 1.5)))
    index = HistoryIndex(3)  # the engine's view, rebuilt from what it released
    for entry in kept.entries:
        index.append(entry.query, alpha=float(entry.budget), step=float(entry.step))
    target = LinearQuery.from_dense([1.0, 1.0, 0.0])
    blue, (repeat,) = index.solve(target), index.repeats(target)
    assert blue is not None
    miss = AccuracyRequest(1.0, 1 - delta).delta
    ends = min(interval(blue, miss).half_width, interval(repeat, miss).half_width)
    segment = [combine([(1 - lam, repeat), (lam, blue)]) for lam in np.linspace(0.1, 0.9, 9)]
    least = min(interval(mixed, miss).half_width for mixed in segment)
    if not least < ends:
        return []
    return [ask([1.0, 1.0, 0.0], (least + ends) / 2)]


def _check_coverage(
    trials: int, delta: float, first_seed: int, trial: Callable[[int, float], Outcomes] = _trial
) -> dict[str, int]:
    tally: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for seed in range(first_seed, first_seed + trials):
        for source, covered in trial(seed, delta):
            tally[source][0] += covered
            tally[source][1] += 1
    for source, (covered, n) in tally.items():
        se = math.sqrt(delta * (1 - delta) / n)
        rate = covered / n
        assert rate >= 1 - delta - 3 * se, (source, rate, n)
        assert rate <= 1 - delta + 5 * se, (source, rate, n)  # not wastefully wide
    return {source: n for source, (_, n) in tally.items()}


@pytest.mark.parametrize("delta", [0.05, 0.2])
def test_coverage_quick(delta: float) -> None:
    counts = _check_coverage(trials=120, delta=delta, first_seed=10_000)
    assert {"fresh", "history", "combined", "history+repeat"} <= set(counts)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # 2,600 engines: minutes of CPU on a busy machine
@pytest.mark.parametrize("delta", [0.05, 0.2])
def test_coverage_two_thousand_trials_per_source(delta: float) -> None:
    counts = _check_coverage(trials=2_600, delta=delta, first_seed=0)
    assert min(counts[s] for s in ("fresh", "history", "combined")) >= 2_000, counts
    assert counts["history+repeat"] >= 1_500, counts


def _measured_trial(seed: int, delta: float) -> Outcomes:
    return _trial(seed, delta, MEASURES)


@pytest.mark.parametrize("delta", [0.05, 0.2])
def test_coverage_of_sums_of_measures_quick(delta: float) -> None:
    counts = _check_coverage(trials=120, delta=delta, first_seed=30_000, trial=_measured_trial)
    assert {"fresh", "history", "combined"} <= set(counts)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # 2,600 engines: minutes of CPU on a busy machine
@pytest.mark.parametrize("delta", [0.05, 0.2])
def test_coverage_of_sums_of_measures_two_thousand_trials(delta: float) -> None:
    counts = _check_coverage(trials=2_600, delta=delta, first_seed=0, trial=_measured_trial)
    assert min(counts[s] for s in ("fresh", "history", "combined")) >= 2_000, counts


@pytest.mark.parametrize("delta", [0.5, 0.2])
def test_mixture_coverage_quick(delta: float) -> None:
    counts = _check_coverage(trials=60, delta=delta, first_seed=20_000, trial=_mixture_trial)
    assert counts["history+mixture"] >= 50, counts


@pytest.mark.slow
@pytest.mark.timeout(1800)  # 2,600 engines: minutes of CPU on a busy machine
@pytest.mark.parametrize("delta", [0.5, 0.2])
def test_mixture_coverage_two_thousand_trials(delta: float) -> None:
    counts = _check_coverage(trials=2_600, delta=delta, first_seed=0, trial=_mixture_trial)
    assert counts["history+mixture"] >= 2_000, counts
