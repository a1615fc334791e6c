"""The privacy engine: history, estimates (BLUE and repeats), exact tails, budget, ledger, noise.

The proxy talks to :class:`PrivacyEngine` (one per protected table); the submodules hold one
concern each and are importable on their own for tests and benchmarks.
"""

from proxy.engine.decision import Decision, Source
from proxy.engine.engine import Plan, PrivacyEngine, QueryRequest, Reply, StalePlanError
from proxy.engine.history import HistoryEntry
from proxy.engine.noise import RandomSource, SeededRandomSource, SystemRandomSource
from sqlmap.accuracy import AccuracyRequest

__all__ = [
    "AccuracyRequest",
    "Decision",
    "HistoryEntry",
    "Plan",
    "PrivacyEngine",
    "QueryRequest",
    "RandomSource",
    "Reply",
    "SeededRandomSource",
    "Source",
    "StalePlanError",
    "SystemRandomSource",
]
