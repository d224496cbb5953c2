"""The docstrings of the execution settings, written once for every estimator.

The execution settings (``n_jobs`` ... ``checkpoint_interval``: how a fit runs,
not what it fits) are parameters of :class:`emgmm.GaussianMixture`,
:class:`emgmm.BayesianGaussianMixture` and, most of them, of
:class:`emgmm.GaussianMixtureIC`; their constraints are merged from
``BaseMixture._parameter_constraints``. Their numpydoc paragraphs are
:data:`EXECUTION_SETTINGS`; a class docstring holds a line ``%(name)s`` in its
Parameters section where the paragraph goes, and :func:`fill_parameter_docs`
puts it there when the class is defined (as scipy's ``doccer.filldoc`` fills
``%(name)s`` markers), with the estimator's own words added.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TypeVar

_T = TypeVar("_T", bound=type)

#: ``{setting: its numpydoc paragraph}``: the ``name : type`` line, then the
#: description indented by four spaces (re-indented where it is filled in).
EXECUTION_SETTINGS: dict[str, str] = {
    "n_jobs": """\
n_jobs : int or None, default=None
    Workers for the passes over the data, with joblib's meaning (``-1``: all
    cores). ``None`` follows ``joblib.parallel_config``; when that gives one
    worker, the blocks of a pass run in threads of this process with one BLAS
    thread each (the same result bit for bit). ``1`` means one core: blocks one
    after the other, BLAS on one thread. See the user guide, "Parallelism".""",
    "temp_folder": """\
temp_folder : str, os.PathLike or None, default=None
    Folder of the fit's temporary files with process workers (a copy of
    in-memory data, shared arrays); joblib's ``temp_folder`` of ``Parallel``,
    whose memory-mapping folders go inside. ``None``: ``JOBLIB_TEMP_FOLDER``,
    else the system temporary folder (the model shared under
    ``schedule='pairs'``: ``/dev/shm`` where it has room). joblib offers no
    public getter of ``parallel_config(temp_folder=...)``, so it is not read.""",
    "working_memory": """\
working_memory : float or None, default=None
    Memory for one block's working set, in MiB, per worker. ``None`` uses
    ``sklearn.get_config()["working_memory"]`` (1024 by default).""",
    "block_size": """\
block_size : int or None, default=None
    Rows per block; overrides ``working_memory``.""",
    "memory_limit": """\
memory_limit : float or None, default=None
    Budget in MiB for the copies of the model held by the parent and its
    workers; ``fit`` raises ``MemoryError`` up front when the estimate exceeds
    it. ``None`` uses the physical memory available when ``fit`` starts.""",
    "schedule": """\
schedule : {'auto', 'rows', 'components', 'pairs'}, default='auto'
    How a pass shares the work: 'rows' gives a task a range of rows and all
    components; 'components' a slice of components and a range of rows, so no
    worker holds the whole model (``X`` read twice per iteration); 'pairs'
    ('full', ``resp_threshold > 0``, large ``d``) screens the pairs by rows
    and gives each component its rows, statistics, M step and factor, the
    model shared by every worker. 'auto' picks 'pairs' where it applies, else
    'components' when workers would hold over 64 MiB of statistics each, or
    when only it fits the memory. See the user guide, "Parallelism".""",
    "init_max_samples": """\
init_max_samples : int, default=100_000
    Rows in the initialisation subsample, at most as many float64 rows as fit
    in 256 MiB (3,355 at 10,000 features) and no fewer than ``n_components``.""",
    "compute_dtype": """\
compute_dtype : {'float32', 'float64'} or None, default=None
    Dtype of the heavy products of the E step; ``None`` follows the data.
    ``'float32'`` on float64 data fits the data rounded to float32. The pairs
    that may reach ``resp_threshold`` are recomputed in float64 where float32
    is not accurate enough, and every sum is accumulated in float64. See the
    user guide, "float32".""",
    "resp_threshold": """\
resp_threshold : float, default=1e-20
    Responsibilities at most this are left out of the statistics ``N_k``,
    ``s_k``, ``S_k`` ('full' and 'factor'; 'diag' and 'spherical' from 24
    features on), and 'full' and 'factor' (from 64 features on) compute
    exactly only the pairs that may exceed it. A pair left out
    moves ``S_k``, in its metric, by at most ``r_ik`` times its squared
    Mahalanobis distance: ~1e-18 at the default. ``0.0`` computes every pair
    exactly.""",
    "callback": """\
callback : callable or None, default=None
    Called after every EM iteration with a dict (``event='iteration'``,
    ``init``, ``n_iter``, ``lower_bound``, ``change``, ``seconds``,
    ``reseeded``, ``passes``: the statistics passes (E step and sums), 2
    where the statistics were summed again around the new means; under
    ``schedule='pairs'`` ``passes`` is ``None`` and ``pairs_per_row`` gives
    the pairs computed, the others proven negligible). True attributes
    ``wants_progress`` and ``wants_plan`` ask for the ``'progress'`` and
    ``'final_pass'`` events during passes and the ``'plan'`` event before the
    first (user guide, "Progress and callbacks").""",
    "checkpoint": """\
checkpoint : str, os.PathLike or None, default=None
    Path of a checkpoint file (``.npz``, no pickle), written atomically after EM
    iterations. A fit of the same data and parameters resumes from it to the
    model of an uninterrupted fit; other data or parameters raise
    ``ValueError``, an unwritable folder ``OSError``, a concurrent fit on the
    same path ``RuntimeError``. ``{fingerprint}`` in the path is replaced by
    16 hex digits of the SHA-256 of the data and parameters the checkpoint is
    matched on (``checkpoint='ck-{fingerprint}.npz'``): each fit of other data
    or parameters, such as the clones of a parallel ``GridSearchCV``, then has a
    file of its own, and a fit started again finds its own. Removed when
    ``fit`` completes (user guide, "Checkpoints").""",
    "checkpoint_interval": """\
checkpoint_interval : float, default=0.0
    Minimum seconds between two checkpoint writes; 0 writes after every
    iteration.""",
}

_MARKER = re.compile(r"^( *)%\((\w+)\)s$", re.MULTILINE)


def parameter_doc(name: str, indent: str = "", heading: str | None = None,
                  extra: str | None = None) -> str:
    """The paragraph of the execution setting ``name``, indented by ``indent``.

    ``heading`` replaces its ``name : type`` line (an estimator that takes fewer
    options); ``extra``, lines of at most 80 columns, is appended to its
    description.
    """
    head, _, body = EXECUTION_SETTINGS[name].partition("\n")
    text = (heading or head) + "\n" + body
    if extra:
        text += "\n" + "\n".join("    " + line for line in extra.split("\n"))
    return "\n".join(indent + line for line in text.split("\n"))


def fill_parameter_docs(headings: dict[str, str] | None = None,
                        **extra: str) -> Callable[[_T], _T]:
    """A class decorator: each line ``%(name)s`` of the class docstring becomes
    the paragraph of :data:`EXECUTION_SETTINGS` (``headings[name]`` for its
    first line, ``extra[name]`` added to its description).

    Raises
    ------
    KeyError
        At import, for a marker or an ``extra`` that names no execution setting
        (or an ``extra`` with no marker).
    """
    headings = headings or {}

    def fill(cls: _T) -> _T:
        doc = cls.__doc__
        if doc is None:  # python -OO
            return cls
        used = set()

        def paragraph(match: re.Match[str]) -> str:
            indent, name = match.groups()
            used.add(name)
            return parameter_doc(name, indent, headings.get(name), extra.get(name))

        cls.__doc__ = _MARKER.sub(paragraph, doc)
        unused = (set(extra) | set(headings)) - used
        if unused:
            raise KeyError(f"{cls.__name__}: no %(name)s marker for {sorted(unused)}")
        return cls

    return fill
