"""Benchmark of parallel EM: n_jobs=1 vs n_jobs=2, and memory over a 4 GB .npy file.

Every measurement runs in a fresh Python subprocess (``--child``), on data generated
there from a fixed seed (a mixture of ``K`` Gaussians), from a fixed initialisation
(``weights_init``, ``means_init``, ``precisions_init``; ``tol=0`` and a fixed number of
iterations, or ``--tol`` for a fit to convergence, whose iterations are the same for
every ``n_jobs``):

1. ``blas1``: [100k, 64], K=200, 'full', one BLAS thread per worker in both runs
   (``threadpoolctl.threadpool_limits(1)`` in the parent for n_jobs=1; the workers of
   n_jobs=2 get ``cores // 2 = 1``). Wall time of ``fit``; the ratio
   ``t(n_jobs=1) / t(n_jobs=2)`` is the parallel speed-up (target >= 1.7 on 2 cores).
   The component-sharded schedule and scikit-learn (one BLAS thread) are timed on the
   same fit for reference. ``--repeats R`` times ``R`` alternating pairs and
   reports the ratio of the median times (and each pair's ratio).
2. ``default``: the same fit with default settings (no thread limit: n_jobs=1 lets
   BLAS use every core). Target: n_jobs=2 no slower than n_jobs=1. Also timed:
   ``n_jobs=None``, which runs the row blocks in threads of one process.
3. ``memory``: a 4 GB float64 ``.npy`` (5,000,000 x 100) is written, fitted with K=50
   'full', n_jobs=2 and ``--mem-iters`` iterations, while a thread samples every
   0.2 s the anonymous memory (``Anonymous:`` of ``/proc/<pid>/smaps_rollup``, i.e.
   heap and anonymous maps, not the page cache of the memory-mapped file) of the
   fitting process and all its descendants (the joblib workers), summed. Target: the
   peak of the sum stays under 1 GB. The file is deleted afterwards.

Results: ``benchmarks/results/<name>.json`` (default ``parallel``; ``--quick``:
``parallel_quick``), written after every measurement. ``--quick`` shrinks every size
so the whole run takes seconds (a smoke run; its figures mean nothing).

Usage (OpenBLAS's own CPU detection, as in bench_em.py)::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_parallel.py
    python benchmarks/bench_parallel.py --quick
    python benchmarks/bench_parallel.py --parts memory --mem-working-memory 128
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"


# ----------------------------------------------------------------------- data


def mixture_rows(rng, n, d, K, centers):
    labels = rng.integers(K, size=n)
    return centers[labels] + rng.normal(size=(n, d))


def make_centers(d, K, seed=0):
    return np.random.default_rng(seed).normal(scale=3.0, size=(K, d))


def initial_parameters(X_head, K, cov):
    """Same start for every run: K rows as means, unit precisions."""
    d = X_head.shape[1]
    means = np.ascontiguousarray(X_head[:K], dtype=np.float64)
    weights = np.full(K, 1.0 / K)
    precisions = {"full": np.stack([np.eye(d)] * K), "diag": np.ones((K, d))}[cov]
    return dict(weights_init=weights, means_init=means, precisions_init=precisions)


# ------------------------------------------------------------- child: timings


def child_time(p):
    from threadpoolctl import threadpool_info, threadpool_limits

    rng = np.random.default_rng(1)
    X = mixture_rows(rng, p["n"], p["d"], p["K"], make_centers(p["d"], p["K"]))
    init = initial_parameters(X[::max(1, p["n"] // p["K"])], p["K"], p["cov"])
    limit = threadpool_limits(limits=p["blas"], user_api="blas") if p["blas"] else None
    blas_in_parent = max(i["num_threads"] for i in threadpool_info()
                         if i["user_api"] == "blas")
    common = dict(n_components=p["K"], covariance_type=p["cov"], tol=p.get("tol", 0.0),
                  max_iter=p["iters"], **init)
    if p["engine"] == "sklearn":
        from sklearn.mixture import GaussianMixture
        est = GaussianMixture(**common)
    else:
        from emgmm import GaussianMixture
        est = GaussianMixture(**common, n_jobs=p["n_jobs"], schedule=p["schedule"])
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tic = time.perf_counter()
        est.fit(X)
        seconds = time.perf_counter() - tic
    if limit is not None:
        limit.restore_original_limits()
    out = dict(p, seconds=seconds, blas_threads_parent=blas_in_parent,
               lower_bounds=[float(v) for v in est.lower_bounds_])
    if p["engine"] == "emgmm":
        out["iteration_seconds"] = [r["seconds"] for r in est.history_]
    return out


# -------------------------------------------------------------- child: memory


def anonymous_kib(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Anonymous:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class MemorySampler(threading.Thread):
    """Samples the summed anonymous memory of this process and its descendants."""

    def __init__(self, interval=0.2):
        super().__init__(daemon=True)
        import psutil

        self.me = psutil.Process()
        self.interval = interval
        self.stop = threading.Event()
        self.peak_total = 0
        self.peak_by_pid = {}
        self.peak_uss_total = 0
        self.samples = 0

    def sample(self):
        procs = [self.me] + self.me.children(recursive=True)
        total, uss = 0, 0
        for proc in procs:
            kib = anonymous_kib(proc.pid)
            total += kib
            self.peak_by_pid[proc.pid] = max(self.peak_by_pid.get(proc.pid, 0), kib)
            try:
                uss += proc.memory_full_info().uss
            except Exception:
                pass
        self.peak_total = max(self.peak_total, total * 1024)
        self.peak_uss_total = max(self.peak_uss_total, uss)
        self.samples += 1

    def run(self):
        while not self.stop.is_set():
            self.sample()
            self.stop.wait(self.interval)


def child_memory(p):
    import warnings

    from emgmm import GaussianMixture
    from emgmm._io.sources import as_source

    mm = np.load(p["path"], mmap_mode="r")
    init = initial_parameters(np.array(mm[:p["K"] * 1000:1000]), p["K"], p["cov"])
    del mm
    est = GaussianMixture(n_components=p["K"], covariance_type=p["cov"], tol=0.0,
                          max_iter=p["iters"], n_jobs=2,
                          working_memory=p["working_memory"], **init)
    sampler = MemorySampler()
    sampler.sample()
    baseline = sampler.peak_total
    sampler.start()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tic = time.perf_counter()
        est.fit(p["path"])
        seconds = time.perf_counter() - tic
    sampler.stop.set()
    sampler.join()
    with as_source(p["path"]) as source:
        block = est._block_size(source)
    return dict(p, seconds=seconds, peak_anonymous_bytes=sampler.peak_total,
                baseline_anonymous_bytes=baseline,
                peak_uss_bytes=sampler.peak_uss_total,
                peak_anonymous_by_process_bytes=sorted(
                    (v * 1024 for v in sampler.peak_by_pid.values()), reverse=True),
                samples=sampler.samples, block_size=block,
                lower_bounds=[float(v) for v in est.lower_bounds_])


# --------------------------------------------------------------------- parent


def run_child(params):
    cmd = [sys.executable, __file__, "--child", json.dumps(params)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"child failed: {params}\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def write_npy(path, n, d, K, chunk=250_000):
    centers = make_centers(d, K, seed=2)
    rng = np.random.default_rng(3)
    mm = np.lib.format.open_memmap(path, mode="w+", dtype=np.float64, shape=(n, d))
    for s in range(0, n, chunk):
        e = min(s + chunk, n)
        mm[s:e] = mixture_rows(rng, e - s, d, K, centers)
    mm.flush()
    del mm


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="tiny sizes (smoke run)")
    ap.add_argument("--parts", default="blas1,default,memory")
    ap.add_argument("--iters", type=int, default=2,
                    help="EM iterations of parts 1-2 (max_iter)")
    ap.add_argument("--tol", type=float, default=0.0,
                    help="tol of parts 1-2: 0 runs exactly --iters iterations; "
                         "e.g. 1e-3 (scikit-learn's default) fits to convergence")
    ap.add_argument("--repeats", type=int, default=1,
                    help="alternating n_jobs=1 / n_jobs=2 pairs of part 1 (the "
                         "summary uses the median time of each)")
    ap.add_argument("--mem-iters", type=int, default=2)
    ap.add_argument("--mem-cov", default="full")
    ap.add_argument("--mem-working-memory", type=float, default=None,
                    help="working_memory (MiB per worker) of the 4 GB fit; "
                         "default: sklearn's working_memory")
    ap.add_argument("--no-sklearn", action="store_true")
    ap.add_argument("--name", default=None)
    ap.add_argument("--tmp", default=tempfile.gettempdir(), help="folder of the .npy")
    args = ap.parse_args()
    if args.child:
        p = json.loads(args.child)
        result = child_time(p) if p["kind"] == "time" else child_memory(p)
        print(json.dumps(result))
        return

    name = args.name or ("parallel_quick" if args.quick else "parallel")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out_path = RESULTS / f"{name}.json"
    import joblib
    report = dict(
        command=" ".join([os.path.basename(sys.executable)] + sys.argv),
        machine=dict(cpu_count=os.cpu_count(), joblib_cpu_count=joblib.cpu_count(),
                     platform=platform.platform(),
                     OPENBLAS_CORETYPE=os.environ.get("OPENBLAS_CORETYPE"),
                     load_average_start=os.getloadavg()),
        runs=[], summary={},
    )

    def save():
        out_path.write_text(json.dumps(report, indent=1))

    n, d, K = (5_000, 16, 20) if args.quick else (100_000, 64, 200)
    base = dict(kind="time", n=n, d=d, K=K, cov="full", iters=args.iters, tol=args.tol,
                engine="emgmm", schedule="auto")
    parts = args.parts.split(",")

    def timed(tag, **kw):
        params = dict(base, **kw)
        res = run_child(params)
        res["tag"] = tag
        report["runs"].append(res)
        save()
        n_iter = len(res["lower_bounds"])
        print(f"{tag:34s} {res['seconds']:8.2f} s, {n_iter} iterations", flush=True)
        return res["seconds"]

    s = report["summary"]
    if "blas1" in parts:
        # alternating pairs, so that a change of the shared machine's load falls on
        # both; the summary takes the median of each
        pairs = [(timed(f"blas1 n_jobs=1 #{r}", n_jobs=1, blas=1),
                  timed(f"blas1 n_jobs=2 #{r}", n_jobs=2, blas=1))
                 for r in range(args.repeats)]
        t1, t2 = (float(np.median(times)) for times in zip(*pairs, strict=True))
        tc = timed("blas1 n_jobs=2 components", n_jobs=2, blas=1, schedule="components")
        s["blas1_median_seconds_n_jobs_1"] = t1
        s["blas1_median_seconds_n_jobs_2"] = t2
        s["blas1_speedup_n_jobs_1_over_2"] = t1 / t2
        s["blas1_speedup_each_pair"] = [a / b for a, b in pairs]
        s["blas1_components_n_jobs_2_speedup_vs_rows_n_jobs_1"] = t1 / tc
        if not args.no_sklearn:
            ts = timed("blas1 sklearn", engine="sklearn", n_jobs=None, blas=1)
            s["blas1_sklearn_over_emgmm_n_jobs_2"] = ts / t2
            s["blas1_sklearn_over_emgmm_n_jobs_1"] = ts / t1
        save()
    if "default" in parts:
        t1 = timed("default n_jobs=1", n_jobs=1, blas=None)
        t2 = timed("default n_jobs=2", n_jobs=2, blas=None)
        t0 = timed("default n_jobs=None (row threads)", n_jobs=None, blas=None)
        s["default_speedup_n_jobs_1_over_2"] = t1 / t2
        s["default_speedup_n_jobs_none_over_2"] = t0 / t2
        save()
    if "memory" in parts:
        mn, md, mK = (200_000, 100, 10) if args.quick else (5_000_000, 100, 50)
        path = os.path.join(args.tmp, f"emgmm-bench-{os.getpid()}.npy")
        try:
            tic = time.perf_counter()
            write_npy(path, mn, md, mK)
            print(f"wrote {path}: {os.path.getsize(path) / 1e9:.2f} GB in "
                  f"{time.perf_counter() - tic:.0f} s", flush=True)
            res = run_child(dict(kind="memory", path=path, n=mn, d=md, K=mK,
                                 cov=args.mem_cov, iters=args.mem_iters,
                                 working_memory=args.mem_working_memory))
            res["file_bytes"] = os.path.getsize(path)
        finally:
            if os.path.exists(path):
                os.remove(path)
        res["tag"] = "memory"
        report["runs"].append(res)
        s["memory_file_gb"] = res["file_bytes"] / 1e9
        s["memory_peak_anonymous_gb"] = res["peak_anonymous_bytes"] / 1e9
        s["memory_fit_seconds"] = res["seconds"]
        print(f"memory: peak anonymous {res['peak_anonymous_bytes'] / 1e9:.3f} GB over "
              f"{len(res['peak_anonymous_by_process_bytes'])} processes, "
              f"fit {res['seconds']:.0f} s, block {res['block_size']} rows", flush=True)
    report["machine"]["load_average_end"] = os.getloadavg()
    save()
    print(json.dumps(s, indent=1))
    print(f"-> {out_path}")


if __name__ == "__main__":
    main()
