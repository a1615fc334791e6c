"""Coverage: over seeded random workloads, intervals hold the truth as often as they claim.

Every trial builds its own engine on a small random cube and asks three fresh queries, then
combinations of them loosely (answered from history) and tightly (history plus a fresh
measurement), and one more fresh query. The noise comes from a seeded source, so a failure
reproduces. Per source and delta, the empirical coverage must be at least ``1 - delta`` minus
three binomial standard errors, and (the intervals being the narrowest the engine can justify)
at most ``1 - delta`` plus five. Every trial also checks that no cell overspent and that the
ledger equals a recomputation from the stored history.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from fractions import Fraction

import numpy as np
import pytest

from proxy.engine import (
    AccuracyRequest,
    InMemoryHistoryStore,
    PrivacyEngine,
    QueryRequest,
    SeededRandomSource,
)
from proxy.errors import BudgetExhausted
from sqlmap.vector import LinearQuery

N_CELLS = 6


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


def _recomputed_ledger(store: InMemoryHistoryStore) -> dict[int, Fraction]:
    spent: dict[int, Fraction] = defaultdict(Fraction)
    for entry in store.entries("t"):
        s = max(abs(Fraction(repr(w))) for w in entry.query.weights.tolist())
        for cell, w in zip(entry.query.cells.tolist(), entry.query.weights.tolist()):
            spent[cell] += entry.budget * abs(Fraction(repr(w))) / s
    return dict(spent)


def _trial(seed: int, delta: float) -> list[tuple[str, bool]]:
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 60, N_CELLS)
    store = InMemoryHistoryStore()
    total = Fraction(int(rng.integers(5, 40)), 10)
    engine = PrivacyEngine(
        "t", N_CELLS, total_budget=total, store=store, rng=SeededRandomSource(seed)
    )
    outcomes = []

    def ask(query: LinearQuery, eps: float) -> None:
        request = QueryRequest(query, AccuracyRequest(eps, 1 - delta))
        try:
            (reply,) = engine.answer([request], lambda ms: [m.evaluate(x) for m in ms])
        except BudgetExhausted:
            return
        outcomes.append((reply.source, reply.low <= query.evaluate(x) <= reply.high))

    base = [_random_query(rng) for _ in range(3)]
    widths = rng.uniform(2.0, 20.0, size=3)
    for query, eps in zip(base, widths):
        ask(query, float(eps))
    for factor in (3.0, 3.0, 0.4, 0.4):  # loose: history; tight: combined
        ask(_combination(rng, base), float(factor * widths.mean()))
    ask(_random_query(rng), float(rng.uniform(2.0, 20.0)))

    assert engine.ledger.per_cell() == _recomputed_ledger(store)
    assert engine.ledger.spent <= total
    return outcomes


def _check_coverage(trials: int, delta: float, first_seed: int) -> dict[str, int]:
    tally: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for seed in range(first_seed, first_seed + trials):
        for source, covered in _trial(seed, delta):
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
    assert set(counts) == {"fresh", "history", "combined"}


@pytest.mark.slow
@pytest.mark.parametrize("delta", [0.05, 0.2])
def test_coverage_two_thousand_trials_per_source(delta: float) -> None:
    counts = _check_coverage(trials=2_600, delta=delta, first_seed=0)
    assert min(counts[s] for s in ("fresh", "history", "combined")) >= 2_000, counts
