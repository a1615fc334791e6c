"""Posterior probabilities and range-respecting estimates: exact values, calibration, coverage.

Exactness is checked against closed forms for one Laplace term and against numerical
integration of the convolved density for several. Calibration draws true values from a uniform
prior (the flat prior of the posterior, on the feasible range when one is given) and checks that
among answers given probability ``p`` the event holds a fraction ``p`` of the time. Coverage
checks the range-cut interval at true values at and near the ends of a count's range.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate

from proxy.engine.posterior import (
    REAL_LINE,
    Interval,
    binomial_posterior_mean,
    cdf,
    comparison,
    posterior_mean,
    posterior_median,
    posterior_mode,
    probability,
    range_interval,
)
from proxy.engine.tails import EXACT, ConvolutionTail
from tests.engine.calibration import assert_calibrated
from tests.paper_examples import (
    EIGHT_BY_FOUR_ALPHA,
    EIGHT_BY_FOUR_H,
    EIGHT_BY_FOUR_PR_THETA_POSITIVE,
    EIGHT_BY_FOUR_THETA_ESTIMATE,
    EIGHT_BY_FOUR_THETA_WEIGHTS,
)

COUNTS = Interval(0.0, math.inf)


def _laplace_cdf(b: float, x: float) -> float:
    return math.exp(x / b) / 2 if x < 0 else 1 - math.exp(-x / b) / 2


def _two_term_density(b1: float, b2: float, x: float) -> float:
    # partial fractions of 1 / ((1 + b1^2 s^2)(1 + b2^2 s^2))
    return (b1 * math.exp(-abs(x) / b1) - b2 * math.exp(-abs(x) / b2)) / (2 * (b1**2 - b2**2))


def _three_term_density(b: tuple[float, float, float], x: float) -> float:
    """The density of b1 L1 + b2 L2 + b3 L3: the two-term density convolved with b3 L3's."""
    b1, b2, b3 = b

    def integrand(u: float) -> float:
        return _two_term_density(b1, b2, u) * math.exp(-abs(x - u) / b3) / (2 * b3)

    reach = 60 * b1
    value, _ = integrate.quad(integrand, x - reach, x + reach, points=[0.0, x], limit=400)
    return float(value)


def _truncated_laplace_mean(b: float, y: float, low: float, high: float) -> float:
    """E[theta] for the density exp(-|theta - y| / b) on [low, high], from antiderivatives."""

    def mass_and_moment(a: float, c: float) -> tuple[float, float]:  # of u = theta - y on [a, c]
        if a >= 0:
            mass = b * (math.exp(-a / b) - math.exp(-c / b))
            moment = b * ((a + b) * math.exp(-a / b) - (c + b) * math.exp(-c / b))
            return mass, moment
        if c <= 0:
            mass, moment = mass_and_moment(-c, -a)
            return mass, -moment
        left, right = mass_and_moment(a, 0.0), mass_and_moment(0.0, c)
        return left[0] + right[0], left[1] + right[1]

    far = 1e6 * b  # e^{-1e6} is 0: as good as infinity
    mass, moment = mass_and_moment(max(low - y, -far), min(high - y, far))
    return y + moment / mass


# --- exactness ----------------------------------------------------------------------------


@pytest.mark.parametrize("x", [-40.0, -3.0, -1e-9, 0.0, 0.5, 7.0, 55.0])
def test_cdf_of_one_term_is_the_laplace_cdf(x: float) -> None:
    assert cdf([4.0], x) == pytest.approx(_laplace_cdf(4.0, x), rel=1e-12, abs=1e-300)


@pytest.mark.parametrize("x", [-25.0, -4.0, 0.0, 1.5, 9.0, 30.0])
def test_cdf_of_three_terms_integrates_the_convolved_density(x: float) -> None:
    b = (5.0, 3.0, 1.5)
    lower, _ = integrate.quad(lambda u: _three_term_density(b, u), -400.0, min(x, 0.0))
    upper, _ = integrate.quad(lambda u: _three_term_density(b, u), 0.0, max(x, 0.0))
    assert cdf(list(b), x) == pytest.approx(lower + upper, abs=1e-9)


def test_an_exact_answer_has_an_atom_at_the_estimate() -> None:
    y = 7.0
    assert probability([], y, comparison(">", y)) == 0.0
    assert probability([], y, comparison(">=", y)) == 1.0
    assert probability([], y, comparison("<", y)) == 0.0
    assert probability([], y, comparison("<=", y)) == 1.0
    assert probability([], y, comparison("between", y, y)) == 1.0
    assert probability([0.0], y, comparison("between", 7.5, 9)) == 0.0
    assert posterior_mean([], -3.0, COUNTS) == 0.0


def test_comparisons_of_one_term_are_closed_forms() -> None:
    b, y = 10.0, 5.0
    above_zero = 1 - math.exp(-0.5) / 2
    assert probability([b], y, comparison(">", 0.0)) == pytest.approx(above_zero, rel=1e-12)
    assert probability([b], y, comparison(">=", 0.0)) == pytest.approx(above_zero, rel=1e-12)
    assert probability([b], y, comparison("<", 0.0)) == pytest.approx(1 - above_zero, rel=1e-12)
    assert probability([b], y, comparison("<=", 0.0)) == pytest.approx(1 - above_zero, rel=1e-12)
    inside = probability([b], y, comparison("between", -5.0, 15.0))
    assert inside == pytest.approx(1 - math.exp(-1), rel=1e-12)
    # far in a tail, the tails' relative precision survives (no 1 - (1 - tiny))
    far = probability([b], y, comparison(">", 505.0))
    assert far == pytest.approx(math.exp(-50) / 2, rel=1e-12)


def test_a_feasible_range_truncates_the_posterior() -> None:
    b, y, low, high = 2.0, 3.0, 0.0, 10.0
    mass = _laplace_cdf(b, high - y) - _laplace_cdf(b, low - y)
    above = _laplace_cdf(b, high - y) - _laplace_cdf(b, 5.0 - y)
    feasible = Interval(low, high)
    got = probability([b], y, comparison(">", 5.0), feasible)
    assert got == pytest.approx(above / mass, rel=1e-12)
    assert probability([b], y, comparison(">", -1.0), feasible) == 1.0
    assert probability([b], y, comparison("<", 0.0), feasible) == 0.0
    assert probability([b], y, comparison("between", -5.0, 20.0), feasible) == pytest.approx(1.0)


def test_an_answer_the_range_cannot_explain_counts_as_the_nearest_end() -> None:
    # P(X < -40) = e^{-40}/2 < 1e-9 for every true value >= 0
    assert probability([1.0], -40.0, comparison("<=", 0.0), COUNTS) == 1.0
    assert probability([1.0], -40.0, comparison(">", 0.0), COUNTS) == 0.0
    assert posterior_mean([1.0], -40.0, COUNTS) == 0.0
    assert range_interval(-40.0, EXACT.quantile(np.array([1.0]), 0.05), COUNTS) == (0.0, 0.0)


@pytest.mark.parametrize(
    ("y", "low", "high"),
    [
        (2.0, 0.0, math.inf),
        (0.0, 0.0, math.inf),
        (-12.0, 0.0, math.inf),
        (40.0, 0.0, math.inf),
        (50.0, 0.0, 100.0),
        (97.0, 0.0, 100.0),
        (130.0, 0.0, 100.0),
        (3.0, 4.0, 4.5),
    ],
)
def test_truncated_mean_of_one_term_is_the_closed_form(y: float, low: float, high: float) -> None:
    b = 50 / math.log(20)  # +-50 at 95%
    got = posterior_mean([b], y, Interval(low, high))
    assert got == pytest.approx(_truncated_laplace_mean(b, y, low, high), rel=1e-9, abs=1e-9 * b)


@pytest.mark.parametrize(("y", "high"), [(1.0, math.inf), (-6.0, math.inf), (18.0, 20.0)])
@pytest.mark.parametrize("b", [(6.0, 2.0), (5.0, 3.0, 1.5)])
def test_truncated_mean_of_several_terms_integrates_the_density(
    b: tuple[float, ...], y: float, high: float
) -> None:
    def density(x: float) -> float:
        if len(b) == 2:
            return _two_term_density(b[0], b[1], x)
        return _three_term_density((b[0], b[1], b[2]), x)

    top = min(high, y + 80 * b[0])
    mass, _ = integrate.quad(lambda t: density(y - t), 0.0, top, points=[y], limit=200)
    moment, _ = integrate.quad(lambda t: t * density(y - t), 0.0, top, points=[y], limit=200)
    got = posterior_mean(list(b), y, Interval(0.0, high))
    assert got == pytest.approx(moment / mass, abs=1e-7 * b[0])


def test_binomial_prior_mean_is_the_papers_sum() -> None:
    y, scale, rows, p = 3.5, 10.0, 6, 0.3
    k = np.arange(rows + 1)
    prior = np.array([math.comb(rows, int(i)) * p**i * (1 - p) ** (rows - i) for i in k])
    weight = prior * np.exp(-np.abs(y - k) / scale)
    expected = float((k * weight).sum() / weight.sum())
    assert binomial_posterior_mean(y, scale, rows, p) == pytest.approx(expected, rel=1e-12)
    assert binomial_posterior_mean(-50.0, scale, 5, 1.0) == pytest.approx(5.0)


def test_papers_probability_that_theta_is_positive() -> None:
    """Sec. 5.2's Pr(theta > 0) for the 8 x 4 example's x1 + x3, estimate 42 (eq. 26 weights).

    The paper sums a binned probability mass vector (its Alg. 2, here ConvolutionTail.pmf on
    0.05-wide bins); the exact law agrees to the binning error. The paper prints 0.88, and the
    95% interval [-41, 125]: both from a law wider than the one its eq. (26) weights give
    (their Monte Carlo spans +-466), whose exact 95% half-width is 47.4, not 83.
    """
    h = np.array(EIGHT_BY_FOUR_H, dtype=float)
    sensitivity = np.abs(h).max(axis=1)
    alpha = np.array([float(a) for a in EIGHT_BY_FOUR_ALPHA])
    scales = np.abs(np.array(EIGHT_BY_FOUR_THETA_WEIGHTS)) * sensitivity / alpha
    y = EIGHT_BY_FOUR_THETA_ESTIMATE
    exact = probability(scales, y, comparison(">", 0.0))

    binned = ConvolutionTail(gamma=1e-9, step=0.05)
    pmf = binned.pmf(scales)
    centres = (np.arange(pmf.size) - (pmf.size - 1) // 2) * binned.step
    # theta > 0 is X < y; the bin centred on y is split in two
    paper_style = pmf[centres < y].sum() + pmf[np.isclose(centres, y)].sum() / 2
    assert exact == pytest.approx(paper_style, abs=2e-3)
    assert round(exact, 2) == EIGHT_BY_FOUR_PR_THETA_POSITIVE
    assert EXACT.quantile(scales, 0.05) == pytest.approx(47.4, abs=0.05)


# --- calibration and coverage ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("feasible", "event"),
    [
        (REAL_LINE, comparison(">", 0.0)),
        (REAL_LINE, comparison("between", -10.0, 25.0)),
        (Interval(0.0, 60.0), comparison(">", 5.0)),
        (Interval(0.0, 60.0), comparison("<=", 50.0)),
        (Interval(0.0, 60.0), comparison("between", 2.0, 20.0)),
    ],
)
def test_probability_is_calibrated(feasible: Interval, event: Interval) -> None:
    """True values uniform on the range (or on [-150, 150]: flat where the events are decided)."""
    rng = np.random.default_rng(15)
    scales = np.array([12.0, 7.0])
    trials = 4000
    low, high = (-150.0, 150.0) if feasible == REAL_LINE else (feasible.low, feasible.high)
    truths = rng.uniform(low, high, trials)
    answers = truths + rng.laplace(0, scales[0], trials) + rng.laplace(0, scales[1], trials)
    said = np.array([probability(scales, float(y), event, feasible) for y in answers])
    held = np.array([event.contains(float(t)) for t in truths])
    assert 0.05 < said.mean() < 0.95  # the events are informative, not foregone
    assert_calibrated(said, held, slack=1e-12)


HALF_WIDTH = 50.0  # the example: a count asked at +-50
ROWS = 1000.0  # a public row count N


@pytest.mark.parametrize(
    "scales",
    [
        [HALF_WIDTH / math.log(20)],
        [20.0, 9.0],
        [20.0, 9.0, 4.0],
    ],
)
def test_range_interval_covers_every_true_value_and_stays_in_range(scales: list[float]) -> None:
    rng = np.random.default_rng(150)
    confidence, trials = 0.95, 2000
    feasible = Interval(0.0, ROWS)
    half_width = EXACT.quantile(np.array(scales), 1 - confidence)
    noise = rng.laplace(0.0, scales, (trials, len(scales))).sum(axis=1)
    for truth in (0.0, 1.0, 2.0, 5.0, half_width / 2, ROWS):
        intervals = [range_interval(truth + float(e), half_width, feasible) for e in noise]
        lows, highs = np.array(intervals).T
        assert lows.min() >= 0 and highs.max() <= ROWS
        covered = float(np.mean((lows <= truth) & (truth <= highs)))
        assert covered >= confidence - 3 * math.sqrt(confidence * (1 - confidence) / trials)


def test_counts_near_zero_come_back_nonnegative_and_closer() -> None:
    """The acceptance check: truths below 5% of the half-width, no negative estimate or bound.

    The mode (the answer moved into the range) is never farther from the truth than the raw
    answer, so its mean absolute error falls; the flat-prior mean, pulled towards the bulk of
    the range, does not near 0 (its error is larger than the raw answer's there).
    """
    rng = np.random.default_rng(1500)
    scale, trials = HALF_WIDTH / math.log(20), 2000
    for truth in (0.0, 1.0, 2.0):
        answers = truth + rng.laplace(0, scale, trials)
        modes = np.array([posterior_mode(float(y), COUNTS) for y in answers])
        lows = np.array([range_interval(float(y), HALF_WIDTH, COUNTS)[0] for y in answers])
        assert modes.min() >= 0 and lows.min() >= 0
        assert np.all(np.abs(modes - truth) <= np.abs(answers - truth))
        raw_error = np.mean(np.abs(answers - truth))
        assert np.mean(np.abs(modes - truth)) < 0.6 * raw_error  # about half: E max(X, 0)
        means = np.array([posterior_mean([scale], float(y), COUNTS) for y in answers[:200]])
        assert means.min() >= 0 and np.mean(np.abs(means - truth)) > raw_error


@pytest.mark.parametrize(
    ("y", "low", "high"), [(-5.0, 0.0, math.inf), (3.0, 0.0, math.inf), (97.0, 0.0, 100.0)]
)
def test_median_halves_the_truncated_posterior(y: float, low: float, high: float) -> None:
    for scales in ([8.0], [8.0, 5.0]):
        feasible = Interval(low, high)
        median = posterior_median(scales, y, feasible)
        below = probability(scales, y, comparison("<=", median), feasible)
        assert low <= median <= high and below == pytest.approx(0.5, abs=1e-9)
