"""emgmm.GaussianMixture: scikit-learn's estimator, fitted by blocked single-pass EM."""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from numbers import Integral, Real
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike

from .._engine import online
from .._engine.degenerate import initial_factors
from .._engine.model import Model
from .._runtime.blas import single_blas_thread
from ..covariance import REGISTRY
from ..covariance._cholesky import (
    covariances_from_cholesky,
    precisions_cholesky_from_precisions,
)
from .base import BaseMixture, DataLike, WeightLike
from .initialization import (
    initial_responsibilities,
    parameters_from_responsibilities,
)
from .parameter_docs import fill_parameter_docs
from .validation import (
    Interval,
    StrOptions,
    check_means,
    check_precisions,
    check_weights,
)


@fill_parameter_docs(
    checkpoint_interval=":meth:`partial_fit` writes after every call.")
class GaussianMixture(BaseMixture):
    """Gaussian mixture fitted by exact, blocked, out-of-core EM.

    A drop-in for :class:`sklearn.mixture.GaussianMixture` (same parameters, defaults,
    attributes and methods) that also reads ``np.memmap``, ``.npy`` and HDF5 data in
    row blocks, never holding an array of ``n_samples`` rows in ``fit``, and runs the
    blocks on joblib workers. One EM iteration reads ``X`` once: the E step (Bishop,
    *Pattern Recognition and Machine Learning*, 2006, eq. 9.23) and the sufficient
    statistics of the M step (eq. 9.24-9.27) are fused per block; the statistics are
    accumulated in float64 around the previous means.

    Parameters
    ----------
    n_components : int, default=1
        Number of mixture components.
    covariance_type : {'full', 'tied', 'diag', 'spherical', 'factor'}, default='full'
        'full': each component has its own covariance matrix; 'tied': one shared
        matrix; 'diag': each its own diagonal; 'spherical': each its own variance;
        'factor': each ``W_k W_k^T + diag(psi_k)`` with ``n_factors`` factors (a
        mixture of factor analysers, Ghahramani & Hinton 1996; see
        the user guide page :doc:`/factor`).
    n_factors : int, default=10
        Factors per component for 'factor' (``0 <= n_factors <= n_features``; 0 is
        'diag'); ignored by the other types.
    tol : float, default=1e-3
        Convergence threshold: EM stops when the absolute change of the mean
        per-sample log-likelihood (nats per sample) between two iterations is below
        ``tol``.
    reg_covar : float, default=1e-6
        Non-negative value added to the diagonal of every covariance ('factor':
        the floor of its noise variances, its M step's maximiser under that bound).
    max_iter : int, default=100
        Number of EM iterations per initialisation.
    n_init : int, default=1
        Number of initialisations; the run whose final parameters have the highest
        mean log-likelihood is kept.
    init_params : {'kmeans', 'k-means++', 'random', 'random_from_data'}, \
default='kmeans'
        How the initial responsibilities are found, as in scikit-learn, computed on a
        random subsample of at most ``init_max_samples`` rows (all rows when there are
        no more than that; then the initialisation equals scikit-learn's).
    weights_init : array-like of shape (n_components,), default=None
        Initial weights.
    means_init : array-like of shape (n_components, n_features), default=None
        Initial means.
    precisions_init : array-like, default=None
        Initial precisions (inverse covariances), shaped like ``precisions_``.
    random_state : int, RandomState instance or None, default=None
        Seeds the initialisation, the subsample and :meth:`sample`.
    warm_start : bool, default=False
        Start the next ``fit`` from the current parameters (``n_init`` is then 1).
        The first iteration's change is measured against the previous fit's last
        iteration's bound, ``lower_bounds_[-1]`` (scikit-learn's ``lower_bound_``),
        so a loop of warm-started ``max_iter=1`` fits converges where one fit
        would.
    verbose : int, default=0
        1 prints each initialisation and iteration; 2 also times and lower bounds.
    verbose_interval : int, default=10
        Iterations between two messages.
    %(n_jobs)s
    %(temp_folder)s
    %(working_memory)s
    %(block_size)s
    %(memory_limit)s
    %(schedule)s
    %(init_max_samples)s
    %(compute_dtype)s
    %(resp_threshold)s
    on_degenerate : {'reinit', 'raise'}, default='reinit'
        For a component whose covariance is not positive definite after
        ``reg_covar``, or whose weight falls below a thousandth of one sample
        (``N_k < 1e-3``; scikit-learn keeps a k-means singleton, so does emgmm):
        'reinit' re-seeds it
        on the worst-explained sample, warns and records it in ``history_``;
        'raise' raises scikit-learn's ``ValueError`` for a covariance that is not
        positive definite and keeps a starved component, as scikit-learn does
        (its weight near 0, its covariance ``reg_covar``). Both raise when no
        component is healthy or one re-seeded 10 times degenerates again. See the
        user guide, "Degenerate components".
    %(callback)s
    %(checkpoint)s
    %(checkpoint_interval)s
    learning_decay : float, default=0.7
        ``alpha`` of the step size ``eta_t = (t + learning_offset) ** -alpha`` of
        :meth:`partial_fit`, in ``(0.5, 1]`` (scikit-learn's name and default, from
        its online ``LatentDirichletAllocation``).
    learning_offset : float, default=10.0
        ``t0 >= 0`` of the step size: damps the first steps of a stream.

    Attributes
    ----------
    weights_ : ndarray of shape (n_components,)
        Mixture weights, summing to 1.
    means_ : ndarray of shape (n_components, n_features)
    covariances_ : ndarray
        (n_components, n_features, n_features) 'full'; (n_features, n_features)
        'tied'; (n_components, n_features) 'diag'; (n_components,) 'spherical';
        for 'factor' not stored: ``W_k W_k^T + diag(psi_k)`` as (n_components,
        n_features, n_features) float64, formed each time it is read (as are
        ``precisions_`` and ``precisions_cholesky_``; a ``UserWarning`` beyond
        256 MiB, ``emgmm.covariance._factor.DENSE_WARN_MIB``).
    precisions_ : ndarray
        Inverses of the covariances, same shapes.
    precisions_cholesky_ : ndarray
        Upper-triangular factors ``U`` of the precisions: ``U @ U.T == precisions_``
        for 'full' (per component) and 'tied'; for 'diag' and 'spherical' the
        elementwise square roots of the precisions. Same shapes.
    loadings_ : ndarray of shape (n_components, n_features, n_factors)
        'factor' only: the loadings ``W_k`` (scikit-learn's ``FactorAnalysis``
        stores one ``(n_factors, n_features)`` ``components_``; here one
        ``(d, q)`` matrix per component, as in ``x = mu_k + W_k z + e``). Defined
        up to a rotation ``W_k R``.
    noise_variance_ : ndarray of shape (n_components, n_features)
        'factor' only: ``psi_k`` (at least ``reg_covar``).
    converged_ : bool
        Whether the kept run met ``tol``.
    n_iter_ : int
        EM iterations of the kept run.
    lower_bound_ : float
        Mean log-likelihood of the training data under the returned parameters
        (equals ``score(X)`` up to the order of the sum, ~1e-16 relative; for
        float32 data, the parameters as rounded to float32). scikit-learn reports
        the value before the last M step.
    lower_bounds_ : list of float
        ``lower_bounds_[i]`` is the mean log-likelihood computed in the E step of
        iteration ``i + 1`` of the kept run, i.e. of the parameters entering it
        (scikit-learn's meaning).
    history_ : list of dict
        One record per iteration of the kept run (see ``callback``).
    n_steps_ : int
        :meth:`partial_fit` calls of the stream since it started (0 after
        :meth:`fit`).
    n_features_in_ : int
    feature_names_in_ : ndarray of shape (``n_features_in_``,)
        Only when ``X`` has string feature names.

    Notes
    -----
    Data sources accepted by every method taking ``X``: array-likes, ``np.memmap``,
    a path to a ``.npy`` file (memory-mapped read-only), an ``h5py.Dataset`` and the
    string ``"file.h5:/path/to/dataset"``. Files are only read. ``sample_weight``
    (of :meth:`fit`, :meth:`partial_fit`, :meth:`score`, :meth:`bic`, :meth:`aic`)
    takes the same kinds of sources, 1-D.

    Examples
    --------
    >>> import numpy as np
    >>> from emgmm import GaussianMixture
    >>> rng = np.random.default_rng(0)
    >>> X = np.vstack([rng.normal(-5, 1, size=(500, 2)),
    ...                rng.normal(5, 1, size=(500, 2))])
    >>> gm = GaussianMixture(n_components=2, random_state=0).fit(X)
    >>> bool(gm.converged_)
    True
    >>> np.sort(gm.means_[:, 0]).round()
    array([-5.,  5.])
    >>> labels = gm.predict([[-5.0, -5.0], [5.0, 5.0]])
    >>> bool(labels[0] != labels[1])
    True
    >>> proba = gm.predict_proba(X[:3])
    >>> proba.shape
    (3, 2)
    >>> bool(np.allclose(proba.sum(axis=1), 1.0))
    True

    The same fit from a ``.npy`` file, read in row blocks:

    >>> import os, tempfile
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     path = os.path.join(folder, "X.npy")
    ...     np.save(path, X)
    ...     from_file = GaussianMixture(n_components=2, random_state=0).fit(path)
    >>> bool(np.allclose(from_file.means_, gm.means_))
    True
    """

    _parameter_constraints: dict = {
        **BaseMixture._parameter_constraints,
        "covariance_type": [StrOptions(REGISTRY)],
        "n_factors": [Interval(Integral, 0, None, closed="left")],
        "weights_init": ["array-like", None],
        "means_init": ["array-like", None],
        "precisions_init": ["array-like", None],
        "on_degenerate": [StrOptions({"reinit", "raise"})],
        "learning_decay": [Interval(Real, 0.5, 1.0, closed="right")],
        "learning_offset": [Interval(Real, 0.0, None, closed="left")],
    }

    def __init__(
        self,
        n_components: int = 1,
        *,
        covariance_type: str = "full",
        n_factors: int = 10,
        tol: float = 1e-3,
        reg_covar: float = 1e-6,
        max_iter: int = 100,
        n_init: int = 1,
        init_params: Literal["kmeans", "k-means++", "random",
                             "random_from_data"] = "kmeans",
        weights_init: ArrayLike | None = None,
        means_init: ArrayLike | None = None,
        precisions_init: ArrayLike | None = None,
        random_state: int | np.random.RandomState | None = None,
        warm_start: bool = False,
        verbose: int = 0,
        verbose_interval: int = 10,
        n_jobs: int | None = None,
        temp_folder: str | os.PathLike[str] | None = None,
        working_memory: float | None = None,
        block_size: int | None = None,
        memory_limit: float | None = None,
        schedule: Literal["auto", "rows", "components", "pairs"] = "auto",
        init_max_samples: int = 100_000,
        compute_dtype: Literal["float32", "float64"] | None = None,
        resp_threshold: float = 1e-20,
        on_degenerate: Literal["reinit", "raise"] = "reinit",
        callback: Callable[[dict[str, Any]], Any] | None = None,
        checkpoint: str | os.PathLike[str] | None = None,
        checkpoint_interval: float = 0.0,
        learning_decay: float = online.DEFAULT_LEARNING_DECAY,
        learning_offset: float = online.DEFAULT_LEARNING_OFFSET,
    ) -> None:
        self.n_components = n_components
        self.covariance_type = covariance_type
        self.n_factors = n_factors
        self.tol = tol
        self.reg_covar = reg_covar
        self.max_iter = max_iter
        self.n_init = n_init
        self.init_params = init_params
        self.weights_init = weights_init
        self.means_init = means_init
        self.precisions_init = precisions_init
        self.random_state = random_state
        self.warm_start = warm_start
        self.verbose = verbose
        self.verbose_interval = verbose_interval
        self.n_jobs = n_jobs
        self.temp_folder = temp_folder
        self.working_memory = working_memory
        self.block_size = block_size
        self.memory_limit = memory_limit
        self.schedule = schedule
        self.init_max_samples = init_max_samples
        self.compute_dtype = compute_dtype
        self.resp_threshold = resp_threshold
        self.on_degenerate = on_degenerate
        self.callback = callback
        self.checkpoint = checkpoint
        self.checkpoint_interval = checkpoint_interval
        self.learning_decay = learning_decay
        self.learning_offset = learning_offset

    # ------------------------------------------------------------ parameters

    def _check_initial_parameters(self, n_features):
        """Validated copies of the *_init parameters (never stored on self)."""
        self._kind().check_n_features(n_features)
        weights = means = precisions = None
        if self.weights_init is not None:
            weights = check_weights(self.weights_init, self.n_components)
        if self.means_init is not None:
            means = check_means(self.means_init, self.n_components, n_features)
        if self.precisions_init is not None:
            precisions = check_precisions(self.precisions_init, self._kind(),
                                          self.n_components, n_features)
        return weights, means, precisions

    def _initial_model(self, source, random_state, inits, block_size,
                       sample_weights=None):
        weights_init, means_init, precisions_init = inits
        weights = means = covariances = None
        sample_weight = None
        if weights_init is None or means_init is None or precisions_init is None:
            sample, sample_weight = self._init_sample(source, random_state, block_size,
                                                      sample_weights)
            resp = initial_responsibilities(sample, self.n_components, self.init_params,
                                            random_state, sample_weight)
            weights, means, covariances = parameters_from_responsibilities(
                sample, resp, self.reg_covar, self._kind(), sample_weight
            )
        if weights_init is not None:
            weights = np.asarray(weights_init, dtype=np.float64)
        if means_init is not None:
            means = np.asarray(means_init, dtype=np.float64)
        if precisions_init is None:
            u = initial_factors(covariances, self._kind(), self.on_degenerate,
                                init_params=self.init_params)
        else:
            u = precisions_cholesky_from_precisions(
                np.asarray(precisions_init, dtype=np.float64), self.covariance_type
            )
            covariances = covariances_from_cholesky(u, self.covariance_type)
        return Model(weights, means, covariances, u, self.covariance_type)

    def _fitted_model(self):
        """The fitted attributes as a float64 :class:`Model`.

        Raises
        ------
        ValueError
            If the attributes hold no valid covariances, e.g. a
            ``precisions_cholesky_`` set by hand to ``numpy.linalg.cholesky``'s
            lower factor (see :meth:`CovarianceType.model_arrays`).
        """
        covariances, factors = self._kind().model_arrays(self.__dict__)
        return Model(np.asarray(self.weights_, dtype=np.float64),
                     np.asarray(self.means_, dtype=np.float64), covariances, factors,
                     self.covariance_type)

    def _set_model(self, model, dtype, precisions):
        # the covariances' attributes of an earlier fit of another type (any
        # registered one, also registered after this module was imported)
        for name in {n for kind in REGISTRY.values() for n in kind.attribute_names}:
            self.__dict__.pop(name, None)
        self.weights_ = model.weights.astype(dtype)
        self.means_ = model.means.astype(dtype)
        self.__dict__.update(self._kind().fitted_attributes(model, dtype, precisions))

    _precisions_on_demand = True

    @functools.cached_property
    def precisions_(self) -> np.ndarray:
        """Inverses of the covariances, ``U U^T`` from ``precisions_cholesky_``:
        formed on first access (one BLAS thread: the same for any ``n_jobs``) and
        kept; a fit sets it anew. ('factor': formed from the loadings.)"""
        if "precisions_cholesky_" not in self.__dict__:  # unfitted, or 'factor'
            return self.__getattr__("precisions_")
        return self._stored_precisions(self.precisions_cholesky_)

    def _stored_precisions(self, precisions_cholesky):
        with single_blas_thread():
            return self._kind().precisions_from_cholesky(
                np.asarray(precisions_cholesky))

    def __getattr__(self, name):
        # (only called when normal lookup fails) the attributes a covariance type
        # forms on demand: the dense ones of 'factor'
        state = self.__dict__
        missing = AttributeError(f"{type(self).__name__!r} object has no attribute "
                                 f"{name!r}")
        try:
            return REGISTRY[state["covariance_type"]].derived_attribute(state, name)
        except (KeyError, TypeError):
            raise missing from None
        except AttributeError as exc:
            if exc.args != (name,):  # the type's own reason (e.g. too large)
                raise
            raise missing from None

    # ---------------------------------------------------------- model choice

    def _n_parameters(self):
        """Free parameters of the model."""
        _, d = self.means_.shape
        K = self.n_components
        return int(self._kind().n_parameters(K, d) + d * K + K - 1)

    def bic(self, X: DataLike, sample_weight: WeightLike | None = None) -> float:
        """Bayesian information criterion, ``-2 log L + p log n`` (Schwarz, 1978).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), np.memmap, str or h5py.Dataset
            The data, from any source :meth:`fit` accepts.
        sample_weight : see :meth:`fit`
            With weights, ``log L = sum_i w_i log p(x_i)`` and ``n = sum_i w_i``.

        Returns
        -------
        float
            The lower the better.
        """
        n, score = self._n_and_score(X, sample_weight)
        return -2 * score * n + self._n_parameters() * math.log(n)

    def aic(self, X: DataLike, sample_weight: WeightLike | None = None) -> float:
        """Akaike information criterion, ``-2 log L + 2 p`` (Akaike, 1974).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), np.memmap, str or h5py.Dataset
            The data, from any source :meth:`fit` accepts.
        sample_weight : see :meth:`fit`
            With weights, ``log L = sum_i w_i log p(x_i)``.

        Returns
        -------
        float
            The lower the better.
        """
        n, score = self._n_and_score(X, sample_weight)
        return -2 * score * n + 2 * self._n_parameters()

