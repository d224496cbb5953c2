"""A certified screen of the 'factor' E step, in the contract of the 'full' one
(:mod:`emgmm.covariance._screen`): only the pairs that may reach the responsibility
threshold are computed, the others are proven negligible.

With ``S_k = Sigma_k^{-1} = Psi_k^{-1} - G_k G_k^T`` (the precision the kernels
define, :mod:`emgmm.covariance._factor_parameters`) and any ``Z`` (``d x p``) whose
columns are ``S_k``-orthonormal (``Z^T S_k Z = I``), Bessel's inequality in the
inner product of ``S_k`` gives ``||(x - mu_k)^T S_k Z||^2 <= (x - mu_k)^T S_k (x -
mu_k) = m_ik``: with ``B_k = S_k Z``, the squared projections on ``B_k`` bound the
Mahalanobis distance from below (they are the Mahalanobis distance of the marginal
along ``Z``), at ``2 d p`` flops per pair against ``2 d q + 4 d`` for the pair
itself. Only ``S_k`` products are needed (``O(d q)`` per vector), never a ``(d,
d)`` array.

``Z`` spans where the other components' means lie in component ``k``'s metric: the
leading right singular vectors of ``A = (M - mu_k) S_k^{1/2}`` (``M`` the means),
by subspace iteration (Halko, Martinsson and Tropp 2011, Alg. 4.4) carried in the
coordinates ``Z = S_k^{-1/2} V`` (``A^T A V`` there is ``(M - mu_k)^T (M - mu_k)
S_k Z``), from the range finder's start ``Z_0 = (M - mu_k)^T Omega``. Their choice
sets the bound's tightness only; its validity rests on ``||Z^T S_k Z||_2`` and the
products' rounding, both bounded rigorously (Higham 2002, eq. 3.5).
"""

from dataclasses import dataclass

import numpy as np

from .._runtime.blas import threads_for_loop
from ._factor_pairs import pair_values
from ._log_density import _gamma, _shift
from ._screen import _OVERSAMPLE, _SUBSPACE_STEPS, ComponentTerms, ProjectionScreen

#: Directions per component: on 50x50 sample-image patches (K=200, q=32), pairs per
#: row surviving for p = 2/4/8/16: 14.6/12.2/10.0/8.3 with one pair computed first,
#: 9.3 for p = 4 with three; p = 4 does least work.
FACTOR_SCREEN_DIRECTIONS = 4
#: Pairs per row computed before the limit is set (the bounds rank a row's best first
#: for 64% of rows at p = 4; the best of three sets a limit that keeps 24% fewer).
FACTOR_FIRST_PAIRS = 3
#: The screen is built from this many features (below, the dense E step is cheap).
MIN_FEATURES = 64


def _apply_precision(precision, k, Z):
    """``S_k Z = Psi_k^{-1} Z - G_k (G_k^T Z)``."""
    G = precision.projection[k]
    return precision.inv_noise[k][:, None] * Z - G @ (G.T @ Z)


def _orthonormal(precision, k, Z):
    """``Z`` made ``S_k``-orthonormal (``Z C^{-T}``, ``C C^T = Z^T S_k Z``), with
    ``S_k Z``; columns of ``S_k``-norm zero (means equal to ``mu_k``) dropped."""
    SZ = _apply_precision(precision, k, Z)
    T = Z.T @ SZ
    vals, vecs = np.linalg.eigh(0.5 * (T + T.T))
    keep = vals > vals.max(initial=0.0) * 1e-12
    if not keep.any():
        return Z[:, :0], SZ[:, :0]
    scale = vecs[:, keep] / np.sqrt(vals[keep])
    return Z @ scale, SZ @ scale


def component_directions(precision, k, centres, p, seed=0):
    """``Z`` (d, p') of component ``k`` (see the module's docstring), ``p' <= p``
    (fewer where the other means span fewer directions)."""
    D = centres - centres[k]
    width = min(p + _OVERSAMPLE, D.shape[0])
    omega = np.random.default_rng(seed).standard_normal((D.shape[0], width))
    Z, SZ = _orthonormal(precision, k, D.T @ omega)
    for _ in range(_SUBSPACE_STEPS):
        Z, SZ = _orthonormal(precision, k, D.T @ (D @ SZ))
    DB = D @ SZ
    _, vecs = np.linalg.eigh(DB.T @ DB)
    return Z @ vecs[:, ::-1][:, :p]


def component_terms(precision, k, means, g, p):
    """:class:`~emgmm.covariance._screen.ComponentTerms` of component ``k``.

    ``B = fl(S_k Z)`` is within ``e_B = gamma_{q+3} (||Psi^{-1} Z||_F + ||G_k||_F
    ||fl(G_k^T Z)||_F) + gamma_d ||G_k||_F^2 ||Z||_F`` of ``S_k Z``; ``||Z^T S_k
    Z||_2 <= 1 + ||fl(Z^T B) - I||_F + gamma_d ||Z||_F ||B||_F + ||Z||_F e_B`` (the
    ``q_norm^2`` of the bound); ``err_coef`` as for 'full'
    (:func:`~emgmm.covariance._screen.component_screen`); ``u_norm >= ||G_k||_F``
    (for the rounding bounds of :func:`~emgmm.covariance._factor_pairs.pair_values`).
    """
    d = means.shape[1]
    Z = component_directions(precision, k, means, p, seed=k)
    G = precision.projection[k]
    GZ = G.T @ Z
    scaled = precision.inv_noise[k][:, None] * Z
    B = scaled - G @ GZ
    g_norm, z_norm = np.linalg.norm(G), np.linalg.norm(Z)
    e_b = (_gamma(G.shape[1] + 3, np.float64) * (np.linalg.norm(scaled)
                                                 + g_norm * np.linalg.norm(GZ))
           + _gamma(d, np.float64) * g_norm**2 * z_norm) * (1.0 + 1e-6)
    b_norm = np.linalg.norm(B)
    gram_dev = np.linalg.norm(Z.T @ B - np.eye(Z.shape[1]))
    bound = 1.0 + gram_dev + _gamma(d, np.float64) * z_norm * b_norm + z_norm * e_b
    pad = p - Z.shape[1]  # directions the other means did not span: zero columns
    B = np.pad(B, ((0, 0), (0, pad)))
    m = means[k] - g
    log_det = -0.5 * precision.log_det[k]
    return ComponentTerms(
        Q=np.pad(Z, ((0, 0), (0, pad))), B=B, c=m @ B,
        err_coef=2.0 * (2.0 * _gamma(d + 2, np.float64) * b_norm + e_b) * (1.0 + 1e-6),
        q_norm=np.sqrt(bound * (1.0 + 4 * _gamma(4, np.float64))),
        m_norm=np.linalg.norm(m),
        u_norm=g_norm * (1.0 + _gamma(G.size + 2, np.float64)), log_det=log_det,
        log_det_err=_log_det_error(precision, k))


def _log_det_error(precision, k):
    """A bound of the rounding of ``-1/2 log det Sigma_k`` as
    :func:`~emgmm.covariance._factor.unpack_precision` sums it."""
    q = precision.n_factors
    terms = (np.abs(np.log(precision.inv_noise[k])).sum()
             + 2.0 * np.abs(np.log(np.diagonal(precision.cholesky_inv[k]))).sum())
    d = precision.inv_noise.shape[1]
    return 0.5 * _gamma(d + q + 2, np.float64) * terms * (1.0 + 1e-6)


@dataclass
class FactorScreen(ProjectionScreen):
    """:class:`~emgmm.covariance._screen.ProjectionScreen` of a 'factor' model: the
    bounds of its projections on ``B_k = S_k Z_k``, the pairs computed by
    :func:`~emgmm.covariance._factor_pairs.pair_values`; ``precision`` is the model's
    :class:`~emgmm.covariance._factor_parameters.FactorPrecision`."""

    precision: object = None
    first_pairs = FACTOR_FIRST_PAIRS

    @classmethod
    def build(cls, weights, means, precision, p=FACTOR_SCREEN_DIRECTIONS):
        """The screen of a 'factor' model (``O(K (K + q) d p)`` flops per component
        step)."""
        means = np.asarray(means, dtype=np.float64)
        K, d = means.shape
        arrays = {name: np.empty(shape)
                  for name, shape in cls.shapes(K, d, p).items()}
        p = arrays["B"].shape[1]
        screen = cls.from_arrays(means, None, arrays)
        screen.precision = precision
        screen.g[:] = _shift(means, weights)
        work = K * d * (K + precision.n_factors) * (p + _OVERSAMPLE) \
            * (_SUBSPACE_STEPS + 1)
        screen.set_components(
            lambda k: component_terms(precision, k, means, screen.g, p),
            threads_for_loop(work))
        screen.set_offsets(weights)
        return screen

    def exact(self, X, comps, rows, errors=False):
        return pair_values(X, self.means, self.precision, self.offset, comps, rows,
                           self.u_norm if errors else None)
