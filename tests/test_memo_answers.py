"""The memo's answers from history: forgotten once the history grows, kept without error laws.

A kept answer held its replies' error laws (a term per history row each), which is what made a
server at 100,000 answers grow to 2 GB; these tests hold what it keeps, with a real service.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np

from proxy.config import load_config
from proxy.dp.answering import DpResult, DpService
from proxy.dp.memo import DpMemo
from proxy.dp.routing import Router
from proxy.engine.engine import Reply
from proxy.engine.history import HistoryEntry
from proxy.storage.reader import Reader

CONFIG = load_config(Path(__file__).parent.parent / "config.yaml")
CUBE = CONFIG.cubes[0]


def memo() -> tuple[DpMemo, DpService]:
    router = Router(CONFIG.translator(), CONFIG.cubes)
    # nothing is measured here: the reader is never asked
    service = DpService(CONFIG.cubes, Reader.__new__(Reader))
    return DpMemo(router, service), service


def from_history(terms: int, values: int = 1) -> DpResult:
    """An answer of ``values`` values from history, each with ``terms`` error terms."""
    reply = Reply(10.0, 5.0, 15.0, 0.95, "history", Fraction(0), Fraction(1), np.full(terms, 0.5))
    return DpResult((), (), (), (reply,) * values)


def grow(service: DpService) -> None:
    """One more measurement in the table's history (as if another process released it)."""
    spec = CONFIG.translator().translate("SELECT COUNT(*) FROM adult WITH ACCURACY 100")
    entry = HistoryEntry(CUBE.qualified_name, spec.queries[0], Fraction(1, 100), Fraction(1), 3.0)
    service.engine(CUBE).absorb([entry])


def test_an_answer_is_forgotten_once_the_history_has_grown() -> None:
    kept, service = memo()
    for key in ("a", "b"):
        kept.remember(key, kept.version(CUBE), from_history(10), CUBE)
    assert kept.answer("a", CUBE) is not None
    grow(service)
    kept.remember("c", kept.version(CUBE), from_history(10), CUBE)
    # "b" was never asked again: still gone, since only "c" can be sent again
    assert len(kept._answers) == 1
    assert kept.answer("a", CUBE) is None and kept.answer("c", CUBE) is not None


def test_an_answer_from_a_grown_history_is_not_kept() -> None:
    kept, service = memo()
    version = kept.version(CUBE)  # read before answering, as the session does
    grow(service)
    kept.remember("new", kept.version(CUBE), from_history(10), CUBE)
    kept.remember("old", version, from_history(10), CUBE)
    assert len(kept._answers) == 1 and kept.answer("new", CUBE) is not None


def test_a_kept_answer_holds_no_error_law_and_the_same_figures() -> None:
    kept, _ = memo()
    answer = from_history(100_000, values=3)
    kept.remember("a", kept.version(CUBE), answer, CUBE)
    again = kept.answer("a", CUBE)
    assert again is not None
    assert [r.scales.size for r in again.replies] == [0, 0, 0]
    assert again.replies == answer.replies  # estimates, intervals, sources, budgets
    assert (again.rows, again.notices, again.summary) == (answer.rows, answer.notices, "")
