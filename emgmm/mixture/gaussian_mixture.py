"""emgmm.GaussianMixture: scikit-learn's estimator, fitted by blocked single-pass EM."""

import functools
import math
import os
from numbers import Integral, Real

import numpy as np
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted

from ..covariance import REGISTRY
from ..covariance.cholesky import (
    covariances_from_cholesky,
    not_upper_triangular_message,
    precisions_cholesky_from_precisions,
)
from ..engine.degenerate import initial_factors
from ..engine.model import Model
from ..io.sources import ArraySource
from ..runtime.blas import single_blas_thread
from .base import BaseMixture
from .initialization import (
    initial_responsibilities,
    parameters_from_responsibilities,
    subsample_indices,
)
from .validation import Interval, StrOptions, check_means, check_precisions, check_weights


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
        Workers for the blocked passes, with joblib's meaning (``None`` follows
        ``joblib.parallel_config``, else 1; ``-1`` all cores). Process workers read
        the data through files: an in-memory array is written once per fit to
        joblib's temporary folder (removed at the end of the fit). When ``None``
        resolves to one worker, the blocks of a pass run in threads of this
        process, as many as BLAS may use, with one BLAS thread each (same result
        bit for bit); an explicit ``1`` runs them one after the other.
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
        How a pass shares the work. 'rows': a task is a range of rows and all
        components (one read of ``X`` per iteration; every worker holds the whole
        model and its statistics). 'components': a task is a slice of components and
        a range of rows; workers hold only their slice, exchanging
        log-probabilities through a memory-mapped buffer in joblib's temporary
        folder (``X`` read twice per iteration). 'auto' picks 'components' when
        there are several workers and one task's statistics,
        ``K d (d + 1) / 2 * 8`` bytes for 'full', exceed 64 MiB, or when only it
        fits ``memory_limit`` (see ``emgmm.runtime.memory.choose_schedule``). Both give
        the same model to 1e-12 relative.
    init_max_samples : int, default=100_000
        Rows in the initialisation subsample.
    compute_dtype : {'float32', 'float64'} or None, default=None
        Dtype of the heavy products of the E step (for 'full': the estimate of
        every pair, packed for small ``d``, triangular beyond, or the plain path's
        products). ``None`` follows the data (float32 data computes in float32).
        Blocks are read in this dtype: ``'float32'`` on float64 data fits the data
        rounded to float32 (tight clusters far from the origin then lose what that
        rounding loses; pass it for the speed, not for float64 data that need
        their digits).
        The pairs that may reach ``resp_threshold`` are recomputed in float64 when
        an estimate is used; where the float32 estimate's rounding bounds are too
        coarse for the model (strongly overlapping components: most pairs would
        need the recomputation), a block takes the float64 estimate of the same data
        instead (small ``d``), and where that too needs too many, the plain path in
        float64. The M-step statistics are computed in float64, and sums are
        accumulated in float64 in every case.
    resp_threshold : float, default=1e-20
        Pairs (row, component) whose responsibility is at most this are left out of
        that component's statistics ``N_k``, ``s_k`` and ``S_k`` ('full'; 'diag' and
        'spherical' with at least 24 features, below which masking the pairs costs
        more than it saves; gathered rows or a sparse product when few are kept), and
        for 'full' the E step computes exactly only the pairs that may exceed it;
        the others are estimated within a first-order rounding-error bound (see
        ``emgmm.covariance.packed_estimate.RefinedEstimate``). A pair left out moves
        ``N_k`` by ``r_ik`` and ``S_k``, in the metric of component ``k``, by at
        most ``r_ik Q_ik`` (``Q_ik`` its squared Mahalanobis distance, about
        ``2 log(1 / r_ik)``): about 1e-18 at the default, below float64 rounding.
        For 'diag' and 'spherical', a component whose expanded log-density may be
        inexact (tight, far from the mixture mean) is recomputed directly only on
        the rows where it may exceed the threshold. 'tied' pools every pair.
        ``0.0`` skips only exact zeros and computes every pair exactly (slower; in
        the compute dtype: with float32 compute, plain float32 products and no
        float64 recomputation).
    on_degenerate : {'reinit', 'raise'}, default='reinit'
        What to do with a component whose covariance is not positive definite after
        ``reg_covar`` or whose weight falls below one sample (``N_k < 1``; a
        component re-seeded before that starves again is kept, as scikit-learn keeps
        it): 'reinit'
        re-seeds it on the worst-explained sample of the same pass, warns naming the
        component and records it in ``history_``; 'raise' raises scikit-learn's
        ``ValueError`` naming the component (starved components are then kept).
        A re-seeded component gets the weighted mean covariance of the healthy
        components ('tied' keeps the shared one) and weight ``1 / K`` before
        renormalisation; a row serves one re-seed per run before any row is reused.
        The lower bound may decrease after an iteration that re-seeded. A component
        whose initial covariance is not positive definite starts, under 'reinit',
        from the mean covariance of the others. When no component is healthy, or
        the 'tied' covariance is not positive definite, or a component re-seeded
        ``MAX_RESEEDS`` (10) times is not positive definite once more (a flat
        cluster without ``reg_covar`` takes every re-seed back), both policies
        raise.
    callback : callable or None, default=None
        Called after every EM iteration with a dict (``event='iteration'``,
        ``init``, ``n_iter``, ``lower_bound``, ``change``, ``seconds``,
        ``reseeded``). A callable whose attribute ``wants_progress`` is true is
        also called while a pass over the data runs, after each finished task, with
        ``{'event': 'progress', 'done': int, 'total': int}`` (for a progress bar
        over the blocks of long iterations).
    checkpoint : str, os.PathLike or None, default=None
        Path of a checkpoint file (``.npz``, no pickle). After EM iterations the
        state of the fit (parameters, iteration, lower bounds, history, random
        state, best earlier initialisation) is written to it atomically (temporary
        file in the same folder, then ``os.replace``). A fit started with an
        existing checkpoint for the same data and parameters resumes from it and
        ends with the same model as an uninterrupted fit; a checkpoint of other data
        or parameters raises ``ValueError`` saying what differs. The file is
        removed when ``fit`` completes, also when the model it completed cannot be
        returned in float32 attributes (a resumed fit would end the same way, and
        the retry with ``compute_dtype='float64'`` that the error suggests has
        other parameters), and kept when it raises otherwise. The data are
        identified by shape, dtype and a SHA-256 of every value (one extra read of
        the data per fit). A folder where it cannot be written raises ``OSError``
        before the first pass. A running fit holds the path (an ``flock`` on
        ``.<name>.lock`` beside it, removed when the fit ends): a second fit with
        the same path at the same time, as clones under ``GridSearchCV(n_jobs=2)``
        would be, raises ``RuntimeError`` naming the first one's process (scikit-learn's
        searches turn it into a ``FitFailedWarning`` and a NaN score unless
        ``error_score='raise'``: give such searches ``checkpoint=None``). A relative
        path is taken from the working folder at the start of ``fit``.
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
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Only when ``X`` has string feature names.

    Notes
    -----
    Data sources accepted by every method taking ``X``: array-likes, ``np.memmap``,
    a path to a ``.npy`` file (memory-mapped read-only), an ``h5py.Dataset`` and the
    string ``"file.h5:/path/to/dataset"``. Files are only read.
    """

    _parameter_constraints: dict = {
        "n_components": [Interval(Integral, 1, None, closed="left")],
        "covariance_type": [StrOptions(set(REGISTRY))],
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

    # ------------------------------------------------------------ parameters

    def _check_initial_parameters(self, n_features):
        """Validated copies of the *_init parameters (never stored on self)."""
        weights = means = precisions = None
        if self.weights_init is not None:
            weights = check_weights(self.weights_init, self.n_components)
        if self.means_init is not None:
            means = check_means(self.means_init, self.n_components, n_features)
        if self.precisions_init is not None:
            precisions = check_precisions(self.precisions_init, self.covariance_type,
                                          self.n_components, n_features)
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
        kind = self._kind()
        square = kind.per_component(factors)
        below = kind.first_below_diagonal(square)
        if below is not None:
            k, i, j = below
            name = ("precisions_cholesky_" if kind.shared
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
        # the model's arrays themselves when they have the dtype: at d=900, K=200
        # each (K, d, d) copy is 1.3 GB
        self.weights_ = model.weights.astype(dtype, copy=False)
        self.means_ = model.means.astype(dtype, copy=False)
        self.covariances_ = model.covariances.astype(dtype, copy=False)
        self.precisions_cholesky_ = model.precisions_cholesky.astype(dtype, copy=False)
        self.__dict__.pop("precisions_", None)
        if precisions is not None:
            self.precisions_ = precisions

    _precisions_on_demand = True

    @functools.cached_property
    def precisions_(self):
        """Inverses of the covariances, ``U U^T`` from ``precisions_cholesky_``:
        formed on first access (one BLAS thread: the same for any ``n_jobs``) and
        kept; a fit sets it anew."""
        return self._stored_precisions(self.precisions_cholesky_)

    def _stored_precisions(self, precisions_cholesky):
        with single_blas_thread():
            return self._kind().precisions_from_cholesky(np.asarray(precisions_cholesky))

    def sample(self, n_samples=1):
        """Draw samples from the fitted mixture (as scikit-learn draws them).

        Parameters
        ----------
        n_samples : int, default=1

        Returns
        -------
        X : ndarray of shape (n_samples, n_features)
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
        rng = check_random_state(self.random_state)
        counts = rng.multinomial(n_samples, self.weights_)
        parts = self._kind().sample(rng, self.means_, self.covariances_, counts)
        X = np.vstack(parts).astype(np.float64)
        y = np.concatenate([np.full(int(s), k, dtype=np.int64) for k, s in enumerate(counts)])
        return X, y

    # ---------------------------------------------------------- model choice

    def _n_parameters(self):
        """Free parameters of the model."""
        _, d = self.means_.shape
        K = self.n_components
        return int(self._kind().n_parameters(K, d) + d * K + K - 1)

    def _n_and_score(self, X):
        log_prob = self.score_samples(X)
        return log_prob.shape[0], float(log_prob.mean())

    def bic(self, X):
        """Bayesian information criterion, ``-2 log L + p log n`` (Schwarz, 1978).

        Parameters
        ----------
        X : see :meth:`fit`

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
        X : see :meth:`fit`

        Returns
        -------
        float
            The lower the better.
        """
        n, score = self._n_and_score(X)
        return -2 * score * n + 2 * self._n_parameters()

