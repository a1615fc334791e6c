"""A large fresh GROUP BY on the wide cube, then the 20-group one: CPU and peak memory each.

Run ``OPENBLAS_NUM_THREADS=1 .venv/bin/python -m bench.wide_group_by_bench`` (``--m`` history
size, ``--rounds`` of the pair). The engine is loaded with ``m`` answers as
:mod:`bench.engine_sql_bench` draws them on its wide cube; each round then answers
``SELECT workclass, marital_status, relationship, COUNT(*) ... WHERE age BETWEEN ...`` (a
different age range each round: hundreds of groups, all fresh) and the 20-group
``GROUP BY race, sex, income`` at a tighter accuracy each round, so that it measures again on a
history that has just grown by the large one. Printed: CPU seconds of each statement (engine
only, the stand-in for the database left out) and the process's peak RSS after it.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time

from bench.engine_sql_bench import (
    GROUP_BY_20,
    Statements,
    _histogram,
    _history,
    cubes,
    requests_of,
    restarted,
)
from sqlmap.translate import Translator

AGES = ((25, 34), (35, 44), (45, 54), (55, 64))
WIDE_GROUP_BY = (
    "SELECT workclass, marital_status, relationship, COUNT(*) FROM adult "
    "WHERE age BETWEEN {} AND {} GROUP BY workclass, marital_status, relationship "
    "WITH ACCURACY 100"
)


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--m", type=int, default=1000, help="history size")
    parser.add_argument("--rounds", type=int, default=3, help="pairs of statements (<= 4)")
    args = parser.parse_args()
    seed = 7
    cube = cubes()["wide"]
    translator = Translator([cube])
    statements = Statements(cube, seed)
    pool = [statements.sql() for _ in range(max(50, min(args.m // 5, 2000)))]
    x = _histogram(cube, seed)
    history = _history(translator, pool, args.m, x, seed + 1)
    start = time.process_time()
    engine = restarted(cube, history, seed)
    size, distinct, rank = engine.history_shape
    print(
        f"loaded m = {size:,} ({distinct:,} distinct, rank {rank}) in "
        f"{time.process_time() - start:.2f} s CPU, peak RSS {_peak_mb():.0f} MB"
    )
    print("| statement | groups | sources | CPU s | peak RSS MB | rank after |")
    print("|---|---|---|---|---|---|")
    accuracies = (60, 40, 30, 20)
    for (low, high), eps in list(zip(AGES, accuracies))[: args.rounds]:
        for label, sql in (
            (f"wide GROUP BY, age {low}-{high}", WIDE_GROUP_BY.format(low, high)),
            (f"GROUP BY race, sex, income ±{eps}", f"{GROUP_BY_20} WITH ACCURACY {eps}"),
        ):
            requests = requests_of(translator, sql)
            plan_start = time.process_time()
            plan = engine.plan(requests)
            cpu = time.process_time() - plan_start
            truths = [q.evaluate(x) for q in plan.measurements]  # the database's part
            record_start = time.process_time()
            replies = engine.execute(plan, truths)
            cpu += time.process_time() - record_start
            sources = ", ".join(
                f"{source} {count}"
                for source in ("history", "combined", "fresh")
                if (count := sum(r.source == source for r in replies))
            )
            print(
                f"| {label} | {len(requests)} | {sources} | {cpu:.2f} | {_peak_mb():.0f} | "
                f"{engine.history_shape[2]} |",
                flush=True,
            )


if __name__ == "__main__":
    sys.exit(main())
