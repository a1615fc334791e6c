"""Coordinates for factored query vectors that keep inner products over cells, without cells.

A SQL query over a cube weighs cells through the few dimensions it names (a factored
:class:`~sqlmap.vector.LinearQuery`: a tensor over its ``axes``, constant along the others),
but covers millions of cells of a wide cube. Everything the span solver needs of a vector is
its inner products and distances over cells, so vectors are mapped by an isometry into a space
built from the tensors alone: the ANOVA decomposition. Every vector ``f`` over the cube is the
orthogonal sum of components ``f_S``, one per set ``S`` of dimensions, each depending on ``S``
only and averaging to zero along every dimension of ``S``; ``f_S`` comes from the core by
averaging over the core's dimensions outside ``S`` and centering along those in ``S``. A
component is repeated over the ``N / n_S`` cells that share its ``S``-coordinates, so
``||f||^2 = sum_S (N / n_S) ||f_S||^2``: scaled by ``sqrt(N / n_S)``, the components laid side
by side are coordinates in which norms and inner products equal those over cells.

Over a cube with measures a vector's coordinates are a tensor over ``(kind, *cube)``
(:mod:`sqlmap.vector`): coordinates of different kinds (the counts, each measure's sums) are
orthogonal, so each kind's slice of the core is decomposed on its own, in blocks ``(kind, S)``
(a count's vector has no coordinates in a measure's blocks).

A vector over dimensions ``A`` has ``prod_{d in A} (n_d + 1)`` such coordinates (a range count
over three dimensions of the wide cube: a few hundred, for the million cells it covers).
Coordinates are numbered as sets ``S`` are first met, in blocks of ``n_S``. A component that
is zero but comes out of the averaging as rounding (a sum of functions of one dimension each
has no interaction terms) is dropped below ``_CHOP`` of the core's largest weight, so that a
vector and its multiples have the same coordinates.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from sqlmap.vector import LinearQuery

__all__ = ["AnovaCoordinates"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

_CHOP = 1e-12


class AnovaCoordinates:
    """Isometric coordinates for factored vectors over a cube of ``shape`` (and its kinds).

    >>> space = AnovaCoordinates((2, 3))
    >>> a = LinearQuery.from_tensor((2, 3), np.array([[1.0], [0.0]]))
    >>> b = LinearQuery.from_tensor((2, 3), np.array([[1.0, 1.0, 0.0]]))
    >>> (ca, va), (cb, vb) = space.of(a), space.of(b)
    >>> round(float(va @ va), 12), float(a.to_dense() @ b.to_dense())  # ||a||^2: 3 cells
    (3.0, 2.0)
    >>> d = dict(zip(ca.tolist(), va.tolist()))
    >>> round(sum(d.get(c, 0.0) * v for c, v in zip(cb.tolist(), vb.tolist())), 12)
    2.0
    """

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = tuple(int(s) for s in shape)
        self.n_cells = math.prod(self.shape)
        self._blocks: dict[tuple[int, ...], int] = {}  # (kind, *S) -> its first coordinate
        self.size = 0  # coordinates numbered so far

    @classmethod
    def numbered(
        cls, shape: tuple[int, ...], blocks: list[tuple[tuple[int, ...], int]]
    ) -> AnovaCoordinates:
        """The space over ``shape`` with ``blocks`` numbered (another's :meth:`blocks`).

        Raises:
            ValueError: the blocks are not a numbering of this cube's (one after another, each
                ``(kind, *S)`` with ``prod_{d in S} n_d`` coordinates).
        """
        space = cls(shape)
        for key, first in blocks:
            kind, *dims = key
            if (
                first != space.size
                or kind < 0
                or key in space._blocks
                or dims != sorted(set(dims))
                or any(not 0 <= d < len(space.shape) for d in dims)
            ):
                raise ValueError(f"not a numbering of a cube of shape {shape}: block {key}")
            space._blocks[tuple(key)] = first
            space.size += math.prod(space.shape[d] for d in dims)
        return space

    def blocks(self) -> list[tuple[tuple[int, ...], int]]:
        """The blocks numbered so far: ``((kind, *S), first coordinate)``, in their order.

        A block runs from its first coordinate to the next block's (the last one to
        :attr:`size`); blocks numbered later follow, so these never change.
        """
        return sorted(self._blocks.items(), key=lambda block: block[1])

    def of(self, query: LinearQuery) -> tuple[IntArray, FloatArray]:
        """The query's non-zero coordinates (increasing) and their values."""
        (coordinates,) = self.of_many([query])
        return coordinates

    def of_many(self, queries: Sequence[LinearQuery]) -> list[tuple[IntArray, FloatArray]]:
        """:meth:`of` for each query, vectors over the same axes decomposed in one tensor op.

        A GROUP BY's vectors, or a restart's history, share a few sets of axes: each set's
        cores are stacked and split together, so the cost per vector is a few array slices,
        not the averaging's Python loop. New blocks are numbered as :meth:`of` would number
        them taking the queries one by one.
        """
        held = [self._factored(query) for query in queries]
        batches: dict[tuple[tuple[int, ...], tuple[int, ...]], list[int]] = {}
        for i, query in enumerate(held):
            assert query.core is not None
            batches.setdefault((query.axes, query.core.shape), []).append(i)
        split = {key: self._split(held, members) for key, members in batches.items()}
        # a block not yet numbered: the first query that weighs it, its place in that query's parts
        new: dict[tuple[int, ...], tuple[int, int]] = {}
        sizes: dict[tuple[int, ...], int] = {}
        for (_, members), parts in zip(batches.items(), split.values()):
            for place, (kept, flat, mask) in enumerate(parts):
                if kept in self._blocks:
                    continue
                weighing = np.flatnonzero(mask.any(axis=1))
                if weighing.size:
                    first = (members[int(weighing[0])], place)
                    new[kept] = min(new.get(kept, first), first)
                    sizes[kept] = flat.shape[1]
        for kept in sorted(new, key=new.__getitem__):
            self._blocks[kept] = self.size
            self.size += sizes[kept]
        out = [(np.zeros(0, dtype=np.int64), np.zeros(0)) for _ in held]
        for (_, members), parts in zip(batches.items(), split.values()):
            # the blocks in the order of their coordinates, each a run of them: laid side by
            # side, the coordinates increase (no sort, and no gather of the values after it)
            numbered = sorted(
                (
                    (self._blocks[kept], flat, mask)
                    for kept, flat, mask in parts
                    if kept in self._blocks
                ),
                key=lambda part: part[0],
            )
            if not numbered:
                continue
            size = sum(flat.shape[1] for _, flat, _ in numbered)
            coords = np.empty(size, dtype=np.int64)
            values = np.empty((len(members), size))
            at = 0
            for start, flat, _ in numbered:
                width = flat.shape[1]
                coords[at : at + width] = np.arange(start, start + width)
                np.multiply(flat, math.sqrt(self.n_cells / width), out=values[:, at : at + width])
                at += width
            # a row that keeps every coordinate (most of a restart's 6,178 on the wide cube)
            # shares the batch's, read-only
            coords.flags.writeable = False
            values.flags.writeable = False
            kept_all = np.logical_and.reduce([mask.all(axis=1) for _, _, mask in numbered])
            for row, i in enumerate(members):
                if kept_all[row]:
                    out[i] = (coords, values[row])
                    continue
                (nonzero,) = np.nonzero(np.concatenate([mask[row] for _, _, mask in numbered]))
                out[i] = (coords[nonzero], values[row, nonzero])
        return out

    def _factored(self, query: LinearQuery) -> LinearQuery:
        if query.core is None:  # over this cube's cells, but held cell by cell
            full = (query.kinds, *self.shape)
            query = LinearQuery.from_tensor(
                self.shape, query.to_dense().reshape(full), measures=query.measures
            )
        if query.shape != self.shape:
            raise ValueError(f"query over a cube of shape {query.shape}, not {self.shape}")
        return query

    @staticmethod
    def _split(
        held: list[LinearQuery], members: list[int]
    ) -> list[tuple[tuple[int, ...], FloatArray, npt.NDArray[np.bool_]]]:
        """Per block ``(kind, *S)``: the members' components flattened, and which are kept."""
        cores = np.stack([held[i].core for i in members])  # type: ignore[misc]
        axes = held[members[0]].axes
        batch, kinds = cores.shape[:2]
        flat_cores = np.abs(cores.reshape(batch, kinds, -1))
        chop = _CHOP * flat_cores.max(axis=(1, 2), initial=0.0)
        # ((kind, *S), tensor over the batch, S and the axes still to split); a kind no member
        # weighs has no components (a count over a cube with measures is split once, not once
        # per kind)
        weighed: npt.NDArray[np.bool_] = np.any(flat_cores, axis=(0, 2))
        parts: list[tuple[tuple[int, ...], FloatArray]] = [
            ((k,), cores[:, k]) for k in range(kinds) if weighed[k]
        ]
        for axis in axes:
            parts_split = []
            for kept, tensor in parts:
                position = len(kept)  # after the batch and the dimensions kept
                # np.mean's own arithmetic (a sum, then a division), without its per-call
                # overhead
                mean = np.add.reduce(tensor, axis=position) / tensor.shape[position]
                kept_dims = (*tensor.shape[:position], 1, *tensor.shape[position + 1 :])
                parts_split.append((kept, mean))
                parts_split.append((kept + (axis,), tensor - mean.reshape(kept_dims)))
            parts = parts_split
        out = []
        for kept, tensor in parts:
            flat = tensor.reshape(batch, -1)
            out.append((kept, flat, np.abs(flat) > chop[:, None]))
        return out
