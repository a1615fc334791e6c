"""Run the whole evaluation and write its tables and plots.

    uv run python -m bench.evaluation [--quick] [--jobs N] [--no-wire] [--out DIR]

Settings run in ``--jobs`` worker processes (default 2), each with one BLAS thread.

Writes ``summary.md``, ``summary.csv`` and five PNGs to ``docs/evaluation`` (or ``--out``);
docs/benchmarks.md ("Evaluation") discusses a full run's figures.
"""

from __future__ import annotations

import os

# One BLAS thread per process: the matrices are small, and threads only contend on 2 cores.
for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import argparse  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from concurrent.futures import ProcessPoolExecutor  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from bench.evaluation import report  # noqa: E402
from bench.evaluation.run import (  # noqa: E402
    Setting,
    adult_statements,
    long_replications,
    metrics,
    replications,
    run_setting,
    settings,
)
from bench.evaluation.systems import SYSTEMS  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "evaluation"  # committed: docs/benchmarks.md shows these
ONE_D = ("NETTRACE", "SEARCHLOGS")


#: One unit of work: a setting and the systems to run on it.
Task = tuple[Setting, tuple[str, ...]]


def _task(task: Task) -> report.Result:
    setting, keys = task
    return setting, run_setting(setting, keys, log=lambda line: print(line, flush=True))


def _run_all(tasks: Sequence[Task], jobs: int) -> list[report.Result]:
    # the slowest first, so that two workers finish together
    order = sorted(range(len(tasks)), key=lambda i: _cost(tasks[i]), reverse=True)
    if jobs <= 1:
        done = {i: _task(tasks[i]) for i in order}
    else:
        with ProcessPoolExecutor(jobs) as pool:
            futures = {i: pool.submit(_task, tasks[i]) for i in order}
            done = {i: f.result() for i, f in futures.items()}
    return [done[i] for i in range(len(tasks))]


def _cost(task: Task) -> float:
    setting, keys = task
    weight = {"ADULT-range": 4.0, "ADULT-groupby": 6.0}.get(setting.dataset, 1.0)
    tree = 2.0 if setting.tree is not None else 1.0
    return setting.queries * weight * tree * (1.0 if "greedy" in keys else 0.1)


def _coverage(results: Sequence[report.Result]) -> list[str]:
    """R_i pooled over the replications, with the replications' own standard error."""
    lines = [
        "| setting | system | answered | pooled R_i | replications' mean R_i +- SE | "
        "floor (1-delta - 3 SE) | ok | design effect |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for kind in ("unbounded", "bounded"):
        chosen = [(s, t) for s, t in results if s.kind == kind]
        if not chosen:
            continue
        delta = chosen[0][0].delta
        for key in SYSTEMS:
            per = [metrics(t[key], s.delta) for s, t in chosen]
            answered = sum(m["answered"] for m in per)
            covered = sum(m["answered"] * m["R_i"] for m in per if m["answered"])
            values = np.array([m["R_i"] for m in per if m["answered"]])
            if answered == 0 or values.size < 2:
                continue
            se = float(values.std(ddof=1) / math.sqrt(values.size))
            pooled = covered / answered
            floor = (1 - delta) - 3 * se
            # how much more R_i varies between replications than if answers were independent
            binomial = np.mean([m["R_i"] * (1 - m["R_i"]) / m["answered"] for m in per])
            design = float(values.var(ddof=1) / binomial) if binomial > 0 else math.nan
            lines.append(
                f"| {kind} ({len(chosen)} x {chosen[0][0].queries} queries) | {SYSTEMS[key]} | "
                f"{int(answered)} | {pooled:.3f} | {values.mean():.3f} +- {se:.3f} | "
                f"{floor:.3f} | {'yes' if pooled >= floor else '**no**'} | {design:.1f} |"
            )
    return lines


def _long_coverage(results: Sequence[report.Result]) -> list[str]:
    """dpproxy alone, replications of the full-length bounded setting: coverage by source."""
    if not results:
        return []
    traces = [t["dpproxy"] for _, t in results]
    setting = results[0][0]
    per = np.array([metrics(t, setting.delta)["R_i"] for t in traces])
    se = float(per.std(ddof=1) / math.sqrt(per.size))
    answered = sum(metrics(t, setting.delta)["answered"] for t in traces)
    binomial = math.sqrt(setting.delta * (1 - setting.delta) / (answered / per.size))
    lines = [
        f"{per.size} replications of {setting.label}, {setting.queries} queries each "
        f"(NETTRACE domain; the data do not matter): per-stream R_i has mean {per.mean():.3f}, "
        f"standard deviation {per.std(ddof=1):.3f} (a binomial proportion over as many "
        f"independent answers would have {binomial:.3f}) and minimum {per.min():.3f}; "
        f"the mean is {per.mean():.3f} +- {se:.3f}.",
        "",
        "| source | answers | share holding the truth |",
        "|---|---|---|",
    ]
    for source in ("history", "fresh", "combined"):
        held = total = 0
        for t in traces:
            truth, low, high = np.array(t.truth), np.array(t.low), np.array(t.high)
            chosen = np.array(t.source) == source
            held += int(np.sum((low <= truth) & (truth <= high) & chosen))
            total += int(chosen.sum())
        if total:
            lines.append(f"| {source} | {total} | {held / total:.4f} |")
    return lines


def _acceptance(results: Sequence[report.Result]) -> list[str]:
    """The issue's R_a targets in the bounded setting, per data set."""
    lines = [
        "| data | dpproxy R_a | improved baseline R_a | ratio (>= 2?) | best paper method R_a | "
        "dpproxy >= every paper method? |",
        "|---|---|---|---|---|---|",
    ]
    for setting, traces in results:
        if setting.kind != "bounded":
            continue
        ra = {k: metrics(t, setting.delta)["R_a"] for k, t in traces.items()}
        best = max(("greedy", "blue_pc"), key=lambda k: ra[k])
        ratio = ra["dpproxy"] / ra["improved"] if ra["improved"] else math.inf
        lines.append(
            f"| {setting.dataset} | {ra['dpproxy']:.3f} | {ra['improved']:.3f} | {ratio:.2f} "
            f"({'yes' if ratio >= 2 else '**no**'}) | {ra[best]:.3f} ({SYSTEMS[best]}) | "
            f"{'yes' if ra['dpproxy'] >= max(ra['greedy'], ra['blue_pc']) else '**no**'} |"
        )
    return lines


def _wire(quick: bool, log: list[str]) -> list[str]:
    from bench.evaluation.run import SEEDS, Setting
    from bench.evaluation.wire import run_wire

    count = 40 if quick else 160
    ranges = adult_statements(Setting("bounded", "ADULT-range", 1.0, (1.0, 1000.0), queries=count))
    groups = adult_statements(
        Setting("bounded", "ADULT-groupby", 1.0, (1.0, 1000.0), queries=count // 3)
    )
    statements = []
    for i in range(count // 3):  # three range counts, then a GROUP BY
        statements += ranges[3 * i : 3 * i + 3] + [groups[i]]
    start = time.perf_counter()
    run = run_wire(statements, SEEDS["ADULT-range"] + 1000)
    log.append(f"wire run: {time.perf_counter() - start:.0f} s")
    wire, local = metrics(run.wire, 0.2), metrics(run.in_process, 0.2)
    lines = [
        f"{run.statements} Adult statements (3 range counts, then a GROUP BY, repeated), "
        f"{int(wire['values'])} values, total budget 1, 2eps~U[1,1000], confidence 0.8.",
        "",
        f"- histogram from PostgreSQL (dpproxy's canonical SQL) equals the Python binning: "
        f"{'yes' if run.histogram_matches else '**no**'}",
        f"- identical decisions (source and charged budget, value by value): "
        f"{run.same_decisions} of {int(wire['values'])}"
        + (
            f"; first differences: {run.different_decisions[:3]}" if run.different_decisions else ""
        ),
        "",
        "| run | R_a | R_i (3-SE floor) | E | history / fresh / combined | ms / statement |",
        "|---|---|---|---|---|---|",
    ]
    for name, m in (("over the wire (psycopg)", wire), ("in process (engine)", local)):
        lines.append(
            f"| {name} | {m['R_a']:.3f} | {m['R_i']:.3f} ({m['R_i_floor']:.3f}) | {m['E']:.3f} | "
            f"{int(m['history'])} / {int(m['fresh'])} / {int(m['combined'])} | "
            f"{m['latency_ms']:.1f} |"
        )
    return lines


def _write(
    out: Path,
    results: list[report.Result],
    coverage: list[report.Result],
    long: list[report.Result],
    wire: list[str],
    header: list[str],
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    report.write_csv(results + coverage + long, out / "summary.csv")
    md = [*header, ""]
    for kind, title in (("unbounded", "Unbounded"), ("bounded", "Bounded")):
        for setting, traces in results:
            if setting.kind == kind:
                md += [f"### {title}: {setting.dataset}, {setting.label}", ""]
                md += report.table(setting, traces) + [""]
    md += ["### R_a is at least 2x the improved baseline's, and at least every paper method's", ""]
    md += _acceptance(results) + [""]
    for kind, parameter, title in (
        ("budget", "total budget", "Impact of the total budget (Fig. 9), 2eps~U[1,1000]"),
        ("eps", "upper end of 2eps", "Impact of the accuracy range (Fig. 10), total budget 1"),
    ):
        sweep = [r for r in results if r[0].dataset in ONE_D and r[0].kind in (kind, "bounded")]
        sweep.sort(key=lambda r: (r[0].dataset, report._parameter(r[0], parameter)))
        for metric in ("R_a", "R_i", "E"):
            md += [f"### {title}: {metric}", ""] + report.sweep_table(sweep, metric, parameter)
            md += [""]
        report.plot_sweep(sweep, parameter, out / f"{kind}.png", title)
    md += ["### Coverage over independent replications", ""] + _coverage(coverage) + [""]
    md += ["### dpproxy's coverage over replications of the whole bounded setting", ""]
    md += _long_coverage(long) + [""]
    if wire:
        md += ["### End to end: the real proxy over the wire", ""] + wire + [""]
    (out / "summary.md").write_text("\n".join(md) + "\n")
    for kind in ("unbounded", "bounded"):
        chosen = [r for r in results if r[0].kind == kind and r[0].dataset in ONE_D]
        report.plot_streams(chosen, out / f"{kind}.png", f"{kind.capitalize()} setting")
    adult = [r for r in results if r[0].dataset.startswith("ADULT")]
    report.plot_streams(adult, out / "adult.png", "Adult cube, bounded (total budget 1)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: short streams")
    parser.add_argument(
        "--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes (default 2)"
    )
    parser.add_argument("--no-wire", action="store_true", help="skip the run over the wire")
    parser.add_argument("--out", type=Path, default=OUT, help=f"results folder (default {OUT})")
    args = parser.parse_args()
    start = time.perf_counter()
    log: list[str] = []
    # first: the server and the in-process replay should run the same engine code
    wire = [] if args.no_wire else _wire(args.quick, log)
    every = tuple(SYSTEMS)
    main_tasks: list[Task] = [(s, every) for s in settings(args.quick)]
    coverage_tasks = [(s, every) for s in replications(args.quick)]
    long_tasks: list[Task] = [(s, ("dpproxy",)) for s in long_replications(args.quick)]
    everything = _run_all(main_tasks + coverage_tasks + long_tasks, args.jobs)
    results = everything[: len(main_tasks)]
    coverage = everything[len(main_tasks) : len(main_tasks) + len(coverage_tasks)]
    long = everything[len(main_tasks) + len(coverage_tasks) :]
    elapsed = time.perf_counter() - start
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    shown = [a for a in sys.argv[1:] if a not in ("--out", str(args.out))]  # not where it wrote
    command = " ".join(["uv run python -m bench.evaluation", *shown])
    header = [
        "## Evaluation results",
        "",
        f"`{command}`: {elapsed / 60:.1f} min on {platform.node()} ({os.cpu_count()} CPUs, "
        f"{platform.python_version()}, numpy {np.__version__}), {time.strftime('%Y-%m-%d %H:%M')}, "
        f"commit {commit} (with the working tree's changes), {args.jobs} job(s).",
        *log,
    ]
    _write(args.out, results, coverage, long, wire, header)
    print(f"done in {elapsed / 60:.1f} min; results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
