"""The solver by fronts of ANOVA blocks against the span solver: CPU, memory, agreement.

Run ``uv run python -m bench.component_elimination`` (``--cube``, ``--m``, ``--no-span``,
``--check``). It draws the history ``bench.engine_sql_bench`` loads (the same pool, seeds and
budgets), pools each distinct vector's rows (precision ``sum budget^2 / (2 sensitivity^2)``,
the Laplace noise's) and loads the vectors, in the engine's ANOVA coordinates, into
:class:`~proxy.engine.fronts.BlockFronts` and :class:`~proxy.engine.span.SpanSolver` as a
restart does (every vector added and weighed, then factored at once). Then, per solver, CPU
per value of the vectors of statements new to the history (each solved alone), of the 20-group
GROUP BY of ``bench.engine_sql_bench`` solved as one batch, of one more row on a copy (a repeat
of a history vector, or a new vector) and of a plan's step (a copy, a new vector weighed, the
batch's other values solved again). Values are compared with the span solver's (estimable
alike; ``u_j`` within 1e-9 of the largest) and, with ``--check``, with a dense minimum-norm
reference (one pseudo-inverse: small histories only). Memory: the numbers the fronts keep
(``R_T``, ``R_T^{-1}``, ``V_T``, ``C_T``) and the span's matrices (``G``, ``L``, ``L^{-1}``,
``K``, ``K^{-1}`` and the coordinates, ``5 r^2 + r n``), and what the fronts hold in all once a
value is solved (traced in a build of their own: with the caches a solve fills).
``--one-by-one`` also builds the fronts a vector at a time (each row rotated in before the
next), as a history grows. ``OPENBLAS_NUM_THREADS=1`` for CPU figures that mean something.
"""

from __future__ import annotations

import argparse
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from bench.engine_sql_bench import GROUP_BY_20, Statements, _histogram, _history, cubes
from proxy.engine.estimator import ESTIMABLE_RESIDUAL
from proxy.engine.factored import AnovaCoordinates
from proxy.engine.fronts import BlockFronts
from proxy.engine.span import SpanSolver
from sqlmap.translate import Translator
from sqlmap.vector import LinearQuery

FloatArray = npt.NDArray[np.float64]
Coordinates = tuple[npt.NDArray[np.int64], FloatArray]
Found = tuple[list[FloatArray | None], list[float]]
T = TypeVar("T")


class Solver(Protocol):
    """What both solvers offer (the contract HistoryIndex uses)."""

    size: int

    @property
    def rank(self) -> int: ...
    def add(self, cells: npt.NDArray[np.int64], weights: FloatArray) -> int: ...
    def weigh(self, j: int, weight2: float) -> None: ...
    def prepare(self) -> None: ...
    def solve_many(self, queries: list[Coordinates]) -> Found: ...
    def copy(self) -> Solver: ...


def history_and_tests(
    cube_name: str, m: int, tests: int, seed: int = 7
) -> tuple[list[LinearQuery], FloatArray, list[LinearQuery]]:
    """The history's distinct vectors, their pooled precisions, and new statements' vectors."""
    cube = cubes()[cube_name]
    translator = Translator([cube])
    statements = Statements(cube, seed)
    pool = [statements.sql() for _ in range(min(2_000, m // 5))]
    pooled: dict[tuple[tuple[int, ...], bytes], tuple[LinearQuery, float]] = {}
    for e in _history(translator, pool, m, _histogram(cube, seed), seed + 1):
        key = (e.query.axes, np.asarray(e.query.core).tobytes())
        query, precision = pooled.get(key, (e.query, 0.0))
        pooled[key] = (query, precision + float(e.budget) ** 2 / (2 * e.query.sensitivity**2))
    new = [
        q.without_offset()
        for _ in range(tests)
        for q in translator.translate(statements.sql()).queries
    ]
    return (
        [q for q, _ in pooled.values()],
        np.array([p for _, p in pooled.values()]),
        new,
    )


def _cpu_ms(action: Callable[[], T]) -> tuple[float, T]:
    start = time.process_time()
    result = action()
    return 1e3 * (time.process_time() - start), result


def loaded(solver: Solver, history: list[Coordinates], precisions: FloatArray) -> float:
    """Add and weigh every vector, then factor (and form what solves read): CPU seconds."""

    def load() -> int:
        for (c, v), p in zip(history, precisions.tolist()):
            solver.weigh(solver.add(c, v), p)
        if isinstance(solver, SpanSolver):
            solver.place_all()
        solver.prepare()
        return solver.rank

    return _cpu_ms(load)[0] / 1e3


@dataclass
class Measured:
    """One solver's figures: CPU in ms (arrays: one per value or row) and the values found."""

    single: FloatArray
    estimable: FloatArray  # the single values within the span
    first: float  # the first of them (a restart's first value: caches are filled then)
    found: list[FloatArray | None]
    batch: float
    batch_found: list[FloatArray | None]
    repeat: FloatArray
    fresh: FloatArray
    copy: float
    step: float


def measured(
    solver: Solver, tests: list[Coordinates], batch: list[Coordinates], precisions: FloatArray
) -> Measured:
    """CPU per value (single, batch), per row on a copy, per plan step; and the values."""
    single = [_cpu_ms(lambda q=q: solver.solve_many([q])) for q in tests]
    batches = [_cpu_ms(lambda: solver.solve_many(batch)) for _ in range(7)]
    inside = [q for q, (_, ((found,), _)) in zip(tests, single) if found is not None]
    probe = inside[0] if inside else tests[0]  # solved after each row, as a plan's next value
    repeats, fresh, copies = [], [], []

    def then_probe(copied: Solver, j: int, weight2: float) -> Found:
        copied.weigh(j, weight2)
        return copied.solve_many([probe])

    for j in np.random.default_rng(3).choice(solver.size, 30, replace=False).tolist():
        copy_ms, copied = _cpu_ms(solver.copy)
        copies.append(copy_ms)
        repeats.append(_cpu_ms(lambda c=copied, j=j: then_probe(c, j, float(precisions[j])))[0])
    for q in tests[:30]:
        copied = solver.copy()
        fresh.append(_cpu_ms(lambda c=copied, q=q: then_probe(c, c.add(*q), 1.0))[0])

    def step() -> Found:
        copied = solver.copy()
        copied.weigh(copied.add(*batch[0]), 1.0)
        return copied.solve_many(batch[1:])

    return Measured(
        single=np.array([ms for ms, _ in single]),
        estimable=np.array([ms for ms, ((found,), _) in single if found is not None]),
        first=next((ms for ms, ((found,), _) in single if found is not None), float("nan")),
        found=[found for _, ((found,), _) in single],
        batch=float(np.median([ms for ms, _ in batches])),
        batch_found=batches[0][1][0],
        repeat=np.array(repeats),
        fresh=np.array(fresh),
        copy=float(np.median(copies)),
        step=float(np.median([_cpu_ms(step)[0] for _ in range(7)])),
    )


def one_by_one(
    space: AnovaCoordinates, history: list[Coordinates], precisions: FloatArray
) -> float:
    """BlockFronts built a vector at a time, each rotated in before the next: CPU seconds."""
    fronts = BlockFronts(space, residual=ESTIMABLE_RESIDUAL)

    def build() -> int:
        for (c, v), p in zip(history, precisions.tolist()):
            fronts.weigh(fronts.add(c, v), p)
            fronts.rank  # noqa: B018 (rotates the row in)
        return fronts.rank

    return _cpu_ms(build)[0] / 1e3


def traced_mb(
    space: AnovaCoordinates, history: list[Coordinates], precisions: FloatArray, value: Coordinates
) -> float:
    """What BlockFronts holds once built and a value solved (traced allocations), MB."""
    tracemalloc.start()
    fronts = BlockFronts(space, residual=ESTIMABLE_RESIDUAL)
    loaded(fronts, history, precisions)
    fronts.solve_many([value])
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return held / 2**20


def agreement(
    found: list[FloatArray | None], expected: list[FloatArray | None], precisions: FloatArray
) -> tuple[int, float]:
    """Values estimable alike, and the largest difference of a ``u_j`` over the largest."""
    c = np.sqrt(precisions)
    alike, worst = 0, 0.0
    for a, b in zip(found, expected):
        alike += (a is None) == (b is None)
        if a is not None and b is not None:
            u = b[: c.size] * c
            worst = max(worst, float(np.abs(a[: c.size] * c - u).max() / np.abs(u).max()))
    return alike, worst


def dense_reference(
    history: list[Coordinates], precisions: FloatArray, tests: list[Coordinates], size: int
) -> list[FloatArray | None]:
    """Per test value, ``u_j / c_j`` of the dense minimum-norm solution (None: not estimable)."""
    weighed = np.zeros((len(history), size))
    for i, ((c, v), p) in enumerate(zip(history, precisions)):
        weighed[i, c] = np.sqrt(p) * v
    minimum_norm = np.linalg.pinv(weighed.T, rcond=1e-10)
    out: list[FloatArray | None] = []
    for c, v in tests:
        q = np.zeros(size)
        q[c] = v
        u = minimum_norm @ q
        inside = np.linalg.norm(weighed.T @ u - q) <= ESTIMABLE_RESIDUAL * np.linalg.norm(q)
        out.append(u / np.sqrt(precisions) if inside else None)
    return out


def _percentiles(ms: FloatArray) -> str:
    return f"{np.median(ms):.2f} / {np.percentile(ms, 95):.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cube", choices=["demo", "wide"], default="demo")
    parser.add_argument("--m", type=int, default=10_000, help="history size")
    parser.add_argument("--tests", type=int, default=60, help="new statements to solve")
    parser.add_argument("--no-span", action="store_true", help="the fronts alone")
    parser.add_argument("--check", action="store_true", help="against a dense reference")
    parser.add_argument(
        "--one-by-one", action="store_true", help="also build the fronts a vector at a time"
    )
    args = parser.parse_args()
    cube = cubes()[args.cube]
    history, precisions, tests = history_and_tests(args.cube, args.m, args.tests)
    group_by = [q.without_offset() for q in Translator([cube]).translate(GROUP_BY_20).queries]
    space = AnovaCoordinates(cube.shape)
    coordinates = space.of_many(history + tests + group_by)
    vectors = coordinates[: len(history)]
    values = coordinates[len(history) : len(history) + len(tests)]
    batch = coordinates[len(history) + len(tests) :]
    solvers: dict[str, Solver] = {"fronts": BlockFronts(space, residual=ESTIMABLE_RESIDUAL)}
    if not args.no_span:
        solvers["span"] = SpanSolver(space.size, residual=ESTIMABLE_RESIDUAL)
    built = {name: loaded(solver, vectors, precisions) for name, solver in solvers.items()}
    results = {name: measured(s, values, batch, precisions) for name, s in solvers.items()}
    fronts = solvers["fronts"]
    assert isinstance(fronts, BlockFronts)
    layout = fronts.layout()
    rank = fronts.rank
    kept = {
        "fronts": sum(k * (2 * k + n + below) for _, k, n, below in layout),
        "span": 5 * rank * rank + rank * len(history),
    }
    estimable = sum(f is not None for f in results["fronts"].found)
    probe = next((v for v, f in zip(values, results["fronts"].found) if f is not None), values[0])
    held = traced_mb(space, vectors, precisions, probe)
    print(
        f"{args.cube} cube, m = {args.m:,}: {len(history):,} distinct vectors, rank {rank:,} "
        f"(span solver: {solvers['span'].rank if 'span' in solvers else '-'}), "
        f"{space.size:,} coordinates; {len(values)} new values, {estimable} estimable; "
        f"the fronts hold {held:,.0f} MB once a value is solved"
    )
    print()
    print(
        "| solver | build s CPU | single value p50 / p95 ms | estimable ones | first of them "
        "| 20-group batch ms "
        "| copy ms | a row on a copy, then a value: repeat / new, p50 / p95 ms "
        "| copy + new row + 19 values ms "
        "| numbers kept (MB) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        print(
            f"| {name} | {built[name]:.2f} | {_percentiles(r.single)} "
            f"| {_percentiles(r.estimable)} | {r.first:.1f} | {r.batch:.2f} "
            f"| {r.copy:.3f} | {_percentiles(r.repeat)} / {_percentiles(r.fresh)} "
            f"| {r.step:.2f} | {kept[name]:,} ({8 * kept[name] / 2**20:,.0f}) |"
        )
    print()
    if "span" in results:
        f, s = results["fronts"], results["span"]
        for what, ours, theirs in (
            ("single values", f.found, s.found),
            ("batch", f.batch_found, s.batch_found),
        ):
            alike, worst = agreement(ours, theirs, precisions)
            count = len(ours)
            print(
                f"against the span solver, {what}: estimable alike {alike} of {count}; "
                f"largest difference of a u_j {worst:.1e} of the largest"
            )
    if args.one_by_one:
        print(
            f"the fronts built a vector at a time: {one_by_one(space, vectors, precisions):.2f} s "
            f"CPU (at once: {built['fronts']:.2f} s, with what solves read)"
        )
    if args.check:
        reference = dense_reference(vectors, precisions, values, space.size)
        alike, worst = agreement(results["fronts"].found, reference, precisions)
        print(
            f"against the dense reference: estimable alike {alike} of {len(values)}; "
            f"largest difference of a u_j {worst:.1e} of the largest"
        )
    print()
    print(
        "| order | fronts | coordinates | rank | rows of a front, median / max "
        "| columns below a front, median / max |"
    )
    print("|---|---|---|---|---|---|")
    for order in sorted({len(key) - 1 for key, *_ in layout}, reverse=True):
        of_order = [(k, n, below) for key, k, n, below in layout if len(key) - 1 == order]
        ranks = np.array([k for k, _, _ in of_order])
        below = np.array([b for _, _, b in of_order])
        print(
            f"| {order} | {len(of_order)} | {sum(n for _, n, _ in of_order):,} | {ranks.sum():,} "
            f"| {np.median(ranks):.0f} / {ranks.max():,} "
            f"| {np.median(below):,.0f} / {below.max():,} |"
        )


if __name__ == "__main__":
    main()
