"""emgmm: exact, out-of-core, parallel EM for Gaussian mixtures.

A drop-in for :class:`sklearn.mixture.GaussianMixture` that fits data in memory, in
``np.memmap`` or ``.npy`` files and in HDF5 datasets, in row blocks, on joblib workers.

The public names are imported on first use (PEP 562), so that a worker process
which only unpickles the task functions of ``emgmm._engine`` does not import
scikit-learn.
"""

import importlib

__version__ = "0.1.0"

_PUBLIC = {
    "BayesianGaussianMixture": "._mixture.bayesian_mixture",
    "GaussianMixture": "._mixture.gaussian_mixture",
    "GaussianMixtureIC": "._mixture.model_selection",
    "ModelFileError": "._io.model_file",
    "load_model": "._mixture.loading",
    "save_model": "._io.model_file",
    "as_source": "._io.sources",
}

__all__ = sorted(_PUBLIC) + ["__version__"]


def __getattr__(name):
    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_PUBLIC))
