"""The evaluation package (bench/evaluation): workload generator and the baselines' core math.

The papers' own worked examples are the references: the online paper's running example
(eqs. 10-44) for the greedy representations, the minimal budget and the per-cell cost; the
second paper's 8x4 example (eqs. 11-16) for the BLUE.
"""

from __future__ import annotations

import doctest
import math
from fractions import Fraction

import numpy as np
import pytest

from bench.evaluation.adult import Compaction
from bench.evaluation.greedy import GreedyHistory, Observation, posterior
from bench.evaluation.ledger import CellLedger
from bench.evaluation.linear import DenseHistory
from bench.evaluation.run import Setting, metrics, run_setting
from bench.evaluation.systems import (
    SYSTEMS,
    BluePC,
    Dpproxy,
    FixedBudget,
    GreedyBayes,
    ImprovedBaseline,
    OlsReuse,
    minimal_budget,
)
from bench.evaluation.workload import (
    DATA_DIR,
    DATASETS,
    MultinomialQueries,
    paper_stream,
    region_of_interest_law,
    tree_history,
)
from proxy.engine import AccuracyRequest, QueryRequest
from sqlmap.vector import LinearQuery
from tests.paper_examples import (
    EIGHT_BY_FOUR_ALPHA,
    EIGHT_BY_FOUR_H,
    EIGHT_BY_FOUR_Y,
    RUNNING_ALPHA,
    RUNNING_H,
    RUNNING_Q,
)

RUNNING_A = [float(a) for a in RUNNING_ALPHA]


def vector(row: list[float] | list[int]) -> LinearQuery:
    return LinearQuery.from_dense(np.array(row, dtype=float))


def test_region_of_interest_law_is_the_papers_eq_50() -> None:
    law = region_of_interest_law(40)
    assert law.sum() == pytest.approx(1.0)
    assert np.all(law[:10] == law[0]) and np.all(law[10:20] == law[10])
    assert law[10] / law[9] == pytest.approx(0.1) and law[30] / law[10] == pytest.approx(0.01)


def test_multinomial_queries_follow_the_law() -> None:
    queries = MultinomialQueries(region_of_interest_law(64), np.random.default_rng(5))
    drawn = [queries.query() for _ in range(3000)]
    trials = np.array([q.weights.sum() for q in drawn])
    assert set(trials.tolist()) == set(range(1, 11))  # n_t ~ U{1..10}
    assert abs(trials.mean() - 5.5) < 0.2
    hot = sum(q.weights[q.cells < 10].sum() for q in drawn) / trials.sum()
    assert abs(hot - 0.9 / 0.999) < 0.01  # the first ten cells take 90% of the draws
    assert all(q.sensitivity == q.weights.max() for q in drawn)


def test_paper_stream_is_reproducible_and_in_range() -> None:
    first = paper_stream(128, 50, (1.0, 1000.0), 0.2, seed=3)
    again = paper_stream(128, 50, (1.0, 1000.0), 0.2, seed=3)
    assert [i.requests[0] for i in first] == [i.requests[0] for i in again]
    eps = [i.requests[0].accuracy.eps for i in first]
    assert min(eps) >= 0.5 and max(eps) <= 500
    assert {round(i.requests[0].accuracy.delta, 9) for i in first} == {0.2}


def test_tree_history_spends_its_budget_on_every_cell() -> None:
    x = np.arange(16)
    entries = tree_history(x, Fraction(3, 10), np.random.default_rng(0))
    assert len(entries) == 31 and entries[0].query.cells.size == 16
    ledger = CellLedger(16, None)
    for e in entries:
        ledger.charge(e.query, float(e.budget))
        assert (e.noisy_answer * 1024) == round(e.noisy_answer * 1024)  # on the lattice
    assert ledger.spent == pytest.approx(0.3)
    assert np.allclose(ledger._spent, 0.3)


def test_minimal_budget_is_thm_3_7_and_exactly_enough() -> None:
    accuracy = AccuracyRequest(15.0, 0.8)
    alpha = minimal_budget(vector(RUNNING_Q), accuracy)
    assert alpha == pytest.approx(0.108, abs=1e-3)  # the running example's alpha
    q = vector([0, 3, 1])
    alpha = minimal_budget(q, accuracy)
    # Laplace(S / alpha) stays within eps with probability exactly 1 - delta
    assert 1 - math.exp(-accuracy.eps * alpha / q.sensitivity) == pytest.approx(0.8)


def test_cell_costs_reproduce_the_running_example() -> None:
    """Eq. (44): B after adding H8 = Q with alpha 0.108."""
    ledger = CellLedger(9, 1.0)
    for row, alpha in zip(RUNNING_H + [RUNNING_Q], RUNNING_A + [0.108]):
        ledger.charge(vector(row), alpha)
    expected = [0, 0.1, 0, 0, 0.408, 0.283, 0, 0.2, 0.2]
    assert ledger._spent.round(3).tolist() == expected
    assert ledger.spent == pytest.approx(0.408)
    assert not ledger.fits(vector([0, 0, 0, 0, 1, 0, 0, 0, 0]), 0.6)


def test_greedy_representations_reproduce_the_running_example() -> None:
    """Eq. (29): T1 = [0 0 1/2 -1/2 0 0 0], T2 = [0 1 0 0 1 0 0], T3 = [1 0 0 0 0 -1 1/2]."""
    history = GreedyHistory(9)
    for row, alpha in zip(RUNNING_H, RUNNING_A):
        history.append(vector(row), alpha, 0.0)
    found = history.find(vector(RUNNING_Q))
    dense = []
    for o in found:
        t = np.zeros(7)
        t[o.rows] = o.weights
        dense.append(t.round(9).tolist())
    assert dense == [
        [0, 0, 0.5, -0.5, 0, 0, 0],
        [0, 1, 0, 0, 1, 0, 0],
        [1, 0, 0, 0, 0, -1, 0.5],
    ]
    # eqs. (23), (25), (27): N1 = (N(0.05/4) - N(0.1/2)) / 2, ...
    assert found[0].scales.tolist() == pytest.approx([40.0, 10.0])
    assert found[2].scales.tolist() == pytest.approx([20.0, 20.0, 20.0])


def test_greedy_finds_nothing_outside_the_row_space() -> None:
    history = GreedyHistory(3)
    history.append(vector([1, 1, 0]), 1.0, 5.0)
    assert history.find(vector([1, 0, 0])) == []
    assert len(history.find(vector([2, 2, 0]))) == 1


def test_posterior_of_one_laplace_observation() -> None:
    """With one observation the posterior is its noise's law, truncated where PC drops gamma.

    The 1 - delta interval of Laplace(b) renormalized on [-T, T] (mass 1 - gamma) is
    ``+- b ln(1 / (1 - (1 - delta)(1 - gamma)))``, a little shorter than ``b ln(1/delta)``.
    """
    b, gamma = 40.0, 0.01
    estimate, low, high = posterior(
        [Observation(np.array([0]), np.array([1.0]), 500.0, np.array([b]))], 0.2, gamma=gamma
    ) or (0.0, 0.0, 0.0)
    assert estimate == pytest.approx(500.0)
    truncated = -b * math.log(1 - 0.8 * (1 - gamma))
    assert abs((high - low) / 2 - truncated) <= 1.0  # one unit bin
    assert (high - low) / 2 < b * math.log(5)


def test_blue_reproduces_the_second_papers_example() -> None:
    """Eqs. (11)-(16): x_hat = [24.99, 10.18, 17.02, 19.50], theta_hat = 42.0 for Q = [1 0 1 0]."""
    history = DenseHistory(4)
    for row, a, value in zip(EIGHT_BY_FOUR_H, EIGHT_BY_FOUR_ALPHA, EIGHT_BY_FOUR_Y):
        history.append(vector(row), float(a), value)

    def estimate(q: list[int], blue: bool = True) -> float:
        w = history.solve(vector(q), blue=blue)
        assert w is not None
        return float(w.weights @ history.y[w.rows])

    cells = [round(estimate([int(i == j) for i in range(4)]), 2) for j in range(4)]
    assert cells == [24.99, 10.18, 17.02, 19.5]
    assert round(estimate([1, 0, 1, 0]), 1) == 42.0
    assert round(estimate([1, 0, 1, 0], blue=False), 1) != 42.0  # OLS weighs differently


def test_blue_has_least_variance_and_ols_least_norm() -> None:
    rng = np.random.default_rng(7)
    history = DenseHistory(6)
    for _ in range(20):
        row = rng.integers(-1, 3, 6).astype(float)
        if np.any(row):
            history.append(LinearQuery.from_dense(row), float(rng.uniform(0.05, 1.0)), 0.0)
    q = LinearQuery.from_dense(rng.integers(0, 3, 6).astype(float))
    blue, ols = history.solve(q, blue=True), history.solve(q, blue=False)
    assert blue is not None and ols is not None
    for w in (blue, ols):
        assert np.allclose(w.weights @ history.rows[w.rows], q.to_dense())
    assert np.sum(blue.scales**2) <= np.sum(ols.scales**2) + 1e-12
    assert np.sum(ols.weights**2) <= np.sum(blue.weights**2) + 1e-12
    reference = np.linalg.lstsq(history.rows.T, q.to_dense(), rcond=None)[0]
    dense = np.zeros(history.size)
    dense[ols.rows] = ols.weights
    assert np.allclose(dense, reference)


def ask(system: object, q: list[int], eps: float, x: np.ndarray) -> tuple[str, float] | None:
    request = QueryRequest(vector(q), AccuracyRequest(eps, 0.8))
    (answer,) = system.answer([request], lambda v: v.evaluate(x))  # type: ignore[attr-defined]
    return None if answer is None else (answer.source, answer.budget)


@pytest.mark.parametrize("cls", [GreedyBayes, BluePC, OlsReuse, Dpproxy])
def test_reuse_systems_answer_a_repeat_for_free(cls: type) -> None:
    x = np.array([40, 50, 60])
    system = cls(3, 1.0, 1, ())
    first = ask(system, [1, 1, 0], 60.0, x)
    assert first is not None and first[0] == "fresh" and first[1] > 0
    assert ask(system, [1, 1, 0], 60.0, x) == ("history", 0.0)
    assert system.alpha_bar == pytest.approx(first[1])


def test_improved_baseline_pays_every_time_until_refused() -> None:
    x = np.array([40, 50, 60])
    system = ImprovedBaseline(3, 0.06, 1, ())
    alpha = math.log(5) / 60
    assert ask(system, [1, 1, 0], 60.0, x) == ("fresh", pytest.approx(alpha))
    assert ask(system, [1, 1, 0], 60.0, x) == ("fresh", pytest.approx(alpha))
    assert system.alpha_bar == pytest.approx(2 * alpha)
    assert ask(system, [1, 1, 0], 60.0, x) is None  # 3 alpha > 0.06
    assert ask(system, [0, 0, 1], 60.0, x) is not None  # another cell still has budget


def test_fixed_budget_counts_only_answers_its_budget_covers() -> None:
    x = np.array([40, 50, 60])
    system = FixedBudget(3, None, 1, (), alpha0=math.log(5) / 100)
    assert ask(system, [1, 0, 0], 100.0, x) is not None
    assert ask(system, [1, 0, 0], 50.0, x) is None  # released, but too noisy for +-50
    assert ask(system, [2, 0, 0], 100.0, x) is None  # sensitivity 2 doubles the noise
    assert system.alpha_bar == pytest.approx(3 * math.log(5) / 100)


def test_compaction_changes_no_blue_estimate() -> None:
    rng = np.random.default_rng(2)
    rows = [LinearQuery.from_dense(rng.integers(0, 2, 12).astype(float)) for _ in range(6)]
    rows = [r for r in rows if r.cells.size]
    compaction = Compaction(12, rows)
    assert compaction.blocks < 12
    full, small = DenseHistory(12), DenseHistory(compaction.blocks)
    for r in rows:
        y = float(rng.normal(10, 3))
        full.append(r, 0.5, y)
        small.append(compaction.query(r), 0.5, y)
    q = LinearQuery.from_dense(rows[0].to_dense() + rows[1].to_dense())
    a, b = full.solve(q, blue=True), small.solve(compaction.query(q), blue=True)
    assert a is not None and b is not None
    assert float(a.weights @ full.y[a.rows]) == pytest.approx(float(b.weights @ small.y[b.rows]))
    assert sorted(a.scales) == pytest.approx(sorted(b.scales))


def test_doctests_of_the_evaluation_package() -> None:
    from bench.evaluation import adult, greedy, ledger, linear, systems, workload

    for module in (workload, ledger, linear, greedy, systems, adult):
        result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
        assert result.attempted > 0 and result.failed == 0, module.__name__


@pytest.mark.skipif(not (DATA_DIR / DATASETS["NETTRACE"]).exists(), reason="DPBench data not found")
def test_a_short_run_of_every_system() -> None:
    setting = Setting("unbounded", "NETTRACE", None, (50.0, 1000.0), Fraction(3, 10), queries=25)
    traces = run_setting(setting, log=lambda line: None)
    assert list(traces) == list(SYSTEMS)
    for key, trace in traces.items():
        m = metrics(trace, setting.delta)
        assert m["values"] == 25 and 0 <= m["R_a"] <= 1
        assert m["alpha_bar"] >= 0.3 - 1e-9  # the tree's cost, on every cell
        if key != "fixed":
            assert m["R_a"] == 1.0  # unbounded: everything is answered
    # the reuse systems spend less than the improved baseline on the same stream
    spent = {k: metrics(t, 0.2)["alpha_bar"] for k, t in traces.items()}
    assert spent["dpproxy"] < spent["improved"] and spent["blue_pc"] < spent["improved"]


@pytest.mark.slow
def test_the_wire_run_makes_the_in_process_decisions() -> None:
    from bench.evaluation.adult import group_by_workload, range_workload
    from bench.evaluation.wire import run_wire

    statements = range_workload(6, (1.0, 1000.0), 0.2, 1) + group_by_workload(
        2, (1.0, 1000.0), 0.2, 2
    )
    run = run_wire(statements, seed=3)
    assert run.histogram_matches
    assert run.different_decisions == [] and run.same_decisions == len(run.wire.answered)
