"""'factor' (mixtures of factor analysers): the parameterisation and the
factorisation the kernels share.

Component ``k`` has the covariance ``Sigma_k = W_k W_k^T + Psi_k`` with loadings
``W_k`` of shape ``(d, q)`` and a diagonal ``Psi_k = diag(psi_k)`` of noise variances
(the model ``x = mu_k + W_k z + e``, ``z ~ N(0, I_q)``, ``e ~ N(0, Psi_k)``).
No ``(d, d)`` array is ever formed: the log-densities use the Woodbury identity and
the matrix determinant lemma, the statistics are ``O(d q)`` per component. The
kernels are split by operation, as those of the other types: the E step
(:mod:`~emgmm.covariance._factor_log_density`), the statistics
(:mod:`~emgmm.covariance._factor_statistics`), the M step and the start
(:mod:`~emgmm.covariance._factor_m_step`), the chosen pairs and the screen
(:mod:`~emgmm.covariance._factor_pairs`, :mod:`~emgmm.covariance._factor_screen`).

Notation: ``M_k = I_q + W_k^T Psi_k^{-1} W_k = L_k L_k^T`` (lower Cholesky factor),
``G_k = Psi_k^{-1} W_k L_k^{-T}`` (``(d, q)``), and for a row ``x`` the projection
``p_k(x) = (x - mu_k)^T G_k`` (``(q,)``). Then (Woodbury; determinant lemma)::

    (x - mu)^T Sigma^{-1} (x - mu) = sum_j (x_j - mu_j)^2 / psi_j - ||p(x)||^2
    log det Sigma = sum_j log psi_j + 2 sum_l log L_ll

and the posterior of the factors is ``z | x ~ N(L^{-T} p(x), M^{-1})`` (Ghahramani &
Hinton 1996, eq. 3-4, with ``beta = W^T Sigma^{-1} = M^{-1} W^T Psi^{-1}``).

Pure functions of the parameters they are given: none keeps state, reads files or
starts workers.
"""

from dataclasses import dataclass, field

import numpy as np
from scipy.linalg import solve_triangular

from .._runtime.blas import over_ranges


def n_parameters(n_components, n_features, n_factors):
    """Free parameters: ``K (d q - q (q - 1) / 2 + 2 d) + K - 1``.

    Loadings ``d q`` less the ``q (q - 1) / 2`` of the rotation ``W -> W R`` that leaves
    ``W W^T`` unchanged, ``d`` noise variances, ``d`` means, and ``K - 1`` weights.

    Returns
    -------
    int
    """
    K, d, q = n_components, n_features, n_factors
    return int(K * (d * q - q * (q - 1) // 2 + 2 * d) + K - 1)


@dataclass
class FactorPrecision:
    """What the kernels need of ``K`` components' ``W_k`` and ``psi_k``.

    Attributes
    ----------
    inv_noise : ndarray of shape (K, d), float64
        ``1 / psi_k``.
    projection : ndarray of shape (K, d, q), float64
        ``G_k = Psi_k^{-1} W_k L_k^{-T}``: a view of :attr:`stacked`.
    cholesky_inv : ndarray of shape (K, q, q), float64
        ``L_k^{-1}`` (lower triangular): ``E[z | x]^T = p_k(x) L_k^{-1}`` and
        ``Cov[z | x] = L_k^{-T} L_k^{-1} = M_k^{-1}``.
    log_det : ndarray of shape (K,), float64
        ``log det Sigma_k``.
    """

    inv_noise: np.ndarray
    projection: np.ndarray
    cholesky_inv: np.ndarray
    log_det: np.ndarray
    _cast: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def n_factors(self):
        return self.projection.shape[2]

    def take(self, k0, k1):
        """The factorisation of components ``k0:k1`` (its own stacked copy)."""
        K, d, q = self.projection.shape
        stacked = np.ascontiguousarray(self.stacked().reshape(d, K, q)[:, k0:k1])
        return FactorPrecision(self.inv_noise[k0:k1], np.swapaxes(stacked, 0, 1),
                               self.cholesky_inv[k0:k1], self.log_det[k0:k1])

    def stacked(self, dtype=np.float64):
        """``[G_1, ..., G_K]`` of shape ``(d, K q)`` in ``dtype`` (the float32 copy is
        made once and kept)."""
        K, d, q = self.projection.shape
        base = np.swapaxes(self.projection, 0, 1).reshape(d, K * q)  # no copy
        key = np.dtype(dtype).str
        if key == base.dtype.str:
            return base
        if key not in self._cast:
            self._cast[key] = base.astype(dtype)
        return self._cast[key]


def check_parameters(loadings, noise_variance):
    """Validated float64 copies of ``loadings`` (K, d, q) and ``noise_variance`` (K, d).

    Raises
    ------
    ValueError
        Shapes that do not match, a non-finite entry, or a noise variance that is not
        positive (naming the component and feature).
    """
    W = np.asarray(loadings, dtype=np.float64)
    psi = np.asarray(noise_variance, dtype=np.float64)
    if W.ndim != 3 or psi.ndim != 2 or W.shape[:2] != psi.shape:
        raise ValueError(
            f"loadings of shape (K, d, q) and noise variances of shape (K, d) are "
            f"needed; got {W.shape} and {psi.shape}")
    for name, a in (("loadings", W), ("noise variances", psi)):
        bad = np.argwhere(~np.isfinite(a))
        if bad.size:
            raise ValueError(f"The {name} of component {bad[0][0]} are not finite "
                             f"(feature {bad[0][1]}).")
    bad = np.argwhere(~(psi > 0.0))
    if bad.size:
        k, j = bad[0]
        raise ValueError(f"The noise variance of component {k}, feature {j} is "
                         f"{psi[k, j]!r}; noise variances must be positive.")
    return W, psi


def factorize(loadings, noise_variance, threads=1):
    """:class:`FactorPrecision` of the components: ``O(d q^2 + q^3)`` each.

    Parameters
    ----------
    loadings : array-like of shape (K, d, q)
        ``W_k``; ``q`` may be 0.
    noise_variance : array-like of shape (K, d)
        ``psi_k``, positive.
    threads : int, default=1
        Threads that take ranges of components
        (:func:`~emgmm._runtime.blas.over_ranges`; the result does not depend on it).

    Returns
    -------
    FactorPrecision

    Raises
    ------
    ValueError
        From :func:`check_parameters`.
    """
    W, psi = check_parameters(loadings, noise_variance)
    K, d, q = W.shape
    inv_noise = 1.0 / psi
    chol_inv = np.empty((K, q, q))
    # laid out (d, K, q) so that every block's GEMM reads it as one (d, K q) matrix
    stacked = np.empty((d, K, q))
    log_diag = np.empty((K, q))

    def factor(k0, k1):
        for k in range(k0, k1):
            log_diag[k] = _factor_component(W[k], inv_noise[k], chol_inv[k],
                                            stacked[:, k])

    over_ranges(factor, K, threads)
    log_det = np.log(psi).sum(axis=1)
    log_det += 2.0 * log_diag.sum(axis=1)
    return FactorPrecision(inv_noise, np.swapaxes(stacked, 0, 1), chol_inv, log_det)


def _factor_component(W, inv_noise, chol_inv, projection):
    """One component of :func:`factorize`: ``L^{-1}`` into ``chol_inv`` (q, q),
    ``G`` into ``projection`` (d, q); returns ``log diag L`` (q,)."""
    q = W.shape[1]
    scaled = W * inv_noise[:, None]                          # Psi^{-1} W
    inner = W.T @ scaled                                     # W^T Psi^{-1} W
    inner[np.arange(q), np.arange(q)] += 1.0
    L = np.linalg.cholesky(inner)
    chol_inv[...] = solve_triangular(L, np.eye(q), lower=True)
    # M >= I: ||L^{-1}|| <= 1, so the product is as accurate as a triangular solve
    np.matmul(scaled, chol_inv.T, out=projection)
    return np.log(np.diagonal(L))


def bad_components(noise_variance):
    """Components whose noise variances are not all positive and finite (``(m,)`` int):
    degenerate (a component on fewer distinct points than features with
    ``reg_covar=0``)."""
    psi = np.asarray(noise_variance)
    return np.flatnonzero(~(np.isfinite(psi) & (psi > 0.0)).all(axis=1))


def covariances(loadings, noise_variance):
    """Dense ``W_k W_k^T + diag(psi_k)``: ``(K, d, d)`` float64 (for attributes read on
    demand, never in ``fit``)."""
    W = np.asarray(loadings, dtype=np.float64)
    out = np.matmul(W, np.swapaxes(W, 1, 2))
    d = W.shape[1]
    out[:, np.arange(d), np.arange(d)] += noise_variance
    return out


def precisions(precision):
    """Dense ``Sigma_k^{-1} = Psi_k^{-1} - G_k G_k^T`` (Woodbury): ``(K, d, d)``."""
    G = precision.projection
    out = -np.matmul(G, np.swapaxes(G, 1, 2))
    d = G.shape[1]
    out[:, np.arange(d), np.arange(d)] += precision.inv_noise
    return out


def precisions_cholesky(loadings, noise_variance):
    """Upper ``U_k`` with ``U_k U_k^T = Sigma_k^{-1}`` (scikit-learn's convention):
    ``(K, d, d)``, ``U = L^{-T}`` for the Cholesky factor ``Sigma = L L^T`` of the
    dense covariance, as scikit-learn forms it."""
    cov = covariances(loadings, noise_variance)
    eye = np.eye(cov.shape[1])
    for k, c in enumerate(cov):
        cov[k] = solve_triangular(np.linalg.cholesky(c), eye, lower=True).T
    return cov


def sample(rng, means, loadings, noise_variance, counts):
    """``counts[k]`` draws of ``mu_k + W_k z + sqrt(psi_k) e`` per component, stacked in
    component order: ``(sum(counts), d)`` float64."""
    parts = []
    for mu, W, psi, c in zip(means, loadings, noise_variance, counts, strict=False):
        z = rng.standard_normal(size=(c, W.shape[1]))
        e = rng.standard_normal(size=(c, len(mu)))
        parts.append(mu + z @ W.T + e * np.sqrt(psi))
    return np.concatenate(parts) if parts else np.empty((0, means.shape[1]))


def bytes_per_row(n_features, n_components, n_factors, itemsize):
    """Working memory (bytes) of one row of a block during a pass: the row in the
    compute dtype (``d`` values) and six ``(n, K)`` float64 arrays: the diagonal
    distances and the sums ``sum_j y_j^2 / psi_kj`` (then the distances' rounding
    bounds), ``||p_k(x)||^2``,
    the log-densities (the responsibilities in place), the engine's work array of
    the responsibilities, and the E step's temporaries (with float32 projections,
    their rounding bounds and estimates). No ``K q`` array per row: the
    projections, the shifted rows ``[y^2, y, 1]``, and the statistics' posterior
    means are formed by row chunks (``_CHUNK_BYTES``, at least
    ``_MIN_PRODUCT_ROWS`` rows), a few per thread whatever the block
    (``n_factors`` does not enter)."""
    d, K = n_features, n_components
    return d * itemsize + 6 * K * 8
