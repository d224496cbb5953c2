"""A certified screen of the 'full' E step: only the pairs that may reach the
responsibility threshold are computed.

For any ``Q`` (``d x p``, orthonormal columns), ``||z Q|| <= ||z||``: with ``z =
(x - mu_k) U_k`` and ``B_k = U_k Q_k``, ``||(x - mu_k) B_k||^2`` is a lower bound of
the squared Mahalanobis distance ``m_ik`` (it is the Mahalanobis distance of the
marginal of ``N(mu_k, Lambda_k^-1)`` along the columns of ``B_k``). One GEMM of a
block's rows against ``[B_1, ..., B_K]`` (``n K d p`` flops, against ``n K d^2`` for
every distance) bounds every pair's weighted log-density ``a_ik = log w_k + log
N(x_i | mu_k, Lambda_k)`` from above by ``ub_ik``. Per row the pair of largest bound
is computed exactly (``v_i <= max_k a_ik``); a pair with ``ub_ik < v_i - margin`` has
``r_ik < exp(-margin)``: it is set to ``-inf`` (responsibility exactly 0; with the
margin of :func:`~emgmm.covariance.log_density.relevance_margin` it lies below
``resp_threshold``, which leaves it out of the statistics anyway); the others are
computed exactly, gathered per
component (one product each). The screen keeps no state between blocks or
iterations.

``Q_k`` holds the leading right singular vectors of ``(M - mu_k) U_k`` for ``M`` the
other components' means (where the other clusters lie in component ``k``'s metric),
from a few steps of subspace iteration (Halko, Martinsson and Tropp, *Finding
structure with randomness*, SIAM Review 53, 2011, Alg. 4.4). Only the tightness of
the bound depends on them, never its validity: rounding is bounded rigorously
(Higham, *Accuracy and Stability of Numerical Algorithms*, 2002, eq. 3.5).

Pure functions of one block of rows and the model parameters they are given.
Notation as in :mod:`emgmm.covariance.log_density`.
"""

from dataclasses import dataclass

import numpy as np

from ..runtime.blas import single_blas_thread
from ..runtime.gather import GatherBuffers
from ..runtime.workspace import borrow
from .cholesky import log_det_cholesky
from .log_density import _LOG_2PI, _gamma, _shift, chunk_rows

#: Directions ``p`` per component. On sample-image patches fitted by emgmm
#: (K=200; 30x30: K=100), pairs per row surviving for p = 4/8/16: 8x8 13.2/9.9/7.6
#: (4.8 needed), 14x14 1.76/1.55/1.36 (1.01), 30x30 1.00/1.00/1.00 (1.00): per row,
#: the projections cost 2 K d p flops and each surviving pair 2 d^2, so p = 4 does
#: least work at each of these sizes.
SCREEN_DIRECTIONS = 4
#: Steps of subspace iteration for ``Q_k``, and the extra columns they carry.
_SUBSPACE_STEPS = 2
_OVERSAMPLE = 4
#: The screen probes this many rows first; where more than ``_MAX_DENSITY`` of their
#: pairs survive beyond one per row (broad components: the first iterations), the
#: block takes the dense path, whose triangular products cost about half as much
#: per pair as the gathered ones.
_PROBE_ROWS = 512
_MAX_DENSITY = 0.3
#: Bytes of a row chunk of the projections ``(rows, K p)``.
_PROJECTION_BYTES = 8 * 2**20
_U64 = np.finfo(np.float64).eps / 2


def leading_directions(means, u, p, seed=0):
    """``Q`` (K, d, p'), orthonormal columns (``p' = min(p, d)``): for each component
    ``k`` the leading right singular vectors of ``A_k = (M - mu_k) U_k``, ``M`` the
    means of the other components, by ``_SUBSPACE_STEPS`` steps of subspace
    iteration on ``A_k^T A_k`` from a seeded Gaussian start, then Rayleigh-Ritz.

    ``A_k`` is never formed: each step costs ``4 d^2 (p + _OVERSAMPLE)`` flops (two
    products with ``U_k``) plus ``4 K d (p + _OVERSAMPLE)``.

    Parameters
    ----------
    means : ndarray of shape (K, d), float64
    u : ndarray of shape (K, d, d), float64
        Upper-triangular precision factors.
    p : int
    seed : int, default=0

    Returns
    -------
    Q : ndarray of shape (K, d, min(p, d)), float64
    """
    K, d = means.shape
    p = min(p, d)
    width = min(p + _OVERSAMPLE, d)
    rng = np.random.default_rng(seed)
    start = rng.standard_normal((d, width))
    Q = np.empty((K, d, p))
    with single_blas_thread():
        for k in range(K):
            Q[k] = _leading(means, u, k, start, p)
    return Q


def _leading(means, u, k, start, p):
    """``Q_k`` of :func:`leading_directions`."""
    G = np.delete(means, k, axis=0) - means[k]

    def gram(V, uk=u[k]):
        return uk.T @ (G.T @ (G @ (uk @ V)))

    V = np.linalg.qr(start)[0]
    for _ in range(_SUBSPACE_STEPS):
        V = np.linalg.qr(gram(V))[0]
    T = V.T @ gram(V)
    _, vectors = np.linalg.eigh(0.5 * (T + T.T))
    return np.linalg.qr(V @ vectors[:, ::-1][:, :p])[0]


@dataclass
class ProjectionScreen:
    """The screen's work on the model, shared by every block of a pass.

    ``B`` (d, p K) holds ``fl(U_k Q_k)`` (column ``q K + k`` is column ``q`` of
    component ``k``), ``c`` (p K,) ``fl((mu_k - g) B_k)`` in the same order, around
    the mixture mean ``g``. The bound of a pair
    (:meth:`upper_bounds`) uses, per component, ``q_norm >= ||Q_k||_2`` and
    ``err_coef``: with ``y = fl(x - g)`` and ``m_k = fl(mu_k - g)``, the computed
    ``t = fl(y B_k) - c_k`` is within ``err_coef[k] (||y|| + ||m_k||)`` of
    ``(x - mu_k) U_k Q_k`` (see :meth:`build`).
    """

    means: np.ndarray
    u: np.ndarray
    g: np.ndarray
    B: np.ndarray
    c: np.ndarray
    offset: np.ndarray
    err_coef: np.ndarray
    q_norm: np.ndarray
    m_norm: np.ndarray
    p: int

    @classmethod
    def build(cls, weights, means, precisions_cholesky, p=SCREEN_DIRECTIONS):
        """The screen of a 'full' model (``K d^2 p`` flops, plus
        :func:`leading_directions`).

        Rounding (Higham 2002, eq. 3.5; ``gamma = gamma_{d+2}``): ``fl(U_k Q_k) =
        U_k Q_k + E`` with ``||E||_2 <= gamma || |U_k| |Q_k| ||_F``; the products
        ``y B_k`` and ``m_k B_k`` are off by at most ``gamma ||y|| ||B_k||_F`` and
        ``gamma ||m_k|| ||B_k||_F``, their difference by ``u`` of it, and ``y - m_k``
        differs from ``x - mu_k`` by at most ``u (||y|| + ||m_k||)``, times
        ``||U_k Q_k||_2 <= ||B_k||_F + ||E||_2``. Together, with a factor 2 for the
        second-order terms and the rounding of the norms themselves:
        ``err_coef = 2 gamma (2 ||B_k||_F + || |U_k| |Q_k| ||_F)``. And
        ``||Q_k||_2^2 <= 1 + ||fl(Q_k^T Q_k) - I||_F + gamma_d p``.
        """
        means = np.asarray(means, dtype=np.float64)
        u = np.asarray(precisions_cholesky, dtype=np.float64)
        K, d = means.shape
        Q = leading_directions(means, u, p)
        p = Q.shape[2]
        g = _shift(means, weights)
        m = means - g
        B = np.empty((d, p, K))
        b_norm = np.empty(K)
        abs_norm = np.empty(K)
        gram_dev = np.empty(K)
        with single_blas_thread():
            for k in range(K):
                B[:, :, k] = u[k] @ Q[k]
                b_norm[k] = np.linalg.norm(B[:, :, k])
                abs_norm[k] = np.linalg.norm(np.abs(u[k]) @ np.abs(Q[k]))
                gram_dev[k] = np.linalg.norm(Q[k].T @ Q[k] - np.eye(p))
        c = np.einsum("kj,jqk->qk", m, B).reshape(p * K)
        B = B.reshape(d, p * K)
        gamma = _gamma(d + 2, np.float64)
        with np.errstate(divide="ignore"):
            offset = (np.log(np.asarray(weights, dtype=np.float64))
                      + log_det_cholesky(u, "full", d) - 0.5 * d * _LOG_2PI)
        q_norm = np.sqrt(1.0 + gram_dev + _gamma(d, np.float64) * p) * (1.0 + 4 * _U64)
        return cls(means=means, u=u, g=g, B=B, c=c, offset=offset,
                   err_coef=2.0 * gamma * (2.0 * b_norm + abs_norm), q_norm=q_norm,
                   m_norm=np.linalg.norm(m, axis=1), p=p)

    def upper_bounds(self, X, out):
        """Into ``out`` (n, K): per pair an upper bound of ``log w_k + log N(x_i |
        mu_k, Lambda_k)``, ``offset_k - 1/2 L_ik`` with ``L_ik`` a lower bound of
        ``m_ik`` (NaN where the data overflow; never too low otherwise).

        ``L_ik = ((sqrt(l (1 - gamma_{p+1})) - err_coef_k (||y_i|| + ||m_k||))_+ /
        q_norm_k)^2 (1 - 8u)`` with ``l = fl(sum_j t_j^2)``. Row chunks of
        ``_PROJECTION_BYTES``.
        """
        n, d = X.shape
        K, p = self.offset.size, self.p
        rows = chunk_rows(K * p, 8, n, _PROJECTION_BYTES)
        shrink = 1.0 - _gamma(p + 1, np.float64)
        out_t = out.T  # (K, n): contiguous rows for a column-major out
        err = self.err_coef[:, None]
        with borrow("screen_t", (rows * K * p,)) as T, \
                borrow("screen_y", (rows, d)) as Y, \
                np.errstate(over="ignore", invalid="ignore"):
            for r0 in range(0, n, rows):
                r1 = min(r0 + rows, n)
                y = np.subtract(X[r0:r1], self.g, out=Y[:r1 - r0])
                y_norm = np.sqrt(np.einsum("ij,ij->i", y, y))
                # (p K, rows) = B^T y^T: each direction's K components contiguous
                t = np.matmul(self.B.T, y.T, out=T[:(r1 - r0) * K * p]
                              .reshape(K * p, r1 - r0))
                t -= self.c[:, None]
                np.square(t, out=t)
                lo = out_t[:, r0:r1]
                np.copyto(lo, t[:K])
                for q in range(1, p):
                    lo += t[q * K:(q + 1) * K]
                lo *= shrink
                np.sqrt(lo, out=lo)
                lo -= err * (y_norm + self.m_norm[:, None])
                np.maximum(lo, 0.0, out=lo)
                lo /= self.q_norm[:, None]
                np.square(lo, out=lo)
                lo *= -0.5 * (1.0 - 8 * _U64)
                lo += self.offset[:, None]
        return out

    def weighted_refined(self, X, margin, out=None, max_density=_MAX_DENSITY):
        """``log w_k + log N(x | mu_k, Lambda_k)``: exact for every pair that may lie
        within ``margin`` nats of its row's best, ``-inf`` for the others (certified
        to lie more than ``margin`` below it).

        Parameters
        ----------
        X : ndarray of shape (n, d), float32 or float64
            The exact pairs are computed in float64 (float32 rows as they are).
        margin : float
        out : ndarray of shape (n, K), float64, column-major, or None
        max_density : float, default=_MAX_DENSITY (0.3)
            The screen refuses the block when more than this fraction of the pairs
            of its first ``_PROBE_ROWS`` rows, beyond one per row, survive.

        Returns
        -------
        weighted : ndarray of shape (n, K), float64, or None
            ``None`` when the screen refuses the block.
        """
        n, K = X.shape[0], self.offset.size
        weighted = np.empty((n, K), order="F") if out is None else out
        p = min(_PROBE_ROWS, n)
        if self._screen(X[:p], margin, weighted[:p], max_density) is None:
            return None
        self._screen(X[p:], margin, weighted[p:], np.inf)
        return weighted

    def _screen(self, X, margin, weighted, max_density):
        """:meth:`weighted_refined` of ``X`` into ``weighted``, or ``None`` when
        more than ``max_density`` of its pairs survive beyond one per row."""
        n = X.shape[0]
        K = self.offset.size
        if n == 0:
            return weighted
        ub = self.upper_bounds(X, weighted).T  # (K, n)
        rows = np.arange(n)
        top = np.argmax(ub, axis=0)
        order = np.argsort(top, kind="stable")
        best = np.empty(n)
        best[order] = exact_pairs(X, self.means, self.u, self.offset, top[order], order)
        with np.errstate(invalid="ignore"):
            limit = best - margin - 1e-9 * (np.abs(best) + margin)
        with borrow("screen_keep", (K, n), bool) as keep:
            np.less(ub, limit, out=keep)
            np.logical_not(keep, out=keep)  # NaN bounds or limits survive
            keep[top, rows] = False
            comps, kept = np.nonzero(keep)
            if comps.size > max_density * n * K:
                return None
            keep[top, rows] = True
            ub[~keep] = -np.inf
        ub[top, rows] = best
        ub[comps, kept] = exact_pairs(X, self.means, self.u, self.offset, comps, kept)
        return weighted


def exact_pairs(X, means, u, offset, comps, rows):
    """``offset_k - 1/2 ||(x_i - mu_k) U_k||^2`` of the pairs ``(rows[j], comps[j])``,
    sorted by component: each component's rows gathered, centred in float64 and
    multiplied by ``U_k`` (one numpy product per component, on one BLAS thread: it
    releases the GIL, scipy's ``trmm`` does not).

    Parameters
    ----------
    X : ndarray of shape (n, d)
    means : ndarray of shape (K, d), float64
    u : ndarray of shape (K, d, d), float64
    offset : ndarray of shape (K,)
        ``log w_k + log det U_k - d/2 log(2 pi)``.
    comps, rows : ndarray of int, shape (m,)

    Returns
    -------
    values : ndarray of shape (m,), float64
    """
    K = means.shape[0]
    bounds = np.searchsorted(comps, np.arange(K + 1))
    counts = np.diff(bounds)
    size = counts.max(initial=0)
    values = np.empty(comps.size)
    with single_blas_thread(), GatherBuffers.borrowed(X, size) as gather, \
            borrow("gather_products", (size, X.shape[1])) as zbuf:
        for k in np.flatnonzero(counts):
            b0, b1 = bounds[k], bounds[k + 1]
            z = np.matmul(gather.centred(rows[b0:b1], means[k]), u[k],
                          out=zbuf[:b1 - b0])
            q = np.einsum("ij,ij->i", z, z, out=values[b0:b1])
            q *= -0.5
            q += offset[k]
    return values
