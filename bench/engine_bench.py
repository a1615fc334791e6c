"""Benchmark of the privacy engine: decision latency vs history size, and tail-method accuracy.

Run ``uv run python bench/engine_bench.py`` (``--quick`` for a smaller run). Prints markdown
tables; the figures recorded in docs/benchmarks.md come from this script.

Decision latency. A history of ``m`` sparse rows over ``n`` cells is stored, an engine is built
from it, and a stream of new queries from the same generator is decided with
``PrivacyEngine.plan`` (estimability, BLUE, exact tails, minimal budget: everything but the
database round trip). Fresh measurements are executed, so the history grows during the stream
and its upkeep (bordering, refactorization) shows in the figures. Rows follow the papers'
generator (Sec. 6: 1-10 multinomial draws of cells, the weights are the draw counts) with cell
popularity Zipf(1.1) over a random permutation of the cells ("regions of interest"), or
uniform.

Tail methods. ``P(|sum b_k L_k| > x)`` by the exact method (checked against mpmath in the
tests), the papers' Monte Carlo (Alg. 1) and binned convolution (Alg. 2, "PC"), on scale sets of
10, 100 and 1,000 terms, at the exact 0.05 and 1e-6 quantiles.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.evaluation.workload import MultinomialQueries  # noqa: E402
from proxy.engine import (  # noqa: E402
    AccuracyRequest,
    HistoryEntry,
    PrivacyEngine,
    QueryRequest,
    SeededRandomSource,
)
from proxy.engine.tails import (  # noqa: E402
    EXACT,
    ConvolutionTail,
    MonteCarloTail,
    TailMethod,
    quantile,
)


class Workload(MultinomialQueries):
    """The papers' generator (1-10 multinomial draws), cell popularity Zipf over a permutation."""

    def __init__(self, n: int, zipf: float, seed: int) -> None:
        rng = np.random.default_rng(seed)
        popularity = 1.0 / np.arange(1, n + 1) ** zipf
        super().__init__(rng.permutation(popularity / popularity.sum()), rng)


def _percentiles(values_ms: list[float]) -> str:
    a = np.array(values_ms)
    return f"{np.percentile(a, 50):.2f} | {np.percentile(a, 95):.1f} | {a.max():.0f}"


def decision_latency(m: int, n: int, zipf: float, stream: int, seed: int = 1) -> str:
    """One table row: build a history of ``m`` rows, then decide ``stream`` new queries."""
    workload = Workload(n, zipf, seed)
    rng = np.random.default_rng(seed + 1)
    history = [
        HistoryEntry(
            "t",
            workload.query(),
            Fraction(int(rng.integers(10, 500)), 1000),
            Fraction(1, 1024),
            0.0,
        )
        for _ in range(m)
    ]
    start = time.perf_counter()
    engine = PrivacyEngine(
        "t", n, total_budget=Fraction(10**9), history=history, rng=SeededRandomSource(seed)
    )
    load_s = time.perf_counter() - start
    probe = QueryRequest(history[0].query, AccuracyRequest(50.0, 0.95))
    start = time.perf_counter()
    engine.plan([probe])  # the first solve factorizes the whole history
    factor_s = time.perf_counter() - start

    decide_ms: dict[str, list[float]] = {"history": [], "combined": [], "fresh": []}
    execute_ms = []
    for _ in range(stream):
        request = QueryRequest(
            workload.query(), AccuracyRequest(float(rng.uniform(20.0, 200.0)), 0.95)
        )
        start = time.perf_counter()
        plan = engine.plan([request])
        decide_ms[plan.decisions[0].source].append(1e3 * (time.perf_counter() - start))
        start = time.perf_counter()
        engine.execute(plan, [0.0] * len(plan.measurements))
        if plan.measurements:
            execute_ms.append(1e3 * (time.perf_counter() - start))
    everything = [t for times in decide_ms.values() for t in times]
    by_source = " | ".join(
        f"{len(times) * 100 // stream}%, {np.median(times):.2f}" if times else "0%"
        for times in decide_ms.values()
    )
    return (
        f"| {m:,} | {n:,} | {'Zipf ' + str(zipf) if zipf else 'uniform'} | {load_s:.2f} | "
        f"{factor_s:.2f} | {_percentiles(everything)} | {by_source} | "
        f"{np.percentile(execute_ms, 50) if execute_ms else 0:.1f} |"
    )


def _timed(method: TailMethod, scales: np.ndarray, x: float) -> tuple[float, float]:
    start = time.perf_counter()
    value = method.tail(scales, x)
    return value, 1e3 * (time.perf_counter() - start)


def tail_methods(sizes: list[int], mc_samples: int, seed: int = 2) -> list[str]:
    """Table rows: value, error against the exact method, and time, per method and set."""
    rng = np.random.default_rng(seed)
    methods: list[tuple[str, Callable[[], TailMethod]]] = [
        ("exact", lambda: EXACT),
        (f"MC, {mc_samples:,} samples", lambda: MonteCarloTail(rng, samples=mc_samples)),
        ("PC, unit bins, gamma 0.01", lambda: ConvolutionTail()),
        ("PC, 0.05 bins, gamma 1e-9", lambda: ConvolutionTail(gamma=1e-9, step=0.05)),
    ]
    rows = []
    for size in sizes:
        scales = rng.uniform(0.5, 20.0, size) / math.sqrt(size / 10)
        for delta in (0.05, 1e-6):
            x = quantile(EXACT, scales, delta)
            for name, make in methods:
                value, ms = _timed(make(), scales, x)
                rows.append(
                    f"| {size:,} | {delta:g} | {name} | {value:.3e} | "
                    f"{abs(value - delta) / delta:.1e} | {ms:.1f} |"
                )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller histories and samples")
    args = parser.parse_args()
    configs = (
        [(100, 256, 1.1), (1_000, 4_096, 1.1)]
        if args.quick
        else [
            (100, 256, 1.1),
            (1_000, 4_096, 1.1),
            (1_000, 4_096, 0.0),
            (3_000, 16_384, 1.1),
            (10_000, 65_536, 1.1),
            (10_000, 65_536, 0.0),
        ]
    )
    stream = 100 if args.quick else 400
    print("## Decision latency (PrivacyEngine.plan, one query per batch)\n")
    print(
        "| m | n | cells | load s | first solve s | decide p50 ms | p95 ms | max ms "
        "| history: share, p50 ms | combined | fresh | execute p50 ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for m, n, zipf in configs:
        print(decision_latency(m, n, zipf, stream), flush=True)
    print("\n## Tail methods at the exact quantile (error relative to the target tail)\n")
    print("| terms | target tail | method | tail found | rel. error | ms |")
    print("|---|---|---|---|---|---|")
    for row in tail_methods(
        [10, 100] if args.quick else [10, 100, 1_000],
        mc_samples=100_000 if args.quick else 1_000_000,
    ):
        print(row, flush=True)


if __name__ == "__main__":
    main()
