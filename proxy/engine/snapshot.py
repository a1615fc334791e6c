"""A history's factorization as plain arrays, so that a restart need not factor it again.

Everything the fronts of a factored history hold (:mod:`proxy.engine.fronts`: per front its
block, ``V_T``, ``R_T``, ``R_T^{-1}``, ``C_T``; the products solves read; the distinct vectors'
coordinates and the space's block numbering) is a function of public inputs only: the vectors
and their budgets, never a noisy value. An engine exports it (:meth:`HistoryIndex.factorization
<proxy.engine.estimator.HistoryIndex.factorization>`) with a watermark, the number of history
rows it covers and a digest of those rows' vectors, budgets and steps; a restart given it
(:meth:`HistoryIndex.load <proxy.engine.estimator.HistoryIndex.load>`) checks the watermark
against the history it is given, takes the arrays in place of the factorization and folds only
the rows after the watermark. On any mismatch it factors the history as if it had none: the
history stays the record, this is a cache of work done on it.

Arrays are grouped by what they are (every front's ``V_T``, ...), each group one 1-D array of
its members' numbers laid end to end with their shapes and memory orders, so that a store
writes tens of arrays, not tens of thousands (:func:`pack`, :func:`unpack`).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "FORMAT",
    "Array",
    "Factorization",
    "FactorizationMismatch",
    "RowsDigest",
    "pack",
    "unpack",
]

FORMAT = 1  # the layout of the arrays below; a factorization of another is not taken

Array = npt.NDArray[Any]  # a factorization's arrays: numbers of several dtypes


class FactorizationMismatch(ValueError):
    """A factorization that does not belong to the history it was given (or is malformed)."""


@dataclass(frozen=True, slots=True)
class Members:
    """Arrays of one group not yet laid end to end (views an engine holds: :func:`pack`)."""

    arrays: tuple[Array, ...]
    fortran: tuple[bool, ...]
    dtype: type

    @property
    def nbytes(self) -> int:
        """Their size laid out."""
        return sum(a.size for a in self.arrays) * np.dtype(self.dtype).itemsize

    def laid_out(self) -> Array:
        """One 1-D array of their numbers (each in its memory order)."""
        if not self.arrays:
            return np.zeros(0, dtype=self.dtype)
        return np.concatenate(
            [a.ravel(order="F" if f else "C") for a, f in zip(self.arrays, self.fortran)]
        ).astype(self.dtype, copy=False)


class Factorization:
    """A history's factorization: metadata (JSON-able) and named arrays (numbers only).

    Attributes:
        meta: ``format``, ``rows`` (the history rows it covers), ``digest`` (theirs:
            :class:`RowsDigest`), the cube's ``n_cells``, ``shape`` and ``measures``, and the
            structure's small parts (block keys, counts).
    """

    __slots__ = ("meta", "_parts", "_arrays")

    def __init__(self, meta: Mapping[str, object], parts: Mapping[str, Array | Members]) -> None:
        self.meta = meta
        self._parts = parts
        self._arrays: dict[str, Array] | None = None

    @property
    def arrays(self) -> Mapping[str, Array]:
        """The numbers by name (:func:`pack`'s groups), laid out at the first call.

        An engine exports views of what it holds (under its caller's lock); laying them out
        copies them, so a writer does it after the lock is released.
        """
        if self._arrays is None:
            self._arrays = {
                name: part.laid_out() if isinstance(part, Members) else part
                for name, part in self._parts.items()
            }
            self._parts = self._arrays
        return self._arrays

    @property
    def rows(self) -> int:
        """The history rows it covers (the first ones)."""
        rows = self.meta["rows"]
        if not isinstance(rows, int):
            raise FactorizationMismatch("malformed rows")
        return rows

    @property
    def nbytes(self) -> int:
        """The size of its arrays."""
        return sum(part.nbytes for part in self._parts.values())

    def with_meta(self, **meta: object) -> Factorization:
        """The same arrays with more metadata."""
        return Factorization({**self.meta, **meta}, self._parts)


class RowsDigest:
    """A running digest of history rows ``(vector, alpha, step)``: what a factorization covers.

    Vectors by their key (offset-free, as the index holds them), budgets and steps as the
    floats the index takes.
    """

    __slots__ = ("_hash",)

    def __init__(self) -> None:
        self._hash = hashlib.blake2b(digest_size=20)

    def copy(self) -> RowsDigest:
        """An independent digest of the same rows."""
        other = RowsDigest.__new__(RowsDigest)
        other._hash = self._hash.copy()
        return other

    def add(self, key: bytes, alpha: float, step: float) -> None:
        """One more row (``key``: its vector's)."""
        self._row(_short(key), alpha, step)

    def add_all(
        self, keys: Sequence[bytes], alphas: Sequence[float], steps: Sequence[float]
    ) -> None:
        """Rows in order; a vector's key hashed once for the rows that share it (a load's)."""
        hashed: dict[bytes, bytes] = {}
        for key, alpha, step in zip(keys, alphas, steps):
            short = hashed.get(key)
            if short is None:
                short = hashed[key] = _short(key)
            self._row(short, alpha, step)

    def _row(self, short: bytes, alpha: float, step: float) -> None:
        # the one encoding of a row: an appended row (add) and a loaded one (add_all) must
        # hash alike, or no restart would ever take a checkpoint
        self._hash.update(short)
        self._hash.update(struct.pack("<dd", alpha, step))

    def hexdigest(self) -> str:
        """The digest so far."""
        return self._hash.hexdigest()


def _short(key: bytes) -> bytes:
    """A vector's key, hashed to the 16 bytes a row's digest takes."""
    return hashlib.blake2b(key, digest_size=16).digest()


def pack(
    name: str, members: Sequence[Array], dtype: type, into: dict[str, Array | Members]
) -> None:
    """Put ``members`` (1-D or 2-D arrays of ``dtype``) in ``into`` as its group ``name``.

    Their shapes and whether each was column-major are kept with them (a front's factor is,
    as LAPACK takes it; restored the same, products with it round as before). Their numbers
    are laid end to end when :attr:`Factorization.arrays` is first read.
    """
    shapes = [(a.shape[0], a.shape[1] if a.ndim == 2 else -1) for a in members]
    fortran = tuple(
        bool(a.ndim == 2 and not a.flags.c_contiguous and a.flags.f_contiguous) for a in members
    )
    into[f"{name}.shape"] = np.array(shapes, dtype=np.int64).reshape(len(members), 2)
    into[f"{name}.fortran"] = np.array(fortran, dtype=bool)
    into[f"{name}.data"] = Members(tuple(members), fortran, dtype)


def unpack(name: str, arrays: Mapping[str, Array], dtype: type) -> list[Array]:
    """The members of ``arrays``' group ``name`` (views of its data), checked against it."""
    try:
        shapes, fortran, data = (arrays[f"{name}.{part}"] for part in ("shape", "fortran", "data"))
    except KeyError as missing:
        raise FactorizationMismatch(f"no {missing.args[0]}") from None
    if (
        data.dtype != dtype
        or data.ndim != 1
        or shapes.dtype != np.int64
        or shapes.ndim != 2
        or shapes.shape[1] != 2
        or fortran.shape != (shapes.shape[0],)
    ):
        raise FactorizationMismatch(f"{name}: malformed")
    sizes = np.where(shapes[:, 1] < 0, shapes[:, 0], shapes[:, 0] * shapes[:, 1])
    if np.any(shapes[:, 0] < 0) or int(sizes.sum()) != data.size:
        raise FactorizationMismatch(f"{name}: its shapes do not fit its data")
    ends = np.cumsum(sizes).tolist()
    members = []
    for (rows, columns), f, start, end in zip(
        shapes.tolist(), fortran.tolist(), [0, *ends[:-1]], ends
    ):
        flat = data[start:end]
        members.append(
            flat if columns < 0 else flat.reshape((rows, columns), order="F" if f else "C")
        )
    return members
