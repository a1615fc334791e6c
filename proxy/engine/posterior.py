"""What an answer says about the true value: posterior probabilities and range-respecting estimates.

An answer ``y`` to a linear query is ``theta + X`` with the exact error law of :mod:`tails`:
``X = sum_k b_k L_k`` for standard Laplace ``L_k`` and a scale vector ``b``. Under a flat prior
the posterior of the true value is ``theta = y - X`` ("Bayesian inference under DP", sec. 5:
hypothesis tests such as ``Pr(theta > 0)`` and the confidence of an interval ``[L, U]``). When
the true value is known to lie in a feasible range (a count in ``[0, N]``, a clamped sum in its
bounds), the prior is flat on that range instead, and the posterior is the same law truncated to
it: its mode (the answer moved into the range), mean and median are estimates that stay in the
range, the mean being the single-count paper's Bayes estimator with a flat prior in place of
its binomial one (which :func:`binomial_posterior_mean` computes). docs/probabilistic.md says
which to use where, and why the interval is the symmetric one cut to the range.

Everything is computed from the tails ``P(|X| > x)`` of :data:`tails.EXACT`; a mass is always
taken as a difference of the two small tails when it lies to one side of ``y``, so far-out
events keep the tails' relative precision instead of cancelling against 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt
from scipy import integrate, special

from proxy.engine.tails import EXACT
from sqlmap.vector import LinearQuery

__all__ = [
    "Interval",
    "REAL_LINE",
    "comparison",
    "cdf",
    "probability",
    "posterior_mode",
    "posterior_mean",
    "posterior_median",
    "range_interval",
    "cut_to_range",
    "feasible_range",
    "binomial_posterior_mean",
]

FloatArray = npt.NDArray[np.float64]

# Below this posterior mass of the feasible range, the tails (absolute error ~1e-13 off the closed
# forms) no longer resolve the truncated law; an answer this far outside its range has
# probability below 1e-9 for every true value inside it.
_MIN_MASS = 1e-9
# Relative error aimed at by the quadrature of a tail (the posterior mean's moments).
_QUAD_TOLERANCE = 1e-8
# The tails' absolute error beyond their closed forms (Gil-Pelaez, dominant-term bound): ~1e-13.
_TAIL_ERROR = 1e-12

Comparison = Literal[">", ">=", "<", "<=", "between"]


@dataclass(frozen=True, slots=True)
class Interval:
    """A set of true values: ``low .. high``, each end included or not (ends may be infinite)."""

    low: float
    high: float
    low_closed: bool = True
    high_closed: bool = True

    def __post_init__(self) -> None:
        if math.isnan(self.low) or math.isnan(self.high):
            raise ValueError("interval ends must be numbers")

    def intersect(self, other: Interval) -> Interval:
        """The values in both (possibly empty: then ``low > high`` or an open end meets it)."""
        low, low_closed = max((self.low, self.low_closed), (other.low, other.low_closed), key=_lo)
        # Of two upper ends at the same place the open one is the tighter: False < True.
        high, high_closed = min((self.high, self.high_closed), (other.high, other.high_closed))
        return Interval(low, high, low_closed, high_closed)

    def contains(self, value: float) -> bool:
        """Whether ``value`` is in the set."""
        above = value > self.low or (self.low_closed and value == self.low)
        below = value < self.high or (self.high_closed and value == self.high)
        return above and below

    @property
    def empty(self) -> bool:
        """Whether no value is in the set."""
        return self.low > self.high or (
            self.low == self.high and not (self.low_closed and self.high_closed)
        )


def _lo(end: tuple[float, bool]) -> tuple[float, bool]:
    # Of two lower ends at the same place, the open one is the tighter.
    return end[0], not end[1]


REAL_LINE = Interval(-math.inf, math.inf)


def comparison(op: Comparison, value: float, upper: float | None = None) -> Interval:
    """The true values for which ``theta <op> value`` holds (``between``: both ends included).

    >>> comparison(">", 0.0)
    Interval(low=0.0, high=inf, low_closed=False, high_closed=True)
    """
    if (op == "between") != (upper is not None):
        raise ValueError("an upper value goes with 'between', and only with it")
    if op == ">":
        return Interval(value, math.inf, low_closed=False)
    if op == ">=":
        return Interval(value, math.inf)
    if op == "<":
        return Interval(-math.inf, value, high_closed=False)
    if op == "<=":
        return Interval(-math.inf, value)
    if op == "between" and upper is not None:
        return Interval(value, upper)
    raise ValueError(f"unknown comparison {op!r}")


def _scales(scales: npt.ArrayLike) -> FloatArray:
    return np.asarray(scales, dtype=np.float64)


def _above(b: FloatArray, x: float, inclusive: bool) -> float:
    """``P(X >= x)`` if ``inclusive`` else ``P(X > x)``; only an error-free answer has an atom."""
    if x == math.inf:
        return 0.0
    if x == -math.inf:
        return 1.0
    if x > 0:
        return EXACT.tail(b, x) / 2.0
    if x < 0:
        return 1.0 - EXACT.tail(b, -x) / 2.0
    half = EXACT.tail(b, 0.0) / 2.0  # 1/2 with noise; 0 when the answer is exact (X = 0)
    return 1.0 - half if inclusive else half


def _error_mass(b: FloatArray, p: float, q: float, p_closed: bool, q_closed: bool) -> float:
    """``P(X in <p, q>)``, as a difference of tails on the side of 0 where the set lies."""
    if p > q or (p == q and not (p_closed and q_closed)):
        return 0.0
    if p >= 0:
        mass = _above(b, p, p_closed) - _above(b, q, not q_closed)
    elif q <= 0:  # by symmetry P(X in <p, q>) = P(X in <-q, -p>)
        mass = _above(b, -q, q_closed) - _above(b, -p, not p_closed)
    else:
        mass = 1.0 - _above(b, -p, not p_closed) - _above(b, q, not q_closed)
    return max(0.0, mass)


def _mass(b: FloatArray, estimate: float, values: Interval) -> float:
    """The flat-prior posterior probability that the true value lies in ``values``."""
    # theta = y - X, so theta in <low, high> is X in <y - high, y - low>.
    return _error_mass(
        b, estimate - values.high, estimate - values.low, values.high_closed, values.low_closed
    )


def cdf(scales: npt.ArrayLike, x: float) -> float:
    """``P(X <= x)`` for the error ``X = sum_k b_k L_k``.

    >>> round(cdf([2.0], -2.0), 12) == round(math.exp(-1) / 2, 12)  # one term: e^{x/b} / 2
    True
    """
    return _error_mass(_scales(scales), -math.inf, x, True, True)


def _nearest_end(estimate: float, feasible: Interval) -> float:
    return min(max(estimate, feasible.low), feasible.high)


def probability(
    scales: npt.ArrayLike,
    estimate: float,
    event: Interval,
    feasible: Interval = REAL_LINE,
) -> float:
    """The posterior probability that the true value lies in ``event``, given the answer.

    The prior is flat on ``feasible`` (the whole line by default), so the posterior is the
    law of ``estimate - X`` truncated to ``feasible``. An estimate whose range has posterior
    mass below 1e-9 counts as the range's nearest end.

    >>> round(probability([10.0], 5.0, comparison(">", 0.0)), 6)  # 1 - e^{-1/2} / 2
    0.696735
    """
    b = _scales(scales)
    if feasible.empty:
        raise ValueError("the feasible range is empty")
    total = _mass(b, estimate, feasible)
    if total < _MIN_MASS:
        return 1.0 if event.contains(_nearest_end(estimate, feasible)) else 0.0
    return min(1.0, _mass(b, estimate, event.intersect(feasible)) / total)


def posterior_mode(estimate: float, feasible: Interval) -> float:
    """The mode of the flat-prior posterior on ``feasible``: the estimate moved into the range.

    The error law is symmetric and log-concave (Laplace densities are, and convolution keeps
    it), so the posterior density ``f(theta - y)`` peaks at ``y`` and, cut to a range, at its
    nearest point. For every true value in the range this is never farther from it than the
    raw answer (projection onto an interval), so it lowers the error of every answer the range
    can improve, at every true value: near the ends of a count's range the posterior mean and
    median do not (docs/probabilistic.md).

    >>> posterior_mode(-7.5, Interval(0.0, 100.0)), posterior_mode(42.0, Interval(0.0, 100.0))
    (0.0, 42.0)
    """
    if feasible.empty:
        raise ValueError("the feasible range is empty")
    return _nearest_end(estimate, feasible)


def _truncated(
    scales: npt.ArrayLike, estimate: float, feasible: Interval
) -> tuple[FloatArray, float] | None:
    """The scales and the range's posterior mass, or None where the answer is the nearest end.

    That is: no noise, no range, or a mass too small for the tails to resolve.
    """
    b = _scales(scales)
    if feasible.empty:
        raise ValueError("the feasible range is empty")
    if feasible == REAL_LINE or not np.any(b):
        return None
    total = _mass(b, estimate, feasible)
    return None if total < _MIN_MASS else (b, total)


def posterior_mean(scales: npt.ArrayLike, estimate: float, feasible: Interval) -> float:
    """The mean of the flat-prior posterior on ``feasible``: an estimate that stays in the range.

    With ``theta = y - X`` and the range ``[lo, hi]`` as ``X in [p, q] = [y - hi, y - lo]``,
    the mean is ``y - (M(p) - M(q)) / P(X in [p, q])`` for the even function
    ``M(x) = E[X; X > |x|] = |x| P(X > |x|) + int_|x|^inf P(X > t) dt`` (:func:`_upper_moment`).
    Without noise, or without a bound, it is the estimate itself (clipped).

    >>> round(posterior_mean([1.0], 0.0, Interval(0.0, math.inf)), 9)  # posterior e^{-theta}
    1.0
    """
    truncated = _truncated(scales, estimate, feasible)
    if truncated is None:
        return _nearest_end(estimate, feasible)
    b, total = truncated
    # Each moment to within _QUAD_TOLERANCE * b_1 * total puts the mean within ~1e-8 b_1, as
    # far as the tails resolve it.
    tolerance = max(_QUAD_TOLERANCE * total, _TAIL_ERROR)
    moments = _upper_moment(b, estimate - feasible.high, tolerance) - _upper_moment(
        b, estimate - feasible.low, tolerance
    )
    return min(max(estimate - moments / total, feasible.low), feasible.high)


def posterior_median(scales: npt.ArrayLike, estimate: float, feasible: Interval) -> float:
    """The median of the flat-prior posterior on ``feasible`` (Bayes for the absolute error).

    With ``[p, q] = [y - hi, y - lo]`` and ``Z = P(X in [p, q])`` it is ``y - x`` for the ``x``
    with ``P(X >= x) = P(X > q) + Z / 2`` (equivalently ``P(X < x) = P(X < p) + Z / 2``; the
    smaller side is inverted, by one exact quantile).

    >>> round(posterior_median([1.0], -5.0, Interval(0.0, math.inf)), 9)  # e^{-theta}: ln 2
    0.693147181
    """
    truncated = _truncated(scales, estimate, feasible)
    if truncated is None:
        return _nearest_end(estimate, feasible)
    b, total = truncated
    above = _above(b, estimate - feasible.low, False) + total / 2  # P(X >= x)
    below = _above(b, feasible.high - estimate, False) + total / 2  # P(X < x), by symmetry
    if min(above, below) >= 0.5:
        error = 0.0
    elif above < below:
        error = EXACT.quantile(b, 2 * above)
    else:
        error = -EXACT.quantile(b, 2 * below)
    return min(max(estimate - error, feasible.low), feasible.high)


def _upper_moment(b: FloatArray, x: float, tolerance: float) -> float:
    """``M(x) = E[X; X > |x|]``, which is ``E[X; X > x]`` for every ``x`` (X is symmetric).

    The tail's integral is taken in ``v = exp(-(t - |x|) / b_1)`` over ``(0, 1]``: the tail
    falls like ``exp(-t / b_1)`` at most polynomially slower, so the integrand is bounded and
    nearly flat (constant for one term), and quadrature needs few tail evaluations. The
    integral is taken to 1e-8 relative, or to ``tolerance`` absolute in units of ``b_1``.
    """
    x = abs(x)
    if x == math.inf:
        return 0.0
    b_1 = float(np.max(np.abs(b)))
    area, _ = integrate.quad(
        lambda v: EXACT.tail(b, x - b_1 * math.log(v)) / (2.0 * v),
        0.0,
        1.0,
        limit=200,
        epsabs=tolerance,
        epsrel=_QUAD_TOLERANCE,
    )
    return x * EXACT.tail(b, x) / 2.0 + b_1 * float(area)


def range_interval(estimate: float, half_width: float, feasible: Interval) -> tuple[float, float]:
    """The answer's symmetric interval ``estimate +- half_width``, cut to the feasible range.

    ``half_width`` is the answer's exact quantile (``EXACT.quantile(scales, 1 - confidence)``,
    which the engine already computes). The cut interval contains every true value in the range
    at least as often as the symmetric one does (the truth is always in the range), so its
    coverage is ``>= confidence`` for every true value. If the two do not meet (the answer is
    far outside its range, which the symmetric interval already counts as a miss) it is the
    range's nearest end.

    >>> range_interval(3.0, 29.96, Interval(0.0, 1000.0))
    (0.0, 32.96)
    """
    if not half_width >= 0:
        raise ValueError("the half-width must be a non-negative number")
    return cut_to_range(estimate, estimate - half_width, estimate + half_width, feasible)


def cut_to_range(
    estimate: float, low: float, high: float, feasible: Interval
) -> tuple[float, float]:
    """The interval ``[low, high]`` around ``estimate`` cut to the feasible range.

    If they do not meet, the range's nearest end to ``estimate``: see :func:`range_interval`.

    >>> cut_to_range(-70.0, -120.0, -20.0, Interval(0.0, math.inf))
    (0.0, 0.0)
    """
    if feasible.empty:
        raise ValueError("the feasible range is empty")
    low, high = max(feasible.low, low), min(feasible.high, high)
    if low > high:
        end = _nearest_end(estimate, feasible)
        return end, end
    return low, high


def feasible_range(query: LinearQuery, rows: int | None = None) -> Interval:
    """The values ``q . x + offset`` can take for a table of at most ``rows`` rows.

    Each row adds its cell's weight (over measure coordinates, a value in the box of the
    measures' bounds: :meth:`~sqlmap.vector.LinearQuery.row_range`), so with ``x >= 0`` and
    ``sum x <= rows`` the answer lies in ``offset + rows * [min(0, min q), max(0, max q)]``
    (the extremes put every row in the cell of the least or the largest weight, or no row at
    all); both ends are reached, so nothing narrower is provable. Without a row count (None:
    not public) only the sign of the weights bounds it: ``[offset, inf)`` when none is
    negative.

    >>> q = LinearQuery.from_dense([1.0, -2.0, 0.5], offset=3.0)
    >>> feasible_range(q, 10), feasible_range(LinearQuery.from_dense([1.0, 1.0])).low
    (Interval(low=-17.0, high=13.0, low_closed=True, high_closed=True), 0.0)
    """
    if rows is not None and rows < 0:
        raise ValueError("a row count cannot be negative")
    # what one row adds: its cell's weight, or over measure coordinates the box of the bounds
    least, largest = query.row_range()
    least, largest = min(0.0, least), max(0.0, largest)
    if rows is None:
        low = -math.inf if least < 0 else 0.0
        high = math.inf if largest > 0 else 0.0
    else:
        low, high = rows * least, rows * largest
    return Interval(query.offset + low, query.offset + high)


def binomial_posterior_mean(estimate: float, scale: float, rows: int, fraction: float) -> float:
    """The single-count paper's Bayes estimator: a count of ``rows`` Bernoulli(``fraction``) rows.

    ``E[k | y]`` for the prior ``k ~ Binomial(rows, fraction)`` and one Laplace noise of scale
    ``scale`` (the paper's setting: one noisy count, ``scale = 1/epsilon``), summed over
    ``k = 0..rows`` in log space.

    >>> round(binomial_posterior_mean(-3.0, 1.0, 1, 0.5), 6)  # 1 / (1 + e)
    0.268941
    """
    if not (scale > 0 and rows >= 0 and 0 <= fraction <= 1):
        raise ValueError("need a positive scale, a row count and a fraction in [0, 1]")
    k = np.arange(rows + 1, dtype=np.float64)
    with np.errstate(divide="ignore"):  # fraction 0 or 1: log 0 = -inf weights, as they should
        log_prior = (
            special.gammaln(rows + 1.0)
            - special.gammaln(k + 1.0)
            - special.gammaln(rows - k + 1.0)
            + special.xlogy(k, fraction)
            + special.xlogy(rows - k, 1.0 - fraction)
        )
    log_weight = log_prior - np.abs(estimate - k) / scale
    weight = np.exp(log_weight - np.max(log_weight))
    return float(np.dot(k, weight) / weight.sum())
