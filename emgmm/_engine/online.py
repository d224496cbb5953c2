"""Stepwise online EM: running sufficient statistics moved by a step size.

Stepwise EM (Cappé and Moulines, "On-line expectation-maximization algorithm for
latent data models", JRSS B 71, 2009, eq. 2-3; Liang and Klein, "Online EM for
unsupervised models", NAACL 2009, algorithm "stepwise EM") keeps running sufficient
statistics ``s`` and, for the ``t``-th mini-batch (``t = 1, 2, ...``),

    s_t = s_{t-1} + eta_t (sbar_t - s_{t-1}) = (1 - eta_t) s_{t-1} + eta_t sbar_t,
    eta_t = (t + t0) ** -alpha,

where ``sbar_t`` are the batch's statistics under the parameters of step ``t - 1``
*normalised per unit of weight* (divided by the batch's total sample weight), and
``theta_t`` is the M step of ``s_t``. ``0.5 < alpha <= 1`` is the range in which
``sum eta_t = inf`` and ``sum eta_t^2 < inf`` (Robbins-Monro). scikit-learn's online
``LatentDirichletAllocation`` uses the same schedule, whose names and defaults
emgmm takes: ``learning_decay`` (alpha) 0.7 and ``learning_offset`` (t0) 10.

``s_0`` are the statistics that the M step maps to the starting model
(:func:`implied_statistics`). With ``alpha = 1`` and ``t0 = 0``, ``eta_1 = 1`` and
by induction ``s_t = (1 / t) sum_{j <= t} sbar_j``: the plain average of the
batches' normalised statistics, each under the parameters before it.

The statistics are the engine's ``N_k``, ``s_k = sum r_ik (x_i - c_k)`` and ``S_k =
sum r_ik (x_i - c_k)(x_i - c_k)^T`` around centres ``c_k`` (the current means, so
that no large terms cancel), in float64, and any further arrays the covariance type
names (:meth:`~emgmm.covariance.CovarianceType.online_statistics_shapes`; 'factor':
the latent moments ``sum r u E[z|x]^T``, ``sum r E[z|x]`` and ``sum r E[z z^T|x]``
with ``S_k`` kept as its diagonal, all ``O(K d q)``). Each type gives the shift of
its arrays to new centres, the statistics of a given model and its M step; the
functions here treat every array alike otherwise. Moving the centres is the
parallel-axis shift (:func:`shift_centres`), which is linear in the statistics: the
average above does not depend on the centres the batches were summed around. For
'full', every function reads and writes only what the upper triangles of ``sum_xx``
need (the engine's gathered statistics fill only them).

Pure functions of their arguments: no state, no files, no scikit-learn.
"""

from dataclasses import dataclass, field
from numbers import Integral, Real

import numpy as np

from ..covariance import REGISTRY, get_covariance_type

#: Default ``alpha`` of ``eta_t = (t + t0) ** -alpha``
#: (scikit-learn's ``learning_decay``).
DEFAULT_LEARNING_DECAY = 0.7
#: Default ``t0`` (scikit-learn's ``learning_offset``): damps the first steps.
DEFAULT_LEARNING_OFFSET = 10.0


@dataclass
class OnlineStatistics:
    """Normalised sufficient statistics around centres ``c_k``.

    Attributes
    ----------
    nk : ndarray of shape (K,), float64
        ``sum_i w_i r_ik / sum_i w_i`` (sums to one over ``k`` for data statistics).
    sum_x : ndarray of shape (K, d), float64
        ``sum_i w_i r_ik (x_i - c_k) / sum_i w_i``.
    sum_xx : ndarray, float64
        ``sum_i w_i r_ik (x_i - c_k)(x_i - c_k)^T / sum_i w_i``: ``(K, d, d)`` 'full'
        (upper triangles meaningful), ``(d, d)`` 'tied' (summed over ``k``),
        ``(K, d)`` 'diag' and 'spherical' (the diagonals): the covariance type's
        ``second_moments_shape``.
        'factor': ``(K, d)``, the diagonals.
    centers : ndarray of shape (K, d), float64
        The ``c_k``.
    covariance_type : str
        A name of :data:`emgmm.covariance.REGISTRY` whose type has online
        statistics.
    extra : dict of str to ndarray, float64
        The type's further arrays, normalised as the others (names and shapes:
        :meth:`~emgmm.covariance.CovarianceType.online_statistics_shapes`; 'factor':
        ``sum_xz`` (K, d, q), ``sum_z`` (K, q), ``sum_zz`` (K, q, q)); empty for the
        Gaussian types.
    """

    nk: np.ndarray
    sum_x: np.ndarray
    sum_xx: np.ndarray
    centers: np.ndarray
    covariance_type: str
    extra: dict = field(default_factory=dict)

    def arrays(self):
        """Every statistic by name (``nk``, ``sum_x``, ``sum_xx``, then ``extra``;
        not ``centers``): the arrays themselves, not copies."""
        return {"nk": self.nk, "sum_x": self.sum_x, "sum_xx": self.sum_xx,
                **self.extra}

    @property
    def nbytes(self):
        """Bytes of all the arrays, ``centers`` included."""
        return sum(a.nbytes for a in self.arrays().values()) + self.centers.nbytes


_BASE = ("nk", "sum_x", "sum_xx")


def _from_arrays(arrays, centers, covariance_type):
    """:class:`OnlineStatistics` of a dict of every statistic (no copies)."""
    extra = {name: a for name, a in arrays.items() if name not in _BASE}
    return OnlineStatistics(arrays["nk"], arrays["sum_x"], arrays["sum_xx"], centers,
                            covariance_type, extra)


def online_covariance_type(covariance_type):
    """The :class:`~emgmm.covariance.CovarianceType` of ``covariance_type``.

    Raises
    ------
    ValueError
        An unknown name, or a type without running statistics (naming those with).
    """
    kind = get_covariance_type(covariance_type)
    if not kind.has_online_statistics:
        online = [name for name, k in REGISTRY.items() if k.has_online_statistics]
        raise ValueError(f"covariance_type={kind.name!r} has no stepwise online EM "
                         f"(partial_fit); these types have: {', '.join(online)}.")
    return kind


def make_statistics(nk, sum_x, sum_xx, centers, covariance_type, **extra):
    """:class:`OnlineStatistics` of float64 copies, with the shapes checked.

    ``extra``: the type's further arrays by name (none for the Gaussian types;
    'factor': ``sum_xz``, ``sum_z``, ``sum_zz``).

    Raises
    ------
    ValueError
        An unknown ``covariance_type``, one without online statistics, arrays
        whose shapes do not agree, or other ``extra`` arrays than the type's.
    """
    kind = online_covariance_type(covariance_type)
    centers = np.array(centers, dtype=np.float64)
    arrays = {name: np.array(a, dtype=np.float64) for name, a in
              {"nk": nk, "sum_x": sum_x, "sum_xx": sum_xx, **extra}.items()}
    K, d = centers.shape if centers.ndim == 2 else (-1, -1)
    expected = kind.online_statistics_shapes(K, d, arrays)
    if set(arrays) != set(expected):
        raise ValueError(f"The running statistics of covariance_type="
                         f"{covariance_type!r} are {', '.join(expected)}; got "
                         f"{', '.join(arrays)}.")
    checks = [(name, arrays[name], shape) for name, shape in expected.items()]
    for name, a, shape in checks + [("centers", centers, (K, d))]:
        if a.shape != shape or K < 1:
            raise ValueError(f"{name} has shape {a.shape}; expected {shape} for "
                             f"covariance_type={covariance_type!r} and centers of "
                             f"shape {centers.shape}.")
    return _from_arrays({name: arrays[name] for name in expected}, centers, kind.name)


def zero_statistics(centers, covariance_type, **shape_parameters):
    """:class:`OnlineStatistics` of no rows around ``centers`` (K, d): zeros of the
    type's shapes (``shape_parameters``: what they need beyond ``K`` and ``d``, e.g.
    ``n_factors`` for 'factor', given to the type's ``for_params``)."""
    kind = online_covariance_type(covariance_type)
    if shape_parameters:
        kind = kind.for_params(shape_parameters)
    centers = np.array(centers, dtype=np.float64)
    K, d = centers.shape
    arrays = {name: np.zeros(shape)
              for name, shape in kind.online_statistics_shapes(K, d).items()}
    return _from_arrays(arrays, centers, kind.name)


def check_step_parameters(learning_decay, learning_offset):
    """Raise ``ValueError`` unless ``0.5 < learning_decay <= 1`` and
    ``learning_offset >= 0`` (both finite real numbers)."""
    if not (isinstance(learning_decay, Real) and 0.5 < learning_decay <= 1.0):
        raise ValueError(f"learning_decay must be in (0.5, 1] (Robbins-Monro: the "
                         f"steps sum to infinity, their squares do not); got "
                         f"{learning_decay!r}.")
    if not (isinstance(learning_offset, Real) and 0.0 <= learning_offset < np.inf):
        raise ValueError(f"learning_offset must be a finite number >= 0; got "
                         f"{learning_offset!r}.")


def step_size(step, learning_decay=DEFAULT_LEARNING_DECAY,
              learning_offset=DEFAULT_LEARNING_OFFSET):
    """``eta_t = (t + t0) ** -alpha`` of the ``t``-th mini-batch.

    Parameters
    ----------
    step : int
        ``t >= 1``.
    learning_decay : float, default=0.7
        ``alpha``, in ``(0.5, 1]``.
    learning_offset : float, default=10.0
        ``t0 >= 0``.

    Returns
    -------
    float
        In ``(0, 1]``; ``1`` only when ``t + t0 == 1``.

    Raises
    ------
    ValueError
        ``step < 1`` or parameters out of range (:func:`check_step_parameters`).
    """
    check_step_parameters(learning_decay, learning_offset)
    if not isinstance(step, Integral) or step < 1:
        raise ValueError(f"step must be an integer >= 1; got {step!r}.")
    return float((step + learning_offset) ** -learning_decay)


def normalised(nk, sum_x, sum_xx, centers, total_weight, covariance_type, **extra):
    """A batch's summed statistics divided by its total sample weight.

    Parameters
    ----------
    nk, sum_x, sum_xx : ndarray
        Sums over the batch's rows (weighted), around ``centers``; shapes as in
        :class:`OnlineStatistics`. For 'full', only the upper triangles of
        ``sum_xx`` are read: the result is symmetric.
    centers : ndarray of shape (K, d)
    total_weight : float
        ``sum_i w_i`` over the batch (its row count when unweighted), ``> 0``.
    covariance_type : str
    **extra : ndarray
        The type's further sums (:class:`OnlineStatistics`), divided alike.

    Returns
    -------
    OnlineStatistics

    Raises
    ------
    ValueError
        ``total_weight`` not a finite positive number.
    """
    total_weight = float(total_weight)
    if not 0.0 < total_weight < np.inf:
        raise ValueError(f"total_weight must be finite and > 0; got {total_weight}.")
    stats = make_statistics(nk, sum_x, sum_xx, centers, covariance_type, **extra)
    for a in stats.arrays().values():
        a /= total_weight
    # ('full': from the upper triangles, as the M step reads them)
    get_covariance_type(covariance_type).symmetrised_second_moments(stats.sum_xx)
    return stats


def batch_statistics(stats, centers, total_weight, covariance_type):
    """:func:`normalised` of a pass's summed statistics ``stats`` (the engine's
    ``SufficientStatistics``, 'factor''s ``FactorStatistics``: read by the names of
    the type's running statistics) around ``centers``."""
    centers = np.asarray(centers)
    kind = online_covariance_type(covariance_type)
    names = kind.online_statistics_shapes(*centers.shape, vars(stats))
    arrays = {name: getattr(stats, name) for name in names}
    return normalised(centers=centers, total_weight=total_weight,
                      covariance_type=covariance_type, **arrays)


def shift_centres(stats, new_centers):
    """The same statistics around ``new_centers`` (the parallel-axis shift).

    With ``delta_k = c'_k - c_k``: ``N'_k = N_k``, ``s'_k = s_k - N_k delta_k`` and
    ``S'_k = S_k - s_k delta_k^T - delta_k s_k^T + N_k delta_k delta_k^T`` (the
    expansion of ``sum r (x - c - delta)(x - c - delta)^T``); 'tied' sums the terms
    over ``k``, 'diag', 'spherical' and 'factor' keep the diagonal ``S_kj - 2
    delta_kj s_kj + N_k delta_kj^2``; 'factor' also moves ``sum_xz' = sum_xz - delta
    sum_z^T`` (the type's
    :meth:`~emgmm.covariance.CovarianceType.shift_online_statistics`).
    Rounding: the terms are of the size of ``N_k delta_k^2``, so a shift far
    larger than the spread loses about ``log10(delta^2 / variance)`` digits of
    ``S`` (callers shift by the M step's own move, ``s_k / N_k``).

    Parameters
    ----------
    stats : OnlineStatistics
    new_centers : array-like of shape (K, d)

    Returns
    -------
    OnlineStatistics
        New arrays; ``stats`` is not modified.
    """
    new = np.array(new_centers, dtype=np.float64)
    if new.shape != stats.centers.shape:
        raise ValueError(f"new_centers has shape {new.shape}; the statistics are "
                         f"around centres of shape {stats.centers.shape}.")
    delta = new - stats.centers
    kind = online_covariance_type(stats.covariance_type)
    return _from_arrays(kind.shift_online_statistics(stats.arrays(), delta), new,
                        stats.covariance_type)


def stepwise_update(running, batch, eta):
    """``(1 - eta) running + eta batch``, around ``running.centers``.

    Parameters
    ----------
    running, batch : OnlineStatistics
        Of the same covariance type and shapes; ``batch`` is first shifted onto
        ``running.centers`` (:func:`shift_centres`) when its centres differ.
    eta : float
        The step size, in ``[0, 1]`` (:func:`step_size`).

    Returns
    -------
    OnlineStatistics
        New arrays.

    Raises
    ------
    ValueError
        ``eta`` outside ``[0, 1]`` or statistics that do not match.
    """
    eta = float(eta)
    if not 0.0 <= eta <= 1.0:
        raise ValueError(f"eta must be in [0, 1]; got {eta}.")
    shapes = {name: a.shape for name, a in running.arrays().items()}
    if (batch.covariance_type != running.covariance_type
            or {name: a.shape for name, a in batch.arrays().items()} != shapes
            or batch.centers.shape != running.centers.shape):
        raise ValueError("The batch's statistics do not match the running ones "
                         f"({batch.covariance_type}, {batch.sum_xx.shape} against "
                         f"{running.covariance_type}, {running.sum_xx.shape}).")
    if not np.array_equal(batch.centers, running.centers):
        batch = shift_centres(batch, running.centers)
    keep = 1.0 - eta
    other = batch.arrays()
    return _from_arrays({name: keep * a + eta * other[name]
                         for name, a in running.arrays().items()},
                        running.centers.copy(), running.covariance_type)


def implied_statistics(weights, means, covariances, reg_covar, covariance_type):
    """The normalised statistics around ``means`` that the M step maps to this model.

    The M step gives ``w_k = N_k / sum N``, ``mu_k = c_k + s_k / N_k`` and
    ``Sigma_k = S_k / N_k - (s_k / N_k)(s_k / N_k)^T + reg_covar I``; its inverse
    around ``c_k = mu_k`` is ``N_k = w_k``, ``s_k = 0``, ``S_k = w_k (Sigma_k -
    reg_covar I)`` ('tied': ``sum_k w_k (Sigma - reg_covar I)``; 'spherical':
    ``w_k (sigma_k^2 - reg_covar)`` in every feature; 'factor': the expected
    statistics of the model's own distribution, ``sum_xz = w_k W_k``, ``sum_z = 0``,
    ``sum_zz = w_k I``, ``sum_xx = w_k diag(W_k W_k^T + Psi_k - reg_covar I)``: the
    type's :meth:`~emgmm.covariance.CovarianceType.implied_online_statistics`).
    Up to the M step's ``10 eps`` added to ``N_k`` (scikit-learn's guard), which
    moves the model by ~1e-15 relative. These are ``s_0`` of a stream that starts
    from a given model.

    Parameters
    ----------
    weights : array-like of shape (K,)
    means : array-like of shape (K, d)
    covariances : array-like
        scikit-learn's ``covariances_`` shapes ('factor': the packed loadings and
        noise variances of the engine's model).
    reg_covar : float
    covariance_type : str

    Returns
    -------
    OnlineStatistics
    """
    w = np.array(weights, dtype=np.float64)
    means = np.array(means, dtype=np.float64)
    cov = np.array(covariances, dtype=np.float64)
    K, d = means.shape
    kind = online_covariance_type(covariance_type)
    moments = kind.implied_online_statistics(w, cov, reg_covar, d)
    return make_statistics(w, np.zeros((K, d)), moments.pop("sum_xx"), means,
                           covariance_type, **moments)


def m_step(stats, reg_covar):
    """Weights, means and covariances (the engine's layout) of running statistics:
    the type's :meth:`~emgmm.covariance.CovarianceType.online_m_step` (the M step of
    ``fit`` from the same statistics)."""
    kind = online_covariance_type(stats.covariance_type)
    return kind.online_m_step(stats, reg_covar)


def to_arrays(stats, prefix="online_"):
    """The statistics as a dict of arrays (for model files and checkpoints):
    ``nk``, ``sum_x``, ``sum_xx``, the type's ``extra`` arrays, ``centers``."""
    named = {**stats.arrays(), "centers": stats.centers}
    return {prefix + name: a for name, a in named.items()}


def from_arrays(arrays, covariance_type, prefix="online_"):
    """Inverse of :func:`to_arrays` (every entry of ``arrays`` named ``prefix`` and
    other than the four common ones is one of the type's ``extra`` arrays); shapes
    and names checked (:func:`make_statistics`)."""
    common = ("nk", "sum_x", "sum_xx", "centers")
    extra = {name[len(prefix):]: a for name, a in arrays.items()
             if name.startswith(prefix) and name[len(prefix):] not in common}
    return make_statistics(*(arrays[prefix + name] for name in common),
                           covariance_type, **extra)


#: A component whose running weight ``N_k`` falls below this fraction of the mean
#: weight ``1 / K`` is starved (:func:`split_starved`). Batch fits of natural-image
#: patches (K=6) keep components of 0.02 to 0.05 (above 0.1 / 6); a stream that
#: starves leaves them at 0.001 to 0.006 (issue 36).
STARVED_FRACTION = 0.1

#: How far apart the two halves of a split start, in standard deviations along
#: the widest axis of the split component (each moves half of it).
SPLIT_SEPARATION = 1.0


def split_starved(stats, covariances, reg_covar, fraction=STARVED_FRACTION):
    """Re-seed the starved components by splitting the heaviest ones.

    A component whose weight ``N_k / sum N`` is below ``fraction / K`` is starved.
    In turn (by index), each starved component ``k`` and the heaviest component
    ``h`` at that moment share ``h``'s weight equally and its covariance, their means
    ``h``'s mean minus and plus ``SPLIT_SEPARATION / 2`` standard deviations along
    ``h``'s widest axis (its statistics are those :func:`implied_statistics` gives
    that pair); ``k``'s old statistics are dropped. The other components keep their
    means and covariances; every statistic is divided by the new total weight, so the
    weights sum to one. With 'tied', ``S`` is scaled with the total weight, so the
    shared covariance is kept. Deterministic: no random numbers.

    Splitting, not moving the component onto a worst-explained row as ``fit``'s
    re-seed does: a component seeded on an outlier with a covariance from the
    others takes few rows of the next batch, and a step of ``eta`` < 1 then starves
    it again; half of the component that explains most rows starts with work to
    do, and the halves separate over the next steps (the split of SMEM, Ueda et
    al., Neural Computation 12, 2000).

    Parameters
    ----------
    stats : OnlineStatistics
        Around the means (``sum_x`` zero: :func:`shift_centres` onto the M step's
        means).
    covariances : ndarray
        The M step's covariances of ``stats`` (``reg_covar`` included), in
        scikit-learn's shapes.
    reg_covar : float
    fraction : float, default=STARVED_FRACTION

    Returns
    -------
    stats : OnlineStatistics
        ``stats`` itself when no component is starved, else new arrays.
    splits : list of (int, int)
        ``(k, h)``: starved component, the component it was split from.
    """
    kind = online_covariance_type(stats.covariance_type)
    K, d = stats.centers.shape
    nk = stats.nk
    starved = [int(k) for k in np.flatnonzero(nk < fraction * nk.sum() / K)]
    if not starved:
        return stats, []
    nk, sum_x, sum_xx = nk.copy(), stats.sum_x.copy(), stats.sum_xx.copy()
    extra = {name: a.copy() for name, a in stats.extra.items()}
    centers = stats.centers.copy()
    old_total = nk.sum()
    nk[starved] = 0.0
    covariances = np.array(covariances, dtype=np.float64)  # (a split's own copy)
    splits = []
    for k in starved:
        h = int(np.argmax(nk))
        covariance = covariances if kind.shared else covariances[h]
        shift = 0.5 * SPLIT_SEPARATION * kind.widest_axis(covariance, d)
        half = nk[h] / 2.0
        pair = [h, k]
        nk[pair] = half
        sum_x[pair] = 0.0
        centers[pair] = centers[h] - shift, centers[h] + shift
        if not kind.shared:
            implied = kind.implied_online_statistics(
                np.full(2, half), np.stack([covariance] * 2), reg_covar, d)
            sum_xx[pair] = implied.pop("sum_xx")
            for name, a in implied.items():
                extra[name][pair] = a
            covariances[k] = covariance
        splits.append((k, h))
    total = nk.sum()
    if kind.shared:  # (a shared type's arrays beyond N and s are all pooled)
        sum_xx *= total / old_total
        for a in extra.values():
            a *= total / old_total
    return (OnlineStatistics(nk / total, sum_x / total, sum_xx / total, centers,
                             stats.covariance_type,
                             {name: a / total for name, a in extra.items()}), splits)
