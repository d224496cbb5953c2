"""Degenerate components: a covariance not positive definite, or a weight below one
sample. The policy of ``on_degenerate`` as an object (:class:`ReinitPolicy`,
:class:`RaisePolicy`), the repair of an initial model, and the re-seeding of
components on the worst-explained rows."""

import collections
import warnings

import numpy as np

from ..covariance import get_covariance_type
from ..covariance._cholesky import factorize, ill_defined_message

#: Re-seeds of one component after which its collapsing once more (a covariance not
#: positive definite) ends the fit with scikit-learn's error: a flat cluster
#: without reg_covar takes every re-seed back within two iterations, while the
#: singleton cases of CASES C09 settled after at most 5.
MAX_RESEEDS = 10

#: What the initial 'tied' covariance of each init_params but 'kmeans' pools beyond
#: the spread within clusters (see initial_factors).
_TIED_INIT_POOLS = {
    "random": ("the spread between clusters", "clusters far apart relative to their "
               "spread"),
    "k-means++": ("the spread of the rows around the origin (as in scikit-learn)",
                  "data far from the origin relative to their spread"),
}
_TIED_INIT_POOLS["random_from_data"] = _TIED_INIT_POOLS["k-means++"]


def initial_factors(covariances, covariance_type, on_degenerate, dtype=np.float64,
                    init_params=None):
    """Precision factors of an initial model, applying the degenerate policy.

    An initialisation can give a component a covariance that is not positive definite
    (a k-means cluster of fewer than ``d + 1`` distinct points with ``reg_covar=0``).
    With 'reinit' such a component keeps its mean and weight and gets the pooled
    covariance of the healthy components (there is no pass yet to re-seed it from);
    with 'raise', or when no component is healthy, scikit-learn's error is raised.

    Parameters
    ----------
    covariances : ndarray
        Modified in place for the repaired components.
    covariance_type : str or CovarianceType
    on_degenerate : {'reinit', 'raise'}
    dtype : numpy dtype
    init_params : str or None, default=None
        The initialisation the covariances come from, for the error message.

    Returns
    -------
    precisions_cholesky : ndarray

    Raises
    ------
    ValueError
        scikit-learn's ill-defined covariance message naming the component; for a
        finite 'tied' covariance of ``init_params`` 'random', 'k-means++' or
        'random_from_data', also what that initialisation pooled into it.
    """
    kind = get_covariance_type(covariance_type)
    u, bad = factorize(covariances, kind, dtype)
    if not bad:
        return u
    healthy = np.setdiff1d(np.arange(len(covariances)), bad)
    if on_degenerate == "raise" or kind.shared or healthy.size == 0:
        message = ill_defined_message(kind.first_failure(bad), dtype, covariances)
        pooled = _TIED_INIT_POOLS.get(init_params)
        if kind.shared and pooled and np.isfinite(covariances).all():
            message += (
                " With covariance_type='tied' the initial covariance is one matrix "
                f"pooled over all components, and init_params={init_params!r} pools "
                f"{pooled[0]} into it: with {pooled[1]}, that is too ill-conditioned "
                "to factor in float64. init_params='kmeans' pools only the spread "
                "within clusters.")
        raise ValueError(message)
    covariances[bad] = covariances[healthy].mean(axis=0)
    warnings.warn(
        f"Initialisation: components {bad} had a covariance that is not positive "
        "definite; they start from the mean covariance of the other components. "
        "Increase reg_covar to avoid this.",
        UserWarning, stacklevel=2,
    )
    u, _ = factorize(covariances, kind, dtype)
    return u


def reseed(weights, means, covariances, components, worst, covariance_type, used_rows):
    """Re-seed ``components`` on the worst-explained rows (in place).

    A re-seeded component gets a worst-explained row as its mean, the weighted average
    covariance of the healthy components ('tied': the shared covariance is kept) and
    the weight ``1 / K`` before the weights are renormalised. Rows already used for a
    re-seed in this run come last, so that a row no component can hold (a singleton
    with ``reg_covar=0``) does not capture a component again and again.

    Parameters
    ----------
    weights, means, covariances : ndarray
        The M step's parameters, modified in place.
    components : list of int
        The degenerate components.
    worst : Worst
        Candidate rows from the pass.
    covariance_type : str
    used_rows : list of int
        Rows used by earlier re-seeds of this run; the rows used now are appended.

    Returns
    -------
    list of int
        The components that could be re-seeded (as many as there are candidate rows).
    """
    K = len(weights)
    healthy = np.setdiff1d(np.arange(K), components)
    if healthy.size == 0 or worst.data is None:
        return []
    used = set(used_rows)
    order = sorted(range(len(worst.rows)), key=lambda i: int(worst.rows[i]) in used)
    done = []
    pooled = get_covariance_type(covariance_type).pooled_covariance(
        weights, covariances, healthy)
    for k, i in zip(components, order, strict=False):
        means[k] = worst.data[i]
        if pooled is not None:
            covariances[k] = pooled
        weights[k] = 1.0 / K
        used_rows.append(int(worst.rows[i]))
        done.append(int(k))
    weights /= weights.sum()
    return done


def _warn_reseeded(n_iter, reseeded, bad, reg_covar):
    """One warning per cause of the re-seeds of an iteration, with its advice: a
    covariance not positive definite (``bad``: reg_covar helps), a weight below
    a thousandth of one sample's (starved: reg_covar does not)."""
    collapsed = [k for k in reseeded if k in bad]
    starved = [k for k in reseeded if k not in bad]
    if collapsed:
        warnings.warn(
            f"EM iteration {n_iter}: components {collapsed} had a covariance that is "
            "not positive definite and were re-seeded on the worst-explained "
            f"samples. If this repeats, increase reg_covar (now {reg_covar}): a "
            "component on a flat cluster or on fewer distinct points than features "
            "has no positive definite covariance without it.",
            UserWarning, stacklevel=2,
        )
    if starved:
        warnings.warn(
            f"EM iteration {n_iter}: components {starved} fell to a weight below a "
            "thousandth of one sample's and were re-seeded on the worst-explained "
            "samples (the data "
            "may hold fewer clusters than components, e.g. a warm start on data "
            "without one of them). If this repeats, use fewer components or another "
            "initialisation (n_init, init_params).",
            UserWarning, stacklevel=2,
        )


#: A re-seed within this many iterations of the component's previous one continues
#: its streak of collapses (a flat cluster without reg_covar takes every re-seed back
#: within two iterations).
STREAK_GAP = 2


def reseed_streaks(history, n_iter):
    """Per component, the re-seeds of its current streak of collapses.

    A streak is a run of re-seeds each within :data:`STREAK_GAP` iterations of the
    one before, the last within :data:`STREAK_GAP` of iteration ``n_iter``; a
    component that settled longer in between starts afresh. ``MAX_RESEEDS`` caps a
    streak, not all the re-seeds of a run.

    Parameters
    ----------
    history : list of dict
        Iteration records (``n_iter``, ``reseeded``), in order.
    n_iter : int
        The iteration being run.

    Returns
    -------
    collections.Counter
    """
    last, streak = {}, collections.Counter()
    for record in history:
        for k in record["reseeded"]:
            near = record["n_iter"] - last.get(k, -np.inf) <= STREAK_GAP
            streak[k] = streak[k] + 1 if near else 1
            last[k] = record["n_iter"]
    return collections.Counter({k: count for k, count in streak.items()
                                if n_iter - last[k] <= STREAK_GAP})


class RaisePolicy:
    """``on_degenerate='raise'``: a covariance that is not positive definite raises
    scikit-learn's ``ValueError`` naming the component; starved components are kept."""

    name = "raise"

    def __init__(self, reg_covar, dtype):
        self.reg_covar = reg_covar
        self.dtype = dtype

    def repair(self, parameters, bad, starved, worst, seeds, used_rows, n_iter):
        """Apply the policy to the M step's ``parameters`` after a factorisation.

        Parameters
        ----------
        parameters : Model
            The M step's weights, means, covariances (modified in place by a
            re-seed) and their factors.
        bad : list of int
            Components whose covariance is not positive definite.
        starved : list of int
            Components whose ``N_k`` fell below the minimum count (never re-seeded
            before).
        worst : Worst
            The pass's worst-explained rows.
        seeds : collections.Counter
            Each component's current streak of re-seeds (:func:`reseed_streaks`).
        used_rows : list of int
            Rows used by the run's re-seeds (appended to).
        n_iter : int

        Returns
        -------
        precisions_cholesky : ndarray
        reseeded : list of int

        Raises
        ------
        ValueError
            When a component stays degenerate.
        """
        if bad:
            raise ValueError(self._message(parameters,
                                           parameters.kind.first_failure(bad)))
        return parameters.precisions_cholesky, []

    def hold(self, parameters, bad, previous_factors, n_iter):
        """The components of ``bad`` still degenerate after the covariance type's
        repair that keeps the lower bound: with 'raise', all of them.

        Returns
        -------
        list of int
        """
        return bad

    def _message(self, parameters, component):
        return ill_defined_message(component, self.dtype, parameters.covariances)


class ReinitPolicy(RaisePolicy):
    """``on_degenerate='reinit'``: degenerate components are re-seeded on the
    worst-explained rows (:func:`reseed`) with a warning; a shared covariance that
    fails, a component degenerate again after ``max_reseeds`` re-seeds, or one that
    cannot be re-seeded raises as :class:`RaisePolicy`."""

    name = "reinit"
    max_reseeds = MAX_RESEEDS

    def repair(self, parameters, bad, starved, worst, seeds, used_rows, n_iter):
        u = parameters.precisions_cholesky
        if (parameters.kind.shared and bad) or not (bad or starved):
            return super().repair(parameters, bad, starved, worst, seeds, used_rows,
                                  n_iter)
        # a component that collapses on every re-seed (a flat cluster without
        # reg_covar: every other iteration) would be re-seeded to the end
        again = [k for k in bad if seeds[k] >= self.max_reseeds]
        if again:
            raise ValueError(
                f"EM iteration {n_iter}: component {again[0]} is degenerate again "
                f"after {seeds[again[0]]} consecutive re-seeds. "
                + self._message(parameters, again[0]))
        degenerate = sorted(set(bad) | set(starved))
        p = parameters
        reseeded = reseed(p.weights, p.means, p.covariances, degenerate, worst,
                          p.kind, used_rows)
        if reseeded:
            _warn_reseeded(n_iter, reseeded, set(bad), self.reg_covar)
            u, bad = self._refactor(p, reseeded, bad)
        if bad:
            raise ValueError(self._message(parameters, bad[0]))
        return u, reseeded

    def hold(self, parameters, bad, previous_factors, n_iter):
        """Repair the degenerate components of ``bad`` that the covariance type
        can keep from the E step's factors ``previous_factors`` (its
        :meth:`~emgmm.covariance.CovarianceType.hold_degenerate`: the lower bound
        cannot decrease), with a warning; the factors of ``parameters`` are formed
        again for them. Returns the components still degenerate."""
        p = parameters
        if not bad or previous_factors is None or not p.kind.holds_degenerate:
            return bad
        held = p.kind.hold_degenerate(p.covariances, previous_factors, bad)
        if not held:
            return bad
        u, failed = self._refactor(p, held, [])
        p.precisions_cholesky = u
        kept = [k for k in held if k not in failed]
        if kept:
            warnings.warn(
                f"Components {kept} had noise variances that are not positive (a "
                "component on fewer distinct points than features, with reg_covar="
                f"{self.reg_covar}); they keep their previous noise variances in "
                "those features, so that the lower bound does not decrease. "
                "Increase reg_covar to avoid this.",
                UserWarning, stacklevel=3)
        return [k for k in bad if k not in kept]

    def _refactor(self, parameters, reseeded, bad):
        """The factors with those of the ``reseeded`` components formed again (in
        place; a shared covariance: all of it), and the components still bad."""
        p = parameters
        if p.kind.shared:
            return factorize(p.covariances, p.kind, self.dtype)
        fixed, failed = factorize(p.covariances[reseeded], p.kind, self.dtype)
        u = p.precisions_cholesky
        u[reseeded] = fixed
        return u, ([reseeded[i] for i in failed]
                   + [k for k in bad if k not in reseeded])


#: ``on_degenerate`` -> its policy class.
POLICIES = {"reinit": ReinitPolicy, "raise": RaisePolicy}
