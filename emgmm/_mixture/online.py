"""``partial_fit``: stepwise online EM on the mixture base class, and the sharing of
sample weights with worker processes.

Each call reads its batch once in row blocks (any source, as ``fit``), moves the
running sufficient statistics by the batch's (:mod:`emgmm._engine.online`) and takes
the M step. The state of a stream is ``n_steps_`` and the running statistics
(``_online_statistics``: normalised, centred on the current means, float64); model
files and checkpoints keep it (:mod:`emgmm._io.model_file`,
:mod:`emgmm._io.stream_checkpoint`), ``clone`` drops it.
"""

from __future__ import annotations

import os
import shutil
import time
import warnings
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np
from sklearn import config_context
from sklearn.utils import check_random_state
from sklearn.utils.metaestimators import available_if

from .._engine import online
from .._engine.degenerate import initial_factors
from .._engine.model import Model
from .._engine.update import MaximumLikelihood
from .._io.checkpoint import checkpoint_path
from .._io.sources import DataLike, WeightLike
from .._io.stream_checkpoint import read_stream, stream_fingerprint, write_stream
from .._io.weights import ArrayWeights, dump_weights
from .._runtime.executor import make_temp_folder
from .._runtime.worker_loss import explain_worker_loss
from ..covariance._cholesky import factorize, ill_defined_message
from .validation import check_attributes_hold

if TYPE_CHECKING:
    from typing_extensions import Self

_MODEL_FIELDS = ("weights", "means", "covariances", "precisions_cholesky")


@contextmanager
def shared_weights(executor, weights):
    """``weights`` as the tasks of an entered ``executor`` read them: in-memory
    weights are written once to a ``.npy`` file in the fit's temporary folder for
    process workers (removed on exit), file-backed ones travel by reference.

    Raises
    ------
    ValueError
        Weights that worker processes cannot reopen (an HDF5 file open for writing).
    """
    if weights is None or executor.n_workers == 1 or executor.uses_threads:
        yield weights
        return
    if not weights.shareable:
        raise ValueError(f"{weights.description} is an HDF5 dataset of a file open for "
                         "writing or held in memory: worker processes cannot read it. "
                         "Use n_jobs=1, or close the file and pass 'file.h5:/dataset'.")
    if not isinstance(weights, ArrayWeights):
        yield weights
        return
    folder = make_temp_folder(executor.temp_folder, 8 * weights.n_samples,
                              "sharing sample_weight with the workers")
    try:
        yield dump_weights(weights, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _has_online_update(estimator):
    """Whether the estimator's M step is the one of the running statistics
    (maximum likelihood, or a subclass's own ``_parameters_from_online_statistics``)."""
    own = (type(estimator)._parameters_from_online_statistics
           is not OnlineMixin._parameters_from_online_statistics)
    return own or type(estimator._update_rule()) is MaximumLikelihood


def initial_model(estimator, source, random_state, inits, block_size, sample_weights):
    """``estimator._initial_model``, with ``sample_weights`` only when there are
    weights (a subclass's hook without that argument still fits unweighted data)."""
    kwargs = {} if sample_weights is None else {"sample_weights": sample_weights}
    return estimator._initial_model(source, random_state, inits, block_size, **kwargs)


def _warn_split(step, splits):
    """The warning of a step that re-seeded starved components."""
    starved = [k for k, _ in splits]
    split = [h for _, h in splits]
    warnings.warn(
        f"partial_fit step {step}: components {starved} fell to a running weight "
        f"below {online.STARVED_FRACTION} of the mean weight and were re-seeded by "
        f"splitting components {split} (the heaviest). If this repeats, use fewer "
        "components or larger batches.", UserWarning, stacklevel=5)


class OnlineMixin:
    """``partial_fit`` over the base class's sources, plan and hooks (present only
    for estimators whose update rule has an online M step)."""

    if TYPE_CHECKING:  # the base class's, which the mixin's methods call
        def _validate(self) -> None: ...

    @available_if(_has_online_update)
    def partial_fit(self, X: DataLike, y: None = None,
                    sample_weight: WeightLike | None = None) -> Self:
        """One step of stepwise online EM on the mini-batch ``X``.

        The first call on an unfitted estimator initialises the parameters from its
        batch as ``fit`` does (``init_params`` on at most ``init_max_samples`` rows,
        or the ``*_init`` parameters); without ``precisions_init`` the components
        start with one pooled covariance and that call takes ``eta_1 = 1`` (see
        docs/online.rst). Every call then reads its batch once in
        blocks (the E step under the current parameters), moves the running
        sufficient statistics, ``s_t = (1 - eta_t) s_{t-1} + eta_t sbar_t`` with
        ``eta_t = (t + learning_offset) ** -learning_decay`` and ``t = n_steps_``
        after the call, and takes the M step (Cappé and Moulines 2009; Liang and
        Klein 2009; see :mod:`emgmm._engine.online`). ``sbar_t`` are the batch's
        statistics divided by its total weight, ``s_0`` those the M step maps to
        the starting model. The statistics are the covariance type's:
        ``N_k``, ``s_k`` and ``S_k`` (its layout) for the Gaussian types; for
        'factor' the diagonals of ``S_k`` and the factors' posterior moments,
        ``O(K d q)`` (docs/online.rst). With ``on_degenerate='reinit'``, a
        component whose running weight falls below a tenth of the mean weight is
        re-seeded by splitting the heaviest one
        (:func:`emgmm._engine.online.split_starved`, with a ``UserWarning``). A
        fitted estimator (``fit``, ``load_model``) continues
        from its parameters, ``t`` counting on from ``n_steps_`` (0 after ``fit``);
        ``fit`` starts afresh, as for scikit-learn's ``MiniBatchKMeans``, and
        ``clone`` drops the stream. ``tol``, ``max_iter``, ``n_init`` and
        ``warm_start`` are ``fit``'s. With ``checkpoint``, every call replaces that
        file with the stream's state (atomically), and an unfitted estimator of
        the same parameters resumes from it.

        Parameters
        ----------
        X : see :meth:`fit`
            The batch: any source; later calls may have a single row.
        y : None
            Ignored.
        sample_weight : see :meth:`fit`
            Weights of the batch's rows.

        Returns
        -------
        self : object
            ``lower_bound_`` is the batch's (weighted) mean log-likelihood under
            the parameters before the step; ``n_iter_`` is 1.

        Raises
        ------
        ValueError
            A covariance type without running statistics (all the built-in
            ones have them), invalid parameters, data or weights (naming the
            row), features other
            than the stream's, a covariance that is not positive definite after
            the step (whatever ``on_degenerate``: a stream re-seeds only starved
            components), or a
            checkpoint of other parameters or of ``fit``. The estimator then keeps
            its state.
        """
        self._validate()
        saved = dict(self.__dict__)
        try:
            with config_context(skip_parameter_validation=True):
                self._partial_fit_unsafe(X, sample_weight)
        except BaseException:
            self.__dict__.clear()
            self.__dict__.update(saved)
            raise
        return self

    def _partial_fit_unsafe(self, X, sample_weight):
        online.online_covariance_type(self.covariance_type)  # before reading X
        if (not hasattr(self, "means_") and self.checkpoint is not None
                and os.path.exists(self._stream_checkpoint())):
            self._resume_stream()
        first = not hasattr(self, "means_")
        source = self._source(X, reset=first)
        plan = None
        try:
            plan = self._plan(source, sample_weight, stream=True)
            tic = time.perf_counter()
            with explain_worker_loss(plan.model_nbytes, plan.block_nbytes,
                                     plan.executor.n_workers), \
                    plan.executor, \
                    shared_weights(plan.executor, plan.sample_weights) as weights:
                if first:
                    model = initial_model(self, source,
                                          check_random_state(self.random_state),
                                          plan.inits, plan.block_size,
                                          plan.sample_weights)
                    from_batch = getattr(self, "precisions_init", None) is None
                    if from_batch:
                        model = self._pooled_start(model)
                    running = None
                else:
                    model = self._current_model(continued_by="partial_fit")
                    running = self._online_statistics
                    from_batch = False
                kwargs = {} if weights is None else {"weights": weights}
                stats, _ = plan.statistics_pass(
                    plan.executor, plan.tasks, plan.block_size, model,
                    plan.compute_dtype, self.resp_threshold, 0, **kwargs)
                # (under the executor's BLAS limits, as fit's M step)
                self._online_step(model, running, stats, plan, from_batch,
                                  time.perf_counter() - tic)
        finally:
            source.close()
            if plan is not None and plan.sample_weights is not None:
                plan.sample_weights.close()
        if self.checkpoint is not None:
            self._save_stream()

    def _pooled_start(self, model):
        """``model`` with every component's covariance replaced by their
        weighted mean (the batch's within-cluster covariance): the start of a
        stream initialised from its first batch.

        ``init_params`` on one batch estimates each covariance from that
        component's rows, about ``n / K`` of them (a k-means cluster of 2 rows
        in d=64 for a batch of 500 patches): a covariance that explains no other
        row, so that the next batches all go to one component. The pooled
        covariance is estimated from all the rows; the steps then tell the
        components apart.
        """
        kind = model.kind
        K = len(model.weights)
        pooled = kind.stream_start_covariance(model.weights, model.covariances)
        if pooled is None:  # a shared covariance is pooled already
            return model
        covariances = np.stack([pooled] * K)
        u = initial_factors(covariances, kind, self.on_degenerate,
                            init_params=self.init_params)
        return Model(model.weights, model.means, covariances, u,
                     self.covariance_type)

    def _parameters_from_online_statistics(self, running, compute_dtype):
        """The model of the running statistics (the maximum-likelihood M step);
        a subclass with another update rule overrides it."""
        ct = self.covariance_type
        weights, means, covariances = online.m_step(running, self.reg_covar)
        u, bad = factorize(covariances, ct, compute_dtype)
        if bad:
            kind = self._kind()
            raise ValueError(f"partial_fit step {getattr(self, 'n_steps_', 0) + 1}: "
                             + ill_defined_message(kind.first_failure(bad),
                                                   compute_dtype, covariances))
        return Model(weights, means, covariances, u, ct)

    def _online_step(self, model, running, stats, plan, from_batch, seconds):
        """Move the running statistics by the batch's ``stats`` (summed under
        ``model``; ``from_batch``: the start the first call estimated from this
        batch), take the M step, re-seed starved components and set the
        attributes."""
        ct = self.covariance_type
        if running is None:
            # the covariances of the precision factors, as a model file restores
            # them: a fitted estimator and its saved copy continue alike
            covariances = model.kind.covariances_from_cholesky(
                np.asarray(model.precisions_cholesky, dtype=np.float64))
            running = online.implied_statistics(model.weights, model.means,
                                                covariances, self.reg_covar, ct)
        batch = online.batch_statistics(stats, model.means, plan.total_weight, ct)
        step = getattr(self, "n_steps_", 0) + 1
        # a start estimated from this batch is no evidence beyond it: s_1 is the
        # batch's statistics under the start (the start gives only the E step)
        eta = (1.0 if from_batch else
               online.step_size(step, self.learning_decay, self.learning_offset))
        running = online.stepwise_update(running, batch, eta)
        new = self._parameters_from_online_statistics(running, plan.compute_dtype)
        splits = []
        if self.on_degenerate == "reinit":
            running, splits = online.split_starved(
                online.shift_centres(running, new.means), new.covariances,
                self.reg_covar)
        if splits:
            _warn_split(step, splits)
            new = self._parameters_from_online_statistics(running,
                                                          plan.compute_dtype)
        precisions = new.kind.precisions_from_cholesky(
            new.precisions_cholesky.astype(plan.out_dtype))
        check_attributes_hold(new, precisions, plan.out_dtype)
        self._set_model(new, plan.out_dtype, precisions)
        self._online_statistics = online.shift_centres(running, new.means)
        self.n_steps_ = step
        lower_bound = stats.log_likelihood / plan.total_weight
        record = {"event": "partial_fit", "n_steps": step, "eta": eta,
                  "lower_bound": lower_bound,
                  "reseeded": [k for k, _ in splits], "seconds": seconds}
        self.converged_, self.n_iter_ = False, 1
        self.lower_bound_, self.lower_bounds_ = lower_bound, [lower_bound]
        self.history_ = [record]
        if self.callback is not None:
            self.callback(dict(record))

    # ------------------------------------------------------------- checkpoint

    def _model_fields(self):
        """The fitted arrays a stream's checkpoint keeps: weights, means and those
        of the type's attributes in ``_MODEL_FIELDS``, then the rest of what model
        files store ('factor': ``loadings``, ``noise_variance``; never a dense
        attribute that the type forms on demand)."""
        kind = self._kind()
        names = [name for name in _MODEL_FIELDS if name in ("weights", "means")
                 or name + "_" in kind.attribute_names]
        return names + [name for name in kind.stored_shapes(1, 1) if name not in names]

    def _stream_state(self):
        """The stream as float64 arrays and JSON metadata."""
        arrays = {name: np.asarray(getattr(self, name + "_"), dtype=np.float64)
                  for name in self._model_fields()}
        if getattr(self, "_online_statistics", None) is not None:
            arrays.update(online.to_arrays(self._online_statistics))
        meta = {"n_steps": int(self.n_steps_),
                "n_features_in": int(self.n_features_in_),
                "attributes_dtype": np.dtype(self.means_.dtype).name,
                "lower_bound": float(self.lower_bound_)}
        if hasattr(self, "feature_names_in_"):
            meta["feature_names_in"] = [str(v) for v in self.feature_names_in_]
        return arrays, meta

    def _set_stream_state(self, arrays, meta):
        dtype = np.dtype(meta["attributes_dtype"])
        for name in self._model_fields():
            setattr(self, name + "_", arrays[name].astype(dtype))
        if "precisions_cholesky" in arrays:  # (else formed on demand: 'factor')
            self.precisions_ = self._kind().precisions_from_cholesky(
                arrays["precisions_cholesky"].astype(dtype))
        self._online_statistics = (online.from_arrays(arrays, self.covariance_type)
                                   if "online_nk" in arrays else None)
        self.n_steps_ = meta["n_steps"]
        self.n_features_in_ = meta["n_features_in"]
        if "feature_names_in" in meta:
            self.feature_names_in_ = np.asarray(meta["feature_names_in"], dtype=object)
        self.lower_bound_ = meta["lower_bound"]
        self.lower_bounds_ = [self.lower_bound_]
        self.n_iter_, self.converged_, self.history_ = 1, False, []

    def _stream_checkpoint(self):
        """The stream's checkpoint file: ``checkpoint`` with ``{fingerprint}``
        replaced by the digest of the stream's parameters."""
        return checkpoint_path(self.checkpoint,
                               stream_fingerprint(self.get_params(deep=False)))

    def _save_stream(self):
        arrays, meta = self._stream_state()
        write_stream(self._stream_checkpoint(), arrays, meta,
                     stream_fingerprint(self.get_params(deep=False)))

    def _resume_stream(self):
        arrays, meta = read_stream(self._stream_checkpoint(),
                                   stream_fingerprint(self.get_params(deep=False)))
        self._set_stream_state(arrays, meta)
