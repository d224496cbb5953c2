"""Benchmark of BayesianGaussianMixture: scikit-learn's and emgmm's, side by side.

Both fit the same data (a mixture of ``K`` Gaussians from a fixed seed) from the same
initialisation (``init_params='random_from_data'``, the same ``random_state``, emgmm's
``init_max_samples`` at ``n`` so that it draws from all rows as scikit-learn does) with
``tol=0`` and a fixed ``max_iter``, one after the other in this process, default
threads. Reported per configuration: seconds per fit for each, the ratio
scikit-learn / emgmm, and the largest relative difference of their ``lower_bounds_``
(the same fit, checked). Configurations (``--quick`` shrinks them to seconds, a smoke
run whose figures mean nothing):

- ``full``: [200k, 16], K=30, 'full', Dirichlet process prior, 10 iterations.
- ``diag``: [200k, 32], K=30, 'diag', Dirichlet distribution prior, 10 iterations.

Results: ``benchmarks/results/bayesian.json`` (``bayesian_quick.json``).

Usage::

    nice -n 10 python benchmarks/bench_bayesian.py
    python benchmarks/bench_bayesian.py --quick
"""

import argparse
import json
import os
import platform
import time
import warnings
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
CONFIGS = {
    "full": {"n": 200_000, "d": 16, "K": 30, "covariance_type": "full",
             "prior": "dirichlet_process", "max_iter": 10},
    "diag": {"n": 200_000, "d": 32, "K": 30, "covariance_type": "diag",
             "prior": "dirichlet_distribution", "max_iter": 10},
}


def mixture(n, d, K, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(scale=3.0, size=(K, d))
    return centers[rng.integers(K, size=n)] + rng.normal(size=(n, d))


def timed_fit(estimator, X):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the non-convergence of a fixed max_iter
        tic = time.perf_counter()
        estimator.fit(X)
        return time.perf_counter() - tic


def run(config):
    from sklearn.mixture import BayesianGaussianMixture as SkBayesianGaussianMixture

    from emgmm import BayesianGaussianMixture

    X = mixture(config["n"], config["d"], config["K"])
    params = {"n_components": config["K"], "covariance_type": config["covariance_type"],
              "weight_concentration_prior_type": config["prior"], "tol": 0.0,
              "max_iter": config["max_iter"], "init_params": "random_from_data",
              "random_state": 0}
    # (emgmm initialises on all rows, as scikit-learn: the same start)
    sk = SkBayesianGaussianMixture(**params)
    ours = BayesianGaussianMixture(init_max_samples=config["n"], **params)
    t_sk, t_ours = timed_fit(sk, X), timed_fit(ours, X)
    sk_bounds = np.array([float(np.ravel(b)[0]) for b in sk.lower_bounds_])
    return {**config, "sklearn_s": t_sk, "emgmm_s": t_ours, "ratio": t_sk / t_ours,
            "max_rel_diff_lower_bounds": float(np.max(np.abs(
                np.asarray(ours.lower_bounds_) - sk_bounds) / np.abs(sk_bounds)))}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    parser.add_argument("--out", type=Path, default=None, help="results JSON path")
    args = parser.parse_args(argv)
    out = {"machine": platform.platform(), "load_average": os.getloadavg(),
           "results": {}}
    path = args.out or RESULTS / ("bayesian_quick.json" if args.quick
                                  else "bayesian.json")
    path.parent.mkdir(exist_ok=True)
    for name in args.configs:
        config = dict(CONFIGS[name])
        if args.quick:
            config.update(n=2000, max_iter=2)
        result = run(config)
        out["results"][name] = result
        print(f"{name}: scikit-learn {result['sklearn_s']:.2f} s, emgmm "
              f"{result['emgmm_s']:.2f} s, ratio {result['ratio']:.2f}x, lower bounds "
              f"within {result['max_rel_diff_lower_bounds']:.1e}")
        path.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
