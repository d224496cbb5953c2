"""'full': how far one component moved between two models, as the terms that carry a
lower bound of its Mahalanobis distances from one model to the next.

With the old mean and upper precision factor ``(mu, U)``, the new ``(mu', U')``,
``Ahat = fl(U^-1 U')`` and ``F = U' - U Ahat`` (exactly), for every row ``x``::

    ||(x - mu') U'|| >= ||(x - mu) U'|| - ||(mu' - mu) U'||
    ||(x - mu) U'||  >= ||(x - mu) U|| sigma_min(Ahat) - ||x - mu|| ||F||_2

so ``sqrt(m'_x) >= s sqrt(m_x) - e (||x|| + ||mu||) - t`` with ``s <=
sigma_min(Ahat)``, ``e >= ||F||_2`` and ``t >= ||(mu' - mu) U'||``. Since
``Ahat^T Ahat = I + E + E^T + E^T E`` for ``E = Ahat - I``, ``sigma_min(Ahat)^2 >= 1
- ||E + E^T||_2``: tight when the metric changes little, as it does from one EM
iteration to the next (an eigensolver's ``lambda_min(E + E^T)`` would be tighter
still, but costs four times the solve and kept no more rows carried on image
patches). Every term is rounded so that the inequality holds for the
stored arrays (Higham, *Accuracy and Stability of Numerical Algorithms*, 2002: eq.
3.5 for the products; the solve's residual is computed, so that nothing rests on
how the BLAS solves).

Pure functions of one component's arrays; the solve releases the GIL
(:mod:`emgmm._runtime.lapack`).
"""

from dataclasses import dataclass

import numpy as np

from .._runtime.lapack import trmm_left_lower, trsm_right_lower
from ._log_density import _gamma

_U64 = np.finfo(np.float64).eps / 2
#: Relative slack for the rounding of the norms and sums below (each far below it
#: for any ``d`` up to ~10^5).
_SLACK = 1e-6


@dataclass
class Drift:
    """The terms of one component's move: ``scale`` ``s`` (in ``[0, 1]``, 0 when
    nothing can be carried), ``error`` ``e`` and ``shift`` ``e ||mu|| + t``, so that
    ``sqrt(m'_x) >= s sqrt(m_x) - e ||x|| - shift``."""

    scale: float
    error: float
    shift: float


def drift_flops(d):
    """Flops of :func:`metric_drift` at ``d`` features (the solve and the
    residual's product)."""
    return 2 * d ** 3 / 3


def metric_drift(u_old, u_new, mean_old, mean_new, u_norm_old, u_norm_new):
    """:class:`Drift` of a component from ``(mean_old, u_old)`` to ``(mean_new,
    u_new)``.

    Parameters
    ----------
    u_old, u_new : ndarray of shape (d, d), float64
        Upper precision factors (their strict lower triangles are zero).
    mean_old, mean_new : ndarray of shape (d,), float64
        The component's mean in the two models.
    u_norm_old, u_norm_new : float
        Upper bounds of ``||U||_F`` and ``||U'||_F``.

    Returns
    -------
    Drift
    """
    d = u_old.shape[0]
    a_hat = solved(u_old, u_new)
    a_norm = np.sqrt(np.einsum("ij,ij->", a_hat, a_hat)) * (1.0 + _SLACK)
    error = residual_bound(u_old, u_new, a_hat, u_norm_old, a_norm)
    step = np.subtract(mean_new, mean_old)
    z = step @ u_new
    step_norm = np.sqrt(step @ step) * (1.0 + _SLACK)
    shift = (np.sqrt(z @ z) * (1.0 + _SLACK)
             + _gamma(d + 2, np.float64) * step_norm * u_norm_new)
    mean_norm = np.sqrt(mean_old @ mean_old) * (1.0 + _SLACK)
    return Drift(scale=_scale(a_hat), error=float(error),
                 shift=float((error * mean_norm + shift) * (1.0 + _SLACK)))


def solved(u_old, u_new):
    """``Ahat = fl(U^-1 U')`` (d, d), C-ordered (one triangular solve, any
    accuracy: its residual is bounded from the result)."""
    a_hat = np.array(u_new.T, order="F")  # U'^T, solved from the right by U^T
    trsm_right_lower(np.asfortranarray(u_old.T), a_hat)
    return a_hat.T


def residual_bound(u_old, u_new, a_hat, u_norm_old, a_norm):
    """An upper bound of ``||U' - U Ahat||_2`` from the computed residual: ``fl(U
    Ahat)`` is within ``gamma_{d+1} ||U||_F ||Ahat||_F`` of ``U Ahat`` (Higham
    2002, eq. 3.5, as every product here), the subtraction within ``u`` of the
    result."""
    d = u_old.shape[0]
    product = np.asfortranarray(a_hat)
    trmm_left_lower(np.asfortranarray(u_old.T), product, transpose=True)
    residual = np.subtract(u_new, product)
    r_norm = np.sqrt(np.einsum("ij,ij->", residual, residual))
    return float((r_norm * (1.0 + 2 * _U64)
                  + _gamma(d + 1, np.float64) * u_norm_old * a_norm) * (1.0 + _SLACK))


def _scale(a_hat):
    """A lower bound of ``sigma_min(a_hat)``: ``sqrt(1 - ||S||_2)`` for ``S = E +
    E^T``, ``||S||_2 <= min(||S||_F, ||S||_inf)``, ``fl(S)`` within ``2u |S|`` of
    ``S`` entrywise."""
    d = a_hat.shape[0]
    s = a_hat + a_hat.T
    s.flat[::d + 1] -= 2.0
    s_norm = np.sqrt(np.einsum("ij,ij->", s, s)) * (1.0 + _SLACK)
    if not np.isfinite(s_norm):
        return 0.0
    inf_norm = np.abs(s).sum(axis=1).max() * (1.0 + _SLACK)
    square = (1.0 - min(s_norm, inf_norm) - 3 * _U64 * s_norm) * (1.0 - 4 * _U64)
    return float(np.sqrt(square) * (1.0 - 4 * _U64)) if square > 0.0 else 0.0
