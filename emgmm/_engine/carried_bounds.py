"""Lower bounds of Mahalanobis distances carried across the iterations of the pairs
schedule (:mod:`.pair_step`), so that most rows are screened without touching them.

Each row ``i`` keeps its top component ``c_i`` and, per group ``g`` of components
(of nearby offsets, fixed while rows carry bounds), ``b_ig <= min_{k in g, k != c_i}
sqrt(m_ik)`` under the model of the last E step (float32, rounded down), with
``||x_i||`` (rounded up). When the model moves, each component's
:class:`~emgmm.covariance._drift.Drift` moves the bound of its group (Elkan 2003;
Hamerly 2010; Ding et al., *Yinyang K-means*, ICML 2015, for the grouping), here in
each component's own metric::

    b'_ig = s_g b_ig - e_g ||x_i|| - f_g,   s_g = min s_k, e_g = max e_k,
                                             f_g = max shift_k  over k in g

and the group bounds every other pair's weighted log-density from above by
``o_g - b'_ig^2 / 2`` (``o_g`` the largest screen offset of the group). A component
whose move carries nothing (a re-seed, the first iteration, ``s_k`` below
:data:`FRESH_SCALE`) is *fresh*: its pairs are bounded by the projection screen
instead, and its groups' bounds are refreshed from those.

Pure functions of arrays; rounding is directed by relative slacks far above the
few roundings of each expression.
"""

from dataclasses import dataclass

import numpy as np

from ..covariance._drift import drift_flops

#: Components per group on average (the state holds ``n x ceil(K / GROUP_SIZE)``
#: bounds).
GROUP_SIZE = 5
#: A component whose ``s_k`` is below this is screened afresh (its bounds would
#: shrink too fast to reject anything).
FRESH_SCALE = 0.8
#: Carried bounds are used when the projections they save (``2 n d p`` flops per
#: component, at the GEMM rate) are ``_PAYBACK`` times the drift terms (a
#: triangular solve and product, ``2 d^3 / 3`` flops, at about ``_SOLVE_RATE`` of
#: that rate): from ``n >= 4 d^2``. The payback is set by measurement: with 8.6
#: pairs per row at [50k, 196] K=200 the rescreened rows' second projection and the
#: drift terms took back more than phase 1 saved; ``True`` or ``False`` forces them
#: on or off (for the tests and benchmarks).
CARRY = None
_PAYBACK = 12.0
_SOLVE_RATE = 0.25
_SLACK = 1e-12
_U64 = np.finfo(np.float64).eps / 2


def carry_pays(n_samples, n_features, p):
    """Whether carried bounds pay for their drift terms at this size (or
    :data:`CARRY` when set)."""
    if CARRY is not None:
        return bool(CARRY)
    return (2.0 * n_samples * n_features * p * _SOLVE_RATE
            >= _PAYBACK * drift_flops(n_features))


def component_groups(offset, n_groups):
    """At most ``n_groups`` groups of components of nearby screen offsets ``offset``
    (K,) (log weight and log-determinant, which differ by thousands of nats
    between flat and textured image patches), as (K,) int32 labels.

    A group's bound ``o_g - b_ig^2 / 2`` takes its largest offset with its nearest
    member's distance, so it is as tight as its offsets are close: the groups are
    the bins of the sorted finite offsets of the least width that needs at most
    ``n_groups`` bins (bisection on the width, a greedy binning for each); the
    non-finite ones (a weight of 0) share one more group."""
    offset = np.asarray(offset, dtype=np.float64)
    finite = np.isfinite(offset)
    bins = max(1, n_groups - int(not finite.all()))
    order = np.flatnonzero(finite)[np.argsort(offset[finite], kind="stable")]
    values = offset[order]
    low, high = 0.0, float(np.ptp(values)) if values.size else 0.0
    for _ in range(60):
        width = 0.5 * (low + high)
        if _bins(values, width).max(initial=0) < bins:
            high = width
        else:
            low = width
    groups = np.full(offset.size, min(bins, n_groups - 1), np.int32)
    groups[order] = _bins(values, high)
    return groups


def _bins(values, width):
    """Greedy bins of ``width`` over the sorted ``values``: each bin starts at the
    first value beyond the last bin's start plus ``width``."""
    labels = np.empty(values.size, np.int32)
    label, start = 0, values[0] if values.size else 0.0
    for j, value in enumerate(values):
        if value - start > width:
            label += 1
            start = value
        labels[j] = label
    return labels


def rounded_down(values):
    """float32 values no larger than the float64 ``values`` (``inf`` stays)."""
    out = values.astype(np.float32)
    over = out.astype(np.float64) > values
    out[over] = np.nextafter(out[over], np.float32(-np.inf))
    return out


def row_norms_up(X):
    """Upper bounds of ``||x_i||`` (float32) of the rows of ``X`` (n, d), scaled
    by each row's largest entry so that no square underflows or overflows."""
    x = np.asarray(X, dtype=np.float64)
    scale = np.abs(x).max(axis=1, initial=0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        y = x / np.where(scale > 0.0, scale, 1.0)[:, None]
    norms = scale * np.sqrt(np.einsum("ij,ij->i", y, y)) * (1.0 + 1e-6)
    with np.errstate(over="ignore"):  # (beyond float32: inf, still a bound)
        out = norms.astype(np.float32)
    under = out.astype(np.float64) < norms
    out[under] = np.nextafter(out[under], np.float32(np.inf))
    return out


@dataclass
class GroupTerms:
    """Per group, the terms that move its bounds (:func:`group_terms`): ``scale``,
    ``error``, ``shift`` and ``offset`` (the largest screen offset), over its
    members that are not fresh; ``live`` whether it has any."""

    scale: np.ndarray
    error: np.ndarray
    shift: np.ndarray
    offset: np.ndarray
    live: np.ndarray


def group_terms(groups, n_groups, drift, fresh, offset):
    """:class:`GroupTerms` from the components' ``drift`` (K, 3) (scale, error,
    shift), ``fresh`` (K,) bool and screen ``offset`` (K,) (whose rounding the
    rejection limit allows for, as for the projection screen's bounds)."""
    carried = ~fresh
    scale = np.ones(n_groups)
    error, shift = np.zeros(n_groups), np.zeros(n_groups)
    top = np.full(n_groups, -np.inf)
    np.minimum.at(scale, groups[carried], drift[carried, 0])
    np.maximum.at(error, groups[carried], drift[carried, 1])
    np.maximum.at(shift, groups[carried], drift[carried, 2])
    np.maximum.at(top, groups[carried], offset[carried])
    live = np.bincount(groups[carried], minlength=n_groups) > 0
    return GroupTerms(scale, error, shift, top, live)


def moved_bounds(bounds, x_norms, terms):
    """The rows' bounds under the last model moved to the current one.

    Parameters
    ----------
    bounds : ndarray of shape (n, G), float32
    x_norms : ndarray of shape (n,), float32
        Upper bounds of the rows' norms.
    terms : GroupTerms

    Returns
    -------
    ndarray of shape (n, G), float64
        ``max(0, s_g b_ig - e_g ||x_i|| - f_g)`` with slack for its rounding;
        ``inf`` for a group without carried members.
    """
    down = terms.scale * (1.0 - _SLACK) * bounds
    down -= (np.multiply.outer(x_norms, terms.error) + terms.shift) * (1.0 + _SLACK)
    np.maximum(down, 0.0, out=down)
    down[:, ~terms.live] = np.inf
    return down


def group_minima(roots, groups, n_groups, top):
    """Per row and group, the smallest of ``roots`` over the group's components
    other than the row's ``top``.

    Parameters
    ----------
    roots : ndarray of shape (n, K)
        Lower bounds of the distances.
    groups : ndarray of shape (K,), int
    n_groups : int
    top : ndarray of shape (n,), int

    Returns
    -------
    ndarray of shape (n, n_groups), float64
        ``inf`` where a group has no other component.
    """
    n = roots.shape[0]
    masked = np.array(roots, dtype=np.float64)
    masked[np.arange(n), top] = np.inf
    out = np.full((n, n_groups), np.inf)
    for g in range(n_groups):
        members = np.flatnonzero(groups == g)
        if members.size:
            out[:, g] = masked[:, members].min(axis=1)
    return out


def pair_bounds(roots, offset, out=None):
    """Upper bounds ``o_k - r_ik^2 / 2`` of weighted log-densities from lower
    bounds ``roots`` (n, K) of the distances and the offsets ``offset`` (K,) (NaN
    where a root is NaN, which prunes nothing)."""
    out = np.square(roots, out=out)
    out *= -0.5 * (1.0 - 8 * _U64)
    out += offset
    return out


def second_bound(bounds, group_offset):
    """Per row, an upper bound of the weighted log-density of every pair of the
    groups: ``max_g o_g - b_ig^2 / 2`` (``-inf`` where no group has members; NaN
    where a bound is NaN)."""
    return pair_bounds(bounds, group_offset).max(axis=1, initial=-np.inf)
