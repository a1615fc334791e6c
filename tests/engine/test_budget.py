"""The per-cell ledger: the papers' Theorem 3.8 examples, exactness and refusals."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from proxy.engine.budget import CellBudget, cell_charges
from proxy.errors import BudgetExhausted
from sqlmap.vector import LinearQuery
from tests.paper_examples import (
    EIGHT_BY_FOUR_ALPHA,
    EIGHT_BY_FOUR_H,
    RUNNING_ALPHA,
    RUNNING_H,
    RUNNING_Q,
)


def _ledger(rows: list[list[int]], alphas: list[Fraction], total: Fraction) -> CellBudget:
    ledger = CellBudget("t", total=total)
    for row, alpha in zip(rows, alphas):
        ledger.commit(cell_charges(LinearQuery.from_dense(row), alpha))
    return ledger


def test_running_example_ledger_after_adding_x5_plus_x6() -> None:
    # "Online query answering", eqs. (10), (11) and (44): H_8 = x5 + x6 with alpha = ln(5)/15.
    alpha_8 = Fraction(math.log(5) / 15)
    ledger = _ledger(
        [*RUNNING_H, RUNNING_Q],
        [*(Fraction(a) for a in RUNNING_ALPHA), alpha_8],
        total=Fraction(1),
    )
    spent = [float(ledger.spent_on(j)) for j in range(9)]
    # The paper rounds alpha_8 to 0.108 first, hence its 0.408 and 0.283.
    assert spent == pytest.approx([0, 0.1, 0, 0, 0.408, 0.283, 0, 0.2, 0.2], abs=1e-3)
    assert ledger.spent == ledger.spent_on(4) == Fraction("0.3") + alpha_8


def test_eight_by_four_example_ledger() -> None:
    # "Bayesian inference under DP", eq. (35) on eqs. (11)-(12).
    h = EIGHT_BY_FOUR_H
    alphas = [Fraction(a) for a in EIGHT_BY_FOUR_ALPHA]
    ledger = _ledger(h, alphas, total=Fraction(1))
    assert [ledger.spent_on(j) for j in range(4)] == [
        Fraction("0.1"),
        Fraction("0.275"),
        Fraction("0.25"),
        Fraction("0.375"),
    ]
    assert ledger.spent == Fraction("0.375")


def test_ledger_equals_a_dense_recomputation() -> None:
    rng = np.random.default_rng(2)
    rows = [list(rng.integers(-3, 4, size=12) * (rng.random(12) < 0.4)) for _ in range(60)]
    rows = [r for r in rows if any(r)]
    alphas = [Fraction(int(rng.integers(1, 1000)), 10_000) for _ in rows]
    ledger = _ledger(rows, alphas, total=Fraction(100))
    for j in range(12):
        expected = sum(
            (
                a * abs(Fraction(int(r[j]))) / max(abs(int(v)) for v in r)
                for r, a in zip(rows, alphas)
            ),
            Fraction(0),
        )
        assert ledger.spent_on(j) == expected


def test_refusal_names_request_cost_and_what_is_left() -> None:
    ledger = _ledger([[1, 1, 0]], [Fraction(3, 4)], total=Fraction(1))
    charges = cell_charges(LinearQuery.from_dense([0, 2, 1]), Fraction(1, 2))
    with pytest.raises(BudgetExhausted) as refused:
        ledger.check(charges, request="this query to ±5 at 0.95 confidence")
    error = refused.value
    assert error.sqlstate == "53400"
    assert "±5 at 0.95" in error.detail and "costing 0.5 on cell 1" in error.detail
    assert "has 0.25 of its 1 left" in error.detail and error.hint
    assert ledger.spent_on(1) == Fraction(3, 4)  # a refusal charges nothing


def test_a_charge_that_fits_exactly_is_allowed() -> None:
    ledger = _ledger([[1, 0]], [Fraction(3, 4)], total=Fraction(1))
    ledger.check(cell_charges(LinearQuery.from_dense([1, 0]), Fraction(1, 4)), request="q")
