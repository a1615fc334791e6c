"""Choosing the history estimate by its exact interval, on the BLUE-to-repeat segment."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from proxy.engine.estimator import HistoryIndex, Solution, combine
from proxy.engine.selection import (
    TAIL_SLACK,
    Candidate,
    _mixture_terms,
    _wider,
    choose,
    interval,
    meets,
)
from proxy.engine.tails import EXACT, ExactTail, Runs, discrete_laplace_tail
from sqlmap.accuracy import AccuracyRequest
from sqlmap.vector import LinearQuery


def _index(rows: list[list[float]], alphas: list[float], step: float = 1 / 1024) -> HistoryIndex:
    index = HistoryIndex(len(rows[0]))
    for row, alpha in zip(rows, alphas):
        index.append(LinearQuery.from_dense(row), alpha=alpha, step=step)
    return index


def _unbiased_for(estimator: Solution, rows: list[list[float]], query: list[float]) -> bool:
    weights = np.zeros(len(rows))
    weights[estimator.rows] = estimator.weights
    return bool(np.allclose(weights @ np.array(rows), query, atol=1e-9))


def _recomputed_width(estimator: Solution, delta: float) -> float:
    """The half-width by the definitions, independently of ``interval``."""
    if estimator.rows.size == 1:
        rho = float(estimator.steps[0] * estimator.precisions[0])
        k = 1
        while discrete_laplace_tail(rho, k) > delta:
            k += 1
        return (k - 1) * estimator.shift
    return estimator.shift + EXACT.quantile(estimator.scales, delta - TAIL_SLACK)


# The defect's history: q = x0 + x1 measured, then x0 and x1 alone, each as noisy as q.
ROWS = [[1.0, 1.0], [1.0, 0.0], [0.0, 1.0]]
ALPHAS = [0.07, 0.05, 0.05]


def _ends() -> tuple[Solution, Solution]:
    index = _index(ROWS, ALPHAS)
    query = LinearQuery.from_dense([1.0, 1.0])
    blue = index.solve(query)
    (repeat,) = index.repeats(query)
    assert blue is not None
    return blue, repeat


def test_the_blue_can_be_wider_than_the_query_measured_alone() -> None:
    blue, repeat = _ends()
    assert blue.variance < repeat.variance
    eps = interval(repeat, 0.5).half_width
    assert interval(blue, 0.5).half_width > eps  # the BLUE alone would charge the repeat
    best = choose(blue, [repeat], AccuracyRequest(eps, 0.5))
    assert best.basis == "repeat" and best.estimator is repeat and best.half_width == eps


@pytest.mark.parametrize("confidence", [0.5, 0.8])
def test_a_mixture_meets_what_neither_end_does(confidence: float) -> None:
    delta = AccuracyRequest(1.0, confidence).delta
    blue, repeat = _ends()
    ends = min(interval(blue, delta).half_width, interval(repeat, delta).half_width)
    grid = [combine([(1 - lam, repeat), (lam, blue)]) for lam in np.linspace(0.01, 0.99, 99)]
    least = min(interval(m, delta).half_width for m in grid)
    assert least < ends
    eps = (least + ends) / 2
    best = choose(blue, [repeat], AccuracyRequest(eps, confidence))
    assert best.basis == "mixture" and best.half_width <= eps
    assert _unbiased_for(best.estimator, ROWS, [1.0, 1.0])
    assert best.half_width == pytest.approx(_recomputed_width(best.estimator, delta), rel=1e-12)
    # on the segment: (1 - lam) repeat + lam BLUE for the lam its weight on row 0 gives
    lam = (1 - float(best.estimator.weights[0])) / (1 - float(blue.weights[0]))
    assert 0 < lam < 1
    assert best.estimator.same_as(combine([(1 - lam, repeat), (lam, blue)]))
    # asked for less than any point of the segment gives, the narrower end comes back
    short = choose(blue, [repeat], AccuracyRequest(0.99 * least, confidence))
    assert short.basis != "mixture" and short.half_width == pytest.approx(ends)


def test_at_high_confidence_the_repeat_itself_is_kept() -> None:
    # The exact lattice width of one measurement, against a sum's coupling bound: the repeat
    # wins when the other rows add little, and then its reply is the earlier answer itself.
    index = _index(ROWS, [0.3, 0.0005, 0.0005])
    query = LinearQuery.from_dense([1.0, 1.0])
    blue = index.solve(query)
    assert blue is not None
    (repeat,) = index.repeats(query)
    eps = interval(repeat, 0.05).half_width
    best = choose(blue, [repeat], AccuracyRequest(eps, 0.95))
    assert best.basis == "repeat" and best.estimator.rows.tolist() == [0]
    assert best.estimator.weights.tolist() == [1.0]


def test_pooled_repeats_and_no_repeats() -> None:
    index = _index([[1.0, 1.0], [2.0, 2.0]], [0.1, 0.1])
    query = LinearQuery.from_dense([1.0, 1.0])
    blue = index.solve(query)
    assert blue is not None
    # the BLUE here is the pooled repeat: one of the two is kept, and nothing is searched
    accuracy = AccuracyRequest(1.0, 0.95)
    best = choose(blue, index.repeats(query), accuracy)
    assert best.basis != "mixture" and best.estimator.same_as(blue)
    assert choose(blue, (), accuracy) == interval(blue, accuracy.delta)


@st.composite
def _histories(draw: st.DrawFn) -> tuple[list[list[float]], list[float], list[float], float]:
    n = draw(st.integers(2, 4))
    query = [draw(st.sampled_from([0.0, 1.0, 1.0, 2.0, -1.0])) for _ in range(n)]
    if not any(query):
        query[0] = 1.0
    rows = []
    for _ in range(draw(st.integers(1, 6))):
        if draw(st.booleans()):
            factor = draw(st.sampled_from([1.0, 1.0, 2.0, -0.5]))
            rows.append([factor * w for w in query])
        else:
            cells = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True))
            row = [0.0] * n
            for c in cells:
                row[c] = draw(st.sampled_from([1.0, 2.0, -1.0]))
            rows.append(row)
    rows.append(query)  # the query was measured at least once
    alphas = [draw(st.sampled_from([0.01, 0.05, 0.2, 1.0])) for _ in rows]
    delta = draw(st.sampled_from([0.5, 0.2, 0.05, 1e-3]))
    return rows, alphas, query, delta


@settings(max_examples=60, deadline=None)
@given(history=_histories(), eps_factor=st.sampled_from([0.5, 0.9, 0.97, 1.0, 1.5]))
@example(  # three identical rows: the pooled repeat is the BLUE, by two quantile searches
    history=([[1.0] * 3] * 3, [0.2, 0.01, 0.2], [1.0] * 3, 0.5), eps_factor=0.5
)
def test_never_wider_than_the_blue_or_any_repeat(
    history: tuple[list[list[float]], list[float], list[float], float], eps_factor: float
) -> None:
    rows, alphas, dense, delta = history
    delta = AccuracyRequest(1.0, 1 - delta).delta  # as the request will hold it
    index = _index(rows, alphas)
    query = LinearQuery.from_dense(dense)
    blue = index.solve(query)
    repeats = index.repeats(query)
    assert blue is not None and repeats
    ends = [interval(blue, delta).half_width] + [interval(r, delta).half_width for r in repeats]
    eps = eps_factor * min(ends)
    best = choose(blue, repeats, AccuracyRequest(eps, 1 - delta))
    # a pooled repeat may be the BLUE itself: two quantile searches (each ~1e-12 relative) on
    # one law may differ in the last digits, so either may be picked
    assert best.half_width <= min(ends) * (1 + 1e-9)
    if eps_factor >= 1.0:  # eps is one end, found by one of those searches (seen: 1.006e-12 over)
        assert best.half_width <= eps * (1 + 1e-9)
    assert _unbiased_for(best.estimator, rows, dense)
    width = _recomputed_width(best.estimator, delta)
    assert best.half_width == pytest.approx(width, rel=1e-12) or best.half_width == eps


def test_meets_settles_a_hair_over_by_the_tail_at_eps() -> None:
    index = _index([[1.0, 0.0], [0.0, 1.0]], [0.1, 0.2])
    blue = index.solve(LinearQuery.from_dense([1.0, 1.0]))
    assert blue is not None
    exact = interval(blue, 0.1)
    assert meets(exact, exact.half_width, 0.1) == exact
    # a quantile rounded a hair above eps: the tail at eps decides, and the width is eps
    near = Candidate(blue, exact.half_width * (1 + 1e-10), 0.9)
    clipped = meets(near, exact.half_width, 0.1)
    assert clipped is not None and clipped.half_width == exact.half_width
    assert clipped.confidence >= 0.9
    assert meets(near, exact.half_width * (1 - 1e-6), 0.1) is None
    assert meets(exact, exact.half_width * 0.5, 0.1) is None
    assert math.isclose(
        EXACT.tail(blue.scales, exact.half_width - blue.shift), 0.1 - TAIL_SLACK, rel_tol=1e-9
    )


@pytest.mark.parametrize("eps", [3.0, 7.0, 20.0])
def test_a_pooled_repeat_settled_wider_by_one_tail_is_not_inverted(eps: float) -> None:
    # x0 + x1 twice at a low budget, x0 and x1 alone at a high one: the BLUE (8.0 at 95%) is
    # far narrower than the pooled repeat (41.1), itself narrower than each single one (59.9)
    def ends() -> tuple[Solution, list[Solution]]:
        rows = [[1.0, 1.0], [1.0, 1.0], [1.0, 0.0], [0.0, 1.0]]
        index = _index(rows, [0.05, 0.05, 0.5, 0.5])
        query = LinearQuery.from_dense([1.0, 1.0])
        blue = index.solve(query)
        assert blue is not None
        return blue, list(index.repeats(query))

    accuracy = AccuracyRequest(eps, 0.95)
    blue, repeats = ends()
    (pooled,) = [r for r in repeats if r.terms > 1]
    best = choose(blue, repeats, accuracy)
    # with every width known beforehand, the same choice
    known_blue, known_repeats = ends()
    for estimator in (known_blue, *known_repeats):
        interval(estimator, accuracy.delta)
    known = choose(known_blue, known_repeats, accuracy)
    assert (best.half_width, best.confidence, best.basis) == (
        known.half_width,
        known.confidence,
        known.basis,
    )
    assert best.estimator.same_as(known.estimator) and best.basis == "blue"
    # out of reach (3) or met by the BLUE (20): the pooled repeat, wider than the BLUE, cannot
    # change the answer, and one tail settles that; at 7 a segment search may start from it,
    # and it is narrower than the single repeats: its quantile is found
    assert ((EXACT, accuracy.delta) in pooled.widths) == (eps == 7.0)
    # the width it was settled wider than is kept: asked again, no tail is needed
    settled = pooled.widths.get((("exceeds", EXACT), accuracy.delta))
    assert settled == (None if eps == 7.0 else interval(blue, accuracy.delta).half_width)


def test_wider_settles_only_what_the_quantile_confirms() -> None:
    index = _index([[1.0, 1.0], [1.0, 1.0], [2.0, 2.0]], [0.05, 0.2, 0.1])
    (pooled,) = [r for r in index.repeats(LinearQuery.from_dense([1.0, 1.0])) if r.terms > 1]
    for delta in (0.5, 0.05, 1e-3):
        width = interval(pooled, delta).half_width
        assert _wider(pooled, width * (1 - 1e-3), delta, EXACT)
        assert _wider(pooled, pooled.shift * 0.5, delta, EXACT)  # below the shift
        assert not _wider(pooled, width * (1 - 1e-13), delta, EXACT)  # within the slack
        assert not _wider(pooled, width, delta, EXACT)
        # a bound kept from before is read first (one planted above the width shows it)
        pooled.widths[(("exceeds", EXACT), delta)] = width * 2.0
        assert _wider(pooled, width * 1.5, delta, EXACT)
        del pooled.widths[(("exceeds", EXACT), delta)]


def test_wider_settles_a_few_terms_without_inverting_phi(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # pooled repeats of three budgets, distinct or two alike: their tails bounded in closed
    # form, no node set placed
    placed: list[float] = []
    spacing = ExactTail._spacing
    monkeypatch.setattr(
        ExactTail, "_spacing", lambda self, *a: placed.append(a[2]) or spacing(self, *a)
    )
    # the second: two scales alike, shrunk 1% apart (a bound a few tenths of a per cent lower)
    for alphas, below in (([0.05, 0.2, 0.1], 1e-3), ([0.05, 0.1, 0.1], 1e-2)):
        index = _index([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0]], alphas)
        query = LinearQuery.from_dense([1.0, 1.0])
        (pooled,) = [r for r in index.repeats(query) if r.terms > 1]
        with monkeypatch.context() as unpatched:
            unpatched.setattr(ExactTail, "_spacing", spacing)
            width = interval(pooled, 0.05).half_width
        assert _wider(pooled, width * (1 - below), 0.05, EXACT)
        assert not _wider(pooled, width, 0.05, EXACT)
    assert placed == []


@pytest.mark.parametrize("eps", [1e15, 1e30, 1e300])
def test_a_huge_half_width_is_decided_in_a_few_steps(eps: float) -> None:
    # the least k of the lattice interval is near eps / step: far past where k + 1 == k in floats
    from proxy.engine.decision import decide
    from sqlmap.vector import LinearQuery

    decision = decide(LinearQuery.from_dense([1.0, 1.0]), AccuracyRequest(eps, 0.95), None)
    assert decision.source == "fresh" and 0 < decision.half_width <= eps
    assert decision.half_width == pytest.approx(eps, rel=1e-3)


def _classes_and_repeats() -> tuple[HistoryIndex, LinearQuery, Solution]:
    """40 rows in 10 classes (5 vectors at 2 budgets), a query measured 8 times, its BLUE."""
    index = HistoryIndex(3)
    vectors = ([1, 1, 0], [1, 0, 0], [0, 1, 1], [1, 1, 1], [0, 0, 1])
    for k in range(40):
        index.append(LinearQuery.from_dense(vectors[k % 5]), alpha=(0.05, 0.1)[k % 2], step=0.01)
    query = LinearQuery.from_dense([1, 1, 0])
    blue = index.solve(query)
    assert blue is not None and blue.columns is not None
    return index, query, blue.with_weights()


def test_a_mixtures_terms_by_class_are_its_rows_terms_to_the_bit() -> None:
    # the query's own rows leave their classes
    index, query, held = _classes_and_repeats()
    for anchor in index.repeats(query):
        order = None  # each lam sorted from the last one's order, as the search does
        for lam in (0.0, 0.25, 0.618, 1.0, 0.3):
            mixture = combine([(1.0 - lam, anchor), (lam, held)])
            expected = Runs.of(mixture.scales)
            for hint in (None, order):
                found = _mixture_terms(anchor, held, lam, hint)
                assert found is not None
                runs, shift, order = found
                assert np.array_equal(runs.values, expected.values)
                assert np.array_equal(runs.counts, expected.counts)
                assert shift == mixture.shift


def test_a_mixtures_tail_from_the_blues_terms_amended_is_its_rows_tail() -> None:
    # the search's miss at each lam without sorting the mixture: the BLUE's terms times lam,
    # the anchor's rows out of their classes and back with the mixture's scales
    from proxy.engine.selection import _mixture_parts, error_terms
    from proxy.engine.tails import _may_dominate

    index, query, held = _classes_and_repeats()
    terms = error_terms(held)
    bound = 2 * (EXACT.alias_tol + EXACT.trunc_tol) + 1e-14
    amended = 0
    for anchor in index.repeats(query):
        for lam in (0.25, 0.618, 0.9):
            mixture = combine([(1.0 - lam, anchor), (lam, held)])
            parts = _mixture_parts(anchor, held, lam)
            assert parts is not None
            own, shift = parts
            assert shift == mixture.shift
            for x in (5.0, 10.0, 20.0):
                found = EXACT.amended_tail(
                    terms, lam, held.scales[anchor.rows], np.abs(own) / anchor.precisions, x - shift
                )
                if found is None:  # left to the sorted terms only where one may dominate
                    assert _may_dominate(Runs.of(mixture.scales), x - shift, EXACT.trunc_tol)
                    continue
                amended += 1
                assert abs(found - EXACT.tail(mixture.scales, x - shift)) <= bound, (lam, x)
    assert amended >= 20
