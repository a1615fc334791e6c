"""A BLUE's variance block by block, against the span solver's rank: the design measured.

Run ``uv run python -m bench.component_elimination`` (``--cube``, ``--m``, ``--check``). It
draws the history ``bench.engine_sql_bench`` loads (the same pool, seeds and budgets), pools
each distinct vector's rows (precision ``sum budget^2 / (2 sensitivity^2)``, the Laplace
noise's) and takes the vectors, scaled by the square roots of their precisions, in the engine's
ANOVA coordinates (:mod:`proxy.engine.factored`: one block per set of dimensions ``S``). Then
it eliminates the blocks highest order first, an orthogonal transformation of the rows (a
multifrontal QR): the rows that weigh a block ``T`` are rotated by the SVD of their ``T`` parts
into rows that fix ``T`` (the block's rank: "absorbed", kept as its front) and rows without it,
passed down to the blocks below. The ranks absorbed add up to the history's rank.

A value ``q`` is then estimable, and its BLUE's variance found, by one substitution through the
fronts from its highest block down: at each front the query's part must lie in the span of the
front's rows (else it is not estimable), the front's weights ``w`` follow, and the front's
other columns carry ``q`` on to lower blocks; the variance is ``sum |w|^2``. It reads only the
fronts on the query's path, not the span's r x r matrices. ``--check`` compares estimability
and variance with a dense minimum-norm reference (one pseudo-inverse; not on the wide cube at
m = 10,000). The test values are the vectors of statements new to the history. The engine does
not use this yet: it measures what a component-wise solver would read.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import numpy as np
import numpy.typing as npt

from bench.engine_sql_bench import Statements, _histogram, _history, cubes
from proxy.engine.factored import AnovaCoordinates
from sqlmap.translate import Translator
from sqlmap.vector import LinearQuery

Component = tuple[int, ...]
FloatArray = npt.NDArray[np.float64]
Row = dict[Component, FloatArray]
Front = tuple[FloatArray, FloatArray, dict[Component, FloatArray]]  # s, V, columns below

_RANK = 1e-9  # singular values below this share of a front's largest are rounding


class Blocks:
    """Sparse ANOVA coordinates cut into the blocks of their sets of dimensions."""

    def __init__(self, space: AnovaCoordinates) -> None:
        numbered = sorted(space._blocks.items(), key=lambda block: block[1])
        self.starts = np.array([start for _, start in numbered] + [space.size])
        self.components: list[Component] = [kept[1:] for kept, _ in numbered]  # (kind, *S)
        ends = zip(self.components, self.starts[:-1], self.starts[1:])
        self.sizes = {S: int(end - start) for S, start, end in ends}
        self.size = space.size

    def row(self, coords: npt.NDArray[np.int64], values: FloatArray, scale: float = 1.0) -> Row:
        block = np.searchsorted(self.starts, coords, side="right") - 1
        row: Row = {}
        for b in np.unique(block):
            part = np.zeros(self.sizes[self.components[b]])
            part[coords[block == b] - self.starts[b]] = scale * values[block == b]
            row[self.components[b]] = part
        return row


def history_and_tests(
    cube_name: str, m: int, tests: int, seed: int = 7
) -> tuple[list[LinearQuery], FloatArray, list[LinearQuery]]:
    """The history's distinct vectors, their pooled precisions, and new statements' vectors."""
    cube = cubes()[cube_name]
    translator = Translator([cube])
    statements = Statements(cube, seed)
    pool = [statements.sql() for _ in range(min(2_000, m // 5))]
    pooled: dict[tuple[Component, bytes], tuple[LinearQuery, float]] = {}
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


def eliminate(rows: list[Row], sizes: dict[Component, int]) -> dict[Component, Front]:
    """Each block's front: singular values and directions of its rows, their other columns."""
    order = {S: i for i, S in enumerate(sorted(sizes, key=lambda S: (-len(S), S)))}
    alive = dict(enumerate(rows))
    meeting: dict[Component, set[int]] = defaultdict(set)
    for i, row in alive.items():
        for S in row:
            meeting[S].add(i)
    fresh = len(rows)
    fronts: dict[Component, Front] = {}
    for T in sorted(sizes, key=order.__getitem__):
        front = sorted(meeting.pop(T, ()))
        if not front:
            continue
        u, s, v = np.linalg.svd(np.stack([alive[i][T] for i in front]))
        rank = int((s > _RANK * s[0]).sum())
        old = [alive.pop(i) for i in front]
        for i, row in zip(front, old):
            for S in row:
                meeting[S].discard(i)
        others = sorted({S for row in old for S in row} - {T}, key=order.__getitem__)
        rotated = {
            S: u.T @ np.stack([row.get(S, np.zeros(sizes[S])) for row in old]) for S in others
        }
        fronts[T] = (s[:rank], v[:rank], {S: c[:rank] for S, c in rotated.items()})
        for S, c in rotated.items():  # rows with no T part, passed down
            scale = np.abs(c).max()
            for j in np.flatnonzero(np.abs(c[rank:]).max(axis=1, initial=0.0) > 1e-12 * scale):
                alive.setdefault(fresh + int(j), {})[S] = c[rank + j]
                meeting[S].add(fresh + int(j))
        fresh += len(front) - rank
    return fronts


def variance(
    query: Row, fronts: dict[Component, Front], order: dict[Component, int]
) -> tuple[float | None, int]:
    """The BLUE's variance of ``query`` (None: not estimable) and the numbers it read."""
    rest = {S: part.copy() for S, part in query.items()}
    total, read = 0.0, 0
    while rest:
        T = min(rest, key=order.__getitem__)
        part = rest.pop(T)
        if T not in fronts:
            if np.abs(part).max() > 1e-9:
                return None, read
            continue
        s, v, below = fronts[T]
        a = v @ part
        if np.linalg.norm(part - v.T @ a) > 1e-7 * max(1.0, float(np.linalg.norm(part))):
            return None, read
        w = a / s
        total += float(w @ w)
        read += v.size + sum(c.size for c in below.values())
        for S, c in below.items():
            rest[S] = rest.get(S, 0.0) - c.T @ w
    return total, read


def against_reference(
    coordinates: list[tuple[npt.NDArray[np.int64], FloatArray]],
    precisions: FloatArray,
    results: list[tuple[float | None, int, float]],
    size: int,
) -> tuple[int, float]:
    """How many values a dense minimum-norm solve finds estimable alike, and the largest
    relative difference of a variance (coordinates: the history's, then the values')."""
    history = len(precisions)
    dense = np.zeros((history, size))
    for i, ((c, v), p) in enumerate(zip(coordinates, precisions)):
        dense[i, c] = np.sqrt(p) * v
    minimum_norm = np.linalg.pinv(dense.T, rcond=1e-10)  # u = minimum_norm @ q
    agree, worst = 0, 0.0
    for (c, v), (var, _, _) in zip(coordinates[history:], results):
        q = np.zeros(size)
        q[c] = v
        u = minimum_norm @ q
        inside = np.linalg.norm(dense.T @ u - q) <= 1e-7 * max(1.0, float(np.linalg.norm(q)))
        agree += inside == (var is not None)
        if inside and var is not None:
            worst = max(worst, float(abs(var - u @ u) / (u @ u)))
    return agree, worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cube", choices=["demo", "wide"], default="wide")
    parser.add_argument("--m", type=int, default=10_000, help="history size")
    parser.add_argument("--tests", type=int, default=60, help="new statements to estimate")
    parser.add_argument("--check", action="store_true", help="against a dense reference")
    args = parser.parse_args()
    history, precisions, tests = history_and_tests(args.cube, args.m, args.tests)
    space = AnovaCoordinates(cubes()[args.cube].shape)
    coordinates = space.of_many(history + tests)
    blocks = Blocks(space)
    rows = [blocks.row(c, v, float(np.sqrt(p))) for (c, v), p in zip(coordinates, precisions)]
    start = time.process_time()
    fronts = eliminate(rows, blocks.sizes)
    seconds = time.process_time() - start
    order = {S: i for i, S in enumerate(sorted(blocks.sizes, key=lambda S: (-len(S), S)))}
    rank = sum(s.size for s, _, _ in fronts.values())
    results = []
    for c, v in coordinates[len(history) :]:
        start = time.process_time()
        var, read = variance(blocks.row(c, v), fronts, order)
        results.append((var, read, 1e3 * (time.process_time() - start)))
    estimable = [r for r in results if r[0] is not None]
    print(
        f"{args.cube} cube, m = {args.m:,}: {len(history):,} distinct vectors, rank {rank:,}, "
        f"{blocks.size:,} coordinates in {len(blocks.sizes)} blocks; eliminated in {seconds:.1f} s"
    )
    print()
    print(
        "| order | blocks | coordinates | rank absorbed | rows of a front, median / max "
        "| coordinates below a front, median / max |"
    )
    print("|---|---|---|---|---|---|")
    for size in sorted({len(S) for S in fronts}, reverse=True):
        of_size = [(f, blocks.sizes[T]) for T, f in fronts.items() if len(T) == size]
        ranks = np.array([f[0].size for f, _ in of_size])
        below = np.array([sum(c.shape[1] for c in f[2].values()) for f, _ in of_size])
        print(
            f"| {size} | {len(of_size)} | {sum(n for _, n in of_size):,} | {ranks.sum():,} "
            f"| {np.median(ranks):.0f} / {ranks.max():,} "
            f"| {np.median(below):,.0f} / {below.max():,} |"
        )
    print()
    if estimable:
        cpu = [r[2] for r in estimable]
        numbers = [r[1] for r in estimable]
        print(
            f"{len(results)} new values, {len(estimable)} estimable: CPU per value p50 / p95 "
            f"{np.median(cpu):.2f} / {np.percentile(cpu, 95):.2f} ms; numbers read p50 / p95 "
            f"{np.median(numbers):,.0f} / {np.percentile(numbers, 95):,.0f} (a dense pass over the "
            f"span's triangle: {rank * (rank + 1) // 2:,})"
        )
    if args.check:
        agree, worst = against_reference(coordinates, precisions, results, blocks.size)
        print(
            f"dense reference: estimable alike for {agree} of {len(results)}; largest relative "
            f"difference of a variance {worst:.1e}"
        )


if __name__ == "__main__":
    main()
