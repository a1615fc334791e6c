"""The first GROUP BY and single values, planned again and again on the SQL bench's engine.

Run ``OPENBLAS_NUM_THREADS=1 uv run python -m bench.group_by_bench`` (``--m``, ``--runs``;
``--profile`` prints a cProfile of the GROUP BY's plans instead). It builds the engine of
:mod:`bench.engine_sql_bench` (the demo cube, ``m`` answers, the same 200-statement stream),
then plans ``GROUP_BY_20`` (``--groups 160``: one of 160 groups) at accuracy 500
(``--accuracy 5``: most of the 160 groups buy combined answers at m = 100,000) ``--runs`` times
as if for the first time (the history's cached solutions and the group vectors'
coordinates dropped before each) and the single-value statements of the pool likewise: CPU
medians of ``PrivacyEngine.plan``, steadier than the bench's one first run on a busy machine,
and the process's peak RSS.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import resource
import statistics
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
from proxy.engine import QueryRequest
from sqlmap.translate import Translator

# the GROUP BYs planned (``--groups``), by their number of groups
GROUP_BYS = {
    20: GROUP_BY_20,
    160: "SELECT education, race, sex, COUNT(*) FROM adult GROUP BY education, race, sex",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--m", type=int, default=10_000, help="history rows")
    parser.add_argument("--runs", type=int, default=15, help="plans of the GROUP BY")
    parser.add_argument("--profile", action="store_true", help="cProfile the GROUP BY's plans")
    parser.add_argument(
        "--groups",
        type=int,
        choices=sorted(GROUP_BYS),
        default=20,
        help="the GROUP BY planned: race, sex, income (20) or education, race, sex (160)",
    )
    parser.add_argument(
        "--accuracy",
        type=float,
        default=500.0,
        help="the half-width asked of the GROUP BY (tighter ones buy combined answers)",
    )
    args = parser.parse_args()
    cube, seed = cubes()["demo"], 7
    translator = Translator([cube])
    statements = Statements(cube, seed)
    pool = [statements.sql() for _ in range(max(50, min(args.m // 5, 2_000)))]
    x = _histogram(cube, seed)
    engine = restarted(cube, _history(translator, pool, args.m, x, seed + 1), seed)

    def measure(queries: object) -> list[float]:
        return [q.evaluate(x) for q in queries]  # type: ignore[attr-defined]

    rng = random.Random(seed + 2)  # the bench's stream, so the history is the bench's
    engine.answer(requests_of(translator, pool[0]), measure)
    for _ in range(200):
        sql = rng.choice(pool) if rng.random() < 0.5 else statements.sql()
        engine.answer(requests_of(translator, sql), measure)
    group_by = requests_of(translator, f"{GROUP_BYS[args.groups]} WITH ACCURACY {args.accuracy:g}")
    singles = [r for r in (requests_of(translator, sql) for sql in pool[:200]) if len(r) == 1]
    index = engine._index  # the caches a first plan finds empty
    keys = [r.query.without_offset().key for r in group_by]

    def first_plan(batch: list[QueryRequest]) -> float:
        index._solutions.clear()
        for key in keys:
            index._memo.pop(key, None)
        start = time.process_time()
        engine.plan(batch)
        return 1e3 * (time.process_time() - start)

    for _ in range(3):
        first_plan(group_by)
    if args.profile:
        profile = cProfile.Profile(time.process_time)
        profile.enable()
        for _ in range(args.runs):
            first_plan(group_by)
        profile.disable()
        pstats.Stats(profile).sort_stats("cumulative").print_stats(40)
        return
    group_ms = [first_plan(group_by) for _ in range(args.runs)]
    single_ms = [first_plan(r) for r in singles for _ in range(2)]
    _, distinct, rank = engine.history_shape
    print(
        f"m {args.m:,} ({distinct:,} vectors, rank {rank}): GROUP BY {args.groups} groups "
        "first plan "
        f"median {statistics.median(group_ms):.1f} ms CPU (min {min(group_ms):.1f}, "
        f"{len(group_ms)} runs); single value median {statistics.median(single_ms):.2f} ms "
        f"({len(single_ms)} plans); peak RSS {_peak_rss_mb():.0f} MB"
    )


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


if __name__ == "__main__":
    sys.exit(main())
