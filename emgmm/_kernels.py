"""Pure numerical kernels of blocked EM for Gaussian mixtures.

Every function here works on one block of rows and on the model parameters it is given;
none keeps state, reads files or starts workers. The orchestration lives in
:mod:`emgmm._em`.

Notation (Bishop, *Pattern Recognition and Machine Learning*, 2006, section 9.2):
``X`` is a block of ``n`` rows and ``d`` features, ``K`` the number of components,
``w_k`` the weights, ``mu_k`` the means, ``Lambda_k`` the precision matrices and
``U_k`` their upper-triangular Cholesky factors with ``U_k @ U_k.T == Lambda_k``
(scikit-learn's ``precisions_cholesky_`` convention). ``r_ik`` are the
responsibilities (eq. 9.23) and ``c_k`` the centres the sufficient statistics are
accumulated around (the means of the previous iteration).
"""

from dataclasses import dataclass

import numpy as np
from scipy import linalg
from scipy.special import logsumexp

COVARIANCE_TYPES = ("full", "tied", "diag", "spherical")

_LOG_2PI = np.log(2.0 * np.pi)


def _ill_defined_message(component, dtype):
    """Error text for a covariance that is not positive definite (sklearn's wording)."""
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


# --------------------------------------------------------------------------------------
# Parameterisation: covariances <-> precision Cholesky factors


def precisions_cholesky_from_covariances(covariances, covariance_type):
    """Upper Cholesky factors of the precisions, from the covariances.

    For a covariance ``Sigma = L L^T`` (``L`` lower triangular) the precision factor is
    ``U = L^{-T}``, upper triangular, with ``U U^T = Sigma^{-1}`` (scikit-learn's
    ``_compute_precision_cholesky``).

    Parameters
    ----------
    covariances : ndarray
        ``(K, d, d)`` for 'full', ``(d, d)`` for 'tied', ``(K, d)`` for 'diag',
        ``(K,)`` for 'spherical'; float32 or float64.
    covariance_type : {'full', 'tied', 'diag', 'spherical'}

    Returns
    -------
    precisions_cholesky : ndarray
        Same shape and dtype as ``covariances``.

    Raises
    ------
    ValueError
        If a covariance is not positive definite; the message names the component.
    """
    covariances = np.asarray(covariances)
    dtype = covariances.dtype
    if covariance_type in ("full", "tied"):
        stack = covariances if covariance_type == "full" else covariances[np.newaxis]
        out = np.empty_like(stack)
        eye = np.eye(stack.shape[-1], dtype=dtype)
        for k, cov in enumerate(stack):
            try:
                cov_chol = linalg.cholesky(cov, lower=True, check_finite=True)
            except (linalg.LinAlgError, ValueError):
                component = k if covariance_type == "full" else None
                raise ValueError(_ill_defined_message(component, dtype)) from None
            out[k] = linalg.solve_triangular(cov_chol, eye, lower=True).T
        return out if covariance_type == "full" else out[0]
    bad = ~(covariances > 0.0)
    if np.any(bad):
        component = int(np.flatnonzero(bad.reshape(len(covariances), -1).any(axis=1))[0])
        raise ValueError(_ill_defined_message(component, dtype))
    return 1.0 / np.sqrt(covariances)


def precisions_cholesky_from_precisions(precisions, covariance_type):
    """Upper Cholesky factors ``U`` with ``U U^T = precision``.

    The upper factor of ``Lambda`` is ``J chol(J Lambda J) J`` with ``J`` the exchange
    matrix (scikit-learn issue #26415).

    Parameters
    ----------
    precisions : ndarray
        Shapes as in :func:`precisions_cholesky_from_covariances`.
    covariance_type : {'full', 'tied', 'diag', 'spherical'}

    Returns
    -------
    precisions_cholesky : ndarray
        Same shape and dtype as ``precisions``.

    Raises
    ------
    ValueError
        If a precision matrix is not positive definite; names the component.
    """
    precisions = np.asarray(precisions)
    if covariance_type in ("full", "tied"):
        stack = precisions if covariance_type == "full" else precisions[np.newaxis]
        out = np.empty_like(stack)
        for k, prec in enumerate(stack):
            try:
                lower = linalg.cholesky(prec[::-1, ::-1], lower=True)
            except linalg.LinAlgError:
                raise ValueError(
                    f"'{covariance_type} precision' of component {k} is not "
                    "positive definite"
                ) from None
            out[k] = lower[::-1, ::-1]
        return out if covariance_type == "full" else out[0]
    return np.sqrt(precisions)


def precisions_from_cholesky(precisions_cholesky, covariance_type):
    """Precisions ``U U^T`` from their upper Cholesky factors.

    Parameters
    ----------
    precisions_cholesky : ndarray
        Shapes as in :func:`precisions_cholesky_from_covariances`.
    covariance_type : {'full', 'tied', 'diag', 'spherical'}

    Returns
    -------
    precisions : ndarray
        Same shape and dtype.
    """
    u = np.asarray(precisions_cholesky)
    if covariance_type == "full":
        return np.matmul(u, np.swapaxes(u, 1, 2))
    if covariance_type == "tied":
        return u @ u.T
    return u**2


def covariances_from_cholesky(precisions_cholesky, covariance_type):
    """Covariances ``(U U^T)^{-1} = U^{-T} U^{-1}`` from the precision factors.

    Parameters
    ----------
    precisions_cholesky : ndarray
        Shapes as in :func:`precisions_cholesky_from_covariances`.
    covariance_type : {'full', 'tied', 'diag', 'spherical'}

    Returns
    -------
    covariances : ndarray
        Same shape and dtype.
    """
    u = np.asarray(precisions_cholesky)
    if covariance_type in ("full", "tied"):
        stack = u if covariance_type == "full" else u[np.newaxis]
        eye = np.eye(stack.shape[-1], dtype=u.dtype)
        out = np.empty_like(stack)
        for k, uk in enumerate(stack):
            u_inv = linalg.solve_triangular(uk, eye, lower=False)
            out[k] = u_inv.T @ u_inv
        return out if covariance_type == "full" else out[0]
    return 1.0 / u**2


def log_det_cholesky(precisions_cholesky, covariance_type, n_features):
    """``log det U_k = 1/2 log det Lambda_k`` for each component.

    Parameters
    ----------
    precisions_cholesky : ndarray
        Shapes as in :func:`precisions_cholesky_from_covariances`.
    covariance_type : {'full', 'tied', 'diag', 'spherical'}
    n_features : int

    Returns
    -------
    log_det : ndarray of shape (K,) for 'full', 'diag', 'spherical', or a float64
        scalar for 'tied'.
    """
    u = np.asarray(precisions_cholesky, dtype=np.float64)
    if covariance_type == "full":
        return np.log(np.diagonal(u, axis1=1, axis2=2)).sum(axis=1)
    if covariance_type == "tied":
        return np.log(np.diag(u)).sum()
    if covariance_type == "diag":
        return np.log(u).sum(axis=1)
    return n_features * np.log(u)


# --------------------------------------------------------------------------------------
# E step


def _shift(means, weights):
    """A common centre for the expanded distance formulas: the mixture mean."""
    return np.asarray(weights, dtype=np.float64) @ np.asarray(means, dtype=np.float64)


def _trmm_right_upper(block, u):
    """``block @ u`` for an upper-triangular ``u`` with one triangular BLAS call.

    ``block`` is a C-contiguous (n, d) array that is overwritten; it is returned.
    """
    (trmm,) = linalg.get_blas_funcs(("trmm",), (block,))
    # block.T is Fortran-ordered (d, n); u.T @ block.T == (block @ u).T
    out = trmm(1.0, u, block.T, side=0, lower=0, trans_a=1, overwrite_b=1)
    return out.T


def log_gaussian_prob(X, means, precisions_cholesky, covariance_type, weights=None):
    """Log-density of every row under every component.

    ``log N(x | mu_k, Lambda_k) = -d/2 log(2 pi) + sum_j log U_k[j, j]
    - 1/2 ||(x - mu_k) U_k||^2`` (Bishop eq. 2.43 with ``Lambda_k = U_k U_k^T``).

    For 'full' each component's block is centred on ``mu_k`` before the triangular
    product, so there is no cancellation. For 'tied', 'diag' and 'spherical' the
    squared distances are expanded around one common shift (the mixture mean) so that
    the work is a few matrix products; the rounding is then relative to the spread of
    the component means around that shift.

    Parameters
    ----------
    X : ndarray of shape (n, d), float32 or float64
        The block. It is not modified. Its dtype is the compute dtype.
    means : ndarray of shape (K, d)
    precisions_cholesky : ndarray
        Shapes as in :func:`precisions_cholesky_from_covariances`.
    covariance_type : {'full', 'tied', 'diag', 'spherical'}
    weights : ndarray of shape (K,), optional
        Only used to choose the shift for the expanded formulas (mixture mean);
        uniform when omitted. Does not change the result beyond rounding.

    Returns
    -------
    log_prob : ndarray of shape (n, K), float64
    """
    X = np.asarray(X)
    dtype = X.dtype
    n, d = X.shape
    K = means.shape[0]
    log_det = log_det_cholesky(precisions_cholesky, covariance_type, d)
    if covariance_type == "full":
        maha = np.empty((n, K), dtype=np.float64)
        means_c = means.astype(dtype, copy=False)
        work = np.empty((n, d), dtype=dtype)
        for k in range(K):
            np.subtract(X, means_c[k], out=work)
            u = np.asarray(precisions_cholesky[k], dtype=dtype)
            y = _trmm_right_upper(work, u)
            maha[:, k] = np.einsum("ij,ij->i", y, y)
    else:
        # Few products around one shift, in float64: the expansion cancels, so it
        # must not run in float32.
        if weights is None:
            weights = np.full(K, 1.0 / K)
        g = _shift(means, weights)
        Y = np.subtract(X, g, dtype=np.float64)
        M = np.asarray(means, dtype=np.float64) - g
        u = np.asarray(precisions_cholesky, dtype=np.float64)
        if covariance_type == "tied":
            Yu = _trmm_right_upper(Y, u)
            Mu = M @ u
            maha = (
                np.einsum("ij,ij->i", Yu, Yu)[:, None]
                - 2.0 * (Yu @ Mu.T)
                + np.einsum("ij,ij->i", Mu, Mu)[None, :]
            )
        elif covariance_type == "diag":
            prec = u**2
            maha = (Y * Y) @ prec.T - 2.0 * (Y @ (M * prec).T) + (M**2 * prec).sum(axis=1)
        else:
            prec = u**2
            maha = (
                np.einsum("ij,ij->i", Y, Y)[:, None]
                - 2.0 * (Y @ M.T)
                + np.einsum("ij,ij->i", M, M)[None, :]
            ) * prec[None, :]
        np.maximum(maha, 0.0, out=maha)
    return -0.5 * (d * _LOG_2PI + maha) + log_det


def estimate_log_prob_resp(X, weights, means, precisions_cholesky, covariance_type):
    """Per-row log-likelihood and log-responsibilities (Bishop eq. 9.23, 9.28).

    Parameters
    ----------
    X : ndarray of shape (n, d)
    weights : ndarray of shape (K,)
    means : ndarray of shape (K, d)
    precisions_cholesky : ndarray
    covariance_type : {'full', 'tied', 'diag', 'spherical'}

    Returns
    -------
    log_prob_norm : ndarray of shape (n,), float64
        ``log sum_k w_k N(x | mu_k, Lambda_k)``.
    log_resp : ndarray of shape (n, K), float64
        ``log r_ik``; rows sum (in probability) to one.
    """
    weighted = log_gaussian_prob(X, means, precisions_cholesky, covariance_type, weights)
    with np.errstate(divide="ignore"):
        weighted += np.log(np.asarray(weights, dtype=np.float64))
    log_prob_norm = logsumexp(weighted, axis=1)
    with np.errstate(under="ignore", invalid="ignore"):
        weighted -= log_prob_norm[:, np.newaxis]
    return log_prob_norm, weighted


# --------------------------------------------------------------------------------------
# Sufficient statistics and M step


@dataclass
class SufficientStatistics:
    """Sums over rows that the M step needs, centred on fixed centres ``c_k``.

    Attributes
    ----------
    nk : ndarray of shape (K,), float64
        ``sum_i r_ik``.
    sum_x : ndarray of shape (K, d), float64
        ``sum_i r_ik (x_i - c_k)``.
    sum_xx : ndarray, float64
        'full': ``(K, d, d)``, ``sum_i r_ik (x_i - c_k)(x_i - c_k)^T`` (upper triangle
        filled; the lower is symmetrised in :func:`m_step`); 'tied': ``(d, d)``, the
        same summed over ``k``; 'diag' and 'spherical': ``(K, d)``, the diagonal.
    log_likelihood : float
        ``sum_i log p(x_i)`` under the parameters of the E step.
    n_samples : int
        Rows summed.
    """

    nk: np.ndarray
    sum_x: np.ndarray
    sum_xx: np.ndarray
    log_likelihood: float
    n_samples: int

    def __iadd__(self, other):
        self.nk += other.nk
        self.sum_x += other.sum_x
        self.sum_xx += other.sum_xx
        self.log_likelihood += other.log_likelihood
        self.n_samples += other.n_samples
        return self


def block_statistics(X, resp, centers, covariance_type, resp_threshold=0.0):
    """Sufficient statistics of one block, centred on ``centers``.

    ``N_k = sum_i r_ik``, ``s_k = sum_i r_ik (x_i - c_k)`` and
    ``S_k = sum_i r_ik (x_i - c_k)(x_i - c_k)^T`` (Bishop eq. 9.24-9.27 rewritten
    around ``c_k``; centring keeps float32 data clear of the ``E[x^2] - mu^2``
    cancellation). For 'full', ``S_k`` is one symmetric rank-k update of
    ``sqrt(r_k) (X - c_k)`` over the rows with ``r_ik > resp_threshold``. For 'tied',
    with ``m_i = sum_k r_ik c_k``: ``sum_k S_k = sum_i (x_i - m_i)(x_i - m_i)^T +
    sum_k N_k c_k c_k^T - sum_i m_i m_i^T`` (one rank-k update). 'diag' and
    'spherical' use matrix products around a common shift, in float64.

    Parameters
    ----------
    X : ndarray of shape (n, d), float32 or float64
        The block (compute dtype). Not modified.
    resp : ndarray of shape (n, K), float64
        Responsibilities ``r_ik``.
    centers : ndarray of shape (K, d), float64
        Centres ``c_k``.
    covariance_type : {'full', 'tied', 'diag', 'spherical'}
    resp_threshold : float, default=0.0
        Rows with ``r_ik <= resp_threshold`` are left out of component ``k``'s 'full'
        second-moment statistic. ``0.0`` only skips exact zeros (exact).

    Returns
    -------
    SufficientStatistics
        With ``log_likelihood = 0.0``; the caller adds the block's log-likelihood.
    """
    X = np.asarray(X)
    dtype = X.dtype
    n, d = X.shape
    K = centers.shape[0]
    resp = np.asarray(resp, dtype=np.float64)
    centers = np.asarray(centers, dtype=np.float64)
    nk = resp.sum(axis=0)
    X64 = X.astype(np.float64, copy=False)
    sum_x = resp.T @ X64 - nk[:, None] * centers
    if covariance_type == "full":
        sum_xx = np.zeros((K, d, d), dtype=np.float64)
        (syrk,) = linalg.get_blas_funcs(("syrk",), (X,))
        centers_c = centers.astype(dtype)
        for k in range(K):
            rk = resp[:, k]
            rows = np.flatnonzero(rk > resp_threshold)
            if rows.size == 0:
                continue
            if rows.size == n:
                work = X - centers_c[k]
                work *= np.sqrt(rk, dtype=np.float64).astype(dtype)[:, None]
            else:
                work = X[rows] - centers_c[k]
                work *= np.sqrt(rk[rows]).astype(dtype)[:, None]
            # work.T is Fortran-ordered (d, m): syrk(trans=0) gives work.T @ work
            sum_xx[k] = syrk(1.0, work.T, trans=0, lower=0)
    elif covariance_type == "tied":
        g = centers.mean(axis=0)
        cg = centers - g
        mg = resp @ cg
        diff = np.subtract(X64, g)
        diff -= mg
        (syrk,) = linalg.get_blas_funcs(("syrk",), (diff,))
        sum_xx = syrk(1.0, diff.T, trans=0, lower=0)
        sum_xx = np.triu(sum_xx) + np.triu(sum_xx, 1).T
        sum_xx += (cg.T * nk) @ cg - mg.T @ mg
    else:
        g = (nk @ centers) / max(nk.sum(), np.finfo(np.float64).tiny)
        y = X64 - g
        cg = centers - g
        sum_xx = resp.T @ (y * y) - 2.0 * cg * (resp.T @ y) + nk[:, None] * cg**2
        np.maximum(sum_xx, 0.0, out=sum_xx)
    return SufficientStatistics(nk, sum_x, sum_xx, 0.0, n)


def m_step(stats, centers, reg_covar, covariance_type):
    """Maximisation step from summed sufficient statistics (Bishop eq. 9.24-9.26).

    ``N_k`` gets ``10 * eps`` added as in scikit-learn, ``w_k = N_k / sum N``,
    ``mu_k = c_k + s_k / N_k`` and ``Sigma_k = S_k / N_k - (s_k / N_k)(s_k / N_k)^T +
    reg_covar I``. 'tied' pools ``sum_k (S_k - s_k s_k^T / N_k) / sum_k N_k``;
    'spherical' averages the diagonal over features.

    Parameters
    ----------
    stats : SufficientStatistics
        Summed over all rows.
    centers : ndarray of shape (K, d)
        The centres the statistics were accumulated around.
    reg_covar : float
        Added to the diagonal of every covariance.
    covariance_type : {'full', 'tied', 'diag', 'spherical'}

    Returns
    -------
    weights : ndarray of shape (K,), float64
    means : ndarray of shape (K, d), float64
    covariances : ndarray, float64
        sklearn's ``covariances_`` shapes.
    """
    eps = np.finfo(np.float64).eps
    nk = stats.nk + 10 * eps
    weights = nk / nk.sum()
    shift = stats.sum_x / nk[:, None]
    means = np.asarray(centers, dtype=np.float64) + shift
    d = means.shape[1]
    if covariance_type == "full":
        upper = stats.sum_xx / nk[:, None, None]
        cov = np.triu(upper) + np.swapaxes(np.triu(upper, 1), 1, 2)
        cov -= shift[:, :, None] * shift[:, None, :]
        cov[:, np.arange(d), np.arange(d)] += reg_covar
    elif covariance_type == "tied":
        cov = stats.sum_xx - (shift.T * nk) @ shift
        cov /= nk.sum()
        cov = 0.5 * (cov + cov.T)
        cov[np.arange(d), np.arange(d)] += reg_covar
    else:
        # A variance around the new mean is >= 0: clip the rounding below it.
        # scikit-learn computes E[x^2] - mu^2 with the regularised N_k, which
        # exceeds the centred variance by mu^2 * 10 eps / N_k; add that term too so
        # both agree when N_k is about one sample (one-hot initialisations).
        cov = np.maximum(stats.sum_xx / nk[:, None] - shift**2, 0.0)
        cov += means**2 * ((nk - stats.nk) / nk)[:, None] + reg_covar
        if covariance_type == "spherical":
            cov = cov.mean(axis=1)
    return weights, means, cov

