"""The papers' query workload, the DPBench 1-D data and the given hierarchical history.

Workload (online paper sec. 5.1, eqs. 50-51; second paper sec. 6.4, eqs. 37-38): a query is
``n_t ~ U{1..10}`` independent multinomial trials over the cells, cell ``j`` (1-based) drawn with
probability proportional to ``P_j = 0.9 * 10^-floor((j - 1) / 10)`` (the "regions of
interest": the first ten cells take 90% of the draws, the next ten 9%, ...). The query vector
holds the trial counts, so its sensitivity is the largest count. Each query asks for a
half-width ``eps`` with ``2 eps ~ U[lo, hi]`` at confidence ``1 - delta``.

Data: NETTRACE and SEARCHLOGS from DPBench (``../shared/data/dpbench-1d``, 4,096 bins each),
coarsened by summing blocks of adjacent bins to :data:`DOMAIN` cells.

History for the unbounded setting: a hierarchical partitioning tree (Hay et al. 2010, the
papers' [17]/[13]): a binary tree over the cells, root first then level by level, every node a
range count measured with ``budget / levels`` (so every cell spends ``budget``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np
import numpy.typing as npt

from proxy.engine import AccuracyRequest, HistoryEntry, QueryRequest
from sqlmap.vector import LinearQuery

__all__ = [
    "DATA_DIR",
    "DATASETS",
    "DOMAIN",
    "TREE_STEP",
    "Item",
    "MultinomialQueries",
    "region_of_interest_law",
    "paper_stream",
    "load_histogram",
    "tree_history",
    "values",
]

ROOT = Path(__file__).resolve().parents[2]
#: Where the DPBench 1-D files live: ``$DPBENCH_1D_DIR``, else the repository's sibling
#: ``shared/data/dpbench-1d`` folder.
DATA_DIR = Path(os.environ.get("DPBENCH_1D_DIR") or ROOT.parent / "shared" / "data" / "dpbench-1d")
#: The two data sets of the papers' figures, by DPBench file.
DATASETS = {"NETTRACE": "NETTRACE.n4096.npy", "SEARCHLOGS": "SEARCHLOGS.n4096.npy"}
#: Cells of the 1-D domain: 4,096 bins coarsened by 16.
DOMAIN = 128
#: Lattice step of the tree's noisy answers (they are rounded to it; see :func:`tree_history`).
TREE_STEP = Fraction(1, 1024)


@dataclass(frozen=True, slots=True)
class Item:
    """One statement of a stream: one query, or the groups of a GROUP BY (answered as a batch).

    ``sql`` is the statement dpproxy would receive, when there is one.
    """

    requests: tuple[QueryRequest, ...]
    sql: str | None = None


def region_of_interest_law(n: int) -> npt.NDArray[np.float64]:
    """The papers' eq. (50), normalized over ``n`` cells.

    >>> law = region_of_interest_law(30)
    >>> round(float(law[:10].sum()), 6), round(float(law[10] / law[0]), 6)
    (0.900901, 0.1)
    """
    j = np.arange(1, n + 1)
    p = 0.9 * 10.0 ** (-np.floor((j - 1) / 10))
    return np.asarray(p / p.sum(), dtype=np.float64)


class MultinomialQueries:
    """Random count queries: ``n_t ~ U{1..10}`` multinomial trials over a cell law.

    The weights are the trial counts (eq. 51). Draws are inverse-CDF lookups of uniforms, which
    is the multinomial law; the engine benchmark uses the same sampler with a Zipf law.

    >>> queries = MultinomialQueries(region_of_interest_law(64), np.random.default_rng(1))
    >>> q = queries.query()
    >>> bool(1 <= q.weights.sum() <= 10 and q.sensitivity == q.weights.max())
    True
    """

    def __init__(self, probabilities: npt.ArrayLike, rng: np.random.Generator) -> None:
        self.cumulative = np.cumsum(np.asarray(probabilities, dtype=np.float64))
        self.n = self.cumulative.size
        self.rng = rng

    def query(self) -> LinearQuery:
        """One query vector."""
        draws = int(self.rng.integers(1, 11))
        cells = np.searchsorted(self.cumulative, self.rng.random(draws) * self.cumulative[-1])
        cells, counts = np.unique(np.minimum(cells, self.n - 1), return_counts=True)
        return LinearQuery(self.n, cells, counts.astype(np.float64))


def paper_stream(
    n: int, count: int, two_eps: tuple[float, float], delta: float, seed: int
) -> list[Item]:
    """``count`` queries of the papers' workload over ``n`` cells, each with its accuracy.

    >>> stream = paper_stream(64, 3, (50.0, 1000.0), 0.2, seed=1)
    >>> [round(i.requests[0].accuracy.confidence, 3) for i in stream]
    [0.8, 0.8, 0.8]
    >>> all(25 <= i.requests[0].accuracy.eps <= 500 for i in stream)
    True
    """
    rng = np.random.default_rng(seed)
    queries = MultinomialQueries(region_of_interest_law(n), rng)
    items = []
    for _ in range(count):
        query = queries.query()
        eps = float(rng.uniform(*two_eps)) / 2
        items.append(Item((QueryRequest(query, AccuracyRequest(eps, 1.0 - delta)),)))
    return items


def load_histogram(name: str, n: int = DOMAIN, data_dir: Path = DATA_DIR) -> npt.NDArray[np.int64]:
    """A DPBench 1-D histogram coarsened to ``n`` cells (sums of adjacent bins)."""
    raw = np.load(data_dir / DATASETS[name], allow_pickle=False)
    if raw.size % n:
        raise ValueError(f"{raw.size} bins cannot be coarsened to {n}")
    return np.asarray(raw.reshape(n, -1).sum(axis=1), dtype=np.int64)


def tree_history(
    x: npt.NDArray[np.int64], budget: Fraction, rng: np.random.Generator, table: str = "t"
) -> list[HistoryEntry]:
    """Noisy counts of every node of a binary tree over the cells, root first.

    Each of the ``log2(n) + 1`` levels gets ``budget / levels``; a node's answer is its count
    plus continuous Laplace noise rounded to :data:`TREE_STEP`. Rounding moves the noise by at
    most half a step, which is within the coupling dpproxy's bounds allow for lattice noise,
    and negligible (1/2048) for the systems that read it as continuous Laplace: every system
    gets these same values.

    >>> entries = tree_history(np.arange(4), Fraction(3, 10), np.random.default_rng(0))
    >>> [e.query.cells.tolist() for e in entries][:3], entries[0].budget
    ([[0, 1, 2, 3], [0, 1], [2, 3]], Fraction(1, 10))
    """
    n = x.size
    levels = int(math.log2(n)) + 1
    if 2 ** (levels - 1) != n:
        raise ValueError("the tree needs a power-of-two number of cells")
    alpha = budget / levels
    entries = []
    for level in range(levels):
        width = n >> level
        for start in range(0, n, width):
            cells = np.arange(start, start + width)
            noise = float(rng.laplace(0.0, 1.0 / float(alpha)))
            steps = round(noise / float(TREE_STEP))
            value = float(x[start : start + width].sum()) + steps * float(TREE_STEP)
            entries.append(
                HistoryEntry(table, LinearQuery(n, cells, np.ones(width)), alpha, TREE_STEP, value)
            )
    return entries


def values(items: Sequence[Item]) -> int:
    """The number of answers a stream asks for (GROUP BY statements ask for several)."""
    return sum(len(item.requests) for item in items)
