"""How a history's rows would eliminate ANOVA component by component, highest order first.

Run ``uv run python -m bench.component_elimination`` (``--cube``, ``--m``). It draws the history
``bench.engine_sql_bench`` loads (the same pool, seeds and budgets), takes its distinct vectors
in the ANOVA coordinates the engine uses (:mod:`proxy.engine.factored`: one block per set of
dimensions ``S``) and eliminates one block ``T`` at a time, highest order first: the rows that
weigh ``T`` are split by an SVD of their ``T`` parts into the combinations that fix ``T`` (the
block's rank, "absorbed") and those that leave it out ("passed down", rows over the other
blocks those rows weigh). The ranks absorbed add up to the history's rank. A query over a set
``D`` of dimensions would then read the fronts of its own blocks and those below them, not the
whole span: the table shows how large those fronts are, in rows and in coordinates, against the
rank the span solver works at. Weights are left out (scaling rows changes neither ranks nor
which blocks they meet). It measures the design a component-wise solver would have; the engine
does not use it.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import numpy as np

from bench.engine_sql_bench import Statements, _histogram, _history, cubes
from proxy.engine.factored import AnovaCoordinates
from sqlmap.translate import Translator

Component = tuple[int, ...]
Row = dict[Component, np.ndarray]


def distinct_rows(cube_name: str, m: int, seed: int = 7) -> tuple[list[Row], dict[Component, int]]:
    """The history's distinct vectors as blocks ``{S: values}``, and each block's size."""
    cube = cubes()[cube_name]
    translator = Translator([cube])
    statements = Statements(cube, seed)
    pool = [statements.sql() for _ in range(min(2_000, m // 5))]
    history = _history(translator, pool, m, _histogram(cube, seed), seed + 1)
    queries = list(
        {(e.query.axes, np.asarray(e.query.core).tobytes()): e.query for e in history}.values()
    )
    space = AnovaCoordinates(cube.shape)
    coordinates = space.of_many(queries)
    numbered = sorted(space._blocks.items(), key=lambda block: block[1])
    starts = np.array([start for _, start in numbered] + [space.size])
    components: list[Component] = [kept[1:] for kept, _ in numbered]  # (kind, *S) -> S
    sizes = {S: int(starts[i + 1] - starts[i]) for i, S in enumerate(components)}
    rows = []
    for coords, values in coordinates:
        block = np.searchsorted(starts, coords, side="right") - 1
        row: Row = {}
        for b in np.unique(block):
            part = np.zeros(sizes[components[b]])
            part[coords[block == b] - starts[b]] = values[block == b]
            row[components[b]] = part
        rows.append(row)
    return rows, sizes


def eliminate(
    rows: list[Row], sizes: dict[Component, int]
) -> dict[int, list[tuple[int, int, int, int]]]:
    """Per order, per block: (rows meeting it, its size, rank absorbed, other coordinates)."""
    alive = dict(enumerate(rows))
    meeting: dict[Component, set[int]] = defaultdict(set)
    for i, row in alive.items():
        for S in row:
            meeting[S].add(i)
    fresh = len(rows)
    fronts: dict[int, list[tuple[int, int, int, int]]] = defaultdict(list)
    for T in sorted(sizes, key=lambda S: (-len(S), S)):
        front = sorted(meeting.pop(T, ()))
        if not front:
            continue
        u, s, _ = np.linalg.svd(np.stack([alive[i][T] for i in front]))
        rank = int((s > 1e-9 * s[0]).sum())
        others = sorted({S for i in front for S in alive[i]} - {T})
        fronts[len(T)].append((len(front), sizes[T], rank, sum(sizes[S] for S in others)))
        for i in front:
            for S in alive[i]:
                meeting[S].discard(i)
        old = [alive.pop(i) for i in front]
        down = u[:, rank:].T  # combinations of the front's rows with no T part
        for S in others:
            parts = np.stack([row.get(S, np.zeros(sizes[S])) for row in old])
            passed = down @ parts
            scale = np.abs(parts).max()
            for j in np.flatnonzero(np.abs(passed).max(axis=1) > 1e-9 * scale):
                alive.setdefault(fresh + int(j), {})[S] = passed[j]
                meeting[S].add(fresh + int(j))
        fresh += down.shape[0]
    return fronts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cube", choices=["demo", "wide"], default="wide")
    parser.add_argument("--m", type=int, default=10_000, help="history size")
    args = parser.parse_args()
    rows, sizes = distinct_rows(args.cube, args.m)
    start = time.process_time()
    fronts = eliminate(rows, sizes)
    seconds = time.process_time() - start
    rank = sum(f[2] for blocks in fronts.values() for f in blocks)
    print(f"{args.cube} cube, m = {args.m:,}: {len(rows):,} distinct vectors, rank {rank:,}, ")
    print(
        f"{sum(sizes.values()):,} coordinates in {len(sizes)} blocks; eliminated in {seconds:.0f} s"
    )
    print()
    print(
        "| order | blocks | coordinates | rank absorbed | rows in a front, median / max |"
        " coordinates of a front, median / max |"
    )
    print("|---|---|---|---|---|---|")
    for order, blocks in sorted(fronts.items(), reverse=True):
        a = np.array(blocks)
        width = a[:, 1] + a[:, 3]
        print(
            f"| {order} | {len(blocks)} | {a[:, 1].sum():,} | {a[:, 2].sum():,} | "
            f"{np.median(a[:, 0]):.0f} / {a[:, 0].max():,} | "
            f"{np.median(width):,.0f} / {width.max():,} |"
        )


if __name__ == "__main__":
    main()
