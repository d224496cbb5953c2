"""The refined E step of 'full': a packed estimate of every pair's log-density with a
rigorous rounding bound, and the exact recomputation of the pairs that matter.

Pure functions of one block of rows and the model parameters they are given: none
keeps state, reads files or starts workers (the orchestration lives in
:mod:`emgmm._engine`). Notation as in :mod:`emgmm.covariance._log_density`.

Tuning constant: ``BOUND_CHUNK_BYTES`` (bytes of one chunk of the rounding bounds and
of the candidate pairs' indices), read at every call like those of
:mod:`~emgmm.covariance._log_density`.
"""

import abc
from dataclasses import dataclass

import numpy as np

from .._runtime.workspace import borrow
from . import _log_density as log_density
from ._base import get_covariance_type
from ._cholesky import log_det_cholesky
from ._log_density import (
    _LOG_2PI,
    _REFINE_TOL,
    _full_maha_dense,
    _full_maha_packed,
    _gamma,
    _packed_weights,
    _representable,
    _shift,
    _use_packed,
    chunk_rows,
)
from ._screen import ProjectionScreen, exact_pairs

# The refined E step probes this many rows first; if more than _REFINE_MAX_DENSITY of
# their pairs, beyond one per row, would need the exact recomputation (broad
# components, ill-conditioned precisions), the block takes the plain path of
# log_gaussian_prob instead.
_REFINE_PROBE_ROWS = 512
_REFINE_MAX_DENSITY = 0.3
# RefinedEstimate.to_refine: while every row's uniform bound (at least each of its
# pairs' bounds) is at most _UNIFORM_BOUND nats, as in float64, one comparison with the
# row's best estimate finds the candidates, a fraction of the cost of every bound;
# beyond, every bound is evaluated, in row chunks of BOUND_CHUNK_BYTES per work array.
# The candidates are then taken a chunk of components at a time (BOUND_CHUNK_BYTES
# per array of their indices and bounds): while the components are broad (the first
# pass) nearly every pair is a candidate, and all at once their indices and bounds
# would take several times the block's own (n, K) arrays.
_UNIFORM_BOUND = 1.0
BOUND_CHUNK_BYTES = 2**20
# RefinedEstimate.beyond_range: relative room between the float64 norm of x - g and
# the estimate's own (float32 x - g is within 2^-24 relative per feature)
_BEYOND_RANGE_ROOM = 1e-6
# RefinedEstimate._bounds: every component, as a (K, 1) column
_EACH_COMPONENT = (slice(None), None)
_U64 = np.finfo(np.float64).eps / 2


#: Power iterations behind :func:`_abs_spectral_bound` (4 gave within 0.4% of the
#: spectral radius on fitted 64-feature precisions, the worst of 200).
_SPECTRAL_ITERATIONS = 6


def _abs_spectral_bound(A):
    """Upper bounds of the spectral radii of nonnegative ``A`` (K, d, d), each with a
    positive diagonal (``|Lambda_k|``).

    Collatz-Wielandt: ``rho(A) <= max_j (A v)_j / v_j`` for every positive ``v``
    (Horn and Johnson, *Matrix Analysis*, 2nd ed., 2013, Cor. 8.1.29); ``v`` from a
    few power iterations started at ones stays positive (the diagonal is), and the
    bound then comes within a few percent of the radius (0.4% at most on 200 fitted
    64-feature precisions). Raised by ``gamma_{d+2}`` for its own float64 rounding.
    NaN where ``A`` overflows, or where ``v`` underflows (diagonal entries some 50
    decades apart): the caller then keeps its cruder bound (``np.fmin``).
    """
    K, d, _ = A.shape
    v = np.ones((K, d, 1))
    for _ in range(_SPECTRAL_ITERATIONS):
        Av = np.matmul(A, v)
        with np.errstate(invalid="ignore"):
            v = Av / Av.max(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        bound = (np.matmul(A, v) / v)[:, :, 0].max(axis=1)
    return bound * (1.0 + _gamma(d + 2, np.float64))


@dataclass
class RefinedEstimate(abc.ABC):
    """An estimate of ``log w_k + log N(x | mu_k, Lambda_k)`` for every pair, with a
    rigorous bound of each pair's rounding error, and its refinement: the pairs that
    may matter and whose bound exceeds ``_REFINE_TOL`` are recomputed exactly.

    Subclasses give the estimate (:meth:`weighted`, around the shift ``g``) and may
    give their own bound (:meth:`_bounds`; here ``error_coef[k] (||y|| +
    ||m_k||)^2`` with ``y = x - g`` and ``m_k = mu_k - g``). A dataclass of arrays,
    so that a pass can build it once and share it with its workers.
    """

    dtype: str
    means: np.ndarray
    u: np.ndarray
    g: np.ndarray
    error_coef: np.ndarray
    m_norm: np.ndarray
    offset: np.ndarray
    y_limit: float

    @abc.abstractmethod
    def weighted(self, X, out, y_norm=None):
        """The estimate into ``out``, ``(n, K)`` float64; returns ``out``.
        ``y_norm``, if given, receives ``||x - g||`` per row (for the bounds)."""

    def row_norms(self, X):
        """``||x - g||`` per row of ``X`` (n,), float64 (``x - g`` in float64), in
        row chunks."""
        n, d = X.shape
        norms = np.empty(n)
        rows = chunk_rows(d, 8, n)
        for r0 in range(0, n, rows):
            y = np.subtract(X[r0:r0 + rows], self.g)
            np.sqrt(np.einsum("ij,ij->i", y, y), out=norms[r0:r0 + rows])
        return norms

    def beyond_range(self, X):
        """The rows of ``X`` (bool, (n,)) for which :meth:`weighted_refined` may
        raise :class:`BeyondRange`: ``||x - g||`` above ``y_limit``, with room for
        the estimate forming ``x - g`` in its own dtype (float32: within ~1e-7
        relative), so that the other rows never raise it."""
        return ~(self.row_norms(X) <= self.y_limit * (1.0 - _BEYOND_RANGE_ROOM))

    def _bounds(self, w, k, y, out=None):
        """Error bounds of the pairs of estimates ``w``, components ``k`` (an index
        array, or ``_EACH_COMPONENT`` for a ``(K, 1)`` column) and row norms ``y``
        (``||x - g||``, broadcast against ``k``); into ``out`` if given."""
        e = np.add(self.m_norm[k], y, out=out)
        np.square(e, out=e)
        e *= self.error_coef[k]
        return e

    def _uniform_bounds(self, y_norm):
        """Per row, a bound at least each of its pairs' bounds, or ``None`` when
        the estimate has none cheaper than the pairs' own."""
        coef = self.error_coef
        return 2.0 * ((coef * self.m_norm**2).max(initial=0.0)
                      + coef.max(initial=0.0) * y_norm**2)

    def to_refine(self, weighted, y_norm, margin):
        """The pairs to recompute: within ``margin`` nats of the row's best (by the
        bounds) and with a bound above ``_REFINE_TOL``.

        With ``e_ik`` the bound of pair ``(i, k)``, these are the pairs with
        ``w_ik + e_ik >= max_l (w_il - e_il) - margin`` and ``e_ik > _REFINE_TOL``.
        Candidates are marked first, then the bounds evaluated on them only.
        With a uniform bound ``E_i >= e_ik`` of each row (:meth:`_uniform_bounds`;
        for the default bound ``E_i = 2 max_k c_k ||m_k||^2 + 2 max_k c_k
        ||y_i||^2``, from ``(a + b)^2 <= 2 a^2 + 2 b^2``) at most
        ``_UNIFORM_BOUND`` (float64), the candidates are the pairs within
        ``margin + 2 E_i`` of their row's largest estimate, which hold every pair
        sought and the pair attaining the maximum: one comparison. Else (float32:
        bounds of up to ~1e5 nats on tight components) the condition is evaluated
        on every pair, in row chunks that stay in cache. The candidates (nearly
        every pair while the components are broad) are then taken a chunk of
        components at a time (``BOUND_CHUNK_BYTES`` per array of their indices and
        bounds), so that these take no more memory than the pairs kept.

        Returns
        -------
        comps, rows : ndarray of int
            The pairs, sorted by component, then row.
        """
        n, K = weighted.shape
        est = weighted.T  # (K, n): contiguous rows for the column-major estimates
        spread = self._uniform_bounds(y_norm)
        floor = np.full(n, -np.inf)
        found = []
        with np.errstate(invalid="ignore"), \
                borrow("candidate", (K, n), bool) as candidate:
            if spread is not None and spread.max(initial=0.0) <= _UNIFORM_BOUND:
                best = est.max(axis=0)
                # (with room for the rounding of these sums)
                limit = (best - margin - 2.0 * spread
                         - 1e-9 * (np.abs(best) + margin + spread))
                np.greater_equal(est, limit, out=candidate)
            else:
                self._near_best(est, y_norm, margin, candidate)
            step = max(1, BOUND_CHUNK_BYTES // (8 * max(n, 1)))
            for k0 in range(0, K, step):
                flat = np.flatnonzero(candidate[k0:k0 + step])
                comps = flat // max(n, 1)
                rows = flat - comps * n
                comps += k0
                w = est[comps, rows]
                e = self._bounds(w, comps, y_norm[rows])
                np.maximum.at(floor, rows, w - e)
                inexact = e > _REFINE_TOL
                found.append((comps[inexact], rows[inexact], (w + e)[inexact]))
            floor -= margin
            comps, rows, upper = (np.concatenate(parts)
                                  for parts in zip(*found, strict=True))
            keep = upper >= floor[rows]
        return comps[keep], rows[keep]

    def _near_best(self, est, y_norm, margin, mask):
        """Into ``mask`` (K, n), bool: the pairs in ``est`` (K, n) with ``w + e >=
        max(w - e) - margin`` over their row, every bound evaluated (row chunks of
        ``BOUND_CHUNK_BYTES``)."""
        K, n = est.shape
        rows = chunk_rows(K, 8, n, BOUND_CHUNK_BYTES)
        e_buf, t_buf = np.empty((K, rows)), np.empty((K, rows))
        for r0 in range(0, n, rows):
            r1 = min(r0 + rows, n)
            t, w = t_buf[:, :r1 - r0], est[:, r0:r1]
            e = self._bounds(w, _EACH_COMPONENT, y_norm[r0:r1],
                             out=e_buf[:, :r1 - r0])
            floor = np.subtract(w, e, out=t).max(axis=0)
            floor -= margin
            np.greater_equal(np.add(w, e, out=t), floor, out=mask[:, r0:r1])

    def weighted_refined(self, X, margin, out=None):
        """``log w_k + log N(x | mu_k, Lambda_k)``, exact where it matters.

        Every pair is estimated (``n K d^2`` flops at the GEMM rate); the pairs that
        may lie within ``margin`` nats of their row's best and whose error bound
        exceeds ``_REFINE_TOL`` are recomputed exactly; the others either have
        ``r_ik < exp(-margin)`` or are accurate to ``_REFINE_TOL``.

        Parameters
        ----------
        X : ndarray of shape (n, d)
        margin : float
        out : ndarray of shape (n, K), float64, column-major, or None
            Where to write the result (allocated if ``None``).

        Returns
        -------
        weighted : ndarray of shape (n, K), float64, or None
            ``None`` when a probe of the first rows finds that more than
            ``_REFINE_MAX_DENSITY`` of the pairs would need recomputing (beyond one
            per row: in float32 every row's best pair has a bound above
            ``_REFINE_TOL``).

        Raises
        ------
        BeyondRange
            When a row lies so far from ``g`` (``y_limit``, :meth:`beyond_range`) that
            the products could overflow: such rows are for the plain path.
        """
        # column-major: the GEMM writes it directly, and the softmax of
        # estimate_resp reduces over contiguous memory
        weighted = (np.empty((X.shape[0], self.means.shape[0]), order="F")
                    if out is None else out)
        y_norm = np.empty(X.shape[0])
        p = _REFINE_PROBE_ROWS
        with np.errstate(over="ignore", invalid="ignore"):  # checked by y_limit
            probe = self.weighted(X[:p], weighted[:p], y_norm[:p])
        if not y_norm[:p].max(initial=0.0) <= self.y_limit:
            raise BeyondRange
        comps, _ = self.to_refine(probe, y_norm[:p], margin)
        if comps.size - probe.shape[0] > _REFINE_MAX_DENSITY * probe.size:
            return None
        with np.errstate(over="ignore", invalid="ignore"):
            self.weighted(X[p:], weighted[p:], y_norm[p:])
        if not y_norm.max(initial=0.0) <= self.y_limit:
            raise BeyondRange
        return self.refine(X, weighted, *self.to_refine(weighted, y_norm, margin))

    def refine(self, X, weighted, comps, rows):
        """Recompute the pairs ``(rows[j], comps[j])`` (sorted by component) exactly,
        ``log w_k + log N`` with ``||(x - mu_k) U_k||^2`` over each component's
        gathered rows (float64, one numpy product per component: it releases the
        GIL, scipy's ``trmm`` does not); in place."""
        weighted[rows, comps] = exact_pairs(X, self.means, self.u, self.offset, comps,
                                            rows)
        return weighted


@dataclass
class PackedEstimate(RefinedEstimate):
    """Packed estimate of ``log w_k + log N(x | mu_k, Lambda_k)`` and its error bounds.

    The estimate is :func:`_full_maha_packed` around the mixture mean ``g``, in
    float64, or in float32 for float32 compute (``dtype``: float32 products and GEMM,
    about twice the rate; ``g`` is then rounded to float32 first so that ``x - g`` and
    ``mu_k - g`` use the same shift). Its
    rounding error is, to first order, at most ``e_k(x) = (gamma_m lambda_k +
    gamma64 (lambda_k + rho_k)) (||y|| + ||m_k||)^2`` with ``y = x - g``,
    ``m_k = mu_k - g``, ``gamma_m = m u / (1 - m u)`` for the unit roundoff ``u`` of
    ``dtype`` and ``m = T + 3`` (``T = d (d+1)/2 + d + 1`` products in the dot
    product, Higham, *Accuracy and Stability of Numerical Algorithms*, 2002, eq. 3.5,
    plus the roundings of ``y`` and of the products; one more for float32, whose
    weights are rounded from float64), and ``gamma64 = gamma_{2d+2}`` in float64.
    The sum of the magnitudes of the dot product's terms is at most
    ``(|y| + |m_k|)^T |Lambda_k| (|y| + |m_k|) <= lambda_k (||y|| + ||m_k||)^2``
    with ``lambda_k`` an upper bound of the spectral radius of ``|Lambda_k|``
    (elementwise absolute values; :func:`_abs_spectral_bound`). The float64 work on
    the model adds ``gamma_d rho_k`` for ``Lambda_k = U_k U_k^T`` (its rounding is at
    most ``gamma_d |U_k| |U_k|^T``, whose spectral radius is at most
    ``rho_k = max_j (|U_k| |U_k|^T 1)_j``) and ``gamma_{2d+2} lambda_k`` for
    ``Lambda_k m_k``, ``m_k^T Lambda_k m_k`` and the rounding of ``m_k`` itself.
    Half of ``e_k`` bounds the error in ``log N``: ``error_coef[k] (||y|| +
    ||m_k||)^2``; the float64 rounding of ``log w_k + log N`` from it is within the
    bound's spare (``gamma64 rho_k`` counts ``Lambda_k`` twice). Products that fall
    below float32's normal range (``||y|| < ~1e-19``) round absolutely, beyond the
    bound, by at most ~1e-13 in ``log N`` (see :func:`_representable`). The pairs
    recomputed by :meth:`refine` are computed in float64 whatever ``dtype`` is.

    A dataclass of arrays, so that a pass can build it once and share it with its
    workers (:meth:`build_all`).
    """

    W: np.ndarray

    @classmethod
    def build_all(cls, weights, means, precisions_cholesky, dtypes):
        """The estimates for each of ``dtypes`` (float64 or float32: that of the
        estimate's products), sharing the work on the model (``K d^3`` flops for
        the precisions) and the shift ``g``, rounded to the narrowest of them;
        ``None`` when the narrowest cannot hold the packed weights
        (:func:`_representable`; the wider ones then serve no purpose to its
        data)."""
        dtypes = [np.dtype(t) for t in dtypes]
        means = np.asarray(means, dtype=np.float64)
        u = np.asarray(precisions_cholesky, dtype=np.float64)
        K, d = means.shape
        narrowest = min(dtypes, key=lambda t: t.itemsize)
        g = _shift(means, weights).astype(narrowest).astype(np.float64)
        means_shifted = means - g
        precisions = np.matmul(u, np.swapaxes(u, 1, 2))
        W = _packed_weights(precisions, means_shifted)
        if not _representable(W, narrowest):
            return None
        abs_u = np.abs(u)
        rho = np.matmul(abs_u, abs_u.sum(axis=1)[:, :, None])[:, :, 0].max(axis=1)
        gamma64 = _gamma(2 * d + 2, np.float64)
        spectral = np.fmin(_abs_spectral_bound(np.abs(precisions, out=precisions)),
                           rho * (1.0 + gamma64))
        del precisions
        with np.errstate(divide="ignore"):
            offset = (np.log(np.asarray(weights, dtype=np.float64))
                      + log_det_cholesky(u, "full", d) - 0.5 * d * _LOG_2PI)
        m_norm = np.linalg.norm(means_shifted, axis=1)
        built = []
        for dtype in dtypes:
            gamma = _gamma(d * (d + 1) // 2 + d + 4 + (dtype != np.float64), dtype)
            error_coef = 0.5 * (gamma * spectral + gamma64 * (spectral + rho))
            # The products and every partial sum of the dot product are at most
            # max(rho_k, 1) (||y|| + ||m_k||)^2 in magnitude: rows with ||y|| below
            # y_limit cannot overflow ``dtype`` (with a factor 4 to spare).
            y_limit = float(np.sqrt(np.finfo(dtype).max / 4.0 / max(rho.max(), 1.0))
                            - m_norm.max())
            built.append(cls(dtype=dtype.str, means=means, u=u, g=g,
                             error_coef=error_coef, m_norm=m_norm, offset=offset,
                             y_limit=y_limit, W=W.astype(dtype)))
        return built

    def weighted(self, X, out, y_norm=None):
        """The estimate into ``out``, ``(n, K)`` float64; returns ``out``.
        ``y_norm``, if given, receives ``||x - g||`` per row (for the bounds)."""
        _full_maha_packed(X, self.g, self.W, out, y_norm)
        out *= -0.5
        out += self.offset
        return out


@dataclass
class TriangularEstimate(RefinedEstimate):
    """Float32 estimate of ``log w_k + log N(x | mu_k, Lambda_k)`` for large ``d``
    (no packed products): the column-block triangular products of
    :func:`_full_maha_dense` around the mixture mean ``g`` (rounded to float32), in
    float32, with a per-pair bound of their rounding.

    With ``y = x - g``, ``m_k = mu_k - g`` and ``z = (y - m_k) U_k`` computed as
    ``y U_k - m_k U_k``, each ``z_j`` is off by at most ``gamma (|y| + |m_k|)^T
    |U_k[:, j]|`` (Higham, *Accuracy and Stability of Numerical Algorithms*, 2002,
    eq. 3.5: ``gamma = gamma_{d+4}`` in float32 for the dot product of length at
    most ``d`` and the roundings of ``y``, ``U_k``, ``m_k U_k`` and the difference,
    plus ``gamma_{d+2}`` in float64 for ``m_k U_k``), so ``||dz|| <= delta =
    gamma sqrt(rho_k) (||y|| + ||m_k||)`` with ``rho_k = max_j (|U_k| |U_k|^T 1)_j``
    at least the squared spectral norm of ``|U_k|``. The squares and their sums
    over a column block (width ``h``) add at most ``gamma_{h+1} ||z^||^2``
    (float32; the blocks are added in float64, ``gamma_{d}`` there), so the
    estimate ``M^`` of ``||z||^2`` is within ``e = gamma_s M' + delta (2 sqrt(M') +
    delta)`` with ``M' = M^ / (1 - gamma_s)`` bounding ``||z^||^2`` (``M^`` is
    recovered from ``w = offset_k - M^ / 2`` with room for that float64 rounding).
    Half of ``e`` bounds the error in ``log N``, with ``4 u64 (|w| + M')`` added for
    the float64 work on the estimate ``w`` of ``log w_k + log N``. Unlike the packed
    estimate's, the bound grows with ``sqrt(M)``, not with ``M``: a far pair's
    bound stays far below its distance. It is some 500x the errors seen (d = 100).

    The products cost ``n K d^2 (1 + h/d)`` flops at the SGEMM rate; the pairs
    recomputed by :meth:`refine` (float64) cost ``2 d^2`` each.
    """

    means_shifted: np.ndarray
    gamma_sum: float

    @classmethod
    def build(cls, weights, means, precisions_cholesky, dtype=np.float32):
        """The estimate's work on the model: ``K d^2`` flops (one component at a
        time: no ``(K, d, d)`` temporary). ``None`` when ``dtype`` cannot hold the
        factors or the shifted means' products (:func:`_representable`)."""
        dtype = np.dtype(dtype)
        means = np.asarray(means, dtype=np.float64)
        u = np.asarray(precisions_cholesky, dtype=np.float64)
        K, d = means.shape
        g = _shift(means, weights).astype(dtype).astype(np.float64)
        means_shifted = means - g
        rho = np.empty(K)
        for k in range(K):
            a = np.abs(u[k])
            if not (_representable(a, dtype)
                    and _representable(means_shifted[k] @ a, dtype)):
                return None
            rho[k] = (a @ a.sum(axis=0)).max(initial=0.0)
        with np.errstate(divide="ignore"):
            offset = (np.log(np.asarray(weights, dtype=np.float64))
                      + log_det_cholesky(u, "full", d) - 0.5 * d * _LOG_2PI)
        m_norm = np.linalg.norm(means_shifted, axis=1)
        gamma = _gamma(d + 4, dtype) + _gamma(d + 2, np.float64)
        # the products, partial sums and squares are at most max(rho_k, 1)
        # (||y|| + ||m_k||)^2 in magnitude (a factor 4 to spare)
        y_limit = float(np.sqrt(np.finfo(dtype).max / 4.0 / max(rho.max(initial=0.0),
                                                                1.0))
                        - m_norm.max(initial=0.0))
        # (the column-block width of the dense products, read when the estimate is
        # made: the tuning constant of log_density)
        gamma_sum = (_gamma(min(d, log_density.TRIANGLE_BLOCK) + 1, dtype)
                     + _gamma(d, np.float64))
        return cls(dtype=dtype.str, means=means, u=u, g=g,
                   error_coef=gamma * np.sqrt(rho), m_norm=m_norm, offset=offset,
                   y_limit=y_limit, means_shifted=means_shifted, gamma_sum=gamma_sum)

    def weighted(self, X, out, y_norm=None):
        """The estimate into ``out``, ``(n, K)`` float64; returns ``out``.
        ``y_norm``, if given, receives ``||x - g||`` per row (float64)."""
        K = self.means.shape[0]
        _full_maha_dense(X, self.g.astype(X.dtype), self.means_shifted, self.u,
                         np.arange(K), out)
        if y_norm is not None:
            y_norm[:] = self.row_norms(X)
        out *= -0.5
        out += self.offset
        return out

    def _bounds(self, w, k, y, out=None):
        """See the class docstring; ``w`` gives ``M^ = 2 (offset_k - w)`` (0 for a
        component without weight, whose ``w`` is exactly ``-inf``)."""
        delta = self.error_coef[k] * (self.m_norm[k] + y)
        offset = self.offset[k]
        # M^ recovered from w, with room for the rounding of w = offset - M^/2
        m = (2.0 / (1.0 - self.gamma_sum)) * (
            (offset - w) + 2.0 * _U64 * (np.abs(offset) + np.abs(w)))
        np.fmax(m, 0.0, out=m)
        e = delta * (2.0 * np.sqrt(m) + delta)
        e += self.gamma_sum * m
        e += 4.0 * _U64 * (np.abs(w) + m)
        e *= 0.5
        if out is None:
            return e
        out[...] = e
        return out

    def _uniform_bounds(self, y_norm):
        """``None``: the pairs' own bounds are the cheapest."""
        return None


class BeyondRange(Exception):
    """A row of the block lies too far from the shift for a :class:`RefinedEstimate`'s
    products (its ``y_limit``)."""


def prepare_log_prob(weights, means, precisions_cholesky, covariance_type, dtype,
                     screen=None):
    """Work on the model that every block of a pass shares, or ``None``: the
    covariance type's (for 'full', :func:`prepare_full_log_prob`; the others have
    none)."""
    return get_covariance_type(covariance_type).prepare_log_prob(
        weights, means, precisions_cholesky, dtype, screen)


def prepare_full_log_prob(weights, means, precisions_cholesky, dtype, screen=None):
    """The estimates (:class:`RefinedEstimate`) that
    :func:`~emgmm._engine.estep.weighted_log_prob` tries in this order, each refined
    where it matters, before its plain path:

    * small ``d`` (packed products, ``K d^3`` flops here): for float32 data the
      float32 :class:`PackedEstimate`, then the float64 one (on the same data),
      taken where the float32 bounds are too coarse for the model (on the image
      patches D, ill-conditioned precisions: 150 of 200 pairs per row to
      recompute); for float64 data the float64 one. ``None`` for float32 data when
      float32 cannot hold the packed weights.
    * larger ``d``: the certified screen
      (:class:`~emgmm.covariance._screen.ProjectionScreen`, ``K d^2 p`` flops here),
      which computes only the pairs that may lie within the margin and refuses
      blocks where too many do (broad components; ``screen``: the arrays of one a
      run kept for these parameters); then, for float32 data, the
      float32 :class:`TriangularEstimate` (``K d^2`` flops here), unless float32
      cannot hold the factors. Float64 data have no estimate: their plain path is
      exact.

    Where every estimate refuses a block (too many pairs to recompute), float32
    data take the plain path in float64. Where float32's range falls short (the
    refusals above, or rows too far for the products: :class:`BeyondRange`, and
    then only those rows), float32 compute takes the plain float32 path, and its
    check refuses what overflows there.
    """
    K, d = np.shape(means)
    float32 = np.dtype(dtype) == np.float32
    with np.errstate(over="ignore", invalid="ignore"):
        if _use_packed(d, K):
            built = PackedEstimate.build_all(
                weights, means, precisions_cholesky,
                (np.float32, np.float64) if float32 else (np.float64,))
            return None if built is None else tuple(built)
        # (a run's kept screen of these parameters, else a new one: any valid
        # screen is exact, and building one costs K d^2 p (steps + 1) flops)
        screen = (ProjectionScreen.build(weights, means, precisions_cholesky)
                  if screen is None else ProjectionScreen.from_arrays(
                      np.asarray(means, dtype=np.float64),
                      np.asarray(precisions_cholesky, dtype=np.float64), screen),)
        if float32:
            built = TriangularEstimate.build(weights, means, precisions_cholesky)
            return screen if built is None else screen + (built,)
    return screen
