"""The per-cell budget alone: CPU per statement of its check, commit and most-spent-after.

Run ``uv run python -m bench.budget_bench`` (``--cube demo`` or ``wide``, ``--m`` charges
first). Prints a markdown table; docs/benchmarks.md records it.

A history of ``m`` answers is drawn from a pool of SQL statements as in
:mod:`bench.engine_sql_bench` (same cubes, statements and budgets) and committed to a
:class:`~proxy.engine.budget.CellBudget` on the cube's grid of value classes one answer at a
time (the engine's record path). Then a stream of statements, half new and half from the pool,
each charged at the budget a fresh answer at its accuracy would spend (``--asked N``: those
from the pool among its first ``N`` only, as a dashboard asks): per statement, the CPU
time (``time.process_time``) of the check ``plan`` makes, of ``answering._most_spent_after``
(what the ledger store records with the write) and of the commit ``record`` makes.
"""

from __future__ import annotations

import argparse
import sys
import time
from fractions import Fraction

import numpy as np

from bench.engine_sql_bench import Statements, _histogram, _history, cubes
from proxy.dp.answering import _most_spent_after
from proxy.engine.budget import CellBudget, Charges
from proxy.engine.decision import fresh_budget
from proxy.engine.noise import noise_step
from sqlmap.translate import Translator


def run(name: str, m: int, stream: int, seed: int = 7, asked: int | None = None) -> str:
    """``asked``: the stream's statements from the pool come from its first ``asked`` only (a
    dashboard asking its few statements again), not from all of it."""
    cube = cubes()[name]
    translator = Translator([cube])
    statements = Statements(cube, seed)
    pool = [statements.sql() for _ in range(max(50, min(m // 5, 2_000)))]
    history = _history(translator, pool, m, _histogram(cube, seed), seed + 1)
    budget = CellBudget("adult", total=Fraction(10**9), shape=cube.shape)
    start = time.process_time()
    for entry in history:
        budget.commit(Charges.of_query(entry.query, entry.budget))
    load_s = time.process_time() - start
    grid_before = budget._grid.size

    rng = np.random.default_rng(seed + 2)
    times: dict[str, list[float]] = {"check": [], "after": [], "commit": []}
    for _ in range(stream):
        again = pool[: asked or len(pool)]
        sql = again[int(rng.integers(len(again)))] if rng.random() < 0.5 else statements.sql()
        spec = translator.translate(sql)
        assert spec.accuracy is not None
        charges = Charges(
            tuple(
                (q, fresh_budget(q.sensitivity, noise_step(q, spec.accuracy.eps), spec.accuracy))
                for q in (q.without_offset() for q in spec.queries)
            )
        )
        start = time.process_time()
        budget.check(charges, request="bench")
        checked = time.process_time()
        _most_spent_after(budget, charges)
        after = time.process_time()
        budget.commit(charges)
        committed = time.process_time()
        times["check"].append(1e3 * (checked - start))
        times["after"].append(1e3 * (after - checked))
        times["commit"].append(1e3 * (committed - after))

    def cell(values: list[float]) -> str:
        return f"{np.percentile(values, 50):.2f} / {np.percentile(values, 95):.2f}"

    return (
        f"| {name} | {m:,} | {asked or len(pool)} | {load_s:.2f} | "
        f"{grid_before:,} -> {budget._grid.size:,} | "
        f"{cell(times['check'])} | {cell(times['after'])} | {cell(times['commit'])} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cube", choices=["demo", "wide", "both"], default="wide")
    parser.add_argument("--m", default="1000", help="charges first, comma-separated")
    parser.add_argument("--stream", type=int, default=200, help="statements charged per run")
    parser.add_argument(
        "--asked", type=int, help="the stream asks again only the pool's first ASKED statements"
    )
    args = parser.parse_args()
    names = ["demo", "wide"] if args.cube == "both" else [args.cube]
    print(
        "| cube | m | statements asked again | load CPU s | grid cells (after stream) "
        "| check p50 / p95 ms | most spent after | commit |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        for m in (int(v) for v in args.m.split(",")):
            print(run(name, m, args.stream, asked=args.asked), flush=True)


if __name__ == "__main__":
    sys.exit(main())
