"""The spend decision: answer from history for free, or buy the least fresh budget that suffices.

This is the papers' Algorithm 1 with three improvements: the history estimate's error is judged
by its exact distribution rather than a simulation; the history estimate need not be the BLUE:
the query's own earlier measurements, or a mixture of them with the BLUE, count too when their
exact interval is narrower (:mod:`proxy.engine.selection`), so a query once measured is free
again at the same accuracy however the history grows; and when history falls short, the fresh
measurement is combined with a history estimate (inverse-variance weights; the BLUE or the
narrower other end, whichever needs less), so the budget bought is the least that makes the
*combination* meet the requirement, never more than answering from scratch. Inputs are public
only: the query vector, the history's estimates (weights and scales, from ``H`` and the
budgets) and the accuracy asked for. True answers never reach this module.

Every bound accounts for the noise actually added. A single lattice noise (a fresh answer, or a
history estimate resting on one earlier measurement) has an exactly computed discrete tail; a
sum of them uses the coupling ``P(|sum t_k Z_k| > x) <= P(|sum t_k L_k| > x - sum |t_k| g_k)``
with continuous ``L_k`` (each lattice Laplace is within one step ``g_k`` of its continuous twin).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

import numpy as np
from scipy import optimize

from proxy.engine.estimator import Solution
from proxy.engine.noise import noise_step, public_fraction
from proxy.engine.selection import (
    TAIL_SLACK,
    Basis,
    choose,
    error_terms,
    interval,
    lattice_interval,
    meets,
    out_of_reach,
)
from proxy.engine.tails import (
    EXACT,
    ExactTail,
    Runs,
    ScaledTails,
    Scales,
    TailMethod,
    discrete_laplace_tail,
)
from sqlmap.accuracy import AccuracyRequest
from sqlmap.vector import LinearQuery

__all__ = [
    "Source",
    "Decision",
    "fresh_budget",
    "round_up",
    "decide",
]

Source = Literal["history", "fresh", "combined"]

# Budgets are rounded up to this many significant digits: readable, and never below the need.
_BUDGET_DIGITS = 12
# A combination is bought to miss with probability at most delta (1 - 1e-9): asked again, its
# estimate is recomputed from the rows to ~1e-15, and that must still pass the same test.
_COMBINED_MARGIN = 1e-9
# The root search for a combined budget: steps at most, and the relative step that settles it.
_ROOT_STEPS = 200
_ROOT_RTOL = 1e-9
# Grid points per power of ten: mantissas 10^11 .. 10^12 - 1.
_DECADE: int = 9 * 10 ** (_BUDGET_DIGITS - 1)


@dataclass(frozen=True, slots=True)
class Decision:
    """How one query will be answered; everything here is public.

    The reply will be ``(1 - fresh_weight) * history.estimate(y) + fresh_weight * y_new`` plus
    the query's constant, with interval ``+- half_width`` at ``confidence``.

    Attributes:
        source: ``history`` (no budget), ``fresh`` (new measurement only) or ``combined``.
        budget: ``alpha`` of the new measurement (0 if none).
        step: lattice step of the new measurement's noise (0 if none).
        history: the history estimate used (``None`` when the answer is fresh only): the BLUE,
            or one with a narrower interval (:func:`~proxy.engine.selection.choose`).
        fresh_weight: weight of the new measurement in the reply.
        half_width: half-width of the interval the reply will carry.
        confidence: a lower bound on the probability that the interval holds the true answer.
        basis: what ``history`` is (:class:`~proxy.engine.selection.Candidate`); ``None`` iff
            the answer is fresh only.
    """

    source: Source
    budget: Fraction
    step: Fraction
    history: Solution | None
    fresh_weight: float
    half_width: float
    confidence: float
    basis: Basis | None = None

    def __post_init__(self) -> None:
        measures = self.source != "history"
        if measures != (self.budget > 0) or measures != (self.step > 0):
            raise ValueError("a fresh or combined answer has a budget and step; history has none")
        if (self.history is None) != (self.source == "fresh") or (self.history is None) != (
            self.basis is None
        ):
            raise ValueError("only a fresh answer lacks a history estimate and its basis")
        if not 0 <= self.fresh_weight <= 1 or (self.source == "history") != (
            self.fresh_weight == 0
        ):
            raise ValueError("fresh_weight must be in [0, 1] and zero exactly for history")
        if not (self.half_width >= 0 and 0 < self.confidence <= 1):
            raise ValueError("half_width must be >= 0 and confidence in (0, 1]")


def round_up(value: float) -> Fraction:
    """``value`` rounded up to 12 significant decimal digits, as a ``Fraction``.

    >>> round_up(0.125)
    Fraction(1, 8)
    >>> round_up(1 / 3)
    Fraction(166666666667, 500000000000)
    """
    exponent = math.floor(math.log10(value)) - _BUDGET_DIGITS + 1
    numerator, denominator = value.as_integer_ratio()  # exact; integers, not Fraction's steps
    if exponent >= 0:
        unit = 10**exponent
        return Fraction(-(-numerator // (denominator * unit)) * unit)
    units = 10**-exponent  # per 1
    return Fraction(-(-numerator * units // denominator), units)


def _discrete_k(accuracy: AccuracyRequest, step: Fraction) -> int:
    """Lattice noise misses ``+-eps`` iff it is at least ``k`` steps: ``k = floor(eps/g) + 1``."""
    return math.floor(public_fraction(accuracy.eps) / step) + 1


def fresh_budget(sensitivity: float, step: Fraction, accuracy: AccuracyRequest) -> Fraction:
    """The least budget for which lattice Laplace noise alone meets ``accuracy``.

    With ``rho = g alpha / S`` the noise misses with probability
    ``2 e^{-k rho} / (1 + e^{-rho})``; solve for ``alpha`` and round up. By the choice of ``g``
    (:func:`~proxy.engine.noise.noise_step`) this never exceeds the continuous
    ``S ln(1/delta) / eps`` (the papers' Thm 3.7).

    >>> accuracy = AccuracyRequest(15.0, 0.8)
    >>> alpha = fresh_budget(1.0, Fraction(15, 1024), accuracy)
    >>> 0.99 * math.log(5) / 15 < alpha < math.log(5) / 15
    True
    """
    k = _discrete_k(accuracy, step)
    log_delta = math.log(accuracy.delta)

    def excess(rho: float) -> float:  # log P(miss) - log delta, decreasing in rho
        return math.log(2.0) - k * rho - math.log1p(math.exp(-rho)) - log_delta

    high = (math.log(2.0) - log_delta) / k
    # xtol relative to the bracket: rho is tiny when eps spans many lattice steps
    rho = float(optimize.brentq(excess, 0.0, high, xtol=high * 1e-14, rtol=1e-14))
    budget = round_up(rho * sensitivity / float(step))
    while _fresh_miss(sensitivity, step, budget, k) > accuracy.delta:
        # at least one unit of the last digit: the float product can round back to ``budget``
        unit = Fraction(10) ** (math.floor(math.log10(budget)) - _BUDGET_DIGITS + 1)
        budget = max(round_up(float(budget) * (1 + 1e-11)), budget + unit)
    return budget


def _fresh_miss(sensitivity: float, step: Fraction, budget: Fraction, k: int) -> float:
    return discrete_laplace_tail(float(step) * (float(budget) / sensitivity), k)


def decide(
    query: LinearQuery,
    accuracy: AccuracyRequest,
    history: Solution | None,
    tail: TailMethod = EXACT,
    repeats: Sequence[Solution] = (),
) -> Decision:
    """Decide how to answer ``query`` to ``accuracy`` from its history estimates.

    Args:
        query: the offset-free query vector.
        accuracy: the half-width and confidence asked for.
        history: the query's BLUE over the history (``None``: not estimable).
        tail: how error tails are computed.
        repeats: estimates from the rows that measured ``query`` itself, one by one or pooled
            (:meth:`~proxy.engine.estimator.HistoryIndex.repeats`).

    >>> q = LinearQuery.from_dense([1.0, 1.0])
    >>> d = decide(q, AccuracyRequest(10.0, 0.95), None)
    >>> d.source, float(d.budget) < math.log(20) / 10
    ('fresh', True)
    """
    history_terms: Runs | None = None
    history_var: float | None = None  # its scales' sum of squares, once derived
    # the fresh measurement's step and budget alone, found early where history surely misses
    fresh: tuple[Fraction, Fraction] | None = None
    placed: ScaledTails | None = None  # nodes placed with the BLUE's quantile for its combination
    if history is not None:
        if (
            isinstance(tail, ExactTail)
            and history.terms > 1
            and (tail, accuracy.delta) not in history.widths
        ):
            # sorted once (10,000 rows on the wide cube): for its interval, found here where
            # choose() then finds it, and for the combination's tails if history falls short
            history_terms = error_terms(history)
            # sum_k b_k^2, to the bit (derived once: for choose and _combined)
            history_var = history.variance / 2.0
            if out_of_reach(2.0 * history_var, accuracy):
                # choose's own test that no estimate from history can meet (public inputs;
                # every value it held for on the wide cube missed, and a wrong call only costs
                # time): the BLUE will be combined, and its quantile's nodes serve that too
                fresh = _fresh(query, accuracy)
                placed = _quantile_with_nodes(
                    history, history_terms, history_var, query.sensitivity, fresh, accuracy, tail
                )
            else:
                interval(history, accuracy.delta, tail, terms=history_terms)
        best = choose(
            history,
            repeats,
            accuracy,
            tail,
            None if history_var is None else 2.0 * history_var,
            history_terms,
        )
        if meets(best, accuracy.eps, accuracy.delta, tail) is not None:
            return Decision(
                "history",
                Fraction(0),
                Fraction(0),
                best.estimator,
                0.0,
                best.half_width,
                best.confidence,
                best.basis,
            )
    step, alone = _fresh(query, accuracy) if fresh is None else fresh
    sensitivity = query.sensitivity
    if history is not None:
        # Combine with the BLUE and, if narrower, with the other end: whichever needs less.
        bases: list[tuple[Solution, Basis, Runs | None, float | None, ScaledTails | None]] = [
            (history, "blue", history_terms, history_var, placed)
        ]
        if not best.estimator.same_as(history):
            bases.insert(0, (best.estimator, best.basis, None, None, None))
        options = [_combined(*b, sensitivity, step, accuracy, alone, tail) for b in bases]
        combined = [d for d in options if d is not None]
        if combined:
            return min(combined, key=lambda d: d.budget)  # the first of equals
    rho = float(step) * (float(alone) / sensitivity)
    width, miss = lattice_interval(rho, float(step), accuracy.delta)
    return Decision("fresh", alone, step, None, 1.0, width, 1.0 - miss)


def _fresh(query: LinearQuery, accuracy: AccuracyRequest) -> tuple[Fraction, Fraction]:
    """The step of a fresh measurement of ``query`` and the least budget that meets alone."""
    step = noise_step(query, accuracy.eps)
    return step, fresh_budget(query.sensitivity, step, accuracy)


def _quantile_with_nodes(
    history: Solution,
    terms: Runs,
    history_var: float,
    sensitivity: float,
    fresh: tuple[Fraction, Fraction],
    accuracy: AccuracyRequest,
    tail: ExactTail,
) -> ScaledTails | None:
    """The BLUE's interval, kept where :func:`interval` finds it, on nodes its combination uses.

    The nodes serve the BLUE's quantile and the combination's tails at budgets from half the
    fresh-only budget to it (what :func:`_combined` places first), ``r`` from 0: one
    evaluation of ``log phi`` and one placement instead of two (the finer step of the two and
    the later stop). None where they are the quantile's alone (see
    :meth:`~proxy.engine.tails.ExactTail.quantile_and_scaled`) or no combination is placed.
    """
    step, ceiling = fresh
    combination = _Combination(history_var, history.shift, sensitivity, float(step), accuracy.eps)
    ranges = combination.ranges(float(ceiling), float(ceiling))
    delta = accuracy.delta - TAIL_SLACK
    if ranges is None:
        width, placed = tail.quantile(terms, delta), None
    else:
        width, placed = tail.quantile_and_scaled(terms, delta, ranges[0][1], ranges[1])
    history.widths[(tail, accuracy.delta)] = history.shift + width  # as interval() keeps it
    return placed


@dataclass(frozen=True, slots=True)
class _Combination:
    """A history estimate weighed against a fresh measurement by inverse variance.

    Divided by ``1 - w``, the combination's error is ``E + r L``: the history's error and the
    fresh noise at ``r = V b / S``, and its threshold grows with ``b`` too (while eps exceeds
    the step), so one node set, ``log phi_E`` on it computed once, serves the budgets of a
    range.
    """

    history_var: float
    shift: float
    sensitivity: float
    step: float
    eps: float

    def at(self, budget: float) -> tuple[float, float, float, float]:
        """The weight, the error's threshold, and ``r`` and the threshold on ``E + r L``.

        At ``budget``; the threshold is eps less the lattice shift.
        """
        fresh_scale = self.sensitivity / budget
        weight = self.history_var / (self.history_var + fresh_scale**2)
        x = self.eps - ((1.0 - weight) * self.shift + weight * self.step)
        if weight == 1.0:  # the history's share rounds away: no node set serves
            return weight, x, math.inf, math.inf
        return weight, x, weight * fresh_scale / (1.0 - weight), x / (1.0 - weight)

    def ranges(
        self, budget: float, ceiling: float
    ) -> tuple[tuple[float, float], tuple[float, float]] | None:
        """The ``r`` and thresholds a node set placed at ``budget`` serves.

        Those of the budgets from half of it to twice it (at most ``ceiling``). None if its
        threshold is not positive.
        """
        _, _, r, y = self.at(budget)
        if not y > 0.0:
            return None
        ends = [self.at(b)[2:] for b in (budget / 2, min(2 * budget, ceiling))]
        ys = [y] + [end[1] for end in ends if end[1] > 0.0]
        return (min(r, ends[0][0]), max(r, ends[1][0])), (min(ys), max(ys))


def _combined(
    history: Solution,
    basis: Basis,
    terms: Runs | None,
    history_var: float | None,
    placed: ScaledTails | None,
    sensitivity: float,
    step: Fraction,
    accuracy: AccuracyRequest,
    ceiling: Fraction,
    tail: TailMethod,
) -> Decision | None:
    """The least budget at which history plus one new measurement meets ``accuracy``.

    Returns ``None`` if that is no cheaper than ``ceiling`` (the fresh-only budget).
    ``terms``: the history's :func:`error_terms`, if sorted already; ``history_var``: its
    sum of squared scales, if known; ``placed``: a node set placed for the first budgets
    tried (:func:`_quantile_with_nodes`).
    """
    if history_var is None:
        history_var = history.variance / 2.0
    target = accuracy.delta * (1 - _COMBINED_MARGIN)
    if terms is None and isinstance(tail, ExactTail):
        terms = error_terms(history)
    known: dict[float, tuple[float, float]] = {}  # by budget: each is tried once
    combination = _Combination(history_var, history.shift, sensitivity, float(step), accuracy.eps)
    shared = isinstance(tail, ExactTail) and terms is not None and terms.size >= 2
    node_sets: list[ScaledTails] = [] if placed is None else [placed]

    def nodes_for(budget: float, r: float, y: float) -> ScaledTails | None:
        """A node set that serves ``budget``: one placed for it and those near, if none does."""
        nonlocal shared
        found = next((nodes for nodes in node_sets if nodes.serves(r, y)), None)
        if found is None and y > 0.0:
            ranges = combination.ranges(budget, float(ceiling))
            assert isinstance(tail, ExactTail) and terms is not None and ranges is not None
            found = tail.scaled(terms, *ranges)
            if found is None:
                shared = False  # too many nodes: the budgets' own from now on
            else:
                node_sets.append(found)
        return found

    def miss(budget: float) -> tuple[float, float]:
        """(bound on P(miss), weight of the new measurement) at ``budget``."""
        if budget in known:
            return known[budget]
        weight, x, r, y = combination.at(budget)
        nodes = nodes_for(budget, r, y) if shared else None
        if nodes is not None:
            found = known[budget] = (nodes.tail(r, y) + TAIL_SLACK, weight)
            return found
        fresh_scale = sensitivity / budget
        # the history's terms sorted once for every budget tried (the fresh one is the largest)
        scales: Scales | None = (
            None if terms is None else terms.joined(1.0 - weight, weight * fresh_scale)
        )
        if scales is None:
            scales = np.append((1.0 - weight) * history.scales, weight * fresh_scale)
        found = known[budget] = (tail.tail(scales, x) + TAIL_SLACK, weight)
        return found

    if miss(float(ceiling))[0] > target:
        return None  # the coupling allowance outweighs the history's help
    root = _least_budget(
        lambda budget: math.log(miss(budget)[0]),
        math.log(target),
        float(ceiling),
        1.0 / history_var,
        sensitivity,
    )
    if root is None:
        return None  # not reached (the slack keeps the two bounds consistent); fresh is safe
    budget = _least_on_grid(lambda b: miss(b)[0] <= target, round_up(root), ceiling)
    if budget is None or budget >= ceiling:
        return None
    bound, weight = miss(float(budget))
    return Decision("combined", budget, step, history, weight, accuracy.eps, 1.0 - bound, basis)


def _grid_index(budget: Fraction) -> int:
    """The place of a 12-digit budget (:func:`round_up`'s grid) among all of them, in order.

    ``m 10^(e - 11)`` with ``10^11 <= m < 10^12`` is ``e (9 10^11) + m - 10^11``: neighbours
    on the grid are neighbouring integers, across powers of ten too. In integers, as the
    search's steps (:func:`_grid_float`): ``Fraction`` arithmetic was most of its cost.
    """
    numerator, denominator = budget.numerator, budget.denominator
    # 10^e <= n / d < 10^(e + 1) for this e or the one below
    exponent = len(str(numerator)) - len(str(denominator))
    low, high = _shifted(numerator, denominator, -exponent)
    if low < high:
        exponent -= 1
    low, high = _shifted(numerator, denominator, _BUDGET_DIGITS - 1 - exponent)
    mantissa, remainder = divmod(low, high)
    if remainder:
        raise ValueError(f"{budget} has more than {_BUDGET_DIGITS} significant digits")
    return exponent * _DECADE + mantissa - _DECADE // 9


def _shifted(numerator: int, denominator: int, digits: int) -> tuple[int, int]:
    """``numerator 10^digits / denominator`` as a numerator and denominator (integers)."""
    if digits >= 0:
        return numerator * 10**digits, denominator
    return numerator, denominator * 10**-digits


def _grid_budget(index: int) -> Fraction:
    """The budget at ``index`` (:func:`_grid_index`'s inverse)."""
    numerator, denominator = _grid_ratio(index)
    return Fraction(numerator, denominator)


def _grid_float(index: int) -> float:
    """``float(_grid_budget(index))``, to the bit: a quotient of integers rounds correctly."""
    numerator, denominator = _grid_ratio(index)
    return numerator / denominator


def _grid_ratio(index: int) -> tuple[int, int]:
    exponent, offset = divmod(index, _DECADE)
    return _shifted(offset + _DECADE // 9, 1, exponent - _BUDGET_DIGITS + 1)


def _least_on_grid(
    meets: Callable[[float], bool], start: Fraction, ceiling: Fraction
) -> Fraction | None:
    """The budget on the grid where ``meets`` turns true, found from ``start``; ``ceiling`` meets.

    ``meets`` is asked at a grid budget's float. The answer meets and its neighbour below
    misses (the least that meets, for a bound that falls with the budget): it depends on the
    bound at those two grid points only, not on where the search began or how it went, so a
    budget moves only if the bound crosses the target at a grid point (one step, if the bound
    is evaluated a rounding apart). From ``start`` the steps double away from it until the
    target is bracketed (one step when ``start`` is the rounded root), then bisect. None if
    the steps down pass ``2^-60`` of the ceiling or ``_ROOT_STEPS`` do not settle it (not
    reached: the history alone misses).
    """
    top = _grid_index(ceiling)
    bottom = _grid_index(round_up(float(ceiling) * 2.0**-60))
    at = min(_grid_index(start), top)
    low: int | None = None  # the greatest index known to miss
    high = top  # the least known to meet
    first: bool | None = None  # whether ``start`` met
    stride = 1  # 0 once bracketed
    for _ in range(_ROOT_STEPS):
        met = at == top or meets(_grid_float(at))
        if met:
            high = at
        else:
            low = at
        if low is not None and high - low == 1:
            return _grid_budget(high)
        if first is None:
            first = met
        if met == first and stride > 0:  # away from ``start``, doubling
            after = at - stride if met else at + stride
            stride *= 2
            if after < bottom:
                return None
            if (low is None or after > low) and after < high:
                at = after
                continue
        stride = 0
        assert low is not None  # a miss is known once bracketed
        at = (low + high) // 2
    return None


def _least_budget(
    log_miss: Callable[[float], float],
    log_target: float,
    ceiling: float,
    history_precision: float,
    sensitivity: float,
) -> float | None:
    """The budget below ``ceiling`` (which meets) where ``log_miss`` falls to ``log_target``.

    A budget ``b`` gives the combination the precision ``v = sqrt(1/V + (b/S)^2)`` (``V``:
    the history's sum of squared scales; inverse-variance weights), and the log of a
    Laplace-like tail is nearly linear in ``v`` (``log P(|L| > x) = -x v`` for one term). So
    the secant method in ``v`` converges in a few evaluations, started from the ceiling with
    ``log P`` taken proportional to ``v``. Each step stays inside the bracket (else bisects)
    and, while no budget that misses is known, goes at most halfway down. The root is taken
    once a step would move it by less than ``_ROOT_RTOL`` of itself (the secant's steps
    shrink superlinearly, so it is then far closer than that), or the bracket is that narrow.
    None if every budget down to ``2^-60`` of the ceiling meets (not reached: the history
    alone missed).
    """

    def precision(budget: float) -> float:
        return math.sqrt(history_precision + (budget / sensitivity) ** 2)

    low, high = 0.0, ceiling  # a budget that misses (0: none yet) and one that meets
    last = (ceiling, precision(ceiling), log_miss(ceiling) - log_target)  # budget, v, excess
    before: tuple[float, float, float] | None = None
    v = last[1] * log_target / (last[2] + log_target)
    for _ in range(_ROOT_STEPS):
        budget = sensitivity * math.sqrt(max(v * v - history_precision, 0.0))
        if not low < budget < high or (low == 0.0 and budget < high / 2):
            budget = (low + high) / 2 if low > 0.0 else high / 2
            v = precision(budget)
        if before is not None and abs(budget - last[0]) <= _ROOT_RTOL * budget:
            return budget
        excess = log_miss(budget) - log_target
        if excess > 0.0:
            low = budget
        elif budget < ceiling * 2.0**-60:
            return None
        else:
            high = budget
        if high - low <= _ROOT_RTOL * high:
            return high  # bracketed closely enough (a noisy tail may stall the secant)
        before, last = last, (budget, v, excess)
        slope = (last[2] - before[2]) / (last[1] - before[1]) if last[1] != before[1] else 0.0
        v = last[1] - last[2] / slope if slope < 0.0 else math.nan  # NaN: bisect
    return None
