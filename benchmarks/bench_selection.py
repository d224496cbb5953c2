"""Benchmark of GaussianMixtureIC: the shared pass against a loop of separate fits.

A ``.npy`` file of a mixture of ``--true-k`` Gaussians (``n x d`` float64, from a fixed
seed) is written to a temporary folder; then, in this process:

1. ``GaussianMixtureIC(1, K, covariance_type=['full', 'diag'])`` fits the grid with
   one read of the file per EM iteration for all candidates still iterating;
2. the loop of separate ``emgmm.GaussianMixture`` fits of the same candidates.

Reported: wall time of each, passes over the file and the bytes they read (a pass
reads the whole file; a separate fit takes ``n_iter_ + 1`` passes, its iterations and
its final scoring, plus any recentring pass, not counted), and whether both chose the
same candidate. The issue's target size is a 2 GB file with K=1..30; the default here
is smaller (this machine is shared): ``--n 2000000 --d 16 --max-k 30`` writes 256 MB.

Results: ``benchmarks/results/selection.json`` (``--quick``: ``selection_quick.json``,
a smoke run of seconds whose figures mean nothing).

Usage::

    nice -n 10 python benchmarks/bench_selection.py
    python benchmarks/bench_selection.py --quick
"""

import argparse
import json
import os
import platform
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"


def write_mixture(path, n, d, k, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(scale=4.0, size=(k, d))
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float64, shape=(n, d))
    for start in range(0, n, 100_000):
        stop = min(start + 100_000, n)
        out[start:stop] = (centers[rng.integers(k, size=stop - start)]
                           + rng.normal(size=(stop - start, d)))
    out.flush()
    del out


def run(args, path):
    from emgmm import GaussianMixture, GaussianMixtureIC

    nbytes = os.path.getsize(path)
    params = {"random_state": 0, "max_iter": args.max_iter, "n_jobs": args.n_jobs}
    types = ["full", "diag"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # candidates cut by max_iter
        tic = time.perf_counter()
        selector = GaussianMixtureIC(1, args.max_k, covariance_type=types,
                                     **params).fit(str(path))
        shared_s = time.perf_counter() - tic
        tic = time.perf_counter()
        passes, best = 0, None
        for k in range(1, args.max_k + 1):
            for kind in types:
                model = GaussianMixture(k, covariance_type=kind,
                                        **params).fit(str(path))
                passes += model.n_iter_ + 1
                n_params = model._n_parameters()
                bic = -2 * model.lower_bound_ * args.n + n_params * np.log(args.n)
                if best is None or bic < best[0]:
                    best = (bic, k, kind)
        loop_s = time.perf_counter() - tic
    return {
        "n": args.n, "d": args.d, "max_k": args.max_k, "true_k": args.true_k,
        "file_mb": nbytes / 2**20, "candidates": 2 * args.max_k,
        "shared_s": shared_s, "loop_s": loop_s, "time_ratio": loop_s / shared_s,
        "shared_passes": selector.n_passes_, "loop_passes_at_least": passes,
        "shared_gb_read": selector.n_passes_ * nbytes / 2**30,
        "loop_gb_read_at_least": passes * nbytes / 2**30,
        "chosen": [int(selector.n_components_), selector.covariance_type_],
        "same_choice": (best[1], best[2]) == (selector.n_components_,
                                              selector.covariance_type_),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=500_000)
    parser.add_argument("--d", type=int, default=8)
    parser.add_argument("--max-k", type=int, default=10)
    parser.add_argument("--true-k", type=int, default=6)
    parser.add_argument("--max-iter", type=int, default=100)
    parser.add_argument("--n-jobs", type=int, default=1)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=None, help="results JSON path")
    args = parser.parse_args(argv)
    if args.quick:
        args.n, args.max_k, args.true_k, args.max_iter = 3000, 3, 2, 20
    path_out = args.out or RESULTS / ("selection_quick.json" if args.quick
                                      else "selection.json")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "x.npy"
        write_mixture(path, args.n, args.d, args.true_k)
        result = run(args, path)
    result.update(machine=platform.platform(), load_average=os.getloadavg())
    path_out.parent.mkdir(exist_ok=True)
    path_out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"shared: {result['shared_s']:.1f} s, {result['shared_passes']} passes "
          f"({result['shared_gb_read']:.2f} GB); loop: {result['loop_s']:.1f} s, "
          f">= {result['loop_passes_at_least']} passes "
          f"({result['loop_gb_read_at_least']:.2f} GB); chosen {result['chosen']}, "
          f"same as the loop's: {result['same_choice']}")


if __name__ == "__main__":
    main()
