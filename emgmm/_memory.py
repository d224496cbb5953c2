"""The memory model: block size from a budget, and an up-front check of the model size.

Per worker, one pass over a block of ``B`` rows holds the block in the compute dtype,
a centred copy, a float64 copy for the first-order statistics, and a few ``B x K``
float64 arrays (log-probabilities, responsibilities). Per process, the model holds
the parameters, the factors and one set of sufficient statistics, each about
``K d^2`` float64 values for 'full'.
"""

import os
import warnings

import numpy as np

_MIB = 2**20


def bytes_per_row(n_features, n_components, itemsize):
    """Bytes of working memory one row of a block needs during a pass.

    Parameters
    ----------
    n_features, n_components : int
    itemsize : int
        Bytes per value of the compute dtype (4 or 8).

    Returns
    -------
    int
    """
    return 3 * n_features * itemsize + 2 * n_features * 8 + 4 * n_components * 8


def model_nbytes(n_components, n_features, covariance_type):
    """Bytes of one copy of the parameters (means, factors, statistics), float64.

    Parameters
    ----------
    n_components, n_features : int
    covariance_type : {'full', 'tied', 'diag', 'spherical'}

    Returns
    -------
    int
    """
    K, d = n_components, n_features
    per_cov = {"full": K * d * d, "tied": d * d, "diag": K * d, "spherical": K}
    # means + covariances + precision factors + statistics (sum_x, sum_xx)
    return 8 * (2 * K * d + 3 * per_cov[covariance_type])


def available_memory():
    """Physical memory available to new allocations, in bytes (Linux MemAvailable)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def check_model_fits(n_components, n_features, covariance_type, n_workers,
                     memory_limit_mib=None):
    """Refuse up front when the model itself cannot fit in memory.

    Parameters
    ----------
    n_components, n_features : int
    covariance_type : str
    n_workers : int
        Processes holding a copy of the model (the parent and the workers).
    memory_limit_mib : float or None
        The budget in MiB; ``None`` means the memory available now.

    Returns
    -------
    int
        The estimate in bytes.

    Raises
    ------
    MemoryError
        With the estimate and the budget in the message.
    """
    copies = 1 + (n_workers if n_workers > 1 else 0)
    need = copies * model_nbytes(n_components, n_features, covariance_type)
    budget = available_memory() if memory_limit_mib is None else memory_limit_mib * _MIB
    if need > budget:
        raise MemoryError(
            f"The model needs about {need / _MIB:,.0f} MiB ({copies} copies of "
            f"{n_components} '{covariance_type}' components of {n_features} features, "
            f"float64), more than the budget of {budget / _MIB:,.0f} MiB. Use fewer "
            "components or features, a cheaper covariance_type ('diag'), fewer "
            "n_jobs, or raise memory_limit."
        )
    return need


def block_rows(n_samples, n_features, n_components, itemsize, working_memory_mib,
               chunk_rows=None, description="X"):
    """Rows per block so that one block's working set fits ``working_memory_mib``.

    When the source is chunked by rows (HDF5), the block is a multiple of the chunk
    rows (or one chunk when a chunk is larger than the budget). When a chunk spans
    many more rows than a block needs, a warning says each read decompresses more
    than it uses.

    Parameters
    ----------
    n_samples, n_features, n_components, itemsize : int
    working_memory_mib : float
    chunk_rows : int or None
    description : str

    Returns
    -------
    int
        At least 1, at most ``n_samples``.
    """
    per_row = bytes_per_row(n_features, n_components, itemsize)
    rows = max(1, int(working_memory_mib * _MIB // per_row))
    if chunk_rows:
        if rows >= chunk_rows:
            rows = rows // chunk_rows * chunk_rows
        elif chunk_rows > 4 * rows and n_samples > rows:
            warnings.warn(
                f"{description} is stored in chunks of {chunk_rows} rows, "
                f"{chunk_rows / rows:.0f}x the {rows} rows a block may hold within "
                f"working_memory={working_memory_mib} MiB: every block read "
                "decompresses far more than it uses. Rechunk the dataset by rows "
                "(e.g. chunks=(1024, n_features)) or raise working_memory.",
                UserWarning,
            )
    return int(min(rows, max(n_samples, 1)))


def partition(n_samples, block_size, max_tasks=64):
    """Fixed split of the rows into tasks of whole blocks.

    The split depends only on ``n_samples`` and ``block_size`` (never on the number
    of workers), so the reduction order, and with it the result, is the same for any
    ``n_jobs``.

    Parameters
    ----------
    n_samples, block_size : int
    max_tasks : int, default=64

    Returns
    -------
    list of (start, stop)
    """
    n_blocks = -(-n_samples // block_size)
    per_task = -(-n_blocks // max_tasks)
    step = per_task * block_size
    return [(s, min(s + step, n_samples)) for s in range(0, n_samples, step)]


def itemsize_of(dtype):
    """Bytes per value of a dtype."""
    return np.dtype(dtype).itemsize
