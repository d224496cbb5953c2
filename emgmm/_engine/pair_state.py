"""The arrays of one EM run under the pairs schedule (:mod:`.pair_step`), allocated
once per run and reused by every iteration.

The model (weights, means, covariances, precision factors), the statistics being
summed (``N_k`` and ``s_k``; the second moments ``S_k`` in the memory of the
covariances, which they become in place), and the screen's terms
(:class:`~emgmm.covariance._screen.ProjectionScreen`). Component tasks write the rows
of their own components; row tasks only read.
"""

import numpy as np

from .._runtime.shared_arrays import SharedArrays
from ..covariance._screen import SCREEN_DIRECTIONS, ProjectionScreen
from .model import Model


class PairState:
    """The run's arrays (:class:`~emgmm._runtime.shared_arrays.SharedArrays`).

    Attributes
    ----------
    weights : ndarray of shape (K,)
    means : ndarray of shape (K, d)
    covariances : ndarray of shape (K, d, d)
        The model's covariances; during a pass, the second moments being summed.
    factors : ndarray of shape (K, d, d)
        The upper precision Cholesky factors ``U_k`` (``precisions_cholesky``).
    nk, sum_x : ndarray of shape (K,) and (K, d)
        The statistics being summed.
    drift : ndarray of shape (K, 3)
        Each component's :class:`~emgmm.covariance._drift.Drift` (scale, error,
        shift) from the model of the last E step to the current one.
    fresh : ndarray of shape (K,), bool
        The components whose drift carries no bound (:mod:`.carried_bounds`).
    """

    def __init__(self, arrays, covariance_type, p):
        self.arrays = arrays
        self.covariance_type = covariance_type
        self.p = p

    @staticmethod
    def shapes(n_components, n_features, p=SCREEN_DIRECTIONS):
        """The state's arrays, ``{name: (shape, dtype)}``."""
        K, d = n_components, n_features
        shapes = {"weights": ((K,), np.float64), "means": ((K, d), np.float64),
                  "covariances": ((K, d, d), np.float64),
                  "factors": ((K, d, d), np.float64),
                  "nk": ((K,), np.float64), "sum_x": ((K, d), np.float64),
                  "drift": ((K, 3), np.float64), "fresh": ((K,), np.bool_)}
        shapes.update({name: (shape, np.float64) for name, shape
                       in ProjectionScreen.shapes(K, d, p).items()})
        return shapes

    @staticmethod
    def nbytes(n_components, n_features, p=SCREEN_DIRECTIONS):
        """Bytes of the state's arrays."""
        return sum(int(np.prod(shape)) * np.dtype(dtype).itemsize for shape, dtype
                   in PairState.shapes(n_components, n_features, p).values())

    @classmethod
    def allocate(cls, model, folder=None, p=SCREEN_DIRECTIONS, adopt=True):
        """The state of a run from ``model``, in memory or in files of ``folder``
        (worker processes). ``adopt``: the caller lets ``model`` go, so its
        covariances and factors are used, not copied, when they live in this
        process and can be written (never a fitted estimator's attributes)."""
        K, d = model.means.shape
        shapes = cls.shapes(K, d, p)
        arrays = SharedArrays.allocate(shapes, folder, {
            "covariances": model.covariances,
            "factors": model.precisions_cholesky} if adopt else None)
        state = cls(arrays, model.covariance_type, min(p, d))
        arrays["fresh"][:] = True
        for name, value in (("weights", model.weights), ("means", model.means),
                            ("covariances", model.covariances),
                            ("factors", model.precisions_cholesky)):
            target = arrays[name]
            if target is not value:
                target[...] = value
        screen = model.screen or {}
        names = ProjectionScreen.shapes(K, d, p)
        if all(np.shape(screen.get(name)) == names[name] for name in names):
            for name in names:
                arrays[name][...] = screen[name]
            state.has_screen = True
        return state

    #: Whether the state holds its model's screen (a resumed run's).
    has_screen = False

    weights = property(lambda self: self.arrays["weights"])
    means = property(lambda self: self.arrays["means"])
    covariances = property(lambda self: self.arrays["covariances"])
    factors = property(lambda self: self.arrays["factors"])
    nk = property(lambda self: self.arrays["nk"])
    sum_x = property(lambda self: self.arrays["sum_x"])
    drift = property(lambda self: self.arrays["drift"])
    fresh = property(lambda self: self.arrays["fresh"])

    def screen(self):
        """The :class:`~emgmm.covariance._screen.ProjectionScreen` over the state's
        arrays (views: what is written through it lands in the state)."""
        names = ProjectionScreen.shapes(*self.means.shape, self.p)
        return ProjectionScreen.from_arrays(
            self.means, self.factors, {name: self.arrays[name] for name in names})

    def model(self):
        """The model the state holds, as a :class:`~emgmm._engine.model.Model` of
        views (valid until the next pass writes the state), with its screen (a
        run resumed from it screens as this one would have)."""
        names = ProjectionScreen.shapes(*self.means.shape, self.p)
        return Model(self.weights, self.means, self.covariances, self.factors,
                     self.covariance_type,
                     screen={name: self.arrays[name] for name in names})

    def close(self):
        self.arrays.close()


class RowBounds:
    """The bounds each row carries (:mod:`.carried_bounds`), in memory or in one
    file of a folder (:class:`~emgmm._runtime.shared_arrays.SharedArrays`); row
    tasks write only their own rows.

    Attributes
    ----------
    top : ndarray of shape (n,), int32
        The row's top component in the last E step, ``-1`` before it has one.
    bounds : ndarray of shape (n, G), float32
        Lower bounds of the row's Mahalanobis distances to each group's other
        components (rounded down).
    norms : ndarray of shape (n,), float32
        Upper bounds of ``||x_i||``.
    best : ndarray of shape (n,), float32
        The row's best weighted log-density in the last E step (its top pair's, or
        its log-likelihood): not a bound, what the next screen compares with.
    """

    def __init__(self, arrays):
        self.arrays = arrays

    @staticmethod
    def shapes(n_samples, n_groups):
        """The arrays by name, ``{name: (shape, dtype)}``."""
        return {"top": ((n_samples,), np.int32),
                "bounds": ((n_samples, n_groups), np.float32),
                "norms": ((n_samples,), np.float32),
                "best": ((n_samples,), np.float32)}

    @staticmethod
    def nbytes(n_samples, n_groups):
        """Bytes of the arrays."""
        return n_samples * (12 + 4 * n_groups)

    @classmethod
    def allocate(cls, n_samples, n_groups, folder=None):
        """New bounds of ``n_samples`` rows and ``n_groups`` groups, none known
        yet, in memory or in one file of ``folder``."""
        arrays = SharedArrays.allocate(cls.shapes(n_samples, n_groups), folder)
        arrays["top"][:] = -1
        arrays["best"][:] = np.nan
        return cls(arrays)

    top = property(lambda self: self.arrays["top"])
    bounds = property(lambda self: self.arrays["bounds"])
    norms = property(lambda self: self.arrays["norms"])
    best = property(lambda self: self.arrays["best"])

    def close(self):
        self.arrays.close()
