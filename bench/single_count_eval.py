"""The single-count paper's comparison, with dpproxy's range-respecting estimates beside it.

Run ``uv run python bench/single_count_eval.py`` (``--quick`` for fewer trials). Prints two
markdown tables; the figures recorded in docs/benchmarks.md ("Single counts near their range")
come from this script.

Table 1 is the paper's setting: a table of ``N`` rows (100 or 1,000), each satisfying the
predicate with probability ``p = 0.3``, so the true count is Binomial(N, p); one Laplace
answer of scale ``1/epsilon``. Per epsilon it gives the mean absolute error of the raw (naive)
answer (the paper's ``1/epsilon``), of the paper's Bayes estimator (binomial prior, which needs
``p``), and of dpproxy's estimates, which need only the range ``[0, N]``: the posterior mode
(the answer moved into the range), mean and median under a flat prior on the range; the
fraction of trials where the paper's estimator beats the raw answer (its second metric); and
the probability that the raw answer leaves ``[0, N]``, from the paper's formula
``(e^{-a/b} + e^{(a - N)/b}) / 2`` averaged over the truths, beside the measured fraction.

Table 2 is the issue's case: fixed true counts at and near 0 (and at N) asked at +-50
(95%), where the range matters most and no prior fraction is known.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import time

import numpy as np

from proxy.engine.posterior import (
    Interval,
    binomial_posterior_mean,
    posterior_mean,
    posterior_median,
    posterior_mode,
)

FRACTION = 0.3  # the paper's predicate probability
EPSILONS = (0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def _out_of_range(truths: np.ndarray, scale: float, rows: int) -> float:
    """The paper's P_out(a) = (e^{-a/b} + e^{(a - N)/b}) / 2, averaged over the truths."""
    return float(np.mean((np.exp(-truths / scale) + np.exp((truths - rows) / scale)) / 2))


def _errors(truths: np.ndarray, answers: np.ndarray, scale: float, rows: int) -> dict[str, float]:
    feasible = Interval(0.0, float(rows))
    raw = np.abs(answers - truths)
    paper = np.array([binomial_posterior_mean(float(y), scale, rows, FRACTION) for y in answers])
    mode = np.array([posterior_mode(float(y), feasible) for y in answers])
    mean = np.array([posterior_mean([scale], float(y), feasible) for y in answers])
    median = np.array([posterior_median([scale], float(y), feasible) for y in answers])
    return {
        "raw": float(raw.mean()),
        "paper": float(np.abs(paper - truths).mean()),
        "mode": float(np.abs(mode - truths).mean()),
        "mean": float(np.abs(mean - truths).mean()),
        "median": float(np.abs(median - truths).mean()),
        "paper_better": float(np.mean(np.abs(paper - truths) < raw)),
        "out_measured": float(np.mean((answers < 0) | (answers > rows))),
    }


def papers_setting(trials: int, rng: np.random.Generator) -> None:
    print(f"#### The paper's setting: true count ~ Binomial(N, {FRACTION}), {trials:,} trials each")
    print()
    print(
        "| N | epsilon | raw (1/eps) | paper's Bayes | mode | flat mean | flat median "
        "| paper beats raw | P_out formula | P_out measured |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for rows in (100, 1000):
        for epsilon in EPSILONS:
            scale = 1.0 / epsilon
            truths = rng.binomial(rows, FRACTION, trials).astype(np.float64)
            answers = truths + rng.laplace(0.0, scale, trials)
            e = _errors(truths, answers, scale, rows)
            print(
                f"| {rows:,} | {epsilon:g} | {e['raw']:.2f} | {e['paper']:.2f} | {e['mode']:.2f} "
                f"| {e['mean']:.2f} | {e['median']:.2f} | {e['paper_better']:.3f} "
                f"| {_out_of_range(truths, scale, rows):.4f} | {e['out_measured']:.4f} |"
            )
    print()


def near_the_end(trials: int, rng: np.random.Generator) -> None:
    rows, half_width = 1000, 50.0
    scale = half_width / math.log(20)  # +-50 at 95%
    print(f"#### Fixed true counts, N = {rows:,}, asked at +-50 (95%), {trials:,} trials each")
    print()
    print("| true count | raw | mode | flat mean | flat median | raw < 0 or > N | P_out formula |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for truth in (0.0, 1.0, 2.0, 5.0, 25.0, 100.0, float(rows)):
        truths = np.full(trials, truth)
        answers = truths + rng.laplace(0.0, scale, trials)
        e = _errors(truths, answers, scale, rows)
        print(
            f"| {truth:g} | {e['raw']:.2f} | {e['mode']:.2f} | {e['mean']:.2f} "
            f"| {e['median']:.2f} | {e['out_measured']:.4f} "
            f"| {_out_of_range(truths, scale, rows):.4f} |"
        )
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2,000 trials per row")
    parser.add_argument("--seed", type=int, default=15)
    args = parser.parse_args()
    trials = 2000 if args.quick else 10_000
    rng = np.random.default_rng(args.seed)
    started = time.process_time()
    print(f"{platform.node()} {platform.processor() or platform.machine()}, load {os.getloadavg()}")
    print()
    papers_setting(trials, rng)
    near_the_end(trials, rng)
    print(f"CPU time {time.process_time() - started:.1f} s")


if __name__ == "__main__":
    main()
