"""``load_model``: a fitted estimator from an HDF5 model file.

The file is read and checked by :func:`emgmm._io.model_file.read_model`; this
module, above :mod:`emgmm._io` in the layers, supplies the estimator classes.
"""

from __future__ import annotations

import os

from .._io.model_file import read_model
from .bayesian_mixture import BayesianGaussianMixture
from .gaussian_mixture import GaussianMixture


def _estimator_for(bayesian):
    """A new estimator of the class a model file's format names."""
    return BayesianGaussianMixture() if bayesian else GaussianMixture()


def load_model(path: str | os.PathLike[str]
               ) -> GaussianMixture | BayesianGaussianMixture:
    """Load a fitted estimator from an HDF5 model file.

    Parameters
    ----------
    path : str or os.PathLike
        Model file written by :func:`save_model`.

    Returns
    -------
    emgmm.GaussianMixture or emgmm.BayesianGaussianMixture
        The fitted estimator, of the class the file was saved from: ``weights_``,
        ``means_`` and ``precisions_cholesky_`` as stored, ``covariances_`` and
        ``precisions_`` recomputed from the factors (in float64), all five in the dtype
        of the fitted model; the fit metadata (``n_iter_``, ``converged_``,
        ``lower_bound_``, ``lower_bounds_``), ``n_features_in_``, the state of a
        ``partial_fit`` stream (``n_steps_``, 0 for a fit, and its running statistics)
        and ``feature_names_in_`` if stored.
        Parameters listed in ``params_dropped`` keep their defaults.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ModelFileError
        If the file is not an emgmm model file, has another format version,
        or its arrays have inconsistent shapes or hold no valid mixture (the
        message names the array and, for the precision Cholesky factors, the
        component: not finite, no positive diagonal, not upper triangular, or
        precisions or covariances that overflow float64).
    """
    return read_model(path, _estimator_for)
