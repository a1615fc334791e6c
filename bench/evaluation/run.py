"""Settings, the runner that feeds one stream to every system, and the papers' metrics.

Metrics (online paper sec. 5.1; second paper sec. 6.4), over the values a stream asks for (a
GROUP BY statement asks for one value per group):

* ``R_a``: answered values (an interval that holds with probability >= ``1 - delta``) / all;
* ``R_i``: answered values whose interval holds the true answer / answered values;
* ``E``: mean of ``|estimate - truth| / eps`` over answered values;
* ``alpha_bar``: the system privacy cost ``max_j B_j`` (Thm 3.8) after the stream;
* latency: mean wall time per statement of the system's answer (decision, noise, history
  update; the true answer is a dot product with the histogram, included).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cache

import numpy as np
import numpy.typing as npt

from bench.evaluation import adult, systems
from bench.evaluation.systems import Answer, System
from bench.evaluation.workload import (
    DOMAIN,
    Item,
    load_histogram,
    paper_stream,
    tree_history,
)
from proxy.engine import HistoryEntry
from sqlmap.cube import Cube
from sqlmap.vector import LinearQuery

__all__ = [
    "Setting",
    "Workload",
    "Trace",
    "settings",
    "replications",
    "long_replications",
    "workload",
    "run_setting",
    "metrics",
]

DATASETS_1D = ("NETTRACE", "SEARCHLOGS")
ADULT_WORKLOADS = ("ADULT-range", "ADULT-groupby")
#: Seeds of the data sets' streams: different streams, i.e. independent replications (the
#: metrics do not depend on the data: every error is noise, shift-invariant in the truth).
SEEDS = {"NETTRACE": 11, "SEARCHLOGS": 12, "ADULT-range": 13, "ADULT-groupby": 14}
#: Fig. 9 and Fig. 10 sweeps: total budget, and the upper end of 2 eps.
BUDGETS = (0.25, 0.5, 1.0, 2.0, 4.0)
EPS_UPPER = (200.0, 400.0, 600.0, 800.0, 1000.0)


@dataclass(frozen=True, slots=True)
class Setting:
    """One experiment: a data set's stream, a history, a budget and the accuracy law."""

    kind: str  # "unbounded", "bounded", "budget" (Fig. 9) or "eps" (Fig. 10)
    dataset: str
    total: float | None
    two_eps: tuple[float, float]
    tree: Fraction | None = None
    delta: float = 0.2
    queries: int = 1000
    replicate: int = 0  # > 0: a replication of the coverage study, with seeds of its own

    @property
    def label(self) -> str:
        budget = "unbounded" if self.total is None else f"total {self.total:g}"
        tree = f", {self.tree}-DP tree" if self.tree is not None else ""
        lo, hi = self.two_eps
        return f"{budget}{tree}, 2eps~U[{lo:g},{hi:g}], delta {self.delta:g}"

    @property
    def seed(self) -> int:
        return SEEDS[self.dataset] + 100 * self.replicate


def settings(quick: bool = False) -> list[Setting]:
    """Every setting of a full (or quick) run."""
    count = 200 if quick else 1000
    out: list[Setting] = []
    for name in DATASETS_1D:
        out.append(Setting("unbounded", name, None, (50.0, 1000.0), Fraction(3, 10), queries=count))
        out.append(Setting("bounded", name, 1.0, (1.0, 1000.0), queries=count))
        for total in BUDGETS if not quick else (0.5,):
            if total != 1.0:
                out.append(Setting("budget", name, total, (1.0, 1000.0), queries=count))
        for upper in EPS_UPPER if not quick else (400.0,):
            if upper != 1000.0:
                out.append(Setting("eps", name, 1.0, (1.0, upper), queries=count))
    out.append(Setting("bounded", "ADULT-range", 1.0, (1.0, 1000.0), queries=count // 2))
    out.append(Setting("bounded", "ADULT-groupby", 1.0, (1.0, 1000.0), queries=count * 3 // 20))
    return out


def long_replications(quick: bool = False) -> list[Setting]:
    """Replications of the whole bounded setting (for dpproxy alone: the others are slower)."""
    count, copies = (200, 3) if quick else (1000, 24)
    return [
        Setting("bounded", "NETTRACE", 1.0, (1.0, 1000.0), queries=count, replicate=100 + r)
        for r in range(1, copies + 1)
    ]


def replications(quick: bool = False) -> list[Setting]:
    """The coverage study: independent replications (history, stream, noise) of both settings.

    Answers reused from one history share its noise, so within one stream they are not
    independent trials; R_i pooled over independent replications tests coverage properly.
    """
    count, copies = (100, 3) if quick else (250, 12)
    out = []
    for replicate in range(1, copies + 1):
        out.append(
            Setting(
                "unbounded",
                "NETTRACE",
                None,
                (50.0, 1000.0),
                Fraction(3, 10),
                queries=count,
                replicate=replicate,
            )
        )
        out.append(
            Setting("bounded", "NETTRACE", 1.0, (1.0, 1000.0), queries=count, replicate=replicate)
        )
    return out


@dataclass(frozen=True)
class Workload:
    """A stream over a domain, with the histogram that gives true answers."""

    n: int
    x: npt.NDArray[np.int64]
    items: tuple[Item, ...]
    history: tuple[HistoryEntry, ...] = ()
    compact: Workload | None = None  # the same stream over merged cells, for the baselines

    def for_baselines(self) -> Workload:
        return self.compact if self.compact is not None else self


@cache
def _adult() -> tuple[Cube, npt.NDArray[np.int64]]:
    cube = adult.adult_cube()
    return cube, adult.adult_histogram(cube)


def adult_statements(setting: Setting) -> list[adult.AdultStatement]:
    """The SQL of an Adult setting's stream."""
    make = adult.range_workload if setting.dataset == "ADULT-range" else adult.group_by_workload
    return make(setting.queries, setting.two_eps, setting.delta, setting.seed)


def workload(setting: Setting) -> Workload:
    """Build a setting's stream, history and histogram (deterministic in its seed)."""
    if setting.dataset in ADULT_WORKLOADS:
        cube, x = _adult()
        items = adult.translate(cube, adult_statements(setting))
        compaction = adult.Compaction(x.size, (r.query for i in items for r in i.requests))
        compact = Workload(
            compaction.blocks, compaction.histogram(x), tuple(compaction.items(items))
        )
        return Workload(x.size, x, tuple(items), compact=compact)
    x = load_histogram(setting.dataset, DOMAIN)
    items = paper_stream(DOMAIN, setting.queries, setting.two_eps, setting.delta, setting.seed)
    history: list[HistoryEntry] = []
    if setting.tree is not None:
        history = tree_history(x, setting.tree, np.random.default_rng(setting.seed + 2000))
    return Workload(DOMAIN, x, tuple(items), tuple(history))


@dataclass
class Trace:
    """What one system did with one stream, value by value."""

    system: str
    answered: list[bool] = field(default_factory=list)
    estimate: list[float] = field(default_factory=list)
    low: list[float] = field(default_factory=list)
    high: list[float] = field(default_factory=list)
    truth: list[float] = field(default_factory=list)
    eps: list[float] = field(default_factory=list)
    source: list[str] = field(default_factory=list)
    budget: list[float] = field(default_factory=list)
    alpha_bar: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)  # per statement

    def add(self, answer: Answer | None, truth: float, eps: float, alpha_bar: float) -> None:
        self.answered.append(answer is not None)
        self.estimate.append(answer.estimate if answer else math.nan)
        self.low.append(answer.low if answer else math.nan)
        self.high.append(answer.high if answer else math.nan)
        self.truth.append(truth)
        self.eps.append(eps)
        self.source.append(answer.source if answer else "refused")
        self.budget.append(answer.budget if answer else 0.0)
        self.alpha_bar.append(alpha_bar)


def make_system(key: str, setting: Setting, load: Workload) -> System:
    """A fresh instance of system ``key`` for a setting (all share the noise seed)."""
    seed = setting.seed + 1000
    if key == "dpproxy":
        return systems.Dpproxy(load.n, setting.total, seed, load.history)
    base = load.for_baselines()
    args = (base.n, setting.total, seed, base.history)
    if key == "fixed":
        return systems.FixedBudget(*args, systems.fixed_budget(setting.two_eps, setting.delta))
    kinds: dict[str, Callable[..., System]] = {
        "improved": systems.ImprovedBaseline,
        "greedy": systems.GreedyBayes,
        "blue_pc": systems.BluePC,
        "ols": systems.OlsReuse,
    }
    return kinds[key](*args)


def run_stream(system: System, items: Sequence[Item], x: npt.NDArray[np.int64]) -> Trace:
    """Answer every statement; record answers, truths and the privacy cost after each."""
    trace = Trace(system.name)

    def measure(q: LinearQuery) -> float:
        return q.evaluate(x)

    for item in items:
        start = time.perf_counter()
        answers = system.answer(item.requests, measure)
        trace.seconds.append(time.perf_counter() - start)
        alpha_bar = system.alpha_bar
        for request, answer in zip(item.requests, answers):
            trace.add(answer, request.query.evaluate(x), request.accuracy.eps, alpha_bar)
    return trace


def run_setting(
    setting: Setting,
    keys: Sequence[str] = tuple(systems.SYSTEMS),
    log: Callable[[str], None] = print,
) -> dict[str, Trace]:
    """Every system on the setting's stream."""
    load = workload(setting)
    traces = {}
    for key in keys:
        start = time.perf_counter()
        system = make_system(key, setting, load)
        base = load if key == "dpproxy" else load.for_baselines()
        traces[key] = run_stream(system, base.items, base.x)
        m = metrics(traces[key], setting.delta)
        log(
            f"  {setting.dataset:13} {setting.kind:9} {setting.label:48} {system.name:24} "
            f"R_a {m['R_a']:.3f} R_i {m['R_i']:.3f} E {m['E']:.3f} "
            f"alpha_bar {m['alpha_bar']:.3f} ({time.perf_counter() - start:.1f} s)"
        )
    return traces


def metrics(trace: Trace, delta: float) -> dict[str, float]:
    """R_a, R_i (and its 3-SE floor), E, alpha_bar, latency and answer sources."""
    answered = np.array(trace.answered)
    count = int(answered.sum())
    truth = np.array(trace.truth)[answered]
    low, high = np.array(trace.low)[answered], np.array(trace.high)[answered]
    error = np.abs(np.array(trace.estimate)[answered] - truth) / np.array(trace.eps)[answered]
    sources = np.array(trace.source)
    floor = (1 - delta) - 3 * math.sqrt(delta * (1 - delta) / count) if count else math.nan
    covered = float(np.mean((low <= truth) & (truth <= high))) if count else math.nan
    return {
        "values": float(answered.size),
        "answered": float(count),
        "R_a": count / answered.size,
        "R_i": covered,
        "R_i_floor": floor,
        "R_i_ok": float(not count or covered >= floor),
        "E": float(error.mean()) if count else math.nan,
        "alpha_bar": trace.alpha_bar[-1],
        "latency_ms": 1e3 * float(np.mean(trace.seconds)),
        "history": float(np.sum(sources == "history")),
        "fresh": float(np.sum(sources == "fresh")),
        "combined": float(np.sum(sources == "combined")),
    }
