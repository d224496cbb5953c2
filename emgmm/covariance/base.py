"""The covariance-type protocol: what the engine, the estimators, the memory model
and the model files ask of a covariance type.

A covariance type is a stateless object (one instance per type, in
:data:`emgmm.covariance.REGISTRY`) that owns everything specific to it: the shapes
of its parameters and their count, the factorisation of the covariances into
precision Cholesky factors and back, the log-density and statistics kernels of a
block, the covariance part of the M step, the sizes the memory model needs, the
layout of its factors in a model file and the validation of user-given precisions.

Shapes follow scikit-learn's ``covariances_`` (``(K, d, d)`` 'full', ``(d, d)``
'tied', ``(K, d)`` 'diag', ``(K,)`` 'spherical'); ``U`` is the precision Cholesky
factor with ``U @ U.T == precision`` (scikit-learn's ``precisions_cholesky_``).
Adding a type is one module with a subclass of :class:`CovarianceType` and one
line in the registry.
"""

from abc import ABC, abstractmethod

import numpy as np


def get_covariance_type(covariance_type):
    """The :class:`CovarianceType` registered under ``covariance_type``.

    Parameters
    ----------
    covariance_type : str or CovarianceType
        A name of :data:`emgmm.covariance.REGISTRY`, or a covariance type (returned
        as it is).

    Returns
    -------
    CovarianceType

    Raises
    ------
    ValueError
        If the name is not registered.
    """
    if isinstance(covariance_type, CovarianceType):
        return covariance_type
    from . import REGISTRY

    try:
        return REGISTRY[covariance_type]
    except (KeyError, TypeError):
        raise ValueError(f"unknown covariance_type {covariance_type!r} (one of "
                         f"{', '.join(map(repr, REGISTRY))})") from None


def check_shape(array, shape, name):
    """Raise ``ValueError`` (scikit-learn's wording) unless ``array.shape == shape``."""
    if array.shape != shape:
        raise ValueError(f"The parameter '{name}' should have the shape of {shape}, "
                         f"but got {array.shape}")


class CovarianceType(ABC):
    """One covariance type: its parameters, kernels, sizes and file layout.

    Attributes
    ----------
    name : str
        The ``covariance_type`` value that selects it.
    shared : bool
        One covariance for all components ('tied'): the components' statistics
        pool into it, a degenerate component cannot be re-seeded alone, and the
        component schedule keeps one slice.
    triangular : bool
        The factors are triangular matrices (checked upper triangular).
    uses_centred_products : bool
        The E step's centred products of a block
        (:func:`~emgmm.covariance.log_density.centred_products`) serve its
        statistics too.
    streams_blocks : bool
        Cheap per-row work: blocks are capped at the memory model's streaming size.
    """

    name = None
    shared = False
    triangular = False
    uses_centred_products = False
    streams_blocks = False

    def __repr__(self):
        return f"<covariance type {self.name!r}>"

    def __reduce__(self):
        # one instance per type, also in worker processes
        return (get_covariance_type, (self.name,))

    # ------------------------------------------------------------ shapes, sizes

    @abstractmethod
    def covariance_shape(self, n_components, n_features):
        """Shape of the covariances, precisions and their factors (a tuple)."""

    @abstractmethod
    def n_parameters(self, n_components, n_features):
        """Free parameters of the covariances (an int)."""

    @abstractmethod
    def statistics_values(self, n_components, n_features):
        """float64 values of one task's second-moment statistics (an int)."""

    @abstractmethod
    def work_per_row(self, n_features):
        """Multiply-adds per row and component of one E step plus statistics."""

    def covariance_values(self, n_components, n_features):
        """float64 values of one covariance array."""
        return int(np.prod(self.covariance_shape(n_components, n_features)))

    def component_values(self, n_features):
        """float64 values of one component's factor (the component schedule's
        slices are cut by these)."""
        return int(np.prod(self.covariance_shape(1, n_features)))

    def factor_terms(self, n_features):
        """Products of two factor entries summed in one precision entry."""
        return n_features

    # ------------------------------------------------------- parameterisation

    def factor_limit(self, n_features, dtype=np.float64):
        """The bound on ``|U_ij|`` below which every precision formed from the
        factors is finite in ``dtype``: ``sqrt(max / terms)`` (an entry of
        ``U U^T`` sums ``terms`` products of two entries of ``U``)."""
        return np.sqrt(np.finfo(dtype).max / self.factor_terms(n_features))

    @abstractmethod
    def factorize(self, covariances, dtype=np.float64, threads=1):
        """Precision Cholesky factors and the components whose covariance is not
        positive definite (see :func:`emgmm.covariance.cholesky.factorize`)."""

    @abstractmethod
    def precisions_cholesky_from_precisions(self, precisions):
        """Upper factors ``U`` with ``U U^T = precision``."""

    @abstractmethod
    def precisions_from_cholesky(self, precisions_cholesky):
        """Precisions ``U U^T``."""

    @abstractmethod
    def covariances_from_cholesky(self, precisions_cholesky):
        """Covariances ``(U U^T)^{-1}``."""

    @abstractmethod
    def log_det_cholesky(self, precisions_cholesky, n_features):
        """``log det U_k`` per component ((K,), or a scalar when shared)."""

    @abstractmethod
    def feature_variances(self, a):
        """The diagonals of covariances or precisions ``a``, broadcastable to
        ``(K, d)``."""

    def per_component(self, a):
        """``a`` with one component per entry of its first axis (shared: one)."""
        return np.asarray(a)

    def slice_factors(self, precisions_cholesky, k0, k1):
        """The factors of components ``k0:k1`` (shared: all of them)."""
        return precisions_cholesky[k0:k1]

    def pooled_covariance(self, weights, covariances, healthy):
        """The covariance a re-seeded component gets: the weighted mean of the
        healthy components' (``None`` when shared: the shared one is kept)."""
        hw = weights[healthy] / weights[healthy].sum()
        return np.tensordot(hw, covariances[healthy], axes=1)

    def first_failure(self, bad):
        """The component to name in an error for the failed components ``bad``
        (``None`` when shared)."""
        return bad[0]

    # ----------------------------------------------------------- the kernels

    def prepare_log_prob(self, weights, means, precisions_cholesky, dtype):
        """Work on the parameters that every block of a pass shares, or ``None``."""
        return None

    @abstractmethod
    def log_prob(self, X, means, precisions_cholesky, g, offset, margin=None,
                 products=None, out=None):
        """``offset_k - 1/2 (x - mu_k)^T Lambda_k (x - mu_k)`` of every row and
        component, (n, K) float64, with the distances expanded around the shift
        ``g`` (d,); ``offset`` (K,) holds ``log det U_k - d/2 log(2 pi)`` and, for
        the E step, ``log w_k``. See
        :func:`emgmm.covariance.log_density.log_gaussian_prob`."""

    @abstractmethod
    def block_statistics(self, X, resp, centers, resp_threshold=0.0, products=None,
                         out=None):
        """Sufficient statistics of one block centred on ``centers`` (see
        :func:`emgmm.covariance.statistics.block_statistics`)."""

    @abstractmethod
    def m_step_covariances(self, stats, nk, shift, reg_covar, overwrite=False):
        """Covariances of the M step from the summed statistics, the regularised
        counts ``nk`` (K,) and the shifts ``s_k / N_k`` (K, d) of the means."""

    def covariances_from_responsibilities(self, X, resp, means, nk, reg_covar):
        """Initial covariances from a sample ``X`` and its responsibilities
        (scikit-learn's ``_estimate_gaussian_parameters``)."""
        from .m_step import m_step
        from .statistics import block_statistics

        stats = block_statistics(X, resp, means, self)
        return m_step(stats, means, reg_covar, self)[2]

    # -------------------------------------------------------- model files

    def factor_name(self, index):
        """How messages name the precision Cholesky factor of component ``index``."""
        return f"precisions_cholesky of component {index}"

    def factor_diagonals(self, stack):
        """The diagonals of the factors ``stack`` (one component per entry)."""
        return np.asarray(stack)

    def first_below_diagonal(self, stack):
        """``(k, i, j)`` of the first nonzero entry below a factor's diagonal in
        ``stack``, or ``None``."""
        return None

    # ---------------------------------------------------------- validation

    @abstractmethod
    def check_precisions(self, precisions, n_components, n_features):
        """Raise ``ValueError`` (scikit-learn's wording) unless ``precisions``, a
        float array, has the type's shape and is positive (definite)."""

    # ---------------------------------------------------------- sampling

    @abstractmethod
    def sample(self, rng, means, covariances, counts):
        """``counts[k]`` draws of each component, as scikit-learn draws them: a
        list of arrays, one per component."""
