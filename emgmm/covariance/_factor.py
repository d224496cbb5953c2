"""Covariance type 'factor' (mixtures of factor analysers) behind the registry's
protocol: :class:`FactorCovariance` over the packed arrays of the engine's model.
Its kernels are split by operation: :mod:`~emgmm.covariance._factor_parameters`,
:mod:`~emgmm.covariance._factor_log_density`,
:mod:`~emgmm.covariance._factor_statistics`,
:mod:`~emgmm.covariance._factor_m_step`, :mod:`~emgmm.covariance._factor_pairs` and
:mod:`~emgmm.covariance._factor_screen`.
"""

import warnings

import numpy as np
from scipy.sparse.linalg import LinearOperator, eigsh

from .._runtime.blas import threads_for_loop
from . import _factor_parameters as factor_parameters
from . import _factor_screen as factor_screen
from ._base import CovarianceType, widest_axis_of_matrix
from ._factor_log_density import densities, projections
from ._factor_m_step import initial_parameters, m_step
from ._factor_pairs import pair_statistics
from ._factor_parameters import (
    FactorPrecision,
    bad_components,
    bytes_per_row,
    factorize,
    n_parameters,
    sample,
)
from ._factor_statistics import (
    FactorStatistics,
    block_statistics,
    concatenate_statistics,
    dense_pays,
    statistics_nbytes,
)

#: The dense attributes of the other types, formed on demand for 'factor'.
DENSE_ATTRIBUTES = ("covariances_", "precisions_", "precisions_cholesky_")
#: Above this size (MiB) forming a dense attribute warns.
DENSE_WARN_MIB = 256
#: Up to this many features the widest axis of a component (a stream's split)
#: comes from its dense covariance; above, from Lanczos on ``W W^T + Psi``.
_DENSE_AXIS_FEATURES = 64

# ------------------------------------------------------------ the covariance type
#
# The engine's Model holds two arrays per covariance type. For 'factor' they are
# packed, one component per entry of the first axis (so that slices, re-seeds,
# checkpoints and float32 rounding treat them as the other types' arrays):
#
#   covariances          (K, d + q, q + 1): [:, :d, :q] = W_k, [:, :d, q] = psi_k
#                        (the last q rows are zero)
#   precisions_cholesky  (K, d + q, q + 1): [:, :d, :q] = G_k, [:, :d, q] = 1 / psi_k,
#                        [:, d:, :q] = L_k^{-1}
#
# so that q is the width less one and d the height less q, in both.


def pack_parameters(loadings, noise_variance):
    """The packed ``covariances`` of ``loadings`` (K, d, q) and ``noise_variance``
    (K, d): ``(K, d + q, q + 1)``."""
    W = np.asarray(loadings, dtype=np.float64)
    K, d, q = W.shape
    out = np.zeros((K, d + q, q + 1))
    out[:, :d, :q] = W
    out[:, :d, q] = noise_variance
    return out


def unpack_parameters(packed):
    """``(loadings, noise_variance)`` views of packed covariances."""
    q = packed.shape[-1] - 1
    d = packed.shape[-2] - q
    return packed[..., :d, :q], packed[..., :d, q]


def pack_precision(precision):
    """The packed ``precisions_cholesky`` of a :class:`FactorPrecision`."""
    K, d, q = precision.projection.shape
    out = np.zeros((K, d + q, q + 1))
    out[:, :d, :q] = precision.projection
    out[:, :d, q] = precision.inv_noise
    out[:, d:, :q] = precision.cholesky_inv
    return out


def unpack_precision(packed):
    """The :class:`FactorPrecision` of packed factors (its own stacked copy of
    ``G``); ``log det Sigma = -sum log(1 / psi) - 2 sum log diag L^{-1}``."""
    packed = np.asarray(packed, dtype=np.float64)
    K, rows, width = packed.shape
    q = width - 1
    d = rows - q
    stacked = np.empty((d, K, q))
    stacked[...] = np.swapaxes(packed[:, :d, :q], 0, 1)
    inv_noise = np.ascontiguousarray(packed[:, :d, q])
    chol_inv = np.ascontiguousarray(packed[:, d:, :q])
    with np.errstate(divide="ignore", invalid="ignore"):
        log_det = -(np.log(inv_noise).sum(axis=1)
                    + 2.0 * np.log(np.diagonal(chol_inv, axis1=1, axis2=2)).sum(axis=1))
    return FactorPrecision(inv_noise, np.swapaxes(stacked, 0, 1), chol_inv, log_det)


def _n_factors(packed):
    return packed.shape[-1] - 1


class FactorCovariance(CovarianceType):
    """'factor': ``Sigma_k = W_k W_k^T + diag(psi_k)`` with ``q`` factors.

    One instance per ``n_factors`` (:meth:`with_factors`); the registry's has
    ``n_factors=None`` and reads ``q`` off the packed arrays it is given (see the
    notes above :func:`pack_parameters`). The methods that take no arrays
    (shapes, counts, sizes) need a configured instance.
    """

    name = "factor"
    variational = False
    parameters = ("n_factors",)
    attribute_names = ("loadings_", "noise_variance_")
    statistics_need_products = True
    stores_covariances = True
    holds_degenerate = True
    chunked_blocks = True

    def __init__(self, n_factors=None):
        self.n_factors = None if n_factors is None else int(n_factors)

    def __reduce__(self):
        return (FactorCovariance, (self.n_factors,))

    def __eq__(self, other):
        return (isinstance(other, FactorCovariance)
                and other.n_factors == self.n_factors)

    def __hash__(self):
        return hash((self.name, self.n_factors))

    def __str__(self):
        return self.name

    def with_factors(self, n_factors):
        """The type with ``n_factors`` factors per component."""
        return FactorCovariance(n_factors)

    def for_params(self, params):
        """Configured with the estimator's ``n_factors``."""
        return self.with_factors(params["n_factors"])

    def for_model(self, model):
        """Configured from a model's packed arrays."""
        arrays = model.covariances if model.covariances is not None \
            else model.precisions_cholesky
        return FactorCovariance(_n_factors(arrays))

    def _q(self):
        if self.n_factors is None:
            raise ValueError("covariance_type='factor' needs n_factors here")
        return self.n_factors

    # -------------------------------------------------------------- sizes
    def stored_shapes(self, n_components, n_features):
        q = self._q()
        return {"loadings": (n_components, n_features, q),
                "noise_variance": (n_components, n_features)}

    def check_n_features(self, n_features):
        if self._q() > n_features:
            raise ValueError(
                f"n_factors={self._q()} exceeds the {n_features} features of X: "
                "a component has at most as many factors as features.")

    def fitted_attributes(self, model, dtype, precisions):
        """``loadings_`` and ``noise_variance_`` (the dense attributes are formed on
        demand: :meth:`derived_attribute`)."""
        loadings, noise = unpack_parameters(model.covariances)
        return {"loadings_": np.ascontiguousarray(loadings, dtype=dtype),
                "noise_variance_": np.ascontiguousarray(noise, dtype=dtype)}

    def model_arrays(self, attributes):
        """The packed arrays of ``loadings_`` and ``noise_variance_``; raises
        ``ValueError`` naming a component whose noise variance is not positive."""
        covariances = pack_parameters(
            np.asarray(attributes["loadings_"], dtype=np.float64),
            np.asarray(attributes["noise_variance_"], dtype=np.float64))
        u, bad = self.factorize(covariances)
        if bad:
            raise ValueError(f"noise_variance_ of component {bad[0]} is not positive "
                             "and finite")
        return covariances, u

    def derived_attribute(self, attributes, name):
        """``covariances_``, ``precisions_`` or ``precisions_cholesky_``: (K, d, d),
        formed now (a ``UserWarning`` above ``DENSE_WARN_MIB``; ``AttributeError``
        when they do not fit in memory)."""
        if name not in DENSE_ATTRIBUTES or "loadings_" not in attributes:
            raise AttributeError(name)
        W = np.asarray(attributes["loadings_"], dtype=np.float64)
        psi = np.asarray(attributes["noise_variance_"], dtype=np.float64)
        K, d, _ = W.shape
        mib = 8 * K * d * d / 2**20
        if mib > DENSE_WARN_MIB:
            warnings.warn(
                f"{name} of a covariance_type='factor' model is formed on demand: "
                f"{K} dense {d} x {d} matrices, {mib:,.0f} MiB (the model itself is "
                "loadings_ and noise_variance_).", UserWarning, stacklevel=4)
        try:
            if name == "covariances_":
                out = factor_parameters.covariances(W, psi)
            elif name == "precisions_":
                out = factor_parameters.precisions(factor_parameters.factorize(W, psi))
            else:
                out = factor_parameters.precisions_cholesky(W, psi)
        except MemoryError:
            # (an AttributeError: hasattr() and getattr(..., default) stay usable)
            raise AttributeError(
                f"{name} of this covariance_type='factor' model does not fit in memory "
                f"({K} dense {d} x {d} matrices, {mib:,.0f} MiB); use loadings_ and "
                "noise_variance_") from None
        return out.astype(attributes["loadings_"].dtype, copy=False)

    def stored_problem(self, stored):
        """Loadings not finite, or noise variances not positive and finite (naming
        the component and entry)."""
        noise = stored["noise_variance"]
        for name, ok in (("loadings", np.isfinite(stored["loadings"])),
                         ("noise_variance", np.isfinite(noise) & (noise > 0))):
            bad = np.argwhere(~ok)
            if bad.size:
                need = "finite and positive" if name == "noise_variance" else "finite"
                return (f"{name} of component {bad[0][0]} must be {need} (entry "
                        f"{tuple(int(i) for i in bad[0][1:])})")
        return None

    def covariance_shape(self, n_components, n_features):
        q = self._q()
        return (n_components, n_features + q, q + 1)

    def n_parameters(self, n_components, n_features):
        # the loadings up to a rotation and the noise; the estimator adds means and
        # weights (the K (d q - q (q - 1) / 2 + 2 d) + K - 1 in all)
        return n_parameters(n_components, n_features, self._q()) - (
            n_components * n_features + n_components - 1)

    def statistics_values(self, n_components, n_features):
        return statistics_nbytes(n_components, n_features, self._q()) // 8

    def work_per_row(self, n_features):
        return 2 * n_features * (self._q() + 1)

    def bytes_per_row(self, n_features, n_components, itemsize):
        return bytes_per_row(n_features, n_components, self._q(), itemsize)

    def factor_terms(self, n_features):
        return n_features + self._q() + 1

    # ---------------------------------------------------- parameterisation
    def factorize(self, covariances, dtype=np.float64, threads=1):
        W, psi = unpack_parameters(np.asarray(covariances, dtype=np.float64))
        K, d, q = W.shape
        threads = threads_for_loop(K * d * (q + 1) ** 2, threads)
        bad = [int(k) for k in bad_components(psi)]
        if not bad:
            return pack_precision(factorize(W, psi, threads)), bad
        good = np.setdiff1d(np.arange(len(psi)), bad)
        out = np.full(covariances.shape, np.nan)
        if good.size:
            out[good] = pack_precision(factorize(W[good], psi[good], threads))
        return out, bad

    def precisions_cholesky_from_precisions(self, precisions):
        raise ValueError("precisions_init is not supported with "
                         "covariance_type='factor' (loadings and noise variances "
                         "define the components; give means_init and weights_init, "
                         "or warm-start from a fitted model)")

    def precisions_from_cholesky(self, precisions_cholesky):
        # the packed factors stand for the precisions inside the engine; the dense
        # precisions_ are formed on demand by the estimator (precisions())
        return precisions_cholesky

    def covariances_from_cholesky(self, precisions_cholesky):
        prec = unpack_precision(precisions_cholesky)
        L = np.linalg.inv(prec.cholesky_inv)
        psi = 1.0 / prec.inv_noise
        W = psi[:, :, None] * np.matmul(prec.projection, np.swapaxes(L, 1, 2))
        return pack_parameters(W, psi)

    def log_det_cholesky(self, precisions_cholesky, n_features):
        return -0.5 * unpack_precision(precisions_cholesky).log_det

    def feature_variances(self, a):
        q = _n_factors(a)
        return a[:, :a.shape[1] - q, q]

    def hold_degenerate(self, covariances, previous_factors, components):
        """The M step's loadings and means, and the E step's noise variances where
        the M step's are not positive: a generalised M step, so the lower bound
        cannot decrease.

        The M step's ``[W_k, m_k]`` maximise the expected complete log-likelihood
        ``Q`` for any noise variances (each feature's row is a least-squares fit
        that does not involve ``psi_kj``), and ``Q`` increases as ``psi_kj`` moves
        from its E-step value towards the M step's (down to 0 for a component on
        fewer distinct points than features with ``reg_covar=0``). So these
        parameters have ``Q`` no lower than the E step's, and the log-likelihood
        no lower than the E step's (Dempster, Laird & Rubin 1977, theorem 1).

        Parameters
        ----------
        covariances : ndarray of shape (K, d + q, q + 1)
            The M step's packed parameters, modified in place.
        previous_factors : ndarray of shape (K, d + q, q + 1)
            The E step's packed factors (``1 / psi`` in ``[:, :d, q]``).
        components : list of int
            The degenerate components.

        Returns
        -------
        list of int
            The components repaired (those whose loadings are finite and whose
            E-step noise variances are positive and finite).
        """
        W, psi = unpack_parameters(covariances)
        q = _n_factors(previous_factors)
        d = psi.shape[1]
        held = []
        for k in components:
            with np.errstate(divide="ignore"):
                before = 1.0 / previous_factors[k, :d, q]
            if not (np.isfinite(W[k]).all() and np.isfinite(before).all()
                    and (before > 0).all()):
                continue
            ok = np.isfinite(psi[k]) & (psi[k] > 0.0)
            psi[k] = np.where(ok, psi[k], before)
            held.append(int(k))
        return held

    def pooled_covariance(self, weights, covariances, healthy):
        """The healthy components' pooled covariance as one factor analyser
        (:meth:`stream_start_covariance`), for a re-seeded component."""
        healthy = np.asarray(healthy)
        return self.stream_start_covariance(np.asarray(weights)[healthy],
                                            np.asarray(covariances)[healthy])

    # --------------------------------------------------------- the kernels
    def prepare_log_prob(self, weights, means, precisions_cholesky, dtype,
                         screen=None):
        """The certified screen of the model
        (:class:`~emgmm.covariance._factor_screen.FactorScreen`) where it pays:
        ``d >= MIN_FEATURES`` and more than one component."""
        K, d = np.shape(means)
        if K < 2 or d < factor_screen.MIN_FEATURES:
            return None
        return [factor_screen.FactorScreen.build(weights, means,
                                                 unpack_precision(precisions_cholesky))]

    def block_products(self, X, model, g=None):
        """The block's :class:`Projections` (its factorisation and shift) for the E
        step and the statistics of the same block."""
        return projections(X, model.means, self._precision(model), model.weights,
                           X.dtype, shift=g)

    @staticmethod
    def _precision(model):
        """The model's unpacked factorisation: its screen's (built once by the parent
        and shared with the workers, as the screen is), else unpacked once per model
        object (a task's blocks share it)."""
        for estimate in model.prepared or ():
            if isinstance(estimate, factor_screen.FactorScreen):
                return estimate.precision
        cached = model.__dict__.get("_factor_precision")
        if cached is None or cached[0] is not model.precisions_cholesky:
            cached = (model.precisions_cholesky,
                      unpack_precision(model.precisions_cholesky))
            model.__dict__["_factor_precision"] = cached
        return cached[1]

    def log_prob(self, X, means, precisions_cholesky, g, offset, margin=None,
                 products=None, out=None):
        if products is None:
            products = projections(X, means, unpack_precision(precisions_cholesky),
                                   dtype=X.dtype, shift=g)
        offset = np.broadcast_to(offset, (len(means),))
        return densities(X, means, products.precision, products, offset, margin)

    def block_statistics(self, X, resp, centers, resp_threshold=0.0, products=None,
                         out=None):
        """Summed over every pair where the E step computed every pair and enough
        of them hold a responsibility (:func:`dense_pays`), else over each
        component's rows of nonzero responsibility (a screened E step, or well
        separated components:
        :func:`~emgmm.covariance._factor_pairs.pair_statistics`)."""
        if products is None:
            raise ValueError("'factor' statistics need the block's projections")
        if not (products.computed and dense_pays(resp, resp_threshold)):
            return pair_statistics(X, resp, centers, products.means,
                                   products.precision, resp_threshold, out)
        stats = block_statistics(X, resp, centers, products.precision, products,
                                 resp_threshold)
        if out is None:
            return stats
        out += stats
        return out

    def concatenate_statistics(self, parts):
        return concatenate_statistics(parts)

    def m_step(self, stats, centers, reg_covar, overwrite=False):
        K, d, q = stats.sum_xz.shape
        weights, means, W, psi = m_step(stats, centers, reg_covar,
                                        threads_for_loop(K * d * (q + 1) ** 2))
        return weights, means, pack_parameters(W, psi)

    def recentring_terms(self, stats, means, covariances):
        """``scale``: the statistics' own ``sum_abs_x / N_k`` (pairs are summed
        around the E step's means, dense blocks around the mixture mean; ``|mu_k|``
        for statistics without it). ``left``: ``diag(W_k W_k^T) + psi_k``, the
        scale of the rounding of ``S_uu`` and ``W S_uz^T`` in the noise
        variances, which a second pass keeps."""
        W, psi = unpack_parameters(np.asarray(covariances, dtype=np.float64))
        left = psi + (W**2).sum(axis=2)
        if stats.sum_abs_x is None:
            return np.abs(means), left
        nk = stats.nk + 10 * np.finfo(np.float64).eps
        return stats.sum_abs_x / nk[:, None], left

    def m_step_covariances(self, stats, nk, shift, reg_covar, overwrite=False):
        raise NotImplementedError("'factor' moves means and loadings together: m_step")

    def covariances_from_responsibilities(self, X, resp, means, nk, reg_covar,
                                          sample_weight=None):
        if sample_weight is not None:  # the weighted responsibilities w_i r_ik
            resp = np.asarray(resp) * sample_weight[:, None]
        _, _, W, psi = initial_parameters(X, resp, self._q(), reg_covar)
        return pack_parameters(W, psi)

    # ------------------------------------------------ validation, sampling
    # ---------------------- no conjugate prior: BayesianGaussianMixture refuses it
    def _no_prior(self, *args, **kwargs):
        raise NotImplementedError("covariance_type='factor' has no conjugate prior "
                                  "for BayesianGaussianMixture")

    covariance_prior_shape = default_covariance_prior = check_covariance_prior = \
        posterior_covariances = weighted_mahalanobis = _no_prior

    def check_precisions(self, precisions, n_components, n_features):
        self.precisions_cholesky_from_precisions(precisions)

    def sampling_covariances(self, estimator):
        """The packed loadings and noise variances (not the dense covariances)."""
        return pack_parameters(estimator.loadings_, estimator.noise_variance_)

    def sample(self, rng, means, covariances, counts):
        W, psi = unpack_parameters(covariances)
        return [sample(rng, m[None], w[None], p[None], [int(c)])
                for m, w, p, c in zip(means, W, psi, counts, strict=False)]

    # ------------------------ stepwise online EM (_engine/online.py), O(K d q)
    #
    # The running statistics are those of the M step (FactorStatistics): the
    # complete-data sufficient statistics of the mixture of factor analysers,
    # linear in E[z | x] and E[z z^T | x], with only the diagonal of the second
    # moments (Ghahramani & Hinton 1996, section 3); stepwise EM (Cappe &
    # Moulines 2009) moves them as the Gaussian types' statistics.
    has_online_statistics = True

    _ONLINE_LATENT = ("sum_xz", "sum_z", "sum_zz")

    def second_moments_shape(self, n_components, n_features):
        return (n_components, n_features)

    def online_statistics_shapes(self, n_components, n_features, arrays=None):
        """``nk`` (K,), ``sum_x`` (K, d), ``sum_xx`` (K, d) (the diagonals),
        ``sum_xz`` (K, d, q), ``sum_z`` (K, q), ``sum_zz`` (K, q, q): ``O(K d q)``,
        no ``(d, d)`` array. ``q`` is ``n_factors``, or read off ``arrays["sum_zz"]``
        by the registry's instance."""
        q = self.n_factors
        if q is None and arrays is not None:
            # (-1 without sum_zz: the names then differ, which is the error)
            zz = arrays.get("sum_zz")
            q = np.shape(zz)[-1] if zz is not None and np.ndim(zz) else -1
        q = self._q() if q is None else q
        K, d = n_components, n_features
        return {"nk": (K,), "sum_x": (K, d), "sum_xx": (K, d), "sum_xz": (K, d, q),
                "sum_z": (K, q), "sum_zz": (K, q, q)}

    def shift_online_statistics(self, arrays, delta):
        """With ``u' = u - delta``: ``sum_xx' = sum_xx - 2 delta sum_x + N delta^2``,
        ``sum_x' = sum_x - N delta``, ``sum_xz' = sum_xz - delta sum_z^T``;
        ``nk``, ``sum_z`` and ``sum_zz`` unchanged (``E[z | x]`` does not depend on
        the centres). New arrays."""
        nk, s, z = arrays["nk"], arrays["sum_x"], arrays["sum_z"]
        return {"nk": nk.copy(), "sum_x": s - nk[:, None] * delta,
                "sum_xx": (arrays["sum_xx"] - 2.0 * delta * s
                           + nk[:, None] * delta**2),
                "sum_xz": arrays["sum_xz"] - delta[:, :, None] * z[:, None, :],
                "sum_z": z.copy(), "sum_zz": arrays["sum_zz"].copy()}

    def implied_online_statistics(self, weights, covariances, reg_covar, n_features):
        """The expected statistics of the model's own distribution around its
        means, per unit of weight: ``sum_zz = w_k I`` (``E[z z^T] = I``), ``sum_z =
        0``, ``sum_xz = w_k W_k`` (``E[u z^T] = W``) and ``sum_xx = w_k (diag(W_k
        W_k^T) + psi_k)``; the M step maps them back to ``(W_k, psi_k)`` (``psi_k >=
        reg_covar``, its floor; up to its ``10 eps`` guards). ``covariances``:
        packed (K, d + q, q + 1)."""
        W, psi = unpack_parameters(np.asarray(covariances, dtype=np.float64))
        w = np.asarray(weights, dtype=np.float64)
        K, _, q = W.shape
        return {"sum_xx": w[:, None] * ((W**2).sum(axis=2) + psi),
                "sum_xz": w[:, None, None] * W, "sum_z": np.zeros((K, q)),
                "sum_zz": w[:, None, None] * np.eye(q)}

    def online_m_step(self, stats, reg_covar):
        """:meth:`m_step` of the running statistics (as a
        :class:`~emgmm.covariance._factor_statistics.FactorStatistics`)."""
        arrays = stats.arrays()
        fs = FactorStatistics(*(arrays[name] for name in FactorStatistics._ARRAYS),
                              0.0, 0)
        return self.m_step(fs, stats.centers, reg_covar)

    def stream_start_covariance(self, weights, covariances):
        """The components' pooled covariance ``sum_k w_k (W_k W_k^T + Psi_k)`` as
        one factor analyser: the loadings are the top ``q`` singular directions of
        ``[sqrt(w_k) W_k]_k`` (d, K q) times their singular values, ``psi`` keeps the
        pooled diagonal (``>= min psi_k``). Not ``W = 0``: that is a fixed point of
        the factor EM (``E[z | x] = 0``, so the M step gives ``W = 0`` again), and
        a stream or a re-seeded component started there never leaves it."""
        W, psi = unpack_parameters(np.asarray(covariances, dtype=np.float64))
        K, d, q = W.shape
        w = np.asarray(weights, dtype=np.float64) / np.sum(weights)
        marginal = w @ (psi + (W**2).sum(axis=2))
        stacked = np.concatenate(np.sqrt(w)[:, None, None] * W, axis=1)  # (d, K q)
        U, s, _ = np.linalg.svd(stacked, full_matrices=False)
        loadings = U[:, :q] * s[:q]
        noise = np.maximum(marginal - (loadings**2).sum(axis=1), psi.min(axis=0))
        return pack_parameters(loadings[None], noise[None])[0]

    def widest_axis(self, covariance, n_features):
        """One standard deviation along the leading eigenvector of one packed
        component ``W W^T + diag(psi)``, by Lanczos on its ``O(d q)`` product
        (no ``(d, d)`` matrix; a fixed start, so deterministic)."""
        W, psi = unpack_parameters(np.asarray(covariance, dtype=np.float64))
        d = W.shape[0]
        if d <= _DENSE_AXIS_FEATURES:
            return widest_axis_of_matrix(W @ W.T + np.diag(psi))
        op = LinearOperator((d, d), matvec=lambda v: W @ (W.T @ v) + psi * v.ravel(),
                            dtype=np.float64)
        start = np.sqrt(psi + (W**2).sum(axis=1))
        values, vectors = eigsh(op, k=1, which="LA", v0=start, tol=0.0)
        return np.sqrt(max(values[0], 0.0)) * vectors[:, 0]
