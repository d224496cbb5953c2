"""The memory model: block size from a budget, and an up-front check of the model size.

Per worker, one pass over a block of ``B`` rows holds the block in the compute dtype,
a centred copy, a float64 copy for the first-order statistics, and a few ``B x K``
float64 arrays (log-probabilities, responsibilities). Per process, the model holds
the parameters, the factors and one set of sufficient statistics, each about
``K d^2`` float64 values for 'full'.

Three schedules share the work of a pass (:func:`choose_schedule`):

- ``"rows"``: a task is a range of rows and all components; every worker holds the
  whole model and one full set of sufficient statistics.
- ``"components"``: a task is a slice of components and a range of rows
  (:func:`component_slices`); a worker holds only its slice's factors and
  statistics, and the log-probabilities are exchanged through a memory-mapped
  buffer of ``buffer_rows x K`` float64 values (:func:`buffer_rows`).
- ``"pairs"`` ('full', :mod:`emgmm._engine.pair_step`): one model and one set of
  statistics for all workers (shared memory maps with worker processes); a task
  holds a block of rows or one component's gathered rows.

The sizes specific to a covariance type come from the type itself, passed in as
``covariance_type`` (a :class:`~emgmm.covariance.CovarianceType`, e.g.
``REGISTRY["full"]``, not its name): the memory model is part of the runtime, below
the covariance types, which use the runtime's kernels. It asks only the
:class:`~emgmm.covariance.Sizes` concern of the type (its sizes and the class
attributes ``Sizes`` declares); named in the docstrings only, since the runtime
imports nothing of ``emgmm.covariance``.
"""

import ctypes
import math
import os
import sys
import warnings

import numpy as np

_MIB = 2**20


def model_nbytes(n_components, n_features, covariance_type):
    """Bytes of one copy of the parameters (means, factors, statistics), float64.

    Parameters
    ----------
    n_components, n_features : int
    covariance_type : Sizes

    Returns
    -------
    int
    """
    K, d = n_components, n_features
    per_cov = covariance_type.covariance_values(K, d)
    # means + covariances + precision factors + statistics (sum_x, sum_xx)
    return 8 * (2 * K * d + 3 * per_cov)


#: The file :func:`available_memory` reads ``MemAvailable`` from (Linux); read at every
#: call, so that tests can point it at a file of their own to fake a small machine.
MEMINFO = "/proc/meminfo"


def _meminfo_available():
    """``MemAvailable`` of ``MEMINFO`` in bytes, or ``None`` where it cannot be read."""
    try:
        with open(MEMINFO) as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _sysconf_pages(name):
    """``os.sysconf(name)`` pages in bytes, or ``None`` where the system lacks it."""
    try:
        pages, size = os.sysconf(name), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):  # no os.sysconf (Windows), no name
        return None
    return pages * size if pages > 0 and size > 0 else None


def available_memory():
    """Physical memory available to new allocations, in bytes.

    The first of: ``MemAvailable`` of ``MEMINFO`` (Linux); ``available`` of
    ``psutil.virtual_memory()`` where psutil is installed (a dependency on macOS
    and Windows); the free pages of ``os.sysconf`` (``SC_AVPHYS_PAGES``, other
    Unix systems); all physical pages (``SC_PHYS_PAGES``: an upper bound of what is
    available, where the free ones are not told). Where none is known, ``inf``:
    the budget then refuses nothing (set ``memory_limit``).

    Returns
    -------
    int or float
        Bytes; ``math.inf`` when unknown.
    """
    available = _meminfo_available()
    if available is not None:
        return available
    try:
        import psutil
    except ImportError:
        pass
    else:
        return int(psutil.virtual_memory().available)
    for name in ("SC_AVPHYS_PAGES", "SC_PHYS_PAGES"):
        available = _sysconf_pages(name)
        if available is not None:
            return available
    return math.inf


def _mib(nbytes):
    """``nbytes`` in MiB for messages (3 significant digits below 100 MiB)."""
    mib = nbytes / _MIB
    return f"{mib:,.0f}" if mib >= 100 else f"{mib:.3g}"


def _find_malloc_trim():
    """glibc's ``malloc_trim``, or ``None`` (other C libraries and systems)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


_MALLOC_TRIM = _find_malloc_trim()

#: After a pass over blocks that need at least this much working memory each, the
#: fitting process hands the allocator's free pages back to the system
#: (:func:`release_free_memory`).
RELEASE_MIN_BYTES = 32 * _MIB


def release_free_memory():
    """Hand the free pages of the C allocator back to the system; whether any were.

    glibc keeps memory freed inside its heaps resident, one arena per thread that
    allocated there, and returns it only from the top of each heap. Worker threads
    that each allocate and free blocks of tens of MiB then keep their own high-water
    marks resident, fragmented by the allocations that outlive a block (on [100k, 64],
    K=200 'full' with 2 row threads: 235-250 MiB resident above the data where
    ``tracemalloc`` traced a peak of 113 MiB). ``malloc_trim(0)`` (glibc >= 2.8;
    thread-safe) releases the whole free pages of every arena (``madvise``); the
    next blocks fault them in again. Elsewhere this does nothing.

    Returns
    -------
    bool
        ``True`` when glibc released memory.

    References
    ----------
    malloc_trim(3), Linux man-pages.
    """
    return _MALLOC_TRIM is not None and _MALLOC_TRIM(0) == 1


#: Per-task sufficient statistics above this size make ``schedule="auto"`` pick the
#: component-sharded schedule when there are several workers (K=200, d=64 'full':
#: 3.3 MB -> rows; K=200, d=900: 649 MB -> components).
COMPONENT_SCHEDULE_MIN_BYTES = 64 * _MIB

#: Factor bytes a component slice may hold; a model of more than ``MIN_SLICES`` MiB
#: of factors is cut into at least ``MIN_SLICES`` slices (work for many workers).
SLICE_BYTES = 32 * _MIB
MIN_SLICES = 16

#: Bytes of the shared log-probability buffer of the component schedule.
BUFFER_BYTES = 256 * _MIB

#: Multiply-adds a (slice, rows) task should do at least, so that dispatching it
#: costs little next to its work.
TASK_WORK = 2**26


#: A data set is cut into at least this many blocks of at least MIN_BLOCK_ROWS rows.
#: Below ~8k rows the per-block work on the model (factor products, the accuracy
#: check of the packed sums: ``K d^2`` each) costs as much as the rows themselves.
TARGET_BLOCKS = 64
MIN_BLOCK_ROWS = 8192
#: 'diag' and 'spherical' blocks stay within this working set: their passes are a few
#: products and element-wise sweeps bound by memory traffic, faster when a block's
#: arrays stay in cache; they have no per-block model work. Smaller blocks pay more
#: per-block overhead (benchmarks/README.md, "Measurements behind the tuning
#: constants").
STREAMING_BLOCK_MIB = 16
#: Blocks of the types with ``chunked_blocks`` ('factor') stay within this working
#: set: their kernels work by row chunks of their own, so a larger block buys no
#: speed, while every row thread holds one (two blocks of [6250, 10000] float64
#: were 954 MiB of a 1.5 GB process).
CHUNKED_BLOCK_MIB = 256
#: The number of blocks is rounded up to a multiple of this (equal shares for 2, 4
#: and 8 workers), whatever ``n_jobs`` is.
BLOCK_MULTIPLE = 8


def statistics_nbytes(n_components, n_features, covariance_type):
    """Bytes of one task's second-moment statistics, float64.

    ``K d (d + 1) / 2 * 8`` for 'full' (the distinct entries of ``K`` symmetric
    ``d x d`` sums), ``d (d + 1) / 2 * 8`` for 'tied', ``K d * 8`` for 'diag' and
    'spherical'.

    Parameters
    ----------
    n_components, n_features : int
    covariance_type : Sizes

    Returns
    -------
    int
    """
    return 8 * covariance_type.statistics_values(n_components, n_features)


#: Multiply-adds a task of rows must do before a pass runs its tasks in threads of
#: one process (below, thread start-up and BLAS limits cost more than they save).
ROW_THREAD_MIN_WORK = 2**22


def row_threads_worthwhile(n_samples, n_tasks, n_components, n_features,
                           covariance_type):
    """Whether a single-process pass should run its row tasks in threads.

    Yes when each task has at least ``ROW_THREAD_MIN_WORK`` multiply-adds and one
    task's statistics are small (at most ``COMPONENT_SCHEDULE_MIN_BYTES``): then a
    second copy per thread costs little, while large-``d`` models are dominated by
    matrix products that BLAS threads already spread over the cores.

    Parameters
    ----------
    n_samples, n_tasks, n_components, n_features : int
    covariance_type : Sizes

    Returns
    -------
    bool
    """
    small = statistics_nbytes(n_components, n_features, covariance_type) \
        <= COMPONENT_SCHEDULE_MIN_BYTES
    return small and not tasks_are_tiny(n_samples, n_tasks, n_components, n_features,
                                        covariance_type)


def tasks_are_tiny(n_samples, n_tasks, n_components, n_features, covariance_type):
    """Whether a task of rows does fewer than ``ROW_THREAD_MIN_WORK`` multiply-adds.

    Such tasks run with one BLAS thread wherever they run: their products are so
    small that a second BLAS thread costs more than it saves (benchmarks/README.md,
    "Measurements behind the tuning constants").

    Parameters
    ----------
    n_samples, n_tasks, n_components, n_features : int
    covariance_type : Sizes

    Returns
    -------
    bool
    """
    work = ((n_samples / max(n_tasks, 1)) * n_components
            * covariance_type.work_per_row(n_features))
    return work < ROW_THREAD_MIN_WORK


def component_slices(n_components, n_features, covariance_type):
    """Fixed split of the components into slices for the component schedule.

    Each slice holds at most ``SLICE_BYTES`` of precision factors; a model with more
    than ``MIN_SLICES`` MiB of factors has at least ``min(K, MIN_SLICES)`` slices so
    that many workers have work, and a smaller one one slice per MiB. The split
    depends only on ``K``, ``d`` and the covariance type (never on the number of
    workers), so the results do not depend on ``n_jobs``. 'tied' keeps one slice:
    its statistic is pooled over the components of each row.

    Returns
    -------
    list of (k0, k1)
        Consecutive, covering ``0..K``.
    """
    K, d = n_components, n_features
    kind = covariance_type
    if kind.shared:
        return [(0, K)]
    per_component = 8 * kind.component_values(d)
    per_slice = max(1, SLICE_BYTES // per_component)
    n_slices = max(-(-K // per_slice), min(MIN_SLICES, -(-K * per_component // _MIB)))
    n_slices = int(min(K, n_slices))
    bounds = np.linspace(0, K, n_slices + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def buffer_rows(n_samples, n_components, block_size):
    """Rows of the shared log-probability buffer: whole blocks, ``<= BUFFER_BYTES``.

    At least one block; at most ``n_samples``.
    """
    rows = BUFFER_BYTES // (8 * max(n_components, 1))
    rows = max(block_size, rows // block_size * block_size)
    return int(min(rows, max(n_samples, 1)))


def range_pieces(n_rows, block_size, n_components, n_features, covariance_type,
                 n_slices):
    """Fixed split of a buffer range into row pieces of whole blocks.

    Enough pieces that a (slice, piece) task does about ``TASK_WORK`` multiply-adds,
    at most ``64 // n_slices`` (and at least one). Depends only on its arguments,
    never on the number of workers.

    Returns
    -------
    list of (start, stop)
        Relative to the start of the range.
    """
    work = n_rows * n_components * covariance_type.work_per_row(n_features)
    wanted = -(-work // (n_slices * TASK_WORK))
    max_tasks = int(max(1, min(wanted, 64 // n_slices)))
    return partition(n_rows, block_size, max_tasks=max_tasks)


def schedule_nbytes(schedule, n_components, n_features, covariance_type, n_workers):
    """Memory the model takes over the parent and its workers under a schedule.

    "rows": ``1 + n_workers`` copies of :func:`model_nbytes` (one when in process).
    "components": one copy in the parent, and each worker the largest slice.
    "pairs": one copy of the covariances and the factors, shared by every worker
    (the statistics are summed in the covariances' memory).

    Returns
    -------
    int
    """
    whole = model_nbytes(n_components, n_features, covariance_type)
    if schedule == "pairs":
        per_cov = covariance_type.covariance_values(
            n_components, n_features)
        return 8 * (3 * n_components * n_features + 2 * per_cov)
    if n_workers <= 1:
        return whole
    if schedule == "rows":
        return (1 + n_workers) * whole
    slices = component_slices(n_components, n_features, covariance_type)
    largest = max(b - a for a, b in slices)
    return whole + n_workers * model_nbytes(largest, n_features, covariance_type)


def choose_schedule(schedule, n_components, n_features, covariance_type, n_workers,
                    memory_limit_mib=None, pairs=False):
    """Pick the schedule of the passes and check that the model fits the budget.

    ``"auto"`` picks "pairs" where it applies (``pairs``); else "components" when
    there are several workers and one task's statistics
    (:func:`statistics_nbytes`) exceed ``COMPONENT_SCHEDULE_MIN_BYTES``, or when only
    the component schedule fits the budget; else "rows".

    Parameters
    ----------
    schedule : {'auto', 'rows', 'components', 'pairs'}
    n_components, n_features : int
    covariance_type : Sizes
    n_workers : int
    memory_limit_mib : float or None
        The budget in MiB; ``None`` means the memory available now.
    pairs : bool, default=False
        Whether the pairs schedule serves this fit
        (:func:`~emgmm._engine.pair_step.pairs_apply`).

    Returns
    -------
    schedule : {'rows', 'components'}
    estimate : int
        Bytes of the model over the parent and its workers.

    Raises
    ------
    MemoryError
        When the model does not fit the budget under the schedule (the message has
        the estimate, the budget and what to change).
    """
    budget = available_memory() if memory_limit_mib is None else memory_limit_mib * _MIB

    def need(name):
        return schedule_nbytes(name, n_components, n_features, covariance_type,
                               n_workers)

    if schedule == "pairs" and not pairs:
        raise ValueError(
            "schedule='pairs' needs covariance_type='full' with more features than "
            "the packed products serve (about 90 and more; with fewer, they "
            "compute every pair faster than the pairs schedule would), "
            "resp_threshold > 0, maximum likelihood (GaussianMixture's fit) and "
            "workers that share the model (threads or local processes).")
    if schedule == "auto" and pairs:
        schedule = "pairs"
    if schedule == "auto":
        big = statistics_nbytes(n_components, n_features, covariance_type) \
            > COMPONENT_SCHEDULE_MIN_BYTES
        schedule = "components" if n_workers > 1 and (big or need("rows") > budget) \
            else "rows"
    estimate = need(schedule)
    if estimate > budget:
        other = "" if schedule == "components" or n_workers == 1 \
            else " schedule='components',"
        kind_name = covariance_type.name
        # (a type's own parameters, e.g. 'factor''s n_factors, size it too)
        smaller = "".join(f" a smaller {name},"
                          for name in getattr(covariance_type, "parameters", ()))
        raise MemoryError(
            f"The model needs about {_mib(estimate)} MiB under the '{schedule}' "
            f"schedule with {n_workers} worker(s) ({n_components} '{kind_name}' "
            f"components of {n_features} features, float64), more than the budget of "
            f"{_mib(budget)} MiB. Use fewer components or features,{smaller} a "
            f"cheaper covariance_type ('diag'), fewer n_jobs,{other} or raise "
            f"memory_limit."
        )
    return schedule, estimate


def block_rows(n_samples, n_features, n_components, itemsize, working_memory_mib,
               chunk_rows=None, description="X", *, covariance_type):
    """Rows per block so that one block's working set fits ``working_memory_mib``
    (for 'diag' and 'spherical' also ``STREAMING_BLOCK_MIB``, for 'factor'
    ``CHUNKED_BLOCK_MIB``).

    A large data set is also cut into at least ``TARGET_BLOCKS`` blocks (blocks of
    no fewer than ``MIN_BLOCK_ROWS`` rows), so that there are tasks for several
    workers even when one block could hold all the rows, and the number of blocks
    is rounded to a multiple of ``BLOCK_MULTIPLE`` (down, to larger blocks, while
    they fit the budget; else up). The size depends only on
    the arguments, never on the number of workers (determinism across ``n_jobs``).

    When the source is chunked by rows (HDF5), the block is a multiple of the chunk
    rows, or one chunk when a chunk holds more rows than that but fits
    ``working_memory_mib`` (also beyond ``STREAMING_BLOCK_MIB``): blocks that cut
    through chunks decompress each chunk several times per pass (2.6x the time of a
    'diag' fit on gzip chunks 2.4x a block). When a chunk exceeds the budget, a
    warning says each read decompresses more than it uses.

    Parameters
    ----------
    n_samples, n_features, n_components, itemsize : int
    working_memory_mib : float
    chunk_rows : int or None
    description : str
    covariance_type : Sizes

    Returns
    -------
    int
        At least 1, at most ``n_samples``.
    """
    per_row = covariance_type.bytes_per_row(n_features, n_components, itemsize)
    working_memory = working_memory_mib  # (the user's, before the streaming cap)
    # a block of whole chunks may take all of working_memory
    chunk_budget_rows = max(1, int(working_memory_mib * _MIB // per_row))
    if covariance_type.streams_blocks:
        working_memory_mib = min(working_memory_mib, STREAMING_BLOCK_MIB)
    if covariance_type.chunked_blocks:
        working_memory_mib = min(working_memory_mib, CHUNKED_BLOCK_MIB)
    budget_rows = max(1, int(working_memory_mib * _MIB // per_row))
    rows = min(budget_rows, max(MIN_BLOCK_ROWS, -(-n_samples // TARGET_BLOCKS)))
    n_blocks = -(-n_samples // rows)
    if n_blocks > 1:
        # a multiple of BLOCK_MULTIPLE equal blocks keeps 2, 4 or 8 workers evenly
        # busy: fewer, larger blocks while they stay within the budget
        down = n_blocks // BLOCK_MULTIPLE * BLOCK_MULTIPLE
        if down and -(-n_samples // down) <= budget_rows:
            n_blocks = down
        else:
            n_blocks = -(-n_blocks // BLOCK_MULTIPLE) * BLOCK_MULTIPLE
        rows = max(1, -(-n_samples // n_blocks))
    if chunk_rows and n_samples > rows:
        if rows >= chunk_rows:
            rows = rows // chunk_rows * chunk_rows
        elif chunk_rows <= chunk_budget_rows:
            rows = chunk_rows
        else:
            warnings.warn(
                f"{description} is stored in chunks of {chunk_rows} rows, and one "
                f"chunk ({chunk_rows} rows) exceeds the {chunk_budget_rows} rows that "
                f"fit working_memory ({working_memory:g} MiB at {per_row} bytes "
                f"per row): emgmm reads blocks of {rows} rows, and every block read "
                "decompresses whole chunks, more than it uses, on every pass. The "
                "initialisation's subsample read (init_max_samples rows, block by "
                "block) pays the same before the first iteration. Rechunk the dataset "
                "by rows (e.g. chunks=(1024, n_features)), or raise working_memory or "
                "pass block_size (rows per block) a multiple of the chunk rows if the "
                "memory allows.",
                UserWarning, stacklevel=1,
            )
    return int(min(rows, max(n_samples, 1)))


#: Bytes that the statistics of a row-sharded pass's tasks may take together: each
#: task sums its rows' statistics into arrays of its own (``K d^2`` float64 for
#: 'full': 1.3 GB at d=900, K=200), and with 2 row threads ~5 of them were alive at
#: once. Beyond it the rows go into fewer tasks (at least 2; see max_row_tasks).
STATISTICS_BUDGET = 2**30

#: Bytes of per-row output (labels, log-likelihoods, responsibilities) that one task
#: of a prediction pass returns at most (at least one block's): a bound on what the
#: parent holds of the tasks in flight, whatever the number of rows.
OUTPUT_TASK_BYTES = 4 * _MIB


def max_row_tasks(n_components, n_features, covariance_type):
    """The most tasks a row-sharded pass splits the rows into: 64, fewer (at least
    2) when their statistics would exceed ``STATISTICS_BUDGET``. Depends only on the
    model's size, never on the number of workers."""
    # (the arrays hold whole (d, d) matrices: the covariances' size)
    per_task = 8 * covariance_type.covariance_values(n_components,
                                                                          n_features)
    return int(max(2, min(64, STATISTICS_BUDGET // max(per_task, 1))))


def partition(n_samples, block_size, max_tasks=64, max_rows=None):
    """Fixed split of the rows into tasks of whole blocks.

    The split depends only on ``n_samples`` and ``block_size`` (never on the number
    of workers), so the reduction order, and with it the result, is the same for any
    ``n_jobs``.

    Parameters
    ----------
    n_samples, block_size : int
    max_tasks : int, default=64
    max_rows : int or None, default=None
        At most this many rows per task, but at least one block: more tasks than
        ``max_tasks`` where needed (what a task returns per row then stays within a
        bound whatever ``n_samples``).

    Returns
    -------
    list of (start, stop)
    """
    n_blocks = -(-n_samples // block_size)
    per_task = -(-n_blocks // max_tasks)
    if max_rows is not None:
        per_task = max(1, min(per_task, max_rows // block_size))
    step = per_task * block_size
    return [(s, min(s + step, n_samples)) for s in range(0, n_samples, step)]

