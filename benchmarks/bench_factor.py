"""Benchmark of covariance_type='factor' (mixtures of factor analysers).

Configuration F: [50k, 2500], K=50, q=16, planted factor mixture (a contiguous
float64 HDF5 dataset read in blocks: no memory map, so the data's pages are not
counted as the fit's memory), 3 EM iterations from a k-means start on 5,000 rows.
Reported, from one run:

* seconds per EM iteration (median of ``history_``) in float64 and float32 compute,
  screened (the default ``resp_threshold``) and, with ``--every-pair``, also with
  ``resp_threshold=0`` (every pair computed; fits keyed ``"float64 every pair"``);
* the flop count of an iteration, ``4 n d K q`` (the E step's GEMM of the rows
  against the stacked ``G_k`` and the statistics' GEMM of the rows against the
  weighted posterior factor means) ``+ 8 n d K`` (the diagonal distances and
  second moments), its time at the DGEMM rate of ``numpy.matmul`` on 2000 x 2000
  matrices measured in the same run, and the useful GFLOP/s (a reference count:
  the dense statistics form each chunk's projections again, ``+2 n d K q``, and a
  block summed over its nonzero pairs skips their GEMM, ``-2 n d K q``);
* peak memory: ``VmHWM`` of the fresh subprocess that fits, its ``VmRSS`` after
  imports (baseline), the largest ``VmRSS`` sampled every 20 ms during the start
  and during the iterations, and ``extra = VmHWM - baseline`` against ``model + one
  block``: loadings, projections and statistics ``3 K d q`` float64 plus ``4 K d``,
  and the block's rows in float64.
* on paper, [2M, 10k], K=200, q=32: the same flop count, the time per iteration at
  40 times the per-core DGEMM rate measured here, and the memory of the model.

Optional configuration D (``--disk``): [50k, 10000], K=20, q=16, a planted factor
mixture in a 4 GB float64 ``.npy`` on disk (written by chunks, deleted after; read
in blocks, not memory-mapped), fitted from the default k-means start for 6
iterations: seconds per iteration (mean of iterations 3-6), pairs per row (``K``:
every pair, an upper bound where the screen computes fewer), the peak memory of the
fitting process (start included) and the flop count at the run's DGEMM rate.

Optional configuration P (``--patches``): 30x30 grayscale patches of the
scikit-learn sample images (mean removed), 'factor' with q chosen by BIC against
'full', held-out log-likelihood per patch against seconds per iteration.

Usage::

    nice python benchmarks/bench_factor.py [--quick] [--patches] [--disk]
                                           [--only-disk] [--every-pair] [--tmp DIR]
                                           [--name NAME | --out PATH]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_em import _status, gemm_rates, patch_data

RESULTS = Path(__file__).resolve().parent / "results"
F = {"n": 50_000, "d": 2500, "K": 50, "q": 16, "iters": 3}
F_QUICK = {"n": 2000, "d": 60, "K": 4, "q": 3, "iters": 2}
D = {"n": 50_000, "d": 10_000, "K": 20, "q": 16, "iters": 6}
D_QUICK = {"n": 3000, "d": 200, "K": 3, "q": 2, "iters": 6}
PAPER = {"n": 2_000_000, "d": 10_000, "K": 200, "q": 32, "cores": 40}


def flops(n, d, K, q):
    """Flops of one EM iteration of 'factor' (see the module's docstring)."""
    return 4.0 * n * d * K * q + 8.0 * n * d * K


def model_bytes(d, K, q):
    """float64 bytes of the model and its statistics: ``W``, ``G``, ``sum_xz``
    (``K d q`` each) and means, noise, ``sum_x``, ``sum_xx`` (``K d`` each)."""
    return 8 * (3 * K * d * q + 4 * K * d)


def planted_data(path, n, d, K, q, seed=0):
    """Write n rows of a planted K-component factor mixture to the HDF5 file
    ``path`` (dataset ``/x``, contiguous float64), a slab of rows at a time."""
    import h5py

    rng = np.random.default_rng(seed)
    W = rng.normal(size=(K, d, q))
    mu = rng.normal(scale=3.0, size=(K, d))
    noise = rng.uniform(0.2, 1.0, size=(K, d))
    with h5py.File(path, "w") as f:
        X = f.create_dataset("x", shape=(n, d), dtype=np.float64)
        step = 5000
        for r0 in range(0, n, step):
            m = min(step, n - r0)
            labels = rng.integers(K, size=m)
            z = rng.normal(size=(m, q))
            X[r0:r0 + m] = (mu[labels] + np.einsum("ndq,nq->nd", W[labels], z)
                            + rng.normal(size=(m, d)) * np.sqrt(noise[labels]))


def planted_npy(path, n, d, K, q, seed=0, step=2000):
    """Write n rows of a planted K-component factor mixture to the ``.npy`` file
    ``path`` (float64), ``step`` rows at a time through ``open_memmap``."""
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(K, d, q))
    mu = rng.normal(scale=3.0, size=(K, d))
    noise = rng.uniform(0.2, 1.0, size=(K, d))
    X = np.lib.format.open_memmap(path, mode="w+", dtype=np.float64, shape=(n, d))
    for r0 in range(0, n, step):
        m = min(step, n - r0)
        labels = rng.integers(K, size=m)
        chunk = rng.normal(size=(m, d)) * np.sqrt(noise[labels])
        for k in np.unique(labels):
            rows = np.flatnonzero(labels == k)
            chunk[rows] += mu[k] + rng.normal(size=(len(rows), q)) @ W[k].T
        X[r0:r0 + m] = chunk
        X.flush()
    del X


def worker(spec):
    """Fit once in this fresh process; print a JSON record."""
    import warnings

    from threadpoolctl import threadpool_limits

    from emgmm import GaussianMixture

    baseline = _status("VmRSS")
    samples, done = [], threading.Event()

    def sample_rss():  # (VmRSS every 20 ms: which phase holds the peak)
        while not done.wait(0.02):
            samples.append((time.perf_counter(), _status("VmRSS")))

    sampler = threading.Thread(target=sample_rss, daemon=True)
    sampler.start()
    gm = GaussianMixture(spec["K"], covariance_type="factor", n_factors=spec["q"],
                         tol=0.0, max_iter=spec["iters"],
                         init_max_samples=spec.get("init_max_samples", 5000),
                         random_state=0, compute_dtype=spec["dtype"],
                         **({} if spec.get("resp_threshold") is None
                            else {"resp_threshold": spec["resp_threshold"]}))
    tic = time.perf_counter()
    with warnings.catch_warnings(), threadpool_limits(spec["blas_threads"], "blas"):
        warnings.simplefilter("ignore")
        gm.fit(spec["data"])
    wall = time.perf_counter() - tic
    done.set()
    sampler.join()
    iters = [h["seconds"] for h in gm.history_]
    start_end = tic + wall - sum(iters)  # (the start, then the iterations)
    phases = {"start": [r for t, r in samples if t <= start_end],
              "iterations": [r for t, r in samples if t > start_end]}
    from emgmm import as_source

    with as_source(spec["data"]) as source:
        block_rows = gm._block_size(source)
    print(json.dumps({
        "iteration_seconds": iters,
        "seconds_per_iteration": float(np.median(iters)),
        "fit_seconds": wall,
        "lower_bounds": [float(v) for v in gm.lower_bounds_],
        "block_rows": int(block_rows),
        "baseline_mb": baseline,
        "peak_mb": _status("VmHWM"),
        "sampled_peak_mb": {k: max(v, default=None) for k, v in phases.items()},
    }))


def run_worker(spec):
    out = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"worker failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def paper_estimate(per_core_rate):
    """[2M, 10k], K=200, q=32 at ``cores`` times ``per_core_rate`` GFLOP/s."""
    n, d, K, q, cores = (PAPER[k] for k in ("n", "d", "K", "q", "cores"))
    f = flops(n, d, K, q)
    return {**PAPER, "flops": f, "per_core_gflops": per_core_rate,
            "seconds_per_iteration_at_dgemm": f / (cores * per_core_rate * 1e9),
            "model_gib": model_bytes(d, K, q) / 2**30,
            "full_model_gib": 8 * K * d * d / 2**30}


def run_factor(cfg, tmp, blas_threads, log, every_pair=False):
    n, d, K, q = (cfg[k] for k in ("n", "d", "K", "q"))
    path = os.path.join(tmp, "factor.h5")
    tic = time.perf_counter()
    planted_data(path, n, d, K, q)
    log(f"data [{n}, {d}] written in {time.perf_counter() - tic:.0f} s")
    rows = {}
    for pairs, threshold in (("", None), (" every pair", 0.0))[:1 + every_pair]:
        for dtype in ("float64", "float32"):
            rec = run_worker({"data": f"{path}:/x", "K": K, "q": q,
                              "iters": cfg["iters"], "dtype": dtype,
                              "blas_threads": blas_threads,
                              "resp_threshold": threshold})
            rows[dtype + pairs] = rec
            log(f"{dtype + pairs}: {rec['seconds_per_iteration']:.2f} s/iteration, "
                f"peak {rec['peak_mb']:.0f} MiB (baseline {rec['baseline_mb']:.0f})")
    os.remove(path)
    return rows


def run_disk(cfg, tmp, blas_threads, rates, log):
    """Configuration D: the fit of a ``.npy`` on disk from the default start."""
    n, d, K, q = (cfg[k] for k in ("n", "d", "K", "q"))
    path = os.path.join(tmp, "factor_disk.npy")
    tic = time.perf_counter()
    planted_npy(path, n, d, K, q)
    log(f"data [{n}, {d}] ({os.path.getsize(path) / 2**30:.1f} GiB) written in "
        f"{time.perf_counter() - tic:.0f} s")
    try:
        rec = run_worker({"data": path, "K": K, "q": q, "iters": cfg["iters"],
                          "dtype": "float64", "blas_threads": blas_threads,
                          "init_max_samples": 100_000})
    finally:
        os.remove(path)
    f = flops(n, d, K, q)
    steady = rec["iteration_seconds"][2:6]
    rec.update({
        "config": cfg, "flops_per_iteration": f,
        "seconds_per_iteration_3_6": float(np.mean(steady)),
        "pairs_per_row": K, "flop_time_at_dgemm": f / (rates["dgemm"] * 1e9),
        "model_mb": model_bytes(d, K, q) / 2**20,
        "block_mb": rec["block_rows"] * d * 8 / 2**20,
    })
    rec["time_over_flop_time"] = (rec["seconds_per_iteration_3_6"]
                                  / rec["flop_time_at_dgemm"])
    log(f"disk: {rec['seconds_per_iteration_3_6']:.1f} s/iteration (3-6) = "
        f"{rec['time_over_flop_time']:.2f}x the flop time at DGEMM rate; peak "
        f"{rec['peak_mb']:.0f} MiB (baseline {rec['baseline_mb']:.0f})")
    return rec


def run_patches(quick, log):
    """'factor' (q by BIC) against 'full' on 30x30 patches: held-out log-likelihood
    per patch against seconds per iteration."""
    import warnings

    from emgmm import GaussianMixture

    n, side, K, iters = (4000, 8, 3, 3) if quick else (20_000, 30, 8, 10)
    X = patch_data(n + n // 4, side, seed=1)
    X += np.random.default_rng(2).normal(scale=0.5, size=X.shape)  # 8-bit dither
    train, test = X[:n], X[n:]
    out = {}
    fits = [("full", None)] + [("factor", q) for q in ((2, 4) if quick
                                                       else (4, 8, 16, 32))]
    for cov, q in fits:
        extra = {} if q is None else {"n_factors": q}
        gm = GaussianMixture(K, covariance_type=cov, max_iter=iters, tol=0.0,
                             random_state=0, init_max_samples=5000, **extra)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tol=0: not converged, by design
            gm.fit(train)
        key = cov if q is None else f"factor q={q}"
        out[key] = {"seconds_per_iteration": float(np.median(
            [h["seconds"] for h in gm.history_])),
            "heldout_loglik": float(gm.score(test)), "bic": float(gm.bic(train))}
        log(f"{key}: {out[key]}")
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--patches", action="store_true")
    p.add_argument("--disk", action="store_true", help="also configuration D")
    p.add_argument("--only-disk", action="store_true",
                   help="configuration D alone (no F)")
    p.add_argument("--every-pair", action="store_true",
                   help="F also with resp_threshold=0 (every pair computed)")
    p.add_argument("--tmp", default=None, help="directory of the data files")
    p.add_argument("--name", default=None)
    p.add_argument("--out", default=None, help="JSON path (overrides --name)")
    p.add_argument("--blas-threads", type=int, default=os.cpu_count())
    p.add_argument("--worker")
    args = p.parse_args(argv)
    if args.worker:
        worker(json.loads(args.worker))
        return

    def log(msg):
        print(msg, flush=True)

    start = time.perf_counter()
    rates = gemm_rates(2000)
    log(f"DGEMM {rates['dgemm']:.1f} GFLOP/s, SGEMM {rates['sgemm']:.1f} GFLOP/s")
    if args.only_disk:
        cfg = D_QUICK if args.quick else D
        with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
            result = {"rates": rates,
                      "disk": run_disk(cfg, tmp, args.blas_threads, rates, log)}
        name = args.name or ("factor_disk_quick" if args.quick else "factor_disk")
        return _write(result, args, name, start, log)
    cfg = F_QUICK if args.quick else F
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        rows = run_factor(cfg, tmp, args.blas_threads, log, args.every_pair)
        disk = None if not args.disk else run_disk(
            D_QUICK if args.quick else D, tmp, args.blas_threads, rates, log)
    n, d, K, q = (cfg[k] for k in ("n", "d", "K", "q"))
    f = flops(n, d, K, q)
    for rec in rows.values():
        rec["gflops"] = f / rec["seconds_per_iteration"] / 1e9
        rec["flop_time_at_dgemm"] = f / (rates["dgemm"] * 1e9)
        rec["time_over_flop_time"] = (rec["seconds_per_iteration"]
                                      / rec["flop_time_at_dgemm"])
    block = rows["float64"]["block_rows"] * d * 8
    target_mb = (model_bytes(d, K, q) + block) / 2**20
    result = {
        "config": cfg, "rates": rates, "flops_per_iteration": f,
        "model_mb": model_bytes(d, K, q) / 2**20, "block_mb": block / 2**20,
        "fits": rows,
        "paper": paper_estimate(rates["dgemm"] / args.blas_threads),
    }
    if disk is not None:
        result["disk"] = disk
    if args.patches:
        result["patches"] = run_patches(args.quick, log)
    log(json.dumps({k: result[k] for k in ("model_mb", "block_mb", "paper")}, indent=1))
    for dtype, rec in rows.items():
        log(f"{dtype}: {rec['seconds_per_iteration']:.2f} s/it = "
            f"{rec['time_over_flop_time']:.2f}x the flop time at DGEMM rate "
            f"({rec['gflops']:.1f} GFLOP/s); fit memory "
            f"{rec['peak_mb'] - rec['baseline_mb']:.0f} MiB = "
            f"{(rec['peak_mb'] - rec['baseline_mb']) / target_mb:.2f}x (model + one "
            "block)")
        rec["memory_ratio"] = (rec["peak_mb"] - rec["baseline_mb"]) / target_mb
    return _write(result, args, args.name or ("factor_quick" if args.quick
                                              else "factor"), start, log)


def _write(result, args, name, start, log):
    """Write ``result`` as JSON (``--out``, else ``results/<name>.json``)."""
    result["benchmark_seconds"] = time.perf_counter() - start
    out = Path(args.out) if args.out else RESULTS / f"{name}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    log(f"benchmark took {result['benchmark_seconds']:.0f} s")


if __name__ == "__main__":
    main()
