"""The per-cell privacy ledger: what each cell has spent, and refusals when a charge won't fit.

A measurement of ``H_i`` with budget ``alpha_i`` costs cell ``j`` exactly ``alpha_i |H_ij| / S_i``
(a record in cell ``j`` moves the answer by at most ``|H_ij|``); costs add up per cell, and the
table has spent ``max_j B_j`` (the papers' Thm 3.8). Everything is kept in ``Fraction``s, so the
ledger equals a recomputation from the history exactly, and a charge fits only if no cell
would go past the DBA's total.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction

from proxy.engine.noise import public_fraction
from proxy.errors import BudgetExhausted
from sqlmap.vector import LinearQuery

__all__ = ["Ledger", "UserCaps", "cell_charges", "format_budget"]


def cell_charges(query: LinearQuery, budget: Fraction) -> dict[int, Fraction]:
    """What measuring ``query`` with ``budget`` costs each cell it touches.

    >>> cell_charges(LinearQuery.from_dense([2.0, 1.0, 0.0]), Fraction(1, 20))
    {0: Fraction(1, 20), 1: Fraction(1, 40)}
    """
    sensitivity = public_fraction(query.sensitivity)
    ratio: dict[float, Fraction] = {}  # one Fraction per distinct weight, not per cell
    charges = {}
    for cell, weight in zip(query.cells.tolist(), query.weights.tolist()):
        if weight not in ratio:
            ratio[weight] = budget * abs(public_fraction(weight)) / sensitivity
        charges[cell] = ratio[weight]
    return charges


def format_budget(value: Fraction, *, up: bool) -> str:
    """A budget to 6 significant digits, rounded against the analyst (costs up, funds down).

    >>> format_budget(Fraction(1, 3), up=True), format_budget(Fraction(1, 3), up=False)
    ('0.333334', '0.333333')
    """
    if value == 0:
        return "0"
    unit = Fraction(10) ** (math.floor(math.log10(abs(value))) - 5)
    scaled = value / unit
    digits = math.ceil(scaled) if up else math.floor(scaled)
    return f"{float(digits * unit):.6g}"


class Ledger:
    """Per-cell spending ``B_j`` for one table against the DBA's ``total``.

    >>> ledger = Ledger("t", total=Fraction(1))
    >>> ledger.commit(cell_charges(LinearQuery.from_dense([1.0, 2.0]), Fraction(1, 2)))
    >>> ledger.spent, ledger.remaining, ledger.spent_on(0)
    (Fraction(1, 2), Fraction(1, 2), Fraction(1, 4))
    """

    def __init__(
        self,
        table: str,
        *,
        total: Fraction,
        carried: Fraction = Fraction(0),
        user: str | None = None,
    ) -> None:
        """``user``: this ledger is one analyst's share of the table (a per-user cap)."""
        if not isinstance(total, Fraction) or total <= 0:
            raise ValueError("total budget must be a positive Fraction")
        if carried < 0:
            raise ValueError("carried budget cannot be negative")
        self.table = table
        self.user = user
        self.total = total
        # spent before the table's cube was redefined: charged to every cell, since the old
        # cells cannot be mapped onto the new ones
        self.carried = carried
        self._spent: dict[int, Fraction] = {}
        self._max = carried

    @property
    def spent(self) -> Fraction:
        """The table's privacy loss so far, ``max_j B_j``."""
        return self._max

    @property
    def remaining(self) -> Fraction:
        """``total - max_j B_j``."""
        return self.total - self._max

    def spent_on(self, cell: int) -> Fraction:
        """``B_j``."""
        return self.carried + self._spent.get(cell, Fraction(0))

    def per_cell(self) -> dict[int, Fraction]:
        """A copy of every ``B_j`` charged since the cube was last defined (without ``carried``)."""
        return dict(self._spent)

    def check(self, charges: Mapping[int, Fraction], *, request: str) -> None:
        """Raise :class:`BudgetExhausted` unless every cell can pay its charge.

        Args:
            charges: cost per cell of everything about to be measured (one batch).
            request: what was asked, for the error message.
        """
        worst_cell, worst_total = -1, Fraction(0)
        for cell, charge in charges.items():
            after = self.spent_on(cell) + charge
            if after > worst_total:
                worst_cell, worst_total = cell, after
        if worst_total <= self.total:
            return
        need = charges[worst_cell]
        left = self.total - self.spent_on(worst_cell)
        holder = "table" if self.user is None else "user"
        whose = "table" if self.user is None else f'user "{self.user}" on table'
        raise BudgetExhausted(
            f'privacy budget of {whose} "{self.table}" exhausted',
            detail=(
                f"Answering {request} needs a fresh measurement costing "
                f"{format_budget(need, up=True)} on cell {worst_cell}, which has "
                f"{format_budget(left, up=False)} of its {format_budget(self.total, up=False)} "
                f"left (the {holder} has spent "
                f"{format_budget(self._max, up=True)})."
            ),
            hint="Ask for a wider interval or a lower confidence, or a query that earlier "
            "answers already determine.",
        )

    def commit(self, charges: Mapping[int, Fraction]) -> None:
        """Add ``charges`` to the cells (call :meth:`check` first)."""
        for cell, charge in charges.items():
            spent = self._spent.get(cell, Fraction(0)) + charge
            self._spent[cell] = spent
            self._max = max(self._max, self.carried + spent)


@dataclass(frozen=True, slots=True)
class UserCaps:
    """Per-user privacy budgets, on top of each table's total (docs/config.md).

    A user's spend on a table is measured like the table's: per cell, summing what that user's
    fresh measurements charged it, and the most any cell has. ``default`` applies to every user
    without an entry in ``per_user``; ``None`` means no cap.

    >>> caps = UserCaps(Fraction(1, 4), {"dba": Fraction(1)})
    >>> caps.cap("alice"), caps.cap("dba"), UserCaps().cap("alice")
    (Fraction(1, 4), Fraction(1, 1), None)
    """

    default: Fraction | None = None
    per_user: Mapping[str, Fraction] = field(default_factory=dict)

    def cap(self, user: str | None) -> Fraction | None:
        """The cap of ``user`` on each table, if any."""
        if user is not None and user in self.per_user:
            return self.per_user[user]
        return self.default
