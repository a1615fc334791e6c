"""``record`` takes the index a plan decided on instead of appending the plan's measurements.

An engine that adopts is run beside one that appends (the same plans with the decided-on index
withheld) on random workloads: every plan, reply, ledger and BLUE must agree to rounding, the
two indexes having placed the same vectors in the span, one at a time or in blocks. Plans that
must not be adopted (stale, of another engine, recorded with other entries) are not.
"""

from __future__ import annotations

import dataclasses
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
from proxy.engine.engine import Plan, StalePlanError
from proxy.engine.estimator import Solution
from sqlmap.vector import LinearQuery
from tests.engine.test_equivalence import Cube, _fits, _same_decision, _same_reply

WORKLOADS = 32  # in BLOCKS tests; the default run takes one of them, -m slow the rest
BLOCKS = 4


def _engine(cube: Cube, total: Fraction, seed: int) -> PrivacyEngine:
    return PrivacyEngine(
        "t",
        cube.n_coordinates,
        total_budget=total,
        rng=SeededRandomSource(seed),
        measures=cube.measures,
        shape=cube.shape if cube.factored else None,
    )


def _appending(plan: Plan) -> Plan:
    """The same plan without the index it was decided on: ``record`` appends its entries."""
    return dataclasses.replace(plan, _workspace=None)


def _adopts(plan: Plan) -> bool:
    return plan._workspace is not None and plan._workspace.index is not None


def _same_solution(a: Solution | None, b: Solution | None) -> None:
    assert (a is None) == (b is None)
    if a is not None and b is not None:  # a weight may be 0 in one and rounding in the other
        size = int(max(a.rows.max(initial=-1), b.rows.max(initial=-1))) + 1
        dense_a, dense_b = np.zeros(size), np.zeros(size)
        dense_a[a.rows], dense_b[b.rows] = a.weights, b.weights
        scale = float(np.abs(dense_b).max(initial=1.0))
        np.testing.assert_allclose(dense_a, dense_b, rtol=1e-8, atol=1e-10 * scale)
        assert a.variance == pytest.approx(b.variance, rel=1e-9)


def _batch(cube: Cube, asked: list[LinearQuery], rng: np.random.Generator) -> list[LinearQuery]:
    """A statement; often a GROUP BY with some of its groups asked (and measured) before."""
    batch = cube.batch(asked)
    if len(batch) > 1 and asked and rng.random() < 0.5:
        known = rng.choice(len(asked), size=min(len(asked), int(rng.integers(1, 4))))
        for i in known.tolist():
            batch.insert(int(rng.integers(len(batch) + 1)), asked[i])
    return batch


def _run(seed: int, measured: bool, factored: bool) -> int:
    """A workload on an adopting and an appending engine; how many plans were adopted."""
    rng = np.random.default_rng(seed)
    cube = Cube(rng, measured, factored)
    x = cube.histogram() if measured else rng.integers(0, 40, size=cube.n)
    total = Fraction(int(rng.choice([10, 100, 10000])) * (100 if measured else 1), 10)
    adopting, appending = _engine(cube, total, seed), _engine(cube, total, seed)
    asked: list[LinearQuery] = []
    adopted = 0
    for _ in range(int(rng.integers(8, 20))):
        if asked and rng.random() < 0.08:  # another process measured something
            q = cube.query(np.where(cube.box(cube.dims()), cube.weights(), 0.0))
            entry = HistoryEntry("t", q, Fraction(1, 20), Fraction(1, 64), float(q.evaluate(x)))
            if not _fits(adopting, entry):
                continue
            adopting.absorb([entry])
            appending.absorb([entry])
            continue
        batch = _batch(cube, asked, rng)
        if not batch:
            continue
        eps = float(rng.choice([2.0, 5.0, 10.0, 25.0, 60.0]))
        requests = [QueryRequest(q, AccuracyRequest(eps, 0.95)) for q in batch]
        abandon = rng.random() < 0.15  # planned and dropped (a backend error): nothing changes
        try:
            plan = adopting.plan(requests)
            if abandon:
                plan = adopting.plan(requests)
        except Exception as refused:
            with pytest.raises(type(refused)):
                appending.plan(requests)
            continue
        other = appending.plan(requests)
        for a, b in zip(plan.decisions, other.decisions, strict=True):
            _same_decision(a, b)
            _same_solution(a.history, b.history)
        entries = adopting.measure(plan, [m.evaluate(x) for m in plan.measurements])
        adopted += _adopts(plan)
        replies = adopting.record(plan, entries)
        assert not _adopts(plan)  # taken, or nothing to take
        for a, b in zip(replies, appending.record(_appending(other), entries), strict=True):
            _same_reply(a, b)
        assert adopting.budget.per_cell() == appending.budget.per_cell()
        asked.extend(batch)
        # the histories give the same BLUEs
        probes = [asked[int(i)] for i in rng.choice(len(asked), size=min(len(asked), 8))]
        found = adopting._index.solve_many(probes)
        for a, b in zip(found, appending._index.solve_many(probes), strict=True):
            _same_solution(a, b)
    assert adopting.history_shape == appending.history_shape
    return adopted


@pytest.mark.parametrize(
    "block", [0, *(pytest.param(b, marks=pytest.mark.slow) for b in range(1, BLOCKS))]
)
@pytest.mark.parametrize(("measured", "factored"), [(False, False), (False, True), (True, True)])
def test_an_adopting_engine_agrees_with_one_that_appends(
    block: int, measured: bool, factored: bool
) -> None:
    seeds = range(block, WORKLOADS, BLOCKS)
    adopted = sum(_run(seed, measured, factored) for seed in seeds)
    assert adopted >= len(seeds)  # the workloads do adopt


@pytest.mark.parametrize(
    "block", [0, *(pytest.param(b, marks=pytest.mark.slow) for b in range(1, BLOCKS))]
)
def test_on_the_fronts_an_adopting_engine_agrees_with_one_that_appends(
    block: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Factored histories on the fronts of ANOVA blocks from their first vector."""
    monkeypatch.setattr("proxy.engine.estimator._FRONTS_RANK", 0)
    seeds = range(block, WORKLOADS, BLOCKS)
    adopted = sum(_run(seed, True, True) for seed in seeds)
    assert adopted >= len(seeds)


def _two_groups(n: int = 4) -> list[QueryRequest]:
    """A GROUP BY of two fresh groups: the first is placed in the plan's index."""
    return [
        QueryRequest(LinearQuery.from_dense(dense), AccuracyRequest(10.0, 0.95))
        for dense in (np.eye(n)[0] + np.eye(n)[1], np.eye(n)[2])
    ]


def _fresh_engine() -> PrivacyEngine:
    return PrivacyEngine("t", 4, total_budget=Fraction(100), rng=SeededRandomSource(3))


def test_a_plan_made_before_the_history_moved_is_not_adopted() -> None:
    engine = _fresh_engine()
    stale, current = engine.plan(_two_groups()), engine.plan(_two_groups())
    assert _adopts(stale) and _adopts(current)
    engine.execute(current, [1.0, 2.0])
    assert engine.history_size == 2
    with pytest.raises(StalePlanError):
        engine.record(stale, engine.measure(current, [1.0, 2.0]))
    assert _adopts(stale)  # never taken
    assert engine.history_size == 2


def test_a_plan_of_another_engine_at_the_same_size_is_not_adopted() -> None:
    """The size alone says the plan is current; the index's version says it is not ours."""
    one, other = _fresh_engine(), _fresh_engine()
    plan = one.plan(_two_groups())
    replies = other.execute(plan, [1.0, 2.0])
    assert _adopts(plan)  # other appended its entries
    assert other.history_shape == (2, 2, 2) and one.history_size == 0
    assert [r.source for r in replies] == ["fresh", "fresh"]


def test_entries_other_than_the_planned_ones_are_appended() -> None:
    """Recorded at another budget than the plan's index placed them: appended, not adopted."""
    engine, twin = _fresh_engine(), _fresh_engine()
    plan, twin_plan = engine.plan(_two_groups()), twin.plan(_two_groups())
    entries = [
        dataclasses.replace(e, budget=e.budget * 2) for e in engine.measure(plan, [1.0, 2.0])
    ]
    engine.record(plan, entries)
    assert _adopts(plan)
    twin.record(_appending(twin_plan), entries)
    probe = [QueryRequest(q.query, AccuracyRequest(1e6, 0.5)) for q in _two_groups()]
    for a, b in zip(engine.plan(probe).decisions, twin.plan(probe).decisions, strict=True):
        _same_decision(a, b)
        _same_solution(a.history, b.history)
