"""The six systems compared, behind one interface: answer a statement's queries, or refuse.

(i) :class:`FixedBudget`: the traditional Laplace mechanism, the same budget ``alpha0`` for
    every query. It releases an answer while the budget lasts; the answer counts (R_a) only if
    its ``+- eps`` interval holds with probability ``1 - delta``, i.e. if
    ``S ln(1/delta) / alpha0 <= eps``.
(ii) :class:`ImprovedBaseline`: the papers' baseline with dynamic allocation: every query is
    measured afresh with its least budget ``alpha = S ln(1/delta) / eps`` (Thm 3.7); no reuse.
(iii) :class:`GreedyBayes`: the first paper's Alg. 1 with greedy representations and the
    Bayesian posterior (:mod:`bench.evaluation.greedy`); answers from history when the
    credible interval is at most ``2 eps`` long, else as (ii).
(iv) :class:`BluePC`: the second paper's system: BLUE over the whole history (eq. 16) and its
    error's probability function by binned convolution ("PC", Alg. 2, unit bins, gamma 0.01,
    the setting its sec. 6.4 uses), interval by Alg. 3; else as (ii).
(v) :class:`OlsReuse`: the same, with ordinary least squares weights (blind to budgets) and
    the exact error tail of that estimate.
(vi) :class:`Dpproxy`: :class:`proxy.engine.PrivacyEngine` as shipped (exact tails, combined
    answers, lattice noise, exact per-cell ledger).

Fresh answers of (i)-(v) add continuous Laplace noise from the system's own seeded numpy
generator; dpproxy draws its lattice noise from a seeded :class:`SeededRandomSource`. Each
statement's queries are answered in order; (i)-(v) refuse or answer each query on its own,
dpproxy plans a statement as one batch and refuses it whole, as the proxy does.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol

import numpy as np

from bench.evaluation.greedy import GreedyHistory, posterior
from bench.evaluation.ledger import CellLedger
from bench.evaluation.linear import DenseHistory
from proxy.engine import (
    HistoryEntry,
    PrivacyEngine,
    QueryRequest,
    SeededRandomSource,
)
from proxy.engine.tails import EXACT, ConvolutionTail, quantile
from proxy.errors import BudgetExhausted
from sqlmap.accuracy import AccuracyRequest
from sqlmap.vector import LinearQuery

__all__ = [
    "Answer",
    "System",
    "Measure",
    "SYSTEMS",
    "minimal_budget",
    "fixed_budget",
    "FixedBudget",
    "ImprovedBaseline",
    "GreedyBayes",
    "BluePC",
    "OlsReuse",
    "Dpproxy",
]

#: Computes a true answer ``q . x`` (offset-free) when a system decides to measure.
Measure = Callable[[LinearQuery], float]
_UNBOUNDED = Fraction(10**12)
# Relative slack for "meets eps": the minimal budget meets eps exactly, up to rounding in the
# quantile search and in 1 - confidence (a repeated query must be answered by its own answer).
_SLACK = 1e-9


@dataclass(frozen=True, slots=True)
class Answer:
    """An answer that meets its request: estimate and interval (offset included)."""

    estimate: float
    low: float
    high: float
    source: str
    budget: float


class System(Protocol):
    """What the runner needs of a system."""

    name: str

    def answer(self, requests: Sequence[QueryRequest], measure: Measure) -> list[Answer | None]:
        """One answer per request; ``None`` for a query it does not answer."""
        ...

    @property
    def alpha_bar(self) -> float:
        """The system privacy cost so far, ``max_j B_j`` (Thm 3.8)."""
        ...


def minimal_budget(query: LinearQuery, accuracy: AccuracyRequest) -> float:
    """The papers' Thm 3.7: ``alpha = S ln(1/delta) / eps``.

    >>> round(minimal_budget(LinearQuery.from_dense([0, 1, 1]), AccuracyRequest(15, 0.8)), 4)
    0.1073
    """
    return query.sensitivity * math.log(1.0 / accuracy.delta) / accuracy.eps


def fixed_budget(two_eps: tuple[float, float], delta: float) -> float:
    """(i)'s ``alpha0``: the least budget for a count (``S = 1``) at the median ``eps``.

    >>> round(fixed_budget((50.0, 1000.0), 0.2), 6)  # median eps 262.5
    0.006131
    """
    return math.log(1.0 / delta) / (sum(two_eps) / 4)


def _offset_free(query: LinearQuery) -> LinearQuery:
    return LinearQuery(query.n_cells, query.cells, query.weights)


class _Fresh:
    """The fresh path shared by (ii)-(v): Thm 3.7 budget, Laplace noise, ledger, history."""

    name = ""

    def __init__(self, n: int, total: float | None, seed: int, history: Sequence[HistoryEntry]):
        self.n = n
        self.ledger = CellLedger(n, total)
        self.rng = np.random.default_rng(seed)
        for entry in history:
            self.ledger.charge(entry.query, float(entry.budget))
            self._remember(entry.query, float(entry.budget), entry.noisy_answer)

    @property
    def alpha_bar(self) -> float:
        return self.ledger.spent

    def _remember(self, query: LinearQuery, alpha: float, y: float) -> None:
        """Add a measurement to the system's history (nothing for a system without reuse)."""

    def _reuse(self, query: LinearQuery, accuracy: AccuracyRequest) -> Answer | None:
        """An answer from history that meets ``accuracy`` (offset-free), or ``None``."""
        return None

    def answer(self, requests: Sequence[QueryRequest], measure: Measure) -> list[Answer | None]:
        return [self._one(r, measure) for r in requests]

    def _one(self, request: QueryRequest, measure: Measure) -> Answer | None:
        query, accuracy = _offset_free(request.query), request.accuracy
        answer = self._reuse(query, accuracy) or self._fresh(query, accuracy, measure)
        if answer is None:
            return None
        offset = request.query.offset
        return Answer(
            answer.estimate + offset,
            answer.low + offset,
            answer.high + offset,
            answer.source,
            answer.budget,
        )

    def _fresh(
        self, query: LinearQuery, accuracy: AccuracyRequest, measure: Measure
    ) -> Answer | None:
        alpha = minimal_budget(query, accuracy)
        if not self.ledger.fits(query, alpha):
            return None
        self.ledger.charge(query, alpha)
        y = measure(query) + float(self.rng.laplace(0.0, query.sensitivity / alpha))
        self._remember(query, alpha, y)
        return Answer(y, y - accuracy.eps, y + accuracy.eps, "fresh", alpha)


class ImprovedBaseline(_Fresh):
    """(ii) Every query fresh at its least budget."""

    name = "improved baseline"


class FixedBudget(_Fresh):
    """(i) Every query fresh at the same budget ``alpha0``."""

    name = "fixed Laplace"

    def __init__(
        self,
        n: int,
        total: float | None,
        seed: int,
        history: Sequence[HistoryEntry],
        alpha0: float,
    ) -> None:
        super().__init__(n, total, seed, history)
        self.alpha0 = alpha0

    def _fresh(
        self, query: LinearQuery, accuracy: AccuracyRequest, measure: Measure
    ) -> Answer | None:
        if not self.ledger.fits(query, self.alpha0):
            return None
        self.ledger.charge(query, self.alpha0)
        y = measure(query) + float(self.rng.laplace(0.0, query.sensitivity / self.alpha0))
        if minimal_budget(query, accuracy) > self.alpha0 * (1 + _SLACK):
            return None  # released, but its +-eps interval does not hold at 1 - delta
        return Answer(y, y - accuracy.eps, y + accuracy.eps, "fresh", self.alpha0)


class GreedyBayes(_Fresh):
    """(iii) Greedy linear representations and the Bayesian posterior."""

    name = "greedy+Bayes (paper 1)"

    def __init__(self, n: int, total: float | None, seed: int, history: Sequence[HistoryEntry]):
        self.history = GreedyHistory(n)
        super().__init__(n, total, seed, history)

    def _remember(self, query: LinearQuery, alpha: float, y: float) -> None:
        self.history.append(query, alpha, y)

    def _reuse(self, query: LinearQuery, accuracy: AccuracyRequest) -> Answer | None:
        observations = self.history.find(query)
        if not observations:
            return None
        # Unit bins as the paper's Alg. 5-6, but never finer than 1/25 of the requirement or of
        # the sharpest observation's spread: the paper's unit bins are what make it slow.
        spread = min(math.sqrt(2.0 * float(np.square(o.scales).sum())) for o in observations)
        step = max(1.0, accuracy.eps / 25, spread / 25)
        found = posterior(observations, accuracy.delta, step=step)
        if found is None:
            return None
        estimate, low, high = found
        if high - low > 2 * accuracy.eps:
            return None
        return Answer(estimate, low, high, "history", 0.0)


class _Linear(_Fresh):
    """Reuse through one linear estimate over the whole history and a symmetric interval."""

    blue = True

    def __init__(self, n: int, total: float | None, seed: int, history: Sequence[HistoryEntry]):
        self.history = DenseHistory(n)
        super().__init__(n, total, seed, history)

    def _remember(self, query: LinearQuery, alpha: float, y: float) -> None:
        self.history.append(query, alpha, y)

    def _half_width(self, scales: np.ndarray, delta: float) -> float:
        raise NotImplementedError

    def _reuse(self, query: LinearQuery, accuracy: AccuracyRequest) -> Answer | None:
        weights = self.history.solve(query, blue=self.blue)
        if weights is None:
            return None
        width = self._half_width(weights.scales, accuracy.delta)
        if width > accuracy.eps * (1 + _SLACK):
            return None
        estimate = float(weights.weights @ self.history.y[weights.rows])
        return Answer(estimate, estimate - width, estimate + width, "history", 0.0)


class BluePC(_Linear):
    """(iv) BLUE and the binned-convolution ("PC") error distribution."""

    name = "BLUE+PC (paper 2)"
    method = ConvolutionTail(gamma=0.01, step=1.0)

    def _half_width(self, scales: np.ndarray, delta: float) -> float:
        """Alg. 3: add bins symmetrically from the centre until they hold ``1 - delta``."""
        pmf = _pc_pmf(scales.tobytes())
        half = (pmf.size - 1) // 2
        held = pmf[half] + 2.0 * np.cumsum(pmf[half + 1 :])
        reached = np.nonzero(np.concatenate([[pmf[half]], held]) >= 1.0 - delta)[0]
        steps = int(reached[0]) if reached.size else half + 1
        return steps * self.method.step


@functools.lru_cache(maxsize=256)
def _pc_pmf(scales: bytes) -> np.ndarray:
    """(iv)'s probability function (cached: a repeated query brings the same weights)."""
    return BluePC.method.pmf(np.frombuffer(scales))


class OlsReuse(_Linear):
    """(v) Ordinary least squares over the history, with its exact error tail."""

    name = "OLS reuse"
    blue = False

    def _half_width(self, scales: np.ndarray, delta: float) -> float:
        return quantile(EXACT, scales, delta)


class Dpproxy:
    """(vi) dpproxy's privacy engine as shipped."""

    name = "dpproxy"

    def __init__(self, n: int, total: float | None, seed: int, history: Sequence[HistoryEntry]):
        self.engine = PrivacyEngine(
            "t",
            n,
            total_budget=_UNBOUNDED if total is None else Fraction(str(total)),
            history=[_retable(e) for e in history],
            rng=SeededRandomSource(seed),
            nonnegative=False,
        )

    @property
    def alpha_bar(self) -> float:
        return float(self.engine.budget.spent)

    def answer(self, requests: Sequence[QueryRequest], measure: Measure) -> list[Answer | None]:
        try:
            plan = self.engine.plan(requests)
        except BudgetExhausted:
            return [None] * len(requests)
        replies = self.engine.execute(plan, [measure(m) for m in plan.measurements])
        return [
            Answer(r.estimate, r.low, r.high, r.source, float(r.budget_charged)) for r in replies
        ]


def _retable(entry: HistoryEntry) -> HistoryEntry:
    return HistoryEntry("t", entry.query, entry.budget, entry.step, entry.noisy_answer)


#: The systems in the order of the tables, by a short key.
SYSTEMS: dict[str, str] = {
    "fixed": FixedBudget.name,
    "improved": ImprovedBaseline.name,
    "greedy": GreedyBayes.name,
    "blue_pc": BluePC.name,
    "ols": OlsReuse.name,
    "dpproxy": Dpproxy.name,
}
