"""Exact discrete Laplace noise on a lattice; the only module that reads the OS CSPRNG.

Textbook Laplace noise computed in floating point leaks the true value through the pattern of
representable outputs (Mironov 2012). Here noise is an integer count of lattice steps drawn with
integer arithmetic only (Canonne, Kamath & Steinke 2020, Algorithms 1-2), and it is added to the
true answer snapped to the lattice the query's exact answers live on, in ``Fraction`` arithmetic.

Lattices. Public numbers (weights, half-widths) are read as the shortest decimal that
round-trips, i.e. what the SQL said. The *granularity* ``g`` of a query is the largest rational
dividing every weight, so ``q . x`` lies in ``g Z`` for integer counts ``x`` and any two
neighbouring databases' answers differ by a multiple of ``g``. The noise *step* is ``g / 2^k``
(so discrete Laplace on it is exactly ``alpha``-DP), at most ``eps / 1024`` (so its coupling
allowance in interval bounds is negligible), with ``k`` the least such that ``eps / step`` has
fractional part at most 1/2. That last condition makes the fresh-only budget never exceed the
continuous ``S ln(1/delta) / eps``: with ``x = delta^(step/eps)`` and fractional part ``f``,
lattice noise at that budget misses with probability ``delta * 2 x^(1-f) / (1 + x)``, and
``2 x^(1-f) <= 2 sqrt(x) <= 1 + x``.

Randomness comes from a :class:`RandomSource`. Production uses :class:`SystemRandomSource`
(``secrets``); tests pass :class:`SeededRandomSource` to make coverage runs reproducible.
"""

from __future__ import annotations

import functools
import math
import random
import secrets
from collections.abc import Iterable
from fractions import Fraction
from typing import Protocol

import numpy as np

from sqlmap.vector import FloatArray, LinearQuery

__all__ = [
    "RandomSource",
    "SystemRandomSource",
    "SeededRandomSource",
    "bernoulli",
    "bernoulli_exp",
    "discrete_laplace",
    "public_fraction",
    "granularity",
    "noise_step",
    "snap",
    "noisy_value",
]

# The noise step is at most eps / 2^10: the coupling allowance sum_k |t_k| step_k then costs
# history estimates at most ~0.1% of their requested half-width.
_STEP_DIVISOR = 1024

# A factored query holds a handful of weights: its lattice, found for its decision and again
# for its noise (~30 us each: 1.2 ms of a 20-group GROUP BY on the wide cube), is kept by them.
_KEPT_WEIGHTS = 64


class RandomSource(Protocol):
    """A source of uniform integers; the only randomness the engine consumes."""

    def randbelow(self, n: int) -> int:
        """A uniform integer in ``[0, n)``."""
        ...


class SystemRandomSource:
    """The OS CSPRNG (``secrets``): the only source fit for released answers."""

    def randbelow(self, n: int) -> int:
        """A uniform integer in ``[0, n)`` from the OS."""
        return secrets.randbelow(n)


class SeededRandomSource:
    """Reproducible uniform integers from ``random.Random(seed)``, for tests and benchmarks only.

    >>> SeededRandomSource(7).randbelow(10) == SeededRandomSource(7).randbelow(10)
    True
    """

    def __init__(self, seed: int) -> None:
        self._random = random.Random(seed)

    def randbelow(self, n: int) -> int:
        """A uniform integer in ``[0, n)`` from the seeded generator."""
        return self._random.randrange(n)


def bernoulli(p: Fraction, rng: RandomSource) -> bool:
    """An exact Bernoulli(``p``) draw for rational ``p`` in ``[0, 1]``.

    >>> bernoulli(Fraction(0), SeededRandomSource(1)), bernoulli(Fraction(1), SeededRandomSource(1))
    (False, True)
    """
    return rng.randbelow(p.denominator) < p.numerator


def _bernoulli_exp_within_one(numerator: int, denominator: int, rng: RandomSource) -> bool:
    """:func:`bernoulli_exp` of ``numerator / denominator`` in ``[0, 1]``, in integers.

    The same draws as over ``Fraction``s (``gamma / k`` in lowest terms: ``randbelow`` of its
    denominator), without making one per draw: a fresh value's noise took 0.14 ms so.
    """
    k = 1
    while True:
        scaled = denominator * k
        common = math.gcd(numerator, scaled)
        if not rng.randbelow(scaled // common) < numerator // common:
            return k % 2 == 1
        k += 1


def bernoulli_exp(gamma: Fraction, rng: RandomSource) -> bool:
    """An exact Bernoulli(``exp(-gamma)``) draw for rational ``gamma >= 0`` (CKS Algorithm 1).

    For ``gamma <= 1``: draw Bernoulli(``gamma/k``) for ``k = 1, 2, ...`` until one fails; the
    number of draws is odd with probability ``sum_k (-gamma)^k / k! = exp(-gamma)``. Larger
    ``gamma`` is split as ``exp(-1)^floor(gamma) * exp(-frac(gamma))``.

    >>> bernoulli_exp(Fraction(0), SeededRandomSource(3))
    True
    """
    while gamma > 1:
        if not _bernoulli_exp_within_one(1, 1, rng):
            return False
        gamma -= 1
    return _bernoulli_exp_within_one(gamma.numerator, gamma.denominator, rng)


def discrete_laplace(scale: Fraction, rng: RandomSource) -> int:
    """An exact draw with ``P(Z = z)`` proportional to ``exp(-|z| / scale)`` (CKS Algorithm 2).

    With ``scale = t/s``: ``X = U + t V`` (``U`` uniform below ``t`` accepted with probability
    ``exp(-U/t)``, ``V`` geometric) is geometric with ratio ``exp(-1/t)``, so ``floor(X/s)`` is
    geometric with ratio ``exp(-s/t)``; a random sign, rejecting "-0", makes it two-sided.

    >>> draws = [discrete_laplace(Fraction(1, 1000), SeededRandomSource(i)) for i in range(5)]
    >>> draws  # a tiny scale puts all mass on 0
    [0, 0, 0, 0, 0]
    """
    if scale <= 0:
        raise ValueError("scale must be positive")
    t, s = scale.numerator, scale.denominator
    while True:
        u = rng.randbelow(t)
        common = math.gcd(u, t)  # (u / t in lowest terms, as a Fraction holds it)
        if not _bernoulli_exp_within_one(u // common, t // common, rng):
            continue
        v = 0
        while _bernoulli_exp_within_one(1, 1, rng):
            v += 1
        y = (u + t * v) // s
        negative = rng.randbelow(2) == 1
        if negative and y == 0:
            continue
        return -y if negative else y


def public_fraction(value: float) -> Fraction:
    """A public float read as the shortest decimal that round-trips (what the SQL said).

    >>> public_fraction(0.1)
    Fraction(1, 10)
    """
    if not math.isfinite(value):
        raise ValueError("public numbers must be finite")
    return _decimal(float(value))


@functools.lru_cache(maxsize=4096)
def _decimal(value: float) -> Fraction:
    """``value``'s shortest round-tripping decimal, parsed once.

    A statement reads a few public numbers, each once per value: parsed from its ``repr`` every
    time, they cost a fresh 378-group GROUP BY 30 ms.
    """
    return Fraction(repr(value))


def _gcd(values: Iterable[Fraction]) -> Fraction:
    """The largest rational that divides every value."""
    num, den = 0, 1
    for value in values:
        # gcd(a/b, c/d) = gcd(a d, c b) / (b d), kept over a common denominator.
        num = math.gcd(num * value.denominator, abs(value.numerator) * den)
        den *= value.denominator
        divisor = math.gcd(num, den)
        num, den = num // divisor, den // divisor
    return Fraction(num, den)


def granularity(query: LinearQuery) -> Fraction:
    """The largest rational ``g`` dividing every weight: exact answers lie on ``g Z``.

    Computed over the distinct weights (a SQL query over a cube has a handful).

    >>> granularity(LinearQuery.from_dense([0.5, 1.5, 0.0, 2.0]))
    Fraction(1, 2)
    """
    weights = query.nonzero_weights()
    if weights.size == 0:
        raise ValueError("the zero query has no lattice")
    if weights.size <= _KEPT_WEIGHTS:
        return _granularity_of(weights.tobytes())
    return _gcd_of(weights)


@functools.lru_cache(maxsize=1024)
def _granularity_of(weights: bytes) -> Fraction:
    return _gcd_of(np.frombuffer(weights))


def _gcd_of(weights: FloatArray) -> Fraction:
    return _gcd(public_fraction(w) for w in np.unique(np.abs(weights)).tolist())


def noise_step(query: LinearQuery, half_width: float) -> Fraction:
    """The lattice step of the noise for ``query`` at half-width ``half_width`` (see module doc).

    >>> noise_step(LinearQuery.from_dense([1.0, 1.0]), 10.0)
    Fraction(1, 128)
    >>> noise_step(LinearQuery.from_dense([1.0]), 10.005)  # 10.005 * 128 = 1280.64: halve
    Fraction(1, 256)
    """
    return _step(granularity(query), public_fraction(half_width))


@functools.lru_cache(maxsize=1024)
def _step(step: Fraction, eps: Fraction) -> Fraction:
    """:func:`noise_step` for granularity ``step`` and half-width ``eps``.

    A statement's values share both: found once, not per value.
    """
    while step > eps / _STEP_DIVISOR:
        step /= 2
    for _ in range(64):  # each halving doubles the fractional part (mod 1): a 0 bit comes soon
        if 2 * ((eps / step) % 1) <= 1:
            return step
        step /= 2
    return step  # eps/g with 64 one-bits in a row: the budget may exceed the papers' by 1e-19


def snap(value: float | int | Fraction, step: Fraction) -> Fraction:
    """The multiple of ``step`` nearest to ``value`` (ties to even), exactly.

    Exact answers already lie on their granularity; snapping only undoes floating-point error
    in how the caller computed them.

    >>> snap(41.99999999999, Fraction(1))
    Fraction(42, 1)
    """
    return round(Fraction(value) / step) * step


def noisy_value(
    true_value: float | int | Fraction,
    *,
    sensitivity: Fraction,
    budget: Fraction,
    lattice: Fraction,
    step: Fraction,
    rng: RandomSource,
) -> Fraction:
    """``true_value`` snapped to ``lattice``, plus ``step`` times discrete Laplace noise.

    The noise has scale ``sensitivity / (budget * step)`` steps: ``budget``-DP for answers that
    move by multiples of ``step`` up to ``sensitivity`` between neighbouring databases.

    >>> noisy_value(7.0, sensitivity=Fraction(1), budget=Fraction(10**9), lattice=Fraction(1),
    ...             step=Fraction(1, 4), rng=SeededRandomSource(0))
    Fraction(7, 1)
    """
    if budget <= 0 or sensitivity <= 0 or step <= 0:
        raise ValueError("budget, sensitivity and step must be positive")
    if (lattice / step).denominator != 1:
        raise ValueError("the noise step must divide the answer lattice")
    z = discrete_laplace(sensitivity / (budget * step), rng)
    return snap(true_value, lattice) + step * z
