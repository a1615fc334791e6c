"""Benchmark of the durable ledger: fresh-answer latency with it vs with in-memory history only.

Run ``uv run python bench/ledger_bench.py`` (``--dsn`` for a PostgreSQL of your own, else an
embedded one is started in a temporary directory; ``--queries N``). The figures recorded in
docs/benchmarks.md come from this script.

Two :class:`~proxy.dp.answering.DpService` over the Adult cube of ``config.yaml`` (total budget
raised so nothing is refused) answer the same stream of distinct DP queries, every one of which
needs a fresh measurement (each names its own group of cells: age bin x sex x education x
race). The services alternate query by query, so both see the same history size at each step.
One keeps its history in memory only; the other commits each measurement to the durable ledger
(advisory lock, read of other processes' entries, insert, commit) before releasing it, and
appends the answer to the audit log. The true histogram comes from a fixed in-memory array, so
the difference is the ledger's cost alone, not the reader's histogram query.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import platform
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import asyncpg
import numpy as np
import yaml

from proxy.config import load_config
from proxy.dp.answering import DpService
from proxy.storage.postgres_ledger import PostgresLedgerStore
from sqlmap.cube import Cube
from sqlmap.vector import LinearQuery

ROOT = Path(__file__).parent.parent
AGES = [(17, 25), (25, 35), (35, 45), (45, 55), (55, 65), (65, 91)]
SEXES = ["Male", "Female"]
RACES = ["White", "Black", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other"]
EDUCATION = [
    "HS-grad", "Some-college", "Bachelors", "Masters", "11th", "Assoc-voc", "Assoc-acdm",
    "10th", "7th-8th", "Prof-school", "9th", "12th", "Doctorate", "5th-6th", "1st-4th",
    "Preschool",
]  # fmt: skip


class FixedHistogram:
    """True answers from a histogram in memory (the same array every time)."""

    def __init__(self, n: int) -> None:
        self.x = np.random.default_rng(0).integers(0, 20, n).astype(np.int64)

    async def measure(self, cube: Cube, queries: Sequence[LinearQuery]) -> list[float]:
        return [q.evaluate(self.x) for q in queries]


def queries(n: int) -> list[str]:
    groups = itertools.product(AGES, SEXES, EDUCATION, RACES)
    out = []
    for ((lo, hi), sex, edu, race), _ in zip(groups, range(n)):
        out.append(
            f"SELECT COUNT(*) FROM adult WHERE age >= {lo} AND age < {hi} AND sex = '{sex}' "
            f"AND education = '{edu}' AND race = '{race}' WITH ACCURACY 50 CONFIDENCE 0.95"
        )
    return out


def pct(values: list[float]) -> str:
    a = np.array(values) * 1000
    return f"{np.percentile(a, 50):.2f} | {np.percentile(a, 95):.2f} | {a.mean():.2f}"


async def run(dsn: str, n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        data: dict[str, Any] = yaml.safe_load((ROOT / "config.yaml").read_text())
        data["tables"]["adult"]["total_budget"] = 1000000
        path = Path(tmp) / "config.yaml"
        path.write_text(yaml.safe_dump(data))
        config = load_config(path)
    cubes = list(config.cubes)
    translator = config.translator()
    source = FixedHistogram(cubes[0].n_cells)
    schema = f"ledger_bench_{uuid.uuid4().hex[:8]}"
    ledger = await PostgresLedgerStore.open(dsn, cubes, schema)
    try:
        durable = await DpService.open_durable(cubes, source, ledger)
        memory = DpService(cubes, source)
        times: dict[str, list[float]] = {"memory": [], "durable": []}
        for i, sql in enumerate(queries(n)):
            spec = translator.translate(sql)
            order = [("memory", memory), ("durable", durable)]
            for name, service in order if i % 2 else reversed(order):
                t = time.perf_counter()
                result = await service.answer(spec, "bench", sql)
                times[name].append(time.perf_counter() - t)
                assert result.replies[0].source == "fresh", result.notices
    finally:
        await ledger.close()
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()
    print(f"{n} fresh answers each; {platform.processor() or platform.machine()}, ", end="")
    print(f"Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}")
    print("| history | p50 ms | p95 ms | mean ms |\n|---|---|---|---|")
    for name, values in times.items():
        print(f"| {name} | {pct(values)} |")
    extra = np.array(times["durable"]) - np.array(times["memory"])
    print(f"| durable - memory (paired) | {pct(list(extra))} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", help="PostgreSQL for the ledger (default: embedded)")
    parser.add_argument("--queries", type=int, default=400)
    args = parser.parse_args()
    if args.dsn:
        asyncio.run(run(args.dsn, args.queries))
        return
    from proxy.embedded import start_embedded

    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(run(start_embedded(Path(tmp)), args.queries))


if __name__ == "__main__":
    main()
