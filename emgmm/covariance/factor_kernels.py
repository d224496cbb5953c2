"""Kernels of covariance type 'factor': mixtures of factor analysers.

Component ``k`` has the covariance ``Sigma_k = W_k W_k^T + Psi_k`` with loadings
``W_k`` of shape ``(d, q)`` and a diagonal ``Psi_k = diag(psi_k)`` of noise variances
(the model ``x = mu_k + W_k z + e``, ``z ~ N(0, I_q)``, ``e ~ N(0, Psi_k)``).
No ``(d, d)`` array is ever formed: the log-densities use the Woodbury identity and
the matrix determinant lemma, the statistics are ``O(d q)`` per component.

Notation: ``M_k = I_q + W_k^T Psi_k^{-1} W_k = L_k L_k^T`` (lower Cholesky factor),
``G_k = Psi_k^{-1} W_k L_k^{-T}`` (``(d, q)``), and for a row ``x`` the projection
``p_k(x) = (x - mu_k)^T G_k`` (``(q,)``). Then (Woodbury; determinant lemma)::

    (x - mu)^T Sigma^{-1} (x - mu) = sum_j (x_j - mu_j)^2 / psi_j - ||p(x)||^2
    log det Sigma = sum_j log psi_j + 2 sum_l log L_ll

and the posterior of the factors is ``z | x ~ N(L^{-T} p(x), M^{-1})`` (Ghahramani &
Hinton 1996, eq. 3-4, with ``beta = W^T Sigma^{-1} = M^{-1} W^T Psi^{-1}``).

Pure functions of one block of rows and the parameters they are given: none keeps
state, reads files or starts workers.
"""

from dataclasses import dataclass, field

import numpy as np
from scipy.linalg import solve_triangular

from ..runtime.lapack import gemm_add
from .log_density import _shift

_LOG_2PI = np.log(2.0 * np.pi)
# A component whose expanded diagonal distances (around the common shift) may be off
# by more than this relative to the scale of its log-densities is recomputed directly.
_REFINE_RTOL = 1e-10
# Expanded sums more than this many times larger than their centred value (a tight
# component far from the shift) are recomputed centred (about 1e-10 relative left).
_MAX_CANCELLATION = 1e6
# The initial loadings take an exact SVD of a component's weighted rows up to this
# size of their smaller side, a randomized one beyond.
_EXACT_SVD_SIZE = 600
# Bytes of the row chunks of [y^2, y, 1] (their products with the coefficients).
_CHUNK_BYTES = 8 * 2**20
# Rows of the statistics' chunks at least (the inner dimension of the GEMMs that
# update the (d, K q) sums: fewer rows make them memory bound).
_MIN_PRODUCT_ROWS = 256


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


def factorize(loadings, noise_variance):
    """:class:`FactorPrecision` of the components: ``O(d q^2 + q^3)`` each.

    Parameters
    ----------
    loadings : array-like of shape (K, d, q)
        ``W_k``; ``q`` may be 0.
    noise_variance : array-like of shape (K, d)
        ``psi_k``, positive.

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
    scaled = W * inv_noise[:, :, None]                      # Psi^{-1} W
    inner = np.matmul(np.swapaxes(W, 1, 2), scaled)         # W^T Psi^{-1} W
    inner[:, np.arange(q), np.arange(q)] += 1.0
    L = np.linalg.cholesky(inner)
    chol_inv = np.empty((K, q, q))
    eye = np.eye(q)
    for k in range(K):
        chol_inv[k] = solve_triangular(L[k], eye, lower=True)
    # M >= I: ||L^{-1}|| <= 1, so the product is as accurate as a triangular solve;
    # laid out (d, K, q) so that every block's GEMM reads it as one (d, K q) matrix
    stacked = np.empty((d, K, q))
    np.matmul(scaled, np.swapaxes(chol_inv, 1, 2), out=np.swapaxes(stacked, 0, 1))
    projection = np.swapaxes(stacked, 0, 1)
    log_det = np.log(psi).sum(axis=1)
    log_det += 2.0 * np.log(np.diagonal(L, axis1=1, axis2=2)).sum(axis=1)
    return FactorPrecision(inv_noise, projection, chol_inv, log_det)


@dataclass
class Projections:
    """Products of a block kept from the E step for its statistics, formed when first
    read (a screened E step never reads them).

    Attributes
    ----------
    X : ndarray of shape (n, d)
        The block (as read; never modified).
    means : ndarray of shape (K, d)
        The E step's means.
    precision : FactorPrecision
        The factorisation they are computed with.
    shift : ndarray of shape (d,), float64
        ``g``: the rows enter every product as ``y = x - g``, formed by chunks.
    dtype : numpy dtype
        Of the projection GEMM.
    P : ndarray of shape (n, K, q), float64
        ``p_k(x_i) = (x_i - mu_k)^T G_k`` (computed on first access).
    y_norm : ndarray of shape (n,), float64
        ``||x_i - g||`` (computed with ``P``).
    diag : ndarray of shape (n, K), float64, or None
        ``sum_j (x_ij - mu_kj)^2 / psi_kj`` (computed with ``P``, from the same pass
        over the rows, for float64 projections); ``None``: computed by
        :func:`densities`.
    """

    X: np.ndarray
    means: np.ndarray
    precision: FactorPrecision
    shift: np.ndarray
    dtype: object = np.float64
    _products: tuple | None = field(default=None, repr=False, compare=False)

    @property
    def computed(self):
        """Whether :attr:`P` has been formed."""
        return self._products is not None

    def _formed(self):
        if self._products is None:
            if np.dtype(self.dtype) == np.float64:
                self._products = _projections_and_distances(
                    self.X, self.means, self.precision, self.shift)
            else:
                self._products = _projections(self.X, self.means, self.precision,
                                              self.shift, self.dtype) + (None,)
        return self._products

    @property
    def P(self):
        return self._formed()[0]

    @property
    def y_norm(self):
        return self._formed()[1]

    @property
    def diag(self):
        return self._formed()[2]


def _square_chunks(X, shift, min_rows=16):
    """Yield ``(r0, r1, Z)`` with ``Z = [y^2, y, 1]`` (float64) of rows ``r0:r1``,
    ``y = x - shift``, in chunks of about ``_CHUNK_BYTES`` but at least ``min_rows``
    rows (one buffer, overwritten by the next chunk): no ``(n, d)`` float64 copy of
    the block is held."""
    n, d = X.shape
    rows = int(max(1, min(n, max(min_rows, _CHUNK_BYTES // (8 * (2 * d + 1))))))
    buf = np.empty((min(rows, n), 2 * d + 1))
    buf[:, 2 * d] = 1.0
    for r0 in range(0, n, rows):
        r1 = min(r0 + rows, n)
        Z = buf[:r1 - r0]
        np.subtract(X[r0:r1], shift, out=Z[:, d:2 * d], dtype=np.float64,
                    casting="unsafe")
        np.multiply(Z[:, d:2 * d], Z[:, d:2 * d], out=Z[:, :d])
        yield r0, r1, Z


def _diag_distances(X, means, inv_noise, shift):
    """``sum_j (x_ij - mu_kj)^2 / psi_kj``: ``(n, K)``, from the shifted rows'
    ``y^2`` and ``y`` (by row chunks): ``S_ik + B_ik + C_k`` with ``S = y^2 @
    (1 / psi)``, ``B = y @ (-2 m / psi)`` and ``C_k = sum_j m_kj^2 / psi_kj``
    (``m = mu - shift``), then :func:`_refine_distances`."""
    diag = _DiagonalSums(means, inv_noise, shift, X.shape[0])
    for r0, r1, Z in _square_chunks(X, shift):
        diag.add(r0, r1, Z)
    return diag.finish(X, means)


class _DiagonalSums:
    """The expanded diagonal distances of a block, accumulated by row chunks of
    ``[y^2, y, 1]`` (:func:`_square_chunks`): two GEMMs per chunk."""

    def __init__(self, means, inv_noise, shift, n):
        self.inv_noise = np.asarray(inv_noise, dtype=np.float64)
        m = np.asarray(means, dtype=np.float64) - shift
        self.linear = -2.0 * (m * self.inv_noise).T              # (d, K)
        self.const = (m * m * self.inv_noise).sum(axis=1)
        self.out = np.empty((n, len(m)))
        self.squares = np.empty((n, len(m)))

    def add(self, r0, r1, Z):
        d = self.linear.shape[0]
        np.matmul(Z[:, :d], self.inv_noise.T, out=self.squares[r0:r1])
        np.matmul(Z[:, d:2 * d], self.linear, out=self.out[r0:r1])

    def finish(self, X, means):
        """The distances, the pairs whose expansion may cancel recomputed."""
        out, squares = self.out, self.squares
        out += squares
        out += self.const
        _refine_distances(X, means, self.inv_noise, out, squares, self.const)
        self.squares = None
        return out


def _refine_distances(X, means, inv_noise, out, squares, const):
    """Recompute from ``x - mu_k`` (:func:`_direct_distances`) the pairs of the
    expanded distances ``out`` whose rounding may exceed ``_REFINE_RTOL`` times the
    scale of their log-density (their distance, or ``d`` if larger).

    The rounding of a pair is at most ``gamma_{2d+8}`` times the sum of the
    magnitudes of its expanded terms, ``S + |B| + C <= (sqrt(S) + sqrt(C))^2``
    (Higham 2002, eq. 3.5; Cauchy-Schwarz for ``|B|``): large for a row of a tight
    component far from the shift, whose expansion cancels. ``squares`` (``S``) is
    overwritten with the bounds.
    """
    d = X.shape[1]
    unit = np.finfo(np.float64).eps / 2
    gamma = (2 * d + 8) * unit / (1.0 - (2 * d + 8) * unit)
    np.sqrt(squares, out=squares)
    squares += np.sqrt(const)
    squares *= squares
    squares *= gamma * (1.0 + gamma)                       # the bound of each pair
    redo = ~(squares <= _REFINE_RTOL * np.maximum(out, d))
    if redo.any():
        _direct_distances(X, means, inv_noise, redo, out)


def _direct_distances(X, means, inv_noise, redo, out):
    """``out[i, k] = sum_j (x_ij - mu_kj)^2 / psi_kj`` from ``x - mu_k`` on the pairs
    of ``redo`` (``(n, K)`` bool), per component by row chunks of ``_CHUNK_BYTES``."""
    d = X.shape[1]
    step = int(max(16, _CHUNK_BYTES // (8 * max(d, 1))))
    for k in np.flatnonzero(redo.any(axis=0)):
        rows = np.flatnonzero(redo[:, k])
        for c0 in range(0, len(rows), step):
            chunk = rows[c0:c0 + step]
            diff = np.subtract(X[chunk], means[k], dtype=np.float64)
            diff *= diff
            out[chunk, k] = diff @ inv_noise[k]


def _projections_and_distances(X, means, precision, shift):
    """float64 ``P``, ``||y||`` and the diagonal distances of :class:`Projections`
    from one pass of row chunks of ``[y^2, y, 1]`` (:func:`_square_chunks`, at least
    ``_MIN_PRODUCT_ROWS`` rows): the projection GEMM of each chunk's ``y`` against
    the stacked ``G_k`` and the two of :class:`_DiagonalSums`, then ``P -= (mu_k -
    shift)^T G_k``."""
    n, d = X.shape
    K, _, q = precision.projection.shape
    G = precision.stacked(np.float64)
    P = np.empty((n, K * q))
    y_norm = np.empty(n)
    diag = _DiagonalSums(means, precision.inv_noise, shift, n)
    for r0, r1, Z in _square_chunks(X, shift, _MIN_PRODUCT_ROWS):
        np.matmul(Z[:, d:2 * d], G, out=P[r0:r1])
        y_norm[r0:r1] = np.sqrt(Z[:, :d].sum(axis=1))
        diag.add(r0, r1, Z)
    m = np.asarray(means, dtype=np.float64) - shift
    P = P.reshape(n, K, q)
    P -= np.einsum("kd,kdq->kq", m, precision.projection)[None]
    return P, y_norm, diag.finish(X, means)


def _projections(X, means, precision, shift, dtype):
    """``P`` and ``||y||`` of :class:`Projections`: GEMMs of the shifted rows (by
    chunks, in ``dtype``) against every component's ``G_k`` stacked as ``(d, K q)``,
    minus ``(mu_k - shift)^T G_k``."""
    n, d = X.shape
    K, _, q = precision.projection.shape
    g = shift.astype(dtype)  # the shift as the chunks have it, also in m below
    G = precision.stacked(dtype)
    P = np.empty((n, K * q))
    y_norm = np.empty(n)
    rows = int(max(1, min(n, max(_MIN_PRODUCT_ROWS, _CHUNK_BYTES // (8 * d)))))
    buf = np.empty((min(rows, n), d), dtype=dtype)
    for r0 in range(0, n, rows):
        r1 = min(r0 + rows, n)
        Y = buf[:r1 - r0]
        np.subtract(X[r0:r1], g, out=Y, dtype=dtype, casting="unsafe")
        y_norm[r0:r1] = np.sqrt(np.einsum("ij,ij->i", Y, Y, dtype=np.float64))
        P[r0:r1] = Y @ G
    m = np.asarray(means, dtype=np.float64) - g.astype(np.float64)
    P = P.reshape(n, K, q)
    P -= np.einsum("kd,kdq->kq", m, precision.projection)[None]
    return P, y_norm


def estimate_log_prob(X, means, precision, weights=None, dtype=np.float64,
                      margin=None):
    """Log-densities of every row under every component, and the products kept for
    :func:`block_statistics`.

    ``log N(x | mu_k, Sigma_k) = -d/2 log(2 pi) - 1/2 log det Sigma_k
    - 1/2 (sum_j (x_j - mu_kj)^2 / psi_kj - ||p_k(x)||^2)`` (see the module's
    docstring): ``O(d q)`` per pair after :func:`factorize`; the work is one GEMM
    ``(n, d) x (d, K q)`` and one ``(n, 2 d + 1) x (2 d + 1, K)``.

    With a float32 projection GEMM the two terms cancel where the factors explain
    most of the variance (``||p||^2`` ~ 6e4 at d=2500, q=16: 0.02 nats off). Given a
    ``margin``, the pairs that may lie within it of their row's best weighted
    log-density (by the rounding bound of :func:`_float32_bound`) get their
    projections recomputed in float64: those are exact, the others are within the
    bound and have responsibilities below ``exp(-margin)``.

    Parameters
    ----------
    X : ndarray of shape (n, d), float32 or float64
        The block; not modified.
    means : ndarray of shape (K, d)
    precision : FactorPrecision
    weights : ndarray of shape (K,), optional
        The shift (the mixture mean) and, with a ``margin``, the pairs that matter;
        uniform when omitted.
    dtype : {numpy.float64, numpy.float32}, default=numpy.float64
        Of the projection GEMM (the diagonal distances are float64).
    margin : float or None, default=None
        Nats (see above); ``None``: every pair in ``dtype``.

    Returns
    -------
    log_prob : ndarray of shape (n, K), float64
    projections : Projections
    """
    X = np.asarray(X)
    d = X.shape[1]
    proj = projections(X, means, precision, weights, dtype)
    log_w = np.log(np.full(len(means), 1.0 / len(means)) if weights is None
                   else np.asarray(weights, dtype=np.float64))
    offset = log_w - 0.5 * (precision.log_det + d * _LOG_2PI)
    out = densities(X, means, precision, proj, offset, margin)
    out -= log_w
    return out, proj


def densities(X, means, precision, proj, offset, margin=None):
    """``offset_k - 1/2 (x - mu_k)^T Sigma_k^{-1} (x - mu_k)``: ``(n, K)`` float64
    from the block's projections ``proj`` (see :func:`estimate_log_prob`; its
    ``margin`` refinement, for float32 projections, ranks the pairs by these values:
    ``offset`` should hold ``log w_k``)."""
    diag = proj.diag
    if diag is None:
        diag = _diag_distances(X, means, precision.inv_noise, proj.shift)
    maha = diag - np.einsum("nkq,nkq->nk", proj.P, proj.P)
    d = X.shape[1]
    if margin is not None and X.dtype != np.float64 and maha.size:
        bound = _float32_bound(proj, precision, d)
        est = offset - 0.5 * maha
        floor = (est - 0.5 * bound).max(axis=1, keepdims=True) - margin
        redo = (est + 0.5 * bound >= floor).T
        _exact_projections(proj, means, precision, redo)
        maha = diag - np.einsum("nkq,nkq->nk", proj.P, proj.P)
    np.maximum(maha, 0.0, out=maha)
    maha *= -0.5
    maha += offset
    return maha


def _float32_bound(proj, precision, d):
    """Bound on the error of ``||p||^2`` from a float32 projection GEMM, ``(n, K)``:
    ``2 ||p|| e + e^2`` with ``||dp|| <= e = gamma_{d+2} ||y|| ||G_k||_F`` (Higham
    2002, eq. 3.5, with the float32 rounding of ``y`` and of ``G``; Cauchy-Schwarz
    for ``|y|^T |G|``)."""
    unit = np.finfo(np.float32).eps / 2
    gamma = (d + 2) * unit / (1.0 - (d + 2) * unit)
    err = gamma * np.outer(proj.y_norm,
                           np.linalg.norm(precision.projection, axis=(1, 2)))
    p_norm = np.sqrt(np.einsum("nkq,nkq->nk", proj.P, proj.P))  # no (n, K, q) copy
    return 2.0 * p_norm * err + err * err


def _exact_projections(proj, means, precision, redo):
    """Recompute ``proj.P`` in float64 on the pairs of ``redo`` (``(K, n)`` bool):
    per component, its rows gathered, one GEMM."""
    for k in np.flatnonzero(redo.any(axis=1)):
        rows = np.flatnonzero(redo[k])
        diff = np.subtract(proj.X[rows], means[k], dtype=np.float64)
        proj.P[rows, k] = diff @ precision.projection[k]


def projections(X, means, precision, weights=None, dtype=np.float64, shift=None):
    """:class:`Projections` of the block ``X`` (n, d) under components of ``means``
    (K, d) and ``precision``, around ``shift`` (default: the mixture mean of
    ``means`` and ``weights``); the projection GEMM in ``dtype``."""
    if shift is None:
        shift = _shift(means, weights)
    return Projections(np.asarray(X), means, precision, shift, dtype)


def log_gaussian_prob(X, means, precision, weights=None):
    """``(n, K)`` float64 log-densities of :func:`estimate_log_prob` alone."""
    return estimate_log_prob(X, means, precision, weights)[0]


@dataclass
class FactorStatistics:
    """Sufficient statistics of the mixture of factor analysers, summed over rows and
    centred on fixed centres ``c_k`` (the means of the E step), float64.

    With ``u = x - c_k`` and ``e = E[z | x, k]`` under the E step's parameters:

    Attributes
    ----------
    nk : ndarray of shape (K,)
        ``sum_i r_ik``.
    sum_x : ndarray of shape (K, d)
        ``sum_i r_ik u_i``.
    sum_xx : ndarray of shape (K, d)
        ``sum_i r_ik u_i^2`` (the diagonal of the second moments).
    sum_xz : ndarray of shape (K, d, q)
        ``sum_i r_ik u_i e_i^T``.
    sum_z : ndarray of shape (K, q)
        ``sum_i r_ik e_i``.
    sum_zz : ndarray of shape (K, q, q)
        ``sum_i r_ik E[z z^T | x_i, k] = sum_i r_ik (e_i e_i^T + M_k^{-1})``.
    log_likelihood : float
    n_samples : int
    """

    nk: np.ndarray
    sum_x: np.ndarray
    sum_xx: np.ndarray
    sum_xz: np.ndarray
    sum_z: np.ndarray
    sum_zz: np.ndarray
    log_likelihood: float
    n_samples: int

    _ARRAYS = ("nk", "sum_x", "sum_xx", "sum_xz", "sum_z", "sum_zz")

    def __add__(self, other):
        return FactorStatistics(
            *(getattr(self, a) + getattr(other, a) for a in self._ARRAYS),
            self.log_likelihood + other.log_likelihood,
            self.n_samples + other.n_samples)

    def __iadd__(self, other):
        for a in self._ARRAYS:
            getattr(self, a).__iadd__(getattr(other, a))
        self.log_likelihood += other.log_likelihood
        self.n_samples += other.n_samples
        return self


def concatenate_statistics(parts):
    """:class:`FactorStatistics` of consecutive component slices joined along the
    components (the log-likelihood and rows of the first part)."""
    first = parts[0]
    arrays = (np.concatenate([getattr(p, a) for p in parts])
              for a in FactorStatistics._ARRAYS)
    return FactorStatistics(*arrays, first.log_likelihood, first.n_samples)


def zero_statistics(n_components, n_features, n_factors):
    """:class:`FactorStatistics` of no rows."""
    K, d, q = n_components, n_features, n_factors
    return FactorStatistics(np.zeros(K), np.zeros((K, d)), np.zeros((K, d)),
                            np.zeros((K, d, q)), np.zeros((K, q)), np.zeros((K, q, q)),
                            0.0, 0)


def block_statistics(X, resp, centers, precision, proj=None, resp_threshold=0.0,
                     means=None):
    """:class:`FactorStatistics` of one block (``log_likelihood = 0``).

    ``e_i^T = p_k(x_i) L_k^{-1}`` from the E step's projections; the sums are GEMMs
    over row chunks (:func:`_statistics_chunks`: no array of the block's size is
    formed): ``R^T y``, ``R^T y^2`` and ``Y^T [r_1 e_1, ..., r_K e_K]`` (``(d, n)
    x (n, K q)``, accumulated in place) with ``y = x - shift``, re-centred on
    ``c_k`` by
    ``sum r (y - m)^2 = sum r y^2 - 2 m sum r y + N m^2`` and ``sum r (y - m) e^T =
    Y^T (r e) - m (sum r e)^T`` (``m = c_k - shift``). A component whose expanded
    second moments exceed ``_MAX_CANCELLATION`` times their centred value in some
    feature is recomputed from ``x - c_k``.

    Parameters
    ----------
    X : ndarray of shape (n, d), float32 or float64
        The block; not modified.
    resp : ndarray of shape (n, K), float64
        Responsibilities.
    centers : ndarray of shape (K, d)
        The centres ``c_k`` of the sums: the E step's means, or others (the M step
        holds for any centres, as long as ``e`` is that of the E step).
    precision : FactorPrecision
        Of the E step.
    proj : Projections or None, default=None
        :func:`estimate_log_prob`'s for this block; ``None``: computed here (float64)
        from ``means``.
    resp_threshold : float, default=0.0
        Pairs with ``r_ik <= resp_threshold`` are left out of every sum.
    means : ndarray of shape (K, d) or None, default=None
        The E step's means when ``proj`` is ``None`` (default: ``centers``).

    Returns
    -------
    FactorStatistics
    """
    X = np.asarray(X)
    n, d = X.shape
    resp = np.asarray(resp, dtype=np.float64)
    if resp_threshold > 0.0:
        resp = np.where(resp > resp_threshold, resp, 0.0)
    centers = np.asarray(centers, dtype=np.float64)
    if proj is None:
        proj = projections(X, centers if means is None else means, precision,
                           resp.sum(axis=0))
    K, q = len(centers), precision.n_factors
    chol_inv = precision.cholesky_inv
    sum_y, sum_yy = np.zeros((K, d)), np.zeros((K, d))
    sum_z, sum_zz = np.zeros((K, q)), np.zeros((K, q, q))
    flat = np.zeros((d, K * q))                       # sum_i y_i (r_i e_i)^T
    for r0, r1, Y, rE in _statistics_chunks(X, proj, resp, chol_inv, sum_z, sum_zz):
        sum_y += resp[r0:r1].T @ Y
        # flat^T += (r e)^T y: Fortran views of the C-ordered arrays, no copies
        gemm_add(flat.T, rE.reshape(r1 - r0, K * q).T, Y.T, trans_b=True)
        Y *= Y
        sum_yy += resp[r0:r1].T @ Y
    nk = resp.sum(axis=0)
    sum_zz += nk[:, None, None] * np.matmul(np.swapaxes(chol_inv, 1, 2), chol_inv)
    sum_xz = np.swapaxes(flat.reshape(d, K, q), 0, 1)  # (K, d, q), a view
    m = centers - proj.shift
    sum_x = sum_y - nk[:, None] * m
    sum_xx = sum_yy - 2.0 * m * sum_y + nk[:, None] * m**2
    for k in range(K):  # (no (K, d, q) temporary)
        sum_xz[k] -= np.outer(m[k], sum_z[k])
    scale = sum_yy + nk[:, None] * m**2
    for k in np.flatnonzero((scale / _MAX_CANCELLATION > sum_xx).any(axis=1)):
        sum_x[k], sum_xx[k], sum_xz[k] = _centred_sums(X, resp[:, k], centers[k],
                                                       proj.P[:, k], chol_inv[k])
    np.maximum(sum_xx, 0.0, out=sum_xx)
    return FactorStatistics(nk, sum_x, sum_xx, sum_xz, sum_z, sum_zz, 0.0, n)


def _statistics_rows(n, d, K, q):
    """Rows of a chunk of :func:`block_statistics`: its shifted rows and weighted
    posterior means within ``_CHUNK_BYTES``, but at least ``_MIN_PRODUCT_ROWS`` (the
    inner dimension of the products that update the ``(d, K q)`` sums)."""
    rows = _CHUNK_BYTES // (8 * (d + K * q) + 1)
    return int(max(1, min(n, max(rows, _MIN_PRODUCT_ROWS))))


def _statistics_chunks(X, proj, resp, cholesky_inv, sum_z, sum_zz):
    """Yield ``(r0, r1, Y, rE)`` over row chunks of the block: ``Y = x - shift``
    (float64, C-ordered) and ``rE = r e`` (``(r1 - r0, K, q)``), each chunk's
    ``sum r e`` and ``sum r e e^T`` added to ``sum_z`` and ``sum_zz`` (two buffers,
    overwritten by the next chunk: no ``(n, K, q)`` array besides ``P``)."""
    n, d = X.shape
    _, K, q = proj.P.shape
    rows = _statistics_rows(n, d, K, q)
    y_buf = np.empty((min(rows, n), d))
    e_buf = np.empty((min(rows, n), K, q))
    for r0 in range(0, n, rows):
        r1 = min(r0 + rows, n)
        Y, E = y_buf[:r1 - r0], e_buf[:r1 - r0]
        np.subtract(X[r0:r1], proj.shift, out=Y, dtype=np.float64, casting="unsafe")
        _weighted_means(proj.P[r0:r1], resp[r0:r1], cholesky_inv, E, sum_z, sum_zz)
        yield r0, r1, Y, E


def _weighted_means(P, resp, cholesky_inv, out, sum_z, sum_zz):
    """``out = r e`` (``(n, K, q)``) from projections ``P`` (``e = p L^{-1}`` per
    component), with ``sum r e`` added to ``sum_z`` and ``sum r e e^T`` to ``sum_zz``
    (``s = sqrt(r) e``: ``s^T s``, then ``r e = sqrt(r) s``)."""
    np.matmul(np.swapaxes(P, 0, 1), cholesky_inv, out=np.swapaxes(out, 0, 1))
    root = np.sqrt(resp)[:, :, None]
    out *= root
    sum_zz += np.matmul(np.transpose(out, (1, 2, 0)), np.swapaxes(out, 0, 1))
    out *= root
    sum_z += out.sum(axis=0)
    return out


def _centred_sums(X, r, center, P, cholesky_inv):
    """``sum r u``, ``sum r u^2`` and ``sum r u e^T`` (``u = x - c``, ``e = p
    L^{-1}``) of one component from ``x - c`` directly, over its rows with ``r > 0``
    by chunks of ``_CHUNK_BYTES`` (where the expansion around the shift cancels)."""
    d, q = X.shape[1], cholesky_inv.shape[0]
    sum_x, sum_xx, sum_xz = np.zeros(d), np.zeros(d), np.zeros((d, q))
    rows = np.flatnonzero(r > 0.0)
    step = int(max(16, _CHUNK_BYTES // (8 * max(d, 1))))
    for c0 in range(0, len(rows), step):
        chunk = rows[c0:c0 + step]
        diff = np.subtract(X[chunk], center, dtype=np.float64)
        rE = (P[chunk] @ cholesky_inv) * r[chunk, None]
        sum_x += r[chunk] @ diff
        sum_xz += diff.T @ rE
        diff *= diff
        sum_xx += r[chunk] @ diff
    return sum_x, sum_xx, sum_xz


def m_step(stats, centers, reg_covar):
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

    The noise variances are floored: ``psi = max(psi_raw, 0) + reg_covar``, so
    ``psi >= reg_covar`` (``reg_covar`` on the diagonal of ``Sigma_k``, as the other
    types add it). With ``q = 0`` this is the 'diag' M step.

    Parameters
    ----------
    stats : FactorStatistics
        Summed over all rows.
    centers : ndarray of shape (K, d)
        The centres the statistics were accumulated around.
    reg_covar : float

    Returns
    -------
    weights : ndarray of shape (K,)
    means : ndarray of shape (K, d)
    loadings : ndarray of shape (K, d, q)
    noise_variance : ndarray of shape (K, d)
    """
    eps10 = 10 * np.finfo(np.float64).eps
    nk = stats.nk + eps10
    K, _d, q = stats.sum_xz.shape
    omega = np.empty((K, q + 1, q + 1))
    omega[:, :q, :q] = stats.sum_zz
    omega[:, np.arange(q), np.arange(q)] += eps10
    omega[:, :q, q] = stats.sum_z
    omega[:, q, :q] = stats.sum_z
    omega[:, q, q] = nk
    rhs = np.concatenate([np.swapaxes(stats.sum_xz, 1, 2), stats.sum_x[:, None, :]],
                         axis=1)                               # (K, q + 1, d)
    aug = np.linalg.solve(omega, rhs)                          # [W, m]^T
    loadings = np.ascontiguousarray(np.swapaxes(aug[:, :q], 1, 2))
    shift = aug[:, q]
    explained = np.einsum("kdq,kdq->kd", loadings, stats.sum_xz) + shift * stats.sum_x
    noise = np.maximum((stats.sum_xx - explained) / nk[:, None], 0.0) + reg_covar
    means = np.asarray(centers, dtype=np.float64) + shift
    return nk / nk.sum(), means, loadings, noise


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
    compute dtype, its projections (``K q`` float64) and six ``(n, K)`` float64
    arrays (the diagonal distances and their rounding bounds, the log-densities,
    the responsibilities and the E step's temporaries). The shifted rows, their
    squares and the weighted posterior means are formed by row chunks
    (``_CHUNK_BYTES``, at least ``_MIN_PRODUCT_ROWS`` rows), a few per thread
    whatever the block."""
    d, K, q = n_features, n_components, n_factors
    return d * itemsize + K * q * 8 + 6 * K * 8


def statistics_nbytes(n_components, n_features, n_factors):
    """Bytes of one set of :class:`FactorStatistics` (float64)."""
    K, d, q = n_components, n_features, n_factors
    return 8 * (K + 2 * K * d + K * d * q + K * q + K * q * q)
