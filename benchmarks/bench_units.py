"""CPU cost of the units of a 'full' iteration at the workload's shape (d=900).

On one BLAS thread, ``time.process_time`` (CPU seconds, less sensitive to a shared
machine's load than wall time): the factorisation of one component (Cholesky and
``L^-1``), the build of the certified screen of K components, the screen's
projections per row and one exact pair (gathered per component) of a block of 30x30
sample-image patches. The per-iteration cost of a fit is then about
``K * factorise + build + n * (projections + pairs_per_row * exact_pair)`` plus the
statistics of the kept pairs (see benchmarks/README.md, issue 24).

Usage::

    nice python benchmarks/bench_units.py --rows 2500 --components 200
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from emgmm.covariance.cholesky import cholesky_factors
from emgmm.covariance.screen import ProjectionScreen, exact_pairs


def cpu_seconds(func):
    """CPU seconds of ``func()`` and its result."""
    tic = time.process_time()
    out = func()
    return time.process_time() - tic, out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2500, help="rows of the block")
    parser.add_argument("--components", type=int, default=200)
    parser.add_argument("--side", type=int, default=30, help="patch side (d = side^2)")
    parser.add_argument("--factorisations", type=int, default=20)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_em import patch_data

    K, n = args.components, args.rows
    X = patch_data(n + 2000, args.side, seed=0)
    d = X.shape[1]
    rng = np.random.default_rng(0)
    labels = rng.integers(K, size=2000)
    means = np.stack([X[n:][labels == k].mean(axis=0) if (labels == k).any() else X[k]
                      for k in range(K)])
    cov = np.cov(X[n:], rowvar=False) + 1e-3 * np.eye(d)
    X = X[:n]
    with threadpool_limits(1, "blas"):
        m = args.factorisations
        t_fac, (u, _) = cpu_seconds(lambda: cholesky_factors(
            np.repeat(cov[None], m, axis=0), np.inf))
        u = np.repeat(u[:1], K, axis=0)
        t_build, screen = cpu_seconds(lambda: ProjectionScreen.build(
            np.full(K, 1.0 / K), means, u))
        out = np.empty((n, K), order="F")
        t_proj, _ = cpu_seconds(lambda: screen.upper_bounds(X, out))
        comps, rows = np.sort(rng.integers(K, size=n)), rng.permutation(n)
        t_pair, _ = cpu_seconds(lambda: exact_pairs(X, means, u, screen.offset, comps,
                                                    rows))
    print(f"d={d} K={K}, block of {n} rows, one BLAS thread, CPU seconds:")
    print(f"  factorise one component   {t_fac / m * 1e3:8.1f} ms")
    print(f"  build the screen          {t_build:8.2f} s")
    print(f"  projections, per row      {t_proj / n * 1e6:8.0f} us")
    print(f"  one exact pair            {t_pair / n * 1e6:8.0f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
