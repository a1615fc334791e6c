"""Range-respecting answers and DP_PROBABILITY through dpproxy's service, on the demo table.

Run ``uv run python bench/range_answers_eval.py`` (``--trials 40`` for a quick look). Starts an
embedded PostgreSQL with the Adult table, then, per seeded trial, a fresh ``DpService`` (empty
history) answers the education x sex counts of ``race = 'Amer-Indian-Eskimo'`` (32 groups, 311
rows) at +-50 (95%). Prints, for the groups whose truth is below 5% of the half-width (0-2
rows) and for all groups: the mean absolute error of the released estimates (the posterior
mode, the default) and of the unbiased ones (``SET dp.estimate = unbiased``), the smallest
estimate and lower bound, and the coverage of the released intervals. Then the CPU time of one
``DP_PROBABILITY`` value by the number of noise terms of its answer. docs/benchmarks.md
("Range-respecting answers through the service") records its output.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import psycopg

from proxy.config import load_config
from proxy.demo import load_adult
from proxy.dp.answering import DpService
from proxy.embedded import start_embedded
from proxy.engine.noise import SeededRandomSource
from proxy.engine.posterior import Interval, comparison, probability
from proxy.storage.provision import provision_roles
from proxy.storage.reader import Reader

ROOT = Path(__file__).resolve().parent.parent
FEW = "race = 'Amer-Indian-Eskimo'"
SQL = (
    "SELECT education, sex, COUNT(*) AS n, DP_INTERVAL_LOW(COUNT(*)) AS lo, "
    f"DP_INTERVAL_HIGH(COUNT(*)) AS hi FROM adult WHERE {FEW} GROUP BY education, sex "
    "WITH ACCURACY 50 CONFIDENCE 0.95"
)


async def through_the_service(dsn: str, trials: int) -> None:
    config = load_config(ROOT / "config.yaml")
    translator = config.translator()
    roles = provision_roles(dsn, config.cubes)
    with psycopg.connect(dsn) as conn:
        counts = conn.execute(
            f"SELECT education, sex, COUNT(*) FROM adult WHERE {FEW} GROUP BY education, sex"
        ).fetchall()
    truths = {(e, s): n for e, s, n in counts}
    reader = await Reader.connect(roles.reader_dsn)
    rows = []  # truth, released estimate, unbiased estimate, low, high
    spec = translator.translate(SQL)
    for seed in range(trials):
        service = DpService(config.cubes, reader, SeededRandomSource(seed))
        result = await service.answer(spec)
        for (education, sex, n, lo, hi), reply in zip(result.rows, result.replies):
            rows.append((truths.get((education, sex), 0), n, reply.center, lo, hi))
    await reader.close()
    t, e, r, lo, hi = (np.array(c, dtype=float) for c in zip(*rows))
    print(f"\n{trials} trials x {len(spec.rows)} groups, +-50 at 95%\n")
    print("| values | n | MAE released (mode) | MAE unbiased | min estimate | min low | coverage |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, chosen in (("truth 0-2 (< 5% of 50)", t < 2.5), ("all 32 groups", t >= 0)):
        print(
            f"| {label} | {int(chosen.sum())} | {np.mean(np.abs(e - t)[chosen]):.2f} | "
            f"{np.mean(np.abs(r - t)[chosen]):.2f} | {e[chosen].min():.2f} | "
            f"{lo[chosen].min():.2f} | {np.mean(((lo <= t) & (t <= hi))[chosen]):.4f} |"
        )


def probability_cost() -> None:
    rng = np.random.default_rng(1)
    counts = Interval(0.0, math.inf)
    print("\n| noise terms | CPU per DP_PROBABILITY value (median of 200) |\n|---:|---:|")
    for terms in (1, 2, 3, 10):
        scales = rng.uniform(5, 20, terms)
        times = []
        for _ in range(200):
            y = float(rng.uniform(-20, 100))
            start = time.process_time()
            probability(scales, y, comparison(">", 30.0), counts)
            times.append(time.process_time() - start)
        print(f"| {terms} | {1000 * float(np.median(times)):.3f} ms |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=160)
    args = parser.parse_args()
    print(f"{platform.node()} {platform.processor() or platform.machine()}, load {os.getloadavg()}")
    start = time.process_time()
    dsn = start_embedded(Path(tempfile.mkdtemp(prefix="dpproxy-range-")))
    load_adult(dsn)
    asyncio.run(through_the_service(dsn, args.trials))
    probability_cost()
    print(f"\nCPU time {time.process_time() - start:.1f} s")


if __name__ == "__main__":
    main()
