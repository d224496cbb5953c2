"""Side-by-side benchmark of prediction against fitting: one EM iteration vs
``score``, ``score_samples``, ``predict``, ``predict_proba`` and the command line's
``predict``/``score``, on one ``.npy`` file.

The data: ``--n`` rows of a ``--K``-component Gaussian mixture in ``--d`` dimensions
(overlapping components, random full covariances; fixed seed), written block by
block to a float64 ``.npy`` in ``--data-dir`` (deleted afterwards unless
``--keep``). A model is fitted once on its first 100k rows (K components, 'full',
5 iterations) and saved; every measurement then runs in a fresh Python subprocess
(``--child``) on the whole file, with that model:

* ``fit_iteration``: ``GaussianMixture(max_iter=1, tol=0)`` started from the model's
  parameters (``*_init``); its time is the ``seconds`` of the iteration in
  ``history_`` (statistics pass, M step and factorisation: the worker start-up,
  the initialisation and the final scoring pass are left out).
* ``score``, ``score_samples``, ``predict``, ``predict_proba``: the method on the
  file's path, after a warm-up call on its first 1000 rows (which starts the
  workers, as the fit's start-up does before its first iteration); the ``*_out``
  kinds write into a memory-mapped ``.npy`` (``out=``), made before the call.
* ``cli_predict``, ``cli_score``: ``emgmm predict MODEL DATA -o labels.npy`` and
  ``emgmm score MODEL DATA``, run as ``emgmm._cli.command.main`` in the fresh process
  (the workers' start-up included, the interpreter's not).

Each child of a prediction kind then times a fit iteration in the same process
(its workers already started), so that every time has a fit iteration measured
beside it under the same load. Rounds are interleaved (every kind once per round, in
a fixed order). Reported per ``n_jobs``: the median time of each kind, the median of
its ratios to the fit iteration beside it (and each round's ratio), and memory: a
thread samples every 0.05 s the anonymous memory (``Anonymous:`` of
``/proc/<pid>/smaps_rollup``: heap and anonymous maps, not the page cache of the
file) of the child and its descendants (the joblib workers), summed; ``extra_mb`` is
its peak above the sample before the call, ``output_mb`` the size of the result the
call returns (which lives in the parent's memory unless ``out=`` is a memmap).

Results: ``benchmarks/results/<name>.json`` (default ``predict``; ``--quick``:
``predict_quick``). ``--quick`` shrinks the run to seconds (a smoke run; its figures
mean nothing).

Usage::

    python benchmarks/bench_predict.py --n 2500000 --rounds 3 --n-jobs 2,None
    python benchmarks/bench_predict.py --quick
"""

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from bench_parallel import anonymous_kib

RESULTS = Path(__file__).resolve().parent / "results"
KINDS = ("fit_iteration", "score", "score_samples", "predict", "predict_out",
         "predict_proba", "predict_proba_out", "cli_predict", "cli_score")
FIT_ROWS = 100_000


# ----------------------------------------------------------------------- data


def write_data(path, n, d, K, seed=0, step=100_000):
    """``n`` rows of a K-component mixture with overlapping components (means of
    scale 0.4, random full covariances) written block by block to ``path``."""
    rng = np.random.default_rng(seed)
    means = rng.normal(scale=0.4, size=(K, d))
    maps = rng.normal(size=(K, d, d)) / np.sqrt(d)
    mm = np.lib.format.open_memmap(path, mode="w+", dtype=np.float64, shape=(n, d))
    for start in range(0, n, step):
        stop = min(n, start + step)
        labels = rng.integers(K, size=stop - start)
        block = np.empty((stop - start, d))
        for k in range(K):
            rows = np.flatnonzero(labels == k)
            block[rows] = means[k] + rng.normal(size=(rows.size, d)) @ maps[k].T
        mm[start:stop] = block
    mm.flush()
    del mm


def fit_model(data, model_path, K, n_jobs):
    """A 'full' model fitted on the first ``FIT_ROWS`` rows, saved with ``n_jobs``."""
    import warnings

    from emgmm import GaussianMixture, save_model

    X = np.load(data, mmap_mode="r")
    head = np.asarray(X[:FIT_ROWS])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gm = GaussianMixture(K, covariance_type="full", max_iter=5, random_state=0,
                             n_jobs=1).fit(head)
    gm.set_params(n_jobs=n_jobs)
    save_model(gm, model_path)


# ------------------------------------------------------------- child: one kind


class MemorySampler(threading.Thread):
    """Samples the summed anonymous memory of this process and its descendants."""

    def __init__(self, interval=0.05):
        super().__init__(daemon=True)
        import psutil

        self.me = psutil.Process()
        self.interval = interval
        self.done = threading.Event()
        self.peak = 0
        self.baseline = 0

    def now(self):
        try:
            procs = [self.me] + self.me.children(recursive=True)
        except Exception:  # noqa: BLE001 (a worker gone between the calls)
            procs = [self.me]
        return 1024 * sum(anonymous_kib(p.pid) for p in procs)

    def run(self):
        while not self.done.is_set():
            self.peak = max(self.peak, self.now())
            self.done.wait(self.interval)

    def begin(self):
        """Take the baseline and start sampling (right before the timed call)."""
        self.baseline = self.now()
        self.start()

    def stop(self):
        self.done.set()
        self.join()
        self.peak = max(self.peak, self.now())


def _fit_iteration(p, model, sampler):
    from emgmm import GaussianMixture

    gm = GaussianMixture(
        model.n_components, covariance_type="full", max_iter=1, tol=0.0,
        n_jobs=p["n_jobs"], weights_init=model.weights_, means_init=model.means_,
        precisions_init=model.precisions_)
    sampler.begin()  # (the workers start in the fit: their memory counts)
    gm.fit(p["data"])
    return gm.history_[0]["seconds"], 0


def _method(p, model, sampler):
    """The estimator's method of ``p['kind']`` on the file, after a warm-up on its
    first 1000 rows; ``(seconds, bytes of the result)``."""
    kind = p["kind"]
    name = kind[:-4] if kind.endswith("_out") else kind
    method = getattr(model, name)
    X = np.load(p["data"], mmap_mode="r")
    method(X[:1000])
    kwargs = {}
    if kind.endswith("_out"):
        shape = (X.shape[0], model.n_components) if name == "predict_proba" \
            else (X.shape[0],)
        dtype = np.int64 if name == "predict" else np.float64
        kwargs["out"] = np.lib.format.open_memmap(
            os.path.join(p["tmp"], "out.npy"), mode="w+", dtype=dtype, shape=shape)
    sampler.begin()
    tic = time.perf_counter()
    result = method(p["data"], **kwargs)
    seconds = time.perf_counter() - tic
    on_disk = kind.endswith("_out")
    return seconds, 0 if on_disk else int(np.asarray(result).nbytes)


def _cli(p, model, sampler):
    from emgmm._cli import command

    argv = (["predict", p["model"], p["data"], "-o",
             os.path.join(p["tmp"], "labels.npy")] if p["kind"] == "cli_predict"
            else ["score", p["model"], p["data"]])
    sampler.begin()  # (the command starts its workers: their memory counts)
    tic = time.perf_counter()
    status = command.main(argv)
    seconds = time.perf_counter() - tic
    assert status == 0, status
    return seconds, 0


def child(p):
    import warnings

    from emgmm import load_model

    warnings.simplefilter("ignore")
    model = load_model(p["model"])
    run = (_fit_iteration if p["kind"] == "fit_iteration"
           else _cli if p["kind"].startswith("cli_") else _method)
    sampler = MemorySampler()
    seconds, output_bytes = run(p, model, sampler)
    sampler.stop()
    # the fit iteration beside it, in the same process under the same load (its
    # workers warm: no start-up in either)
    paired = seconds if p["kind"] == "fit_iteration" else \
        _fit_iteration(p, model, MemorySampler())[0]
    return dict(kind=p["kind"], n_jobs=p["n_jobs"], seconds=seconds,
                fit_iteration_s=paired, ratio=seconds / paired,
                baseline_mb=sampler.baseline / 2**20, peak_mb=sampler.peak / 2**20,
                extra_mb=(sampler.peak - sampler.baseline) / 2**20,
                output_mb=output_bytes / 2**20)


def run_child(p):
    out = subprocess.run([sys.executable, __file__, "--child", json.dumps(p)],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"child {p['kind']} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------ the run


def summarise(records, n_jobs):
    """Per kind: median seconds, the median of its ratios to the fit iteration
    timed beside it (and each round's), and the largest memory figures over the
    rounds."""
    by_kind = {k: [r for r in records if r["kind"] == k] for k in KINDS}
    rows = []
    for kind, recs in by_kind.items():
        seconds = [r["seconds"] for r in recs]
        ratios = [r["ratio"] for r in recs]
        rows.append(dict(
            kind=kind, n_jobs=n_jobs, seconds=seconds,
            median_s=statistics.median(seconds),
            fit_iteration_s=[r["fit_iteration_s"] for r in recs],
            ratio_to_fit_iteration=statistics.median(ratios),
            ratios_per_round=ratios,
            peak_anon_mb=max(r["peak_mb"] for r in recs),
            extra_anon_mb=max(r["extra_mb"] for r in recs),
            output_mb=max(r["output_mb"] for r in recs)))
    return rows


def machine():
    from threadpoolctl import threadpool_info

    return {"cpu_count": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "numpy": np.__version__,
            "load_average": os.getloadavg(),
            "blas": [{"api": i.get("internal_api"), "version": i.get("version"),
                      "threads": i.get("num_threads")}
                     for i in threadpool_info() if i.get("user_api") == "blas"]}


def print_table(rows):
    print(f"{'n_jobs':>6} {'kind':<18} {'median s':>9} {'/ fit iter':>10} "
          f"{'extra MB':>9} {'output MB':>9}")
    for r in rows:
        print(f"{r['n_jobs']!s:>6} {r['kind']:<18} {r['median_s']:9.2f} "
              f"{r['ratio_to_fit_iteration']:10.2f} {r['extra_anon_mb']:9.1f} "
              f"{r['output_mb']:9.1f}", flush=True)


def parse_n_jobs(text):
    return [None if v.strip() == "None" else int(v) for v in text.split(",")]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--K", type=int, default=8)
    parser.add_argument("--n-jobs", default="2,None", type=parse_n_jobs)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--name", default=None)
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", default=None)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(json.loads(args.child))))
        return
    if args.quick:
        args.n, args.d, args.K, args.rounds = 20_000, 8, 3, 1
    name = args.name or ("predict_quick" if args.quick else "predict")
    out_path = Path(args.out) if args.out else RESULTS / f"{name}.json"
    tmp = tempfile.mkdtemp(prefix="bench-predict-", dir=args.data_dir)
    try:
        data = os.path.join(tmp, "X.npy")
        tic = time.perf_counter()
        write_data(data, args.n, args.d, args.K)
        print(f"wrote [{args.n}, {args.d}] float64 "
              f"({os.path.getsize(data) / 2**20:,.0f} MiB) in "
              f"{time.perf_counter() - tic:.1f} s", flush=True)
        rows = []
        for n_jobs in args.n_jobs:
            model = os.path.join(tmp, f"model-{n_jobs}.h5")
            fit_model(data, model, args.K, n_jobs)
            records = [run_child(dict(kind=kind, n_jobs=n_jobs, data=data,
                                      model=model, tmp=tmp))
                       for _ in range(args.rounds) for kind in KINDS]
            rows += summarise(records, n_jobs)
            print_table(summarise(records, n_jobs))
            result = dict(quick=args.quick, n=args.n, d=args.d, K=args.K,
                          covariance_type="full", rounds=args.rounds,
                          data_mb=os.path.getsize(data) / 2**20,
                          machine=machine(), rows=rows)
            out_path.parent.mkdir(parents=True, exist_ok=True)
            out_path.write_text(json.dumps(result, indent=1))
        print(f"results in {out_path}")
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
