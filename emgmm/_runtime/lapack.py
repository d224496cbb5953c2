"""BLAS and LAPACK calls on one component's matrices that release the GIL.

scipy's Python wrappers of BLAS and LAPACK (``scipy.linalg.blas``,
``scipy.linalg.lapack``) hold the GIL while they run, so threads of one process that
call them take turns. The same routines are exported to C by scipy's public Cython
modules ``scipy.linalg.cython_blas`` and ``scipy.linalg.cython_lapack`` (as capsules
holding the routines' addresses, the way Cython modules share C functions); called
through :mod:`ctypes`, which releases the GIL for the duration of a foreign call,
every thread runs its own. Where the capsules cannot be had, the Python wrappers
serve (same results, one thread at a time).

Every function works in place on Fortran-ordered (column-major) 2-D arrays of
float64 or float32; a C-ordered square matrix is passed as its transpose.
"""

import ctypes
import functools

import numpy as np
from scipy.linalg import blas as _blas
from scipy.linalg import lapack as _lapack

_CHAR = ctypes.c_char_p
_INT = ctypes.POINTER(ctypes.c_int)
_PTR = ctypes.c_void_p
_SIGNATURES = {
    "potrf": (_CHAR, _INT, _PTR, _INT, _INT),
    "potri": (_CHAR, _INT, _PTR, _INT, _INT),
    "trtri": (_CHAR, _CHAR, _INT, _PTR, _INT, _INT),
    "trmm": (_CHAR, _CHAR, _CHAR, _CHAR, _INT, _INT, _PTR, _PTR, _INT, _PTR, _INT),
    "trsm": (_CHAR, _CHAR, _CHAR, _CHAR, _INT, _INT, _PTR, _PTR, _INT, _PTR, _INT),
    "syrk": (_CHAR, _CHAR, _INT, _INT, _PTR, _PTR, _INT, _PTR, _PTR, _INT),
    "gemm": (_CHAR, _CHAR, _INT, _INT, _INT, _PTR, _PTR, _INT, _PTR, _INT, _PTR, _PTR,
             _INT),
}
_PREFIX = {np.dtype(np.float64): "d", np.dtype(np.float32): "s"}


@functools.cache
def _routine(name, dtype):
    """The ctypes function of routine ``name`` for ``dtype`` ('d' or 's' prefix), or
    ``None`` when scipy's capsule cannot be read."""
    prefix = _PREFIX[np.dtype(dtype)]
    try:
        if name in ("potrf", "potri", "trtri"):
            from scipy.linalg import cython_lapack as module
        else:
            from scipy.linalg import cython_blas as module
        capsule = module.__pyx_capi__[prefix + name]
        get_name = ctypes.pythonapi.PyCapsule_GetName
        get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
        get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
        get_pointer.restype = ctypes.c_void_p
        get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
        address = get_pointer(capsule, get_name(capsule))
    except (ImportError, AttributeError, KeyError, ValueError, OSError):
        return None
    return ctypes.CFUNCTYPE(None, *_SIGNATURES[name])(address)


def _check(a, name, writable=True):
    if not (a.ndim == 2 and a.flags.f_contiguous and a.dtype in _PREFIX
            and (a.flags.writeable or not writable)):
        raise ValueError(f"{name} must be a {'writable ' if writable else ''}"
                         "Fortran-ordered 2-D float64 or float32 array, got "
                         f"{a.dtype} of shape {a.shape}")


def _check_pair(a, shape, dtype):
    """Refuse operands whose shapes or dtypes differ (BLAS would read or write past
    the smaller one)."""
    if a.shape != shape or a.dtype != dtype:
        raise ValueError(f"operands do not match: {a.dtype} {a.shape} against "
                         f"{np.dtype(dtype)} {shape}")


_INT_MAX = 2**31 - 1


def _int(value):
    """A LAPACK integer (32 bits, as scipy's capsules take)."""
    value = int(value)
    if not 0 <= value <= _INT_MAX:
        raise OverflowError(f"{value} does not fit LAPACK's 32-bit integers")
    return ctypes.byref(ctypes.c_int(value))


def _scalar(value, dtype):
    ctype = ctypes.c_double if np.dtype(dtype) == np.float64 else ctypes.c_float
    return ctypes.byref(ctype(value))


def _lda(a):
    return max(1, a.shape[0])


def _in_place(name, a, flags, fallback):
    """LAPACK ``name`` on the lower triangle of ``a`` in place, its ``info``:
    through scipy's capsule (GIL-free) with ``flags`` before ``(n, a, lda,
    info)``, or scipy's wrapper with ``lower=1`` and the ``fallback`` keywords."""
    _check(a, "a")
    run = _routine(name, a.dtype)
    if run is None:
        _, info = _lapack.get_lapack_funcs(name, (a,))(a, lower=1, **fallback)
        return int(info)
    info = ctypes.c_int(0)
    run(*flags, _int(a.shape[0]), a.ctypes.data, _int(_lda(a)), ctypes.byref(info))
    return info.value


def potrf_lower(a):
    """Cholesky factor ``L`` of the symmetric positive definite ``a`` in place:
    ``a = L L^T`` in the lower triangle (the strict upper triangle is left as it
    is; only the lower one is read).

    Parameters
    ----------
    a : ndarray of shape (d, d), Fortran-ordered

    Returns
    -------
    int
        LAPACK's ``info``: 0 on success, ``j > 0`` when the leading minor of order
        ``j`` is not positive definite.
    """
    return _in_place("potrf", a, (b"L",), dict(overwrite_a=1, clean=0))


def potri_lower(a):
    """The inverse of ``L L^T`` from the lower-triangular ``L`` in ``a``, in place
    (its lower triangle; LAPACK ``potri``: ``2 d^3 / 3`` flops).

    Returns
    -------
    int
        LAPACK's ``info``: 0, or ``j > 0`` when ``a[j-1, j-1]`` is zero.
    """
    return _in_place("potri", a, (b"L",), dict(overwrite_c=1))


def trtri_lower(a):
    """Inverse of the lower-triangular ``a`` in place (its lower triangle).

    Returns
    -------
    int
        LAPACK's ``info``: 0, or ``j > 0`` when ``a[j-1, j-1]`` is zero.
    """
    return _in_place("trtri", a, (b"L", b"N"), dict(overwrite_c=1))


def trmm_left_lower(a, b, transpose=False):
    """``b := a @ b`` (``a.T @ b`` with ``transpose``) in place, ``a`` (d, d) lower
    triangular (its strict upper triangle is not read), ``b`` (d, m); both
    Fortran-ordered and of one dtype."""
    return _triangular("trmm", a, b, right=False, transpose=transpose)


def trsm_right_lower(a, b):
    """``b := b @ inv(a)`` in place, ``a`` (d, d) lower triangular (its strict upper
    triangle is not read), ``b`` (m, d); both Fortran-ordered and of one dtype."""
    return _triangular("trsm", a, b, right=True)


def _triangular(name, a, b, right, transpose=False):
    """BLAS ``name`` ('trmm' or 'trsm') with the lower-triangular ``a`` on the left
    of ``b`` (or its right), in place."""
    _check(a, "a", writable=False)
    _check(b, "b")
    m, n = b.shape
    order = n if right else m
    _check_pair(a, (order, order), b.dtype)
    if m == 0 or n == 0:
        return b
    run = _routine(name, a.dtype)
    if run is None:
        b[...] = _blas.get_blas_funcs(name, (a, b))(1.0, a, b, side=int(right),
                                                     lower=1, trans_a=int(transpose))
        return b
    run(b"R" if right else b"L", b"L", b"T" if transpose else b"N", b"N", _int(m),
        _int(n), _scalar(1.0, a.dtype), a.ctypes.data, _int(_lda(a)), b.ctypes.data,
        _int(_lda(b)))
    return b


def syrk_lower_add(c, a, alpha=1.0):
    """``c := c + alpha a a^T`` in the lower triangle of ``c`` (d, d), ``a`` (d, m);
    both Fortran-ordered and of one dtype (the strict upper triangle of ``c`` is not
    written)."""
    _check(c, "c")
    _check(a, "a", writable=False)
    _check_pair(c, (a.shape[0], a.shape[0]), a.dtype)
    d, m = a.shape
    if m == 0 or d == 0:
        return c
    run = _routine("syrk", a.dtype)
    if run is None:
        c[...] = _blas.get_blas_funcs("syrk", (a, c))(alpha, a, beta=1.0, c=c, lower=1)
        return c
    run(b"L", b"N", _int(d), _int(m), _scalar(alpha, a.dtype), a.ctypes.data,
        _int(_lda(a)), _scalar(1.0, a.dtype), c.ctypes.data, _int(_lda(c)))
    return c


def gemm_add(c, a, b, trans_a=False, trans_b=False):
    """``c := c + op(a) @ op(b)`` in place (``op(a)`` is ``a.T`` with ``trans_a``),
    ``c`` (m, n), ``op(a)`` (m, k), ``op(b)`` (k, n); all Fortran-ordered and of one
    dtype (a C-ordered operand is passed as its transpose, with the flag)."""
    _check(c, "c")
    _check(a, "a", writable=False)
    _check(b, "b", writable=False)
    m, n = c.shape
    k = a.shape[0] if trans_a else a.shape[1]
    _check_pair(a, (k, m) if trans_a else (m, k), c.dtype)
    _check_pair(b, (n, k) if trans_b else (k, n), c.dtype)
    if m == 0 or n == 0 or k == 0:
        return c
    run = _routine("gemm", c.dtype)
    if run is None:
        c[...] = _blas.get_blas_funcs("gemm", (a, b, c))(
            1.0, a, b, beta=1.0, c=c, trans_a=int(trans_a), trans_b=int(trans_b))
        return c
    run(b"T" if trans_a else b"N", b"T" if trans_b else b"N", _int(m), _int(n),
        _int(k), _scalar(1.0, c.dtype), a.ctypes.data, _int(_lda(a)), b.ctypes.data,
        _int(_lda(b)), _scalar(1.0, c.dtype), c.ctypes.data, _int(_lda(c)))
    return c
