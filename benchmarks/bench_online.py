"""Cost of sample_weight and partial_fit, beside scikit-learn, as ratios of one run.

scikit-learn's GaussianMixture has neither, so the references are what a user of it
would do instead:

- ``sample_weight``: integer weights (1 to 3, mean 2) against the fit of the
  repeated rows (``np.repeat``, 2x the rows), seconds per EM iteration from the same
  init (tol=0, a fixed number of iterations), for scikit-learn and emgmm; and
  emgmm's weighted iteration against its unweighted one on the same rows;
- ``partial_fit``: ten calls over the rows (one pass, ten batches) against one EM
  iteration of ``fit`` over the same rows, emgmm's and scikit-learn's.

Each figure is the best of ``--repeat`` runs, the runs of every contender
interleaved (the machine is shared). The results are compared too: emgmm's
weighted and repeated-rows lower bounds, and the weighted means against
scikit-learn's of the repeated rows (both ~1e-10 or closer).

    python benchmarks/bench_online.py                   # minutes
    python benchmarks/bench_online.py --medium          # a minute
    python benchmarks/bench_online.py --quick           # seconds
    python benchmarks/bench_online.py --out results/online.json
"""

import argparse
import json
import time
import warnings

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.mixture import GaussianMixture as SkGaussianMixture

from emgmm import GaussianMixture

COVARIANCE_TYPES = ("full", "tied", "diag", "spherical")


def _interleaved_best(funcs, repeat):
    """``{name: (best seconds, last result)}``, the functions run in turn."""
    best = {name: (np.inf, None) for name in funcs}
    for _ in range(repeat):
        for name, func in funcs.items():
            tic = time.perf_counter()
            result = func()
            seconds = time.perf_counter() - tic
            best[name] = (min(best[name][0], seconds), result)
    return best


def _init(X, K, covariance_type):
    d = X.shape[1]
    precisions = {"full": np.stack([np.eye(d)] * K), "tied": np.eye(d),
                  "diag": np.ones((K, d)), "spherical": np.ones(K)}[covariance_type]
    return {"n_components": K, "covariance_type": covariance_type,
            "weights_init": np.full(K, 1.0 / K), "means_init": X[:K],
            "precisions_init": precisions}


def weighted_rows(X, w, K, iters, repeat, n_jobs):
    """Seconds per iteration of the weighted fit and of the repeated rows."""
    repeated = np.repeat(X, w, axis=0)
    out = {}
    for ct in COVARIANCE_TYPES:
        params = {**_init(X, K, ct), "tol": 0.0, "max_iter": iters}
        emgmm = {**params, "n_jobs": n_jobs}
        best = _interleaved_best({
            "sklearn_repeated": lambda p=params: SkGaussianMixture(**p).fit(repeated),
            "emgmm_repeated": lambda p=emgmm: GaussianMixture(**p).fit(repeated),
            "emgmm_weighted": lambda p=emgmm: GaussianMixture(**p).fit(
                X, sample_weight=w),
            "emgmm_unweighted": lambda p=emgmm: GaussianMixture(**p).fit(X),
        }, repeat)
        per_iter = {name: s / iters for name, (s, _) in best.items()}
        weighted = best["emgmm_weighted"][1]
        bounds = weighted.lower_bound_, best["emgmm_repeated"][1].lower_bound_
        sk_means = best["sklearn_repeated"][1].means_
        out[ct] = {
            "s_per_iter": {k: round(v, 5) for k, v in per_iter.items()},
            "sklearn_repeated_over_emgmm_weighted": round(
                per_iter["sklearn_repeated"] / per_iter["emgmm_weighted"], 2),
            "emgmm_repeated_over_emgmm_weighted": round(
                per_iter["emgmm_repeated"] / per_iter["emgmm_weighted"], 2),
            "emgmm_weighted_over_unweighted": round(
                per_iter["emgmm_weighted"] / per_iter["emgmm_unweighted"], 2),
            "lower_bound_rel_diff_weighted_vs_repeated": float(
                abs(bounds[0] - bounds[1]) / abs(bounds[1])),
            "means_max_rel_diff_to_sklearn_repeated": float(
                np.abs(weighted.means_ - sk_means).max() / np.abs(sk_means).max()),
        }
    return out


def stream(X, K, repeat, n_jobs, n_batches=10):
    """One pass of partial_fit in ``n_batches`` calls against one fit iteration."""
    params = _init(X, K, "full")
    parts = np.array_split(X, n_batches)

    def online():
        est = GaussianMixture(**params, n_jobs=n_jobs)
        for part in parts:
            est.partial_fit(part)
        return est

    best = _interleaved_best({
        "sklearn_one_iteration": lambda: SkGaussianMixture(
            **params, max_iter=1, tol=0.0).fit(X),
        "emgmm_one_iteration": lambda: GaussianMixture(
            **params, max_iter=1, tol=0.0, n_jobs=n_jobs).fit(X),
        "emgmm_partial_fit_pass": online,
    }, repeat)
    seconds = {name: s for name, (s, _) in best.items()}
    return {
        "n_batches": n_batches,
        "seconds": {k: round(v, 5) for k, v in seconds.items()},
        "partial_fit_pass_over_emgmm_iteration": round(
            seconds["emgmm_partial_fit_pass"] / seconds["emgmm_one_iteration"], 2),
        "sklearn_iteration_over_partial_fit_pass": round(
            seconds["sklearn_one_iteration"] / seconds["emgmm_partial_fit_pass"], 2),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small problem")
    parser.add_argument("--medium", action="store_true",
                        help="n=20000, d=8, K=8 (a loaded machine)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--n-jobs", type=int, default=1)
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    n, d, K, iters = ((4_000, 4, 4, 2) if args.quick else (20_000, 8, 8, 3)
                      if args.medium else (100_000, 16, 16, 4))
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, d)) + rng.integers(0, 4, size=(n, 1)) * 3.0
    w = rng.integers(1, 4, size=n)
    warnings.simplefilter("ignore", ConvergenceWarning)
    out = {"n": n, "d": d, "K": K, "iterations": iters, "n_jobs": args.n_jobs,
           "repeat": args.repeat, "quick": args.quick, "medium": args.medium,
           "sample_weight": weighted_rows(X, w, K, iters, args.repeat, args.n_jobs),
           "partial_fit": stream(X, K, args.repeat, args.n_jobs)}
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
