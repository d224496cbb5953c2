"""'factor': the M step (Ghahramani & Hinton 1996) and the start's loadings
(Tipping & Bishop 1999).

Pure functions of the statistics or rows they are given. Notation as in
:mod:`emgmm.covariance._factor_parameters`.
"""


import numpy as np

from .._runtime.blas import over_ranges

# The initial loadings take an exact SVD of a component's weighted rows up to this
# size of their smaller side, a randomized one beyond.
_EXACT_SVD_SIZE = 600


def m_step(stats, centers, reg_covar, threads=1):
    """Weights, means, loadings and noise variances from summed statistics.

    The exact EM of Ghahramani & Hinton (1996, "The EM algorithm for mixtures of
    factor analyzers", Tech. Rep. CRG-TR-96-1, University of Toronto, section 3):
    the augmented loadings ``[W_k, m_k]`` (``m_k = mu_k - c_k``) of the factors
    ``[z; 1]`` are ``[S_uz, s] Omega^{-1}`` with ``Omega = [[S_zz, S_z], [S_z^T, N]]``,
    and ``psi_k = diag(S_uu - [W_k, m_k] [S_uz, s]^T) / N_k``, with one ``psi_k``
    per component as in McLachlan & Peel (2000, *Finite Mixture Models*, section
    8.5). Means, loadings and noise move together from one E step: one read of the
    data per iteration (McLachlan, Peel & Bean 2003's AECM form needs a second E
    step before the loadings). ``N_k`` gets ``10 eps`` as in scikit-learn (also on
    the diagonal of ``S_zz``, so that an empty component gets ``W = 0``).

    The noise variances are floored: ``psi = max(psi_raw, reg_covar)``, the
    maximiser of the expected complete-data log-likelihood over ``psi >=
    reg_covar`` (the loadings' maximiser does not depend on ``psi``), so that the
    lower bound never decreases, as scikit-learn's ``FactorAnalysis`` floors its
    noise. (Adding ``reg_covar`` to ``max(psi_raw, 0)``, as the other types add it
    to their variances, is no maximiser: on a flat cluster the bound fell at every
    iteration.) With ``q = 0`` and ``reg_covar=0`` this is the 'diag' M step.

    Parameters
    ----------
    stats : FactorStatistics
        Summed over all rows.
    centers : ndarray of shape (K, d)
        The centres the statistics were accumulated around.
    reg_covar : float
    threads : int, default=1
        Threads that take ranges of components
        (:func:`~emgmm._runtime.blas.over_ranges`; the result does not depend on it).

    Returns
    -------
    weights : ndarray of shape (K,)
    means : ndarray of shape (K, d)
    loadings : ndarray of shape (K, d, q)
    noise_variance : ndarray of shape (K, d)
    """
    eps10 = 10 * np.finfo(np.float64).eps
    nk = stats.nk + eps10
    K, d, q = stats.sum_xz.shape
    loadings = np.empty((K, d, q))
    noise = np.empty((K, d))
    shift = np.empty((K, d))

    def solve(k0, k1):
        for k in range(k0, k1):
            _component_m_step(stats, k, nk[k], reg_covar, loadings[k], noise[k],
                              shift[k])

    over_ranges(solve, K, threads)
    means = np.asarray(centers, dtype=np.float64) + shift
    return nk / nk.sum(), means, loadings, noise


def _component_m_step(stats, k, nk, reg_covar, loadings, noise, shift):
    """:func:`m_step` of component ``k`` into its ``loadings`` (d, q), ``noise``
    (d,) and mean ``shift`` (d,) (one ``(q + 1)``-system, ``d`` right-hand sides)."""
    d, q = loadings.shape
    omega = np.empty((q + 1, q + 1))
    omega[:q, :q] = stats.sum_zz[k]
    omega[np.arange(q), np.arange(q)] += 10 * np.finfo(np.float64).eps
    omega[:q, q] = omega[q, :q] = stats.sum_z[k]
    omega[q, q] = nk
    rhs = np.empty((q + 1, d))
    rhs[:q] = stats.sum_xz[k].T
    rhs[q] = stats.sum_x[k]
    aug = np.linalg.solve(omega, rhs)                          # [W, m]^T
    loadings[...] = aug[:q].T
    shift[...] = aug[q]
    explained = np.einsum("dq,dq->d", loadings, stats.sum_xz[k])
    explained += shift * stats.sum_x[k]
    np.maximum((stats.sum_xx[k] - explained) / nk, reg_covar, out=noise)


def _principal_axes(A, n_factors, random_state):
    """Top ``n_factors`` right singular vectors ``(d, r)`` and singular values ``(r,)``
    of ``A`` (``r = min(n_factors, rank bound)``): exact while the smaller side of
    ``A`` is at most ``_EXACT_SVD_SIZE``, else scikit-learn's ``randomized_svd``."""
    if min(A.shape) <= _EXACT_SVD_SIZE or n_factors >= min(A.shape) // 2:
        _, s, Vt = np.linalg.svd(A, full_matrices=False)
    else:
        from sklearn.utils.extmath import randomized_svd  # (workers never get here)

        _, s, Vt = randomized_svd(A, n_factors, n_iter=7, random_state=random_state)
    r = min(n_factors, len(s))
    return Vt[:r].T, s[:r]


def initial_parameters(X, resp, n_factors, reg_covar, random_state=0):
    """Weights, means, loadings and noise variances from responsibilities on an
    in-memory sample (e.g. k-means labels): per component, the probabilistic PCA of
    its weighted rows, then the noise that gives the sample's variances.

    With ``N_k = sum r + 10 eps``, the weighted mean ``mu_k``, the variances ``v_kj``
    and the eigenvalues ``lambda_1 >= ...`` of the weighted covariance (by an SVD of
    ``sqrt(r_i) (x_i - mu_k)``, never the ``(d, d)`` matrix): ``sigma^2`` the mean of
    the ``d - q`` discarded eigenvalues and ``W_k = V_q (Lambda_q - sigma^2)^{1/2}``,
    the maximum-likelihood PPCA loadings (Tipping & Bishop 1999, eq. 7-8); then
    ``psi_kj = v_kj - ||W_kj||^2 + reg_covar`` (``>= reg_covar``), so that
    ``diag(Sigma_k) = v_k + reg_covar`` as for 'diag'. Weights ``N_k / m`` as in
    scikit-learn's initialisation.

    Parameters
    ----------
    X : ndarray of shape (m, d)
    resp : ndarray of shape (m, K)
    n_factors : int
    reg_covar : float
    random_state : int, RandomState or None, default=0
        For ``randomized_svd`` (large components only).

    Returns
    -------
    weights : ndarray of shape (K,)
    means : ndarray of shape (K, d)
    loadings : ndarray of shape (K, d, q)
    noise_variance : ndarray of shape (K, d)
    """
    X = np.asarray(X, dtype=np.float64)
    resp = np.asarray(resp, dtype=np.float64)
    m, d = X.shape
    K, q = resp.shape[1], n_factors
    nk = resp.sum(axis=0) + 10 * np.finfo(np.float64).eps
    means = (resp.T @ X) / nk[:, None]
    loadings = np.zeros((K, d, q))
    noise = np.empty((K, d))
    for k in range(K):
        rows = np.flatnonzero(resp[:, k] > 0.0)
        A = np.subtract(X[rows], means[k]) * np.sqrt(resp[rows, k] / nk[k])[:, None]
        var = np.einsum("ij,ij->j", A, A)
        if q and rows.size:
            V, s = _principal_axes(A, q, random_state)
            lam = s**2
            rest = max(var.sum() - lam.sum(), 0.0) / (d - q) if d > q else 0.0
            loadings[k, :, :V.shape[1]] = V * np.sqrt(np.maximum(lam - rest, 0.0))
        noise[k] = np.maximum(var - (loadings[k] ** 2).sum(axis=1), 0.0) + reg_covar
    return nk / m, means, loadings, noise
