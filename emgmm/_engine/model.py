"""The types the engine passes around: the mixture parameters of a run and its
result."""

from dataclasses import dataclass, field

import numpy as np

from ..covariance import REGISTRY, get_covariance_type, register_covariance_type
from ..covariance._packed_estimate import prepare_log_prob


@dataclass
class Model:
    """Mixture parameters in scikit-learn's shapes (covariances may be ``None``).

    ``prepared`` holds the work on the parameters that every block of a pass shares
    (:func:`emgmm.covariance._packed_estimate.prepare_log_prob`), built once by
    :meth:`prepare`; the parent builds it before a pass so that the workers
    receive it (as memory maps,
    like the parameters) instead of each rebuilding it.
    """

    weights: np.ndarray
    means: np.ndarray
    covariances: np.ndarray
    precisions_cholesky: np.ndarray
    covariance_type: str
    prepared: object = field(default=None, repr=False, compare=False)
    prepared_for: str | None = field(default=None, repr=False, compare=False)
    #: The pairs schedule's screen of this model (its arrays by name, see
    #: :meth:`~emgmm.covariance._screen.ProjectionScreen.shapes`), or ``None``: what a
    #: run resumed from this model screens with.
    screen: dict | None = field(default=None, repr=False, compare=False)

    def prepare(self, compute_dtype):
        """:func:`~emgmm.covariance._packed_estimate.prepare_log_prob` for
        ``compute_dtype``, kept (also when it is ``None``)."""
        key = np.dtype(compute_dtype).str
        if self.prepared_for != key:
            self.prepared = prepare_log_prob(self.weights, self.means,
                                             self.precisions_cholesky,
                                             self.covariance_type, compute_dtype,
                                             self.screen)
            self.prepared_for = key
        return self.prepared

    def in_memory(self):
        """This model with its memory-mapped arrays copied into memory (itself
        when it has none): what outlives the folder of a run's shared state."""
        def copied(a):
            return np.array(a) if isinstance(a, np.memmap) else a

        arrays = (self.weights, self.means, self.covariances,
                  self.precisions_cholesky)
        if not any(isinstance(a, np.memmap) for a in arrays) and not any(
                isinstance(a, np.memmap) for a in (self.screen or {}).values()):
            return self
        screen = (None if self.screen is None
                  else {name: copied(a) for name, a in self.screen.items()})
        return Model(*map(copied, arrays), self.covariance_type, screen=screen)

    def __getstate__(self):
        # A worker process imports emgmm afresh, where a type that the fitting
        # process registered is unknown (and a CovarianceType pickles as its name):
        # such a type travels with the model, as its class and attributes.
        kind = get_covariance_type(self.covariance_type)
        own = type(kind).__module__.startswith("emgmm.")
        return {**self.__dict__, "_kind": None if own else (type(kind), vars(kind))}

    def __setstate__(self, state):
        carried = state.pop("_kind", None)
        if carried is not None:
            cls, attributes = carried
            name = getattr(cls, "name", None)
            if REGISTRY.get(attributes.get("name", name)) is None:
                kind = cls.__new__(cls)
                vars(kind).update(attributes)
                register_covariance_type(kind)
        self.__dict__.update(state)

    @property
    def kind(self):
        """The :class:`~emgmm.covariance.CovarianceType` of ``covariance_type``."""
        return get_covariance_type(self.covariance_type).for_model(self)


@dataclass
class RunResult:
    model: Model
    lower_bounds: list
    n_iter: int
    converged: bool
    history: list
    reseed_rows: list = field(default_factory=list)
