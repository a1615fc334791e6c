"""Engine benchmark on SQL workloads: CPU per statement by source, GROUP BY, restart, RSS.

Run ``uv run python -m bench.engine_sql_bench`` (``--quick`` for a smaller run; ``--cube`` and
``--m`` to choose). Prints markdown tables; docs/benchmarks.md records them.

Statements are real SQL translated by sqlmap over the demo cube (config.yaml, 11,520 cells) or a
wide cube (the demo's seven dimensions plus workclass, marital_status and relationship with
Adult's values: ten dimensions, 4,354,560 cells): range counts and sums over 1-3 dimensions
(``WHERE age BETWEEN 25 AND 44 AND education IN (...)``) and GROUP BYs over 1-3 dimensions
with an optional range. A pool of statements is translated once; a history of ``m`` answers is
drawn from it (a dashboard asks its statements again and again), with the budgets a fresh answer
at its accuracy would spend; the engine is loaded from those entries (the restart), its
factorization written to a checkpoint file, and the engine loaded again from the entries and
that file (the restart from a checkpoint, whose engine answers what follows).
Then a stream of statements, half new and half from the pool, at accuracies from 20 to 500, is
planned and, when it measures, executed (noise drawn, history grown): CPU time per statement
(``time.process_time``) by the source of its answers, and separately ``SELECT race, sex,
income, COUNT(*) FROM adult WHERE age BETWEEN 25 AND 44 GROUP BY race, sex, income`` (20
groups) at eight accuracies: the first time, and the median of the seven after it (a
dashboard asking again: the engine's caches answer those the history answers; the column says
how many of the seven measured, each changing the history the next one is solved on), and the
last of them asked twice more (solved on the history it grew, then found in the caches).
Everything but the database round trip. ``--restarts R`` then asks the same statements on R
engines restarted afresh from the checkpoint and prints the medians over them in a second
table: one run's GROUP BY figures spread by a third, their medians over restarts far less.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

from proxy.config import load_config
from proxy.engine import (
    AccuracyRequest,
    HistoryEntry,
    PrivacyEngine,
    QueryRequest,
    SeededRandomSource,
)
from proxy.engine.decision import fresh_budget
from proxy.engine.noise import noise_step
from proxy.engine.snapshot import Factorization
from proxy.heap import give_back_free_heap
from proxy.storage.factorization_checkpoints import Checkpoint, FactorizationCheckpoints
from sqlmap.cube import CategoricalDimension, Cube
from sqlmap.translate import AnswerSpec, Translator
from sqlmap.vector import LinearQuery

ROOT = Path(__file__).resolve().parent.parent
CATEGORIES = {
    "sex": ["Male", "Female"],
    "race": ["White", "Black", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other"],
    "income": ["<=50K", ">50K"],
    "education": [
        "Preschool",
        "1st-4th",
        "5th-6th",
        "7th-8th",
        "9th",
        "10th",
        "11th",
        "12th",
        "HS-grad",
        "Some-college",
        "Assoc-voc",
        "Assoc-acdm",
        "Bachelors",
        "Masters",
        "Prof-school",
        "Doctorate",
    ],  # fmt: skip
}
WIDE = {  # Adult's values (adult.names), '?' as NULL
    "workclass": [
        "Private",
        "Self-emp-not-inc",
        "Self-emp-inc",
        "Federal-gov",
        "Local-gov",
        "State-gov",
        "Without-pay",
        "Never-worked",
        "?",
    ],  # fmt: skip
    "marital_status": [
        "Married-civ-spouse",
        "Divorced",
        "Never-married",
        "Separated",
        "Widowed",
        "Married-spouse-absent",
        "Married-AF-spouse",
    ],  # fmt: skip
    "relationship": [
        "Wife",
        "Own-child",
        "Husband",
        "Not-in-family",
        "Other-relative",
        "Unmarried",
    ],  # fmt: skip
}
RANGES = {"age": [17, 25, 35, 45, 55, 65, 91], "hours_per_week": [1, 35, 41, 100]}
GROUP_BY_20 = (
    "SELECT race, sex, income, COUNT(*) FROM adult WHERE age BETWEEN 25 AND 44 "
    "GROUP BY race, sex, income"
)


def cubes() -> dict[str, Cube]:
    """The demo cube and the wide one (its dimensions plus three of Adult's)."""
    (demo,) = load_config(ROOT / "config.yaml").cubes
    extra = tuple(
        CategoricalDimension(name, tuple(v), closed=True, nullable=False)
        for name, v in WIDE.items()
    )
    wide = Cube(demo.schema, demo.table, demo.dimensions + extra, demo.total_budget)
    return {"demo": demo, "wide": wide}


class Statements:
    """Adult-like statements: range counts/sums and GROUP BYs over 1-3 dimensions."""

    def __init__(self, cube: Cube, seed: int) -> None:
        self.rng = random.Random(seed)
        self.categories = dict(CATEGORIES)
        if cube.dimension("workclass") is not None:
            self.categories.update(WIDE)
        self.dims = [*self.categories, *RANGES]

    def _predicate(self, dim: str) -> str:
        rng = self.rng
        if dim in RANGES:
            edges = RANGES[dim]
            i = rng.randrange(len(edges) - 1)
            j = rng.randrange(i + 1, len(edges))
            return f"{dim} BETWEEN {edges[i]} AND {edges[j] - 1}"
        values = rng.sample(
            self.categories[dim], rng.randint(1, max(1, len(self.categories[dim]) // 3))
        )
        return f"{dim} IN ({', '.join(repr(v) for v in values)})"

    def sql(self) -> str:
        rng = self.rng
        accuracy = rng.choice([20, 50, 100, 200, 500])
        if rng.random() < 0.6:
            where = " AND ".join(
                self._predicate(d) for d in rng.sample(self.dims, rng.randint(1, 3))
            )
            aggregate = (
                "COUNT(*)"
                if rng.random() < 0.8
                else "COUNT(*) FILTER (WHERE income = '>50K') * 2 - COUNT(*)"
            )
            return f"SELECT {aggregate} FROM adult WHERE {where} WITH ACCURACY {accuracy}"
        groups = rng.sample(
            [d for d in self.categories if len(self.categories[d]) <= 9], rng.randint(1, 3)
        )
        rest = [d for d in self.dims if d not in groups]
        where = f" WHERE {self._predicate(rng.choice(rest))}" if rng.random() < 0.5 else ""
        keys = ", ".join(groups)
        return f"SELECT {keys}, COUNT(*) FROM adult{where} GROUP BY {keys} WITH ACCURACY {accuracy}"


def _rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _cpu_ms(action: Callable[[], object]) -> tuple[float, object]:
    start = time.process_time()
    result = action()
    return 1e3 * (time.process_time() - start), result


def _histogram(cube: Cube, seed: int) -> np.ndarray:
    """Cell counts, then per measure of the cube sums its rows could have (the coordinates)."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 5, size=cube.n_cells)
    sums = [rng.integers(lo * counts, hi * counts + 1) for lo, hi in cube.measure_reach]
    return np.concatenate([counts, *sums]).astype(np.float64)


def _history(
    translator: Translator, pool: list[str], m: int, x: np.ndarray, seed: int
) -> list[HistoryEntry]:
    """``m`` answers drawn from the pool's statements, budgets as a fresh answer would spend."""
    rng = np.random.default_rng(seed)
    vectors: list[tuple[LinearQuery, AccuracyRequest]] = []
    for sql in pool:
        spec = translator.translate(sql)
        assert spec.accuracy is not None
        vectors.extend((q.without_offset(), spec.accuracy) for q in spec.queries)
    entries = []
    costs: dict[int, tuple[Fraction, Fraction, float]] = {}
    # the counts and measures' sums summed over other dimensions
    marginals: dict[tuple[int, ...], np.ndarray] = {}
    for i in rng.integers(0, len(vectors), size=m).tolist():
        query, accuracy = vectors[i]
        if i not in costs:
            step = noise_step(query, accuracy.eps)
            if query.core is not None and query.shape is not None:
                others = tuple(1 + d for d in range(len(query.shape)) if d not in query.axes)
                if query.axes not in marginals:
                    coordinates = x.reshape((query.kinds, *query.shape))
                    marginals[query.axes] = coordinates.sum(axis=others)
                truth = float((marginals[query.axes] * query.core).sum())
            else:
                truth = query.evaluate(x)
            costs[i] = (fresh_budget(query.sensitivity, step, accuracy), step, truth)
        budget, step, truth = costs[i]
        noisy = truth + float(rng.laplace(0, query.sensitivity / float(budget)))
        entries.append(HistoryEntry("adult", query, budget, step, noisy))
    return entries


def restarted(
    cube: Cube,
    history: list[HistoryEntry],
    seed: int,
    *,
    factored: bool = True,
    factorization: Factorization | None = None,
) -> PrivacyEngine:
    """An engine loaded from ``history``, as a restart loads it (budget ample, noise seeded).

    ``factorization``: a checkpoint's, taken if it is the history's.
    """
    return PrivacyEngine(
        "adult",
        cube.n_coordinates,
        total_budget=Fraction(10**9),
        history=history,
        rng=SeededRandomSource(seed),
        measures=cube.measure_reach,
        shape=cube.shape if factored else None,
        factorization=factorization,
    )


def _through_checkpoint(
    cube: Cube,
    history: list[HistoryEntry],
    seed: int,
    engine: PrivacyEngine,
    store: FactorizationCheckpoints,
) -> tuple[PrivacyEngine, str]:
    """The restart again, from a checkpoint of ``engine``'s factorization (as the service's).

    Export (what the service holds the engine's gate for), write to ``store`` and read back
    (``proxy.storage.factorization_checkpoints``), then an engine from the history and it:
    that one answers the stream (bitwise as ``engine`` would). Returns it and the figures.
    """
    export_cpu, factorization = _cpu_ms(engine.factorization)
    if factorization is None:
        return engine, "-"
    assert isinstance(factorization, Factorization)
    start = time.perf_counter()
    size = store.write("adult", Checkpoint(len(history), factorization))
    write_wall = time.perf_counter() - start
    del engine, factorization
    give_back_free_heap()
    start = time.perf_counter()
    load_cpu, restored = _from_checkpoint(cube, history, seed, store)
    load_wall = time.perf_counter() - start
    figures = (
        f"{export_cpu:.0f}, {write_wall:.2f}, {size / 1e6:.0f}; "
        f"{load_wall:.2f} ({load_cpu / 1e3:.2f})"
    )
    return restored, figures


def _from_checkpoint(
    cube: Cube, history: list[HistoryEntry], seed: int, store: FactorizationCheckpoints
) -> tuple[float, PrivacyEngine]:
    """CPU ms of a restart from the checkpoint in ``store`` (read afresh), and its engine."""
    load_cpu, restored = _cpu_ms(
        lambda: restarted(cube, history, seed, factorization=store.read("adult").factorization)
    )
    assert isinstance(restored, PrivacyEngine) and restored.restored_rows == len(history)
    return load_cpu, restored


def requests_of(translator: Translator, sql: str) -> list[QueryRequest]:
    """A statement's values as the engine is asked them."""
    spec = translator.translate(sql)
    assert spec.accuracy is not None
    return [QueryRequest(q, spec.accuracy) for q in spec.queries]


@dataclass
class _Asked:
    """CPU ms per statement one engine spent answering the run's statements, by kind."""

    first: tuple[float, str]  # the pool's first statement, and its source
    by_source: dict[str, list[float]]  # the stream's
    singles: list[float]  # the stream's single-value statements
    group_by: list[tuple[float, str]]  # GROUP_BY_20 at the eight accuracies
    repeats: list[tuple[float, str]]  # the last of them twice more
    translations: list[float]


def _ask_all(
    engine: PrivacyEngine, translator: Translator, x: np.ndarray, first: str, stream: list[str]
) -> _Asked:
    """``first``, the ``stream``, then GROUP_BY_20 at eight accuracies, the last twice more.

    Statements that measure are executed (noise drawn, history grown); the database's
    stand-in (the vectors evaluated on ``x``) is left out of the engine's time.
    """
    measuring = [0.0]

    def measure(ms: object) -> list[float]:
        spent, truths = _cpu_ms(lambda: [q.evaluate(x) for q in ms])  # type: ignore[attr-defined]
        measuring[0] += spent
        return truths  # type: ignore[return-value]

    translations: list[float] = []

    def ask(sql: str) -> tuple[float, str, int]:
        translate_ms, spec = _cpu_ms(lambda: translator.translate(sql))
        translations.append(translate_ms)
        assert isinstance(spec, AnswerSpec) and spec.accuracy is not None
        requests = [QueryRequest(q, spec.accuracy) for q in spec.queries]
        measuring[0] = 0.0
        ms, replies = _cpu_ms(lambda: engine.answer(requests, measure))
        ms -= measuring[0]
        sources = {r.source for r in replies}  # type: ignore[attr-defined]
        source = (
            "fresh" if "fresh" in sources else "combined" if "combined" in sources else "history"
        )
        return ms, source, len(requests)

    first_ms, first_source, _ = ask(first)
    by_source: dict[str, list[float]] = {"history": [], "combined": [], "fresh": []}
    singles: list[float] = []
    for sql in stream:
        ms, source, k = ask(sql)
        by_source[source].append(ms)
        if k == 1:
            singles.append(ms)
    group_by = [
        ask(f"{GROUP_BY_20} WITH ACCURACY {eps}")[:2]
        for eps in (500, 400, 300, 250, 200, 150, 100, 80)
    ]
    # the last twice more: solved on the history it grew, then found in the caches
    repeats = [ask(f"{GROUP_BY_20} WITH ACCURACY 80")[:2] for _ in range(2)]
    return _Asked((first_ms, first_source), by_source, singles, group_by, repeats, translations)


def run(
    name: str,
    cube: Cube,
    m: int,
    stream: int,
    pool_size: int,
    seed: int = 7,
    *,
    factored: bool = True,
    restarts: int = 0,
) -> tuple[str, str | None]:
    """The main table's row for ``cube`` at ``m``, and the restarts table's (None if 0)."""
    translator = Translator([cube])
    statements = Statements(cube, seed)
    pool = [statements.sql() for _ in range(pool_size)]
    x = _histogram(cube, seed)
    history = _history(translator, pool, m, x, seed + 1)
    rng = random.Random(seed + 2)
    # half from the pool, half new; drawn up front, so that every restart asks the same
    asked_stream = [
        rng.choice(pool) if rng.random() < 0.5 else statements.sql() for _ in range(stream)
    ]
    # translating the pool and drawing the history leave hundreds of MB freed but held by
    # malloc (350 MB on the wide cube): without a trim the RSS figures would count them
    give_back_free_heap()
    rss_before = _rss_mb()
    start = time.perf_counter()
    load_cpu, engine = _cpu_ms(lambda: restarted(cube, history, seed, factored=factored))
    load_wall = time.perf_counter() - start
    assert isinstance(engine, PrivacyEngine)
    with tempfile.TemporaryDirectory() as directory:
        store = FactorizationCheckpoints(Path(directory))
        engine, checkpointed = _through_checkpoint(cube, history, seed, engine, store)
        asked = _ask_all(engine, translator, x, pool[0], asked_stream)
        rss = _rss_mb()
        # the service trims after its load and after long engine work (proxy/dp/answering.py):
        # the RSS it holds lies between these two
        give_back_free_heap()
        rss_trimmed = _rss_mb()
        _, distinct, rank = engine.history_shape
        del engine

        def restart() -> PrivacyEngine:
            if checkpointed == "-":
                return restarted(cube, history, seed, factored=factored)
            return _from_checkpoint(cube, history, seed, store)[1]

        # the same statements on engines restarted afresh: the spread between runs of one
        # process (cache and allocator state) shows in their medians less than in one run
        on_restarts = [
            _ask_all(restart(), translator, x, pool[0], asked_stream) for _ in range(restarts)
        ]

    def cell(values: list[float]) -> str:
        if not values:
            return "-"
        return f"{np.percentile(values, 50):.1f} / {np.percentile(values, 95):.0f} ({len(values)})"

    group_by = [ms for ms, _ in asked.group_by]
    # the caches answer only those the history answers: one that measures changes the history
    measured = sum(source != "history" for _, source in asked.group_by[1:])
    repeated = ", ".join(f"{ms:.1f} ({source})" for ms, source in asked.repeats)
    row = (
        f"| {name} | {m:,} | {load_wall:.2f} ({load_cpu / 1e3:.2f}) | {checkpointed} | "
        f"{asked.first[0]:.1f} ({asked.first[1]}) | {cell(asked.singles)} | "
        f"{cell(asked.by_source['history'])} | {cell(asked.by_source['combined'])} | "
        f"{cell(asked.by_source['fresh'])} | "
        f"{group_by[0]:.1f} / {np.percentile(group_by[1:], 50):.1f} ({measured} measured); "
        f"the last twice more {repeated} | "
        f"{rss:.0f}, {rss_trimmed:.0f} trimmed ({rss_before:.0f}) | "
        f"{distinct:,} / {'-' if rank is None else f'{rank:,}'} | {cell(asked.translations)} |"
    )
    if not on_restarts:
        return row, None
    firsts = [a.group_by[0][0] for a in on_restarts]
    agains = [ms for a in on_restarts for ms, _ in a.group_by[1:]]
    singles = [ms for a in on_restarts for ms in a.singles]
    translations = [ms for a in on_restarts for ms in a.translations]
    return row, (
        f"| {name} | {m:,} | {restarts} | {np.median(firsts):.1f} | "
        f"{np.median(agains):.1f} ({len(agains)}) | {np.median(singles):.2f} ({len(singles)}) | "
        f"{np.median(translations):.2f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="m = 1,000 on the demo cube only")
    parser.add_argument("--cube", choices=["demo", "wide", "both"], default="both")
    parser.add_argument("--m", default="1000,10000,100000", help="history sizes, comma-separated")
    parser.add_argument("--stream", type=int, default=200, help="statements decided per run")
    parser.add_argument("--pool", type=int, default=2_000, help="distinct statements at most")
    parser.add_argument(
        "--restarts",
        type=int,
        default=0,
        help="then ask the same statements on this many engines restarted afresh (medians)",
    )
    parser.add_argument(
        "--cells",
        action="store_true",
        help="the engine works cell by cell (not told the cube's shape): the demo cube only",
    )
    args = parser.parse_args()
    chosen = cubes()
    names = ["demo", "wide"] if args.cube == "both" and not args.quick else [args.cube]
    names = ["demo"] if args.quick else names
    sizes = [1_000] if args.quick else [int(v) for v in args.m.split(",")]
    print(
        "| cube | m | load s wall (CPU) | checkpoint: export CPU ms, write s wall, MB; load "
        "from it s wall (CPU) | first statement CPU ms | single value p50 / p95 ms (n) "
        "| history p50 / p95 (n) | combined | fresh "
        "| GROUP BY 20 groups ms, first / again p50 (again that measured); the last twice more "
        "| RSS MB at the end, then trimmed (before load) | distinct vectors / rank "
        "| translation p50 / p95 ms (n) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    restarted_rows = []
    for name in names:
        for m in sizes:
            pool = max(50, min(m // 5, args.pool))
            stream = 60 if args.quick else args.stream
            row, restarted_row = run(
                name, chosen[name], m, stream, pool, factored=not args.cells, restarts=args.restarts
            )
            print(row, flush=True)
            if restarted_row is not None:
                restarted_rows.append(restarted_row)
    if restarted_rows:
        print()
        print(
            "| cube | m | restarts | first GROUP BY median ms | again GROUP BY median ms (n) "
            "| single value median ms (n) | translation median ms (a control) |"
        )
        print("|---|---|---|---|---|---|---|")
        for row in restarted_rows:
            print(row)


if __name__ == "__main__":
    sys.exit(main())
