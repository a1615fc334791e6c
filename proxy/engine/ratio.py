"""Ratios of two linear queries (AVG, shares, percentages) with guaranteed intervals.

A ratio ``N / D`` is answered from an interval of each part: if ``N`` lies in ``[n-, n+]`` and
``D`` in ``[d-, d+]`` with ``0 < d-``, the ratio lies between the smallest and the largest of the
four quotients of the corners (``N / D`` is monotone in each part on such a box). By the union
bound the box holds the true ratio with probability at least ``1 - miss(N) - miss(D)``.

The accuracy a ratio needs from its parts depends on the true denominator, which is private, so
the parts are bought in rounds, each decided from public inputs only (the requirement, the
table's total budget and ledger, and answers already released):

1. **Probe** the denominator at a coarse accuracy fixed in advance (a schedule of budgets that
   grows 4-fold per round, from 1/256 of the table's total) until its released interval shows
   its size to within 10% (history answers for free when it already knows ``D``).
2. **Split**: from the released ``D``, choose the numerator's accuracy and, if it costs less,
   a finer denominator (the engine combines it with the probe), so that the box is at most
   ``+-eps`` wide with the least per-cell budget (:func:`split`). Several ratios over one
   denominator (a GROUP BY's rates, ``AVG`` and a share per group) are split together.
   A split that would cost more than the cells have left makes the ratio NULL (with the reason)
   instead of refusing the whole statement.
3. Answer from the last released intervals. Which rounds run depends on released values, so the
   denominator's miss probability is divided among every interval that could end up in the box
   (each probe and the refinement); the numerator, bought once, gets half of ``1 - c``.

Everything here is pure: :class:`RatioRounds` says what to ask next and turns replies into
answers; the caller asks the engine (which records every measurement before release).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
from scipy import optimize

from proxy.engine.decision import Source
from proxy.engine.engine import QueryRequest, Reply
from sqlmap.accuracy import AccuracyRequest
from sqlmap.vector import LinearQuery

__all__ = ["Ratio", "RatioRounds", "ratio_box", "ratio_bound", "split", "PROBE_ROUNDS"]

#: Probe rounds of a denominator before its ratio is reported as NULL.
PROBE_ROUNDS = 3
#: The first probe's budget, as a share of the table's total; each next one is 8 times more.
_FIRST_PROBE_SHARE = 1 / 256
_PROBE_GROWTH = 4
#: A denominator is known well enough to plan from once its half-width is at most this share.
_PLANNABLE = 0.1
#: Shares of the ratio's miss probability: the numerator's, each probe's, the refinement's.
_MISS_NUMERATOR = 1 / 2
_MISS_PROBE = 1 / 16
_MISS_REFINE = 1 / 2 - PROBE_ROUNDS * _MISS_PROBE

_NEAR_ZERO = "the interval of its denominator reaches zero (too few rows for this budget)"
_TOO_COSTLY = "its accuracy needs more budget than its cells have left"
_NO_ROWS = "its denominator reads no row (0 / 0)"


@dataclass(frozen=True, slots=True)
class Ratio:
    """``numerator / denominator``, asked to within +-``accuracy.eps`` at its confidence."""

    numerator: LinearQuery
    denominator: LinearQuery
    accuracy: AccuracyRequest


def ratio_box(
    n_low: float, n_high: float, d_low: float, d_high: float
) -> tuple[float, float] | None:
    """The range of ``N / D`` over the box; None if the denominator's interval reaches zero.

    >>> ratio_box(10.0, 20.0, 100.0, 200.0)
    (0.05, 0.2)
    >>> ratio_box(-1.0, 1.0, 0.0, 5.0) is None
    True
    """
    if d_low <= 0 <= d_high:
        return None
    corners = [n / d for n in (n_low, n_high) for d in (d_low, d_high)]
    return min(corners), max(corners)


def ratio_bound(numerator: LinearQuery, denominator: LinearQuery) -> float | None:
    """A public bound ``R`` with ``|N| <= R * D`` for every table, or None if there is none.

    It exists when both parts have no constant, the denominator weighs no cell negatively, and
    it weighs every cell the numerator weighs: then ``R = max |w_N / w_D|`` over those cells
    (1 for a share of rows, the largest value for a mean).

    >>> count = LinearQuery.from_dense([1.0, 1.0, 1.0])
    >>> ratio_bound(LinearQuery.from_dense([0.0, 30.0, 50.0]), count)
    50.0
    >>> ratio_bound(count, LinearQuery.from_dense([1.0, 1.0, 0.0])) is None
    True
    """
    if numerator.offset or denominator.offset or np.any(denominator.weights < 0):
        return None
    if not np.all(np.isin(numerator.cells, denominator.cells)):
        return None
    if not numerator.cells.size:
        return 0.0
    dense = denominator.to_dense()
    return float(np.max(np.abs(numerator.weights) / dense[numerator.cells]))


def _budget(sensitivity: float, half_width: float, miss: float) -> float:
    """The continuous Laplace budget for ``+-half_width`` at miss ``miss``: the split's cost."""
    return sensitivity * math.log(1.0 / miss) / half_width


@dataclass(frozen=True, slots=True)
class _Numerator:
    """What :func:`split` needs of one numerator sharing the denominator."""

    query: LinearQuery
    eps: float
    miss: float
    bound: float | None  # R: |N| <= R D
    probe: float | None = None  # |N| <= this, from a released probe
    free: float = math.inf  # the half-width history gives for nothing (its probe's, if history)


def _numerator_width(n: _Numerator, d: Reply, h_d: float | None) -> float:
    """The numerator half-width that keeps the box within ``+-eps``; <= 0 if none can.

    ``d`` is the denominator's released interval; ``h_d`` the half-width of a refinement (None:
    ``d`` is final). With the final ``D`` released as ``D_hat +- h`` and ``|N_hat| <= B + h_n``,
    the box's half-width is at most ``h_n / (D_hat - h) + |N_hat| h / (D_hat^2 - h^2)``, worst
    at the smallest ``D_hat``: ``d``'s low end less ``h`` for a refinement (``D >= d.low``,
    ``D_hat >= D - h``), else ``d``'s own estimate. Solve for ``h_n``.
    """
    if h_d is None:
        d_hat, h = d.estimate, (d.high - d.low) / 2
    else:
        d_hat, h = d.low - h_d, h_d
    low, high = d_hat - h, d.high + 2 * h
    if low <= 0:
        return 0.0
    bounds = [n.bound * high] if n.bound is not None else []
    bounds += [n.probe] if n.probe is not None else []
    if not bounds:
        return 0.0
    spread = h / (d_hat * d_hat - h * h)
    return (n.eps - min(bounds) * spread) / (1.0 / low + spread)


def _patterns(parts: Sequence[LinearQuery]) -> np.ndarray:
    """Which parts each cell is in, one row per distinct combination: the ledger's view."""
    cells = np.unique(np.concatenate([p.cells for p in parts]))
    member = np.stack([np.isin(cells, p.cells) for p in parts], axis=1)
    return np.unique(member, axis=0).astype(np.float64)


def split(
    denominator: LinearQuery,
    released: Reply,
    refine_miss: float,
    numerators: Sequence[_Numerator],
    even: bool = False,
) -> tuple[float | None, list[float], float] | None:
    """Half-widths of a refined denominator (None: keep the released one) and of each numerator.

    The third value is what they cost the most-charged cell.

    Chosen to meet every ratio's ``+-eps`` at the least budget on the most-charged cell (the
    per-cell ledger: parts over the same cells add up, parts over other cells do not). None if
    no choice meets them (the denominator is not known to be positive). ``even`` gives every
    part the same budget instead (the baseline of bench/ratio_bench.py).
    """
    d_width = (released.high - released.low) / 2
    if released.low <= 0:
        return None
    patterns = _patterns([denominator, *(n.query for n in numerators)])
    sensitivity = denominator.sensitivity

    def widths(h_d: float | None) -> list[float]:
        return [_numerator_width(n, released, h_d) for n in numerators]

    def cost(h_d: float, refine: bool) -> float:
        hs = widths(h_d if refine else None)
        if any(h <= 0 for h in hs):
            return math.inf
        alphas = [_budget(sensitivity, h_d, refine_miss) if refine else 0.0]
        alphas += [
            0.0 if n.free <= h else _budget(n.query.sensitivity, h, n.miss)
            for n, h in zip(numerators, hs)
        ]
        return float(np.max(patterns @ np.array(alphas)))

    if even:
        return _even_split(sensitivity, refine_miss, numerators, widths, patterns)
    keep = cost(d_width, refine=False)
    # the coarsest refinement that leaves every numerator a positive width (they shrink as
    # the denominator's half-width grows)
    low, top = 0.0, d_width
    if any(w <= 0 for w in widths(top)):
        for _ in range(60):
            middle = (low + top) / 2
            low, top = (middle, top) if all(w > 0 for w in widths(middle)) else (low, middle)
        top = low
    best, h_refined = keep, top
    if top > 0:
        refined = optimize.minimize_scalar(
            lambda log_h: cost(math.exp(log_h), refine=True),
            bounds=(math.log(top * 1e-4), math.log(top * (1 - 1e-9))),
            method="bounded",
            options={"xatol": 1e-4},
        )
        h_refined = math.exp(float(refined.x))
        best = min(keep, cost(h_refined, refine=True))
    if math.isinf(best):
        return None
    if keep == best:
        return None, widths(None), best
    return h_refined, widths(h_refined), best


def _even_split(
    sensitivity: float,
    refine_miss: float,
    numerators: Sequence[_Numerator],
    widths: Callable[[float], list[float]],
    patterns: np.ndarray,
) -> tuple[float, list[float], float] | None:
    """The least budget that, given to every part alike, meets every ratio."""

    def parts(alpha: float) -> tuple[float, list[float]]:
        return sensitivity * math.log(1 / refine_miss) / alpha, [
            n.query.sensitivity * math.log(1 / n.miss) / alpha for n in numerators
        ]

    def fits(alpha: float) -> bool:
        h_d, hs = parts(alpha)
        return all(0 < h <= w for h, w in zip(hs, widths(h_d)))

    low, high = 1e-9, 1e6
    if not fits(high):
        return None
    for _ in range(80):
        middle = math.sqrt(low * high)
        low, high = (low, middle) if fits(middle) else (middle, high)
    h_d, hs = parts(high)
    return h_d, hs, float(np.max(patterns @ np.full(len(numerators) + 1, high)))


def _key(query: LinearQuery) -> tuple[bytes, bytes, float]:
    return query.cells.tobytes(), query.weights.tobytes(), query.offset


@dataclass(slots=True)
class _Group:
    """The ratios over one denominator, and where they are in their rounds."""

    denominator: LinearQuery
    ratios: list[int]
    probe: int = 0  # the next probe round
    released: Reply | None = None  # the denominator's latest interval
    numerators: dict[int, Reply] = field(default_factory=dict)
    probes: dict[int, Reply] = field(default_factory=dict)  # numerators' probes
    state: str = "probe"  # probe -> final -> done, or null
    reason: str = ""  # why the ratios are NULL


class RatioRounds:
    """The rounds of one statement's ratios: ask :meth:`requests`, give :meth:`observe` replies.

    Each round's requests depend only on the ratios, the table's total budget and replies given
    to :meth:`observe`: public inputs. When :meth:`requests` is empty, :meth:`answers` has one
    reply per ratio (None where the denominator could not be told apart from zero).
    ``even`` splits every requirement evenly between the parts (a baseline for benchmarks).
    """

    def __init__(self, ratios: Sequence[Ratio], total_budget: float, even: bool = False) -> None:
        self.ratios = list(ratios)
        self._even = even
        self._first_probe = total_budget * _FIRST_PROBE_SHARE
        self._groups: dict[tuple[bytes, bytes, float], _Group] = {}
        for i, ratio in enumerate(self.ratios):
            key = _key(ratio.denominator)
            group = self._groups.setdefault(key, _Group(ratio.denominator, []))
            group.ratios.append(i)
            if not ratio.numerator.cells.size:  # no row counts: known without asking
                value = ratio.numerator.offset
                group.numerators[i] = group.probes[i] = Reply(
                    value, value, value, 1.0, "history", Fraction(0), Fraction(0)
                )
        for group in self._groups.values():
            if not group.denominator.cells.size:  # a constant: no ratio of rows to answer
                group.state, group.reason = "null", _NO_ROWS
        self._bounds = [ratio_bound(r.numerator, r.denominator) for r in self.ratios]
        self._parts: list[list[Reply]] = [[] for _ in self.ratios]  # every reply, for charges
        self._asked: list[tuple[_Group, str, int | None]] = []
        self._slots: list[int] = []  # the request that answers each asked part
        self._reasons: dict[int, str] = {}  # ratios NULL on their own

    def _miss(self, group: _Group) -> float:
        return min(self.ratios[i].accuracy.delta for i in group.ratios)

    def _probe_request(self, query: LinearQuery, group: _Group) -> QueryRequest:
        miss = self._miss(group) * _MISS_PROBE
        budget = self._first_probe * _PROBE_GROWTH**group.probe
        half_width = query.sensitivity * math.log(1 / miss) / budget
        return QueryRequest(query, AccuracyRequest(half_width, 1 - miss))

    def requests(
        self, left: Callable[[LinearQuery], float] = lambda _: math.inf
    ) -> list[QueryRequest]:
        """The next round's requests (empty: every ratio is answered).

        ``left(q)`` is the budget left on the most-charged cell ``q`` reads: a ratio whose split
        would cost more is NULL rather than refused with the statement.

        A vector asked twice in a round (``AVG(x)`` and ``SUM(x) / COUNT(x)``) is asked once, at
        the narrower of the two accuracies and the higher confidence.
        """
        wanted = self._wanted(left)
        merged: dict[tuple[bytes, bytes, float], QueryRequest] = {}
        for request in wanted:
            key = _key(request.query)
            if key in merged:
                other = merged[key].accuracy
                merged[key] = QueryRequest(
                    request.query,
                    AccuracyRequest(
                        min(other.eps, request.accuracy.eps),
                        max(other.confidence, request.accuracy.confidence),
                    ),
                )
            else:
                merged[key] = request
        self._slots = [list(merged).index(_key(r.query)) for r in wanted]
        return list(merged.values())

    def _wanted(self, left: Callable[[LinearQuery], float]) -> list[QueryRequest]:
        self._asked = []
        requests: list[QueryRequest] = []
        for group in self._groups.values():
            if group.state == "probe":
                requests.append(self._probe_request(group.denominator, group))
                self._asked.append((group, "denominator", None))
                for i in group.ratios:  # its size tightens the bound R D of the split
                    probe = group.probes.get(i)
                    if probe is None or probe.low < 0 < probe.high:
                        requests.append(self._probe_request(self.ratios[i].numerator, group))
                        self._asked.append((group, "probe", i))
            elif group.state == "final":
                requests.extend(self._final(group, left))
        return requests

    def _final(self, group: _Group, left: Callable[[LinearQuery], float]) -> list[QueryRequest]:
        assert group.released is not None
        d = group.released
        numerators = {
            i: _Numerator(
                self.ratios[i].numerator,
                self.ratios[i].accuracy.eps,
                self.ratios[i].accuracy.delta * _MISS_NUMERATOR,
                self._bounds[i],
                abs(group.probes[i].estimate) + (group.probes[i].high - group.probes[i].low) / 2
                if i in group.probes
                else None,
                # history's interval at the probe's (higher) confidence: narrower at the final one
                (group.probes[i].high - group.probes[i].low) / 2
                if i in group.probes and group.probes[i].source == "history"
                else math.inf,
            )
            for i in group.ratios
        }
        refine_miss = self._miss(group) * _MISS_REFINE

        def alone(i: int) -> float:
            chosen = split(group.denominator, d, refine_miss, [numerators[i]], self._even)
            return math.inf if chosen is None else chosen[2]

        # public: the ledger and released answers. Past the budget left, the ratios that cost
        # most on their own are NULL, so that one costly ratio leaves the others answered
        kept = sorted(group.ratios, key=alone)
        budget_left = left(group.denominator)
        while kept:
            chosen = split(
                group.denominator, d, refine_miss, [numerators[i] for i in kept], self._even
            )
            if chosen is not None and chosen[2] <= budget_left:
                break
            self._reasons[kept.pop()] = _TOO_COSTLY
        if chosen is None or not kept:
            group.state = "null"
            return []
        h_d, h_ns, _ = chosen
        requests = []
        if h_d is not None:
            requests.append(QueryRequest(group.denominator, AccuracyRequest(h_d, 1 - refine_miss)))
            self._asked.append((group, "denominator", None))
        for i, h in zip(kept, h_ns):
            n = numerators[i]
            if not n.query.cells.size:
                continue
            requests.append(QueryRequest(n.query, AccuracyRequest(h, 1 - n.miss)))
            self._asked.append((group, "numerator", i))
        return requests

    def observe(self, replies: Sequence[Reply]) -> None:
        """The engine's replies to the last :meth:`requests`, in order."""
        if len(replies) != max(self._slots, default=-1) + 1:
            raise ValueError("one reply per request of the last round")
        for (group, part, i), slot in zip(self._asked, self._slots):
            reply = replies[slot]
            for j in group.ratios if part == "denominator" else [i]:
                assert j is not None
                self._parts[j].append(reply)
            if part == "denominator":
                group.released = reply
            elif part == "probe":
                assert i is not None
                group.probes[i] = reply
            else:
                assert i is not None
                group.numerators[i] = reply
        for group in {id(g): g for g, _, _ in self._asked}.values():
            if group.state == "final":
                group.state = "done"
            elif group.state == "probe":
                d = group.released
                assert d is not None
                if d.low > 0 and (d.high - d.low) / 2 <= _PLANNABLE * d.estimate:
                    group.state = "final"
                elif group.probe + 1 < PROBE_ROUNDS:
                    group.probe += 1
                else:
                    group.state, group.reason = "null", _NEAR_ZERO
        self._asked, self._slots = [], []

    def reasons(self) -> list[str]:
        """Why each ratio is NULL ("" where it is answered), after the last round."""
        return [
            self._reasons.get(i) or self._groups[_key(r.denominator)].reason
            for i, r in enumerate(self.ratios)
        ]

    def answers(self) -> list[Reply | None]:
        """One reply per ratio: the box's midpoint and ends; None for a NULL ratio."""
        out: list[Reply | None] = []
        remaining = min(
            (r.budget_remaining for parts in self._parts for r in parts), default=Fraction(0)
        )
        for i, ratio in enumerate(self.ratios):
            group = self._groups[_key(ratio.denominator)]
            n, d = group.numerators.get(i), group.released
            if i in self._reasons or n is None or d is None:
                out.append(None)
                continue
            box = ratio_box(n.low, n.high, d.low, d.high)
            if box is None:
                out.append(None)
                continue
            low, high = box
            parts = self._parts[i]
            sources = {r.source for r in parts}
            source: Source = (
                "history"
                if sources == {"history"}
                else "fresh"
                if "history" not in sources and "combined" not in sources
                else "combined"
            )
            out.append(
                Reply(
                    (low + high) / 2,
                    low,
                    high,
                    ratio.accuracy.confidence,
                    source,
                    sum((r.budget_charged for r in parts), Fraction(0)),
                    remaining,
                )
            )
        return out
