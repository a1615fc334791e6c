"""Error tails against high-precision mpmath references, and the papers' MC/PC methods."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

import mpmath as mp
import numpy as np
import pytest

from proxy.engine import PrivacyEngine, QueryRequest
from proxy.engine.history import HistoryEntry
from proxy.engine.tails import (
    EXACT,
    ConvolutionTail,
    ExactTail,
    MonteCarloTail,
    Runs,
    discrete_laplace_tail,
    distinct_tail,
    dominant_tail,
    laplace_sum_tail,
    quantile,
    tail_lower_bound,
)
from sqlmap.accuracy import AccuracyRequest
from sqlmap.vector import LinearQuery
from tests.engine.groups import first_two_dimensions


def _equal_scales_tail(n: int, b: float, x: float) -> mp.mpf:
    """P(|sum of n iid Lap(b)| > x): the density is e^-|z| times a polynomial (no cancellation)."""
    z = mp.mpf(x) / b
    total = mp.mpf(0)
    for j in range(n):
        weight = mp.factorial(2 * n - 2 - j) / (mp.factorial(j) * mp.factorial(n - 1 - j))
        total += weight * 2**j * mp.gammainc(j + 1, z)
    return 2 * total / (2 ** (2 * n - 1) * mp.factorial(n - 1))


def _distinct_scales_tail(scales: list[float], x: float) -> mp.mpf:
    """Partial fractions, exact for distinct scales; 60 digits absorb the cancellation."""
    with mp.workdps(60):
        b = [mp.mpf(v) for v in scales]
        total = mp.mpf(0)
        for k, bk in enumerate(b):
            weight = mp.fprod(bk**2 / (bk**2 - bj**2) for j, bj in enumerate(b) if j != k)
            total += weight * mp.exp(-mp.mpf(x) / bk)
        return +total


def _inversion_tail(scales: dict[float, int], x: float) -> mp.mpf:
    """1 - (2/pi) int_0^inf sin(sx)/s phi(s) ds at 40 digits, for scale -> multiplicity."""
    with mp.workdps(40):
        factors = [(mp.mpf(b) ** 2, count) for b, count in scales.items()]
        xm = mp.mpf(x)

        def phi(s: mp.mpf) -> mp.mpf:
            return mp.fprod((1 + b2 * s * s) ** -count for b2, count in factors)

        end = 1 / mp.sqrt(max(b2 for b2, _ in factors))
        while phi(end) > mp.mpf("1e-45"):
            end *= 2
        pieces = mp.linspace(0, end, max(8, int(end * xm / mp.pi) + 1) + 1)
        inside = mp.quad(lambda s: xm * phi(s) if s == 0 else mp.sin(s * xm) / s * phi(s), pieces)
        return 1 - 2 / mp.pi * inside


def _assert_close(value: float, reference: mp.mpf) -> None:
    # ~1e-12 absolute is the method's budget; relative 1e-5 matters only for tails ~1e-9.
    assert abs(value - float(reference)) <= max(2e-12, 1e-5 * float(reference)), (
        value,
        float(reference),
    )


@pytest.mark.parametrize("b", [0.01, 1.0, 37.5])
@pytest.mark.parametrize("tail", [0.5, 1e-3, 1e-9])
def test_single_term_is_exponential(b: float, tail: float) -> None:
    x = -b * math.log(tail)
    _assert_close(laplace_sum_tail([b], x), mp.exp(-mp.mpf(x) / b))


@pytest.mark.parametrize("n", [2, 3, 7, 40])
@pytest.mark.parametrize("quantile_of", [0.3, 1e-4, 1e-9])
def test_equal_scales(n: int, quantile_of: float) -> None:
    x = quantile(EXACT, [2.0] * n, quantile_of)
    _assert_close(laplace_sum_tail([2.0] * n, x), _equal_scales_tail(n, 2.0, x))
    assert float(_equal_scales_tail(n, 2.0, x)) == pytest.approx(quantile_of, rel=1e-5)


@pytest.mark.parametrize(
    "scales",
    [
        [1.0, 1.0 + 1e-9],
        [1.0, 1.0 + 1e-5],
        [1.0, 1.0 + 1e-9, 1.0 + 2e-9],
        [3.0, 3.0 * (1 + 1e-7), 0.5, 0.5 * (1 + 1e-7)],
        [5.0, 0.01, 0.02],  # one dominant term: slowly decaying characteristic function
    ],
)
@pytest.mark.parametrize("quantile_of", [0.2, 1e-9])
def test_near_equal_and_lopsided_scales(scales: list[float], quantile_of: float) -> None:
    x = quantile(EXACT, scales, quantile_of)
    _assert_close(laplace_sum_tail(scales, x), _distinct_scales_tail(scales, x))


@pytest.mark.parametrize(
    "scales",
    [
        [5.0, 0.01, 0.02],
        [1.0, 1e-3, 2e-3, 3e-3],
        [2.0, 0.03, 0.025, 0.02, 0.015, 0.01],
        [1.0, 1e-4 * (1 + 1e-9), 1e-4],  # near-equal small terms: no cancellation here
    ],
)
@pytest.mark.parametrize("quantile_of", [0.5, 0.05, 1e-6])
def test_a_dominant_term_has_a_closed_form_upper_bound(
    scales: list[float], quantile_of: float
) -> None:
    reference = _distinct_scales_tail(scales, quantile(EXACT, scales, quantile_of))
    x = quantile(EXACT, scales, quantile_of)
    value, error = dominant_tail(scales, x)
    assert error <= 1e-13
    assert float(reference) <= value + 1e-15 and value - float(reference) <= error + 1e-15
    _assert_close(laplace_sum_tail(scales, x), reference)
    assert float(reference) <= quantile_of + 1e-12  # the quantile is on the safe side ...
    assert float(_distinct_scales_tail(scales, x * (1 - 1e-9))) > quantile_of - 1e-12  # ... tight


def test_the_dominant_form_is_refused_where_its_error_is_not_negligible() -> None:
    value, error = dominant_tail([1.0, 0.5, 0.5], 1.0)
    assert error > 1e-3 and 0 < value < 1
    assert dominant_tail([1.0, 1.0, 0.1], 3.0)[1] == math.inf  # no single term dominates
    # the tail then comes from the inversion, which agrees with the reference
    _assert_close(
        laplace_sum_tail([1.0, 0.5, 0.25], 1.0), _distinct_scales_tail([1.0, 0.5, 0.25], 1.0)
    )


def test_thousand_equal_terms() -> None:
    for x in (60.0, 250.0):  # tails ~0.16 and ~1.7e-8
        _assert_close(laplace_sum_tail([1.0] * 1000, x), _equal_scales_tail(1000, 1.0, x))


def test_mixed_terms_against_inversion_at_forty_digits() -> None:
    scales = list(np.random.default_rng(5).uniform(0.1, 3.0, 25))
    sd = math.sqrt(2 * sum(b * b for b in scales))
    x = 5.5 * sd  # a tail of ~1e-8
    _assert_close(laplace_sum_tail(scales, x), _inversion_tail(dict.fromkeys(scales, 1), x))


@pytest.mark.slow
def test_thousand_mixed_terms_against_inversion_at_forty_digits() -> None:
    scales = list(np.random.default_rng(6).uniform(0.01, 2.0, 1000))
    sd = math.sqrt(2 * sum(b * b for b in scales))
    for x in (2.0 * sd, 6.0 * sd):  # down to ~1e-9
        _assert_close(laplace_sum_tail(scales, x), _inversion_tail(dict.fromkeys(scales, 1), x))


def test_thousands_of_tiny_terms_beside_large_ones() -> None:
    # 5000 small terms go through the power-series path; the reference keeps them all.
    scales = {4.0: 1, 2.5: 1, 1.0: 1, 1e-3: 2000, 2e-2: 3000}
    flat = [b for b, count in scales.items() for _ in range(count)]
    for x in (6.0, 40.0):
        _assert_close(laplace_sum_tail(flat, x), _inversion_tail(scales, x))


def test_quantile_inverts_the_tail() -> None:
    scales = np.array([3.0, 1.0, 0.5, 0.25])
    for delta in (0.5, 0.05, 1e-6):
        w = quantile(EXACT, scales, delta)
        # One node set serves the whole root search, so a fresh evaluation may differ by the
        # method's ~1e-13 error.
        assert EXACT.tail(scales, w) <= delta + 1e-12
        assert EXACT.tail(scales, w * (1 - 1e-9)) > delta - 1e-12


def test_no_terms_means_no_error() -> None:
    assert laplace_sum_tail([], 0.0) == 0.0
    assert quantile(EXACT, [], 0.05) == 0.0
    assert laplace_sum_tail([1.0, 2.0, 3.0], -1.0) == 1.0


def test_discrete_laplace_tail_matches_the_mass_function() -> None:
    r = 0.8
    mass = {z: (1 - r) / (1 + r) * r ** abs(z) for z in range(-400, 401)}
    for k in (0, 1, 5, 30):
        direct = sum(p for z, p in mass.items() if abs(z) >= k)
        assert discrete_laplace_tail(-math.log(r), k) == pytest.approx(direct, abs=1e-12)
    # a fine lattice: the continuous limit exp(-x/b), to the lattice's first order
    b, step = 3.0, 1e-7
    assert discrete_laplace_tail(step / b, round(6.0 / step)) == pytest.approx(
        math.exp(-2.0), rel=1e-6
    )


def test_papers_methods_approximate_the_exact_tail() -> None:
    scales = np.array([4.0, 3.0, 2.0, 1.0])
    x = quantile(EXACT, scales, 0.05)
    mc = MonteCarloTail(np.random.default_rng(0), samples=200_000)
    # 4 binomial standard errors at 200k samples.
    assert mc.tail(scales, x) == pytest.approx(0.05, abs=4 * math.sqrt(0.05 * 0.95 / 200_000))
    # The paper's settings (unit bins, gamma = 0.01 of mass dropped) are off by a few percent;
    # finer bins and negligible truncation make PC converge.
    assert ConvolutionTail().tail(scales, x) == pytest.approx(0.05, rel=0.1)
    assert ConvolutionTail(gamma=1e-9, step=0.02).tail(scales, x) == pytest.approx(0.05, rel=5e-3)
    assert mc.quantile(scales, 0.05) == pytest.approx(x, rel=0.02)


def test_the_dominant_quantile_is_skipped_only_where_it_would_be_refused() -> None:
    # The bound on the dominant form's width may settle that it cannot apply; where it does,
    # the full test (the rest's log-MGF) must refuse it too, and where it does not, the result
    # is the one the full test gives.
    from proxy.engine.tails import Runs, _dominant_error, _log_mgf, _may_dominate, _separated

    rng = np.random.default_rng(11)
    skipped = taken = 0
    for _ in range(400):
        n = int(rng.integers(3, 200))
        scales = rng.exponential(1.0, n) * rng.choice([1e-3, 1e-2, 0.1, 1.0], n)
        scales[0] = float(rng.choice([1.0, 5.0, 50.0, 500.0]))
        delta = float(rng.choice([0.5, 0.05, 1e-3, 1e-6]))
        b = Runs.of(scales)
        found = EXACT._dominant_quantile(b, delta)
        if not _separated(b):
            assert found is None
            continue
        top = float(b.values[0])
        w = top * (math.log(1.0 / delta) + _log_mgf(b.rest(), 1.0 / top))
        applies = _may_dominate(b, w, EXACT.trunc_tol) and _dominant_error(b, w) <= EXACT.trunc_tol
        assert (found is not None) == applies
        if found is None:
            skipped += 1
        else:
            taken += 1
            assert EXACT.tail(scales, found) <= delta
    assert skipped > 50 and taken > 50  # both ways exercised


def _batch_matches_one_at_a_time(scales: np.ndarray, delta: float) -> None:
    batch = EXACT.quantiles(scales, delta)
    one = np.array([EXACT.quantile(row, delta) for row in scales])
    np.testing.assert_allclose(batch, one, rtol=1e-10, atol=0.0)  # ~1e-13 in the tail
    for row, w in zip(scales, batch):  # the tail there is delta, to the method's error budget
        assert EXACT.tail(row, w) <= delta + 2 * (EXACT.alias_tol + EXACT.trunc_tol)


def test_batched_quantiles_match_one_at_a_time_on_random_matrices() -> None:
    # Rows as a GROUP BY's BLUEs give them: the same terms (columns), many repeated (rows of
    # one vector at one budget), a spread of magnitudes; some rows dominated by one term, some
    # with only one or two terms, some with ties at the top.
    rng = np.random.default_rng(23)
    kinds = set()
    for trial in range(120):
        n_rows = int(rng.integers(1, 25))
        distinct = int(rng.integers(1, 400))
        columns = rng.exponential(1.0, (n_rows, distinct)) * rng.choice(
            [1e-9, 1e-4, 1e-2, 0.1, 1.0], (n_rows, distinct)
        )
        columns[rng.random((n_rows, distinct)) < 0.1] = 0.0
        scales = columns[:, rng.integers(0, distinct, int(rng.integers(1, 3 * distinct + 2)))]
        if trial % 4 == 1:
            scales[0, 0] = 50.0 * scales.max()  # a dominant term
        if trial % 4 == 2 and scales.shape[1] > 3:
            scales[-1, 2:] = 0.0  # two terms at most
        if trial % 4 == 3 and scales.shape[1] > 3:
            scales[:, 1] = scales[:, 0] = scales.max()  # tied at the top
        delta = float(rng.choice([0.5, 0.2, 0.05, 1e-3, 1e-6]))
        _batch_matches_one_at_a_time(scales, delta)
        values, counts = _merge_for_test(scales)
        from proxy.engine.tails import _BatchSeries

        table = _BatchSeries.fixed(values, counts)
        kinds.add(bool(EXACT._closed_forms(values, counts, delta, table).all()))
    assert kinds == {True, False}  # both the inversion and the closed forms exercised


def _merge_for_test(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    from proxy.engine.tails import _merge_columns

    return _merge_columns(np.abs(scales))


def test_batched_quantiles_of_counted_columns_match_the_expanded_rows() -> None:
    # Columns the caller merged (a history's classes of rows) with their counts: the same
    # quantiles as each row with every column repeated, one at a time.
    rng = np.random.default_rng(29)
    for trial in range(60):
        n_rows, distinct = int(rng.integers(2, 22)), int(rng.integers(2, 300))
        values = rng.exponential(1.0, (n_rows, distinct)) * rng.choice(
            [1e-6, 1e-2, 0.1, 1.0], (n_rows, distinct)
        )
        if trial % 3 == 1:
            values[0, 0] = 40.0 * values.max()  # a dominant term
        counts = rng.integers(1, 50, distinct).astype(np.float64)
        delta = float(rng.choice([0.5, 0.05, 1e-3, 1e-6]))
        batch = EXACT.quantiles(values, delta, counts)
        rows = np.repeat(values, counts.astype(np.int64), axis=1)
        one = np.array([EXACT.quantile(row, delta) for row in rows])
        np.testing.assert_allclose(batch, one, rtol=1e-10, atol=0.0)
        for row, w in zip(rows, batch):
            assert EXACT.tail(row, w) <= delta + 2 * (EXACT.alias_tol + EXACT.trunc_tol)
    with pytest.raises(ValueError, match="count"):
        EXACT.quantiles(np.ones((2, 3)), 0.05, np.ones(2))


def test_counted_runs_from_any_starting_order_are_the_sorted_ones_to_the_bit() -> None:
    # A mixture's classes at the next lam, sorted from the last lam's order: whether that
    # order still sorts them, nearly does, or is any permutation, the runs and the order
    # returned are what a fresh sort gives (zeros dropped, negative counts taken off).
    from proxy.engine.tails import Runs

    rng = np.random.default_rng(41)
    for trial in range(40):
        n = int(rng.integers(1, 400))
        values = rng.choice(rng.exponential(1.0, max(1, n // 3)), n)  # repeats to merge
        values[rng.random(n) < 0.1] = 0.0
        counts = rng.integers(1, 9, n).astype(np.float64)
        counts[rng.random(n) < 0.1] = -1.0
        last = None
        for lam in (0.3, 0.3 + 1e-9, 0.7, float(rng.random())):
            scaled = lam * values
            scaled[: 1 + trial % 4] *= 1.5  # a few entries move (the anchor's rows)
            fresh = Runs.of_counted(scaled, counts)
            starts = [None, last, rng.permutation(n)]
            for start in starts:
                runs, last = Runs.of_counted_near(scaled, counts, start)
                assert np.array_equal(runs.values, fresh.values)
                assert np.array_equal(runs.counts, fresh.counts)
                assert np.all(np.diff(scaled[last]) <= 0)


def test_a_node_set_sums_each_threshold_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # Brent's method evaluates the bracket's ends the quantile has just checked, and the safe
    # side its root again: the node set keeps each threshold's tail, the value summed
    b = Runs.of([3.0, 1.0, 0.7, 0.2, 0.2, 0.05])
    x = ExactTail().quantile(b, 0.05)
    nodes = ExactTail()._nodes(b, 0.5 * x, 2.0 * x)
    summed = ExactTail()._nodes(b, 0.5 * x, 2.0 * x).tail(x)
    sums: list[int] = []
    sin = np.sin
    monkeypatch.setattr(np, "sin", lambda phase: sums.append(phase.size) or sin(phase))
    assert nodes.tail(x) == summed == nodes.tail(x) and sums == [nodes.s.size]
    assert nodes.tail(1.5 * x) < summed and len(sums) == 2


def test_distinct_scales_tail_is_within_its_error_bound_of_the_reference() -> None:
    # partial fractions cancel as scales near each other: the bound grows with that, and holds
    rng = np.random.default_rng(11)
    cases = [[3.0, 1.0, 0.7, 0.2, 0.05], [1.0, 1.0 + 1e-5, 0.5], [118.2, 75.9, 60.1, 50.3, 40.2]]
    cases += [list(rng.uniform(0.1, 3.0, n)) for n in (3, 5, 8, 16) for _ in range(5)]
    checked = 0
    for scales in cases:
        runs = Runs.of(scales)
        sd = math.sqrt(2 * sum(b * b for b in scales))
        for x in (0.3 * sd, 2.0 * sd, 6.0 * sd):
            found = distinct_tail(runs, x)
            if found is not None:  # (refused where the rounding could pass 1e-6 of a term)
                value, error = found
                assert abs(value - float(_distinct_scales_tail(scales, x))) <= error
                checked += 1
    assert checked >= 3 * len(cases) - 2
    # separated scales (a query measured at budgets a fifth or more apart): near exact
    for scales in (cases[0], cases[2]):
        found = distinct_tail(Runs.of(scales), 2.0 * math.sqrt(2 * sum(b * b for b in scales)))
        assert found is not None and found[1] < 1e-14
    for x in np.linspace(1400.0, 1490.0, 91):  # subnormal exponentials: absolute rounding
        value, error = distinct_tail(Runs.of([2.0, 1.0, 0.5]), float(x)) or (math.nan, 0.0)
        assert abs(value - float(_distinct_scales_tail([2.0, 1.0, 0.5], float(x)))) <= error
    assert distinct_tail(Runs.of([3.0, 1.0, 1.0]), 2.0) is None  # a repeated scale
    assert distinct_tail(Runs.of([3.0, 1.0]), 0.0) is None
    assert distinct_tail(Runs.of(list(rng.uniform(0.1, 3.0, 17))), 2.0) is None


@pytest.mark.parametrize(
    "scales",
    [[1.0] * 4, [2.0, 1.0, 1.0], [1.2, 0.49, 0.49, 0.24, 0.24, 0.24, 0.12, 0.12], [3.0, 3.0, 0.5]],
)
def test_repeated_scales_shrunk_apart_bound_the_tail_from_below(scales: list[float]) -> None:
    # against the equal scales' closed form, else the inversion (2e-13 from the exact tail)
    runs = Runs.of(scales)
    sd = math.sqrt(2 * sum(b * b for b in scales))
    for x in (0.3 * sd, 2.0 * sd, 5.0 * sd):
        bound = tail_lower_bound(runs, x)
        if runs.values.size == 1:
            exact = float(_equal_scales_tail(len(scales), scales[0], x))
        else:
            exact = EXACT.tail(np.array(scales), x) + 2e-13
        assert bound is not None and 0.8 * exact < bound <= exact
    assert tail_lower_bound(Runs.of([1.0] * 17), 3.0) is None


def test_merged_columns_are_exactly_the_distinct_columns() -> None:
    rng = np.random.default_rng(5)
    base = rng.exponential(1.0, (6, 40))
    picks = rng.integers(0, 40, 500)
    values, counts = _merge_for_test(base[:, picks])
    assert values.shape[1] == np.unique(picks).size and counts.sum() == 500
    expected = {tuple(base[:, k]): int((picks == k).sum()) for k in np.unique(picks)}
    assert {tuple(c): int(n) for c, n in zip(values.T, counts)} == expected


def _group_by_engine(tail: ExactTail = EXACT) -> tuple[PrivacyEngine, list[LinearQuery]]:
    """An engine over a 4 x 3 x 5 cube with 300 random answers, and a GROUP BY's groups."""
    rng = np.random.default_rng(3)
    shape = (4, 3, 5)
    history = []
    for _ in range(300):
        axes = tuple(sorted(rng.choice(3, int(rng.integers(1, 3)), replace=False).tolist()))
        tensor = rng.random(tuple(n if d in axes else 1 for d, n in enumerate(shape))) < 0.6
        if not tensor.any():
            tensor.flat[0] = True
        query = LinearQuery.from_tensor(shape, tensor.astype(float))
        budget = Fraction(int(rng.integers(1, 20)), 100)
        history.append(HistoryEntry("t", query, budget, Fraction(1), float(rng.normal(50, 5))))
    engine = PrivacyEngine(
        "t", 60, total_budget=Fraction(10**6), history=history, shape=shape, tail=tail
    )
    return engine, first_two_dimensions(shape)


def test_batched_quantiles_of_a_group_by_over_a_real_history() -> None:
    # The BLUEs of a GROUP BY's groups over an engine's history: what the engine batches.
    engine, groups = _group_by_engine()
    solutions = [s for s in engine._index.solve_many(groups) if s is not None]
    assert len(solutions) == len(groups)
    assert all(np.array_equal(s.rows, solutions[0].rows) for s in solutions)
    scales = np.stack([s.scales for s in solutions])
    for delta in (0.05, 1e-4):
        _batch_matches_one_at_a_time(scales, delta)
    # and the engine's plan of that batch finds the widths it would find one by one
    accuracy = AccuracyRequest(5.0, 0.95)
    plan = engine.plan([QueryRequest(q, accuracy) for q in groups])
    alone = [engine.plan([QueryRequest(q, accuracy)]).decisions[0] for q in groups]
    for together, single in zip(plan.decisions, alone):
        assert together.source == single.source
        assert together.half_width == pytest.approx(single.half_width, rel=1e-11)


@dataclass(frozen=True, eq=False)
class _CountingBatches(ExactTail):
    """The exact tail, counting the rows whose quantiles it finds together."""

    rows: list[int] = field(default_factory=list)

    def quantiles(
        self, scales: np.ndarray, delta: float, counts: np.ndarray | None = None
    ) -> np.ndarray:
        self.rows.append(scales.shape[0])
        return super().quantiles(scales, delta, counts)


@pytest.mark.parametrize(
    ("eps", "source", "together"), [(40.0, "history", [11]), (2.0, "fresh", [])]
)
def test_a_group_bys_tails_are_found_together_only_once_a_value_is_answered_from_history(
    eps: float, source: str, together: list[int]
) -> None:
    # A value that measures re-solves every later one: tails found together for them before
    # would go unused. Once the first is answered from history, the rest are found together.
    tail = _CountingBatches()
    engine, groups = _group_by_engine(tail)
    plan = engine.plan([QueryRequest(q, AccuracyRequest(eps, 0.95)) for q in groups])
    assert {d.source for d in plan.decisions} == {source}
    assert tail.rows == together
    for decision, q in zip(plan.decisions, groups):
        single = engine.plan([QueryRequest(q, AccuracyRequest(eps, 0.95))]).decisions[0]
        assert decision.half_width == pytest.approx(single.half_width, rel=1e-11)


def test_joined_runs_are_the_arrays_runs_and_give_their_tails() -> None:
    # a history estimate's terms sorted once, then scaled with one larger term added at each
    # budget a combined decision tries: the runs the arrays would give, tails to rounding,
    # the power sums shared among them and never mixed up
    from proxy.engine.tails import Runs, _sum_log1p, error_terms

    rng = np.random.default_rng(5)
    scales = np.repeat(rng.gamma(2.0, 0.3, 400), rng.integers(1, 6, 400))
    rng.shuffle(scales)
    base = error_terms(scales)
    largest = float(scales.max())
    # the new term above all the others, among them, and below them all
    for factor, above in ((0.9, 1.5), (0.3, 1.01), (0.999, 0.5), (0.5, 30.0), (0.9, 1e-3)):
        top = factor * largest * above
        joined = base.joined(factor, top)
        plain = Runs.of(np.append(factor * scales, top))
        assert joined is not None
        assert np.array_equal(joined.values, plain.values)
        assert np.array_equal(joined.counts, plain.counts) and joined.size == plain.size
        # frequencies where every term, the top one too, goes through the series: its power
        # sums count the top term, which its siblings do not have
        for s in (np.array([0.01, 0.1 / top]), np.array([0.5, 4.0 / top]), np.array([9.0])):
            for sign in (1.0, -1.0):
                if sign < 0 and s[-1] * joined.values[0] >= 1:
                    continue
                assert np.allclose(
                    _sum_log1p(joined, s, sign), _sum_log1p(plain, s, sign), rtol=1e-13, atol=0
                )
        for x in (0.5 * top, 2.0 * top, 8.0 * top):
            assert EXACT.tail(joined, x) == pytest.approx(EXACT.tail(plain, x), rel=1e-12)
        for split in range(joined.values.size + 1):  # taken from the base's, scaled
            assert np.allclose(joined.moments(split), plain.moments(split), rtol=1e-14, atol=0)
        assert EXACT.quantile(joined, 0.05) == pytest.approx(EXACT.quantile(plain, 0.05), rel=1e-12)
    # counted classes sort to the same runs as the rows
    values, first, counts = np.unique(scales, return_index=True, return_counts=True)
    by_class = error_terms(scales[first], counts.astype(np.float64))
    assert np.array_equal(by_class.values, base.values)
    assert np.array_equal(by_class.counts, base.counts)
    assert values.size == base.values.size


def test_joined_runs_keep_apart_what_the_arrays_would_merge() -> None:
    # ties of the new term, and runs a factor rounds together, stay apart: the same terms,
    # so the same tails, without sorting every row again (which once took a third of the
    # budgets a combined decision tried on the wide cube)
    from proxy.engine.tails import Runs, error_terms

    scales = np.array([2.0, 1.9, 1.9, math.nextafter(1.9, 2.0), 0.25, 0.25, 0.1])
    base = error_terms(scales)
    # ties the largest; ties another; 1.9 and the next float times 0.53009... round alike
    for factor, top in ((1.0, 2.0), (0.5, 0.125), (0.5300920184036808, 1.5)):
        joined = base.joined(factor, top)
        plain = Runs.of(np.append(factor * scales, top))
        assert joined is not None and joined.size == plain.size
        assert joined.values.size == plain.values.size + 1  # two runs of one value
        assert np.array_equal(joined.expanded(), plain.expanded())
        for x in (0.5, 2.0, 7.0):
            assert EXACT.tail(joined, x * top) == pytest.approx(
                EXACT.tail(plain, x * top), rel=1e-12
            )
    assert base.joined(0.0, 1.0) is None  # no terms left but the top
    assert base.joined(1.0, math.inf) is None
    assert base.joined(1e-323, 1.0) is None  # the smallest term rounds to zero


def test_large_terms_are_counted_by_bisection_as_by_scanning() -> None:
    from proxy.engine.tails import _SERIES_RADIUS, _count_large

    rng = np.random.default_rng(11)
    for size in (0, 1, 2, 7, 300):
        values = np.sort(np.repeat(rng.gamma(1.0, 2.0, size), rng.integers(1, 3, size)))[::-1]
        # the largest, ties, every term, none, and the radius hit exactly by one product
        edges = [1.0, 1e-9, 1e9] + [_SERIES_RADIUS / float(v) for v in values[:: max(1, size // 5)]]
        for s_max in edges:
            expected = int(np.count_nonzero(values * s_max > _SERIES_RADIUS))
            assert _count_large(values, s_max) == expected


def test_a_table_of_powers_sums_the_series_as_horner_does() -> None:
    from proxy.engine.tails import _POWER_TABLE, _SERIES_TERMS, _polynomial

    rng = np.random.default_rng(12)
    for size in (1, 40, 250, _POWER_TABLE):
        u = rng.random(size)
        # a series' coefficients: alternating, shrinking by about 4 an order
        coefficients = rng.normal(1.0, 0.1, _SERIES_TERMS) * (-0.25) ** np.arange(_SERIES_TERMS)
        horner = u * coefficients[-1]
        for r in range(_SERIES_TERMS - 2, -1, -1):
            horner = (horner + coefficients[r]) * u
        assert np.allclose(_polynomial(u, coefficients), horner, rtol=1e-14, atol=1e-300)


def _scaled_cases() -> list[tuple[str, np.ndarray, tuple[float, float], float]]:
    """(name, E's scales, the range of r, the largest threshold) of a combined decision's sums."""
    rng = np.random.default_rng(11)
    history = np.repeat(rng.gamma(2.0, 0.3, 300), rng.integers(1, 6, 300))
    return [
        ("a history, r near its scales", history, (0.5, 2.0), 40.0),
        ("tiny r", history, (1e-6, 1e-3), 40.0),
        ("huge r", history, (20.0, 60.0), 400.0),
        ("one dominant term", np.append(rng.uniform(0.01, 0.05, 40), 3.0), (0.1, 0.8), 30.0),
        ("many equal scales", np.full(500, 0.2), (0.3, 3.0), 30.0),
        ("two terms", np.array([1.0, 0.4]), (0.05, 2.5), 25.0),
    ]


@pytest.mark.parametrize("case", range(6))
def test_scaled_tails_agree_with_each_sums_own_within_their_error_bounds(case: int) -> None:
    """One node set for ``E + r L`` over ranges of ``r`` and ``x``, against each sum's own tail.

    Both are within alias_tol + trunc_tol of the truth: they agree within twice that and
    rounding, at the ends of the ranges and inside.
    """
    from proxy.engine.tails import error_terms

    _, scales, (r_lo, r_hi), x_hi = _scaled_cases()[case]
    terms = error_terms(scales)
    rng = np.random.default_rng(case)
    x_lo = x_hi / 3
    shared = EXACT.scaled(terms, (r_lo, r_hi), (x_lo, x_hi), most=10**6)
    assert shared is not None
    bound = 2 * (EXACT.alias_tol + EXACT.trunc_tol) + 1e-14
    rs = np.concatenate([[r_lo, r_hi], np.exp(rng.uniform(math.log(r_lo), math.log(r_hi), 12))])
    xs = np.concatenate([[x_lo, x_hi], rng.uniform(x_lo, x_hi, 12)])
    for r, x in zip(rs, xs, strict=True):
        own = EXACT.tail(np.append(scales, r), x)
        assert abs(shared.tail(r, x) - own) <= bound, (r, x, shared.tail(r, x), own)
    with pytest.raises(ValueError, match="outside"):
        shared.tail(r_hi * 1.01, x_hi)
    with pytest.raises(ValueError, match="outside"):
        shared.tail(r_lo, x_lo * 0.99)


@pytest.mark.parametrize(
    ("history", "r"),
    [([1.0], 0.3), ([1.0], 3.0), ([2.0, 0.5], 1e-3), ([2.0, 0.5], 0.7), ([0.01, 0.02], 5.0)],
)
def test_scaled_tails_are_the_true_tail_within_their_error_bound(
    history: list[float], r: float
) -> None:
    """Against partial fractions at 60 digits (distinct scales: one or two terms and ``r``)."""
    from proxy.engine.tails import error_terms

    total = float(np.sum(history) + r)
    x_range = (0.5 * total, 6.0 * total)
    # few terms: phi decays slowly, too many nodes for a decision (``most``), right all the same
    shared = EXACT.scaled(error_terms(np.array(history)), (r, 1.5 * r), x_range, most=10**6)
    assert shared is not None
    for x in np.linspace(*x_range, 7):
        true = _distinct_scales_tail([*history, r], float(x))
        error = shared.tail(r, float(x)) - float(true)
        assert abs(error) <= EXACT.alias_tol + EXACT.trunc_tol + 1e-15, (x, error)


def test_many_equal_scales_and_r_among_them_are_the_true_tail() -> None:
    from proxy.engine.tails import error_terms

    shared = EXACT.scaled(error_terms(np.full(30, 0.5)), (0.4, 0.6), (2.0, 12.0), most=10**6)
    assert shared is not None
    for x in (2.0, 5.0, 12.0):
        error = shared.tail(0.5, x) - float(_equal_scales_tail(31, 0.5, x))
        assert abs(error) <= EXACT.alias_tol + EXACT.trunc_tol + 1e-15, (x, error)


def test_a_shared_node_set_is_refused_where_one_term_dominates() -> None:
    """The fresh term far above the history's: phi decays as its alone (1/s^2) for a long way,
    tens of thousands of nodes shared; each sum's own tail has a closed form then."""
    from proxy.engine.tails import _SHARED_NODES, error_terms

    terms = error_terms(np.full(50, 1e-4))
    assert EXACT.scaled(terms, (1.0, 4.0), (5.0, 20.0)) is None
    many = EXACT.scaled(terms, (1.0, 4.0), (5.0, 20.0), most=10**6)
    assert many is not None and many.s.size > _SHARED_NODES
    for r, x in ((1.0, 5.0), (4.0, 20.0), (2.0, 11.0)):
        value, error = dominant_tail(np.append(np.full(50, 1e-4), r), x)
        assert abs(many.tail(r, x) - value) <= error + EXACT.alias_tol + EXACT.trunc_tol


@pytest.mark.parametrize("case", range(6))
def test_one_node_set_serves_a_quantile_and_the_tails_with_one_more_term(case: int) -> None:
    """:meth:`ExactTail.quantile_and_scaled`: the quantile on nodes shared with ``E + r L``.

    Both are another valid node set's: the quantile agrees with :meth:`ExactTail.quantile`
    to its root search's rounding, and the tails of ``E + r L`` (``r`` from 0) with each
    sum's own within twice the error bound, at thresholds in the range and the quantile's.
    """
    from proxy.engine.tails import error_terms

    _, scales, (_, r_hi), x_hi = _scaled_cases()[case]
    terms = error_terms(scales)
    delta = 0.05
    width, shared = EXACT.quantile_and_scaled(terms, delta, r_hi, (x_hi / 3, x_hi), most=10**6)
    assert width == pytest.approx(EXACT.quantile(scales, delta), rel=1e-11)
    if shared is None:  # a closed form settles the quantile: no nodes to share
        assert EXACT._dominant_quantile(terms, delta) is not None or terms.size <= 2
        return
    assert shared.r_range == (0.0, r_hi)
    assert shared.x_range[0] <= min(x_hi / 3, width) and shared.x_range[1] >= x_hi
    bound = 2 * (EXACT.alias_tol + EXACT.trunc_tol) + 1e-14
    assert EXACT.tail(scales, width) <= delta + bound < EXACT.tail(scales, width * (1 - 1e-9))
    for r in (0.0, r_hi / 7, r_hi):
        for x in (shared.x_range[0], width, x_hi / 2, x_hi):
            own = EXACT.tail(np.append(scales, r) if r > 0 else scales, x)
            assert abs(shared.tail(r, x) - own) <= bound, (r, x)
    assert shared.alone().tail(width) == shared.tail(0.0, width)


def test_nodes_for_a_quantile_alone_start_at_r_zero() -> None:
    from proxy.engine.tails import error_terms

    shared = EXACT.scaled(error_terms(np.full(30, 0.5)), (0.4, 0.6), (2.0, 12.0), most=10**6)
    assert shared is not None
    with pytest.raises(ValueError, match="r_range to start at 0"):
        shared.alone()


def test_a_node_sum_is_within_its_rounding_bound_of_the_exact_sum() -> None:
    """:meth:`_Nodes.tail` sums its terms by numpy's pairwise sum, not ``fsum``: the terms are
    below ``2/(2j + 1)``, so it errs by under ``(log2 J + 8) u (ln J + 2)`` (2e-14 at 2,000
    nodes), far inside the slack a decision adds for the tails' 2e-13 (TAIL_SLACK)."""
    from proxy.engine.tails import _Nodes

    rng = np.random.default_rng(5)
    for size in (50, 400, 2000):
        scales = rng.uniform(0.5, 2.0, 3)
        j_half = np.arange(size) + 0.5
        s = j_half * (math.pi / 60.0)  # nodes for thresholds up to 60, past where phi is 1e-8
        phi = np.prod(1.0 / (1.0 + np.square(np.outer(s, scales))), axis=1)
        coefficients = phi / j_half
        bound = (math.log2(size) + 8) * 2.0**-53 * (math.log(size) + 2)
        for x in rng.uniform(0.5, 20.0, 20):
            exact = 1.0 - (2.0 / math.pi) * math.fsum((np.sin(s * x) * coefficients).tolist())
            assert 0.0 < exact < 1.0
            assert abs(exact - _Nodes(s, coefficients).tail(float(x))) <= bound


@pytest.mark.parametrize("factor", [0.2, 0.618, 1.0])
def test_an_amended_sum_has_the_tail_of_its_scales(factor: float) -> None:
    """``factor`` times a history's terms less a few of them, with a few others, as sorted.

    Both tails are within alias_tol + trunc_tol of the truth (and the amended one within its
    rounding bound): they agree within twice that; the history's power sums serve each factor.
    """
    from proxy.engine.tails import error_terms

    rng = np.random.default_rng(3)
    classes = rng.uniform(0.05, 1.0, 300)
    counts = rng.integers(1, 5, 300).astype(np.float64)
    terms = error_terms(classes, counts)
    scales = np.repeat(classes, counts.astype(np.int64))
    top = int(np.argmax(classes))
    picked = [top, *rng.choice(300, 3, replace=False).tolist()]
    removed = classes[picked]
    added = np.array([0.9, 0.4, 0.0, 0.05])
    rest = scales.tolist()
    for value in removed.tolist():
        rest.remove(value)
    amended = np.concatenate([factor * np.array(rest), added])
    bound = 2 * (EXACT.alias_tol + EXACT.trunc_tol) + 1e-14
    for x in (0.5, 2.0, 6.0, 15.0):
        x *= math.sqrt(factor)
        found = EXACT.amended_tail(terms, factor, removed, added, x)
        assert found is not None
        assert abs(found - EXACT.tail(amended, x)) <= bound, (x, found)


def test_an_amended_sum_is_left_to_its_sorted_terms_where_the_form_does_not_serve() -> None:
    from proxy.engine.tails import error_terms

    terms = error_terms(np.array([2.0, 0.5, 0.5, 0.4, 0.3]))
    added = np.array([0.8])
    # the largest run all removed (the rest's log-MGF past its pole at the Chernoff grid)
    assert EXACT.amended_tail(terms, 0.5, np.array([2.0]), added, 3.0) is None
    assert EXACT.amended_tail(terms, 0.5, np.array([0.5]), added, 3.0) is not None
    # one added term dominates (its closed form may settle the tail), no threshold, few terms
    assert EXACT.amended_tail(terms, 0.01, np.zeros(0), np.array([5.0]), 100.0) is None
    assert EXACT.amended_tail(terms, 0.5, np.zeros(0), added, 0.0) is None
    two = error_terms(np.array([1.0, 0.5]))
    assert EXACT.amended_tail(two, 0.5, np.array([0.5]), np.zeros(0), 1.0) is None
    # most of the largest terms out: their log1p cancel against b's log phi, past the bound
    for copies, kept in ((5, True), (40, False)):
        many = error_terms(np.concatenate([np.full(copies, 1e3), np.full(50, 0.01)]))
        found = EXACT.amended_tail(many, 1.0, np.full(copies - 2, 1e3), np.array([0.02]), 3e3)
        assert (found is not None) == kept
