"""Range and GROUP BY workloads on the Adult demo cube, as SQL, and their compact domain.

Both workloads are SQL statements with ``WITH ACCURACY eps CONFIDENCE 1 - delta``, translated
by :class:`sqlmap.translate.Translator` over the cube of ``config.yaml`` (11,520 cells):

* range: ``COUNT(*)`` over an age range ``[lo, hi)`` on the cube's age edges (21 ranges),
  with no further condition or one ``sex``, ``income`` or ``race`` value (10 choices);
* GROUP BY: ``COUNT(*)`` by ``sex``, ``income`` or ``education`` (2-16 groups), over all rows
  or an age range (22 choices).

Each statement also selects ``DP_INTERVAL_LOW/HIGH`` so that the wire run reads the intervals
from the result. dpproxy answers over the full cube. The baselines, being dense, answer over the
*compact* domain: cells that every query of the workload weighs alike are merged into one
block. That changes nothing they compute (each query is constant on a block, so ``t H = q``,
the estimates and every cell's privacy cost are the same), it only makes their matrices small.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from bench.evaluation.workload import Item
from proxy.config import load_config
from proxy.demo import ADULT_COLUMNS, adult_rows
from proxy.engine import QueryRequest
from sqlmap.cube import BinKind, CategoricalDimension, Cube, Dimension
from sqlmap.translate import Translator
from sqlmap.vector import LinearQuery

__all__ = [
    "AdultStatement",
    "adult_cube",
    "adult_histogram",
    "range_workload",
    "group_by_workload",
    "translate",
    "Compaction",
]

ROOT = Path(__file__).resolve().parents[2]
AGE_EDGES = (17, 25, 35, 45, 55, 65, 91)
FILTERS = (
    ("sex", ("Male", "Female")),
    ("income", ("<=50K", ">50K")),
    ("race", ("White", "Black", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other")),
)
GROUPS = ("sex", "income", "education")


@dataclass(frozen=True, slots=True)
class AdultStatement:
    """A DP statement and the plain SQL whose result is its truth (as the superuser)."""

    sql: str
    truth_sql: str
    group: str | None


def adult_cube() -> Cube:
    """The Adult cube that ``config.yaml`` declares."""
    (cube,) = load_config(ROOT / "config.yaml").cubes
    return cube


def adult_histogram(cube: Cube) -> npt.NDArray[np.int64]:
    """Cell counts of the shipped Adult rows, binned in Python (closed, non-null cube only).

    The wire run checks it against the histogram PostgreSQL computes with dpproxy's SQL.
    """
    position = {name: i for i, (name, _) in enumerate(ADULT_COLUMNS)}
    strides = np.cumprod((cube.shape[1:] + (1,))[::-1])[::-1]
    x = np.zeros(cube.n_cells, dtype=np.int64)
    for row in adult_rows():
        cell = 0
        for dim, stride in zip(cube.dimensions, strides):
            cell += _bin(dim, row[position[dim.name]]) * int(stride)
        x[cell] += 1
    return x


def _bin(dim: Dimension, raw: str | None) -> int:
    if raw is None:
        raise ValueError(f"NULL in {dim.name}: the cube is declared non-null")
    if isinstance(dim, CategoricalDimension):
        return [b.value for b in dim.bins if b.kind is BinKind.VALUE].index(raw)
    value = float(raw)
    for i, b in enumerate(dim.bins):
        if b.kind is BinKind.RANGE and b.lo <= value < b.hi:
            return i
    raise ValueError(f"{raw} is outside the closed dimension")


def _accuracy(rng: np.random.Generator, two_eps: tuple[float, float], delta: float) -> str:
    eps = float(rng.uniform(*two_eps)) / 2
    return f"WITH ACCURACY {eps:.2f} CONFIDENCE {1 - delta:g}"


def _age_range(rng: np.random.Generator) -> tuple[int, int]:
    lo, hi = sorted(rng.choice(len(AGE_EDGES), size=2, replace=False).tolist())
    return AGE_EDGES[lo], AGE_EDGES[hi]


def range_workload(
    count: int, two_eps: tuple[float, float], delta: float, seed: int
) -> list[AdultStatement]:
    """``count`` range-count statements (uniform over 21 ranges x 10 conditions)."""
    rng = np.random.default_rng(seed)
    conditions = [""] + [f" AND {d} = '{v}'" for d, vs in FILTERS for v in vs]
    out = []
    for _ in range(count):
        lo, hi = _age_range(rng)
        where = f" WHERE age >= {lo} AND age < {hi}{conditions[int(rng.integers(len(conditions)))]}"
        out.append(
            AdultStatement(
                "SELECT COUNT(*), DP_INTERVAL_LOW(COUNT(*)), DP_INTERVAL_HIGH(COUNT(*)) "
                f"FROM adult{where} {_accuracy(rng, two_eps, delta)}",
                f"SELECT COUNT(*) FROM adult{where}",
                None,
            )
        )
    return out


def group_by_workload(
    count: int, two_eps: tuple[float, float], delta: float, seed: int
) -> list[AdultStatement]:
    """``count`` GROUP BY statements (3 grouping columns x 22 row sets)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        group = GROUPS[int(rng.integers(len(GROUPS)))]
        where = ""
        if rng.random() < 21 / 22:
            lo, hi = _age_range(rng)
            where = f" WHERE age >= {lo} AND age < {hi}"
        out.append(
            AdultStatement(
                f"SELECT {group}, COUNT(*), DP_INTERVAL_LOW(COUNT(*)), DP_INTERVAL_HIGH(COUNT(*)) "
                f"FROM adult{where} GROUP BY {group} {_accuracy(rng, two_eps, delta)}",
                f"SELECT {group}, COUNT(*) FROM adult{where} GROUP BY {group}",
                group,
            )
        )
    return out


def translate(cube: Cube, statements: Iterable[AdultStatement]) -> list[Item]:
    """The engine's requests for each statement, exactly as the proxy would form them."""
    translator = Translator([cube])
    items = []
    for statement in statements:
        spec = translator.translate(statement.sql)
        if spec.accuracy is None:
            raise ValueError(f"no accuracy in {statement.sql}")
        accuracy = spec.accuracy
        items.append(Item(tuple(QueryRequest(q, accuracy) for q in spec.queries), statement.sql))
    return items


class Compaction:
    """Merge cells that every query of a workload weighs alike into blocks.

    >>> queries = [LinearQuery.from_dense([1, 1, 0, 0]), LinearQuery.from_dense([0, 1, 1, 0])]
    >>> c = Compaction(4, queries)
    >>> c.blocks, c.query(queries[1]).to_dense().tolist()
    (4, [0.0, 1.0, 0.0, 1.0])
    >>> c.histogram(np.array([5, 6, 7, 8])).tolist()
    [8, 7, 5, 6]
    """

    def __init__(self, n: int, queries: Iterable[LinearQuery]) -> None:
        labels = np.zeros(n, dtype=np.int64)
        seen: set[bytes] = set()
        for q in queries:
            key = q.cells.tobytes() + q.weights.tobytes()
            if key in seen:
                continue
            seen.add(key)
            _, inverse = np.unique(np.stack([labels, q.to_dense()]), axis=1, return_inverse=True)
            labels = np.asarray(inverse, dtype=np.int64).ravel()
        self.labels = labels
        self.blocks = int(labels.max()) + 1

    def query(self, q: LinearQuery) -> LinearQuery:
        """``q`` over the blocks (it weighs every cell of a block alike)."""
        weights = np.zeros(self.blocks)
        weights[self.labels[q.cells]] = q.weights
        return LinearQuery.from_dense(weights, q.offset)

    def histogram(self, x: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Block counts."""
        return np.bincount(self.labels, weights=x, minlength=self.blocks).astype(np.int64)

    def items(self, items: Sequence[Item]) -> list[Item]:
        """A stream over the blocks."""
        return [
            Item(
                tuple(QueryRequest(self.query(r.query), r.accuracy) for r in item.requests),
                item.sql,
            )
            for item in items
        ]
