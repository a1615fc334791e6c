"""Answering through an engine as the service does, keeping what was measured.

The engine keeps no store: the service makes each batch's new entries durable in its ledger
store between :meth:`~proxy.engine.PrivacyEngine.measure` and ``record``. Tests that restart an
engine, or recompute its ledger, keep the entries here instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from proxy.engine import HistoryEntry, Plan, PrivacyEngine, QueryRequest, Reply
from sqlmap.vector import LinearQuery


class Recorder:
    """The entries an engine released through :meth:`execute` or :meth:`answer`, in order."""

    def __init__(self) -> None:
        self.entries: list[HistoryEntry] = []

    def execute(
        self, engine: PrivacyEngine, plan: Plan, true_answers: Sequence[float]
    ) -> tuple[Reply, ...]:
        entries = engine.measure(plan, true_answers)
        self.entries.extend(entries)
        return engine.record(plan, entries)

    def answer(
        self,
        engine: PrivacyEngine,
        requests: Sequence[QueryRequest],
        measure: Callable[[Sequence[LinearQuery]], Sequence[float]],
    ) -> tuple[Reply, ...]:
        plan = engine.plan(requests)
        return self.execute(engine, plan, measure(plan.measurements) if plan.measurements else ())
