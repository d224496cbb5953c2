"""Side-by-side benchmark of EM iterations: scikit-learn's GaussianMixture vs emgmm's.

In one run, on the same data and from the same initialisation (identical
``weights_init``, ``means_init`` and ``precisions_init`` passed to both, ``tol=0`` and a
fixed ``max_iter``), every configuration is fitted once by scikit-learn and once per
emgmm mode, each fit in a fresh Python subprocess. The script reports

* seconds per EM iteration of each and their ratio. scikit-learn: the time of its
  ``_e_step`` + ``_m_step`` per iteration (its parameter initialisation, which runs an
  M step even when all ``*_init`` are given, and the final E step are left out);
  emgmm: the ``seconds`` of each iteration in ``history_`` (statistics pass, M step and
  factorisation). The median over iterations is reported (the mean and the total fit
  wall time too): emgmm's iterations get cheaper as the components sharpen (fewer
  pairs need exact work), scikit-learn's cost the same every iteration.
* emgmm's useful GFLOP/s for 'full' (``2 n K d^2`` flops per iteration: ``n K d^2``
  for the triangular factor products of the E step and as many for the symmetric
  second moments) next to the DGEMM and SGEMM rates of ``numpy.matmul`` on 2000 x 2000
  matrices measured in the same run.
* peak memory of each fit: the subprocess reads ``VmRSS`` from ``/proc/self/status``
  after imports and loading the data (baseline) and ``VmHWM`` (the high-water mark of
  the resident set, as ``getrusage().ru_maxrss``) after the fit; ``peak_mb`` is
  VmHWM, ``extra_mb`` the growth above the baseline (what the fit itself allocated).
* whether the lower bounds agree: ``max |lb_emgmm - lb_sklearn| / |lb_sklearn|`` over
  the iterations, checked against ``--rtol`` (1e-6) for the exact float64 modes.

Configurations: A [100k, 64] K=200 full (synthetic mixture); B [20k, 400] K=50 full;
C [1M, 64] K=64 diag; D 100k 8x8 grayscale patches of
``sklearn.datasets.load_sample_images`` (mean of each patch removed), K=200 full;
E 20k 30x30 patches, K=200 full, 10 iterations (scikit-learn 2: its iterations cost
the same each time), compared by the mean of emgmm's iterations 3-10; F 200k 30x30
patches, K=200, emgmm alone to convergence (``tol=1e-3``, ``--configs F``); G 20k
50x50 patches, K=50 full (the seed's next shape), as E; H 50k 14x14 patches, K=200
full, as E (scikit-learn 3 iterations), with a "carried" row: the pairs schedule
with the rows' bounds carried across iterations (emgmm/_engine/carried_bounds.py),
forced on (the default projects them afresh at this size; "projected" forces that).
emgmm's rows report the pairs per row each iteration evaluated (the rest were proved
negligible by the screen of emgmm/covariance/_screen.py and never computed). Extra
emgmm rows: float32 compute mode on A, B and D, ``working_memory=64`` (MiB) on A,
``resp_threshold=1e-8`` on D, and ``resp_threshold=0`` ("exact": every pair computed
exactly, none skipped) on A and D, which measures what skipping the responsibilities
below the default ``resp_threshold=1e-20`` gains.

Results go to ``benchmarks/results/<name>.json`` (``--name``, default ``latest``; the
``--quick`` runs default to ``quick``). ``--quick`` shrinks every configuration so that
the whole run takes seconds (for CI smoke tests; its timings mean nothing).

Usage (benchmark with OpenBLAS's own CPU detection; see README)::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_em.py
    python benchmarks/bench_em.py --quick --configs A,C
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"

# name: n, d, K, covariance_type, iterations, data kind, extra emgmm modes
CONFIGS = {
    "A": dict(n=100_000, d=64, K=200, cov="full", iters=6, data="mixture",
              modes=["float32", "wm64", "exact"]),
    "B": dict(n=20_000, d=400, K=50, cov="full", iters=2, data="mixture",
              modes=["float32"]),
    "C": dict(n=1_000_000, d=64, K=64, cov="diag", iters=6, data="mixture", modes=[]),
    "D": dict(n=100_000, d=64, K=200, cov="full", iters=6, data="patches",
              modes=["float32", "thr1e-8", "exact"]),
    # the workload's shape: scikit-learn for 2 iterations only (~2 min each)
    "E": dict(n=20_000, d=900, K=200, cov="full", iters=10, sk_iters=2,
              data="patches", modes=[]),
    # the seed's next shape (50x50 patches)
    "G": dict(n=20_000, d=2500, K=50, cov="full", iters=10, sk_iters=2,
              data="patches", modes=[]),
    # 14x14 patches: the pairs schedule at d=196, with carried bounds forced
    "H": dict(n=50_000, d=196, K=200, cov="full", iters=10, sk_iters=3,
              data="patches", modes=["carried"]),
    # emgmm alone, to convergence
    "F": dict(n=200_000, d=900, K=200, cov="full", iters=100, tol=1e-3,
              data="patches", modes=[], sklearn=False),
}
QUICK = {
    "A": dict(n=3000, d=8, K=10, iters=2),
    "B": dict(n=1000, d=20, K=4, iters=2),
    "C": dict(n=5000, d=8, K=6, iters=2),
    "D": dict(n=3000, d=16, K=10, iters=2),
    "E": dict(n=2000, d=100, K=10, iters=4, sk_iters=2),
    "F": dict(n=3000, d=100, K=10, iters=10),
    "G": dict(n=2000, d=100, K=5, iters=3, sk_iters=2),
    "H": dict(n=3000, d=100, K=10, iters=4, sk_iters=2),
}
MODES = {
    "float64": {},
    "float32": {"compute_dtype": "float32"},
    "wm64": {"working_memory": 64},
    "thr1e-8": {"resp_threshold": 1e-8},
    "exact": {"resp_threshold": 0.0},
    # the pairs schedule with the rows' bounds projected afresh each iteration, or
    # carried across iterations whatever the cost model says
    "projected": {},
    "carried": {},
}
CARRY = {"projected": False, "carried": True}


# ------------------------------------------------------------------------------ data


def mixture_data(n, d, K, seed):
    """n rows from a random K-component Gaussian mixture in d dimensions."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=2.0, size=(K, d))
    labels = rng.integers(K, size=n)
    X = np.empty((n, d))
    scales = rng.uniform(0.5, 1.5, size=K)
    for k in range(K):
        rows = np.flatnonzero(labels == k)
        A = rng.normal(size=(d, d)) / np.sqrt(d) * scales[k]
        X[rows] = centres[k] + rng.normal(size=(rows.size, d)) @ A
    return X


def patch_data(n, side, seed):
    """n random side x side grayscale patches of the sklearn sample images, each with
    its mean removed, as rows of side**2 float64 values (pixel scale 0..255)."""
    from sklearn.datasets import load_sample_images

    rng = np.random.default_rng(seed)
    images = [img.astype(np.float64) @ np.array([0.299, 0.587, 0.114])
              for img in load_sample_images().images]
    which = rng.integers(len(images), size=n)
    X = np.empty((n, side * side))
    for i, img in enumerate(images):
        rows = np.flatnonzero(which == i)
        r = rng.integers(img.shape[0] - side + 1, size=rows.size)
        c = rng.integers(img.shape[1] - side + 1, size=rows.size)
        off = np.arange(side)
        X[rows] = img[r[:, None, None] + off[None, :, None],
                      c[:, None, None] + off[None, None, :]].reshape(rows.size, -1)
    X -= X.mean(axis=1, keepdims=True)
    return X


def initial_parameters(X, K, cov, seed, reg=1e-6):
    """Means on K random rows, equal weights, every precision the inverse of the data
    covariance (a common 'random from data' start)."""
    rng = np.random.default_rng(seed + 1)
    n, d = X.shape
    means = X[rng.choice(n, K, replace=False)].copy()
    weights = np.full(K, 1.0 / K)
    sample = X[rng.choice(n, min(n, 100_000), replace=False)]
    if cov == "full":
        c = np.cov(sample, rowvar=False) + reg * np.eye(d)
        p = np.linalg.inv(c)
        precisions = np.repeat(((p + p.T) / 2)[None], K, axis=0)
    else:
        precisions = np.repeat((1.0 / (sample.var(axis=0) + reg))[None], K, axis=0)
    return weights, means, precisions


# ------------------------------------------------------------------ worker process


def _status(field):
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0  # kB -> MiB
    return float("nan")


def worker(spec):
    """Fit once (in this fresh process) and print a JSON record on stdout."""
    import warnings

    X = np.load(spec["data"])
    init = np.load(spec["init"])
    if spec["mode"] in CARRY:
        from emgmm._engine import carried_bounds

        carried_bounds.CARRY = CARRY[spec["mode"]]
    kw = dict(n_components=spec["K"], covariance_type=spec["cov"],
              tol=spec.get("tol", 0.0), max_iter=spec["iters"], reg_covar=1e-6,
              weights_init=init["weights"],
              means_init=init["means"], precisions_init=init["precisions"],
              init_params="random_from_data", random_state=0)
    if spec["lib"] == "sklearn":
        from sklearn.mixture import GaussianMixture

        times = {"e": [], "m": []}

        class Timed(GaussianMixture):
            def _e_step(self, *args, **kwargs):
                tic = time.perf_counter()
                out = super()._e_step(*args, **kwargs)
                times["e"].append(time.perf_counter() - tic)
                return out

            def _m_step(self, *args, **kwargs):
                tic = time.perf_counter()
                out = super()._m_step(*args, **kwargs)
                times["m"].append(time.perf_counter() - tic)
                return out

        model = Timed(**dict(kw, max_iter=spec.get("sk_iters", spec["iters"])))
    else:
        from emgmm import GaussianMixture

        pairs = count_pairs()
        model = GaussianMixture(**kw, **MODES[spec["mode"]], callback=pairs.iteration)
    from threadpoolctl import threadpool_info, threadpool_limits

    baseline = _status("VmRSS")
    tic = time.perf_counter()
    with warnings.catch_warnings(), threadpool_limits(spec["blas_threads"], "blas"):
        warnings.simplefilter("ignore")
        model.fit(X)
    wall = time.perf_counter() - tic
    peak = _status("VmHWM")
    extra = {}
    if spec["lib"] == "sklearn":
        # scikit-learn's fit ends with one more E step than M steps (the final E
        # step of fit_predict); zip leaves it out of the per-iteration times
        iters = [e + m for e, m in zip(times["e"], times["m"], strict=False)]
    else:
        iters = [h["seconds"] for h in model.history_]
        # (the pairs schedule counts its own: it evaluates most pairs outside
        # weighted_log_prob)
        extra["pairs_per_row"] = [h.get("pairs_per_row", p) for h, p in
                                  zip(model.history_, pairs.per_row, strict=False)]
        for name in ("rows_carried", "phase_seconds"):
            extra[name] = [h.get(name) for h in model.history_]
        extra["n_iter"] = int(model.n_iter_)
        extra["converged"] = bool(model.converged_)
    blas = [{"lib": i.get("internal_api"), "arch": i.get("architecture"),
             "threads": i.get("num_threads")} for i in threadpool_info()
            if i.get("user_api") == "blas"]
    print(json.dumps({
        "iteration_seconds": iters,
        "seconds_per_iteration": float(np.median(iters)),
        "fit_seconds": wall,
        "lower_bounds": [float(v) for v in model.lower_bounds_],
        "baseline_mb": baseline,
        "peak_mb": peak,
        "extra_mb": peak - baseline,
        "blas": blas,
        **extra,
    }))


def count_pairs():
    """Pairs per row that each iteration's pass evaluated (exactly, or estimated
    within a rounding bound; not the ones the screen proved negligible, which are
    -inf): a wrapper of emgmm's weighted_log_prob, in this process (the default
    n_jobs runs row threads in it), read per iteration through fit's callback."""
    try:
        from emgmm._engine import estep
    except ImportError:  # emgmm before the layout of issue 23: no count
        class Uncounted:
            per_row = []

            @classmethod
            def iteration(cls, record):
                if record.get("event") == "iteration":
                    cls.per_row.append(None)
        return Uncounted

    original = estep.weighted_log_prob
    seen = []

    def counted(X, *args, **kwargs):
        out = original(X, *args, **kwargs)
        seen.append((int(np.count_nonzero(np.isfinite(out))), out.shape[0]))
        return out

    class Pairs:
        per_row = []

        @classmethod
        def iteration(cls, record):
            if record.get("event") != "iteration":
                return
            done = seen[:]
            del seen[:len(done)]
            rows = sum(r for _, r in done)
            cls.per_row.append(sum(f for f, _ in done) / rows if rows else None)

    estep.weighted_log_prob = counted
    return Pairs


def run_worker(spec):
    out = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"worker {spec['lib']}/{spec['mode']} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------ parent


def gemm_rates(size):
    """GFLOP/s of numpy.matmul on (size, size) float64 and float32 (best of 3)."""
    rates = {}
    rng = np.random.default_rng(0)
    for name, dtype in (("dgemm", np.float64), ("sgemm", np.float32)):
        a = rng.random((size, size)).astype(dtype)
        b = rng.random((size, size)).astype(dtype)
        a @ b
        best = np.inf
        for _ in range(3):
            tic = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - tic)
        rates[name] = 2.0 * size**3 / best / 1e9
    return rates


def run_config(name, cfg, tmp, rtol, log, blas_threads=None):
    n, d, K, cov = cfg["n"], cfg["d"], cfg["K"], cfg["cov"]
    if cfg["data"] == "patches":
        X = patch_data(n, int(round(np.sqrt(d))), seed=0)
    else:
        X = mixture_data(n, d, K, seed=0)
    weights, means, precisions = initial_parameters(X, K, cov, seed=0)
    data, init = tmp / f"{name}_X.npy", tmp / f"{name}_init.npz"
    np.save(data, X)
    np.savez(init, weights=weights, means=means, precisions=precisions)
    del X
    base = dict(data=str(data), init=str(init), K=K, cov=cov, iters=cfg["iters"],
                blas_threads=blas_threads)
    base.update({k: cfg[k] for k in ("sk_iters", "tol") if k in cfg})
    sk = None
    if cfg.get("sklearn", True):
        log(f"[{name}] n={n} d={d} K={K} {cov}: scikit-learn ...")
        sk = run_worker(dict(base, lib="sklearn", mode="float64"))
    rows = []
    for mode in cfg.get("run_modes") or ["float64"] + cfg["modes"]:
        log(f"[{name}] emgmm {mode} ...")
        em = run_worker(dict(base, lib="emgmm", mode=mode))
        rows.append(result_row(name, cfg, mode, sk, em, rtol))
    os.remove(data)
    os.remove(init)
    return rows


def result_row(name, cfg, mode, sk, em, rtol):
    """One row of the results: times, ratios, memory, agreement of lower bounds."""
    n, d, K, cov = cfg["n"], cfg["d"], cfg["K"], cfg["cov"]
    em_iters = np.array(em["iteration_seconds"])
    flops = 2.0 * n * K * d * d if cov == "full" else None
    row = {
        "config": name, "n": n, "d": d, "K": K, "covariance_type": cov,
        "iterations": cfg["iters"], "data": cfg["data"], "mode": mode,
        "emgmm_parameters": MODES[mode], "sklearn": sk, "emgmm": em,
        "emgmm_s_per_iter": em["seconds_per_iteration"],
        "emgmm_mean_s_per_iter": float(np.mean(em_iters)),
        # iterations 3-10 (1-based): past the first, broad ones
        "emgmm_mean_s_per_iter_3_10": (float(np.mean(em_iters[2:10]))
                                       if em_iters.size > 2 else None),
        "emgmm_pairs_per_row": em.get("pairs_per_row"),
        "useful_gflops": flops / em["seconds_per_iteration"] / 1e9 if flops else None,
        "emgmm_peak_mb": em["peak_mb"], "emgmm_extra_mb": em["extra_mb"],
    }
    if sk is None:
        return row
    lb_sk, lb_em = np.array(sk["lower_bounds"]), np.array(em["lower_bounds"])
    m = min(lb_sk.size, lb_em.size)
    rel = float(np.max(np.abs(lb_em[:m] - lb_sk[:m]) / np.abs(lb_sk[:m])))
    sk_mean = float(np.mean(sk["iteration_seconds"]))
    row.update({
        "sklearn_s_per_iter": sk["seconds_per_iteration"],
        "speedup": sk["seconds_per_iteration"] / em["seconds_per_iteration"],
        "sklearn_mean_s_per_iter": sk_mean,
        "speedup_iter_3_10": (sk_mean / row["emgmm_mean_s_per_iter_3_10"]
                              if row["emgmm_mean_s_per_iter_3_10"] else None),
        "lower_bound_max_rel_diff": rel,
        "lower_bounds_agree": (bool(rel <= rtol) if mode in ("float64", "wm64", "exact")
                               else None),
        "sklearn_peak_mb": sk["peak_mb"], "sklearn_extra_mb": sk["extra_mb"],
    })
    return row


def format_table(rows, rates):
    head = ("| config | mode | sklearn s/iter | emgmm s/iter | ratio | ratio of means"
            " | ratio, iters 3-10 | pairs/row per iter | GFLOP/s | DGEMM GFLOP/s"
            " | sklearn peak MB (extra) | emgmm peak MB (extra)"
            " | lower bound rel diff |")
    lines = [head, "|" + "---|" * 13]

    def num(value, fmt):
        return "-" if value is None else format(value, fmt)

    for r in rows:
        sk = r["sklearn"] is not None
        pairs = r.get("emgmm_pairs_per_row") or []
        mean_ratio = (r["sklearn_mean_s_per_iter"] / r["emgmm_mean_s_per_iter"]
                      if sk else None)
        lines.append(
            f"| {r['config']} [{r['n']}, {r['d']}] K={r['K']} {r['covariance_type']} "
            f"| {r['mode']} | {num(r.get('sklearn_s_per_iter'), '.3f')} "
            f"| {r['emgmm_s_per_iter']:.3f} | {num(r.get('speedup'), '.1f')}x "
            f"| {num(mean_ratio, '.1f')}x "
            f"| {num(r.get('speedup_iter_3_10'), '.1f')}x "
            f"| {' '.join(num(v, '.1f') for v in pairs[:12])} "
            f"| {num(r['useful_gflops'], '.1f')} | {rates['dgemm']:.1f} "
            f"| {num(r.get('sklearn_peak_mb'), '.0f')} "
            f"({num(r.get('sklearn_extra_mb'), '.0f')}) "
            f"| {r['emgmm_peak_mb']:.0f} ({r['emgmm_extra_mb']:.0f}) "
            f"| {num(r.get('lower_bound_max_rel_diff'), '.1e')} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="A,B,C,D,E",
                        help="comma-separated subset of A-F (default: A-E; F, "
                             "[200k, 900] to convergence, takes hours)")
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes: seconds, for smoke tests")
    parser.add_argument("--name", default=None,
                        help="results/<name>.json (default: latest, or quick)")
    parser.add_argument("--out", default=None,
                        help="explicit output path (overrides --name)")
    parser.add_argument("--rtol", type=float, default=1e-6,
                        help="lower bounds must agree to this (float64 modes)")
    parser.add_argument("--gemm-size", type=int, default=2000)
    parser.add_argument("--blas-threads", type=int, default=None,
                        help="BLAS threads in every fit (default: the library's; "
                             "--quick: 1)")
    parser.add_argument("--n-samples", type=int, default=None,
                        help="override n of every chosen config (a shorter run; "
                             "the results record it)")
    parser.add_argument("--iters", type=int, default=None,
                        help="override emgmm's iterations of every chosen config")
    parser.add_argument("--sk-iters", type=int, default=None,
                        help="override scikit-learn's iterations")
    parser.add_argument("--tol", type=float, default=None,
                        help="override tol of every chosen config (with a large "
                             "--iters: fits to convergence)")
    parser.add_argument("--modes", default=None,
                        help=f"comma-separated emgmm modes to run in every config "
                             f"(default: float64 and the config's; of {sorted(MODES)})")
    parser.add_argument("--no-sklearn", action="store_true",
                        help="emgmm only (e.g. before/after runs of one tree each)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        worker(json.loads(args.worker))
        return 0
    names = [c.strip().upper() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in names if c not in CONFIGS]
    if unknown:
        parser.error(f"unknown configs {unknown}; choose from {sorted(CONFIGS)}")
    modes = [m.strip() for m in (args.modes or "").split(",") if m.strip()]
    if [m for m in modes if m not in MODES]:
        parser.error(f"unknown modes in {args.modes!r}; choose from {sorted(MODES)}")

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    import sklearn
    from threadpoolctl import threadpool_info

    import emgmm

    started = time.time()
    blas_threads = args.blas_threads if args.blas_threads or not args.quick else 1
    rates = gemm_rates(200 if args.quick else args.gemm_size)
    log(f"DGEMM {rates['dgemm']:.1f} GFLOP/s, SGEMM {rates['sgemm']:.1f} GFLOP/s")
    result_name = args.name or ("quick" if args.quick else "latest")
    out = Path(args.out) if args.out else RESULTS / f"{result_name}.json"
    result = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "quick": args.quick,
        "blas_threads": blas_threads,
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "machine": {
            "cpu_count": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "numpy": np.__version__,
            "sklearn": sklearn.__version__,
            "emgmm": getattr(emgmm, "__version__", None),
            "load_average_at_start": os.getloadavg(),
            "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE"),
            "OPENBLAS_L2_SIZE": os.environ.get("OPENBLAS_L2_SIZE"),
            "blas": [{"lib": i.get("internal_api"), "arch": i.get("architecture"),
                      "threads": i.get("num_threads"), "version": i.get("version")}
                     for i in threadpool_info() if i.get("user_api") == "blas"],
        },
        "gemm_gflops": rates,
        "peak_memory_method": (
            "VmHWM (resident high-water mark) of a fresh subprocess per fit; "
            "extra = VmHWM - VmRSS after imports and loading X"
        ),
        "seconds_per_iteration_method": "median over iterations; sklearn: _e_step + "
                                        "_m_step; emgmm: history_[i]['seconds']",
        "rows": [],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = result["rows"]
    with tempfile.TemporaryDirectory(prefix="emgmm-bench-") as tmp:
        for name in names:
            cfg = dict(CONFIGS[name])
            if args.quick:
                cfg.update(QUICK[name])
            for key, value in (("n", args.n_samples), ("iters", args.iters),
                               ("sk_iters", args.sk_iters), ("tol", args.tol)):
                if value is not None:
                    cfg[key] = value
            if args.no_sklearn:
                cfg["sklearn"] = False
            if modes:
                cfg["run_modes"] = modes
            rows.extend(run_config(name, cfg, Path(tmp), args.rtol, log, blas_threads))
            # written after every configuration, so an interrupted run keeps its rows
            result["wall_seconds"] = time.time() - started
            result["machine"]["load_average_at_end"] = os.getloadavg()
            out.write_text(json.dumps(result, indent=1))
    print(format_table(rows, rates))
    print(f"\nSGEMM {rates['sgemm']:.1f} GFLOP/s; written {out}; "
          f"{result['wall_seconds']:.0f} s")
    bad = [r for r in rows if r.get("lower_bounds_agree") is False]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
