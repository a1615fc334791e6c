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

    def of(self, query: LinearQuery) -> tuple[IntArray, FloatArray]:
        """The query's non-zero coordinates (increasing) and their values."""
        if query.core is None:  # over this cube's cells, but held cell by cell
            full = (query.kinds, *self.shape)
            query = LinearQuery.from_tensor(
                self.shape, query.to_dense().reshape(full), measures=query.measures
            )
        if query.shape != self.shape:
            raise ValueError(f"query over a cube of shape {query.shape}, not {self.shape}")
        core, axes = query.core, query.axes
        assert core is not None
        chop = _CHOP * float(np.max(np.abs(core), initial=0.0))
        # ((kind, *S), tensor over S followed by the axes still to split)
        # (a kind the vector does not weigh has no components: a count over a cube with
        # measures is decomposed once, not once per kind)
        parts: list[tuple[tuple[int, ...], FloatArray]] = [
            ((k,), core[k]) for k in range(len(core)) if np.any(core[k])
        ]
        for axis in axes:
            split = []
            for kept, tensor in parts:
                position = len(kept) - 1
                # np.mean's own arithmetic (a sum, then a division), without its per-call
                # overhead: a restart decomposes thousands of small tensors
                mean = np.add.reduce(tensor, axis=position) / tensor.shape[position]
                kept_dims = (*tensor.shape[:position], 1, *tensor.shape[position + 1 :])
                split.append((kept, mean))
                split.append((kept + (axis,), tensor - mean.reshape(kept_dims)))
            parts = split
        coords, values = [], []
        for kept, tensor in parts:
            flat = tensor.ravel()
            (nonzero,) = np.nonzero(np.abs(flat) > chop)
            if not nonzero.size:
                continue
            block = self._blocks.get(kept)
            if block is None:
                block = self._blocks[kept] = self.size
                self.size += flat.size
            scale = math.sqrt(self.n_cells / flat.size)
            coords.append(block + nonzero)
            values.append(flat[nonzero] * scale)
        if not coords:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        coord_array = np.concatenate(coords).astype(np.int64)
        value_array = np.concatenate(values)
        order = np.argsort(coord_array, kind="stable")
        return coord_array[order], value_array[order]
