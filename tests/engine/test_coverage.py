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
from the stored history.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from fractions import Fraction

import numpy as np
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

N_CELLS = 6
Outcomes = list[tuple[str, bool]]


def _random_query(rng: np.random.Generator) -> LinearQuery:
    dense = np.zeros(N_CELLS)
    cells = rng.choice(N_CELLS, size=int(rng.integers(1, 4)), replace=False)
    dense[cells] = rng.choice([1.0, 1.0, 1.0, 2.0, -1.0, 0.5], size=cells.size)
    return LinearQuery.from_dense(dense, offset=float(rng.integers(-5, 6)))


def _combination(rng: np.random.Generator, queries: Sequence[LinearQuery]) -> LinearQuery:
    picked = rng.choice(len(queries), size=2, replace=False)
    dense = sum(float(rng.choice([1, -1, 2])) * queries[i].to_dense() for i in picked)
    if not np.any(dense):
        dense = queries[picked[0]].to_dense()
    return LinearQuery.from_dense(dense)


def _recomputed_ledger(entries: list[HistoryEntry]) -> dict[int, Fraction]:
    spent: dict[int, Fraction] = defaultdict(Fraction)
    for entry in entries:
        s = max(abs(Fraction(repr(w))) for w in entry.query.weights.tolist())
        for cell, w in zip(entry.query.cells.tolist(), entry.query.weights.tolist()):
            spent[cell] += entry.budget * abs(Fraction(repr(w))) / s
    return dict(spent)


def _trial(seed: int, delta: float) -> list[tuple[str, bool]]:
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 60, N_CELLS)
    kept = Recorder()
    total = Fraction(int(rng.integers(5, 40)), 10)
    engine = PrivacyEngine("t", N_CELLS, total_budget=total, rng=SeededRandomSource(seed))
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

    base = [_random_query(rng) for _ in range(3)]
    widths = rng.uniform(2.0, 20.0, size=3)
    for query, eps in zip(base, widths):
        ask(query, float(eps))
    for factor in (3.0, 3.0, 0.4, 0.4):  # loose: history; tight: combined
        ask(_combination(rng, base), float(factor * widths.mean()))
    ask(_random_query(rng), float(rng.uniform(2.0, 20.0)))
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
@pytest.mark.parametrize("delta", [0.05, 0.2])
def test_coverage_two_thousand_trials_per_source(delta: float) -> None:
    counts = _check_coverage(trials=2_600, delta=delta, first_seed=0)
    assert min(counts[s] for s in ("fresh", "history", "combined")) >= 2_000, counts
    assert counts["history+repeat"] >= 1_500, counts


@pytest.mark.parametrize("delta", [0.5, 0.2])
def test_mixture_coverage_quick(delta: float) -> None:
    counts = _check_coverage(trials=60, delta=delta, first_seed=20_000, trial=_mixture_trial)
    assert counts["history+mixture"] >= 50, counts


@pytest.mark.slow
@pytest.mark.parametrize("delta", [0.5, 0.2])
def test_mixture_coverage_two_thousand_trials(delta: float) -> None:
    counts = _check_coverage(trials=2_600, delta=delta, first_seed=0, trial=_mixture_trial)
    assert counts["history+mixture"] >= 2_000, counts
