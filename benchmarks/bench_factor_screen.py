"""Benchmark of the certified screen of covariance_type='factor' (issue 35).

Configuration S: [50k, 2500] 50x50 grayscale patches of scikit-learn's sample images
(mean removed), K=200, q=32, in memory. One fit of two iterations from emgmm's
default start, then the screened estimator (``resp_threshold=1e-20``, the default)
and its unscreened twin (``resp_threshold=0``: every pair) take iterations 3-10
one at a time in turns (warm starts), so that both see the same load. Reported:

* seconds per iteration of each (``history_``), their mean over iterations 3-10 and
  the ratio;
* pairs per row: computed by the screen, and of responsibility above the threshold
  (on 2,000 rows, before each iteration);
* the flop count of an unscreened iteration (``4 n d K q + 8 n d K``) and its time at
  the DGEMM rate measured in the same run;
* the two lower bounds (equal to the screen's rounding).

Usage::

    nice python benchmarks/bench_factor_screen.py [--quick] [--name NAME]
"""

import argparse
import copy
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_em import gemm_rates, patch_data

RESULTS = Path(__file__).resolve().parent / "results"
S = {"n": 50_000, "side": 50, "K": 200, "q": 32, "start_iters": 2, "iters": 8}
S_QUICK = {"n": 1500, "side": 9, "K": 6, "q": 4, "start_iters": 2, "iters": 2}
SAMPLE_ROWS = 2000


def flops(n, d, K, q):
    """Flops of an unscreened EM iteration of 'factor' (bench_factor.flops)."""
    return 4.0 * n * d * K * q + 8.0 * n * d * K


def pairs_per_row(gm, X):
    """``(computed by the screen, responsibility above the threshold)`` per row of
    ``X`` under the fitted ``gm``."""
    from scipy.special import logsumexp

    from emgmm._engine.estep import weighted_log_prob
    from emgmm.covariance._log_density import relevance_margin

    model = gm._fitted_model()
    margin = relevance_margin(gm.resp_threshold)
    prepared = model.prepare(np.float64)
    screened = weighted_log_prob(X, model.weights, model.means,
                                 model.precisions_cholesky, "factor", margin, prepared,
                                 model.kind.block_products(X, model))
    resp = np.exp(screened - logsumexp(screened, axis=1, keepdims=True))
    return (float(np.isfinite(screened).sum(axis=1).mean()),
            float((resp > gm.resp_threshold).sum(axis=1).mean()))


def one_iteration(gm, X):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tol=0: not converged, by design
        gm.fit(X)
    return gm.history_[-1]["seconds"], float(gm.lower_bound_)


def run(cfg, log):
    from emgmm import GaussianMixture

    X = patch_data(cfg["n"], cfg["side"], seed=0)
    sample = X[np.random.default_rng(1).choice(len(X), min(SAMPLE_ROWS, len(X)),
                                               replace=False)]
    screened = GaussianMixture(cfg["K"], covariance_type="factor", n_factors=cfg["q"],
                               max_iter=cfg["start_iters"], tol=0.0, random_state=0)
    tic = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        screened.fit(X)
    log(f"start and {cfg['start_iters']} iterations: {time.perf_counter() - tic:.0f} s")
    screened.set_params(warm_start=True, max_iter=1)
    dense = copy.deepcopy(screened).set_params(resp_threshold=0.0)
    rounds = []
    for it in range(cfg["iters"]):
        computed, relevant = pairs_per_row(screened, sample)
        s_sec, s_lb = one_iteration(screened, X)
        d_sec, d_lb = one_iteration(dense, X)
        rounds.append({"iteration": cfg["start_iters"] + it + 1,
                       "screened_seconds": s_sec, "unscreened_seconds": d_sec,
                       "pairs_computed_per_row": computed,
                       "pairs_above_threshold_per_row": relevant,
                       "screened_lower_bound": s_lb, "unscreened_lower_bound": d_lb})
        log(json.dumps(rounds[-1]))
    return rounds


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--name", default=None)
    args = p.parse_args(argv)

    def log(msg):
        print(msg, flush=True)

    start = time.perf_counter()
    cfg = S_QUICK if args.quick else S
    rates = gemm_rates(2000)
    log(f"DGEMM {rates['dgemm']:.1f} GFLOP/s")
    rounds = run(cfg, log)
    rates_after = gemm_rates(2000)
    n, d, K, q = cfg["n"], cfg["side"] ** 2, cfg["K"], cfg["q"]
    mean_s = float(np.mean([r["screened_seconds"] for r in rounds]))
    mean_d = float(np.mean([r["unscreened_seconds"] for r in rounds]))
    dgemm = 0.5 * (rates["dgemm"] + rates_after["dgemm"])
    result = {
        "config": cfg, "rates_before": rates, "rates_after": rates_after,
        "rounds": rounds, "screened_seconds_per_iteration": mean_s,
        "unscreened_seconds_per_iteration": mean_d, "speedup": mean_d / mean_s,
        "unscreened_flops": flops(n, d, K, q),
        "unscreened_flop_seconds_at_dgemm": flops(n, d, K, q) / (dgemm * 1e9),
        "lower_bound_rel_diff": max(
            abs(r["screened_lower_bound"] - r["unscreened_lower_bound"])
            / abs(r["unscreened_lower_bound"]) for r in rounds),
        "benchmark_seconds": time.perf_counter() - start,
    }
    name = args.name or ("factor_screen_quick" if args.quick else "factor_screen")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=1))
    log(f"screened {mean_s:.2f} s/it, unscreened {mean_d:.2f} s/it: "
        f"{result['speedup']:.1f}x; unscreened flop time at DGEMM "
        f"{result['unscreened_flop_seconds_at_dgemm']:.1f} s; lower bounds "
        f"{result['lower_bound_rel_diff']:.1e} apart")


if __name__ == "__main__":
    main()
