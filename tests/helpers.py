"""Helpers shared by the test modules: data generators, the sources of one array in
every kind emgmm accepts, file fingerprints and checks of a fitted model.

Source kinds (see ``SOURCE_KINDS``):

``ndarray``     the array itself (in memory)
``memmap``      ``np.memmap`` of a raw ``.dat`` file opened read-only
``npy``         the path (``str``) of a ``.npy`` file
``npy_path``    the same ``.npy`` file as a ``pathlib.Path``
``h5``          an open, read-only ``h5py.Dataset`` stored contiguously
``h5_chunked``  an open, read-only ``h5py.Dataset`` chunked by rows (``(64, d)`` by
default) ``h5_string``   the string ``"file.h5:/group/ds"`` naming the chunked dataset
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from contextlib import contextmanager
from pathlib import Path

import h5py
import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal
from sklearn.exceptions import ConvergenceWarning
from sklearn.mixture import GaussianMixture as SkGaussianMixture

from emgmm.covariance import REGISTRY, get_covariance_type

SOURCE_KINDS = ("ndarray", "memmap", "npy", "npy_path", "h5", "h5_chunked", "h5_string")
FILE_KINDS = tuple(k for k in SOURCE_KINDS if k != "ndarray")
#: Every registered covariance type (``emgmm.covariance.REGISTRY``), in its order: the
#: generic tests run over these, so that a newly registered type gets their coverage.
COVARIANCE_TYPES = tuple(REGISTRY)


def _sklearn_fits(covariance_type):
    """Whether scikit-learn's GaussianMixture fits ``covariance_type`` (its ``fit``
    refuses an unknown one with a ValueError before any work; asked through its
    public API, not its private ``_parameter_constraints``)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # one iteration: not converged
            SkGaussianMixture(1, covariance_type=covariance_type,
                              max_iter=1).fit(np.eye(3))
    except ValueError:
        return False
    return True


#: The registered types that scikit-learn's GaussianMixture has too: the tests that
#: compare with scikit-learn run over these.
SKLEARN_COVARIANCE_TYPES = tuple(name for name in REGISTRY if _sklearn_fits(name))


def covariance_types_where(capability):
    """The registered types whose :class:`~emgmm.covariance.CovarianceType` has
    ``capability`` (an attribute name, e.g. ``"variational"`` or
    ``"has_online_statistics"``) true."""
    return tuple(name for name, kind in REGISTRY.items() if getattr(kind, capability))


#: A value for each estimator parameter that a registered type may declare in its
#: ``CovarianceType.parameters``, given the data's number of features: the generic
#: tests read from here what a type needs (:func:`type_settings`). A type declaring
#: a parameter not named here fails those tests until its value is added.
TYPE_PARAMETER_VALUES = {
    # fewer factors than features, so that the noise variances are not the whole fit
    "n_factors": lambda n_features: min(2, n_features - 1),
}


def type_settings(covariance_type, n_features):
    """The estimator settings that select ``covariance_type`` on data of
    ``n_features`` features: ``covariance_type`` and a value of each parameter the
    type declares (``CovarianceType.parameters``, from :data:`TYPE_PARAMETER_VALUES`),
    e.g. ``{"covariance_type": "factor", "n_factors": 2}``. Pass them as
    ``GaussianMixture(**type_settings(ct, X.shape[1]), ...)``."""
    kind = REGISTRY[covariance_type]
    settings = {"covariance_type": covariance_type}
    for name in kind.parameters:
        if name not in TYPE_PARAMETER_VALUES:
            raise KeyError(f"covariance_type={covariance_type!r} declares the "
                           f"parameter {name!r}: give it a value in "
                           "helpers.TYPE_PARAMETER_VALUES")
        settings[name] = TYPE_PARAMETER_VALUES[name](n_features)
    return settings


def accepts_precisions_init(covariance_type):
    """Whether the type takes ``precisions_init`` (its
    ``precisions_cholesky_from_precisions`` does not refuse one): 'factor' refuses
    it, its components being defined by loadings and noise variances."""
    kind = REGISTRY[covariance_type]
    try:
        kind.precisions_cholesky_from_precisions(np.ones((1, 1, 1)))
    except ValueError as error:
        return "not supported" not in str(error)
    return True


#: The registered types that take ``precisions_init``.
PRECISIONS_INIT_COVARIANCE_TYPES = tuple(
    name for name in REGISTRY if accepts_precisions_init(name))
def covariance_type_params(slow_beyond_sklearn=False):
    """:data:`COVARIANCE_TYPES` as ``pytest.param``; with ``slow_beyond_sklearn``,
    the types that scikit-learn does not have carry the ``slow`` marker (for a test
    whose cases of those types take 0.5 s or more where the others do not)."""
    return tuple(
        pytest.param(name, marks=pytest.mark.slow)
        if slow_beyond_sklearn and name not in SKLEARN_COVARIANCE_TYPES else name
        for name in COVARIANCE_TYPES)


#: The types with the conjugate prior of BayesianGaussianMixture.
VARIATIONAL_COVARIANCE_TYPES = covariance_types_where("variational")
#: The variational types that scikit-learn's BayesianGaussianMixture has too: the
#: tests that compare with it, or write priors and factors in its layouts.
SKLEARN_VARIATIONAL_COVARIANCE_TYPES = tuple(
    name for name in VARIATIONAL_COVARIANCE_TYPES if name in SKLEARN_COVARIANCE_TYPES)
#: The types with the running statistics of partial_fit (stepwise online EM).
ONLINE_COVARIANCE_TYPES = covariance_types_where("has_online_statistics")
#: The online types in scikit-learn's layouts: the tests whose oracle keeps Gaussian
#: moments of (d, d) matrices and gives ``precisions_init`` ('factor' streams its
#: own statistics, tested against its own oracle in test_online/test_partial_fit).
SKLEARN_ONLINE_COVARIANCE_TYPES = tuple(
    name for name in ONLINE_COVARIANCE_TYPES if name in SKLEARN_COVARIANCE_TYPES)
#: The start of the ConvergenceWarning of a fit that max_iter stopped: expected by the
#: tests that run a fixed number of iterations (tol=0, or a small max_iter).
NOT_CONVERGED = "Best performing initialization did not converge"
#: ``pytest.mark.filterwarnings`` argument ignoring that warning alone.
IGNORE_NOT_CONVERGED = f"ignore:{NOT_CONVERGED}:sklearn.exceptions.ConvergenceWarning"


@contextmanager
def not_converging():
    """Ignore the ConvergenceWarning of a fit that max_iter stopped, nothing else."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", NOT_CONVERGED, ConvergenceWarning)
        yield


def quiet_fit(est, X, **fit_params):
    """``est.fit(X)``, ignoring the ConvergenceWarning of a fit that max_iter
    stopped (tests that run a fixed number of iterations)."""
    with not_converging():
        return est.fit(X, **fit_params)


def quiet_fit_predict(est, X, **fit_params):
    """``est.fit_predict(X)``, as :func:`quiet_fit`."""
    with not_converging():
        return est.fit_predict(X, **fit_params)


def make_blobs_data(
    n_samples=600,
    n_features=3,
    n_centers=3,
    *,
    spread=6.0,
    seed=0,
    dtype=np.float64,
):
    """Well separated Gaussian blobs with random anisotropic covariances.

    Deterministic for a given ``seed``; returns an ``(n_samples, n_features)``
    C-contiguous array of ``dtype``.
    """
    rng = np.random.default_rng(seed)
    centers = rng.normal(scale=spread, size=(n_centers, n_features))
    labels = rng.integers(n_centers, size=n_samples)
    X = np.empty((n_samples, n_features))
    for k in range(n_centers):
        A = rng.normal(size=(n_features, n_features)) / np.sqrt(n_features)
        A += np.eye(n_features)
        idx = labels == k
        X[idx] = centers[k] + rng.normal(size=(idx.sum(), n_features)) @ A
    return np.ascontiguousarray(X, dtype=dtype)


def random_spd(rng, n_features, *, cond=10.0):
    """A random symmetric positive definite matrix with condition number ``cond``."""
    Q, _ = np.linalg.qr(rng.normal(size=(n_features, n_features)))
    eig = np.geomspace(1.0, cond, n_features) / np.sqrt(cond)
    M = (Q * eig) @ Q.T
    return (M + M.T) / 2


def sample_mixture(rng, weights, means, U, n):
    """``n`` rows of the mixture of weights ``weights``, means ``means`` (K, d) and
    upper-triangular precision factors ``U`` (K, d, d), ``U_k U_k^T = Lambda_k``."""
    from scipy.linalg import solve_triangular

    K, d = means.shape
    labels = rng.choice(K, size=n, p=weights)
    X = np.empty((n, d))
    for k in range(K):
        rows = labels == k
        # e U_k^-1 has covariance U_k^-T U_k^-1 = Lambda_k^-1
        e = rng.normal(size=(rows.sum(), d))
        X[rows] = means[k] + solve_triangular(U[k], e.T, trans="T").T
    return X


@dataclasses.dataclass
class Source:
    """One way of handing the same array to emgmm."""

    kind: str
    obj: object  # what is passed to fit / predict
    path: Path | None = None  # backing file, if any

    def __repr__(self):  # short ids in assertion messages
        return f"Source({self.kind})"


class SourceFactory:
    """Writes arrays to files under ``tmp_path`` and opens them as emgmm sources.

    Every ``h5py.File`` it opens is closed at teardown.
    """

    def __init__(self, tmp_path: Path):
        self.tmp_path = Path(tmp_path)
        self._files = []
        self._counter = 0

    def _stem(self, name):
        self._counter += 1
        return self.tmp_path / f"{name}{self._counter}"

    def __call__(self, X, kinds=SOURCE_KINDS, *, chunk_rows=64, name="X"):
        """Return a list of ``Source`` holding ``X`` in each of ``kinds``."""
        X = np.asarray(X)
        unknown = set(kinds) - set(SOURCE_KINDS)
        if unknown:
            raise ValueError(f"unknown source kinds {sorted(unknown)}")
        stem = self._stem(name)
        out = []
        npy = stem.with_suffix(".npy")
        h5 = stem.with_suffix(".h5")
        if any(k in kinds for k in ("npy", "npy_path")):
            np.save(npy, X)
        if any(k.startswith("h5") for k in kinds):
            with h5py.File(h5, "w") as f:
                f.create_dataset("contiguous", data=X)
                chunks = (max(1, min(chunk_rows, X.shape[0])),) + X.shape[1:]
                f.create_dataset("group/chunked", data=X, chunks=chunks)
        for kind in kinds:
            if kind == "ndarray":
                out.append(Source(kind, X.copy()))
            elif kind == "memmap":
                dat = stem.with_suffix(".dat")
                mm = np.memmap(dat, dtype=X.dtype, mode="w+", shape=X.shape)
                mm[...] = X
                mm.flush()
                del mm
                out.append(
                    Source(kind, np.memmap(dat, dtype=X.dtype, mode="r", shape=X.shape),
                           dat)
                )
            elif kind == "npy":
                out.append(Source(kind, str(npy), npy))
            elif kind == "npy_path":
                out.append(Source(kind, npy, npy))
            elif kind in ("h5", "h5_chunked"):
                f = h5py.File(h5, "r")
                self._files.append(f)
                ds = f["contiguous"] if kind == "h5" else f["group/chunked"]
                out.append(Source(kind, ds, h5))
            elif kind == "h5_string":
                out.append(Source(kind, f"{h5}:/group/chunked", h5))
        return out

    def one(self, X, kind, **kwargs):
        """A single ``Source`` of ``kind`` holding ``X``."""
        return self(X, (kind,), **kwargs)[0]

    def close(self):
        for f in self._files:
            try:
                f.close()
            except Exception:  # pragma: no cover - already closed
                pass
        self._files.clear()


class PlanSpy:
    """A callback recording what each fit chose (its ``'plan'`` event): the
    schedule, block size and workers."""

    wants_plan = True

    def __init__(self):
        self.plans = []

    def __call__(self, record):
        if record["event"] == "plan":
            self.plans.append(record)

    def __getitem__(self, key):
        return [plan[key] for plan in self.plans]


def file_fingerprint(path):
    """Bytes and modification time of a file (to prove it was not modified)."""
    path = Path(path)
    st = os.stat(path)
    return path.read_bytes(), st.st_mtime_ns, st.st_size


PARAMS = ("weights_", "means_", "covariances_", "precisions_", "precisions_cholesky_")


def min_eigenvalues(gm):
    """Smallest eigenvalue of every covariance (per component; tied: one)."""
    cov = np.asarray(gm.covariances_, dtype=np.float64)
    if cov.ndim == 3:  # a matrix per component
        return np.linalg.eigvalsh(cov).min(axis=1)
    if get_covariance_type(gm.covariance_type).shared:  # one matrix
        return np.linalg.eigvalsh(cov).min(keepdims=True)
    if cov.ndim == 2:  # variances per component
        return cov.min(axis=1)
    return cov


def assert_same_state(a, b, rtol=None, precision_rtol=None):
    """Bitwise (rtol=None) or to ``rtol`` relative to each array's largest entry.

    The precisions are inverses of the covariances: they carry the covariances'
    rounding times their condition number, and get ``precision_rtol`` (by default
    ``100 * rtol``).
    """
    for name in PARAMS:
        x, y = getattr(a, name), getattr(b, name)
        if rtol is not None and name.startswith("precisions"):
            tol = 100 * rtol if precision_rtol is None else precision_rtol
            assert_allclose(x, y, rtol=0, atol=tol * np.abs(y).max(), err_msg=name)
        elif rtol is None:
            assert_array_equal(x, y, err_msg=name)
        else:
            assert_allclose(x, y, rtol=0, atol=rtol * np.abs(y).max(), err_msg=name)
    if rtol is None:
        assert a.lower_bounds_ == b.lower_bounds_
        assert a.lower_bound_ == b.lower_bound_
    else:
        assert_allclose(a.lower_bounds_, b.lower_bounds_, rtol=rtol)
    assert a.n_iter_ == b.n_iter_


def dense_covariances(gm):
    """(K, d, d) covariances of a fitted model: its ``covariances_`` read by their
    layout (a matrix per component, as 'full' and the dense ``covariances_`` of
    'factor'; one shared matrix; variances per component; one variance each)."""
    K, d = gm.means_.shape
    c = np.asarray(gm.covariances_, dtype=np.float64)
    if c.ndim == 3:
        return c
    if get_covariance_type(gm.covariance_type).shared:
        return np.stack([c] * K)
    if c.ndim == 2:
        return np.stack([np.diag(v) for v in c])
    return np.stack([np.eye(d) * v for v in c])


def variances(gm):
    """(K, d) variances of a fitted model."""
    return np.diagonal(dense_covariances(gm), axis1=1, axis2=2)


def assert_variances_at_least(gm, reg_covar):
    """Every variance >= reg_covar (the data's own variance is >= 0), and so every
    eigenvalue of a covariance matrix. One rounding of the sum reg_covar + variance
    into the output dtype may fall 1 ulp below."""
    eps = np.finfo(gm.covariances_.dtype).eps
    assert np.all(variances(gm) >= reg_covar * (1 - 2 * eps)), variances(gm)
    if np.ndim(gm.covariances_) == 3 or get_covariance_type(gm.covariance_type).shared:
        covs = dense_covariances(gm)
        eig = np.linalg.eigvalsh(covs)
        # eigenvalues of the *stored* matrix: rounding each entry to the output dtype
        # moves them by at most d * u * max|entry| (Weyl); for float32 entries of ~50
        # that is ~1e-5, more than reg_covar=1e-6 itself, so only that much is asked.
        d = covs.shape[-1]
        u = np.finfo(gm.covariances_.dtype).eps / 2
        slack = 2 * d * u * np.abs(covs).max(axis=(1, 2)) + 1e-6 * reg_covar
        assert np.all(eig >= reg_covar - slack[:, None]), eig


def assert_valid_model(gm):
    """Finite parameters, weights summing to 1, covariances PD with eig >= reg_covar."""
    for name in PARAMS:
        assert np.all(np.isfinite(getattr(gm, name))), name
    assert np.all(np.isfinite(gm.lower_bounds_))
    assert np.isfinite(gm.lower_bound_)
    eps = np.finfo(gm.weights_.dtype).eps
    assert abs(gm.weights_.sum() - 1.0) <= 10 * eps
    assert np.all(gm.weights_ >= 0)
    # rounding: the statistics are sums of squares of the data, whose size is the
    # covariance plus the squared means ('tied' expands around one common shift)
    scale = (np.abs(np.asarray(gm.covariances_, dtype=np.float64)).max()
             + (np.asarray(gm.means_, dtype=np.float64) ** 2).max())
    d = gm.means_.shape[1]
    assert np.all(min_eigenvalues(gm) >= gm.reg_covar - 10 * d * eps * scale)
    # positive definite: the precision factors have a positive diagonal (a float32
    # covariance of condition number above 1/eps may not be PD once rounded)
    u = np.asarray(gm.precisions_cholesky_)
    if get_covariance_type(gm.covariance_type).triangular:
        u = np.diagonal(u, axis1=-2, axis2=-1)
    assert np.all(u > 0)


def assert_bound_monotone(gm, rtol=1e-10):
    """Non-decreasing lower bound, except right after an iteration that re-seeded."""
    lb = np.asarray(gm.lower_bounds_)
    for i in range(1, len(lb)):
        if gm.history_[i - 1]["reseeded"]:
            continue
        assert lb[i] >= lb[i - 1] - rtol * max(1.0, abs(lb[i - 1])), (i, lb[i - 1],
                                                                      lb[i])


def cli_usage_error(argv, capsys):
    """Run ``emgmm`` with ``argv``; check that it is a usage error as argparse reports
    its own (exit status 2, the command's usage, then ``emgmm COMMAND: error: ...``
    as the last line) and return that line."""
    from emgmm._cli import command

    with pytest.raises(SystemExit) as info:
        command.main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: emgmm {argv[0]} "), err
    last = err.rstrip("\n").splitlines()[-1]
    assert last.startswith(f"emgmm {argv[0]}: error: "), err
    return last


def assert_screens_equal(got, want):
    """Two certified screens hold the same terms, bitwise."""
    for name in ("B", "c", "directions", "offset", "err_coef", "q_norm", "u_norm",
                 "log_det_err"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name),
                                      err_msg=name)
