"""The reader's SQL worked out cell by cell over the whole cube: the reference the product's
factored :func:`sqlmap.canonical.measurement_sql` must match (kept in tests, not in the product).

It enumerates every weighed cell (``q.cells``), so it only runs on cubes small enough to list.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from sqlmap.canonical import (
    MeasurementSql,
    _bin_case,
    _bins_predicate,
    _group_weights,
    _nulls_sql,
    _promised,
    _raw_key,
    clamped_sum_sql,
    quote_ident,
)
from sqlmap.cube import Cube
from sqlmap.vector import LinearQuery

Part = tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]


def _kinds(cube: Cube, query: LinearQuery) -> list[Part]:
    """A vector's weights per coordinate kind (the count, then each measure's sums), by cell."""
    n = cube.n_cells
    ends = np.searchsorted(query.cells, np.arange(len(cube.measures) + 2) * n)
    return [
        (query.cells[a:b] - k * n, query.weights[a:b])
        for k, (a, b) in enumerate(zip(ends[:-1], ends[1:]))
    ]


def cellwise_measurement_sql(cube: Cube, queries: Sequence[LinearQuery]) -> MeasurementSql:
    """:func:`sqlmap.canonical.measurement_sql` as it was, cell by cell over the cube."""
    if any(
        q.n_cells != cube.n_coordinates or q.measures != cube.measure_reach or q.offset
        for q in queries
    ):
        raise ValueError("measurements are offset-free vectors over this cube's coordinates")
    parts = [_kinds(cube, q) for q in queries]
    nonempty = [cells for kinds in parts for cells, _ in kinds if cells.size]
    if not nonempty:
        return MeasurementSql(cube, None, (), False, (), False, tuple(map(tuple, parts)))
    shape = cube.shape
    weighed = np.zeros(cube.n_cells, dtype=bool)
    # cells with equal weights in every query share an atom id (0: weighed by none); linear
    # time in the common cases (equal weights, disjoint supports), a sort otherwise
    atom = np.zeros(cube.n_cells, dtype=np.int64)
    next_id = 1
    for cells, weights in (part for kinds in parts for part in kinds):
        if not cells.size:
            continue
        weighed[cells] = True
        before = atom[cells]
        if weights.min() == weights.max() and before.min() == before.max():
            atom[cells] = next_id
            next_id += 1
            continue
        weight_ids = np.unique(weights, return_inverse=True)[1]
        distinct, inverse = np.unique(before * (cells.size + 1) + weight_ids, return_inverse=True)
        atom[cells] = next_id + inverse
        next_id += distinct.size

    # the hull: per dimension, the bins some weighed cell lies in; the atoms over it
    axes = range(len(shape))
    hull = [
        np.flatnonzero(weighed.reshape(shape).any(axis=tuple(e for e in axes if e != d)))
        for d in axes
    ]
    dense = atom.reshape(shape)
    if any(h.size < size for h, size in zip(hull, shape)):
        dense = dense[np.ix_(*hull)]
    varies = dense.min() != dense.max()  # else (a range count) no dimension is grouped
    grouped = [
        d
        for d in axes
        if varies and hull[d].size > 1 and not np.all(dense == dense.take([0], axis=d))
    ]
    restricted = [d for d, dim in enumerate(cube.dimensions) if hull[d].size < dim.size]

    strides = {d: math.prod(shape[e] for e in grouped if e > d) for d in grouped}
    columns, key_bins = [], []
    for d in grouped:
        dim = cube.dimensions[d]
        bins = _raw_key(dim)
        columns.append(f"{quote_ident(dim.name)}::text" if bins else f"({_bin_case(dim, 1)})")
        key_bins.append((strides[d], bins))
    where, inside = [], []
    for d in restricted:
        dim, chosen = cube.dimensions[d], {int(b) for b in hull[d]}
        if _promised(dim):
            # exclude only rows in declared bins outside the hull: violations get through
            outside = set(range(dim.size)) - chosen
            where.append(f"({_bins_predicate(dim, outside)}) IS NOT TRUE")
            if d not in grouped:
                inside.append(f"({_bins_predicate(dim, chosen)})")
        else:
            where.append(f"({_bins_predicate(dim, chosen)})")
    table = f"{quote_ident(cube.schema)}.{quote_ident(cube.table)}"
    counts = ["count(*) AS n"]
    if inside:
        counts.append(f"count(*) FILTER (WHERE {' AND '.join(inside)}) AS n_inside")
    kinds = tuple(k for k in range(1, 1 + len(cube.measures)) if any(p[k][0].size for p in parts))
    summed = [cube.measures[k - 1] for k in kinds]
    counts += [clamped_sum_sql(m) for m in summed]
    nulls = _nulls_sql(summed)
    if nulls is not None:
        counts.append(nulls)
    sql = f"SELECT {', '.join(columns + counts)} FROM {table}"
    if where:
        sql += " WHERE " + " AND ".join(where)
    if columns:
        sql += " GROUP BY " + ", ".join(str(k + 1) for k in range(len(columns)))

    group_of = np.zeros(shape, dtype=np.int64)
    for d in grouped:
        group_of += (np.arange(shape[d]) * strides[d]).reshape([-1 if e == d else 1 for e in axes])
    group_of = group_of.reshape(-1)
    n_groups = math.prod(shape[d] for d in grouped)
    per_group = tuple(
        tuple(_group_weights(cells, w, group_of, n_groups) for cells, w in by_kind)
        for by_kind in parts
    )
    return MeasurementSql(
        cube, sql, tuple(key_bins), bool(inside), kinds, nulls is not None, per_group
    )
