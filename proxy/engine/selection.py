"""Which unbiased estimate from history answers a query: one whose exact interval suffices.

Every ``t`` with ``t H = q`` gives an unbiased estimate ``t . y``, and its interval comes from
the exact tail of its error ``sum_k t_k N_k``. The BLUE minimises the variance of that error,
not its ``1 - delta`` quantile. Below about 91% confidence a single Laplace noise has a
narrower quantile than a near-Gaussian sum of the same variance (``ln(1/delta) / sqrt 2``
standard deviations against the normal ``z_{1-delta/2}``), and at any confidence the exact
lattice tail of one noise is narrower than the coupling bound a sum of them needs. So a query
measured afresh, whose BLUE later spreads over newer overlapping rows, could be judged *less*
accurate from the grown history than from its own earlier measurement, and be charged again.

The quantile-optimal ``t`` is a non-convex search over the whole affine space of unbiased
estimates, too slow for a per-query decision. :func:`choose` looks where it matters, on the
segment from the BLUE to the best *repeat* estimate (the rows that measured the query itself,
alone or inverse-variance weighted): the narrower of the two ends, and only if neither meets
the requested half-width (and the BLUE's variance does not already put it out of reach), a
point between them that does, found by a golden-section descent on the miss probability at
that half-width (each point's tail from the BLUE's terms, sorted once, times ``lam`` with the
anchor's few rows amended: :meth:`~proxy.engine.tails.ExactTail.amended_tail`). The result is
never wider than the BLUE (the engine's earlier choice) nor than the query's own earlier
measurement, so a repeat of a fresh answer at the same accuracy is free by construction; the
search costs time only when it can save budget. Likewise a pooled repeat's own quantile (a
slow inversion of a few terms) is found only where it can matter: a closed-form bound on its
tail that shows it wider than the BLUE usually settles that it cannot.

Only public numbers enter (the rows, their budgets and steps, the accuracy asked for), and the
choice is made before any released value is read, so the chosen estimate's interval keeps its
stated coverage.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Literal

import numpy as np

from proxy.engine import tails
from proxy.engine.estimator import Solution, combine
from proxy.engine.tails import (
    EXACT,
    ExactTail,
    FloatArray,
    IntArray,
    Runs,
    Scales,
    TailMethod,
    discrete_laplace_tail,
    quantile,
    tail_lower_bound,
)
from sqlmap.accuracy import AccuracyRequest

__all__ = [
    "Basis",
    "Candidate",
    "TAIL_SLACK",
    "lattice_interval",
    "interval",
    "intervals",
    "choose",
    "out_of_reach",
    "meets",
    "error_terms",
]

Basis = Literal["blue", "repeat", "mixture"]

# Added to every computed miss probability: the exact tail's error budget (2e-13) with margin.
TAIL_SLACK = 1e-12
# A sum's half-width comes from a quantile search to ~1e-12 relative; one this close above the
# requested half-width is settled by the tail at the requested half-width itself.
_QUANTILE_ROUNDING = 1e-9
# Below this fraction of the variance bound a segment search is not even tried.
_SHAPE_MARGIN = 0.9
# Golden-section steps on the segment: the bracket shrinks to 0.618^10 < 1% of it, at one tail
# evaluation per step.
_SEGMENT_STEPS = 10


@dataclass(frozen=True, slots=True)
class Candidate:
    """An estimate from history with the narrowest interval it justifies.

    Attributes:
        estimator: the unbiased linear estimate.
        half_width: its interval's half-width at the requested confidence.
        confidence: a lower bound on the probability that the interval holds the true answer.
        basis: ``blue``; ``repeat`` (the query's own earlier measurements, one or pooled); or
            ``mixture`` of the two.
    """

    estimator: Solution
    half_width: float
    confidence: float
    basis: Basis = "blue"

    def __post_init__(self) -> None:
        if not (self.half_width >= 0 and 0 < self.confidence <= 1):
            raise ValueError("half_width must be >= 0 and confidence in (0, 1]")
        if self.basis not in ("blue", "repeat", "mixture"):
            raise ValueError(f"unknown basis {self.basis!r}")


def lattice_interval(rho: float, unit: float, delta: float) -> tuple[float, float]:
    """Narrowest half-width for an error ``unit * Z``, ``Z`` discrete Laplace of decay ``rho``.

    Returns ``((k - 1) * unit, P(|Z| >= k))`` for the least ``k`` with ``P(|Z| >= k) <= delta``,
    found by galloping from the closed-form guess and bisecting: O(log k) tail evaluations,
    also when ``k`` is so large (a huge half-width asked for) that ``k + 1`` rounds to ``k``.

    >>> width, miss = lattice_interval(math.log(2), 0.5, 0.25)  # P(|Z| >= k) = (4/3) 2^-k
    >>> width, round(miss, 12)
    (1.0, 0.166666666667)
    >>> width, miss = lattice_interval(3e-30, 1.0, 0.05)  # k near 1e30: floats 2^47 apart
    >>> 0.9e30 < width < 1.1e30 and miss <= 0.05
    True
    """

    def misses(k: int) -> bool:
        return discrete_laplace_tail(rho, k) > delta  # non-increasing in k, true at k = 0

    guess = max(1, math.ceil((math.log(2.0 / delta) - math.log1p(math.exp(-rho))) / rho))
    step = 1
    if misses(guess):  # gallop up to a k that meets delta
        low = guess
        while misses(low + step):
            low, step = low + step, 2 * step
        high = low + step
    else:  # gallop down to a k that misses (k = 0 always does)
        high = guess
        while high - step > 0 and not misses(high - step):
            high, step = high - step, 2 * step
        low = max(0, high - step)
    while high - low > 1:  # low misses, high meets
        middle = (low + high) // 2
        if misses(middle):
            low = middle
        else:
            high = middle
    return (high - 1) * unit, discrete_laplace_tail(rho, high)


def interval(
    estimator: Solution,
    delta: float,
    tail: TailMethod = EXACT,
    basis: Basis = "blue",
    terms: Runs | None = None,
) -> Candidate:
    """The narrowest interval ``estimator`` achieves at confidence ``1 - delta``.

    A single term is one lattice noise scaled by ``t``: its error is exactly ``|t| g Z`` with
    decay ``rho = g alpha / S``, so its tail is exact (a repeated query gets its earlier width).
    Otherwise the coupling ``P(|sum t_k Z_k| > x) <= P(|sum t_k L_k| > x - sum |t_k| g_k)``
    with continuous ``L_k`` applies. ``terms``: its :func:`error_terms`, if the caller has
    them.
    """
    if estimator.terms == 0:
        return Candidate(estimator, 0.0, 1.0, basis)
    if estimator.terms == 1:
        rho = float(estimator.steps[0]) * float(estimator.precisions[0])
        width, miss = lattice_interval(rho, estimator.shift, delta)
        return Candidate(estimator, width, 1.0 - miss, basis)
    if not isinstance(tail, ExactTail):
        width = estimator.shift + quantile(tail, estimator.scales, delta - TAIL_SLACK)
        return Candidate(estimator, width, 1.0 - delta, basis)
    # A solution is cached per history (HistoryIndex.solve), so a statement asked again (a
    # dashboard refreshing) finds its exact quantile here instead of inverting phi again.
    known = estimator.widths.get((tail, delta))
    if known is None:
        if terms is None:
            terms = error_terms(estimator)
        known = estimator.shift + quantile(tail, terms, delta - TAIL_SLACK)
        estimator.widths[(tail, delta)] = known
    return Candidate(estimator, known, 1.0 - delta, basis)


def intervals(
    estimators: Sequence[Solution | None], deltas: Sequence[float], tail: TailMethod = EXACT
) -> None:
    """Find the exact quantiles :func:`interval` will need for a batch's BLUEs, together.

    The BLUEs of one GROUP BY weigh the same history rows, so their scales form a matrix
    whose quantiles :meth:`~proxy.engine.tails.ExactTail.quantiles` inverts at once; each is
    kept where :func:`interval` looks first. Batches whose estimators share few rows are left
    to :func:`interval` one by one.
    """
    if not isinstance(tail, ExactTail):
        return
    by_delta: dict[float, dict[int, Solution]] = {}
    for estimator, delta in zip(estimators, deltas):
        if estimator is not None and estimator.terms > 1:
            if (tail, delta) not in estimator.widths:
                by_delta.setdefault(delta, {})[id(estimator)] = estimator
    for delta, pending in by_delta.items():
        batch = list(pending.values())
        if len(batch) < 2:
            continue
        first = batch[0].rows
        columns = batch[0].columns
        counts = None
        if columns is not None and all(e.columns is columns for e in batch):
            # BLUEs of one history over every row: its classes of rows are the equal columns
            scales = np.stack([e.column_scales() for e in batch])
            counts = columns.counts
        elif all(np.array_equal(e.rows, first) for e in batch):  # all weigh every row
            scales = np.stack([e.scales for e in batch])
        else:
            rows = np.unique(np.concatenate([e.rows for e in batch]))
            if rows.size * len(batch) > 2 * sum(e.rows.size for e in batch):
                continue  # mostly different rows: a matrix would be mostly zeros
            scales = np.zeros((len(batch), rows.size))
            for q, estimator in enumerate(batch):
                scales[q, np.searchsorted(rows, estimator.rows)] = estimator.scales
        for estimator, found in zip(batch, tail.quantiles(scales, delta - TAIL_SLACK, counts)):
            estimator.widths[(tail, delta)] = estimator.shift + float(found)


def error_terms(estimator: Solution) -> Runs:
    """The estimator's error scales sorted for its exact tails, by class of rows if it has them.

    Rows of one class have equal scales (:class:`~proxy.engine.estimator.RowColumns`), so only
    the classes are sorted: the runs are those of the scales row by row.
    """
    columns = estimator.columns
    if columns is None:
        return tails.error_terms(estimator.scales)
    return tails.error_terms(estimator.column_scales(), columns.counts)


def _best_repeat(
    repeats: Sequence[Solution],
    blue: Candidate,
    accuracy: AccuracyRequest,
    tail: TailMethod,
    reach: bool,
) -> Candidate | None:
    """The narrowest of the repeat estimates, less those that cannot change :func:`choose`.

    A repeat of several terms (the pooled one) costs a quantile of a few terms, slow to invert
    (their ``phi`` decays slowly). One wider than the BLUE is never the narrower end, and
    matters only as the anchor of the segment search: that runs only if the narrower end
    misses and the BLUE's variance leaves the accuracy within ``reach``, and starts from the
    narrowest repeat. So one settled wider (:func:`_wider`) than the BLUE, and than the
    narrowest other repeat if a search may follow, is left out. None if all are.
    """
    delta = accuracy.delta
    costly = [
        isinstance(tail, ExactTail) and r.terms > 1 and (tail, delta) not in r.widths
        for r in repeats
    ]
    found = [None if c else interval(r, delta, tail, "repeat") for r, c in zip(repeats, costly)]
    if any(costly):
        others = [c for c in found if c is not None]
        narrowest = min(others, key=lambda c: c.half_width, default=None)  # the first of equals
        end = blue
        if narrowest is not None and narrowest.half_width < blue.half_width:
            end = narrowest
        bar: float | None = blue.half_width
        if reach and meets(end, accuracy.eps, delta, tail) is None:  # a search may follow
            bar = None if narrowest is None else max(blue.half_width, narrowest.half_width)
        assert isinstance(tail, ExactTail)  # (costly ones are its quantiles)
        for k, repeat in enumerate(repeats):
            if costly[k] and (bar is None or not _wider(repeat, bar, delta, tail)):
                found[k] = interval(repeat, delta, tail, "repeat")
    kept = [c for c in found if c is not None]
    return min(kept, key=lambda c: c.half_width, default=None)  # the first of equals


def _wider(estimator: Solution, width: float, delta: float, tail: ExactTail) -> bool:
    """Whether :func:`interval` would give ``estimator`` more than ``width``, by one tail.

    The quantile search returns a half-width whose computed tail is at most
    ``delta - TAIL_SLACK``, and every computed tail is within ``e`` (aliasing and truncation:
    2e-13) of the exact one. An exact tail more than ``e`` above that target at ``width`` puts
    every computed one above it there and at every threshold below, so the search's answer lies
    beyond ``width``; the margin taken is ``2 TAIL_SLACK + e``. For a few terms a closed-form
    lower bound on the exact tail serves (:func:`~proxy.engine.tails.tail_lower_bound`: a
    pooled repeat's tail costs a few hundred microseconds inverted, its few terms decaying
    slowly), else a computed tail less ``e``. False where the bound does not settle it.

    A width so settled is kept with the estimator's widths, as a bound below its own: a
    pooled repeat lasts until its query is measured again, and a statement asked again
    against a BLUE no wider is then settled without a tail.
    """
    key = (("exceeds", tail), delta)
    exceeded = estimator.widths.get(key, -math.inf)
    if width <= exceeded:
        return True
    error = tail.alias_tol + tail.trunc_tol
    terms, x = error_terms(estimator), width - estimator.shift
    below = tail_lower_bound(terms, x)
    if below is None:
        below = tail.tail(terms, x) - error
    if below > delta + TAIL_SLACK + error:
        estimator.widths[key] = width
        return True
    return False


def choose(
    blue: Solution,
    repeats: Sequence[Solution],
    accuracy: AccuracyRequest,
    tail: TailMethod = EXACT,
    variance: float | None = None,
    terms: Runs | None = None,
) -> Candidate:
    """A history estimate that meets ``accuracy`` if the BLUE-to-repeat segment holds one.

    Args:
        blue: the BLUE of the query over the whole history.
        repeats: estimates from the rows that measured the query itself, one by one or pooled
            (:meth:`~proxy.engine.estimator.HistoryIndex.repeats`).
        accuracy: the half-width and confidence asked for.
        tail: how error tails are computed.
        variance: ``blue.variance``, if the caller has it (a BLUE over every row derives its
            scales each time they are read).
        terms: ``error_terms(blue)``, if the caller has them (sorted once).

    Returns:
        The narrower of the BLUE and the best repeat estimate (ties keep the BLUE) if it meets
        ``accuracy`` (see :func:`meets`); otherwise a mixture ``(1 - lam) repeat + lam BLUE``
        that does, if the search finds one; otherwise that narrower end, which misses.

    >>> from proxy.engine.estimator import HistoryIndex
    >>> from sqlmap.vector import LinearQuery
    >>> index = HistoryIndex(2)  # x0 + x1, then x0 and x1 alone
    >>> for row, alpha in (([1.0, 1.0], 0.07), ([1.0, 0.0], 0.05), ([0.0, 1.0], 0.05)):
    ...     _ = index.append(LinearQuery.from_dense(row), alpha=alpha, step=1 / 1024)
    >>> q = LinearQuery.from_dense([1.0, 1.0])
    >>> blue, repeats = index.solve(q), index.repeats(q)
    >>> [round(interval(e, 0.5).half_width, 2) for e in (blue, *repeats)]  # BLUE, x0 + x1 alone
    [10.09, 9.9]
    >>> [choose(blue, repeats, AccuracyRequest(eps, 0.5)).basis for eps in (10, 9.7, 9)]
    ['repeat', 'mixture', 'repeat']
    """
    delta = accuracy.delta
    best = interval(blue, delta, tail)
    repeats = [r for r in repeats if not r.same_as(blue)]  # (a pooled one often is the BLUE)
    reach = bool(repeats) and not out_of_reach(
        blue.variance if variance is None else variance, accuracy
    )
    anchor = _best_repeat(repeats, best, accuracy, tail, reach) if repeats else None
    if anchor is None:
        return meets(best, accuracy.eps, delta, tail) or best
    if anchor.half_width < best.half_width:
        best = anchor
    enough = meets(best, accuracy.eps, delta, tail)
    if enough is not None or not reach:
        return enough or best

    held = blue.with_weights()  # read at every step of the search

    def mixture(lam: float) -> Solution:
        return combine([(1.0 - lam, anchor.estimator), (lam, held)])

    order: IntArray | None = None  # the mixture's terms in order at the last lam tried
    rows = anchor.estimator.rows

    def miss(lam: float) -> float:
        nonlocal order, terms
        x = accuracy.eps
        parts = _mixture_parts(anchor.estimator, held, lam)
        if parts is not None and isinstance(tail, ExactTail):
            # the BLUE's terms times lam, the anchor's rows out and back with their own
            # scales: no sort, and the BLUE's power sums serve every lam
            own, shift = parts
            if terms is None:
                terms = error_terms(blue)
            found = tail.amended_tail(
                terms, lam, held.scales[rows], np.abs(own) / anchor.estimator.precisions, x - shift
            )
            if found is not None:
                return found + TAIL_SLACK
        scales: Scales
        mixed = _mixture_terms(anchor.estimator, held, lam, order)
        if mixed is None:
            estimate = mixture(lam)
            scales, shift = estimate.scales, estimate.shift
        else:
            scales, shift, order = mixed
        return tail.tail(scales, x - shift) + TAIL_SLACK

    lam = _descend(miss, delta)
    if lam is None:
        return best
    return meets(interval(mixture(lam), delta, tail, "mixture"), accuracy.eps, delta, tail) or best


def _mixture_terms(
    anchor: Solution, blue: Solution, lam: float, order: IntArray | None = None
) -> tuple[Runs, float, IntArray] | None:
    """The error terms and shift of ``combine([(1 - lam, anchor), (lam, blue)])``, to the bit.

    ``blue`` weighs every row, a class of rows alike (:attr:`Solution.columns`); the mixture
    weighs its rows as ``blue`` does but for the anchor's few, so its runs are the classes'
    (``lam`` times the BLUE's scale), the anchor's rows taken out of their classes and put
    back with their own scales: the runs of every row's scale without sorting every row. The
    shift is summed row by row as :class:`~proxy.engine.estimator.Solution` sums it. None
    unless ``blue`` has classes and weighs the anchor's rows (:func:`combine` then differs).

    ``order`` sorted these terms at another ``lam`` (returned with them): the classes keep
    their order as ``lam`` scales them all, but for rounding, so it is tried first
    (:meth:`~proxy.engine.tails.Runs.of_counted_near`).
    """
    parts = _mixture_parts(anchor, blue, lam)
    if parts is None:
        return None
    own, shift = parts
    columns, rows, weights, precisions = blue.columns, anchor.rows, blue.weights, blue.precisions
    assert columns is not None  # (as _mixture_parts found)
    first = columns.first
    runs, order = Runs.of_counted_near(
        np.concatenate(
            [
                np.abs(lam * weights[first]) / precisions[first],
                np.abs(lam * weights[rows]) / precisions[rows],  # out of their classes
                np.abs(own) / anchor.precisions,
            ]
        ),
        np.concatenate([columns.counts, np.full(rows.size, -1.0), np.ones(rows.size)]),
        order,
    )
    return runs, shift, order


def _mixture_parts(anchor: Solution, blue: Solution, lam: float) -> tuple[FloatArray, float] | None:
    """The mixture's weights on the anchor's rows, and its shift, to the bit.

    Those of ``combine([(1 - lam, anchor), (lam, blue)])``; None where :func:`_mixture_terms`
    is.
    """
    columns, rows, n = blue.columns, anchor.rows, blue.rows.size
    if columns is None or n == 0 or blue.rows[-1] != n - 1 or (rows.size and rows[-1] >= n):
        return None
    weights = blue.weights
    # as combine adds them: the anchor's part into zeros, then the BLUE's
    own = ((1.0 - lam) * anchor.weights + 0.0) + lam * weights[rows]
    summed = lam * weights
    summed[rows] = own
    steps = blue.steps.copy()
    steps[rows] = anchor.steps
    keep = summed != 0
    if not keep.all():
        summed, steps = summed[keep], steps[keep]
    return own, float(np.abs(summed) @ steps)


def out_of_reach(variance: float, accuracy: AccuracyRequest) -> bool:
    """Whether no unbiased estimate can meet ``accuracy``, judged from the BLUE's ``variance``.

    Every unbiased estimate has at least the BLUE's variance ``sigma^2``, and the ``1 - delta``
    quantile of a sum of Laplace noises is at least about ``r sigma`` with ``r`` the lesser of
    the normal ``z_{1-delta/2}`` and the single Laplace's ``ln(1/delta) / sqrt 2`` (sums between
    the two shapes dip up to 0.5% below near ``delta = 0.09``; a 10% margin covers that). Past
    that, the segment search cannot succeed, so it is not run: an error here only forgoes a
    saving.
    """
    delta = accuracy.delta
    ratio = min(NormalDist().inv_cdf(1.0 - delta / 2.0), math.log(1.0 / delta) / math.sqrt(2.0))
    return _SHAPE_MARGIN * ratio * math.sqrt(variance) > accuracy.eps


def _descend(miss: Callable[[float], float], target: float) -> float | None:
    """A ``lam`` in (0, 1) with ``miss(lam) <= target``, by golden-section descent; else None.

    Stops at the first point that meets the target; otherwise narrows the bracket around the
    least miss for a fixed number of steps (the miss is taken to be unimodal in ``lam``; if it
    is not, the search may only miss a saving, never misjudge one).
    """
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    low, high = 0.0, 1.0
    a, b = high - ratio * (high - low), low + ratio * (high - low)
    miss_a, miss_b = miss(a), miss(b)
    for _ in range(_SEGMENT_STEPS):
        if min(miss_a, miss_b) <= target:
            return a if miss_a <= miss_b else b
        if miss_a <= miss_b:
            high, b, miss_b = b, a, miss_a
            a = high - ratio * (high - low)
            miss_a = miss(a)
        else:
            low, a, miss_a = a, b, miss_b
            b = low + ratio * (high - low)
            miss_b = miss(b)
    if min(miss_a, miss_b) <= target:
        return a if miss_a <= miss_b else b
    return None


def meets(
    candidate: Candidate, eps: float, delta: float, tail: TailMethod = EXACT
) -> Candidate | None:
    """``candidate`` if its interval fits in ``+-eps`` at ``1 - delta`` (clipped to it), else None.

    A half-width at most ``eps`` passes, with a relative slack of 1e-12 for rounding in ``t`` (a
    BLUE's weight on a repeated row is 1 only to ~1e-16). A sum's half-width comes from a
    quantile search accurate to ~1e-12 relative, so one just above ``eps`` is settled by the
    tail at ``eps`` itself: the criterion a combined answer was bought to meet, so its repeat
    from the same rows stays free.
    """
    if candidate.half_width <= eps * (1 + 1e-12):
        return candidate
    estimator = candidate.estimator
    if estimator.terms > 1 and candidate.half_width <= eps * (1 + _QUANTILE_ROUNDING):
        miss = tail.tail(estimator.scales, eps - estimator.shift) + TAIL_SLACK
        if miss <= delta:
            return Candidate(estimator, eps, 1.0 - miss, candidate.basis)
    return None
