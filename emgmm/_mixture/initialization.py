"""Initial parameters from a bounded random subsample, as scikit-learn computes them.

scikit-learn initialises from responsibilities over the whole of ``X``
(``sklearn.mixture._base.BaseMixture._initialize_parameters``). emgmm does the same on
a subsample of at most ``init_max_samples`` rows (and at most
:func:`init_sample_bytes` of them: the fit's block, within bounds), drawn with the
estimator's random state and read in increasing row order (one sequential pass at
most). When ``X`` has
no more rows than that, the subsample is ``X`` itself and no random numbers are drawn
for it, so every ``init_params`` gives exactly scikit-learn's initialisation.
"""

import numpy as np
from sklearn.cluster import KMeans, kmeans_plusplus

from ..covariance import get_covariance_type

#: Bytes of float64 rows the initialisation subsample may hold: it is read into
#: memory and k-means works on copies of it, so at d=10k the 100,000 rows of
#: ``init_max_samples`` would be 8 GB (several times that at the peak).
INIT_SAMPLE_BYTES = 256 * 2**20
#: The subsample may always hold this many bytes, whatever the fit's block (so that
#: small data keep scikit-learn's initialisation on all their rows).
INIT_SAMPLE_MIN_BYTES = 64 * 2**20


def init_sample_bytes(block_bytes=None):
    """Bytes of float64 rows the initialisation subsample may hold: at most
    :data:`INIT_SAMPLE_BYTES` and at most the fit's block as float64
    (``block_bytes``), but at least :data:`INIT_SAMPLE_MIN_BYTES`.

    k-means on the subsample holds the subsample, scikit-learn's centred copy of
    it and, while it computes its tolerance, the deviations from the column means:
    up to about four times the subsample (1034 MiB on 256 MiB at d=10k), against
    the three times (model + one block) a fit may take.

    Parameters
    ----------
    block_bytes : int or None, default=None
        ``block_rows * n_features * 8``; ``None``: :data:`INIT_SAMPLE_BYTES`.

    Returns
    -------
    int
    """
    if block_bytes is None:
        return INIT_SAMPLE_BYTES
    return int(min(INIT_SAMPLE_BYTES, max(INIT_SAMPLE_MIN_BYTES, block_bytes)))


def init_rows(init_max_samples, n_samples, n_features, n_components,
              block_rows=None):
    """Rows of the initialisation subsample: ``init_max_samples``, at most as many
    float64 rows as fit in :func:`init_sample_bytes` of the fit's blocks of
    ``block_rows`` (but no fewer than ``n_components``), at most ``n_samples``."""
    d = max(n_features, 1)
    budget = init_sample_bytes(None if block_rows is None else 8 * d * block_rows)
    by_bytes = max(n_components, budget // (8 * d))
    return int(min(n_samples, init_max_samples, by_bytes))


def subsample_indices(n_samples, max_samples, random_state):
    """Sorted row indices of the initialisation subsample, or ``None`` for all rows.

    Parameters
    ----------
    n_samples, max_samples : int
    random_state : numpy.random.RandomState

    Returns
    -------
    ndarray of int or None
    """
    if n_samples <= max_samples:
        return None
    return np.sort(random_state.choice(n_samples, size=max_samples, replace=False))


def initial_responsibilities(X, n_components, init_params, random_state,
                             sample_weight=None):
    """Responsibilities the initialisation starts from (scikit-learn's four methods).

    Parameters
    ----------
    X : ndarray of shape (m, d)
        The subsample.
    n_components : int
    init_params : {'kmeans', 'k-means++', 'random', 'random_from_data'}
    random_state : numpy.random.RandomState
        Consumed exactly as scikit-learn consumes it.
    sample_weight : ndarray of shape (m,) or None, default=None
        The rows' weights: 'kmeans' and 'k-means++' pass them to scikit-learn's
        ``KMeans`` and ``kmeans_plusplus``; 'random_from_data' draws the rows with
        probability proportional to weight (``random_state.choice(..., p=w / sum
        w)``); 'random' does not use them (the parameters weigh its
        responsibilities).

    Returns
    -------
    resp : ndarray of shape (m, n_components), float64

    Raises
    ------
    ValueError
        'random_from_data' with fewer rows of positive weight than components.
    """
    m = X.shape[0]
    resp = np.zeros((m, n_components), dtype=np.float64)
    if init_params == "kmeans":
        labels = (
            KMeans(n_clusters=n_components, n_init=1, random_state=random_state)
            .fit(X, sample_weight=sample_weight)
            .labels_
        )
        resp[np.arange(m), labels] = 1
    elif init_params == "random":
        resp = random_state.uniform(size=(m, n_components))
        resp /= resp.sum(axis=1)[:, np.newaxis]
    elif init_params == "random_from_data":
        indices = _rows_from_data(m, n_components, random_state, sample_weight)
        resp[indices, np.arange(n_components)] = 1
    else:  # "k-means++"
        _, indices = kmeans_plusplus(X, n_components, sample_weight=sample_weight,
                                     random_state=random_state)
        resp[indices, np.arange(n_components)] = 1
    return resp


def _rows_from_data(m, n_components, random_state, sample_weight):
    """'random_from_data': distinct rows, drawn in proportion to weight if given."""
    if sample_weight is None:
        return random_state.choice(m, size=n_components, replace=False)
    positive = int(np.count_nonzero(sample_weight))
    if positive < n_components:
        raise ValueError(
            f"The initialisation sample has {positive} rows of positive weight, fewer "
            f"than n_components={n_components}: init_params='random_from_data' needs "
            "one per component (raise init_max_samples).")
    return random_state.choice(m, size=n_components, replace=False,
                               p=sample_weight / sample_weight.sum())


def parameters_from_responsibilities(X, resp, reg_covar, covariance_type,
                                     sample_weight=None):
    """Weights, means and covariances from responsibilities on an in-memory sample.

    Follows ``sklearn.mixture._gaussian_mixture._estimate_gaussian_parameters``:
    ``N_k = sum_i r_ik + 10 eps``, ``w_k = N_k / m`` (not renormalised, as in
    scikit-learn's initialisation), means ``sum_i r_ik x_i / N_k``. Statistics are
    centred on those means, by the covariance type's
    :meth:`~emgmm.covariance.CovarianceType.covariances_from_responsibilities`
    (for 'tied' scikit-learn's value, also where rows of ``resp`` do not sum to one).

    Parameters
    ----------
    X : ndarray of shape (m, d)
    resp : ndarray of shape (m, K)
    reg_covar : float
    covariance_type : str
    sample_weight : ndarray of shape (m,) or None, default=None
        Multiplies the responsibilities in every sum; ``m`` becomes ``sum w``.

    Returns
    -------
    weights : ndarray of shape (K,)
    means : ndarray of shape (K, d)
    covariances : ndarray
    """
    X64 = np.asarray(X, dtype=np.float64)
    m = X64.shape[0] if sample_weight is None else float(sample_weight.sum())
    weighted = resp if sample_weight is None else resp * sample_weight[:, None]
    nk = weighted.sum(axis=0) + 10 * np.finfo(np.float64).eps
    means = (weighted.T @ X64) / nk[:, np.newaxis]
    kind = get_covariance_type(covariance_type)
    covariances = kind.covariances_from_responsibilities(
        X64, resp, means, nk, reg_covar, sample_weight)
    return nk / m, means, covariances


def spread_fits(sample, dtype):
    """Whether the squared distances of ``sample``'s rows from their column means
    stay within the range of ``dtype`` (values within ~sqrt(max / d) / 2 of the
    mean)."""
    limit = np.sqrt(np.finfo(dtype).max / max(sample.shape[1], 1)) / 2
    centre = sample.mean(axis=0, dtype=np.float64)
    return bool(np.max(np.abs(sample - centre), initial=0.0) <= limit)


def init_sample(sample, description):
    """The initialisation subsample as k-means and the first covariances get it.

    float32 data whose squared spread overflows float32 is cast to float64 (k-means
    on it would overflow; whether the fitted float32 attributes can hold the
    components is checked on the starting model). Data whose squared spread
    overflows float64 is refused before any distance or variance is computed: every
    covariance would be infinite, after a series of numpy overflow warnings.

    Parameters
    ----------
    sample : ndarray of shape (n, d)
    description : str
        How messages name the data.

    Returns
    -------
    ndarray of shape (n, d)

    Raises
    ------
    ValueError
    """
    if not spread_fits(sample, np.float64):
        limit = np.sqrt(np.finfo(np.float64).max / max(sample.shape[1], 1)) / 2
        raise ValueError(
            f"The covariances of {description} are not finite: the data's variances "
            f"overflow float64 (values beyond ~{limit:.0e} from the mean in the "
            "initialisation's subsample). Scale the input data."
        )
    if sample.dtype == np.float32 and not spread_fits(sample, np.float32):
        return sample.astype(np.float64)
    return sample
