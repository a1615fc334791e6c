"""Atoms: the cells that every vector seen so far weighs alike, kept as a growing partition.

A history row (or a ledger charge) is constant on each atom, so everything the engine computes
over cells (the BLUE, its residual, per-cell charges) can be computed over atoms, each counted
with its size: a SQL query over a cube touches few atoms however many cells it covers. The
partition starts as one atom holding every cell and is refined by each new vector (cells it
weighs differently, or leaves out, part ways); atoms only ever split, and a new atom remembers
its parent, so anything kept per atom (a ledger's spend) follows a split by copying.

A vector that is not constant on an atom of the history's partition, or covers only part of
one, is not in the row space of the history (every row is constant there): the estimability
test of most fresh queries is one pass over their cells.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["Partition"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


class Partition:
    """A partition of ``n_cells`` cells into atoms, refined by vectors.

    >>> p = Partition(6)
    >>> p.refine(np.array([0, 1, 2]), np.array([1.0, 1.0, 2.0]))
    2
    >>> p.atom_of.tolist(), p.sizes.tolist(), p.parent.tolist()
    ([1, 1, 2, 0, 0, 0], [3, 2, 1], [-1, 0, 0])
    >>> p.locate(np.array([0, 1]), np.array([5.0, 5.0]))
    (array([1]), array([5.]))
    >>> p.locate(np.array([0]), np.array([5.0])) is None  # half an atom
    True
    """

    def __init__(self, n_cells: int) -> None:
        if n_cells <= 0:
            raise ValueError("n_cells must be positive")
        self.n_cells = n_cells
        self.atom_of = np.zeros(n_cells, dtype=np.int64)
        self._sizes = np.zeros(16, dtype=np.int64)
        self._parent = np.full(16, -1, dtype=np.int64)
        self._covered = np.zeros(16, dtype=bool)
        self._sizes[0] = n_cells
        self.n_atoms = 1

    @property
    def sizes(self) -> IntArray:
        """Cells per atom."""
        return self._sizes[: self.n_atoms]

    @property
    def parent(self) -> IntArray:
        """The atom each atom split from (-1 for the first)."""
        return self._parent[: self.n_atoms]

    @property
    def covered(self) -> npt.NDArray[np.bool_]:
        """Atoms some vector refined with ``cover=True`` touches."""
        return self._covered[: self.n_atoms]

    def copy(self) -> Partition:
        """An independent partition with the same atoms."""
        other = Partition.__new__(Partition)
        other.n_cells = self.n_cells
        other.atom_of = self.atom_of.copy()
        other._sizes = self._sizes.copy()
        other._parent = self._parent.copy()
        other._covered = self._covered.copy()
        other.n_atoms = self.n_atoms
        return other

    def refine(self, cells: IntArray, weights: FloatArray, *, cover: bool = False) -> int:
        """Split the atoms so that the vector is constant on each; returns the atoms created.

        Within an atom, the cells of each distinct weight form one part and the cells the
        vector leaves out another; the part left out (else the first) keeps the atom's id.
        ``cover`` marks the vector's atoms as covered (history rows do; ledger charges not).
        """
        distinct, weight_id = np.unique(weights, return_inverse=True)
        keys = self.atom_of[cells] * distinct.size + weight_id
        groups, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
        group_atom = groups // distinct.size
        atoms, first, parts = np.unique(group_atom, return_index=True, return_counts=True)
        touched = np.add.reduceat(counts, first)
        whole = touched == self._sizes[atoms]
        created = 0
        if np.any(parts > 1) or not np.all(whole):
            moves = np.ones(groups.size, dtype=bool)
            moves[first[whole]] = False  # a wholly covered atom keeps its id for one part
            created = int(moves.sum())
            ids = group_atom.copy()
            ids[moves] = self.n_atoms + np.arange(created)
            self._grow(self.n_atoms + created)
            new = slice(self.n_atoms, self.n_atoms + created)
            np.subtract.at(self._sizes, group_atom[moves], counts[moves])
            self._sizes[new] = counts[moves]
            self._parent[new] = group_atom[moves]
            self._covered[new] = self._covered[group_atom[moves]]
            self.n_atoms += created
            self.atom_of[cells] = ids[inverse]
            atoms = np.unique(ids)
        if cover:
            self._covered[atoms] = True
        return created

    def locate(self, cells: IntArray, weights: FloatArray) -> tuple[IntArray, FloatArray] | None:
        """The vector over atoms (atoms increasing, one weight each), or None if it splits one.

        A vector splits an atom when it weighs two of its cells differently or leaves some out.
        """
        atoms = self.atom_of[cells]
        counts = np.bincount(atoms, minlength=self.n_atoms)  # linear: no sort of the cells
        (unique,) = np.nonzero(counts)
        if not np.array_equal(counts[unique], self._sizes[unique]):
            return None
        per_atom = np.zeros(self.n_atoms)
        per_atom[atoms] = weights  # one of each atom's weights; all equal if it is aligned
        if not np.array_equal(per_atom[atoms], weights):
            return None
        return unique.astype(np.int64), per_atom[unique]

    def _grow(self, n: int) -> None:
        if n <= self._sizes.size:
            return
        size = max(n, 2 * self._sizes.size)
        self._sizes = np.resize(self._sizes, size)
        self._parent = np.resize(self._parent, size)
        self._covered = np.resize(self._covered, size)
