"""emgmm.GaussianMixture: scikit-learn's estimator, fitted by blocked single-pass EM."""

import math
import os
import warnings
from contextlib import nullcontext
from numbers import Integral, Real

import numpy as np
from sklearn import get_config
from sklearn.base import BaseEstimator, DensityMixin, _fit_context
from sklearn.exceptions import ConvergenceWarning
from sklearn.mixture._gaussian_mixture import _check_means, _check_precisions, _check_weights
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted, validate_data

from ..io.checkpoint import open_checkpointer
from ..covariance.cholesky import (
    covariances_from_cholesky,
    entry_below_diagonal,
    not_upper_triangular_message,
    precisions_cholesky_from_precisions,
    precisions_from_cholesky,
)
from ..engine.component_schedule import component_statistics_pass
from ..engine.em import (
    Model,
    check_explained,
    explain_worker_loss,
    initial_factors,
    rows_statistics_pass,
    run_em,
    score_pass,
)
from ..engine.estep import SCORE_MARGIN, estimate_log_prob_resp
from .initialization import initial_responsibilities, parameters_from_responsibilities, subsample_indices
from ..runtime.memory import (
    block_rows,
    bytes_per_row,
    choose_schedule,
    partition,
    row_threads_worthwhile,
    tasks_are_tiny,
)
from ..runtime.executor import Executor
from ..io.sources import ArraySource, as_source, is_file_backed


def _as_stored(model, dtype):
    """``model`` as the fitted attributes of ``dtype`` hold it, in float64."""
    if np.dtype(dtype) == np.float64:
        return model
    stored = (np.asarray(a).astype(dtype).astype(np.float64) for a in (
        model.weights, model.means, model.covariances, model.precisions_cholesky))
    return Model(*stored, model.covariance_type)


def _variances(a, covariance_type):
    """The diagonals of covariance or precision attributes ``a``."""
    if covariance_type == "full":
        return np.diagonal(a, axis1=1, axis2=2)
    if covariance_type == "tied":
        return np.diagonal(a)
    return a


def _check_attributes_hold(model, precisions, dtype):
    """Raise ``ValueError`` when float32 attributes (those of float32 data computed
    in float32) cannot hold the fitted ``model``: a covariance beyond float32's range
    (data of scale ~1e20 and more: variances ~1e40), or a variance or precision that
    rounds to zero (scale ~1e-23 and less, or ~1e30 and more). ``precisions`` are
    those of the attributes, in ``dtype``."""
    if np.dtype(dtype) == np.float64:
        return
    covariances = model.covariances.astype(dtype)
    arrays = (covariances, model.precisions_cholesky.astype(dtype), precisions)
    kind = model.covariance_type
    if (all(np.isfinite(a).all() for a in arrays)
            and (_variances(covariances, kind) > 0).all()
            and (_variances(precisions, kind) > 0).all()):
        return
    variances = _variances(model.covariances, kind)
    raise ValueError(
        f"The fitted model does not fit in {np.dtype(dtype).name} attributes (those of "
        f"{np.dtype(dtype).name} data computed in {np.dtype(dtype).name}): its "
        f"variances range from {variances.min():.3g} to {variances.max():.3g}, and "
        "a covariance or precision would be infinite or zero. Scale the data, or fit "
        "with compute_dtype='float64', which keeps float64 attributes."
    )


def _normalised_exp(log_resp):
    """``exp(log_resp)`` with every row divided by its sum (in place of the exp)."""
    resp = np.exp(log_resp)
    resp /= resp.sum(axis=1, keepdims=True)
    return resp


class GaussianMixture(DensityMixin, BaseEstimator):
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
    covariance_type : {'full', 'tied', 'diag', 'spherical'}, default='full'
        'full': each component has its own covariance matrix; 'tied': one shared
        matrix; 'diag': each its own diagonal; 'spherical': each its own variance.
    tol : float, default=1e-3
        Convergence threshold: EM stops when the absolute change of the mean
        per-sample log-likelihood (nats per sample) between two iterations is below
        ``tol``.
    reg_covar : float, default=1e-6
        Non-negative value added to the diagonal of every covariance.
    max_iter : int, default=100
        Number of EM iterations per initialisation.
    n_init : int, default=1
        Number of initialisations; the run whose final parameters have the highest
        mean log-likelihood is kept.
    init_params : {'kmeans', 'k-means++', 'random', 'random_from_data'}, default='kmeans'
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
        Start the next ``fit`` from the current parameters (``n_init`` is then 1). A
        warm start always runs at least two iterations: the first change is measured
        from minus infinity, not from the previous data's lower bound.
    verbose : int, default=0
        1 prints each initialisation and iteration; 2 also times and lower bounds.
    verbose_interval : int, default=10
        Iterations between two messages.
    n_jobs : int or None, default=None
        Workers for the passes over the data, with joblib's meaning (``-1``: all
        cores). ``None`` follows ``joblib.parallel_config``; when that gives one
        worker, the blocks of a pass run in threads of this process with one BLAS
        thread each (the same result bit for bit). An explicit ``1`` runs them one
        after the other. See the user guide, "Parallelism".
    working_memory : float or None, default=None
        Memory for one block's working set, in MiB, per worker. ``None`` uses
        ``sklearn.get_config()["working_memory"]`` (1024 by default).
    block_size : int or None, default=None
        Rows per block; overrides ``working_memory``.
    memory_limit : float or None, default=None
        Budget in MiB for the copies of the model held by the parent and its
        workers; ``fit`` raises ``MemoryError`` up front when the estimate exceeds
        it. ``None`` uses the physical memory available when ``fit`` starts.
    schedule : {'auto', 'rows', 'components'}, default='auto'
        How a pass shares the work: 'rows' gives a task a range of rows and all
        components; 'components' a slice of components and a range of rows, so no
        worker holds the whole model (``X`` read twice per iteration). 'auto'
        picks 'components' when workers would hold over 64 MiB of statistics
        each, or when only it fits the memory.
    init_max_samples : int, default=100_000
        Rows in the initialisation subsample.
    compute_dtype : {'float32', 'float64'} or None, default=None
        Dtype of the heavy products of the E step; ``None`` follows the data.
        ``'float32'`` on float64 data fits the data rounded to float32. The pairs
        that may reach ``resp_threshold`` are recomputed in float64 where float32
        is not accurate enough, and every sum is accumulated in float64. See the
        user guide, "float32".
    resp_threshold : float, default=1e-20
        Responsibilities at most this are left out of the statistics ``N_k``,
        ``s_k``, ``S_k`` ('full'; 'diag' and 'spherical' from 24 features on), and
        'full' computes exactly only the pairs that may exceed it. A pair left out
        moves ``S_k``, in its metric, by at most ``r_ik`` times its squared
        Mahalanobis distance: ~1e-18 at the default. ``0.0`` computes every pair
        exactly.
    on_degenerate : {'reinit', 'raise'}, default='reinit'
        For a component whose covariance is not positive definite after
        ``reg_covar``, or whose weight falls below one sample: 'reinit' re-seeds it
        on the worst-explained sample, warns and records it in ``history_``;
        'raise' raises scikit-learn's ``ValueError``. Both raise when no component
        is healthy or one re-seeded 10 times degenerates again. See the user
        guide, "Degenerate components".
    callback : callable or None, default=None
        Called after every EM iteration with a dict (``event='iteration'``,
        ``init``, ``n_iter``, ``lower_bound``, ``change``, ``seconds``,
        ``reseeded``). If its attribute ``wants_progress`` is true, it is also
        called after each finished task of a pass with ``{'event': 'progress',
        'done': int, 'total': int}``.
    checkpoint : str, os.PathLike or None, default=None
        Path of a checkpoint file (``.npz``, no pickle), written atomically after EM
        iterations. A fit of the same data and parameters resumes from it to the
        model of an uninterrupted fit; other data or parameters raise
        ``ValueError``, an unwritable folder ``OSError``, a concurrent fit on the
        same path ``RuntimeError``. Removed when ``fit`` completes (user guide,
        "Checkpoints").
    checkpoint_interval : float, default=0.0
        Minimum seconds between two checkpoint writes; 0 writes after every
        iteration.

    Attributes
    ----------
    weights_ : ndarray of shape (n_components,)
        Mixture weights, summing to 1.
    means_ : ndarray of shape (n_components, n_features)
    covariances_ : ndarray
        (n_components, n_features, n_features) 'full'; (n_features, n_features)
        'tied'; (n_components, n_features) 'diag'; (n_components,) 'spherical'.
    precisions_ : ndarray
        Inverses of the covariances, same shapes.
    precisions_cholesky_ : ndarray
        Upper-triangular factors ``U`` of the precisions: ``U @ U.T == precisions_``
        for 'full' (per component) and 'tied'; for 'diag' and 'spherical' the
        elementwise square roots of the precisions. Same shapes.
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
    n_features_in_ : int
    feature_names_in_ : ndarray of shape (``n_features_in_``,)
        Only when ``X`` has string feature names.

    Notes
    -----
    Data sources accepted by every method taking ``X``: array-likes, ``np.memmap``,
    a path to a ``.npy`` file (memory-mapped read-only), an ``h5py.Dataset`` and the
    string ``"file.h5:/path/to/dataset"``. Files are only read.

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
        "n_components": [Interval(Integral, 1, None, closed="left")],
        "covariance_type": [StrOptions({"full", "tied", "diag", "spherical"})],
        "tol": [Interval(Real, 0.0, None, closed="left")],
        "reg_covar": [Interval(Real, 0.0, None, closed="left")],
        "max_iter": [Interval(Integral, 0, None, closed="left")],
        "n_init": [Interval(Integral, 1, None, closed="left")],
        "init_params": [StrOptions({"kmeans", "random", "random_from_data", "k-means++"})],
        "weights_init": ["array-like", None],
        "means_init": ["array-like", None],
        "precisions_init": ["array-like", None],
        "random_state": ["random_state"],
        "warm_start": ["boolean"],
        "verbose": ["verbose"],
        "verbose_interval": [Interval(Integral, 1, None, closed="left")],
        # joblib gives 0 no meaning ("n_jobs == 0 in Parallel has no meaning")
        "n_jobs": [Interval(Integral, None, -1, closed="right"),
                   Interval(Integral, 1, None, closed="left"), None],
        "working_memory": [Interval(Real, 0, None, closed="neither"), None],
        "block_size": [Interval(Integral, 1, None, closed="left"), None],
        "memory_limit": [Interval(Real, 0, None, closed="neither"), None],
        "schedule": [StrOptions({"auto", "rows", "components"})],
        "init_max_samples": [Interval(Integral, 1, None, closed="left")],
        "compute_dtype": [StrOptions({"float32", "float64"}), None],
        "resp_threshold": [Interval(Real, 0.0, 1.0, closed="left")],
        "on_degenerate": [StrOptions({"reinit", "raise"})],
        "callback": [callable, None],
        "checkpoint": [str, os.PathLike, None],
        "checkpoint_interval": [Interval(Real, 0.0, None, closed="left")],
    }

    def __init__(
        self,
        n_components=1,
        *,
        covariance_type="full",
        tol=1e-3,
        reg_covar=1e-6,
        max_iter=100,
        n_init=1,
        init_params="kmeans",
        weights_init=None,
        means_init=None,
        precisions_init=None,
        random_state=None,
        warm_start=False,
        verbose=0,
        verbose_interval=10,
        n_jobs=None,
        working_memory=None,
        block_size=None,
        memory_limit=None,
        schedule="auto",
        init_max_samples=100_000,
        compute_dtype=None,
        resp_threshold=1e-20,
        on_degenerate="reinit",
        callback=None,
        checkpoint=None,
        checkpoint_interval=0.0,
    ):
        self.n_components = n_components
        self.covariance_type = covariance_type
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

    # ------------------------------------------------------------------ input

    def _source(self, X, *, reset):
        """Validate ``X`` and wrap it in a Source (sklearn validation for arrays)."""
        if is_file_backed(X):
            source = as_source(X)
            n, d = source.shape
            if reset:
                if n < 2:
                    raise ValueError(
                        f"Found array with {n} sample(s) (shape={source.shape}) while a "
                        f"minimum of 2 is required by {type(self).__name__} "
                        f"({source.description})."
                    )
                if d < 1:
                    raise ValueError(
                        f"Found array with 0 feature(s) (shape={source.shape}) while a "
                        f"minimum of 1 is required by {type(self).__name__} "
                        f"({source.description})."
                    )
                self.n_features_in_ = d
                if hasattr(self, "feature_names_in_"):
                    del self.feature_names_in_
            else:
                if n < 1:
                    raise ValueError(
                        f"Found array with 0 sample(s) (shape={source.shape}) while a "
                        f"minimum of 1 is required ({source.description})."
                    )
                if d != self.n_features_in_:
                    raise ValueError(
                        f"X has {d} features, but {type(self).__name__} is expecting "
                        f"{self.n_features_in_} features as input ({source.description})."
                    )
            return source
        X = validate_data(
            self, X, dtype=[np.float64, np.float32], reset=reset,
            ensure_min_samples=2 if reset else 1, ensure_all_finite=False,
        )
        # ArraySource's check names the row and column, as for file-backed data
        return ArraySource(X)

    def _compute_dtype(self, source):
        if self.compute_dtype is None:
            return source.compute_dtype
        return np.dtype(self.compute_dtype).type

    def _block_size(self, source):
        if self.block_size is not None:
            return int(min(self.block_size, max(source.n_samples, 1)))
        budget = self.working_memory
        if budget is None:
            budget = get_config()["working_memory"]
        return block_rows(
            source.n_samples, source.n_features, self.n_components,
            np.dtype(self._compute_dtype(source)).itemsize, budget,
            source.chunk_rows, source.description, self.covariance_type,
        )

    # ------------------------------------------------------------ parameters

    def _check_initial_parameters(self, n_features):
        """Validated copies of the *_init parameters (never stored on self)."""
        weights = means = precisions = None
        if self.weights_init is not None:
            weights = _check_weights(self.weights_init, self.n_components, xp=np)
        if self.means_init is not None:
            means = _check_means(self.means_init, self.n_components, n_features, xp=np)
        if self.precisions_init is not None:
            precisions = _check_precisions(
                self.precisions_init, self.covariance_type, self.n_components,
                n_features, xp=np,
            )
        return weights, means, precisions

    def _initial_model(self, source, random_state, inits, block_size):
        weights_init, means_init, precisions_init = inits
        weights = means = covariances = None
        if weights_init is None or means_init is None or precisions_init is None:
            if isinstance(source, ArraySource) and source.n_samples <= self.init_max_samples:
                sample = source.array
            else:
                idx = subsample_indices(source.n_samples, self.init_max_samples,
                                        random_state)
                if idx is None:
                    idx = np.arange(source.n_samples)
                sample = source.take(idx, block_size)
            if sample.shape[0] < self.n_components:
                # (n_samples >= n_components was checked: the subsample is short)
                raise ValueError(
                    f"init_max_samples={self.init_max_samples} is below n_components="
                    f"{self.n_components}: the initialisation subsample needs at least "
                    "one row per component."
                )
            resp = initial_responsibilities(sample, self.n_components, self.init_params,
                                            random_state)
            weights, means, covariances = parameters_from_responsibilities(
                sample, resp, self.reg_covar, self.covariance_type
            )
        if weights_init is not None:
            weights = np.asarray(weights_init, dtype=np.float64)
        if means_init is not None:
            means = np.asarray(means_init, dtype=np.float64)
        if precisions_init is None:
            u = initial_factors(covariances, self.covariance_type, self.on_degenerate,
                                init_params=self.init_params)
        else:
            u = precisions_cholesky_from_precisions(
                np.asarray(precisions_init, dtype=np.float64), self.covariance_type
            )
            covariances = covariances_from_cholesky(u, self.covariance_type)
        return Model(weights, means, covariances, u, self.covariance_type)

    def _current_model(self):
        """The fitted parameters to warm-start from, checked against the parameters.

        Raises
        ------
        ValueError
            When ``n_components``, ``covariance_type`` or the number of features
            differ from the fitted model's.
        """
        K, d = self.n_components, self.n_features_in_
        expected = {"full": (K, d, d), "tied": (d, d), "diag": (K, d),
                    "spherical": (K,)}[self.covariance_type]
        if np.shape(self.means_) != (K, d) or np.shape(self.covariances_) != expected:
            raise ValueError(
                "warm_start=True continues the fitted model (means of shape "
                f"{np.shape(self.means_)}, covariances of shape "
                f"{np.shape(self.covariances_)}), which does not match "
                f"n_components={K}, covariance_type={self.covariance_type!r} and {d} "
                "features. Set warm_start=False to fit a new model."
            )
        return self._fitted_model()

    def _fitted_model(self):
        """The fitted attributes as a float64 :class:`Model`.

        Raises
        ------
        ValueError
            If ``precisions_cholesky_`` ('full', 'tied') is not upper triangular,
            e.g. set by hand to ``numpy.linalg.cholesky(precisions)`` (lower): the
            triangular kernels read the upper triangle only.
        """
        factors = np.asarray(self.precisions_cholesky_, dtype=np.float64)
        if self.covariance_type in ("full", "tied"):
            square = factors.reshape((-1,) + factors.shape[-2:])
            below = entry_below_diagonal(square)
            if below is not None:
                k, i, j = below
                name = ("precisions_cholesky_" if self.covariance_type == "tied"
                        else f"precisions_cholesky_[{k}]")
                raise ValueError(not_upper_triangular_message(name, (i, j),
                                                              square[k, i, j]))
        return Model(
            np.asarray(self.weights_, dtype=np.float64),
            np.asarray(self.means_, dtype=np.float64),
            np.asarray(self.covariances_, dtype=np.float64),
            factors,
            self.covariance_type,
        )

    def _set_model(self, model, dtype, precisions):
        self.weights_ = model.weights.astype(dtype)
        self.means_ = model.means.astype(dtype)
        self.covariances_ = model.covariances.astype(dtype)
        self.precisions_cholesky_ = model.precisions_cholesky.astype(dtype)
        self.precisions_ = precisions

    # -------------------------------------------------------------------- fit

    def fit(self, X, y=None):
        """Estimate the parameters with EM, keeping the best of ``n_init`` runs.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), np.memmap, str, PathLike or h5py.Dataset
            Training data: in memory, memory-mapped, a ``.npy`` path, an
            ``h5py.Dataset`` or ``"file.h5:/path/to/dataset"``. float64 and float32
            are used as they are; integer data is cast per block.
        y : None
            Ignored.

        Returns
        -------
        GaussianMixture
            The fitted estimator (``self``).

        Raises
        ------
        ValueError
            Invalid parameters or data (NaN/inf, names the row for files), or an
            ill-defined covariance with ``on_degenerate='raise'``.
        MemoryError
            When the model cannot fit ``memory_limit``, or when a worker process died
            (most likely killed for memory); the message gives the estimate. The
            estimator then keeps its previous state.
        OSError
            When the data cannot be shared with the workers (temporary folder full).
        """
        self._fit(X, want_labels=False)
        return self

    def fit_predict(self, X, y=None):
        """Fit, then return the labels of ``X`` from a final E step.

        ``fit_predict(X)`` equals ``fit(X).predict(X)``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), np.memmap, str or h5py.Dataset
            The data, from any source :meth:`fit` accepts.
        y : None
            Ignored.

        Returns
        -------
        ndarray of shape (n_samples,), int64
            The most responsible component of each sample.
        """
        return self._fit(X, want_labels=True)

    @_fit_context(prefer_skip_nested_validation=True)
    def _fit(self, X, want_labels):
        saved = dict(self.__dict__)
        try:
            return self._fit_unsafe(X, want_labels)
        except BaseException:
            self.__dict__.clear()
            self.__dict__.update(saved)
            raise

    def _fit_unsafe(self, X, want_labels):
        source = self._source(X, reset=True)
        try:
            n, d = source.shape
            if n < self.n_components:
                raise ValueError(
                    "Expected n_samples >= n_components but got n_components = "
                    f"{self.n_components}, n_samples = {n}"
                )
            inits = self._check_initial_parameters(d)
            compute_dtype = self._compute_dtype(source)
            # the fitted attributes' dtype: float32 for float32 data computed in float32
            out_dtype = np.float32 if (compute_dtype == np.float32
                                       and source.dtype == np.float32) else np.float64
            block_size = self._block_size(source)
            tasks = partition(n, block_size)
            do_init = not (self.warm_start and hasattr(self, "converged_"))
            n_init = self.n_init if do_init else 1
            random_state = check_random_state(self.random_state)
            executor = Executor(source, self.n_jobs)
            if getattr(self.callback, "wants_progress", False):
                executor.on_task = self._task_callback
            # refuse before writing X for the workers or starting them
            schedule, estimate = choose_schedule(self.schedule, self.n_components, d,
                                                 self.covariance_type, executor.n_workers,
                                                 self.memory_limit)
            statistics_pass = (component_statistics_pass if schedule == "components"
                               else rows_statistics_pass)
            if schedule == "components" or not row_threads_worthwhile(
                    n, len(tasks), self.n_components, d, self.covariance_type):
                executor.row_threads = 0
            if tasks_are_tiny(n, len(tasks), self.n_components, d, self.covariance_type):
                executor.one_blas_thread()
            checkpointer = open_checkpointer(self, source, compute_dtype, random_state,
                                             None if do_init else self._current_model())
            resume = None if checkpointer is None else checkpointer.resume
            block_nbytes = block_size * bytes_per_row(
                d, self.n_components, np.dtype(compute_dtype).itemsize)
            # (the checkpointer first: it holds its path from open_checkpointer on,
            # and must let it go also when the executor refuses to start)
            with checkpointer or nullcontext(), \
                    explain_worker_loss(estimate, block_nbytes, executor.n_workers), \
                    executor:
                best, first = None, 0
                if resume is not None:
                    first = resume.init_index
                    if resume.best_run is not None:
                        best = (resume.best_score, resume.best_run, None)
                for init in range(first, n_init):
                    if self.verbose:
                        print(f"Initialization {init}")
                    start = None
                    if resume is not None and init == first:
                        random_state.set_state(resume.rng_state)
                        start = resume.run
                    # built here (before the checkpointer records the random state)
                    # and handed over in a list that run_em empties, so that nothing
                    # here keeps it after the first iteration (K d^2 values twice)
                    starting = [start.model if start is not None else
                                self._initial_model(source, random_state, inits,
                                                    block_size)
                                if do_init else self._current_model()]
                    run = run_em(
                        executor, tasks, block_size, starting.pop, n,
                        max_iter=self.max_iter, tol=self.tol, reg_covar=self.reg_covar,
                        compute_dtype=compute_dtype, resp_threshold=self.resp_threshold,
                        on_degenerate=self.on_degenerate, min_count=1.0,
                        callback=self._iteration_callback, init_index=init,
                        statistics_pass=statistics_pass, start=start,
                        on_iteration=(None if checkpointer is None
                                      else checkpointer.saver(init, random_state, best)),
                    )
                    # scored as stored (rounded to float32 for float32 data), so that
                    # lower_bound_ is score(X) and n_init compares what it returns
                    total, labels = score_pass(executor, tasks, block_size,
                                               _as_stored(run.model, out_dtype),
                                               compute_dtype, want_labels)
                    score = total / n
                    if self.verbose:
                        status = "converged" if run.converged else "did not converge"
                        print(f"Initialization {status}. lower bound {score:.5f}.")
                    if best is None or score > best[0]:
                        best = (score, run, labels)
                if want_labels and best[2] is None:  # best run restored from checkpoint
                    _, labels = score_pass(executor, tasks, block_size,
                                           _as_stored(best[1].model, out_dtype),
                                           compute_dtype, True)
                    best = best[:2] + (labels,)
                # U U^T under the BLAS threads of the fit's other products: the
                # thread count changes a product's rounding, and precisions_ too is
                # then bitwise the same for any n_jobs
                precisions = precisions_from_cholesky(
                    best[1].model.precisions_cholesky.astype(out_dtype),
                    self.covariance_type)
                if checkpointer is not None:
                    checkpointer.remove()  # (while it holds the path)
        finally:
            source.close()
        score, run, labels = best
        # (the checkpoint is gone: resuming would end in this error again)
        _check_attributes_hold(run.model, precisions, out_dtype)
        if not run.converged and self.max_iter > 0:
            warnings.warn(
                "Best performing initialization did not converge. Try different init "
                "parameters, or increase max_iter, tol, or check for degenerate data.",
                ConvergenceWarning,
            )
        self._set_model(run.model, out_dtype, precisions)
        self.converged_ = run.converged
        self.n_iter_ = run.n_iter
        self.lower_bound_ = score
        self.lower_bounds_ = run.lower_bounds
        self.history_ = run.history
        return labels

    def _task_callback(self, done, total):
        self.callback({"event": "progress", "done": done, "total": total})

    def _iteration_callback(self, record):
        if self.verbose and record["n_iter"] % self.verbose_interval == 0:
            if self.verbose >= 2:
                print(f"  Iteration {record['n_iter']}\t time lapse "
                      f"{record['seconds']:.5f}s\t ll change {record['change']:.5f}")
            else:
                print(f"  Iteration {record['n_iter']}")
        if self.callback is not None:
            self.callback(record)

    # ---------------------------------------------------------------- predict

    def _per_block(self, X, func):
        """Apply ``func(log_prob_norm, log_resp) -> array`` over the blocks of X and
        stack the results into one C-ordered array (as scikit-learn returns them),
        filled block by block: the result plus one block's, whatever order the
        kernels return.

        The blocks are read in the compute dtype and evaluated as the last pass of
        ``fit`` evaluates them (``SCORE_MARGIN``), so that ``score(X)`` of the
        training data is ``lower_bound_``.
        """
        check_is_fitted(self)
        source = self._source(X, reset=False)
        try:
            compute_dtype = self._compute_dtype(source)
            block_size = self._block_size(source)
            model = self._fitted_model()
            prepared = model.prepare(compute_dtype)
            out = None
            for start, stop, block in source.blocks(block_size, compute_dtype):
                log_prob_norm, log_resp = estimate_log_prob_resp(
                    block, model.weights, model.means, model.precisions_cholesky,
                    self.covariance_type, SCORE_MARGIN, prepared)
                check_explained(log_prob_norm, start, source, compute_dtype,
                                model.means)
                part = func(log_prob_norm, log_resp)
                if out is None:
                    out = np.empty((source.n_samples,) + part.shape[1:], part.dtype)
                out[start:stop] = part
        finally:
            source.close()
        return out

    def score_samples(self, X):
        """Log-likelihood of each sample, ``log sum_k w_k N(x | mu_k, Sigma_k)``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), np.memmap, str or h5py.Dataset
            The data, from any source :meth:`fit` accepts.

        Returns
        -------
        ndarray of shape (n_samples,), float64
            The log-likelihood of each sample, in nats.
        """
        return self._per_block(X, lambda log_prob_norm, _: log_prob_norm)

    def score(self, X, y=None):
        """Mean per-sample log-likelihood of ``X`` (nats per sample).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), np.memmap, str or h5py.Dataset
            The data, from any source :meth:`fit` accepts.
        y : None
            Ignored.

        Returns
        -------
        float
            The mean log-likelihood per sample, in nats.
        """
        return float(np.mean(self.score_samples(X)))

    def predict(self, X):
        """Label of the most responsible component for each sample.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), np.memmap, str or h5py.Dataset
            The data, from any source :meth:`fit` accepts.

        Returns
        -------
        ndarray of shape (n_samples,), int64
            The most responsible component of each sample.
        """
        return self._per_block(X, lambda _, log_resp: log_resp.argmax(axis=1))

    def predict_proba(self, X):
        """Compute the responsibilities ``r_ik`` of every component for each sample.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), np.memmap, str or h5py.Dataset
            The data, from any source :meth:`fit` accepts.

        Returns
        -------
        ndarray of shape (n_samples, n_components), float64
            Rows sum to 1: ``exp(log_resp)`` normalised per row. A sample so far out
            that several components' log-densities agree to float64's precision
            (e.g. a fill value of 1e37) gets them in equal shares, where
            scikit-learn gives each of them 1.
        """
        return self._per_block(X, lambda _, log_resp: _normalised_exp(log_resp))

    def sample(self, n_samples=1):
        """Draw samples from the fitted mixture (as scikit-learn draws them).

        Parameters
        ----------
        n_samples : int, default=1
            Number of samples to draw.

        Returns
        -------
        X : ndarray of shape (n_samples, n_features)
            The samples, float64, ordered by component.
        y : ndarray of shape (n_samples,), int64
            Component of each sample.

        Raises
        ------
        ValueError
            If ``n_samples < 1``.
        """
        check_is_fitted(self)
        if n_samples < 1:
            raise ValueError(
                f"Invalid value for 'n_samples': {n_samples} . The sampling requires at "
                "least one sample."
            )
        _, n_features = self.means_.shape
        rng = check_random_state(self.random_state)
        counts = rng.multinomial(n_samples, self.weights_)
        if self.covariance_type == "full":
            parts = [rng.multivariate_normal(m, c, int(s))
                     for m, c, s in zip(self.means_, self.covariances_, counts)]
        elif self.covariance_type == "tied":
            parts = [rng.multivariate_normal(m, self.covariances_, int(s))
                     for m, s in zip(self.means_, counts)]
        else:
            parts = [m + rng.standard_normal(size=(s, n_features)) * np.sqrt(c)
                     for m, c, s in zip(self.means_, self.covariances_, counts)]
        X = np.vstack(parts).astype(np.float64)
        y = np.concatenate([np.full(int(s), k, dtype=np.int64) for k, s in enumerate(counts)])
        return X, y

    # ---------------------------------------------------------- model choice

    def _n_parameters(self):
        """Free parameters of the model."""
        _, d = self.means_.shape
        K = self.n_components
        cov = {"full": K * d * (d + 1) / 2.0, "diag": K * d,
               "tied": d * (d + 1) / 2.0, "spherical": K}[self.covariance_type]
        return int(cov + d * K + K - 1)

    def _n_and_score(self, X):
        log_prob = self.score_samples(X)
        return log_prob.shape[0], float(log_prob.mean())

    def bic(self, X):
        """Bayesian information criterion, ``-2 log L + p log n`` (Schwarz, 1978).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), np.memmap, str or h5py.Dataset
            The data, from any source :meth:`fit` accepts.

        Returns
        -------
        float
            The lower the better.
        """
        n, score = self._n_and_score(X)
        return -2 * score * n + self._n_parameters() * math.log(n)

    def aic(self, X):
        """Akaike information criterion, ``-2 log L + 2 p`` (Akaike, 1974).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), np.memmap, str or h5py.Dataset
            The data, from any source :meth:`fit` accepts.

        Returns
        -------
        float
            The lower the better.
        """
        n, score = self._n_and_score(X)
        return -2 * score * n + 2 * self._n_parameters()

