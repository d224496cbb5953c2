"""emgmm: exact, out-of-core, parallel EM for Gaussian mixtures.

A drop-in for :class:`sklearn.mixture.GaussianMixture` that fits data in memory, in
``np.memmap`` or ``.npy`` files and in HDF5 datasets, in row blocks, on joblib workers.
"""

from ._gaussian_mixture import GaussianMixture
from ._model_io import ModelFileError, load_model, save_model
from ._sources import as_source

__version__ = "0.1.0"

__all__ = ["GaussianMixture", "ModelFileError", "as_source", "load_model", "save_model",
           "__version__"]
