"""CPU cost of the units of a 'full' pairs-schedule iteration at the workload's shape.

On one BLAS thread, ``time.process_time`` (CPU seconds, less sensitive to a shared
machine's load than wall time), on 30x30 sample-image patches (d=900) and a
covariance of 2000 of them:

* per component: the M step in place (``m_step_in_place``), the factor
  (``factor_in_place``: ``potrf`` + ``trtri``) and the screen's terms warm-started
  from the previous directions (``component_screen`` with no subspace step);
* per row: the screen's projections and bounds against K components
  (``upper_bounds``), one exact pair (``pair_values`` on the gathered rows of one
  component) and the statistics of one kept pair (``add_moments``: ``syrk`` of the
  gathered rows in chunks of 1024).

An iteration then costs about ``K * per_component + n * (projections + (1 + P) *
(pair + statistics))`` core-seconds for ``P`` kept pairs per row beyond the first
(plus the gathers and the bookkeeping, which the phase times of a fit's history
show); on ``c`` cores, divided by ``c``. benchmarks/README.md turns this into the
workload's seconds per iteration.

Usage::

    python benchmarks/bench_units.py --rows 2048 --components 200
"""

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from emgmm.covariance._full_component import (
    add_moments,
    factor_in_place,
    m_step_in_place,
)
from emgmm.covariance._screen import ProjectionScreen, component_screen, pair_values


def cpu_seconds(func, repeat=1):
    """CPU seconds per call of ``func()`` over ``repeat`` calls, and its result."""
    tic = time.process_time()
    for _ in range(repeat):
        out = func()
    return (time.process_time() - tic) / repeat, out


def per_component(cov, means, m):
    """CPU seconds of one component's M step, factor and warm screen terms."""
    d = cov.shape[0]
    rng = np.random.default_rng(1)
    sums = [cov * 2000 for _ in range(m)]
    t_m, _ = cpu_seconds(lambda: [m_step_in_place(s, np.zeros(d), 2000.0, 1e-3)
                                  for s in sums])
    factor = np.empty_like(cov)
    t_f, _ = cpu_seconds(lambda: [factor_in_place(cov, factor, np.inf)
                                  for _ in range(m)])
    start = np.linalg.qr(rng.normal(size=(d, 8)))[0]
    g = means.mean(axis=0)
    t_s, _ = cpu_seconds(lambda: [component_screen(factor, means, means[0], g,
                                                   start=start, steps=0)
                                  for _ in range(m)])
    return {"m_step": t_m / m, "factor": t_f / m, "screen_terms": t_s / m}, factor


def per_row(X, means, factor, K):
    """CPU seconds per row of the projections against K components, of one exact
    pair and of one kept pair's statistics."""
    n, d = X.shape
    u = np.repeat(factor[None], K, axis=0)
    screen = ProjectionScreen.build(np.full(K, 1.0 / K), means[:K], u)
    out = np.empty((n, K), order="F")
    t_proj, _ = cpu_seconds(lambda: screen.upper_bounds(X, out))
    values = np.empty(n)
    t_pair, _ = cpu_seconds(lambda: pair_values(X - means[0], factor, 0.0, values))
    sum_xx, sum_x, w = np.zeros((d, d)), np.zeros(d), np.ones(1024)
    t_stat, _ = cpu_seconds(lambda: [add_moments(X[a:a + 1024] - means[0],
                                                 w[:len(X[a:a + 1024])], sum_xx, sum_x)
                                     for a in range(0, n, 1024)])
    return {"projections": t_proj / n, "pair": t_pair / n, "statistics": t_stat / n}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2048, help="rows of the block")
    parser.add_argument("--components", type=int, default=200)
    parser.add_argument("--side", type=int, default=30, help="patch side (d = side^2)")
    parser.add_argument("--repeat", type=int, default=10,
                        help="components timed per unit")
    parser.add_argument("--out", default=None, help="also write the units as JSON")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_em import patch_data

    K, n = args.components, args.rows
    X = patch_data(n + 2000, args.side, seed=0)
    d = X.shape[1]
    rng = np.random.default_rng(0)
    means = X[n:][rng.choice(2000, K, replace=K > 2000)]
    cov = np.cov(X[n:], rowvar=False) + 1e-3 * np.eye(d)
    X = np.ascontiguousarray(X[:n])
    with threadpool_limits(1, "blas"):
        components, factor = per_component(cov, means, args.repeat)
        rows = per_row(X, means, factor, K)
    print(f"d={d} K={K}, {n} rows, one BLAS thread, CPU seconds:")
    for name, value in components.items():
        print(f"  per component  {name:14s} {value * 1e3:8.2f} ms")
    for name, value in rows.items():
        print(f"  per row        {name:14s} {value * 1e6:8.1f} us")
    if args.out:
        Path(args.out).write_text(json.dumps(
            {"d": d, "K": K, "rows": n, "per_component_s": components,
             "per_row_s": rows, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")},
            indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
