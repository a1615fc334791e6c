"""Budget that AVG and ratio queries on Adult need to meet their accuracy, per allocation.

Run ``uv run python bench/ratio_bench.py`` (``--quick`` for fewer replications). Prints a
markdown table; the figures in docs/benchmarks.md come from this script.

Every query is SQL on the demo cube (config.yaml, 11,520 cells), translated by the real
translator; the counts are the shipped Adult rows. Each allocation answers it on a fresh
engine (total budget 1, as the demo), over seeded replications, and the table gives the
budget spent on the most-charged cell (the ledger's charge, mean over replications), ``R_i``
(share of answered ratio intervals that hold the true ratio), and how many ratios were NULL or
wider than asked.

* **dpproxy**: :class:`~proxy.engine.ratio.RatioRounds` (probe the denominator, then the split
  with the least per-cell budget), all ratios of a statement together (joint allocation).
* **equal split**: the same rounds, but every part of the final round gets the same budget.
* **one by one**: dpproxy's split, each ratio its own statement, in order (later ones reuse
  earlier answers through the history): what the joint allocation saves.
* **SmartNoise-style**: noisy SUM (or COUNT) over noisy COUNT, the budget split evenly between
  them, no interval. Its budget is the least total (to 3 digits) at which the ratio lands
  within +-eps of the truth with the asked probability, found by simulating 4,000 draws
  *knowing the true counts*: what no analyst can know, so a lower bound for that approach
  (and it still returns no interval).

The paper's Example 1 (Huang, Han & Li) is reproduced on the same data: q1 = Male Black >50K
over Male >50K (+-0.05 at 95%), q2 = Male White >50K over Male >50K (+-0.1 at 90%).
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.evaluation.adult import adult_cube, adult_histogram  # noqa: E402
from proxy.engine import PrivacyEngine, SeededRandomSource  # noqa: E402
from proxy.engine.ratio import Ratio, RatioRounds  # noqa: E402
from proxy.errors import BudgetExhausted  # noqa: E402
from sqlmap.accuracy import AccuracyRequest  # noqa: E402
from sqlmap.cube import Cube  # noqa: E402
from sqlmap.translate import Translator  # noqa: E402

TOTAL = Fraction(1)
MALE_RICH = "COUNT(*) FILTER (WHERE sex = 'Male' AND income = '>50K')"
AGE = (
    "SUM(CASE WHEN age < 25 THEN 21 WHEN age < 35 THEN 30 WHEN age < 45 THEN 40 "
    "WHEN age < 55 THEN 50 WHEN age < 65 THEN 60 ELSE 75 END)"
)


@dataclass(frozen=True)
class Case:
    name: str
    statements: tuple[tuple[str, ...], ...]  # one statement: (select items, ...) per accuracy
    accuracies: tuple[AccuracyRequest, ...]
    group_by: str = ""


CASES = (
    Case(
        "paper Example 1: q1, q2 over Male >50K",
        (
            (
                "COUNT(*) FILTER (WHERE sex = 'Male' AND race = 'Black' AND income = '>50K') "
                f"/ {MALE_RICH}",
            ),
            (
                "COUNT(*) FILTER (WHERE sex = 'Male' AND race = 'White' AND income = '>50K') "
                f"/ {MALE_RICH}",
            ),
        ),
        (AccuracyRequest(0.05, 0.95), AccuracyRequest(0.1, 0.9)),
    ),
    Case(
        "% >50K, +-1 point",
        (("100.0 * COUNT(*) FILTER (WHERE income = '>50K') / COUNT(*)",),),
        (AccuracyRequest(1.0, 0.95),),
    ),
    Case(
        "mean age (bin midpoints), +-0.5 y",
        ((f"{AGE} / COUNT(*)",),),
        (AccuracyRequest(0.5, 0.95),),
    ),
    Case(
        "share >50K and mean age by sex",
        (
            ("COUNT(*) FILTER (WHERE income = '>50K') / COUNT(*)",),
            (f"{AGE} / COUNT(*)",),
        ),
        (AccuracyRequest(0.02, 0.95), AccuracyRequest(1.0, 0.95)),
        "sex",
    ),
    Case(
        "share >50K by race, +-0.05",
        (("COUNT(*) FILTER (WHERE income = '>50K') / COUNT(*)",),),
        (AccuracyRequest(0.05, 0.9),),
        "race",
    ),
)


def ratios_of(translator: Translator, case: Case) -> list[list[Ratio]]:
    """The case's ratios, one list per statement (per accuracy)."""
    out = []
    for items, accuracy in zip(case.statements, case.accuracies):
        keys = f"{case.group_by}, " if case.group_by else ""
        group = f" GROUP BY {case.group_by}" if case.group_by else ""
        spec = translator.translate(f"SELECT {keys}{', '.join(items)} FROM adult{group}")
        out.append(
            [Ratio(n, d, accuracy) for row in spec.rows for n, d in row.ratios if d.cells.size]
        )
    return out


@dataclass
class Tally:
    spent: list[float]
    covered: int = 0
    answered: int = 0
    nulls: int = 0
    wide: int = 0
    refused: int = 0


def run_rounds(
    statements: list[list[Ratio]], x: npt.NDArray[np.int64], seed: int, cube: Cube, how: str
) -> tuple[float, list[tuple[Ratio, object]]]:
    engine = PrivacyEngine("t", cube.n_cells, total_budget=TOTAL, rng=SeededRandomSource(seed))
    batches = (
        [[r for s in statements for r in s]]
        if how != "one by one"
        else [[r] for s in statements for r in s]
    )
    answered: list[tuple[Ratio, object]] = []
    for batch in batches:
        rounds = RatioRounds(batch, float(TOTAL), even=how == "equal split")
        while requests := rounds.requests():
            plan = engine.plan(requests)
            rounds.observe(engine.execute(plan, [m.evaluate(x) for m in plan.measurements]))
        answered.extend(zip(batch, rounds.answers()))
    return float(engine.budget.spent), answered


def smartnoise_budget(ratio: Ratio, x: npt.NDArray[np.int64], draws: int = 4000) -> float:
    """The least total budget (even split, oracle-calibrated) meeting the ratio's accuracy."""
    n, d = ratio.numerator.evaluate(x), ratio.denominator.evaluate(x)
    rng = np.random.default_rng(7)
    unit_n = rng.laplace(size=draws) * ratio.numerator.sensitivity
    unit_d = rng.laplace(size=draws) * ratio.denominator.sensitivity

    def meets(total: float) -> bool:
        scale = 2 / total  # each part gets total / 2
        with np.errstate(divide="ignore", invalid="ignore"):
            error = np.abs((n + unit_n * scale) / (d + unit_d * scale) - n / d)
        return bool(np.mean(error <= ratio.accuracy.eps) >= ratio.accuracy.confidence)

    low, high = 1e-6, 1e4
    while high / low > 1.001:
        middle = math.sqrt(low * high)
        low, high = (low, middle) if meets(middle) else (middle, high)
    return high


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="30 replications instead of 200")
    parser.add_argument("--replications", type=int, help="seeded replications per allocation")
    parser.add_argument("--cases", help="comma-separated indexes of the cases to run (from 0)")
    args = parser.parse_args()
    cases = [CASES[int(i)] for i in args.cases.split(",")] if args.cases else CASES
    replications = args.replications or (30 if args.quick else 200)
    cube = adult_cube()
    x = adult_histogram(cube)
    translator = Translator([cube])
    started = time.process_time()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; ")
    print(f"load: {os.getloadavg()[0]:.2f}; replications: {replications}; table total 1\n")
    print(
        "| query | allocation | budget spent (mean) | R_i | NULL | wider than asked |\n"
        "|---|---|---|---|---|---|"
    )
    for case in cases:
        statements = ratios_of(translator, case)
        for how in ("dpproxy", "equal split", "one by one"):
            if how == "one by one" and sum(len(s) for s in statements) == 1:
                continue
            tally = Tally([])
            for seed in range(replications):
                try:
                    spent, answered = run_rounds(statements, x, seed, cube, how)
                except BudgetExhausted:
                    tally.refused += 1
                    continue
                tally.spent.append(spent)
                for ratio, reply in answered:
                    if reply is None:
                        tally.nulls += 1
                        continue
                    truth = ratio.numerator.evaluate(x) / ratio.denominator.evaluate(x)
                    tally.answered += 1
                    tally.covered += reply.low <= truth <= reply.high  # type: ignore[attr-defined]
                    half = (reply.high - reply.low) / 2  # type: ignore[attr-defined]
                    tally.wide += half > ratio.accuracy.eps * (1 + 1e-9)
            mean = f"{np.mean(tally.spent):.4f}" if tally.spent else "refused"
            ri = f"{tally.covered / tally.answered:.3f}" if tally.answered else "-"
            refused = f" ({tally.refused} refused)" if tally.refused else ""
            print(
                f"| {case.name} | {how} | {mean}{refused} | {ri} | {tally.nulls} | {tally.wide} |"
            )
        # SmartNoise recomputes each ratio's parts: a shared denominator is paid per ratio
        per_ratio = [smartnoise_budget(r, x) for s in statements for r in s]
        by_cells: dict[bytes, float] = {}
        for ratio, budget in zip((r for s in statements for r in s), per_ratio):
            key = ratio.denominator.cells.tobytes()
            by_cells[key] = by_cells.get(key, 0.0) + budget
        print(
            f"| {case.name} | SmartNoise-style (oracle-calibrated, no interval) | "
            f"{max(by_cells.values()):.4f} | - | - | - |"
        )
    print(f"\nCPU time: {time.process_time() - started:.1f} s")


if __name__ == "__main__":
    main()
