"""An engine restarted from a factorization another exported answers as that one would.

The exporting engine (the *writer*) factors its history row by row as it answers; an engine
restarted from the ledger alone factors the pooled rows at once and answers the same to rounding
(tests/engine/test_restart.py). Restarted from the writer's factorization, it holds the writer's
fronts and products, so its decisions and replies are the writer's bitwise. Rows released after
the factorization are folded in (the writer folded them in its own batches: to rounding); a
factorization that is not of the history given is ignored, never taken.

The demo cube's histories here have a rank in the hundreds: the fronts are forced
(``_FRONTS_RANK`` = 0), as the wide cube's 10,000 answers have them.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest

from proxy.engine import HistoryEntry, PrivacyEngine
from proxy.engine.snapshot import Factorization
from sqlmap.vector import LinearQuery
from tests.engine.recording import Recorder
from tests.engine.test_restart import CUBE, _requests, _statement

WRITTEN, LATER, PROBES = 60, 12, 16


def _engine(
    history: list[HistoryEntry] | None = None, factorization: Factorization | None = None
) -> PrivacyEngine:
    return PrivacyEngine(
        CUBE.qualified_name,
        CUBE.n_coordinates,
        total_budget=Fraction(10**6),
        history=history or (),
        measures=CUBE.measure_reach,
        shape=CUBE.shape,
        factorization=factorization,
    )


@pytest.fixture(autouse=True)
def _fronts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("proxy.engine.estimator._FRONTS_RANK", 0)


def _measure(seed: int) -> Callable[[list[LinearQuery]], list[float]]:
    histogram = np.random.default_rng(seed).integers(0, 40, CUBE.n_coordinates).astype(float)
    return lambda queries: [q.evaluate(histogram) for q in queries]


def _written(seed: int) -> tuple[PrivacyEngine, Recorder, random.Random]:
    """A writer that answered ``WRITTEN`` statements from a history of half as many."""
    rng, measure, kept = random.Random(seed), _measure(seed), Recorder()
    first = _engine()
    for _ in range(WRITTEN // 2):
        kept.answer(first, _requests(_statement(rng)), measure)
    writer = _engine(list(kept.entries))  # a restart's bulk factorization, then appends
    for _ in range(WRITTEN // 2):
        kept.answer(writer, _requests(_statement(rng)), measure)
    return writer, kept, rng


def _answer_both(
    a: PrivacyEngine, b: PrivacyEngine, rng: random.Random, measure: Callable, exact: bool
) -> set[str]:
    """``PROBES`` statements planned by both, measured once: the same decisions and replies."""
    sources = set()
    for _ in range(PROBES):
        requests = _requests(_statement(rng))
        plan_a, plan_b = a.plan(requests), b.plan(requests)
        assert plan_b.measurements == plan_a.measurements
        for x, y in zip(plan_a.decisions, plan_b.decisions, strict=True):
            sources.add(x.source)
            assert (y.source, y.budget, y.step) == (x.source, x.budget, x.step)
            if exact:
                assert (y.half_width, y.confidence) == (x.half_width, x.confidence)
            else:
                assert y.half_width == pytest.approx(x.half_width, rel=1e-9)
        truths = measure(list(plan_a.measurements)) if plan_a.measurements else []
        entries = a.measure(plan_a, truths)
        replies_a, replies_b = a.record(plan_a, entries), b.record(plan_b, entries)
        for x, y in zip(replies_a, replies_b, strict=True):
            if exact:
                assert (y.estimate, y.low, y.high, y.confidence) == (
                    x.estimate,
                    x.low,
                    x.high,
                    x.confidence,
                )
                assert np.array_equal(y.scales, x.scales)
            else:
                assert y.estimate == pytest.approx(x.estimate, rel=1e-9, abs=1e-6)
    return sources


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_restarted_from_the_writers_factorization_it_answers_as_the_writer_bitwise(
    seed: int,
) -> None:
    writer, kept, rng = _written(seed)
    factorization = writer.factorization()
    assert factorization is not None and factorization.rows == len(kept.entries)
    restarted = _engine(list(kept.entries), factorization)
    assert restarted.restart.startswith(f"restored {len(kept.entries)} rows")
    assert restarted.history_shape == writer.history_shape
    assert restarted.budget.per_cell() == writer.budget.per_cell()
    sources = _answer_both(writer, restarted, rng, _measure(seed), exact=True)
    assert sources == {"history", "fresh", "combined"}
    # and from the ledger alone: the same to rounding, as before
    from_ledger = _engine(list(kept.entries))
    assert from_ledger.restart == f"factored {len(kept.entries)} rows"


@pytest.mark.parametrize("seed", [3, 4])
def test_rows_released_after_the_factorization_are_folded_in(seed: int) -> None:
    writer, kept, rng = _written(seed)
    factorization = writer.factorization()
    assert factorization is not None
    measure = _measure(seed)
    for _ in range(LATER):
        kept.answer(writer, _requests(_statement(rng)), measure)
    later = len(kept.entries) - factorization.rows
    assert later > 0
    restarted = _engine(list(kept.entries), factorization)
    assert restarted.restart == (
        f"restored {factorization.rows} rows' factorization, folded {later} after it"
    )
    assert restarted.history_shape == writer.history_shape
    _answer_both(writer, restarted, rng, measure, exact=False)


def _ignored(history: list[HistoryEntry], factorization: Factorization) -> str:
    engine = _engine(history, factorization)
    assert "the factorization given was ignored" in engine.restart
    # ... and the history factored as without it
    assert engine.history_shape == _engine(history).history_shape
    return engine.restart


def test_a_factorization_of_another_history_is_ignored() -> None:
    writer, kept, _ = _written(5)
    factorization = writer.factorization()
    assert factorization is not None
    entries = kept.entries
    # a row removed (another released after it), rows reordered
    assert "not the history's" in _ignored([*entries[1:], entries[1]], factorization)
    assert "not the history's" in _ignored([*entries[1:], entries[0]], factorization)
    altered = replace(entries[3], budget=entries[3].budget * 2)
    assert "not the history's" in _ignored([*entries[:3], altered, *entries[4:]], factorization)
    assert "it covers" in _ignored(entries[:-1], factorization)  # fewer rows than it covers
    meta = {**factorization.meta, "shape": [2, *CUBE.shape[1:]]}
    assert "another cube" in _ignored(entries, Factorization(meta, factorization.arrays))
    meta = {**factorization.meta, "measures": []}
    assert "another cube" in _ignored(entries, Factorization(meta, factorization.arrays))


def test_a_malformed_factorization_is_ignored() -> None:
    writer, kept, _ = _written(6)
    factorization = writer.factorization()
    assert factorization is not None
    entries = kept.entries
    arrays = dict(factorization.arrays)
    del arrays["fronts.factor.data"]
    assert "no fronts.factor.data" in _ignored(entries, Factorization(factorization.meta, arrays))
    arrays = dict(factorization.arrays)
    arrays["fronts.below.data"] = arrays["fronts.below.data"][:-5]  # truncated
    assert "do not fit" in _ignored(entries, Factorization(factorization.meta, arrays))
    arrays = dict(factorization.arrays)
    arrays["vectors.coordinates.data"] = arrays["vectors.coordinates.data"] + 10**9
    assert "outside" in _ignored(entries, Factorization(factorization.meta, arrays))
    meta = dict(factorization.meta)
    del meta["blocks"]
    assert "malformed" in _ignored(entries, Factorization(meta, factorization.arrays))


def test_a_history_the_span_solver_places_exports_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("proxy.engine.estimator._FRONTS_RANK", 10**6)
    writer, _, _ = _written(7)
    assert writer.factorization() is None
