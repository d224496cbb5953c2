"""Parameterisation of the components: precision Cholesky factors, precisions,
covariances and log-determinants, in scikit-learn's conventions.

The functions taking a ``covariance_type`` ask its :class:`CovarianceType`; the
kernels over stacks of ``(d, d)`` matrices below serve 'full' and 'tied'.

``U_k`` is the upper-triangular factor with ``U_k @ U_k.T == Lambda_k``, the precision
matrix (scikit-learn's ``precisions_cholesky_``); 'tied' has one ``(d, d)`` factor,
'diag' ``(K, d)`` and 'spherical' ``(K,)`` square roots of the precisions.
"""

import functools

import numpy as np
from scipy import linalg

from .._runtime.blas import held_threads, over_ranges
from .._runtime.lapack import potrf_lower, potri_lower
from ._base import get_covariance_type


def ill_defined_message(component, dtype, covariances=None):
    """Error text for a covariance that is not positive definite (sklearn's wording),
    or, when ``covariances`` shows it is not finite, for variances that overflow."""
    if covariances is not None:
        covariance = covariances if component is None else covariances[component]
        if not np.isfinite(covariance).all():
            where = "" if component is None else f" of component {component}"
            limit = np.sqrt(np.finfo(dtype).max)
            return (f"The covariance{where} is not finite: the data's variances "
                    f"overflow {np.dtype(dtype)} (values beyond ~{limit:.0e} from "
                    "the mean). Scale the input data.")
    where = "" if component is None else f" (component {component})"
    msg = (
        "Fitting the mixture model failed because some components have "
        f"ill-defined empirical covariance{where} (for instance caused by singleton "
        "or collapsed samples). Try to decrease the number of components, "
        "increase reg_covar, or scale the input data."
    )
    if np.dtype(dtype) == np.float32:
        msg += (
            " The numerical accuracy can also be improved by passing float64"
            " data instead of float32."
        )
    return msg


def entry_below_diagonal(factors):
    """``(k, i, j)`` of the first nonzero entry below the diagonal of ``factors``
    (K, d, d), or ``None`` when every factor is upper triangular. One component at
    a time: no ``(K, d, d)`` temporary."""
    rows, cols = np.tril_indices(factors.shape[-1], -1)
    for k, u in enumerate(factors):
        below = np.flatnonzero(u[rows, cols])
        if below.size:
            return k, int(rows[below[0]]), int(cols[below[0]])
    return None


def factor_limit(covariance_type, n_features, dtype=np.float64):
    """The bound on ``|U_ij|`` below which every precision formed from the factors is
    finite in ``dtype``.

    An entry of ``U U^T`` sums ``d`` products of two entries of ``U`` (one for
    'spherical'), so ``|U_ij| < sqrt(max / d)`` keeps it finite.

    Parameters
    ----------
    covariance_type : str or CovarianceType
    n_features : int
    dtype : numpy dtype, default=float64

    Returns
    -------
    numpy scalar of ``dtype``
    """
    return get_covariance_type(covariance_type).factor_limit(n_features, dtype)


def factorize(covariances, covariance_type, dtype=np.float64, threads=1):
    """Precision Cholesky factors and the components whose covariance is not PD.

    A component also counts as not positive definite when its factor is so large that
    its precision matrix would overflow ``dtype`` (a covariance within rounding of
    singular, possible with ``reg_covar=0``).

    For a covariance ``Sigma = L L^T`` (``L`` lower triangular) the precision factor is
    ``U = L^{-T}``, upper triangular, with ``U U^T = Sigma^{-1}`` (scikit-learn's
    ``_compute_precision_cholesky``).

    Parameters
    ----------
    covariances : ndarray
        ``(K, d, d)`` for 'full', ``(d, d)`` for 'tied', ``(K, d)`` for 'diag',
        ``(K,)`` for 'spherical' (scikit-learn's shapes); float64, or float32.
    covariance_type : str or CovarianceType
    dtype : numpy dtype, default=float64
        The dtype the fitted precisions are stored in.
    threads : int, default=1
        Threads that factorise the components ('full'), one LAPACK call each.

    Returns
    -------
    precisions_cholesky : ndarray
        Same shape and dtype as ``covariances``; rows of bad components are NaN.
    bad : list of int
        For 'tied', ``[0]`` means the shared covariance failed. The callers raise
        ``ValueError`` with :func:`ill_defined_message` or re-seed them.
    """
    return get_covariance_type(covariance_type).factorize(covariances, dtype, threads)


def precisions_cholesky_from_precisions(precisions, covariance_type):
    """Upper Cholesky factors ``U`` with ``U U^T = precision``.

    Parameters
    ----------
    precisions : ndarray
        Shapes as in :func:`factorize`.
    covariance_type : str or CovarianceType

    Returns
    -------
    precisions_cholesky : ndarray
        Same shape and dtype as ``precisions``.

    Raises
    ------
    ValueError
        If a precision matrix is not positive definite; names the component.
    """
    return get_covariance_type(covariance_type).precisions_cholesky_from_precisions(
        np.asarray(precisions))


def precisions_from_cholesky(precisions_cholesky, covariance_type):
    """Precisions ``U U^T`` from their upper Cholesky factors (same shape and dtype;
    shapes as in :func:`factorize`)."""
    return get_covariance_type(covariance_type).precisions_from_cholesky(
        np.asarray(precisions_cholesky))


def covariances_from_cholesky(precisions_cholesky, covariance_type):
    """Covariances ``(U U^T)^{-1} = U^{-T} U^{-1}`` from the precision factors (same
    shape and dtype; shapes as in :func:`factorize`)."""
    return get_covariance_type(covariance_type).covariances_from_cholesky(
        np.asarray(precisions_cholesky))


def log_det_cholesky(precisions_cholesky, covariance_type, n_features):
    """``log det U_k = 1/2 log det Lambda_k`` for each component.

    Parameters
    ----------
    precisions_cholesky : ndarray
        Shapes as in :func:`factorize`.
    covariance_type : str or CovarianceType
    n_features : int

    Returns
    -------
    log_det : ndarray of shape (K,) for 'full', 'diag', 'spherical', or a float64
        scalar for 'tied'.
    """
    return get_covariance_type(covariance_type).log_det_cholesky(precisions_cholesky,
                                                                 n_features)


# ------------------------------------------------ kernels over stacks of matrices


def cholesky_factors(stack, limit, threads=1):
    """Precision factors ``U = L^{-T}`` of the covariances ``stack`` (K, d, d) and
    the components whose covariance is not positive definite or whose factor
    reaches ``limit`` (their factors NaN).

    ``threads`` threads take contiguous ranges of components, one BLAS thread each
    (LAPACK releases the GIL; :func:`~emgmm._runtime.blas.over_ranges`); one thread
    runs them on the process's BLAS threads (for 'tied', one large factorisation).
    The result is the same for any ``threads`` at one BLAS thread per call, which a
    fit gives them whenever it runs more than one."""
    out = np.full_like(stack, np.nan)
    if threads <= 1:  # (one loop: each call may use the process's BLAS threads)
        return out, _factor_range(stack, out, limit, 0, len(stack))
    bad = over_ranges(functools.partial(_factor_range, stack, out, limit), len(stack),
                      threads)
    return out, [k for part in bad for k in part]


def _factor_range(stack, out, limit, k0, k1):
    """:func:`cholesky_factors` of components ``k0:k1`` into ``out``; the bad ones."""
    bad = []
    for k in range(k0, k1):
        try:
            chol = linalg.cholesky(stack[k], lower=True, check_finite=True)
        except (linalg.LinAlgError, ValueError):
            bad.append(k)
            continue
        # L^-1 by LAPACK's triangular inverse (d^3 / 3 flops; a solve against the
        # identity, scikit-learn's, takes d^3)
        inv, info = _trtri(chol, lower=1)
        u = inv.T
        if info != 0 or not np.all(np.abs(u) < limit):
            bad.append(k)
            continue
        out[k] = u
    return bad


def _trtri(a, lower):
    """LAPACK's ``?trtri`` for the dtype of ``a``: ``(inverse, info)``."""
    return linalg.lapack.get_lapack_funcs("trtri", (a,))(a, lower=lower)


@functools.cache
def strictly_lower(d):
    """A boolean ``(d, d)`` mask of the strict lower triangle (cached)."""
    return np.tril(np.ones((d, d), dtype=bool), -1)


#: Rows and columns of the tiles :func:`mirror_upper` copies at a time.
MIRROR_TILE = 128


def mirror_upper(a):
    """Copy the strict upper triangle of the square ``a`` onto its lower one, tile by
    tile (no ``(d, d)`` temporary)."""
    d = a.shape[0]
    t = MIRROR_TILE
    for i in range(0, d, t):
        i1 = min(i + t, d)
        block = a[i:i1, i:i1]
        np.copyto(block, block.T.copy(), where=strictly_lower(i1 - i))
        for j in range(i1, d, t):
            j1 = min(j + t, d)
            a[j:j1, i:i1] = a[i:i1, j:j1].T


#: Flops of a loop over components beyond which :func:`each_component` runs it in
#: threads.
THREADED_FLOPS = 2**30


def each_component(func, n_components, n_features):
    """``func(k)`` for every component: in threads (as many as the process's BLAS
    may use, :func:`~emgmm._runtime.blas.held_threads`: one under ``n_jobs=1``; one
    BLAS thread each) when the loop does more than ``THREADED_FLOPS`` (``K d^3``),
    else one after the other. ``func`` runs GIL-free LAPACK calls
    (:mod:`emgmm._runtime.lapack`) on its own component's arrays."""
    small = n_components * n_features**3 < THREADED_FLOPS
    threads = 1 if small else held_threads()
    if threads < 2:
        for k in range(n_components):
            func(k)
        return
    over_ranges(lambda start, stop: [func(k) for k in range(start, stop)],
                n_components, threads)


def upper_factors_of_precisions(stack, covariance_type):
    """Upper factors of the precisions ``stack`` (K, d, d): ``J chol(J Lambda J) J``
    with ``J`` the exchange matrix (scikit-learn issue #26415). Raises
    ``ValueError`` naming the first component that is not positive definite."""
    out = np.empty_like(stack)
    failed = []

    def factor(k):
        # J Lambda J column-major: its lower Cholesky factor, flipped, is U
        a = np.array(stack[k][::-1, ::-1], order="F")
        if potrf_lower(a) != 0:
            failed.append(k)
            return
        out[k] = np.tril(a)[::-1, ::-1]

    each_component(factor, len(stack), stack.shape[-1])
    if failed:
        raise ValueError(f"'{covariance_type} precision' of component {min(failed)} "
                         "is not positive definite")
    return out


def covariances_of_factors(stack):
    """``U^{-T} U^{-1}`` for the upper factors ``stack`` (K, d, d): ``J U J`` is
    lower triangular with ``(J U J)(J U J)^T = J Lambda J``, so LAPACK ``potri`` of
    it gives ``J Sigma J`` (``2 d^3 / 3`` flops per component)."""
    out = np.empty_like(stack)

    def covariance(k):
        a = np.array(stack[k][::-1, ::-1], order="F")
        if potri_lower(a) != 0:
            out[k] = np.nan
            return
        mirror_upper(a.T)  # (the lower triangle of the column-major a)
        out[k] = a[::-1, ::-1]

    each_component(covariance, len(stack), stack.shape[-1])
    return out


def check_precision_matrix(precision, covariance_type):
    """Raise ``ValueError`` (scikit-learn's wording) unless ``precision`` (d, d) is
    symmetric (``np.isclose``) and positive definite (its Cholesky factorisation
    succeeds: as scikit-learn's ``eigvalsh > 0``, at a fraction of its cost)."""
    if not (np.all(np.isclose(precision, precision.T))
            and potrf_lower(np.array(precision, order="F")) == 0):
        raise ValueError(
            f"'{covariance_type} precision' should be symmetric, positive-definite")


def check_symmetric_positive_definite(matrix, covariance_type):
    """Raise ``ValueError`` naming ``covariance_prior`` unless ``matrix`` (d, d) is
    symmetric (``np.isclose``) and positive definite (``eigvalsh``)."""
    if not (np.all(np.isclose(matrix, matrix.T))
            and np.all(np.linalg.eigvalsh(matrix) > 0.0)):
        raise ValueError(f"covariance_prior (covariance_type={covariance_type!r}) "
                         "should be symmetric, positive-definite.")


def check_precision_positivity(precision, covariance_type):
    """Raise ``ValueError`` (scikit-learn's wording) unless every entry is > 0."""
    if np.any(np.less_equal(precision, 0.0)):
        raise ValueError(f"'{covariance_type} precision' should be positive")
