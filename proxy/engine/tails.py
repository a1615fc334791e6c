"""Tail probabilities of a weighted sum of independent Laplace noises, and their quantiles.

The error of a linear estimate ``t . y`` is ``X = sum_k t_k N_k`` with ``N_k ~ Lap(S_k/alpha_k)``,
i.e. ``X = sum_k b_k L_k`` for standard Laplace ``L_k`` and scales ``b_k = |t_k| S_k / alpha_k``
(signs do not matter: Laplace noise is symmetric). Everything here answers
``P(|X| > x)`` for such a scale vector, behind one interface (:class:`TailMethod`):

* :class:`ExactTail`: closed forms for one or two terms and for one term dominating the rest
  (:func:`dominant_tail`), otherwise numerical inversion of the characteristic function
  ``phi(s) = prod_k 1 / (1 + b_k^2 s^2)`` (Gil-Pelaez, evaluated with Davies' midpoint rule and
  explicit bounds on the aliasing and truncation errors).
* :class:`MonteCarloTail`: the papers' Algorithm 1 (reference only).
* :class:`ConvolutionTail`: the papers' Algorithm 2, "PC", binned convolution (reference only).

The naive partial-fraction mixture for distinct scales cancels catastrophically when scales are
many or nearly equal, so the tails use it for at most two terms, in a rearranged stable form;
for up to sixteen it gives a closed-form lower bound with its rounding bounded term by term
(:func:`tail_lower_bound`), where a bound settles a comparison (a pooled repeat's width).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeAlias

import numpy as np
import numpy.typing as npt
from scipy import fft, optimize

__all__ = [
    "TailMethod",
    "ExactTail",
    "ScaledTails",
    "MonteCarloTail",
    "ConvolutionTail",
    "EXACT",
    "laplace_sum_tail",
    "quantile",
    "discrete_laplace_tail",
    "dominant_tail",
    "distinct_tail",
    "tail_lower_bound",
    "tail_extent",
    "Runs",
    "error_terms",
    "Scales",
]

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.intp]

# Numerical inversion targets an absolute error of 2e-13 (aliasing + truncation), so tails down
# to 1e-9 are right to ~1e-4 relative; round-off in the node sum is ~1e-15.
_ALIAS_TOL = 1e-13
_TRUNC_TOL = 1e-13
# A sum's tails with one more term at many scales share one node set up to this many nodes
# (:meth:`ExactTail.scaled`); past it each tail's own nodes are cheaper.
_SHARED_NODES = 2000
# Terms whose scale times the largest node frequency is below this go through a power series in
# s^2 (cost independent of their number); the series ratio is then <= 0.25.
_SERIES_RADIUS = 0.5
_SERIES_TERMS = 30
# A polynomial in the series at this many points at most takes a table of powers (a Chernoff
# grid), at more Horner's rule (nodes); 19 against 47 us at 40 points, even at 250.
_POWER_TABLE = 128
# A series split computed for one evaluation serves later ones whose own split is at most this
# many runs earlier (those runs are then summed exactly).
_REUSE = 256
# A sum of at most this many distinct scales has its tail in closed form (:func:`distinct_tail`).
_FEW_TERMS = 16
# A repeated scale's copies are shrunk apart by this factor, one after another, to bound the
# tail from below in closed form (:func:`tail_lower_bound`).
_SHRINK = 0.99
# The unit roundoff of a float: rounding errs by at most this relative amount.
_UNIT_ROUNDOFF = 2.0**-53
# Binned convolution: a kernel this short is convolved directly, longer ones through the FFT.
_DIRECT_CONVOLUTION = 64
# Newton's method on a batch of quantiles: steps at most, and the relative step that settles a
# root (its next step would be far below brentq's 1e-12 in the one-at-a-time path).
_NEWTON_STEPS = 60
_NEWTON_RTOL = 1e-13
# How far a batch's tails summed row by row may be from each row's own (:func:`_rough_tails`):
# a bracket's ends are settled by them when farther than this from delta.
_ROUGH_TAIL = 1e-9
# Chernoff parameters lambda * b_max tried when bounding how far the distribution extends.
_CHERNOFF_GRID = np.geomspace(1e-4, 0.999, 40)


class TailMethod(Protocol):
    """Something that computes ``P(|sum_k b_k L_k| > x)`` for standard Laplace ``L_k``."""

    def tail(self, scales: Scales, x: float) -> float:
        """The probability that the weighted sum exceeds ``x`` in absolute value."""
        ...

    def quantile(self, scales: Scales, delta: float) -> float:
        """The least ``x`` whose tail is at most ``delta``."""
        ...


class Runs:
    """Positive scales sorted in decreasing order, as runs of equal values with their counts.

    Neighbouring runs are apart, except in :meth:`joined` runs (equal ones are then summed as
    two runs: the same terms).

    Built once per tail or quantile and shared by every evaluation of ``phi`` it needs:
    equal neighbouring scales (rows of one vector bought at one budget) are taken once with
    their count, and the power sums of the small terms (:func:`_sum_log1p`) are kept per split.
    """

    __slots__ = (
        "values",
        "counts",
        "size",
        "_power_sums",
        "_offset",
        "_shared_from",
        "_chernoff",
        "_suffix",
        "_scaled",
    )

    def __init__(
        self,
        values: FloatArray,
        counts: FloatArray,
        power_sums: dict[int, FloatArray] | None = None,
        offset: int = 0,
    ) -> None:
        self.values = values
        self.counts = counts
        self.size = int(counts.sum())
        # power sums by split, the split counted from ``offset`` runs before these: shared
        # with the runs this one was cut from
        self._power_sums: dict[int, FloatArray] = {} if power_sums is None else power_sums
        self._offset = offset
        # splits before this one hold runs the shared power sums do not (:meth:`joined`)
        self._shared_from = 0
        self._chernoff: tuple[FloatArray, FloatArray] | None = None
        # the moments of every suffix (:meth:`moments`), found once
        self._suffix: tuple[FloatArray, FloatArray] | None = None
        # (runs, factor, where one more term stands or -1): these are ``factor`` times those
        # with that term, whose moments serve (:meth:`joined`)
        self._scaled: tuple[Runs, float, int] | None = None

    @classmethod
    def of(cls, scales: npt.ArrayLike) -> Runs:
        """The runs of ``scales`` (absolute values; zeros dropped)."""
        b = np.abs(np.asarray(scales, dtype=np.float64).ravel())
        if not np.all(np.isfinite(b)):
            raise ValueError("scales must be finite")
        b = np.sort(b[b > 0])[::-1]
        if b.size == 0:
            return cls(b, np.zeros(0))
        starts = np.concatenate([[0], np.flatnonzero(b[1:] != b[:-1]) + 1])
        return cls(b[starts], np.diff(np.append(starts, b.size)).astype(np.float64))

    @classmethod
    def of_counted(cls, values: FloatArray, counts: FloatArray) -> Runs:
        """The runs of ``values[k]`` taken ``counts[k]`` times (what :meth:`of` gives then).

        A negative count takes copies away from the other entries of its value; a value left
        with none has no run.
        """
        positive = values > 0
        # equal values are merged, their counts (whole numbers) summed exactly in any order:
        # the unstable sort serves, 4x faster than the stable one on 9,000 classes of rows
        order = np.argsort(-values[positive])
        return cls._of_sorted(values[positive][order], counts[positive][order])

    @classmethod
    def of_counted_near(
        cls, values: FloatArray, counts: FloatArray, order: IntArray | None
    ) -> tuple[Runs, IntArray]:
        """What :meth:`of_counted` gives, and the permutation that sorts ``values`` decreasing.

        ``order`` is tried first: one that sorted like values (the same classes at a nearby
        mixture weight, :func:`proxy.engine.selection.choose`), whose order rounding and a few
        entries alone change. Checked as it stands, else fixed by the stable sort, which runs
        in linear time on an array sorted but for a few entries: ~20-60 us against the ~300 of
        a fresh sort of 9,000 classes. Either way the values come out sorted, so the runs are
        :meth:`of_counted`'s to the bit.
        """
        if order is None:
            order = np.argsort(-values)
        b = values[order]
        if not np.all(b[1:] <= b[:-1]):
            order = order[np.argsort(-b, kind="stable")]
            b = values[order]
        positive = b > 0  # (zeros last)
        return cls._of_sorted(b[positive], counts[order][positive]), order

    @classmethod
    def _of_sorted(cls, b: FloatArray, c: FloatArray) -> Runs:
        """The runs of positive values ``b`` in decreasing order, taken ``c`` times each."""
        if b.size == 0:
            return cls(b, np.zeros(0))
        starts = np.concatenate([[0], np.flatnonzero(b[1:] != b[:-1]) + 1])
        b, c = b[starts], np.add.reduceat(c, starts)
        if np.any(c <= 0):
            b, c = b[c > 0], c[c > 0]
        return cls(b, c)

    def joined(self, factor: float, top: float) -> Runs | None:
        """``factor`` times these scales with one more, ``top``.

        What :meth:`of` gives for ``np.append(factor * scales, top)`` (scaling keeps the order),
        without sorting again, and sharing these runs' power sums: they are ratios of scales,
        which a common factor leaves as they are, to rounding. A history estimate weighed
        against a fresh measurement is this at every budget tried
        (:func:`proxy.engine.decision.decide`). Runs that the factor rounds together, or that
        ``top`` equals, are left apart (:meth:`of` would merge them): the terms and their sums
        are the same, and the runs still line up with these (a third of the budgets tried on
        the wide cube's history rounded two of its 9,000 runs together, and sorted all its
        rows again). None unless the factor keeps every run positive.
        """
        if self.values.size == 0 or not (factor > 0.0 and 0.0 < top < math.inf):
            return None
        values = factor * self.values
        if values[-1] <= 0.0:
            return None
        at = int(np.count_nonzero(values > top))  # decreasing: ``top`` goes after these
        joined = Runs(
            np.concatenate([values[:at], [top], values[at:]]),
            np.concatenate([self.counts[:at], [1.0], self.counts[at:]]),
            self._power_sums,
            self._offset - 1,
        )
        # a split at or before ``top`` counts it among the series' terms, and those before it
        # one place off: such sums are its own, neither read nor kept in the shared ones
        joined._shared_from = max(at, self._shared_from) + 1
        if self._scaled is None:
            joined._scaled = (self, factor, at)
        return joined

    def expanded(self) -> FloatArray:
        """Every scale, in decreasing order."""
        return np.repeat(self.values, self.counts.astype(np.int64))

    def largest(self, k: int) -> FloatArray:
        """The ``k`` largest scales (with repeats)."""
        top = min(k, self.values.size)
        copies = np.minimum(self.counts[:top], k).astype(np.int64)  # a run's first k suffice
        return np.repeat(self.values[:top], copies)[:k]

    def rest(self) -> Runs:
        """The scales without one copy of the largest."""
        if self.counts[0] > 1:
            counts = self.counts.copy()
            counts[0] -= 1
            return Runs(self.values, counts)
        rest = Runs(self.values[1:], self.counts[1:], self._power_sums, self._offset + 1)
        rest._shared_from = max(0, self._shared_from - 1)
        if self._suffix is not None:  # the suffixes of the rest are these but the whole
            rest._suffix = (self._suffix[0][:-1], self._suffix[1][:-1])
        if self._scaled is not None and self._scaled[2] == 0:  # the joined term was the largest
            rest._scaled = (self._scaled[0], self._scaled[1], -1)
        return rest

    def series(self, split: int) -> tuple[int, FloatArray]:
        """A split at or after ``split`` (at most ``_REUSE`` runs later) and its power sums.

        The terms before the split are summed exactly, those after it as a series
        (:func:`_sum_log1p`); any split past the least one that converges will do, so one
        computed for a larger ``s`` serves the evaluations at smaller ones.
        """
        known = [
            at - self._offset
            for at in self._power_sums
            if 0 <= at - self._offset - split <= _REUSE
            and self._shared_from <= at - self._offset < self.values.size
        ]
        if known:
            split = min(known)
            return split, self._power_sums[split + self._offset]
        sums = self._compute_power_sums(split)
        if split >= self._shared_from:
            self._power_sums[split + self._offset] = sums
        return split, sums

    def _compute_power_sums(self, split: int) -> FloatArray:
        """``P_r = sum_{k >= split} c_k (b_k / b_split)^{2r}``, ``r = 1 .. _SERIES_TERMS``.

        The series scales ``P_r`` by ``(b_split s)^{2r} <= 4^-r``, so a term counts at order
        ``r`` only while ``c_max (b_k / b_split)^{2r} 4^-r >= 1e-20`` (all it would add past
        that is below 1.4e-20): as ``b`` decreases, each order sums a prefix of the terms, and
        the last few are taken at every remaining order at once.
        """
        z = np.square(self.values[split:] / self.values[split])
        counts = self.counts[split:]
        powers = z * counts
        sums = np.zeros(_SERIES_TERMS)
        sums[0] = powers.sum()
        orders = np.arange(2, _SERIES_TERMS + 1)
        least = 4.0 * (1e-20 / float(counts.max())) ** (1.0 / orders)  # the z that still count
        counting = np.searchsorted(-z, -least, "right")
        for r in range(1, _SERIES_TERMS):
            n = int(counting[r - 1])  # the terms that count at order r + 1
            if n <= 64:
                higher = powers[:n, None] * np.power.outer(z[:n], orders[: _SERIES_TERMS - r] - 1)
                sums[r:] = higher.sum(axis=0)
                break
            powers[:n] *= z[:n]
            sums[r] = powers[:n].sum()
        return sums

    def moments(self, split: int) -> tuple[float, float]:
        """``sum_{k >= split} c_k b_k^2`` and ``sum_{k >= split} c_k b_k^4``.

        Summed one term after another from the smallest (``cumsum`` adds in order), so each
        is the same to the bit whichever split asks, and every split's sums are found at once.
        Runs joined to one more term (:meth:`joined`) take theirs from the runs they scale: a
        combined decision tries six budgets or so, each new runs of 9,000 on the wide cube.
        """
        if split >= self.values.size:
            return 0.0, 0.0
        if self._scaled is not None:
            runs, factor, at = self._scaled
            square = factor * factor
            if 0 <= at < split:  # the joined term lies before the split: those after are
                second, fourth = runs.moments(split - 1)  # these runs one place on
                return square * second, square * square * fourth
            second, fourth = runs.moments(split)
            if at < 0:
                return square * second, square * square * fourth
            top = float(self.values[at]) ** 2
            return square * second + top, square * square * fourth + top * top
        if self._suffix is None:
            squares = np.square(self.values[::-1])  # small terms first
            counts = self.counts[::-1]
            self._suffix = (np.cumsum(counts * squares), np.cumsum(counts * np.square(squares)))
        at = self.values.size - 1 - split
        return float(self._suffix[0][at]), float(self._suffix[1][at])

    def chernoff(self) -> tuple[FloatArray, FloatArray]:
        """``lambda`` over the Chernoff grid and ``log E exp(lambda X)`` at each."""
        if self._chernoff is None:
            lam = _CHERNOFF_GRID / self.values[0]
            self._chernoff = (lam, -_sum_log1p(self, lam, -1.0))
        return self._chernoff


# an error's scales: an array, or sorted into runs once for many tails (:func:`error_terms`)
Scales: TypeAlias = FloatArray | Runs


def _positive_scales(scales: npt.ArrayLike | Runs) -> Runs:
    return scales if isinstance(scales, Runs) else Runs.of(scales)


def error_terms(scales: npt.ArrayLike, counts: FloatArray | None = None) -> Runs:
    """``scales`` sorted into runs once, to serve many tails and quantiles of them.

    ``counts``: ``scales[k]`` stands for ``counts[k]`` equal terms (classes of history rows),
    so that only the classes are sorted. The runs are what the arrays would give.
    """
    if counts is None:
        return Runs.of(scales)
    values = np.abs(np.asarray(scales, dtype=np.float64))
    if not np.all(np.isfinite(values)):
        raise ValueError("scales must be finite")
    return Runs.of_counted(values, counts)


def tail_extent(scales: npt.ArrayLike | Runs, tol: float) -> float:
    """A distance ``a`` with ``P(|X| > a) <= tol``, from the Chernoff bound.

    ``P(|X| >= a) <= 2 exp(-lambda a) prod_k 1/(1 - b_k^2 lambda^2)`` for
    ``0 < lambda < 1/max b``; the best of a grid of ``lambda`` is taken.

    >>> a = tail_extent([1.0], 1e-6)  # one term: the exact tail is exp(-a)
    >>> math.exp(-a) <= 1e-6 < math.exp(-a / 2)
    True
    """
    b = _positive_scales(scales)
    if b.size == 0:
        return 0.0
    return _chernoff_extent(*b.chernoff(), tol)


def _chernoff_extent(lam: FloatArray, log_mgf: FloatArray, tol: float) -> float:
    """:func:`tail_extent` from the log-MGF at a grid of ``lambda``."""
    return float(np.min((math.log(2.0 / tol) + log_mgf) / lam))


def _log_mgf(b: Runs, s: float) -> float:
    """``log E exp(s R) = -sum_k log(1 - b_k^2 s^2)`` for ``R = sum_k b_k L_k``, ``s b_k < 1``."""
    return float(-_sum_log1p(b, np.array([s]), -1.0)[0])


def _second(b: Runs) -> float:
    """The second largest scale (the largest again if it repeats)."""
    return float(b.values[0] if b.counts[0] > 1 else b.values[1])


def _may_dominate(b: Runs, x: float, tol: float) -> bool:
    """A cheap necessary condition for :func:`_dominant_error` at ``x`` to be at most ``tol``.

    The bound is ``exp(-s x) E exp(s R)`` for some ``s < 1/b_2``; since ``-log(1 - z) >= z``
    it is at least ``exp(-s x + s^2 sum_{k>1} b_k^2)`` and so at least ``exp(-x / b_2)`` and
    ``exp(-x^2 / (4 sum_{k>1} b_k^2))``: both must be below ``tol``.
    """
    return _dominance_possible(x, _second(b), b.rest().moments(0)[0], tol)


def _dominance_possible(x: float, second: float, rest_square: float, tol: float) -> bool:
    """:func:`_may_dominate` from the second largest scale and the others' sum of squares."""
    need = math.log(1.0 / tol)
    return x >= need * second and x * x >= 4.0 * need * rest_square


def _dominant_error(b: Runs, x: float) -> float:
    """A bound on how far :func:`dominant_tail`'s closed form exceeds the tail at ``x``.

    The excess is ``2 E[(cosh(z) - 1) 1{z < 0}]`` with ``z = (x - R) / b_1``, at most
    ``E[exp((R - x) / b_1) 1{R > x}] <= exp(-s x) E exp(s R)`` for every ``s`` in
    ``[1/b_1, 1/b_2)`` (a Chernoff bound); the best ``s`` of a grid is taken.
    """
    rest = b.rest()
    second = float(rest.values[0])
    low = second / float(b.values[0])
    if low >= _CHERNOFF_GRID[-1]:
        return math.inf
    s = _geometric(low, float(_CHERNOFF_GRID[-1]), 24) / second
    log_bound = -s * x - _sum_log1p(rest, s, -1.0)
    return float(np.exp(np.min(log_bound)))


def _separated(b: Runs) -> bool:
    """Whether the largest scale stands clear of the next, as the closed form needs.

    Scales equal up to rounding would put ``log(1 - (b_2/b_1)^2)`` at ``-inf``.
    """
    return bool(_second(b) < b.values[0] * (1.0 - 1e-9))


def dominant_tail(scales: npt.ArrayLike | Runs, x: float) -> tuple[float, float]:
    """``P(|b_1 L_1 + R| > x)`` as a closed form in the largest scale, and that form's error.

    With ``G`` the tail of ``b_1 L_1`` and ``x > 0``, ``2 P(b_1 L_1 + R > x) = 2 E G(x - R)``
    equals ``E exp(-(x - R) / b_1) = exp(-x / b_1) prod_{k>1} 1 / (1 - b_k^2 / b_1^2)`` except
    where ``R > x``. The closed form is therefore an upper bound, and the second value bounds
    how much it exceeds the tail (:func:`_dominant_error`): negligible when the other terms are
    small against ``x``, which is just when the midpoint rule needs the most nodes (the
    characteristic function then decays like one term's, as ``1/s^2``, for a long way).

    >>> value, error = dominant_tail([2.0, 0.01, 0.01], 2.0 * math.log(20))
    >>> round(value, 9), error < 1e-100
    (0.0500025, True)
    """
    b = _positive_scales(scales)
    if b.size < 2 or not x > 0:
        raise ValueError("a dominant term needs another term and a positive threshold")
    top = float(b.values[0])
    value = math.exp(-x / top + _log_mgf(b.rest(), 1.0 / top)) if _separated(b) else math.inf
    return min(1.0, value), _dominant_error(b, x)


def distinct_tail(b: Runs, x: float) -> tuple[float, float] | None:
    """``P(|X| > x)`` for a few distinct scales by partial fractions, and a bound on its error.

    ``phi(s) = prod_k 1 / (1 + b_k^2 s^2) = sum_k c_k / (1 + b_k^2 s^2)`` with
    ``c_k = prod_{j != k} 1 / (1 - (b_j / b_k)^2)``: the law is a signed mixture of the single
    Laplace laws, and the tail ``sum_k c_k e^{-x / b_k}``. The weights alternate in sign and
    grow as scales near each other, so the rounding is bounded term by term: a factor
    ``1 / (1 - z)`` errs by ``3 u z / |1 - z| + 2 u`` relative (``u``: the unit roundoff), the
    exponential by ``u x / b_k + 2 u``, the product by ``u`` (and either, if subnormal, by the
    least subnormal), the correctly rounded sum by ``u`` of itself; the bound is twice that
    first-order sum. A few dozen microseconds where inverting ``phi`` takes a few hundred (a
    few terms decay slowly: thousands of nodes).
    None for more than ``_FEW_TERMS`` terms, a repeated scale, or ``x <= 0``.

    >>> value, error = distinct_tail(Runs.of([2.0, 1.0]), 3.0)
    >>> round(value, 12) == round(_two_term_tail(2.0, 1.0, 3.0), 12), error < 1e-15
    (True, True)
    """
    if not x > 0.0 or b.size > _FEW_TERMS or b.values.size != b.size:
        return None
    u, tiny = _UNIT_ROUNDOFF, 5e-324
    scales = b.values.tolist()
    terms, errors = [], []
    for k, top in enumerate(scales):
        weight, relative = 1.0, 0.0
        for j, other in enumerate(scales):
            if j != k:
                ratio = other / top
                z = ratio * ratio
                rest = 1.0 - z
                if rest == 0.0:
                    return None
                weight /= rest
                relative += 3.0 * u * z / abs(rest) + 2.0 * u
        term = weight * math.exp(-x / top)
        terms.append(term)
        # (a subnormal exponential or product errs by up to the least subnormal: absolutely)
        errors.append(abs(term) * (relative + u * x / top + 3.0 * u) + (abs(weight) + 1.0) * tiny)
    if max(errors, default=0.0) > 1e-6:  # (only first-order terms are counted)
        return None
    value = math.fsum(terms)
    return min(1.0, max(0.0, value)), 2.0 * (math.fsum(errors) + u * abs(value))


def tail_lower_bound(b: Runs, x: float) -> float | None:
    """A lower bound on ``P(|X| > x)`` in closed form for a few terms; None for more.

    The copies of a repeated scale are shrunk apart (the ``k``-th by ``_SHRINK^k``): a smaller
    scale makes a term more peaked, and so the sum (Birnbaum: independent symmetric unimodal
    terms), which lowers the tail; the distinct scales' tail (:func:`distinct_tail`) less its
    rounding bound is then below the exact one (the distinct terms' own, to the bound).

    >>> exact = ExactTail().tail(np.array([2.0, 1.0, 1.0]), 3.0)
    >>> bound = tail_lower_bound(Runs.of([2.0, 1.0, 1.0]), 3.0)
    >>> bound is not None and 0.99 * exact < bound < exact
    True
    """
    if b.size > _FEW_TERMS:
        return None
    runs = b
    if b.values.size != b.size:
        copies = b.counts.astype(np.int64)
        shrunk = np.repeat(b.values, copies) * _SHRINK ** _copy_numbers(copies)
        runs = Runs.of(shrunk)
    found = distinct_tail(runs, x)
    return None if found is None else found[0] - found[1]


def _copy_numbers(copies: npt.NDArray[np.int64]) -> FloatArray:
    """``0, 1, .., c - 1`` for each count ``c``, one after another."""
    starts = np.repeat(np.cumsum(copies) - copies, copies)
    numbers: FloatArray = (np.arange(int(copies.sum())) - starts).astype(np.float64)
    return numbers


def _two_term_tail(b1: float, b2: float, x: float) -> float:
    """``P(|b1 L1 + b2 L2| > x)`` for ``b1 >= b2``, also for equal or near-equal scales.

    The partial fractions give ``(b1^2 e^{-x/b1} - b2^2 e^{-x/b2}) / (b1^2 - b2^2)``
    ``= e^{-x/b1} + b2^2 (e^{-x/b1} - e^{-x/b2}) / ((b1 - b2)(b1 + b2))``; the difference of
    exponentials over ``b1 - b2`` is taken through ``expm1`` when the scales are close.
    """
    e1 = math.exp(-x / b1)
    e2 = math.exp(-x / b2)
    d = b1 - b2
    exponent = x * d / (b1 * b2)  # x/b2 - x/b1 >= 0
    if d == 0:
        difference = e2 * x / (b1 * b2)  # the limit: a derivative in b
    elif exponent < 1:
        difference = e2 * math.expm1(exponent) / d
    else:
        difference = (e1 - e2) / d
    return e1 + b2 * b2 * difference / (b1 + b2)


def _sum_log1p(runs: Runs, s: FloatArray, sign: float) -> FloatArray:
    """``sum_k log(1 + sign (b_k s)^2)`` at each ``s`` (ascending; ``b_k s < 1`` if ``sign < 0``).

    Terms with ``b_k max(s) <= 1/2`` are summed as the power series
    ``-sum_r (-sign)^r p_r (s / max s)^{2r} / r`` with ``p_r = sum_k (b_k max s)^{2r}``,
    whose truncation error is below ``count * 0.25^31``: the cost then no longer grows with the
    number of small terms, which is most of them for a BLUE spread over a large history.
    """
    b, counts = runs.values, runs.counts
    s_max = float(s[-1])
    split = _count_large(b, s_max)
    if split < b.size:
        split, sums = runs.series(split)
        orders = np.arange(1, _SERIES_TERMS + 1)
        ratio = float(b[split]) * s_max
        power_sums = sums * (ratio * ratio) ** orders
        coefficients = -((-sign) ** orders) * power_sums / orders
        out = _polynomial(np.square(s / s_max), coefficients)  # u <= 1
    else:
        out = np.zeros_like(s)
    for start in range(0, split, 64):  # bounded memory: 64 terms x nodes at a time
        chunk = slice(start, min(start + 64, split))
        out += _log1p_squares(s, b[chunk], sign) @ counts[chunk]
    return out


def _log1p_squares(s: FloatArray, b: FloatArray, sign: float) -> FloatArray:
    """``log(1 + sign (s_j b_k)^2)`` for each node ``s_j`` (rows) and scale ``b_k`` (columns).

    In place in one array: these are most of an exact tail's arithmetic (250 nodes by 30
    terms in a combined decision's), and fresh arrays for each step cost a tenth more.
    """
    z = s[:, None] * b
    z *= z
    if sign < 0.0:  # sign is +-1: negation is exact
        np.negative(z, out=z)
    out: FloatArray = np.log1p(z, out=z)
    return out


def _count_large(values: FloatArray, s_max: float) -> int:
    """``count_nonzero(values * s_max > _SERIES_RADIUS)`` for decreasing ``values``, bisecting.

    The products decrease too, so those that exceed the radius come first: 14 of them looked
    at for 9,000 runs rather than all.
    """
    low, high = 0, values.size
    while low < high:
        middle = (low + high) // 2
        if values[middle] * s_max > _SERIES_RADIUS:
            low = middle + 1
        else:
            high = middle
    return low


def _polynomial(u: FloatArray, coefficients: FloatArray) -> FloatArray:
    """``sum_r c_r u^r``, ``r = 1 .. _SERIES_TERMS``, by Horner's rule, at each ``u``.

    ``coefficients``: the ``c_r`` along the last axis (a row's ``c`` as Q x 1 x R against
    Q x J ``u``). No table of powers: at a batch's thousands of nodes the table (Q x J x R)
    and its product were 10x the cost of these ``R`` passes. At a Chernoff grid's few dozen
    points it is the other way round: the ``R`` passes are calls rather than arithmetic.
    """
    if coefficients.ndim == 1 and u.size <= _POWER_TABLE:
        # a copy of ``u`` per order (cumprod over a broadcast view is 2.5x slower)
        powers = np.repeat(u[:, None], coefficients.size, axis=1).cumprod(axis=1)
        table: FloatArray = powers @ coefficients
        return table
    # one row's as Python floats (each step a cheaper scalar operation), else each order's
    c = coefficients.tolist() if coefficients.ndim == 1 else list(np.moveaxis(coefficients, -1, 0))
    out: FloatArray = u * c[-1]
    for r in range(len(c) - 2, -1, -1):
        out += c[r]
        out *= u
    return out


def _log_phi_above(b: Runs, s: FloatArray) -> FloatArray:
    """An upper bound on ``log phi(s)`` at each ``s`` (ascending), close where it matters.

    The small terms (``b_k max(s) <= 1/2``) enter through ``log(1 + x) >= x - x^2 / 2``, two
    suffix sums instead of a series; the others exactly. Used only to place the last node,
    which an upper bound on ``phi`` can only move later (more nodes, never fewer).
    """
    values, counts = b.values, b.counts
    s_max = float(s[-1])
    split = _count_large(values, s_max)
    second, fourth = b.moments(split)
    square = np.square(s)
    out: FloatArray = square * second - 0.5 * np.square(square) * fourth
    for start in range(0, split, 64):  # bounded memory: 64 terms x nodes at a time
        chunk = slice(start, min(start + 64, split))
        out += _log1p_squares(s, values[chunk], 1.0) @ counts[chunk]
    return -out


def _log_phi(b: Runs, s: FloatArray) -> FloatArray:
    """``log phi(s) = -sum_k log(1 + b_k^2 s^2)`` at each node ``s`` (ascending)."""
    return -_sum_log1p(b, s, 1.0)


@dataclass(frozen=True, slots=True)
class _Nodes:
    """Midpoint nodes ``s_j`` and ``phi(s_j) / (j + 1/2)``, valid for thresholds in a range."""

    s: FloatArray
    coefficients: FloatArray
    # tails by threshold: a root search evaluates its bracket's ends again, and often its root
    # (a sixth of the evaluations in a quantile of a few terms)
    found: dict[float, float] = field(default_factory=dict, repr=False, compare=False)

    def tail(self, x: float) -> float:
        found = self.found.get(x)
        if found is None:
            # numpy's pairwise sum: its terms are below 2/(2j + 1) in absolute value, so it
            # errs by under (log2 J + 8) u (ln J + 2), 2e-14 at 2,000 nodes (fsum's exact sum
            # cost twice the tail, its list of floats most of that)
            inside = (2.0 / math.pi) * float((np.sin(self.s * x) * self.coefficients).sum())
            found = self.found[x] = min(1.0, max(0.0, 1.0 - inside))
        return found


@dataclass(frozen=True, slots=True)
class ScaledTails:
    """``P(|E + r L| > x)`` for one sum ``E`` and ``r``, ``x`` in ranges (:meth:`ExactTail.scaled`).

    Midpoint nodes ``s_j = (j + 1/2) h`` and ``log phi_E(s_j)``; each tail is
    :class:`_Nodes`' sum with ``phi_E(s_j) / (1 + r^2 s_j^2)``, within the same error bounds
    as :meth:`ExactTail.tail`'s.
    """

    s: FloatArray
    j_half: FloatArray
    log_phi: FloatArray
    r_range: tuple[float, float]
    x_range: tuple[float, float]

    def serves(self, r: float, x: float) -> bool:
        """Whether ``r`` and ``x`` lie in the ranges the nodes were placed for."""
        return self.r_range[0] <= r <= self.r_range[1] and self.x_range[0] <= x <= self.x_range[1]

    def tail(self, r: float, x: float) -> float:
        """``P(|E + r L| > x)``; ``r`` and ``x`` served (:meth:`serves`)."""
        if not self.serves(r, x):
            raise ValueError(f"r = {r}, x = {x} outside the ranges {self.r_range}, {self.x_range}")
        log_terms = self.log_phi - np.log1p(np.square(r * self.s))
        return _Nodes(self.s, np.exp(log_terms) / self.j_half).tail(x)

    def alone(self) -> _Nodes:
        """The nodes of ``E`` alone (``r = 0``), for thresholds in the range; ``r_range`` from 0."""
        if self.r_range[0] != 0.0:
            raise ValueError("nodes placed for E alone need r_range to start at 0")
        return _Nodes(self.s, np.exp(self.log_phi) / self.j_half)


@dataclass(frozen=True, slots=True)
class ExactTail:
    """``P(|X| > x)`` to ~1e-12 absolute: closed forms, else Gil-Pelaez with Davies' midpoint rule.

    For symmetric ``X``, ``P(|X| <= x) = (2/pi) int_0^inf sin(s x) phi(s) / s ds``. The midpoint
    rule with step ``h`` sums that integrand at ``s_j = (j + 1/2) h``; by Poisson summation its
    result is ``sum_n (-1)^n P(|X - 2 pi n / h| < x)``, so with ``2 pi / h >= 2 max(x, a)`` the
    aliasing error is at most ``P(|X| > a)``, which the Chernoff bound makes tiny. The sum is
    stopped at a node where ``(2/pi) h phi(s)/s / sin(h x / 2)`` (an Abel-summation bound on
    everything after it, since ``phi(s)/s`` decreases) is negligible. One node set serves a
    whole range of ``x``, so a quantile costs one evaluation of ``phi``.

    >>> round(ExactTail().tail(np.array([1.0, 1.0, 1.0]), 2.0), 12)
    0.372172028901
    >>> round(ExactTail().quantile(np.array([1.0, 1.0, 1.0]), 0.372172028901), 9)
    2.0
    """

    alias_tol: float = _ALIAS_TOL
    trunc_tol: float = _TRUNC_TOL

    def tail(self, scales: Scales, x: float) -> float:
        """``P(|sum_k b_k L_k| > x)`` for independent standard Laplace ``L_k``."""
        return self._tail(_positive_scales(scales), x)

    def _tail(self, b: Runs, x: float) -> float:
        if x < 0 or (b.size > 0 and x == 0):
            return 1.0
        if b.size == 0:
            return 0.0
        if b.size == 1:
            return math.exp(-x / b.values[0])
        if b.size == 2:
            return min(1.0, _two_term_tail(float(b.values[0]), _second(b), x))
        if _may_dominate(b, x, self.trunc_tol):
            value, error = dominant_tail(b, x)
            if error <= self.trunc_tol:
                return value
        return self._nodes(b, x, x).tail(x)

    def amended_tail(
        self, b: Runs, factor: float, removed: FloatArray, added: FloatArray, x: float
    ) -> float | None:
        """:meth:`tail` of ``factor`` times the scales ``b`` less ``removed``, with ``added``.

        ``removed``: some of ``b``'s scales (each one copy of a run's value, before the
        factor). ``log phi(s) = log phi_b(factor s) + sum_removed log(1 + (factor g s)^2) -
        sum_added log(1 + (f s)^2)``, and likewise the log-MGF of the Chernoff extent and
        the upper bound that places the last node: ``b``'s power sums serve every factor, so
        a mixture search weighing one estimate's terms against a few others at a dozen
        factors (:func:`proxy.engine.selection.choose`) neither sorts the terms nor sums their
        powers again. The nodes are placed by :meth:`_spacing`'s rules on these bounds (an
        upper bound on ``b``'s ``log phi`` with the other terms exact is one on the sum's).

        Terms taken out and put back cancel, so each node's ``log phi`` errs in proportion to
        the parts' magnitudes, not the result's; what that adds to the tail's rounding is
        bounded node by node and must stay below ``1e-14`` (with the node sum's 2e-14, inside
        the gap between the 2e-13 of aliasing and truncation and ``TAIL_SLACK``). None where
        that fails, where one term may dominate (:func:`dominant_tail` may settle it), where
        ``b``'s largest run is all removed (the log-MGF of ``b`` alone would not exist
        there), for two terms or fewer, or ``x <= 0``: the caller then sorts the terms.
        """
        g = factor * removed[removed > 0.0]
        f = added[added > 0.0]
        if not x > 0.0 or b.size - g.size + f.size <= 2:
            return None
        largest = b.largest(16 + g.size)
        keep = np.ones(largest.size, dtype=bool)
        for value in removed.tolist():  # a copy of each removed value out of the largest
            at = np.flatnonzero(keep & (largest == value))
            if at.size:
                keep[at[-1]] = False
        largest = np.sort(np.concatenate([factor * largest[keep], f]))[::-1][:16]
        top = float(largest[0])
        if factor * float(b.values[0]) > top:  # the largest run removed: -log(1 - z) past 1
            return None
        square = factor * factor * b.moments(0)[0] - float(g @ g) + float(f @ f)
        if _dominance_possible(x, float(largest[1]), square - top * top, self.trunc_tol):
            return None

        def others(s: FloatArray, sign: float) -> FloatArray:
            """What the removed and added terms change in ``-sum_k log(1 + sign (b_k s)^2)``."""
            out: FloatArray = _log1p_squares(s, g, sign).sum(axis=1)
            out -= _log1p_squares(s, f, sign).sum(axis=1)
            return out

        lam = _CHERNOFF_GRID / top
        log_mgf = others(lam, -1.0) - _sum_log1p(b, factor * lam, -1.0)
        h, count = self._placed(
            _chernoff_extent(lam, log_mgf, self.alias_tol),
            largest,
            lambda grid: _log_phi_above(b, factor * grid) + others(grid, 1.0),
            x,
            x,
        )
        j_half = np.arange(count, dtype=np.float64) + 0.5
        s = j_half * h
        log_phi_b = _log_phi(b, factor * s)
        gained = _log1p_squares(s, g, 1.0).sum(axis=1)
        lost = _log1p_squares(s, f, 1.0).sum(axis=1)
        coefficients = np.exp(log_phi_b + gained - lost) / j_half
        # b's log phi errs by up to c u of itself (its exact terms 64 to a matrix product,
        # the chunks added one after another, the series by Horner's rule over 30 orders),
        # which is c u (gained - lost) more than the sum's own log phi would; the few terms
        # out and in by a few u of theirs: phi errs by as much relative
        c = 128.0 + b.values.size / 64.0
        excess = (c * _UNIT_ROUNDOFF) * np.maximum(gained - lost, 0.0)
        excess += (4.0 * _UNIT_ROUNDOFF) * (gained + lost)
        if (2.0 / math.pi) * float(coefficients @ excess) > 1e-14:
            return None
        return _Nodes(s, coefficients).tail(x)

    def quantile(self, scales: Scales, delta: float) -> float:
        """The least ``w`` with ``P(|X| > w) <= delta`` (see :func:`quantile`)."""
        b = _positive_scales(scales)
        if b.size <= 2 or not 0 < delta < 1:
            return _root_quantile(lambda w: self._tail(b, w), b, delta)
        dominant = self._dominant_quantile(b, delta)
        if dominant is not None:
            return dominant
        low, high = _bracket(b, delta)
        return self._bracketed_quantile(b, delta, low, high)

    def quantile_and_scaled(
        self,
        b: Runs,
        delta: float,
        r_high: float,
        x_range: tuple[float, float],
        most: int = _SHARED_NODES,
    ) -> tuple[float, ScaledTails | None]:
        """:meth:`quantile` of ``E`` (scales ``b``), and :meth:`scaled` of ``E + r L`` on its nodes.

        One node set for both, ``r`` in ``[0, r_high]`` and ``x`` in ``x_range`` and the
        quantile's bracket: ``log phi_E`` evaluated once where a history estimate that misses
        is then combined with a fresh measurement (:func:`proxy.engine.decision.decide`). The
        nodes hold every tail to the bounds :meth:`_nodes` holds one to (the quantile's own
        nodes are another valid set: the two quantiles agree to rounding). The quantile's own
        nodes and None where there is no such set (a closed form settles the quantile, or it
        would take more than ``most`` nodes).
        """
        if b.size <= 2 or not 0 < delta < 1:
            return self.quantile(b, delta), None
        dominant = self._dominant_quantile(b, delta)
        if dominant is not None:
            return dominant, None
        low, high = _bracket(b, delta)
        x_lo, x_hi = min(low, x_range[0]), max(high, x_range[1])
        shared = self.scaled(b, (0.0, r_high), (x_lo, x_hi), most) if x_lo > 0.0 else None
        if shared is None:
            return self._bracketed_quantile(b, delta, low, high), None
        nodes = shared.alone()
        if nodes.tail(low) <= delta or nodes.tail(high) > delta:
            return self._bracketed_quantile(b, delta, low, high), shared  # rounding straddles
        return _root_quantile(nodes.tail, b, delta, low, high), shared

    def _bracketed_quantile(self, b: Runs, delta: float, low: float, high: float) -> float:
        """The general case of :meth:`quantile`, from a bracket that is right but for rounding."""
        for _ in range(64):  # the bracket is right at once unless rounding straddles an end
            nodes = self._nodes(b, low, high)
            if nodes.tail(low) <= delta:
                low /= 8
            elif nodes.tail(high) > delta:
                high *= 2
            else:
                return _root_quantile(nodes.tail, b, delta, low, high)
        raise ArithmeticError(f"no bracket for the {delta} quantile of {b.size} terms")

    def quantiles(
        self, scales: FloatArray, delta: float, counts: FloatArray | None = None
    ) -> FloatArray:
        """:meth:`quantile` of each row of ``scales`` (sums over the same terms: a GROUP BY).

        Columns equal in every row (history rows measured alike) are taken once with their
        count (``counts``: the caller has merged them, column ``k`` stands for ``counts[k]``
        terms), and ``phi`` is evaluated for all rows at once (:func:`_batch_sum_log1p`, one
        table of power sums per row); each row's dominance test, Chernoff grid, node placement
        and nodes follow :meth:`quantile` step for step, and the roots are found together
        (:func:`_newton_roots`), so the quantiles are its own to rounding. Rows it settles
        otherwise (one or two terms, a dominant term, a bracket that needs widening) go
        through it.

        >>> scales = np.array([[1.0, 1.0, 1.0, 0.5], [3.0, 0.5, 0.5, 0.5]])
        >>> batch = ExactTail().quantiles(scales, 0.05)
        >>> one = [ExactTail().quantile(row, 0.05) for row in scales]
        >>> np.allclose(batch, one, rtol=1e-11, atol=0.0)
        True
        """
        matrix = np.abs(np.asarray(scales, dtype=np.float64))
        if matrix.ndim != 2 or not np.all(np.isfinite(matrix)):
            raise ValueError("scales must be a finite 2-D array")
        if not 0 < delta < 1:
            raise ValueError("delta must lie in (0, 1)")
        out = np.zeros(matrix.shape[0])
        if matrix.size == 0:
            return out
        if counts is None:
            values, counts = _merge_columns(matrix)
        elif counts.shape != matrix.shape[1:] or not np.all(counts > 0):
            raise ValueError("one positive count per column")
        else:
            values = matrix
        table = _BatchSeries.fixed(values, counts)
        alone = self._closed_forms(values, counts, delta, table)
        for q in np.flatnonzero(alone):
            out[q] = self.quantile(Runs.of_counted(values[q], counts), delta)
        batch = np.flatnonzero(~alone)
        if batch.size:
            out[batch] = self._batch_quantiles(values[batch], counts, delta, table.take(batch))
        return out

    def _closed_forms(
        self, values: FloatArray, counts: FloatArray, delta: float, table: _BatchSeries
    ) -> BoolArray:
        """The rows :meth:`quantile` settles without inverting ``phi``.

        Those of at most two terms, or with a dominant term (:meth:`_dominant_quantile`'s
        tests, for all rows at once).
        """
        top = values.max(axis=1)
        is_top = values == top[:, None]
        copies = is_top.astype(np.float64) @ counts
        terms = (values > 0).astype(np.float64) @ counts
        second = np.where(copies > 1, top, np.where(is_top, 0.0, values).max(axis=1))
        separated = (second < top * (1.0 - 1e-9)) & (terms > 2)
        safe_top = np.where(top > 0, top, 1.0)
        rest_square = np.maximum(0.0, np.square(values) @ counts - top * top)
        need = math.log(1.0 / self.trunc_tol)

        def may_dominate(x: FloatArray, rows: IntArray | slice = slice(None)) -> BoolArray:
            found: BoolArray = (  # as _may_dominate, for ``rows``
                separated[rows]
                & (x >= need * second[rows])
                & (x * x >= 4.0 * need * rest_square[rows])
            )
            return found

        z_2 = np.where(separated, np.square(second / safe_top), 0.0)  # unused where not
        above = top * (math.log(1.0 / delta) + rest_square / np.square(safe_top) / (1.0 - z_2))
        candidates = np.flatnonzero(may_dominate(above * (1.0 + 1e-9)))
        alone = terms <= 2
        if candidates.size == 0:
            return alone
        # the rest: without the largest term (a single copy, since the rows are separated)
        rest = np.where(is_top[candidates], 0.0, values[candidates])
        table = table.take(candidates)
        log_mgf = -_batch_sum_log1p(rest, counts, (1.0 / top[candidates])[:, None], -1.0, table)
        w = top[candidates] * (math.log(1.0 / delta) + log_mgf[:, 0])
        # the error bound (a Chernoff grid per row) only where the form may dominate at ``w``
        tried = np.flatnonzero(may_dominate(w, candidates))
        if tried.size == 0:
            return alone
        candidates, w, rest = candidates[tried], w[tried], rest[tried]
        table = table.take(tried)
        top_c, second_c = top[candidates], second[candidates]
        low = second_c / top_c
        s = (low[:, None] ** np.linspace(1.0, 0.0, 24)[None, :]) * _CHERNOFF_GRID[-1] ** (
            np.linspace(0.0, 1.0, 24)[None, :]
        )
        s /= second_c[:, None]  # geomspace(second / top, grid end, 24) / second, per row
        bound = np.min(-s * w[:, None] - _batch_sum_log1p(rest, counts, s, -1.0, table), axis=1)
        error = np.where(low < _CHERNOFF_GRID[-1], np.exp(bound), math.inf)
        alone[candidates] |= error <= self.trunc_tol
        return alone

    def _batch_quantiles(
        self,
        values: FloatArray,
        counts: FloatArray,
        delta: float,
        table: _BatchSeries,
    ) -> FloatArray:
        """The general case of :meth:`quantile` for every row at once (``values``: Q x K)."""
        top = values.max(axis=1)
        lam = _CHERNOFF_GRID[None, :] / top[:, None]
        log_mgf = -_batch_sum_log1p(values, counts, lam, -1.0, table)
        high = np.min((math.log(2.0 / delta) + log_mgf) / lam, axis=1)
        extent = np.min((math.log(2.0 / self.alias_tol) + log_mgf) / lam, axis=1)
        low = top * math.log(0.5 / delta) if delta < 0.25 else high / 64
        h = math.pi / np.maximum(high, extent)
        scale = (2.0 / math.pi) * h / (np.sin(h * low / 2.0) * self.trunc_tol)
        s_cap = _node_caps(h, scale, _largest(values, counts))
        grid = h[:, None] * (s_cap / h)[:, None] ** np.linspace(0.0, 1.0, 64)[None, :]
        log_bound = (
            np.log(scale)[:, None] + _batch_log_phi_above(values, counts, grid) - np.log(grid)
        )
        stop = np.where(
            s_cap > h, grid[np.arange(grid.shape[0]), np.argmax(log_bound <= 0.0, 1)], h
        )
        sizes = np.ceil(stop / h).astype(np.int64) + 1
        j_half = np.arange(int(sizes.max()), dtype=np.float64) + 0.5
        # rows with fewer nodes repeat their last: ascending, and the same largest node
        nodes = h[:, None] * np.minimum(j_half[None, :], (sizes - 0.5)[:, None])
        log_phi = -_batch_sum_log1p(values, counts, nodes, 1.0, table)
        coefficients = np.where(j_half < sizes[:, None], np.exp(log_phi) / j_half, 0.0)
        roots = _newton_roots(nodes, coefficients, delta, low, high)
        at_low = _rough_tails(nodes, coefficients, low)
        at_high = _rough_tails(nodes, coefficients, high)
        out = np.zeros(values.shape[0])
        for q in range(values.shape[0]):
            size = int(sizes[q])
            found = _Nodes(nodes[q, :size], coefficients[q, :size])
            if not _misses(found, low[q], at_low[q], delta) or _misses(
                found, high[q], at_high[q], delta
            ):
                # the bracket needs widening: rare
                out[q] = self.quantile(Runs.of_counted(values[q], counts), delta)
            elif math.isnan(roots[q]):
                out[q] = _root(found.tail, delta, float(low[q]), float(high[q]))
            else:
                out[q] = _safe_side(found.tail, delta, float(roots[q]))
        return out

    def _dominant_quantile(self, b: Runs, delta: float) -> float | None:
        """The quantile from :func:`dominant_tail`'s closed form, if its error is negligible there.

        The form is ``delta`` at ``w = b_1 (ln(1/delta) + ln E exp(R / b_1))``; rounded up to
        where :meth:`tail` (the same form there) is at most ``delta``.
        """
        if not _separated(b):
            return None
        top = float(b.values[0])
        # -log(1 - z) <= z / (1 - z_2) for the rest's z = (b_k / b_1)^2 <= z_2 bounds ``w``
        # from above at the cost of a sum; the test below only grows with ``w``, so failing it
        # there (with a margin for rounding) settles it without the rest's log-MGF
        z_2 = (_second(b) / top) ** 2
        rest_square = max(0.0, b.moments(0)[0] - top * top) / (top * top)
        above = top * (math.log(1.0 / delta) + rest_square / (1.0 - z_2)) * (1.0 + 1e-9)
        if not _may_dominate(b, above, self.trunc_tol):
            return None
        w = float(top * (math.log(1.0 / delta) + _log_mgf(b.rest(), 1.0 / top)))
        if not (_may_dominate(b, w, self.trunc_tol) and _dominant_error(b, w) <= self.trunc_tol):
            return None
        while self._tail(b, w) > delta:
            w = math.nextafter(w * (1 + 1e-15), math.inf)
        return w

    def scaled(
        self,
        b: Runs,
        r_range: tuple[float, float],
        x_range: tuple[float, float],
        most: int = _SHARED_NODES,
    ) -> ScaledTails | None:
        """The tails of ``E + r L`` for every ``r`` and ``x`` in the ranges, on one node set.

        ``E`` has the scales ``b``, ``L`` is one more standard Laplace.
        ``phi_r(s) = phi_E(s) / (1 + r^2 s^2)``, so ``log phi_E`` at the nodes serves every
        ``r`` and each tail then costs one pass over the nodes; the error bounds hold for all
        of them at once: the Chernoff extent at the largest ``r`` bounds the aliasing at any
        smaller one (the MGF grows with a scale), and ``phi`` at the least ``r`` bounds the
        truncation at any larger one, at the least ``x`` (:meth:`_nodes`). None if that set
        would have more than ``most`` nodes: one term then dominates much of the range, or
        there are only a few (``phi`` decays slowly), or ``x`` gets small; each tail's own
        nodes, or its closed form, then cost less.
        """
        (r_lo, r_hi), (x_lo, x_hi) = r_range, x_range
        if b.size == 0 or not 0.0 <= r_lo <= r_hi or not 0.0 < r_hi or not 0.0 < x_lo <= x_hi:
            raise ValueError("a term or more, and positive ranges (but for r from 0)")
        widest, narrowest = b.joined(1.0, r_hi), (b if r_lo == 0.0 else b.joined(1.0, r_lo))
        if widest is None or narrowest is None:
            return None
        h, count = self._spacing(widest, narrowest, x_lo, x_hi)
        if count > most:
            return None
        j_half = np.arange(count, dtype=np.float64) + 0.5
        s = j_half * h
        return ScaledTails(s, j_half, _log_phi(b, s), r_range, x_range)

    def _nodes(self, b: Runs, x_lo: float, x_hi: float) -> _Nodes:
        h, count = self._spacing(b, b, x_lo, x_hi)
        j_half = np.arange(count, dtype=np.float64) + 0.5
        s = j_half * h
        return _Nodes(s, np.exp(_log_phi(b, s)) / j_half)

    def _spacing(
        self, widest: Runs, narrowest: Runs, x_lo: float, x_hi: float
    ) -> tuple[float, int]:
        """The midpoint rule's step and number of nodes for thresholds in ``[x_lo, x_hi]``.

        The step keeps the aliasing below ``alias_tol`` for any sum no wider than ``widest``
        (its Chernoff extent), the last node the truncation below ``trunc_tol`` for any whose
        ``phi`` is at most ``narrowest``'s.
        """
        return self._placed(
            tail_extent(widest, self.alias_tol),
            narrowest.largest(16),
            lambda grid: _log_phi_above(narrowest, grid),
            x_lo,
            x_hi,
        )

    def _placed(
        self,
        extent: float,
        largest: FloatArray,
        log_phi_above: Callable[[FloatArray], FloatArray],
        x_lo: float,
        x_hi: float,
    ) -> tuple[float, int]:
        """:meth:`_spacing` from its parts, for sums given otherwise than as runs.

        The widest sum's Chernoff ``extent`` (at ``alias_tol``), and the narrowest's largest
        16 scales and upper bound on its ``log phi``.
        """
        h = math.pi / max(x_hi, extent)
        sin_half = math.sin(h * x_lo / 2.0)
        scale = (2.0 / math.pi) * h / (sin_half * self.trunc_tol)
        s_cap = _node_cap(h, scale, largest)
        grid = _geometric(h, s_cap, 64)
        log_bound = math.log(scale) + log_phi_above(grid) - np.log(grid)
        s_stop = grid[int(np.argmax(log_bound <= 0.0))] if s_cap > h else h
        return h, int(math.ceil(s_stop / h)) + 1


EXACT = ExactTail()


def _geometric(start: float, stop: float, num: int) -> FloatArray:
    """``np.geomspace(start, stop, num)`` for positive ``start`` and ``stop``, to the bit.

    Its steps (``log10`` of the ends, ``linspace``, ``10 ** y``, the ends put back) without
    its checks and conversions, which cost more than the arithmetic at these sizes and were a
    fifth of a tail's evaluation.
    """
    log_start, log_stop = np.log10(np.array([start, stop]))
    step = (log_stop - log_start) / (num - 1)
    steps = np.arange(num, dtype=np.float64)
    if step == 0:  # as linspace: a step that underflows
        steps /= num - 1
        steps *= log_stop - log_start
    else:
        steps *= step
    steps += log_start
    steps[-1] = log_stop
    out: FloatArray = np.power(10.0, steps)
    out[0], out[-1] = start, stop
    return out


def _node_cap(h: float, scale: float, largest: FloatArray) -> float:
    """A frequency past the stopping node: ``phi(s) <= prod_{k <= r} (b_k s)^-2`` for any ``r``."""
    top = np.arange(1, largest.size + 1)
    log_products = np.cumsum(2.0 * np.log(largest))
    return max(h, float(np.exp(np.min((math.log(scale) - log_products) / (2 * top + 1)))))


def _node_caps(h: FloatArray, scale: FloatArray, largest: FloatArray) -> FloatArray:
    """:func:`_node_cap` of each row (``largest``: Q x k, NaN past a row's last scale)."""
    top = np.arange(1, largest.shape[1] + 1)
    log_products = np.cumsum(2.0 * np.log(largest), axis=1)
    bound = (np.log(scale)[:, None] - log_products) / (2 * top + 1)
    caps: FloatArray = np.maximum(h, np.exp(np.nanmin(bound, axis=1)))
    return caps


def _largest(values: FloatArray, counts: FloatArray, k: int = 16) -> FloatArray:
    """The ``k`` largest positive scales of each row of merged columns (with repeats).

    Q x k, decreasing, NaN past the last scale of a row with fewer.
    """
    if values.shape[1] > k:
        picked = np.argpartition(values, -k, axis=1)[:, -k:]
    else:
        picked = np.broadcast_to(np.arange(values.shape[1]), values.shape)
    chosen = np.take_along_axis(values, picked, axis=1)
    order = np.argsort(-chosen, axis=1, kind="stable")
    chosen = np.take_along_axis(chosen, order, axis=1)
    copies = np.where(chosen > 0, counts[np.take_along_axis(picked, order, axis=1)], 0.0)
    # the j-th largest scale (with repeats) is that of the first column whose copies reach j
    reach = np.cumsum(copies, axis=1)
    j = np.arange(k)
    column = np.count_nonzero(reach[:, :, None] <= j, axis=1)
    found = np.take_along_axis(chosen, np.minimum(column, chosen.shape[1] - 1), axis=1)
    out: FloatArray = np.where(j < reach[:, -1:], found, math.nan)
    return out


def _merge_columns(matrix: FloatArray) -> tuple[FloatArray, FloatArray]:
    """The distinct columns of ``matrix`` and how often each occurs.

    A weighted sum of three rows is a hash that equal columns share exactly (elementwise
    arithmetic rounds alike); a merge is kept only if every row agrees.
    """
    last = matrix.shape[0] - 1
    key = matrix[0] + math.pi * matrix[last // 2] + math.e * matrix[last]
    _, first, inverse, counts = np.unique(
        key, return_index=True, return_inverse=True, return_counts=True
    )
    merged = matrix[:, first]
    if not np.array_equal(merged[:, inverse], matrix):
        return matrix, np.ones(matrix.shape[1])
    return merged, counts.astype(np.float64)


class _BatchSeries:
    """Power sums of each row's small terms, against a reference scale per row.

    ``sums[q, r - 1] = sum_k c_k (b_qk / reference_q)^{2r}`` over the terms with
    ``0 < b_qk <= reference_q``, ``r = 1 .. _SERIES_TERMS``, each order summing only the terms
    that still count there (as :meth:`Runs._compute_power_sums`). They serve every evaluation
    at frequencies ``s <= _SERIES_RADIUS / reference_q``, of either sign, the terms above the
    reference then summed exactly.
    """

    __slots__ = ("reference", "sums", "_above")

    def __init__(self, reference: FloatArray, sums: FloatArray) -> None:
        self.reference = reference
        self.sums = sums
        # the terms above the reference of the last ``values`` asked (:meth:`above`)
        self._above: tuple[FloatArray, _Exact] | None = None

    @classmethod
    def of(cls, values: FloatArray, counts: FloatArray, reference: FloatArray) -> _BatchSeries:
        """The table of the terms of ``values`` (Q x K) at or below ``reference`` (one per row)."""
        safe = np.where(reference > 0, reference, 1.0)
        z = np.square(np.where(values <= reference[:, None], values, 0.0) / safe[:, None])
        orders = np.arange(1, _SERIES_TERMS + 1)
        least = 4.0 * (1e-20 / float(counts.max())) ** (1.0 / orders)  # the z that still count
        # terms (as rows, so that a prefix is contiguous) by their largest z, so that those
        # still counting at each order come first
        largest = z.max(axis=0)
        order = np.argsort(-largest, kind="stable")
        z = np.ascontiguousarray(z.T[order])
        powers = z.copy()
        weights = counts[order]
        counting = np.searchsorted(-largest[order], -least, "right")
        sums = np.zeros((_SERIES_TERMS, values.shape[0]))
        for r in range(_SERIES_TERMS):
            n = int(counting[r])
            if n == 0:
                break
            sums[r] = weights[:n] @ powers[:n]
            powers[:n] *= z[:n]
        return cls(reference, np.ascontiguousarray(sums.T))

    @classmethod
    def fixed(cls, values: FloatArray, counts: FloatArray) -> _BatchSeries:
        """One table per row for all its evaluations, the terms above 1/8 of its largest exact.

        It serves the dominance test, the Chernoff grid and (usually) the nodes, whose
        frequencies stay below 4 over the largest scale.
        """
        return cls.of(values, counts, values.max(axis=1) / 8.0)

    def take(self, rows: npt.NDArray[np.intp]) -> _BatchSeries:
        """The table of some of the rows."""
        return _BatchSeries(self.reference[rows], self.sums[rows])

    def above(self, values: FloatArray) -> _Exact:
        """The terms of ``values`` above each row's reference, found once for its evaluations."""
        if self._above is None or self._above[0] is not values:
            self._above = (values, _Exact.of(values, values > self.reference[:, None]))
        return self._above[1]

    def serves(self, s_max: FloatArray) -> bool:
        """Whether every row's series converges as fast as the radius asks at ``s_max``."""
        return bool(np.all(self.reference * s_max <= _SERIES_RADIUS))

    def at(self, s: FloatArray, sign: float) -> FloatArray:
        """``sum_k c_k log(1 + sign (b_qk s_qj)^2)`` over the table's terms (``s``: Q x J)."""
        s_max = s[:, -1]
        orders = np.arange(1, _SERIES_TERMS + 1)
        ratio = self.reference * s_max
        coefficients = (
            -((-sign) ** orders) * self.sums * np.power.outer(ratio * ratio, orders) / orders
        )
        return _polynomial(np.square(s / s_max[:, None]), coefficients[:, None, :])


def _batch_sum_log1p(
    values: FloatArray,
    counts: FloatArray,
    s: FloatArray,
    sign: float,
    table: _BatchSeries | None = None,
) -> FloatArray:
    """:func:`_sum_log1p` for each row ``q``: ``sum_k counts_k log(1 + sign (values_qk s_qj)^2)``.

    ``s`` is Q x J, each row ascending. As there, the terms with ``b max(s) <= 1/2`` go through
    the power series (their power sums cut to the terms that count at each order, as
    :meth:`Runs._compute_power_sums`), the others exactly. ``table``: power sums computed
    before at a split fixed per row (:class:`_BatchSeries`), used if they serve these ``s``
    (the terms above its reference are then summed exactly); ``values`` may have terms zeroed
    (left out) that the table holds only if they lie above its reference.
    """
    s_max = s[:, -1]
    if table is not None and table.serves(s_max):
        exact = table.above(values)
    else:
        mask = values * s_max[:, None] > _SERIES_RADIUS
        exact = _Exact.of(values, mask)
        small = np.where(mask, 0.0, values)
        table = _BatchSeries.of(small, counts, small.max(axis=1))
    out = np.zeros_like(s)
    if exact.rows.size:
        terms = np.log1p(sign * np.square(s[exact.rows] * exact.values))
        terms *= counts[exact.columns][:, None]
        out[exact.rows[exact.starts]] += np.add.reduceat(terms, exact.starts, axis=0)
    return out + table.at(s, sign)


@dataclass(frozen=True, slots=True)
class _Exact:
    """The terms of a Q x K matrix that are summed exactly, row by row.

    Their rows and columns (row-major order), their values (as a column) and where each row's
    terms start.
    """

    rows: npt.NDArray[np.intp]
    columns: npt.NDArray[np.intp]
    values: FloatArray
    starts: npt.NDArray[np.intp]

    @classmethod
    def of(cls, values: FloatArray, mask: BoolArray) -> _Exact:
        rows, columns = np.nonzero(mask)
        starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]]) if rows.size else rows
        return cls(rows, columns, values[rows, columns][:, None], starts)


def _batch_log_phi_above(values: FloatArray, counts: FloatArray, s: FloatArray) -> FloatArray:
    """:func:`_log_phi_above` for each row of ``values`` at its row of ``s`` (Q x J)."""
    s_max = s[:, -1]
    exact = values * s_max[:, None] > _SERIES_RADIUS
    small = np.where(exact, 0.0, np.square(values))
    square = np.square(s)
    out = (
        square * (small @ counts)[:, None]
        - 0.5 * np.square(square) * (np.square(small) @ counts)[:, None]
    )
    rows, cols = np.nonzero(exact)
    if rows.size:
        terms = np.log1p(np.square(s[rows] * values[rows, cols][:, None])) * counts[cols][:, None]
        starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
        out[rows[starts]] += np.add.reduceat(terms, starts, axis=0)
    return -out


def laplace_sum_tail(scales: npt.ArrayLike, x: float) -> float:
    """``P(|sum_k b_k L_k| > x)`` by :class:`ExactTail`.

    >>> round(laplace_sum_tail([2.0], 2.0 * math.log(20)), 12)  # one term: exp(-x/b)
    0.05
    >>> round(laplace_sum_tail([1.0, 1.0], 1.0), 10)  # equal pair: e^{-x}(1 + x/2)
    0.5518191618
    """
    return EXACT.tail(np.asarray(scales, dtype=np.float64), x)


def _bracket(b: Runs, delta: float) -> tuple[float, float]:
    """Thresholds below and above ``E``'s ``delta`` quantile, but for rounding at the ends.

    ``tail(x) >= P(|b_1 L_1| > x) / 2`` by symmetry, which brackets it from below; the
    Chernoff bound from above.
    """
    high = tail_extent(b, delta)
    low = b.values[0] * math.log(0.5 / delta) if delta < 0.25 else high / 64
    return float(low), high


def _root_quantile(
    tail: Callable[[float], float],
    b: Runs,
    delta: float,
    low: float = 0.0,
    high: float | None = None,
) -> float:
    """Root-find ``tail(w) = delta`` in ``[low, high]`` and round up to the safe side."""
    if not 0 < delta < 1:
        raise ValueError("delta must lie in (0, 1)")
    if b.size == 0:
        return 0.0
    if high is None:
        high = tail_extent(b, delta)
        while tail(high) > delta:  # a simulation may disagree with the Chernoff bound
            high *= 2.0
    return _root(tail, delta, low, high)


def _root(tail: Callable[[float], float], delta: float, low: float, high: float) -> float:
    """``tail(w) = delta`` for ``w`` in a bracket, rounded up to the safe side."""
    w = float(optimize.brentq(lambda v: tail(v) - delta, low, high, xtol=1e-300, rtol=1e-12))
    return _safe_side(tail, delta, w)


def _safe_side(tail: Callable[[float], float], delta: float, w: float) -> float:
    """``w`` moved up until ``tail(w) <= delta`` (a root may sit a rounding step below it)."""
    while tail(w) > delta:
        w = math.nextafter(w * (1 + 1e-12), math.inf)
    return w


def _rough_tails(s: FloatArray, coefficients: FloatArray, x: FloatArray) -> FloatArray:
    """:meth:`_Nodes.tail` of each row at its ``x``, the rows summed at once.

    Within ``_ROUGH_TAIL`` of it (the terms are below 2 in absolute value and a row's sum is
    ``O(log J)``: summed in any order it errs by under ``J * 1e-15``); rows past their last
    node have zero coefficients.
    """
    inside = (2.0 / math.pi) * (np.sin(s * x[:, None]) * coefficients).sum(axis=1)
    out: FloatArray = np.clip(1.0 - inside, 0.0, 1.0)
    return out


def _misses(nodes: _Nodes, x: float, rough: float, delta: float) -> bool:
    """Whether ``nodes.tail(x) > delta``, from :func:`_rough_tails`'s ``rough`` unless close."""
    if abs(rough - delta) > _ROUGH_TAIL:
        return rough > delta
    return nodes.tail(x) > delta


def _newton_roots(
    s: FloatArray, coefficients: FloatArray, delta: float, low: FloatArray, high: FloatArray
) -> FloatArray:
    """Per row, ``w`` in ``(low, high)`` with ``1 - (2/pi) sum_j c_j sin(s_j w) = delta``.

    The midpoint sums of :class:`_Nodes` for all rows at once (``s``, ``coefficients``: Q x J),
    by Newton's method kept inside the bracket (a step leaving it bisects instead), to
    ``_NEWTON_RTOL`` relative: about as many evaluations as Brent's method needs for one row
    serve all of them. The tail of a sum of Laplace noises is convex beyond its mode, so from
    ``low`` the steps approach the root from below. NaN for a row that does not settle (its
    caller then runs Brent's method).
    """
    lo, hi = low.astype(np.float64), high.astype(np.float64)
    w = lo.copy()
    open_rows = np.arange(w.size)  # only these are evaluated: a row's sums are its own
    for _ in range(_NEWTON_STEPS):
        at, nodes, weights = w[open_rows], s[open_rows], coefficients[open_rows]
        phase = nodes * at[:, None]
        excess = 1.0 - (2.0 / math.pi) * (np.sin(phase) * weights).sum(axis=1) - delta
        slope = (2.0 / math.pi) * (np.cos(phase) * weights * nodes).sum(axis=1)  # -tail'
        below = np.where(excess > 0.0, at, lo[open_rows])
        above = np.where(excess > 0.0, hi[open_rows], at)
        lo[open_rows], hi[open_rows] = below, above
        with np.errstate(divide="ignore", invalid="ignore"):
            step = excess / slope
        newton = at + step
        inside = (slope > 0.0) & (newton > below) & (newton < above)
        settled = inside & (np.abs(step) <= _NEWTON_RTOL * at)
        w[open_rows] = np.where(inside, newton, 0.5 * (below + above))
        open_rows = open_rows[~settled]
        if not open_rows.size:
            return w
    w[open_rows] = math.nan
    return w


def quantile(method: TailMethod, scales: npt.ArrayLike | Runs, delta: float) -> float:
    """The smallest half-width ``w`` with ``P(|X| > w) <= delta`` (to 1e-12 relative, rounded up).

    >>> round(quantile(EXACT, [3.0], 0.05) / (3.0 * math.log(20)), 9)
    1.0
    """
    if not isinstance(scales, Runs):
        scales = np.asarray(scales, dtype=np.float64)
    return method.quantile(scales, delta)


def discrete_laplace_tail(rho: float, k: int) -> float:
    """``P(|Z| >= k)`` for the discrete Laplace ``P(Z = z)`` proportional to ``exp(-rho |z|)``.

    That is ``2 r^k / (1 + r)`` with ``r = exp(-rho)``, computed from ``rho`` so that fine
    lattices (``rho`` near 0, ``k`` large) keep full precision.

    >>> round(discrete_laplace_tail(math.log(2), 1), 12)  # r = 1/2: 1 - P(Z = 0) = 1 - 1/3
    0.666666666667
    """
    if not rho > 0:
        raise ValueError("rho must be positive")
    if k <= 0:
        return 1.0
    return math.exp(math.log(2.0) - k * rho - math.log1p(math.exp(-rho)))


@dataclass(frozen=True, slots=True)
class MonteCarloTail:
    """The papers' Algorithm 1: simulate ``sum_k b_k L_k`` and count exceedances.

    The paper rounds the samples to integers and histograms them; the tail is read off the raw
    samples instead, since rounding moves it by up to half a unit. The generator is the caller's
    (simulation, not privacy noise), so results are reproducible.
    """

    generator: np.random.Generator
    samples: int = 1_000_000

    def tail(self, scales: Scales, x: float) -> float:
        """Fraction of simulated sums whose absolute value exceeds ``x``."""
        total = np.zeros(self.samples)
        for b in _positive_scales(scales).expanded():
            total += self.generator.laplace(0.0, b, self.samples)
        return float(np.count_nonzero(np.abs(total) > x)) / self.samples

    def quantile(self, scales: Scales, delta: float) -> float:
        """Root of the simulated tail (one simulation per evaluation, as the paper's method)."""
        runs = _positive_scales(scales)
        b = runs.expanded()
        return _root_quantile(lambda w: self.tail(b, w), runs, delta)


@dataclass(frozen=True, slots=True)
class ConvolutionTail:
    """The papers' Algorithm 2 ("PC"): convolve binned probability mass vectors.

    Each ``b_k L_k`` becomes masses on bins of width ``step`` centred on multiples of ``step``,
    truncated where the lost mass is ``gamma / m`` per term (Lemma 4.2); the vectors are convolved
    shortest first. The tail is the mass of the bins centred beyond ``x``. Binning rounds every
    term separately, which is this method's inherent error.
    """

    gamma: float = 0.01
    step: float = 1.0

    def tail(self, scales: Scales, x: float) -> float:
        """Binned-convolution estimate of ``P(|X| > x)``."""
        if _positive_scales(scales).size == 0:
            return 0.0 if x >= 0 else 1.0
        pmf = self.pmf(scales)
        half = (pmf.size - 1) // 2
        centres = (np.arange(pmf.size) - half) * self.step
        return float(np.clip(pmf[np.abs(centres) > x].sum(), 0.0, 1.0))

    def pmf(self, scales: Scales) -> FloatArray:
        """The binned masses of ``X``: odd length, bin ``i`` centred on ``(i - half) * step``.

        >>> ConvolutionTail().pmf(np.array([1.0])).size  # ceil(ln(1 / 0.01)) = 5 bins a side
        11
        """
        b = _positive_scales(scales).expanded()
        kernels = [self._binned(scale, b.size) for scale in b[::-1]]
        pmf = np.ones(1)
        for kernel in kernels:  # short kernels directly, the long ones at once through the FFT
            if kernel.size <= _DIRECT_CONVOLUTION:
                pmf = np.convolve(pmf, kernel)
        long = [kernel for kernel in kernels if kernel.size > _DIRECT_CONVOLUTION]
        if long:
            size = pmf.size + sum(kernel.size - 1 for kernel in long)
            length = fft.next_fast_len(size, real=True)
            spectrum = fft.rfft(pmf, length)
            for kernel in long:
                spectrum *= fft.rfft(kernel, length)
            pmf = fft.irfft(spectrum, length)[:size]
        return pmf

    def quantile(self, scales: Scales, delta: float) -> float:
        """Root of the binned tail."""
        runs = _positive_scales(scales)
        b = runs.expanded()
        return _root_quantile(lambda w: self.tail(b, w), runs, delta)

    def _binned(self, scale: float, m: int) -> FloatArray:
        half = math.ceil(scale * math.log(m / self.gamma) / self.step)
        edges = (np.arange(-half, half + 2) - 0.5) * self.step
        outer = 0.5 * np.exp(-np.abs(edges) / scale)  # mass beyond each edge, never overflows
        cdf = np.where(edges < 0, outer, 1 - outer)
        return np.diff(cdf)
