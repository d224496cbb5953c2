"""Numerical parity with scikit-learn's GaussianMixture.

1. From identical ``weights_init``/``means_init``/``precisions_init`` with ``tol=0`` and
   ``max_iter=5`` (five full EM iterations, no early stop), emgmm and scikit-learn agree
   on ``lower_bounds_`` to 1e-9 relative and on every fitted parameter to 1e-7 relative,
   for all four covariance types, in float64, on synthetic blobs and on the digits data
   set.
2. Drop-in: on data no larger than ``init_max_samples``, default parameters and the same
   ``random_state`` give the same fitted model for every ``init_params``, with
   ``n_init=1`` and ``n_init=3``.

Semantics that differ on purpose (see the emgmm docstring): sklearn's ``lower_bound_``
is the bound computed *before* the last M step; emgmm's is the mean log-likelihood of
the returned parameters, i.e. ``score(X)``. ``lower_bounds_`` has the same meaning in
both.

Exact zeros and the float64 noise floor. The comparison is relative (``atol=0``) for
every entry except those that are zero in expectation, where a relative tolerance is
meaningless:

* exact structural zeros: the strict lower triangle of ``precisions_cholesky_``, and on
  digits the entries involving the pixels that are 0 in every image;
* entries that are zero *at working precision*: on digits some means and covariances
  are sums whose every term carries a responsibility of 1e-13 .. 1e-300 (images far from
  the component) or cancels, e.g. a mean of 5e-125 or a covariance of -1.7e-12 in an
  array whose largest entry is ~40. Such a value is determined only to the absolute
  rounding error of a length-n float64 sum, ``gamma_n * max|entry|`` with
  ``gamma_n = n u`` (Higham, Accuracy and Stability, eq. 4.4), because a responsibility
  of 1e-125 is exp(-287) and its logarithm is itself only known to ~1e-16 times the
  Mahalanobis terms (~1e5 here). Two correct implementations differ there by 10-500%
  relative (measured: sklearn vs emgmm 12% on a mean of 5e-125).

Entries with ``|expected| <= gamma_n * max|expected|`` (n = number of samples) must
agree to that same absolute ``gamma_n * max|expected|``; all others to ``rtol`` with no
atol. On the blobs no entry but the structural zeros is below that floor.
"""

import warnings

import numpy as np
import pytest
from helpers import (
    COVARIANCE_TYPES,
    SKLEARN_COVARIANCE_TYPES,
    make_blobs_data,
    not_converging,
    type_settings,
)
from numpy.testing import assert_allclose, assert_array_equal
from sklearn.cluster import KMeans
from sklearn.datasets import load_digits
from sklearn.exceptions import ConvergenceWarning
from sklearn.mixture import GaussianMixture as SkGaussianMixture

from emgmm import GaussianMixture
from emgmm._mixture import initialization

U64 = float(np.finfo(np.float64).eps) / 2
PARAMS = ("weights_", "means_", "covariances_", "precisions_", "precisions_cholesky_")


def assert_close_with_exact_zeros(got, expected, rtol, name="", n_samples=1):
    """rtol everywhere, except entries zero in expectation (see module doc)."""
    got = np.asarray(got, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert got.shape == expected.shape, name
    scale = np.abs(expected).max()
    floor = n_samples * U64 / (1 - n_samples * U64) * scale
    zero = np.abs(expected) <= floor
    assert np.all(np.abs(got[zero] - expected[zero]) <= floor), f"{name}: zeros"
    assert_allclose(got[~zero], expected[~zero], rtol=rtol, atol=0, err_msg=name)


def init_from_kmeans(X, K, covariance_type, reg_covar, seed=0):
    """weights/means/precisions from a k-means partition (np.cov per cluster)."""
    labels = KMeans(K, n_init=1, random_state=seed).fit(X).labels_
    d = X.shape[1]
    nk = np.bincount(labels, minlength=K).astype(float)
    weights = nk / nk.sum()
    means = np.stack([X[labels == k].mean(axis=0) for k in range(K)])
    covs = np.stack(
        [np.cov(X[labels == k], rowvar=False, bias=True).reshape(d, d)
         for k in range(K)]
    ) + reg_covar * np.eye(d)
    if covariance_type == "full":
        prec = np.linalg.inv(covs)
        prec = (prec + np.swapaxes(prec, 1, 2)) / 2
    elif covariance_type == "tied":
        prec = np.linalg.inv(np.einsum("k,kij->ij", weights, covs))
        prec = (prec + prec.T) / 2
    elif covariance_type == "diag":
        prec = 1.0 / np.diagonal(covs, axis1=1, axis2=2)
    else:
        prec = 1.0 / np.diagonal(covs, axis1=1, axis2=2).mean(axis=1)
    return weights, means, prec


def fit_both(X, K, covariance_type, reg_covar, **extra):
    w, m, p = init_from_kmeans(X, K, covariance_type, reg_covar)
    kw = dict(
        n_components=K,
        covariance_type=covariance_type,
        tol=0.0,
        max_iter=5,
        reg_covar=reg_covar,
        weights_init=w,
        means_init=m,
        precisions_init=p,
    )
    with pytest.warns(ConvergenceWarning):
        sk = SkGaussianMixture(**kw).fit(X)
    with pytest.warns(ConvergenceWarning):  # same warning: tol=0 never converges
        em = GaussianMixture(**kw, **extra).fit(X)
    return sk, em


def assert_parity(sk, em, X):
    assert em.n_iter_ == sk.n_iter_ == 5
    assert em.converged_ is False and sk.converged_ is False
    assert len(em.lower_bounds_) == 5
    assert_allclose(em.lower_bounds_, sk.lower_bounds_, rtol=1e-9, atol=0)
    for name in PARAMS:
        assert_close_with_exact_zeros(
            getattr(em, name), getattr(sk, name), 1e-7, name, n_samples=X.shape[0]
        )
    # emgmm's lower_bound_ is the score of the returned parameters
    assert_allclose(em.lower_bound_, sk.score(X), rtol=1e-9)
    assert_allclose(em.lower_bound_, em.score(X), rtol=1e-12)
    assert_allclose(em.score_samples(X), sk.score_samples(X), rtol=1e-9, atol=0)
    assert_array_equal(em.predict(X), sk.predict(X))


@pytest.fixture(scope="module")
def blobs_parity():
    return make_blobs_data(800, 4, 4, seed=3)


@pytest.fixture(scope="module")
def digits():
    """Raw digits (1797 x 64, pixel values 0..16)."""
    return load_digits().data.astype(np.float64)


@pytest.mark.parametrize("covariance_type", SKLEARN_COVARIANCE_TYPES)
def test_parity_blobs(blobs_parity, covariance_type):
    X = blobs_parity
    sk, em = fit_both(X, 4, covariance_type, reg_covar=1e-6)
    assert_parity(sk, em, X)


@pytest.mark.parametrize("covariance_type", SKLEARN_COVARIANCE_TYPES)
def test_parity_blobs_small_blocks(blobs_parity, covariance_type):
    """Same parity when the data is streamed in blocks of 37 rows.

    37 does not divide 800.
    """
    X = blobs_parity
    sk, em = fit_both(X, 4, covariance_type, reg_covar=1e-6, block_size=37)
    assert_parity(sk, em, X)


@pytest.mark.parametrize("covariance_type", SKLEARN_COVARIANCE_TYPES)
def test_parity_digits(digits, covariance_type):
    """Digits has pixels that are 0 in every image (zero-variance columns). With the
    default reg_covar=1e-6 their variance would be 1e-6 against ~10-40 for the other
    pixels, a covariance condition number ~1e7 that amplifies rounding differences
    between two correct implementations beyond 1e-7. reg_covar=1e-2 keeps the condition
    number ~1e4 while leaving those columns exactly zero (so they also exercise the
    exact-zero handling); standardising would not help, as the constant columns stay
    constant."""
    X = digits
    assert np.any(X.std(axis=0) == 0)  # the reason for reg_covar
    sk, em = fit_both(X, 10, covariance_type, reg_covar=1e-2)
    assert_parity(sk, em, X)


# ----------------------------------------------------------------- drop-in results


@pytest.fixture(scope="module")
def dropin_data():
    # 3 blobs, 450 rows: far below the default init_max_samples=100_000, so emgmm's
    # initialisation sees the whole data set, exactly like scikit-learn's.
    return make_blobs_data(450, 3, 3, spread=4.0, seed=11)


def assert_same_model(em, sk, X):
    assert em.n_iter_ == sk.n_iter_
    assert em.converged_ == sk.converged_
    assert_allclose(em.lower_bounds_, sk.lower_bounds_, rtol=1e-7)
    for name in PARAMS:
        assert_close_with_exact_zeros(getattr(em, name), getattr(sk, name), 1e-7, name)
    assert_array_equal(em.predict(X), sk.predict(X))
    proba = em.predict_proba(X)
    assert_allclose(proba, sk.predict_proba(X), rtol=1e-7, atol=1e-12)
    assert proba.flags.c_contiguous  # scikit-learn's layout, whatever the kernels use
    assert_allclose(em.score(X), sk.score(X), rtol=1e-7)
    assert_allclose(em.bic(X), sk.bic(X), rtol=1e-7)
    assert_allclose(em.aic(X), sk.aic(X), rtol=1e-7)


def fit_quiet(cls, X, **kw):
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always", ConvergenceWarning)
        est = cls(**kw).fit(X)
    return est, any(issubclass(w.category, ConvergenceWarning) for w in ws)


@pytest.mark.parametrize("init_params",
                         ["kmeans", "k-means++", "random", "random_from_data"])
@pytest.mark.parametrize("random_state", [0, 7])
def test_dropin_same_model_as_sklearn(dropin_data, init_params, random_state):
    """n_init=1: the same model as scikit-learn, same warnings."""
    X = dropin_data
    assert X.shape[0] <= GaussianMixture().init_max_samples
    kw = dict(n_components=3, init_params=init_params, random_state=random_state)
    sk, sk_warned = fit_quiet(SkGaussianMixture, X, **kw)
    em, em_warned = fit_quiet(GaussianMixture, X, **kw)
    assert em_warned == sk_warned
    assert_same_model(em, sk, X)


@pytest.mark.parametrize("init_params",
                         ["kmeans", "k-means++", "random", "random_from_data"])
@pytest.mark.parametrize("random_state", [0, 7])
def test_dropin_n_init_3(dropin_data, init_params, random_state):
    """n_init=3.

    Every one of the three runs is scikit-learn's run (replayed by three n_init=1 fits
    sharing one RandomState, which is how both libraries draw the runs of n_init=3).
    The kept run differs on purpose only in the selection rule: emgmm keeps the highest
    ``lower_bound_`` = score of the final parameters, scikit-learn the highest bound
    from the last E step. When both rules pick the same run the models are identical;
    when they do not (on this data all runs reach the same optimum with permuted labels,
    and the pick is decided by 1e-10 noise) emgmm's kept model scores at least as well,
    and is the same mixture up to a relabelling of the components.
    """
    X = dropin_data
    kw = dict(n_components=3, init_params=init_params)
    rs_sk, rs_em = (np.random.RandomState(random_state),
                    np.random.RandomState(random_state))
    runs_sk = [fit_quiet(SkGaussianMixture, X, random_state=rs_sk, **kw)[0]
               for _ in range(3)]
    runs_em = [fit_quiet(GaussianMixture, X, random_state=rs_em, **kw)[0]
               for _ in range(3)]
    for e, s in zip(runs_em, runs_sk, strict=False):
        assert_same_model(e, s, X)

    sk, _ = fit_quiet(SkGaussianMixture, X, n_init=3, random_state=random_state, **kw)
    em, _ = fit_quiet(GaussianMixture, X, n_init=3, random_state=random_state, **kw)
    sk_pick = int(np.argmax([r.lower_bound_ for r in runs_sk]))
    em_pick = int(np.argmax([r.lower_bound_ for r in runs_em]))
    assert_same_model(sk, runs_sk[sk_pick], X)  # (the replay is faithful)
    # emgmm keeps its best run: identical to that run
    for name in PARAMS + ("lower_bound_", "lower_bounds_", "n_iter_", "converged_"):
        assert_array_equal(getattr(em, name), getattr(runs_em[em_pick], name),
                           err_msg=name)
    assert em.lower_bound_ == max(r.lower_bound_ for r in runs_em)
    if em_pick == sk_pick:
        assert_same_model(em, sk, X)
    else:
        assert em.score(X) >= sk.score(X) - 1e-12 * abs(sk.score(X))
        order_em = np.lexsort(em.means_.T[::-1])
        order_sk = np.lexsort(sk.means_.T[::-1])
        # two *different* runs stopped by tol=1e-3 at the same optimum agree only to
        # the convergence accuracy (measured: 3e-7 relative), not to rounding; the
        # per-run equality to 1e-7 is asserted above.
        for name in ("weights_", "means_", "covariances_"):
            assert_allclose(
                getattr(em, name)[order_em], getattr(sk, name)[order_sk], rtol=1e-5,
                atol=0, err_msg=name,
            )
        assert_allclose(em.score_samples(X), sk.score_samples(X), rtol=1e-5)


@pytest.mark.parametrize("covariance_type", SKLEARN_COVARIANCE_TYPES)
def test_dropin_every_covariance_type(dropin_data, covariance_type):
    """Default init (kmeans) for every covariance type."""
    X = dropin_data
    kw = dict(n_components=3, covariance_type=covariance_type, random_state=0)
    sk = SkGaussianMixture(**kw).fit(X)
    em = GaussianMixture(**kw).fit(X)
    assert em.n_iter_ == sk.n_iter_
    assert_allclose(em.lower_bounds_, sk.lower_bounds_, rtol=1e-7)
    for name in PARAMS:
        assert_close_with_exact_zeros(getattr(em, name), getattr(sk, name), 1e-7, name)


def test_dropin_sample(dropin_data):
    """sample() draws the same points from the same random_state."""
    X = dropin_data
    sk = SkGaussianMixture(n_components=3, random_state=0).fit(X)
    em = GaussianMixture(n_components=3, random_state=0).fit(X)
    Xs, ys = sk.sample(50)
    Xe, ye = em.sample(50)
    assert_array_equal(ye, ys)
    assert_allclose(Xe, Xs, rtol=1e-7, atol=1e-9)


def _warm_steps(cls, X, init, max_calls=50):
    """``(n_iter_, converged_)`` of each fit of a loop of warm-started ``max_iter=1``
    fits from ``init`` (weights, means, precisions), up to the first that
    converges."""
    w, m, p = init
    gm = cls(n_components=len(w), covariance_type="full", tol=1e-3, max_iter=1,
             warm_start=True, weights_init=w, means_init=m, precisions_init=p)
    steps = []
    while len(steps) < max_calls and not (steps and steps[-1][1]):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)  # (until the last)
            gm.fit(X)
        steps.append((gm.n_iter_, bool(gm.converged_)))
    return steps, gm


def test_warm_started_single_iterations_converge_as_sklearn(blobs_parity):
    """Each warm start measures its first change against the previous fit's last
    bound (scikit-learn's rule), so the loop converges, at the call where one fit
    of the same start does, as scikit-learn's loop (emgmm measured from -inf and
    never converged)."""
    X = blobs_parity
    init = init_from_kmeans(X, 4, "full", 1e-6)
    steps, em = _warm_steps(GaussianMixture, X, init)
    sk_steps, sk = _warm_steps(SkGaussianMixture, X, init)
    assert steps == sk_steps
    assert steps[-1] == (1, True) and 2 <= len(steps) < 50
    w, m, p = init
    one = GaussianMixture(4, tol=1e-3, weights_init=w, means_init=m,
                          precisions_init=p).fit(X)
    assert one.converged_ and one.n_iter_ == len(steps)
    assert_allclose(em.lower_bounds_, sk.lower_bounds_, rtol=1e-9)
    assert_allclose(em.lower_bounds_[-1], one.lower_bounds_[-1], rtol=1e-12)


class PlanRecorder:
    """A callback keeping the 'plan' event."""

    wants_plan = True

    def __init__(self):
        self.plan = None

    def __call__(self, record):
        if record["event"] == "plan":
            self.plan = record


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_the_init_subsample_is_capped_by_the_block(monkeypatch, covariance_type):
    """Beyond INIT_SAMPLE_MIN_BYTES the subsample holds at most one float64 block
    of the fit (here 40 rows), for every covariance type: k-means' copies of it
    stay within the fit's memory."""
    X = make_blobs_data(500, 50, 3, seed=5)
    monkeypatch.setattr(initialization, "INIT_SAMPLE_MIN_BYTES", 8)
    recorder = PlanRecorder()
    with not_converging():
        GaussianMixture(3, **type_settings(covariance_type, X.shape[1]), max_iter=1,
                        random_state=0, block_size=40, callback=recorder).fit(X)
    assert recorder.plan["init_rows"] == 40
    monkeypatch.setattr(initialization, "INIT_SAMPLE_MIN_BYTES", 500 * 50 * 8)
    assert initialization.init_rows(100_000, 500, 50, 3, block_rows=40) == 500


def test_the_init_subsample_is_capped_in_bytes(monkeypatch):
    """At most INIT_SAMPLE_BYTES of float64 rows (here 64 rows of 50 features): the
    plan says so, and the start is that of init_max_samples=64; never fewer rows
    than components."""
    X = make_blobs_data(500, 50, 3, seed=5)
    monkeypatch.setattr(initialization, "INIT_SAMPLE_BYTES", 64 * 50 * 8)
    recorder = PlanRecorder()
    with not_converging():
        capped = GaussianMixture(3, max_iter=2, random_state=0,
                                 callback=recorder).fit(X)
    assert recorder.plan["init_rows"] == 64
    monkeypatch.setattr(initialization, "INIT_SAMPLE_BYTES", 2**30)
    with not_converging():
        by_rows = GaussianMixture(3, max_iter=2, random_state=0,
                                  init_max_samples=64).fit(X)
    assert np.array_equal(capped.means_, by_rows.means_)
    monkeypatch.setattr(initialization, "INIT_SAMPLE_BYTES", 8)
    assert initialization.init_rows(100_000, 500, 50, 3) == 3
