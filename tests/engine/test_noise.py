"""Exact lattice noise: distributions, lattices, and the one home of randomness."""

from __future__ import annotations

import ast
import hashlib
import math
from collections import Counter
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import proxy.engine
from proxy.engine.noise import (
    SeededRandomSource,
    SystemRandomSource,
    bernoulli_exp,
    discrete_laplace,
    granularity,
    noise_step,
    noisy_value,
    public_fraction,
    snap,
)
from sqlmap.vector import LinearQuery

ENGINE = Path(proxy.engine.__file__).parent


def _within(count: int, trials: int, p: float, sigmas: float = 4.0) -> bool:
    return abs(count - trials * p) <= sigmas * math.sqrt(trials * p * (1 - p)) + 1


@pytest.mark.parametrize("gamma", [Fraction(0), Fraction(1, 3), Fraction(1), Fraction(7, 3)])
def test_bernoulli_exp_has_probability_exp_minus_gamma(gamma: Fraction) -> None:
    rng = SeededRandomSource(11)
    trials = 20_000
    hits = sum(bernoulli_exp(gamma, rng) for _ in range(trials))
    assert _within(hits, trials, math.exp(-float(gamma)))


@pytest.mark.parametrize("scale", [Fraction(1, 2), Fraction(3), Fraction(1000, 7)])
def test_discrete_laplace_matches_its_mass_function(scale: Fraction) -> None:
    rng = SeededRandomSource(5)
    trials = 20_000
    draws = Counter(discrete_laplace(scale, rng) for _ in range(trials))
    r = math.exp(-1 / float(scale))
    for z in (0, 1, -1, 2, -3):
        assert _within(draws[z], trials, (1 - r) / (1 + r) * r ** abs(z)), z
    # the tail beyond k, both signs together
    k = max(1, round(2 * float(scale)))
    beyond = sum(c for z, c in draws.items() if abs(z) >= k)
    assert _within(beyond, trials, 2 * r**k / (1 + r))


def test_system_source_is_uniform_enough() -> None:
    rng = SystemRandomSource()
    draws = Counter(rng.randbelow(4) for _ in range(8000))
    assert set(draws) == {0, 1, 2, 3}
    assert all(_within(c, 8000, 0.25, sigmas=5) for c in draws.values())


def test_seeded_source_reproduces() -> None:
    first = [discrete_laplace(Fraction(10), SeededRandomSource(3)) for _ in range(3)]
    assert first == [discrete_laplace(Fraction(10), SeededRandomSource(3)) for _ in range(3)]


class _Recording(SeededRandomSource):
    """A seeded source that lists the bounds it was asked for."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.asked: list[int] = []

    def randbelow(self, n: int) -> int:
        self.asked.append(n)
        return super().randbelow(n)


def _fraction_bernoulli_exp(gamma: Fraction, rng: SeededRandomSource) -> bool:
    """CKS Algorithm 1 over ``Fraction``s, as the engine first wrote it."""
    while gamma > 1:
        if not _fraction_bernoulli_exp(Fraction(1), rng):
            return False
        gamma -= 1
    k = 1
    while rng.randbelow((gamma / k).denominator) < (gamma / k).numerator:
        k += 1
    return k % 2 == 1


@pytest.mark.parametrize(
    ("scale", "digest"),
    [
        (Fraction(1, 1000), "4c2bca72a0d045aa"),
        (Fraction(1, 2), "5294e48500810a6a"),
        (Fraction(3, 2), "cba30d68c5813cb5"),
        (Fraction(1000, 7), "2de3f0891879ae17"),
        (Fraction(10**6, 3), "c9407146e647a893"),
    ],
)
def test_integer_sampler_draws_as_the_fraction_one(scale: Fraction, digest: str) -> None:
    """The samplers work in integers: the same draws, asked with the same bounds, as CKS over
    ``Fraction``s (whose ``gamma / k`` is in lowest terms), so a seeded engine's noise is
    unchanged. The Laplace draws and bounds of 40 seeds are those the ``Fraction`` sampler gave
    (their digest, recorded at 78b2c53); Bernoulli draws are checked against it here."""
    record = []
    for seed in range(40):
        rng = _Recording(seed)
        record.append(([discrete_laplace(scale, rng) for _ in range(5)], rng.asked))
    assert hashlib.sha256(repr(record).encode()).hexdigest()[:16] == digest
    for seed in range(40):
        ours, theirs = _Recording(seed), _Recording(seed)
        gammas = [Fraction(seed, 7), Fraction(0), Fraction(1), Fraction(5, 2)]
        assert [bernoulli_exp(g, ours) for g in gammas] == [
            _fraction_bernoulli_exp(g, theirs) for g in gammas
        ]
        assert ours.asked == theirs.asked


def test_public_numbers_and_steps_are_read_once() -> None:
    """A statement's values share their weights and half-width: read and stepped once each."""
    query = LinearQuery.from_dense([0.3, 0.6])
    assert noise_step(query, 12.34) is noise_step(LinearQuery.from_dense([0.9, 0.3]), 12.34)
    assert public_fraction(0.3) is public_fraction(0.3) == Fraction(3, 10)


def test_granularity_reads_weights_as_written() -> None:
    assert granularity(LinearQuery.from_dense([0.1, 0.3])) == Fraction(1, 10)
    assert granularity(LinearQuery.from_dense([2.0, -4.0, 6.0])) == 2
    assert public_fraction(2.5e-7) == Fraction(1, 4_000_000)


def test_the_lattice_of_a_few_weights_is_found_once_for_them() -> None:
    """A value's decision and its noise both read its lattice: found once for its weights."""
    shape = (4, 3)
    value = np.zeros((1, 4, 3))
    value[0, 1, :] = [0.3, 0.6, 0.3]
    again = LinearQuery.from_tensor(shape, value.copy())
    assert granularity(again) is granularity(LinearQuery.from_tensor(shape, value))
    assert granularity(again) == Fraction(3, 10)
    many = LinearQuery.from_dense(np.tile([0.3, 0.6, -0.9], 40))  # 120 weights: not kept
    assert granularity(many) == Fraction(3, 10)


@settings(max_examples=80, deadline=None)
@given(
    weights=st.lists(
        st.sampled_from([0.5, 1.0, 2.0, 3.0, -1.0, 0.25, 0.1, 1.5]), min_size=1, max_size=5
    ),
    half_width=st.one_of(
        st.sampled_from([0.3, 1.0, 2.5, 7.0, 15.0, 1023.99999, 1234.5]),
        st.floats(0.01, 1e6, allow_nan=False),
    ),
)
def test_noise_step_divides_answers_and_fits_the_half_width(
    weights: list[float], half_width: float
) -> None:
    query = LinearQuery.from_dense(weights)
    step = noise_step(query, half_width)
    eps = public_fraction(half_width)
    assert (granularity(query) / step).denominator == 1  # every exact answer is on the lattice
    assert step <= eps / 1024  # fine: the coupling allowance is negligible
    assert 2 * ((eps / step) % 1) <= 1  # so the fresh budget never exceeds S ln(1/delta)/eps


def test_snap_undoes_floating_point_error_only() -> None:
    assert snap(0.1 + 0.2, Fraction(1, 10)) == Fraction(3, 10)
    assert snap(7, Fraction(1, 2)) == 7


def test_noisy_value_is_exactly_on_the_lattice() -> None:
    rng = SeededRandomSource(9)
    step = Fraction(1, 1024)
    for _ in range(200):
        value = noisy_value(
            41.99999999997,
            sensitivity=Fraction(2),
            budget=Fraction(1, 10),
            lattice=Fraction(1),
            step=step,
            rng=rng,
        )
        assert (value / step).denominator == 1


def test_noisy_value_refuses_a_step_that_misses_the_lattice() -> None:
    with pytest.raises(ValueError):
        noisy_value(
            1.0,
            sensitivity=Fraction(1),
            budget=Fraction(1),
            lattice=Fraction(1, 3),
            step=Fraction(1, 2),
            rng=SeededRandomSource(0),
        )


def _imported_modules(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def _numpy_random_calls(tree: ast.AST) -> list[str]:
    """Calls like ``np.random.default_rng(...)`` (annotations naming a Generator are fine)."""
    calls = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            text = ast.unparse(node.func)
            if text.startswith(("np.random.", "numpy.random.")):
                calls.append(text)
    return calls


def test_only_noise_module_touches_randomness() -> None:
    for path in ENGINE.glob("*.py"):
        tree = ast.parse(path.read_text())
        imported = _imported_modules(tree)
        if path.name == "noise.py":
            assert {"secrets", "random"} <= imported
        else:
            assert not imported & {"secrets", "random", "numpy.random"}, path.name
        # numpy generators are passed in by callers (the Monte Carlo reference), never made here
        assert not _numpy_random_calls(tree), path.name
