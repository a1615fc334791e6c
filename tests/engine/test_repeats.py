"""Repeats: a query asked again at its first accuracy is free, however the history has grown.

Seeded random workloads on small cubes ask queries, then ask some of them again at the accuracy
of their first answer, after other (overlapping) measurements. A repeat of a fresh answer must
never be charged: the row it bought is a candidate estimate that meets that accuracy exactly.
Repeats of combined answers rest on an estimate that later rows may not reproduce; they are
counted, and must stay rare.
"""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

import numpy as np
import pytest

from proxy.engine import (
    AccuracyRequest,
    PrivacyEngine,
    QueryRequest,
    Reply,
    SeededRandomSource,
)
from sqlmap.vector import LinearQuery

Pairs = Counter[tuple[str, str]]  # (source of the first answer, source of the repeat)


def _engine(seed: int, n_cells: int) -> PrivacyEngine:
    return PrivacyEngine(
        "t",
        n_cells,
        total_budget=Fraction(10**6),
        rng=SeededRandomSource(seed),
    )


def _random_query(rng: np.random.Generator, n_cells: int) -> LinearQuery:
    dense = np.zeros(n_cells)
    cells = rng.choice(n_cells, size=int(rng.integers(1, 4)), replace=False)
    dense[cells] = rng.choice([1.0, 1.0, 2.0, -1.0], size=cells.size)
    return LinearQuery.from_dense(dense)


def _stream(seed: int, confidence: float) -> Pairs:
    """Twelve queries on six cells; 40% of them repeat an earlier one, at its first accuracy."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 60, 6)
    engine = _engine(seed, 6)

    def ask(query: LinearQuery, eps: float) -> Reply:
        request = QueryRequest(query, AccuracyRequest(eps, confidence))
        (reply,) = engine.answer([request], lambda ms: [m.evaluate(x) for m in ms])
        return reply

    pairs: Pairs = Counter()
    asked: list[tuple[LinearQuery, float, str]] = []
    for _ in range(12):
        if asked and rng.random() < 0.4:
            query, eps, first = asked[int(rng.integers(len(asked)))]
            pairs[first, ask(query, eps).source] += 1
        else:
            query, eps = _random_query(rng, 6), float(rng.uniform(2.0, 20.0))
            asked.append((query, eps, ask(query, eps).source))
    return pairs


def _after_overlaps(seed: int, confidence: float) -> Pairs:
    """Five cells: four queries, then three times a query, 1-3 others, and the query again."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 60, 5)
    engine = _engine(seed, 5)

    def ask(query: LinearQuery, eps: float) -> Reply:
        request = QueryRequest(query, AccuracyRequest(eps, confidence))
        (reply,) = engine.answer([request], lambda ms: [m.evaluate(x) for m in ms])
        return reply

    for _ in range(4):
        ask(_random_query(rng, 5), float(rng.uniform(2.0, 20.0)))
    pairs: Pairs = Counter()
    for _ in range(3):
        query, eps = _random_query(rng, 5), float(rng.uniform(2.0, 20.0))
        first = ask(query, eps).source
        for _ in range(int(rng.integers(1, 4))):
            ask(_random_query(rng, 5), float(rng.uniform(2.0, 40.0)))
        pairs[first, ask(query, eps).source] += 1
    return pairs


def _repeats(trials: int, confidence: float) -> Pairs:
    pairs: Pairs = Counter()
    for seed in range(trials):
        pairs += _stream(seed, confidence) + _after_overlaps(seed, confidence)
    return pairs


def _check(pairs: Pairs) -> None:
    charged_fresh = sum(
        n for (first, again), n in pairs.items() if first == "fresh" and again != "history"
    )
    assert charged_fresh == 0, pairs
    combined = sum(n for (first, _), n in pairs.items() if first == "combined")
    charged = combined - pairs["combined", "history"]
    assert charged <= max(1, combined // 100), pairs  # rare: see the module docstring
    assert pairs["history", "history"] == sum(
        n for (first, _), n in pairs.items() if first == "history"
    )


@pytest.mark.parametrize("confidence", [0.5, 0.95])
def test_repeats_quick(confidence: float) -> None:
    pairs = _repeats(20, confidence)
    _check(pairs)
    assert pairs["fresh", "history"] >= 70, pairs


@pytest.mark.slow
@pytest.mark.parametrize("confidence", [0.5, 0.8, 0.95])
def test_repeats_three_hundred_workloads(confidence: float) -> None:
    pairs = _repeats(300, confidence)
    _check(pairs)
    assert pairs["fresh", "history"] >= 1_000, pairs
