"""Tables (markdown, CSV) and plots (PNG) of an evaluation run."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from bench.evaluation.run import Setting, Trace, metrics
from bench.evaluation.systems import SYSTEMS

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["Result", "curves", "write_csv", "table", "plot_streams", "plot_sweep"]

#: One setting's traces, by system key.
Result = tuple[Setting, Mapping[str, Trace]]

_STYLE = {
    "fixed": ("tab:gray", ":"),
    "improved": ("tab:orange", "--"),
    "greedy": ("tab:green", "-."),
    "blue_pc": ("tab:blue", "-"),
    "ols": ("tab:purple", ":"),
    "dpproxy": ("tab:red", "-"),
}
_COLUMNS = (
    "dataset",
    "kind",
    "setting",
    "system",
    "values",
    "answered",
    "R_a",
    "R_i",
    "R_i_floor",
    "R_i_ok",
    "E",
    "alpha_bar",
    "latency_ms",
    "history",
    "fresh",
    "combined",
)


def curves(trace: Trace) -> dict[str, npt.NDArray[np.float64]]:
    """alpha_bar, R_a, R_i and E after each value of the stream (cumulative)."""
    answered = np.array(trace.answered, dtype=float)
    truth = np.array(trace.truth)
    estimate = np.nan_to_num(np.array(trace.estimate))
    covered = (np.array(trace.low) <= truth) & (truth <= np.array(trace.high))
    error = np.where(answered > 0, np.abs(estimate - truth) / np.array(trace.eps), 0.0)
    done = np.cumsum(answered)
    with np.errstate(invalid="ignore", divide="ignore"):
        return {
            "alpha_bar": np.array(trace.alpha_bar),
            "R_a": done / np.arange(1, done.size + 1),
            "R_i": np.cumsum(covered & (answered > 0)) / done,
            "E": np.cumsum(error) / done,
        }


def rows(results: Sequence[Result]) -> list[dict[str, object]]:
    """One flat row per setting and system."""
    out: list[dict[str, object]] = []
    for setting, traces in results:
        for key, trace in traces.items():
            m = metrics(trace, setting.delta)
            out.append(
                {
                    "dataset": setting.dataset,
                    "kind": setting.kind,
                    "setting": setting.label,
                    "system": SYSTEMS[key],
                    **m,
                }
            )
    return out


def write_csv(results: Sequence[Result], path: Path) -> None:
    """Every metric of every setting and system."""
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=_COLUMNS)
        writer.writeheader()
        for row in rows(results):
            writer.writerow(
                {k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()}
            )


def _fmt(value: float, digits: int = 3) -> str:
    return "n/a" if math.isnan(value) else f"{value:.{digits}f}"


def table(setting: Setting, traces: Mapping[str, Trace]) -> list[str]:
    """A markdown table of one setting: a row per system."""
    lines = [
        "| system | R_a | R_i (3-SE floor) | E | alpha_bar | ms / statement | history / fresh / "
        "combined |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, trace in traces.items():
        m = metrics(trace, setting.delta)
        flag = "" if m["R_i_ok"] else " **below**"
        lines.append(
            f"| {SYSTEMS[key]} | {_fmt(m['R_a'])} | {_fmt(m['R_i'])} ({_fmt(m['R_i_floor'])})"
            f"{flag} | {_fmt(m['E'])} | {_fmt(m['alpha_bar'])} | {_fmt(m['latency_ms'], 2)} | "
            f"{int(m['history'])} / {int(m['fresh'])} / {int(m['combined'])} |"
        )
    return lines


def sweep_table(results: Sequence[Result], metric: str, parameter: str) -> list[str]:
    """One metric against a swept parameter: a row per data set and value, a column per system."""
    keys = list(SYSTEMS)
    lines = [
        f"| data | {parameter} | " + " | ".join(SYSTEMS[k] for k in keys) + " |",
        "|---|---|" + "---|" * len(keys),
    ]
    for setting, traces in results:
        value = _parameter(setting, parameter)
        cells = [_fmt(metrics(traces[k], setting.delta)[metric]) for k in keys if k in traces]
        lines.append(f"| {setting.dataset} | {value:g} | " + " | ".join(cells) + " |")
    return lines


def _parameter(setting: Setting, parameter: str) -> float:
    if parameter == "total budget":
        return float(setting.total or math.inf)
    return setting.two_eps[1]


def _save(fig: Figure, path: Path) -> None:
    """A small PNG: 64 colours are plenty for line plots (about 4x smaller than RGBA)."""
    from PIL import Image

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80)
    buffer.seek(0)
    Image.open(buffer).convert("RGB").quantize(colors=64).save(path, optimize=True)


def plot_streams(results: Sequence[Result], path: Path, title: str) -> None:
    """alpha_bar, R_a, R_i and E against the number of values asked; a column per data set."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ("alpha_bar", "R_a", "R_i", "E")
    fig, axes = plt.subplots(
        len(names), len(results), figsize=(4.2 * len(results), 9), squeeze=False, sharex="col"
    )
    for col, (setting, traces) in enumerate(results):
        for key, trace in traces.items():
            color, style = _STYLE[key]
            lines = curves(trace)
            x = np.arange(1, len(trace.answered) + 1)
            for row, name in enumerate(names):
                axes[row][col].plot(x, lines[name], style, color=color, lw=1.2, label=SYSTEMS[key])
        axes[0][col].set_title(f"{setting.dataset}\n{setting.label}", fontsize=8)
        axes[2][col].axhline(1 - setting.delta, color="black", lw=0.6)
        axes[2][col].set_ylim(0.5, 1.0)
        axes[-1][col].set_xlabel("queries (values) asked")
        for row, name in enumerate(names):
            axes[row][col].set_ylabel(name)
            axes[row][col].tick_params(labelsize=7)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)


def plot_sweep(results: Sequence[Result], parameter: str, path: Path, title: str) -> None:
    """R_a, R_i and E against a swept parameter; a column per data set (Fig. 9-10)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = sorted({s.dataset for s, _ in results})
    names = ("R_a", "R_i", "E")
    fig, axes = plt.subplots(
        len(names), len(datasets), figsize=(4.2 * len(datasets), 7), squeeze=False
    )
    for col, dataset in enumerate(datasets):
        chosen = sorted(
            ((s, t) for s, t in results if s.dataset == dataset),
            key=lambda r: _parameter(r[0], parameter),
        )
        x = [_parameter(s, parameter) for s, _ in chosen]
        for key in SYSTEMS:
            color, style = _STYLE[key]
            for row, name in enumerate(names):
                y = [metrics(t[key], s.delta)[name] for s, t in chosen]
                axes[row][col].plot(x, y, style, marker="o", ms=3, color=color, label=SYSTEMS[key])
        axes[0][col].set_title(dataset, fontsize=9)
        axes[1][col].axhline(1 - chosen[0][0].delta, color="black", lw=0.6)
        axes[-1][col].set_xlabel(parameter)
        for row, name in enumerate(names):
            axes[row][col].set_ylabel(name)
            axes[row][col].tick_params(labelsize=7)
            if parameter == "total budget":
                axes[row][col].set_xscale("log", base=2)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
