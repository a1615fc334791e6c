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
cost several of these passes, so up to ``_VECTORS`` columns are taken one product each.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import scipy.linalg.cython_blas

__all__ = ["symmetric_product", "lower_product"]

FloatArray = npt.NDArray[np.float64]

# Right-hand sides taken one matrix-vector product each (at rank 600-2,800, a matrix-matrix
# product of up to about this many columns costs more than as many products with vectors).
_VECTORS = 8

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
_ONE = ctypes.c_double(1.0)
_ZERO = ctypes.c_double(0.0)
_STEP = ctypes.c_int(1)


def _leading(matrix: FloatArray) -> tuple[ctypes.c_int, ctypes.c_int]:
    """The order and leading dimension of a square block whose rows are contiguous.

    Row-major, so BLAS (column-major) sees its transpose, with the rows' stride as ``lda``.
    """
    n, columns = matrix.shape
    if n != columns or matrix.dtype != np.float64 or (n > 1 and matrix.strides[1] != 8):
        raise ValueError("a square float64 block with contiguous rows is required")
    return ctypes.c_int(n), ctypes.c_int(max(matrix.strides[0] // 8, n, 1))


def symmetric_product(matrix: FloatArray, x: FloatArray) -> FloatArray:
    """``matrix @ x`` for a symmetric ``matrix``, reading its lower triangle only.

    ``x``: a vector or columns (a new array is returned either way); past ``_VECTORS`` columns
    numpy's product reads the whole square (symmetric, as it must be anyway).
    """
    if x.ndim == 2 and x.shape[1] > _VECTORS:
        return matrix @ x
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

    ``matrix``: lower triangular, its entries above the diagonal zero (they are read with
    more than ``_VECTORS`` columns). ``x``: a vector or columns (a new array is returned
    either way).
    """
    if x.ndim == 2 and x.shape[1] > _VECTORS:
        return (matrix.T if transpose else matrix) @ x
    if x.ndim == 2:
        return np.stack(
            [lower_product(matrix, x[:, k], transpose=transpose) for k in range(x.shape[1])],
            axis=1,
        )
    n, lda = _leading(matrix)
    out = np.array(x, dtype=np.float64)  # dtrmv writes the product over its vector
    if n.value:  # BLAS sees the upper triangular matrix.T: ("T" is matrix, "N" matrix.T)
        _DTRMV(
            b"U", b"N" if transpose else b"T", b"N", ctypes.byref(n), matrix.ctypes.data,
            ctypes.byref(lda), out.ctypes.data, ctypes.byref(_STEP),
        )  # fmt: skip
    return out
