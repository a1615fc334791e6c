"""Products with symmetric and triangular matrices that read only the triangle they need.

The span solver (:mod:`proxy.engine.span`) keeps ``G``, ``L``, ``L^{-1}``, ``K`` and ``K^{-1}``
densely, in the leading ``r x r`` block of buffers with room to grow, and a solve is a chain
of matrix-vector products with them. At the ranks SQL histories reach (hundreds to thousands)
those products run at the memory's speed, and numpy's ``@`` reads the whole square; BLAS's
``dsymv`` and ``dtrmv`` read one triangle, about half the bytes (0.55-0.65 of the time at rank
600 with the matrices out of cache, and at rank 2,800). SciPy exports them to compiled code
(:mod:`scipy.linalg.cython_blas`, each a capsule holding a function pointer); this module calls
them through :mod:`ctypes` on strided views, as numpy's ``@`` would (no copy of the block).

With several right-hand sides, OpenBLAS's matrix-matrix products pack the square (a copy) and
cost several of these passes, so up to ``_VECTORS`` columns are taken one product each; past
that, a triangular factor goes to ``dtrmm`` (0.65-0.85 of the general product's time with 20
columns) and a symmetric matrix to ``dsymm``, or to numpy's product (about 10% faster) when its
both triangles hold it.

Terms added to a symmetric matrix write its lower triangle alone (``dsyrk``): half the
bytes of a general update, and no pass to mirror it afterwards (34 ms at rank 2,831), since
every product reads that triangle only. With one or a few columns OpenBLAS's ``dgemm`` costs
far more than the bytes it moves (12 ms for one column at rank 2,831, ``dsyrk`` 4-5 ms).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import scipy.linalg.cython_blas

__all__ = [
    "symmetric_product",
    "lower_product",
    "rank_one_update",
    "add_gram",
]

FloatArray = npt.NDArray[np.float64]

# Right-hand sides taken one matrix-vector product each: OpenBLAS's matrix-matrix products
# pack the square first, so that with up to about this many columns they cost more (at rank
# 600 and 2,800, out of cache; with 4 columns they cost about the same).
_VECTORS = 3

_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype = ctypes.c_char_p
_capsule_name.argtypes = [ctypes.py_object]


def _routine(name: str, arguments: int) -> Callable[..., None]:
    """The Fortran BLAS routine ``name`` (every argument by reference, as pointers)."""
    capsule = scipy.linalg.cython_blas.__pyx_capi__[name]
    pointer = _capsule_pointer(capsule, _capsule_name(capsule))
    routine: Callable[..., None] = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * arguments))(pointer)
    return routine


_DSYMV = _routine("dsymv", 10)
_DTRMV = _routine("dtrmv", 8)
_DGER = _routine("dger", 9)
_DTRMM = _routine("dtrmm", 11)
_DSYRK = _routine("dsyrk", 10)
_DSYMM = _routine("dsymm", 12)
_ONE = ctypes.c_double(1.0)
_ZERO = ctypes.c_double(0.0)
_STEP = ctypes.c_int(1)


def _leading(matrix: FloatArray) -> tuple[ctypes.c_int, ctypes.c_int]:
    """The order and leading dimension of a square block whose rows are contiguous.

    Row-major, so BLAS (column-major) sees its transpose, with the rows' stride as ``lda``.
    """
    n, columns = matrix.shape
    if n != columns:
        raise ValueError("a square block is required")
    return ctypes.c_int(n), _rows_stride(matrix)


def _rows_stride(matrix: FloatArray) -> ctypes.c_int:
    """The leading dimension BLAS sees for a row-major block (its rows' stride)."""
    rows, columns = matrix.shape
    if matrix.dtype != np.float64 or (
        rows
        and columns
        and (
            (columns > 1 and matrix.strides[1] != 8)
            or matrix.strides[0] % 8
            or (rows > 1 and matrix.strides[0] < 8 * columns)
        )
    ):
        raise ValueError("a float64 block with contiguous rows is required")
    return ctypes.c_int(max(matrix.strides[0] // 8, columns, 1))


def symmetric_product(matrix: FloatArray, x: FloatArray, *, whole: bool = False) -> FloatArray:
    """``matrix @ x`` for a symmetric ``matrix``, reading its lower triangle only.

    ``x``: a vector or columns (a new array is returned either way). ``whole``: both triangles
    hold the matrix, so that past ``_VECTORS`` columns numpy's product may read the whole
    square (about 10% faster there than ``dsymm``).
    """
    if x.ndim == 2 and x.shape[1] > _VECTORS:
        if whole:
            return matrix @ x
        n, lda = _leading(matrix)
        operand = np.ascontiguousarray(x, dtype=np.float64)
        out = np.empty_like(operand)
        if n.value:
            # BLAS sees operand.T (columns x n): out.T = operand.T @ matrix, from the
            # matrix's upper triangle in columns (its lower one in rows)
            columns = ctypes.c_int(x.shape[1])
            _DSYMM(
                b"R", b"U", ctypes.byref(columns), ctypes.byref(n), ctypes.byref(_ONE),
                matrix.ctypes.data, ctypes.byref(lda), operand.ctypes.data,
                ctypes.byref(columns), ctypes.byref(_ZERO), out.ctypes.data,
                ctypes.byref(columns),
            )  # fmt: skip
        return out
    if x.ndim == 2:
        return np.stack([symmetric_product(matrix, x[:, k]) for k in range(x.shape[1])], axis=1)
    n, lda = _leading(matrix)
    vector = np.ascontiguousarray(x, dtype=np.float64)
    out = np.empty(n.value)
    if n.value:  # the lower triangle in rows is BLAS's upper one in columns
        _DSYMV(
            b"U", ctypes.byref(n), ctypes.byref(_ONE), matrix.ctypes.data, ctypes.byref(lda),
            vector.ctypes.data, ctypes.byref(_STEP), ctypes.byref(_ZERO), out.ctypes.data,
            ctypes.byref(_STEP),
        )  # fmt: skip
    return out


def lower_product(matrix: FloatArray, x: FloatArray, *, transpose: bool = False) -> FloatArray:
    """``matrix @ x`` (``matrix.T @ x`` with ``transpose``), reading ``matrix``'s lower triangle.

    ``matrix``: lower triangular (its entries above the diagonal are taken as zero). ``x``: a
    vector or columns (a new array is returned either way); past ``_VECTORS`` columns, one
    ``dtrmm`` (which, unlike the general product, runs near the memory's speed there too).
    """
    n, lda = _leading(matrix)
    out = np.array(x, dtype=np.float64, order="C")  # BLAS writes the product over it
    if not n.value or not out.size:
        return out
    if x.ndim == 2 and x.shape[1] > _VECTORS:
        # BLAS sees out.T (columns x n) and the upper triangular matrix.T: out.T @ matrix.T
        # is (matrix @ x).T ("N"), out.T @ matrix is (matrix.T @ x).T ("T")
        columns = ctypes.c_int(x.shape[1])
        _DTRMM(
            b"R", b"U", b"T" if transpose else b"N", b"N", ctypes.byref(columns),
            ctypes.byref(n), ctypes.byref(_ONE), matrix.ctypes.data, ctypes.byref(lda),
            out.ctypes.data, ctypes.byref(columns),
        )  # fmt: skip
        return out
    for vector in out.T if out.ndim == 2 else (out,):
        column = np.ascontiguousarray(vector)
        # BLAS sees the upper triangular matrix.T: "T" is matrix, "N" matrix.T
        _DTRMV(
            b"U", b"N" if transpose else b"T", b"N", ctypes.byref(n), matrix.ctypes.data,
            ctypes.byref(lda), column.ctypes.data, ctypes.byref(_STEP),
        )  # fmt: skip
        vector[...] = column
    return out


def rank_one_update(matrix: FloatArray, alpha: float, x: FloatArray, y: FloatArray) -> None:
    """``matrix += alpha * outer(x, y)`` in place, with no temporary of ``matrix``'s size.

    ``matrix``: a block whose rows are contiguous (a view into a larger buffer is written
    through). ``np.outer`` would write and read a second matrix as large: at a wide cube's
    order, hundreds of MB.
    """
    rows, columns = matrix.shape
    if x.shape != (rows,) or y.shape != (columns,):
        raise ValueError("x and y must match the matrix's rows and columns")
    lda = _rows_stride(matrix)
    if not rows or not columns:
        return
    u = np.ascontiguousarray(x, dtype=np.float64)
    v = np.ascontiguousarray(y, dtype=np.float64)
    # BLAS sees matrix.T (columns x rows): matrix.T += alpha * outer(y, x)
    _DGER(
        ctypes.byref(ctypes.c_int(columns)), ctypes.byref(ctypes.c_int(rows)),
        ctypes.byref(ctypes.c_double(alpha)), v.ctypes.data, ctypes.byref(_STEP),
        u.ctypes.data, ctypes.byref(_STEP), matrix.ctypes.data, ctypes.byref(lda),
    )  # fmt: skip


def add_gram(matrix: FloatArray, a: FloatArray, *, alpha: float = 1.0) -> None:
    """Add ``alpha * a @ a.T`` to ``matrix``'s lower triangle in place (``dsyrk``).

    Above the diagonal nothing is written. Half the arithmetic of a general product, and no
    temporary of ``matrix``'s size: a large sum of such terms can be added in blocks of ``a``'s
    columns.
    """
    rows, columns = matrix.shape
    if rows != columns or a.shape[0] != rows:
        raise ValueError("a square matrix and columns of its order are required")
    ldc = _rows_stride(matrix)
    depth = a.shape[1]
    if not rows or not depth:
        return
    operand = np.ascontiguousarray(a, dtype=np.float64)
    # BLAS sees operand.T (depth x rows) and matrix.T, whose upper triangle is matrix's lower
    _DSYRK(
        b"U", b"T", ctypes.byref(ctypes.c_int(rows)), ctypes.byref(ctypes.c_int(depth)),
        ctypes.byref(ctypes.c_double(alpha)), operand.ctypes.data,
        ctypes.byref(ctypes.c_int(depth)), ctypes.byref(_ONE), matrix.ctypes.data,
        ctypes.byref(ldc),
    )  # fmt: skip
