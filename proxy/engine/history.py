"""The query history's entries: released noisy measurements.

Each entry is one row of the papers' system ``y = H x + N``: the query vector ``H_i``, the budget
``alpha_i`` it spent, the lattice step of its noise and the released value ``y_i``. Every later
estimate and every privacy charge is derived from these entries alone, so the ledger store that
keeps them durably (:mod:`proxy.storage.ledger_store`) is all an engine needs to survive a restart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from sqlmap.vector import LinearQuery

__all__ = ["HistoryEntry"]


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One released measurement ``y = H_i x + step * Z`` with ``Z`` discrete Laplace.

    ``Z`` has scale ``S_i / (alpha_i * step)``, so the entry is ``alpha_i``-differentially private
    and its noise is within ``step`` of a ``Lap(S_i / alpha_i)`` variable under a coupling.

    Args:
        table: the protected table the query ran on.
        query: the query vector ``H_i``; its constant part lives in the reply, never here.
        budget: ``alpha_i``, the privacy budget the measurement spent.
        step: the lattice step of the noise (a divisor of every weight of ``query``).
        noisy_answer: ``y_i``, the released noisy value of ``H_i x``.

    >>> query = LinearQuery.from_dense([1.0, 1.0])
    >>> HistoryEntry("t", query, Fraction(1, 10), Fraction(1, 1024), 41.5)
    HistoryEntry(table='t', cells=2, sensitivity=1.0, budget=1/10, step=1/1024, noisy_answer=41.5)
    """

    table: str
    query: LinearQuery
    budget: Fraction
    step: Fraction
    noisy_answer: float

    def __post_init__(self) -> None:
        if not self.table:
            raise ValueError("table must be named")
        if self.query.is_zero or self.query.offset != 0:
            raise ValueError("a measured query has a non-zero vector and no constant part")
        if not isinstance(self.budget, Fraction) or self.budget <= 0:
            raise ValueError("budget must be a positive Fraction")
        if not isinstance(self.step, Fraction) or self.step <= 0:
            raise ValueError("step must be a positive Fraction")
        if not math.isfinite(self.noisy_answer):
            raise ValueError("noisy_answer must be finite")

    def __repr__(self) -> str:
        return (
            f"HistoryEntry(table={self.table!r}, cells={self.query.nonzero_weights().size}, "
            f"sensitivity={self.query.sensitivity}, budget={self.budget}, step={self.step}, "
            f"noisy_answer={self.noisy_answer})"
        )
