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
margin of :func:`~emgmm.covariance._log_density.relevance_margin` it lies below
``resp_threshold``, which leaves it out of the statistics anyway); the others are
computed exactly, gathered per
component (one product each). The rows schedule builds a screen for each pass
(:meth:`ProjectionScreen.build`); the pairs schedule keeps its arrays across
iterations and starts each component's directions from the previous model's
(:func:`component_screen`'s ``start``).

``Q_k`` holds the leading right singular vectors of ``(M - mu_k) U_k`` for ``M`` the
other components' means (where the other clusters lie in component ``k``'s metric),
from a few steps of subspace iteration (Halko, Martinsson and Tropp, *Finding
structure with randomness*, SIAM Review 53, 2011, Alg. 4.4). Only the tightness of
the bound depends on them, never its validity: rounding is bounded rigorously
(Higham, *Accuracy and Stability of Numerical Algorithms*, 2002, eq. 3.5).

Pure functions of one block of rows and the model parameters they are given.
Notation as in :mod:`emgmm.covariance._log_density`.
"""

from dataclasses import dataclass

import numpy as np

from .._runtime.blas import over_ranges, single_blas_thread, threads_for_loop
from .._runtime.gather import GatherBuffers
from .._runtime.lapack import trmm_left_lower
from .._runtime.workspace import borrow
from ._log_density import _LOG_2PI, _gamma, _shift, chunk_rows

#: Whether the screen rejects pairs (read at every call): ``False`` makes it
#: reject none, so that every pair is computed as the unscreened E step computes it
#: (the oracle of the tests of the screen).
ENABLED = True
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
#: Bytes of a row chunk of the projections ``(rows, K p)`` and of the shifted rows
#: ``(rows, d)`` together.
_PROJECTION_BYTES = 8 * 2**20
_U64 = np.finfo(np.float64).eps / 2


def _seeded_start(d, width, seed):
    """The seeded Gaussian ``(d, width)`` start of the subspace iterations."""
    return np.random.default_rng(seed).standard_normal((d, width))


@dataclass
class ComponentTerms:
    """What the screen keeps of one component (:func:`component_screen`): ``Q``
    (d, p) its directions; ``B`` (d, p) ``~= U_k Q``; ``c`` (p,) ``fl((mu_k - g)
    B)``; ``err_coef``, ``q_norm`` and ``m_norm`` of the bound of
    :meth:`ProjectionScreen.upper_bounds`; ``u_norm >= ||U_k||_F`` for the bound
    of :func:`exact_pairs`; ``log_det`` ``sum_j log U_k[j, j]`` and
    ``log_det_err`` a bound of its rounding."""

    Q: np.ndarray
    B: np.ndarray
    c: np.ndarray
    err_coef: float
    q_norm: float
    m_norm: float
    u_norm: float
    log_det: float
    log_det_err: float


def factor_norms(uk):
    """``(u_norm, log_det, log_det_err)`` of the factor ``uk`` (d, d): an upper
    bound of ``||U_k||_F``, ``sum_j log U_k[j, j]`` and a bound of its rounding."""
    d = uk.shape[0]
    u_norm = np.sqrt(np.einsum("ij,ij->", uk, uk)) * (1.0 + _gamma(d * d + 2,
                                                                   np.float64))
    diag = np.log(np.diagonal(uk))
    return u_norm, diag.sum(), _gamma(d, np.float64) * np.abs(diag).sum()


def component_screen(uk, centres, mean_k, g, p=SCREEN_DIRECTIONS, start=None,
                     steps=_SUBSPACE_STEPS, seed=0, norms=None):
    """:class:`ComponentTerms` of the component with factor ``uk`` (d, d) and mean
    ``mean_k`` (d,), around the shift ``g`` (d,).

    The directions ``Q`` span the leading right singular vectors of ``A = (C -
    mu_k) U_k``, ``C`` the rows of ``centres`` (where the other clusters lie; a
    row equal to ``mu_k`` adds nothing): ``steps`` steps of subspace iteration on
    ``A^T A`` (Halko, Martinsson and Tropp 2011, Alg. 4.4) from ``start`` (the
    previous model's, completed by a seeded Gaussian start to ``p +
    _OVERSAMPLE`` columns), then Rayleigh-Ritz, ``Q = V W``. ``A`` is never formed:
    each product with ``A^T A`` is two triangular products with ``U_k`` that release
    the GIL, and ``B = fl(fl(U_k V) W)`` reuses the first of the Rayleigh-Ritz
    step's (``2 (steps + 1)`` passes over ``U_k`` in all).

    Rounding (Higham 2002, eq. 3.5): ``B`` is within ``e_B = gamma_{d+w+2} (2
    ||U_k||_F ||V||_F ||W||_F + ||fl(U_k V)||_F ||W||_F)`` of ``U_k Q`` (``w``
    columns); ``t = fl(y B) - c`` is then within ``err_coef (||y|| + ||m_k||)``
    of ``(x - mu_k) U_k Q`` with ``err_coef = 2 (2 gamma_{d+2} ||B||_F + e_B)``
    (``y = fl(x - g)``, ``m_k = fl(mu_k - g)``, the factor 2 for second-order
    terms and the norms' own rounding). And ``||Q||_2^2 <= 1 + ||fl(Q^T Q) -
    I||_F + gamma_d p``.

    ``norms``: :func:`factor_norms` of ``uk`` when the caller has them.
    """
    d = uk.shape[0]
    p = min(p, d)
    width = min(p + _OVERSAMPLE, d)
    V = _seeded_start(d, width, seed)
    if start is not None:
        V[:, :start.shape[1]] = start
    G = centres - mean_k
    a = np.asfortranarray(uk.T)  # U_k^T, lower triangular

    def times_u(V):
        return trmm_left_lower(a, np.array(V, order="F"), transpose=True)

    def gram(UV):
        """``U_k^T G^T G (U_k V)``."""
        return trmm_left_lower(a, np.asfortranarray(G.T @ (G @ UV)))

    V = np.linalg.qr(V)[0]
    for _ in range(steps):
        V = np.linalg.qr(gram(times_u(V)))[0]
    UV = times_u(V)
    T = V.T @ gram(UV)
    _, vectors = np.linalg.eigh(0.5 * (T + T.T))
    W = vectors[:, ::-1][:, :p]
    Q = V @ W
    B = UV @ W
    u_norm, log_det, log_det_err = factor_norms(uk) if norms is None else norms
    w_norm = np.linalg.norm(W)
    e_b = _gamma(d + width + 2, np.float64) * w_norm * (
        2.0 * u_norm * np.linalg.norm(V) + np.linalg.norm(UV))
    gram_dev = np.linalg.norm(Q.T @ Q - np.eye(p))
    m = mean_k - g
    return ComponentTerms(
        Q=Q, B=B, c=m @ B,
        err_coef=2.0 * (2.0 * _gamma(d + 2, np.float64) * np.linalg.norm(B) + e_b)
        * (1.0 + 1e-6),
        q_norm=np.sqrt(1.0 + gram_dev + _gamma(d, np.float64) * p) * (1.0 + 4 * _U64),
        m_norm=np.linalg.norm(m), u_norm=u_norm, log_det=log_det,
        log_det_err=log_det_err)


def screen_offsets(weights, log_det, log_det_err, d):
    """``offset_k = log w_k + log det U_k - d/2 log(2 pi)`` and a bound of its
    rounding (the log-determinant's, and ``gamma_3`` of the sum)."""
    with np.errstate(divide="ignore"):
        log_w = np.log(np.asarray(weights, dtype=np.float64))
    const = 0.5 * d * _LOG_2PI
    offset = log_w + log_det - const
    err = log_det_err + _gamma(4, np.float64) * (
        np.where(np.isfinite(log_w), np.abs(log_w), 0.0) + np.abs(log_det) + const)
    return offset, err


@dataclass
class ProjectionScreen:
    """The screen's work on the model, shared by every block of a pass.

    ``B`` (d, p K) holds ``fl(U_k Q_k)`` (column ``q K + k`` is column ``q`` of
    component ``k``), ``c`` (p K,) ``fl((mu_k - g) B_k)`` in the same order, around
    the mixture mean ``g``. The bound of a pair
    (:meth:`upper_bounds`) uses, per component, ``q_norm >= ||Q_k||_2`` and
    ``err_coef``: with ``y = fl(x - g)`` and ``m_k = fl(mu_k - g)``, the computed
    ``t = fl(y B_k) - c_k`` is within ``err_coef[k] (||y|| + ||m_k||)`` of
    ``(x - mu_k) U_k Q_k`` (:func:`component_terms`). ``offset_err[k]`` bounds the
    rounding of ``offset[k]``, ``u_norm[k] >= ||U_k||_F`` that of the exact pairs
    (:func:`exact_pairs`); ``directions`` (K, d, p) are the ``Q_k`` (the start of
    the next model's). Its arrays can be views of memory shared with other
    processes (:meth:`from_arrays`).
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
    u_norm: np.ndarray | None = None
    offset_err: np.ndarray | None = None
    log_det: np.ndarray | None = None
    log_det_err: np.ndarray | None = None
    directions: np.ndarray | None = None

    @staticmethod
    def shapes(n_components, n_features, p=SCREEN_DIRECTIONS):
        """The arrays of a screen by name, as ``{name: shape}`` (float64)."""
        K, d, p = n_components, n_features, min(p, n_features)
        per_component = ("offset", "offset_err", "err_coef", "q_norm", "m_norm",
                         "u_norm", "log_det", "log_det_err")
        return {"B": (d, p, K), "c": (p, K), "directions": (K, d, p), "g": (d,),
                **{name: (K,) for name in per_component}}

    @classmethod
    def from_arrays(cls, means, u, arrays):
        """A screen over ``arrays`` (of :meth:`shapes`; kept as views, so that what
        :meth:`set_component` and :meth:`set_offsets` write lands in them)."""
        d, p, K = arrays["B"].shape
        fields = {name: arrays[name] for name in cls.shapes(K, d, p)
                  if name not in ("B", "c")}
        return cls(means=means, u=u, B=arrays["B"].reshape(d, p * K),
                   c=arrays["c"].reshape(p * K), p=p, **fields)

    def set_component(self, k, terms):
        """Store the :class:`ComponentTerms` of component ``k``."""
        d, K = self.B.shape[0], self.offset.size
        self.directions[k] = terms.Q
        self.B.reshape(d, self.p, K)[:, :, k] = terms.B
        self.c.reshape(self.p, K)[:, k] = terms.c
        for name in ("err_coef", "q_norm", "m_norm", "u_norm", "log_det",
                     "log_det_err"):
            getattr(self, name)[k] = getattr(terms, name)

    def set_components(self, terms, threads=1):
        """:meth:`set_component` of ``terms(k)`` for every component, ranges of
        components in ``threads`` threads (one BLAS thread each)."""
        def fill(k0, k1):
            for k in range(k0, k1):
                self.set_component(k, terms(k))

        over_ranges(fill, self.offset.size, threads)

    def set_offsets(self, weights):
        """``offset`` and ``offset_err`` from the weights and the stored
        log-determinants (:func:`screen_offsets`)."""
        d = self.B.shape[0]
        self.offset[:], self.offset_err[:] = screen_offsets(
            weights, self.log_det, self.log_det_err, d)

    @classmethod
    def build(cls, weights, means, precisions_cholesky, p=SCREEN_DIRECTIONS):
        """The screen of a 'full' model: :func:`component_screen` of every
        component, its directions from a seeded start (``K d^2 (p + _OVERSAMPLE)
        (_SUBSPACE_STEPS + 1)`` flops)."""
        means = np.asarray(means, dtype=np.float64)
        u = np.asarray(precisions_cholesky, dtype=np.float64)
        K, d = means.shape
        arrays = {name: np.empty(shape)
                  for name, shape in cls.shapes(K, d, p).items()}
        screen = cls.from_arrays(means, u, arrays)
        screen.g[:] = _shift(means, weights)
        screen.set_components(
            lambda k: component_screen(u[k], means, means[k], screen.g, p),
            threads_for_loop(K * d * d * (p + _OVERSAMPLE) * (_SUBSPACE_STEPS + 1)))
        screen.set_offsets(weights)
        return screen

    def upper_bounds(self, X, out, roots=None):
        """Into ``out`` (n, K): per pair an upper bound of ``log w_k + log N(x_i |
        mu_k, Lambda_k)``, ``offset_k - 1/2 L_ik`` with ``L_ik`` a lower bound of
        ``m_ik`` (NaN where the data overflow; never too low otherwise); into
        ``roots`` (n, K), when given, the :meth:`root_bounds` of the same products.

        ``L_ik = r_ik^2 (1 - 8u)`` with ``r_ik = (sqrt(l (1 - gamma_{p+1})) -
        err_coef_k (||y_i|| + ||m_k||))_+ / q_norm_k`` and ``l = fl(sum_j t_j^2)``.
        Row chunks of ``_PROJECTION_BYTES``.
        """
        for r0, r1, lo in self._roots(X, out):
            if roots is not None:
                np.multiply(lo, 1.0 - 8 * _U64, out=roots.T[:, r0:r1])
            np.square(lo, out=lo)
            lo *= -0.5 * (1.0 - 8 * _U64)
            lo += self.offset[:, None]
        return out

    def root_bounds(self, X, out):
        """Into ``out`` (n, K): per pair a lower bound of the Mahalanobis distance
        ``sqrt(m_ik)``, ``r_ik (1 - 8u)`` (:meth:`upper_bounds`)."""
        for _, _, lo in self._roots(X, out):
            lo *= 1.0 - 8 * _U64
        return out

    def _roots(self, X, out):
        """Fill ``out`` (n, K) with the ``r_ik`` of :meth:`upper_bounds` chunk by
        chunk, yielding each chunk's rows ``r0, r1`` and (K, rows) view of ``out.T``
        once written."""
        n, d = X.shape
        K, p = self.offset.size, self.p
        # (both work arrays: the projections and the shifted rows, (rows, d), which
        # at d=10k, K=20 were a whole block per thread)
        rows = chunk_rows(K * p + d, 8, n, _PROJECTION_BYTES)
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
                yield r0, r1, lo

    def subset(self, comps):
        """The screen of components ``comps`` only (copies), for
        :meth:`upper_bounds` and :meth:`root_bounds` (not for exact pairs)."""
        d, K = self.B.shape[0], self.offset.size
        comps = np.asarray(comps, dtype=np.intp)
        per_component = {name: getattr(self, name)[comps] for name in (
            "offset", "err_coef", "q_norm", "m_norm", "u_norm", "offset_err",
            "log_det", "log_det_err")}
        return ProjectionScreen(
            means=np.asarray(self.means[comps]), u=None, g=np.array(self.g),
            B=np.ascontiguousarray(self.B.reshape(d, self.p, K)[:, :, comps]
                                   .reshape(d, self.p * comps.size)),
            c=np.ascontiguousarray(self.c.reshape(self.p, K)[:, comps].ravel()),
            p=self.p, **per_component)

    def weighted_refined(self, X, margin, out=None, max_density=_MAX_DENSITY,
                         roots=None):
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
        roots : ndarray of shape (n, K), column-major, or None
            Where to write the pairs' :meth:`root_bounds` too (from the same
            projections; complete only when the block is not refused).

        Returns
        -------
        weighted : ndarray of shape (n, K), float64, or None
            ``None`` when the screen refuses the block.
        """
        if not ENABLED:
            return None
        n, K = X.shape[0], self.offset.size
        weighted = np.empty((n, K), order="F") if out is None else out
        p = min(_PROBE_ROWS, n)
        part = (None, None) if roots is None else (roots[:p], roots[p:])
        if self._screen(X[:p], margin, weighted[:p], max_density, part[0]) is None:
            return None
        self._screen(X[p:], margin, weighted[p:], np.inf, part[1])
        return weighted

    def rejection_limit(self, best, err, top, margin):
        """Per row, the bound below which a pair's :meth:`upper_bounds` proves it
        more than ``margin`` nats below the row's best pair: ``best`` (the computed
        value of pair ``top``) less its rounding bound ``err``, the offsets'
        roundings and ``margin``, with room for this sum's own rounding."""
        if not ENABLED:
            return np.full(np.shape(best), -np.inf)
        slack = err + self.offset_err[top] + self.offset_err.max(initial=0.0)
        return best - slack - margin - 1e-9 * (np.abs(best) + margin)

    def _screen(self, X, margin, weighted, max_density, roots=None):
        """:meth:`weighted_refined` of ``X`` into ``weighted`` (and ``roots``), or
        ``None`` when more than ``max_density`` of its pairs survive beyond the
        ``first_pairs`` per row computed first."""
        n = X.shape[0]
        K = self.offset.size
        if n == 0:
            return weighted
        ub = self.upper_bounds(X, weighted, roots).T  # (K, n)
        rows = np.arange(n)
        first = self._first_pairs(ub)
        values, err = self._exact_first(X, first)
        best_of = np.argmax(values, axis=0)
        top = first[best_of, rows]
        best, err = values[best_of, rows], err[best_of, rows]
        with np.errstate(invalid="ignore"):
            limit = self.rejection_limit(best, err, top, margin)
        with borrow("screen_keep", (K, n), bool) as keep:
            np.less(ub, limit, out=keep)
            np.logical_not(keep, out=keep)  # NaN bounds or limits survive
            keep[first, rows] = False
            comps, kept = np.nonzero(keep)
            if comps.size > max_density * n * K:
                return None
            keep[first, rows] = True
            ub[~keep] = -np.inf
        ub[first, rows] = values
        ub[comps, kept] = self.exact(X, comps, kept)
        return weighted

    #: Pairs per row computed before the rejection limit is set: the best of them
    #: sets it (more than one where the bounds often misrank a row's best).
    first_pairs = 1

    def _first_pairs(self, ub):
        """``(c, n)`` components of each row's ``c = first_pairs`` largest bounds
        (``ub`` (K, n); a NaN bound counts as the largest)."""
        c = min(self.first_pairs, ub.shape[0])
        if c == 1:
            return np.argmax(ub, axis=0)[None]
        key = np.where(np.isnan(ub), -np.inf, -ub)
        return np.argpartition(key, c - 1, axis=0)[:c]

    def _exact_first(self, X, first):
        """Values and rounding bounds (both ``(c, n)``) of the pairs ``first``."""
        c, n = first.shape
        comps = first.ravel()
        order = np.argsort(comps, kind="stable")
        values, err = np.empty(c * n), np.empty(c * n)
        values[order], err[order] = self.exact(X, comps[order],
                                               np.tile(np.arange(n), c)[order], True)
        return values.reshape(c, n), err.reshape(c, n)

    def exact(self, X, comps, rows, errors=False):
        """:func:`exact_pairs` of the pairs ``(rows[j], comps[j])`` (sorted by
        component); with ``errors``, their rounding bounds too."""
        return exact_pairs(X, self.means, self.u, self.offset, comps, rows,
                           self.u_norm if errors else None)


def exact_pairs(X, means, u, offset, comps, rows, u_norm=None):
    """``offset_k - 1/2 ||(x_i - mu_k) U_k||^2`` of the pairs ``(rows[j], comps[j])``,
    sorted by component: each component's rows gathered, centred in float64 and
    multiplied by ``U_k`` (:func:`pair_values`: one triangular product per component
    that releases the GIL, on one BLAS thread).

    Parameters
    ----------
    X : ndarray of shape (n, d)
    means : ndarray of shape (K, d), float64
    u : ndarray of shape (K, d, d), float64
    offset : ndarray of shape (K,)
        ``log w_k + log det U_k - d/2 log(2 pi)``.
    comps, rows : ndarray of int, shape (m,)
    u_norm : ndarray of shape (K,) or None, default=None
        Upper bounds of ``||U_k||_F``: then the rounding bounds of the values are
        returned too.

    Returns
    -------
    values : ndarray of shape (m,), float64
    errors : ndarray of shape (m,), float64
        Only with ``u_norm``: ``|values - exact| <= errors`` (:func:`pair_values`).
    """
    K = means.shape[0]
    bounds = np.searchsorted(comps, np.arange(K + 1))
    counts = np.diff(bounds)
    size = counts.max(initial=0)
    values = np.empty(comps.size)
    errors = None if u_norm is None else np.empty(comps.size)
    with single_blas_thread(), GatherBuffers.borrowed(X, size) as gather:
        for k in np.flatnonzero(counts):
            b0, b1 = bounds[k], bounds[k + 1]
            y = gather.centred(rows[b0:b1], means[k])
            pair_values(y, u[k], offset[k], values[b0:b1],
                        None if u_norm is None else u_norm[k],
                        None if errors is None else errors[b0:b1])
    return values if errors is None else (values, errors)


def pair_values(y, uk, offset_k, out, u_norm_k=None, errors=None):
    """``offset_k - 1/2 ||y U_k||^2`` per row of the centred rows ``y`` (m, d)
    (``y = fl(x - mu_k)``, float64, C-ordered; overwritten by ``y U_k``) into
    ``out`` (m,); with ``u_norm_k >= ||U_k||_F``, a bound of each value's rounding
    into ``errors`` (m,).

    The bound (Higham 2002, eq. 3.5, for any order of summation): ``z = fl(y U_k)``
    is within ``e = gamma_{d+1} ||y|| ||U_k||_F`` of ``(x - mu_k) U_k`` (the
    rounding of ``y`` included), and ``fl(||z||^2) = ||z||^2 (1 + theta)``,
    ``|theta| <= gamma_d``; so the distance is within ``2 e sqrt(M) + e^2 +
    gamma_d M`` of the computed ``m`` (``M = m / (1 - gamma_d)``), half of it in
    ``log N``, plus ``2u |value|`` for the final subtraction.
    """
    m, d = y.shape
    if m == 0:
        return out
    norms = None
    if errors is not None:
        norms = np.sqrt(np.einsum("ij,ij->i", y, y))
    trmm_left_lower(np.asfortranarray(uk.T), y.T)  # y := y U_k (column-major views)
    np.einsum("ij,ij->i", y, y, out=out)
    if errors is not None:
        gamma_d = _gamma(d, np.float64)
        e = _gamma(d + 1, np.float64) * u_norm_k * norms * (1.0 + _gamma(d + 4,
                                                                        np.float64))
        upper = out / (1.0 - gamma_d)
        errors[:] = 0.5 * (2.0 * e * np.sqrt(upper) + e * e + gamma_d * upper)
    out *= -0.5
    out += offset_k
    if errors is not None:
        errors += 2.0 * _U64 * np.abs(out)
        errors *= 1.0 + 1e-6  # (the rounding of the bound's own arithmetic)
    return out
