"""The spend decision: history for free, otherwise the least budget that meets the request."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from proxy.engine.decision import (
    _Combination,
    _grid_budget,
    _grid_float,
    _grid_index,
    _least_on_grid,
    _quantile_with_nodes,
    decide,
    fresh_budget,
    round_up,
)
from proxy.engine.estimator import HistoryIndex
from proxy.engine.noise import noise_step
from proxy.engine.selection import error_terms, interval, out_of_reach
from proxy.engine.tails import EXACT, discrete_laplace_tail
from proxy.errors import InvalidParameterValue
from sqlmap.accuracy import AccuracyRequest
from sqlmap.vector import LinearQuery
from tests.paper_examples import RUNNING_ALPHA, RUNNING_H


def _fresh_miss(sensitivity: float, step: Fraction, budget: float, eps: float) -> float:
    k = math.floor(Fraction(repr(eps)) / step) + 1
    return discrete_laplace_tail(float(step) * budget / sensitivity, k)


@pytest.mark.parametrize("seed", [0, 1])
def test_round_up_is_the_least_twelve_digit_decimal_at_or_above(seed: int) -> None:
    """Budgets keep 12 significant digits, rounded up: ceil(value / unit) * unit, exactly."""
    rng = np.random.default_rng(seed)
    values = [0.125, 1 / 3, 1.0, 10.0, 1e-12, 1e12, 123456789012.0, 1234567890123.0, 0.1, 5e-324]
    values += (rng.uniform(1, 10, 300) * 10.0 ** rng.integers(-300, 300, 300)).tolist()
    values += [
        float(Fraction(int(n), 10 ** int(e)))
        for n, e in zip(rng.integers(1, 10**12, 300), rng.integers(0, 20, 300))
    ]
    for value in values:
        unit = Fraction(10) ** (math.floor(math.log10(value)) - 11)
        assert round_up(value) == math.ceil(Fraction(value) / unit) * unit


@pytest.mark.parametrize("sensitivity", [1.0, 2.0, 0.5])
@pytest.mark.parametrize("eps", [0.7, 5.0, 13.46933879023199, 1023.99999, 1000.0])
@pytest.mark.parametrize("confidence", [0.5, 0.8, 0.95, 0.999])
def test_fresh_budget_is_minimal_and_below_the_papers(
    sensitivity: float, eps: float, confidence: float
) -> None:
    accuracy = AccuracyRequest(eps, confidence)
    query = LinearQuery.from_dense([sensitivity, sensitivity / 2])
    step = noise_step(query, eps)
    budget = fresh_budget(sensitivity, step, accuracy)
    papers = sensitivity * math.log(1 / accuracy.delta) / eps  # Thm 3.7, continuous Laplace
    assert float(budget) < papers
    assert float(budget) > papers * (1 - 0.001)  # the lattice is fine: almost no saving
    assert _fresh_miss(sensitivity, step, float(budget), eps) <= accuracy.delta
    assert _fresh_miss(sensitivity, step, float(budget) * (1 - 1e-9), eps) > accuracy.delta


def test_a_fresh_decision_reports_its_lattice_interval() -> None:
    query = LinearQuery.from_dense([1.0, 1.0])
    decision = decide(query, AccuracyRequest(10.0, 0.9), None)
    assert decision.source == "fresh" and decision.history is None
    assert 10.0 - float(decision.step) <= decision.half_width <= 10.0
    assert decision.confidence >= 0.9


def _running_index() -> HistoryIndex:
    index = HistoryIndex(9)
    for row, alpha in zip(RUNNING_H, map(float, RUNNING_ALPHA)):
        index.append(LinearQuery.from_dense(row), alpha=alpha, step=0.001)
    return index


def test_running_example_spends_less_than_the_papers_algorithm() -> None:
    # The paper's estimate of x5 + x6 misses (eps=15, delta=0.2) and it pays ln(5)/15 afresh.
    query = LinearQuery.from_dense([0, 0, 0, 0, 1, 1, 0, 0, 0])
    accuracy = AccuracyRequest(15.0, 0.8)
    history = _running_index().solve(query)
    assert history is not None
    assert EXACT.tail(history.scales, 15.0 - history.shift) > 0.2  # history alone falls short
    decision = decide(query, accuracy, history)
    assert decision.source == "combined"
    assert decision.budget < Fraction(math.log(5) / 15) * Fraction(9, 10)
    assert 1 - decision.confidence <= 0.2

    # Independently: the combination at that budget meets the request, a hair less does not.
    def miss(budget: float) -> float:
        fresh = 1.0 / budget
        weight = history.variance / 2 / (history.variance / 2 + fresh**2)
        scales = np.append((1 - weight) * history.scales, weight * fresh)
        shift = (1 - weight) * history.shift + weight * float(decision.step)
        return EXACT.tail(scales, 15.0 - shift)

    assert miss(float(decision.budget)) <= 0.2 < miss(float(decision.budget) * (1 - 1e-6))
    assert decision.fresh_weight == pytest.approx(
        history.variance / (history.variance + 2 / float(decision.budget) ** 2)
    )


def test_history_answers_when_it_suffices_with_its_narrowest_interval() -> None:
    query = LinearQuery.from_dense([0, 0, 0, 0, 1, 1, 0, 0, 0])
    history = _running_index().solve(query)
    assert history is not None
    decision = decide(query, AccuracyRequest(80.0, 0.8), history)
    assert decision.source == "history" and decision.budget == 0 and decision.fresh_weight == 0
    assert decision.half_width < 80.0
    assert EXACT.tail(history.scales, decision.half_width - history.shift) <= 0.2 + 1e-12


def test_the_zero_query_is_exact() -> None:
    query = LinearQuery.from_dense([0.0, 0.0], offset=3.0)
    decision = decide(query, AccuracyRequest(0.001, 0.999), HistoryIndex(2).solve(query))
    assert (decision.source, decision.budget, decision.half_width, decision.confidence) == (
        "history",
        0,
        0.0,
        1.0,
    )


@pytest.mark.parametrize(
    ("eps", "confidence"), [(0.0, 0.9), (-1.0, 0.9), (math.inf, 0.9), (1.0, 1.0), (1.0, 0.0)]
)
def test_bad_accuracy_is_refused(eps: float, confidence: float) -> None:
    with pytest.raises(InvalidParameterValue):
        AccuracyRequest(eps, confidence)


class _ArraysOnly:
    """The exact tail, always handed arrays (the plain path of a combined decision)."""

    def tail(self, scales: np.ndarray, x: float) -> float:
        assert isinstance(scales, np.ndarray)
        return EXACT.tail(scales, x)

    def quantile(self, scales: np.ndarray, delta: float) -> float:
        return EXACT.quantile(np.asarray(scales), delta)


@pytest.mark.parametrize("eps", [10.0, 15.0, 18.0])
def test_a_combined_decision_sorts_the_history_once_and_decides_as_the_arrays_do(
    eps: float,
) -> None:
    query = LinearQuery.from_dense([0, 0, 0, 0, 1, 1, 0, 0, 0])
    history = _running_index().solve(query)
    assert history is not None
    accuracy = AccuracyRequest(eps, 0.8)
    sorted_once = decide(query, accuracy, history)
    arrays = decide(query, accuracy, history, _ArraysOnly())
    assert sorted_once.source == arrays.source == "combined"
    # the sorted terms' tails share one node set over the budgets tried (ExactTail.scaled),
    # the arrays' each their own: bounds a rounding apart, which may cross the target one
    # grid point apart
    assert abs(sorted_once.budget - arrays.budget) <= arrays.budget - _grid_below(arrays.budget)
    assert sorted_once.fresh_weight == pytest.approx(arrays.fresh_weight, rel=1e-10)
    assert sorted_once.confidence == pytest.approx(arrays.confidence, abs=1e-12)
    # and the sorted terms served it: the fresh term is the largest at the budget bought
    weight, fresh = sorted_once.fresh_weight, 1.0 / float(sorted_once.budget)
    assert error_terms(history).joined(1.0 - weight, weight * fresh) is not None


@pytest.mark.parametrize("eps", [10.0, 12.0, 15.0, 18.0])
@pytest.mark.parametrize("confidence", [0.8, 0.95, 0.99])
def test_a_combined_budget_is_the_least_that_meets_the_request(
    eps: float, confidence: float
) -> None:
    query = LinearQuery.from_dense([0, 0, 0, 0, 1, 1, 0, 0, 0])
    history = _running_index().solve(query)
    assert history is not None
    accuracy = AccuracyRequest(eps, confidence)
    decision = decide(query, accuracy, history, _ArraysOnly())  # each budget's tail as below
    assert decision.source == "combined"
    history_var = float(np.square(history.scales).sum())

    def miss(budget: float) -> float:  # the bound the decision is bought against, as it is
        fresh = query.sensitivity / budget
        weight = history_var / (history_var + fresh**2)
        scales = np.append((1.0 - weight) * history.scales, weight * fresh)
        shift = (1.0 - weight) * history.shift + weight * float(decision.step)
        return EXACT.tail(scales, eps - shift) + 1e-12

    target = accuracy.delta * (1 - 1e-9)
    assert miss(float(decision.budget)) <= target
    assert miss(float(_grid_below(decision.budget))) > target  # the next 12-digit budget down
    # on one node set for the budgets tried: the bound a rounding apart, the budget a step
    shared = decide(query, accuracy, history)
    assert abs(shared.budget - decision.budget) <= decision.budget - _grid_below(decision.budget)


@pytest.mark.parametrize("eps", [8.0, 10.0, 15.0])
@pytest.mark.parametrize("confidence", [0.8, 0.95])
def test_a_blue_out_of_reach_has_its_interval_on_the_nodes_its_combination_uses(
    eps: float, confidence: float
) -> None:
    """Where the BLUE's variance puts the request out of reach, history will be combined: the
    BLUE's quantile is found on a node set placed for the combination's first budgets too
    (one evaluation of ``log phi``). Another valid node set: the interval is the BLUE's own
    to rounding, the decision the one made on separate node sets, a grid step at most."""
    query = LinearQuery.from_dense([0, 0, 0, 0, 1, 1, 0, 0, 0])
    accuracy = AccuracyRequest(eps, confidence)
    history = _running_index().solve(query)
    assert history is not None and out_of_reach(history.variance, accuracy)
    step = noise_step(query, eps)
    ceiling = fresh_budget(query.sensitivity, step, accuracy)
    history_var = history.variance / 2
    placed = _quantile_with_nodes(
        history, error_terms(history), history_var, 1.0, (step, ceiling), accuracy, EXACT
    )
    assert placed is not None and placed.r_range[0] == 0.0
    combination = _Combination(history_var, history.shift, 1.0, float(step), eps)
    for budget in (float(ceiling), float(ceiling) / 2):  # the first budgets _combined tries
        _, _, r, y = combination.at(budget)
        assert placed.serves(r, y)
    own = _running_index().solve(query)
    assert own is not None and own.widths == {}
    width = interval(own, accuracy.delta).half_width  # on the quantile's own nodes
    assert history.widths[(EXACT, accuracy.delta)] == pytest.approx(width, rel=1e-11)

    joint = decide(query, accuracy, _running_index().solve(query))
    separate = decide(query, accuracy, own)  # its interval known: nodes placed apart
    assert joint.source == separate.source == "combined"
    assert abs(joint.budget - separate.budget) <= separate.budget - _grid_below(separate.budget)
    assert joint.fresh_weight == pytest.approx(separate.fresh_weight, rel=1e-10)
    assert joint.confidence == pytest.approx(separate.confidence, abs=1e-12)


def _grid_below(budget: Fraction) -> Fraction:
    """The 12-significant-digit decimal just below ``budget`` (one itself)."""
    unit = Fraction(10) ** (math.floor(math.log10(budget * (1 - Fraction(1, 10**13)))) - 11)
    return budget - unit


@pytest.mark.parametrize(
    "crossing",
    [Fraction(1), Fraction(10**11 + 1, 10**14), Fraction(999999999999, 10**12), Fraction(1, 8)],
)
def test_a_combined_budget_is_where_the_bound_crosses_on_the_grid_from_any_start(
    crossing: Fraction,
) -> None:
    """The search ends at the grid point that meets above one that misses, wherever it began.

    A secant root a rounding step either side of the crossing (a tail evaluated another way)
    starts it one grid point off: the budget must not follow (rounding up the start and then
    stepping up by 1e-9 did, by one step or a thousand).
    """
    ceiling = round_up(float(crossing) * 3.0)
    tried: list[float] = []

    def meets(budget: float) -> bool:  # (asked at a grid budget's float)
        tried.append(budget)
        return budget >= float(crossing)

    starts = [crossing, round_up(float(crossing) / 2), ceiling]
    for steps in (1, 2, 5, 1000, 10**6):
        starts += [_grid_above(crossing, steps), _grid_below_by(crossing, steps)]
    for start in starts:
        tried.clear()
        assert _least_on_grid(meets, start, ceiling) == crossing
        assert float(_grid_below(crossing)) in tried and float(crossing) in tried
    tried.clear()
    assert _least_on_grid(meets, crossing, ceiling) == crossing
    assert tried == [
        float(crossing),
        float(_grid_below(crossing)),
    ]  # from the rounded root: two tails


def test_the_grid_is_walked_in_integers_to_the_bit() -> None:
    """A grid budget's place, its neighbours and its float, without ``Fraction`` arithmetic:
    the float a search step asks at is the budget's own (a quotient of integers rounds
    correctly), and neighbouring places are neighbouring 12-digit budgets, across decades."""
    rng = np.random.default_rng(3)
    values = (rng.uniform(1, 10, 400) * 10.0 ** rng.integers(-40, 40, 400)).tolist()
    budgets = [round_up(v) for v in values] + [Fraction(1), Fraction(1, 10), Fraction(10**15)]
    budgets += [Fraction(999999999999, 10**12), Fraction(10**11 + 1, 10**14)]
    for budget in budgets:
        index = _grid_index(budget)
        assert _grid_budget(index) == budget and _grid_float(index) == float(budget)
        above, below = _grid_budget(index + 1), _grid_budget(index - 1)
        assert round_up(float(budget) * (1 + 1e-12)) == above and _grid_index(above) == index + 1
        assert below < budget and round_up(float(below) * (1 + 1e-13)) in (below, budget)
    with pytest.raises(ValueError, match="significant digits"):
        _grid_index(Fraction(1234567890123, 10**12))


def _grid_above(budget: Fraction, steps: int) -> Fraction:
    for _ in range(min(steps, 8)):
        budget = round_up(float(budget) * (1 + 1e-12))  # one step each
    if steps > 8:
        budget = round_up(float(budget) * (1 + 1e-12 * steps))
    return budget


def _grid_below_by(budget: Fraction, steps: int) -> Fraction:
    for _ in range(min(steps, 8)):
        budget = _grid_below(budget)
    if steps > 8:
        budget = round_up(float(budget) * (1 - 1e-12 * steps))
    return budget
