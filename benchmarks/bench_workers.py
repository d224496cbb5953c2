"""CPU work and memory of one fit with 1, 2 and many worker processes (issue 32's W).

Each fit runs in a fresh subprocess from the same fitted start (``--start``: a model
saved by ``--make-start``), a few iterations with ``tol=0``. After every iteration
the subprocess adds up the CPU time (user + system) of itself and of every process
below it (the loky workers and their resource tracker, found with psutil); the
differences are the CPU seconds of each iteration of the whole process tree. A
sampling thread records each worker's unique set size (USS: the memory only that
process holds, not the shared maps of the model and the data) and the tree's total
resident memory.

n_jobs=40 on a 2-core machine measures the CPU work and the memory of 40 workers,
not their wall time.

Configurations: E (30x30 patches, K=200, 'full'), G (50x50, K=50, 'full') and FS
(50x50, K=200, 'factor' with q=32, screened: the start is a fitted estimator that
each run warm-starts).

Usage::

    python benchmarks/bench_workers.py --make-start E --n 20000
    python benchmarks/bench_workers.py --config E --n-jobs 1,2,40 --iters 4
"""

import argparse
import json
import os
import pickle
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_em import initial_parameters, patch_data  # noqa: E402

RESULTS = HERE / "results"


def _tree(proc):
    import psutil

    try:
        return [proc] + proc.children(recursive=True)
    except psutil.Error:
        return [proc]


def _cpu(procs, seen):
    """CPU seconds (user + system) of the processes of the tree that were ever
    seen: ``seen`` maps each pid to its last reading, so that a worker that exits
    keeps its share."""
    import psutil

    for p in procs:
        try:
            t = p.cpu_times()
            seen[p.pid] = max(seen.get(p.pid, 0.0), t.user + t.system)
        except psutil.Error:
            pass
    return sum(seen.values())


class Sampler(threading.Thread):
    """Samples the workers' USS and the tree's RSS every ``interval`` seconds."""

    def __init__(self, interval=0.5):
        super().__init__(daemon=True)
        import psutil

        self.me = psutil.Process()
        self.interval = interval
        self.worker_uss = 0.0
        self.tree_rss = 0.0
        self.stopped = threading.Event()
        #: CPU seconds by pid (see :func:`_cpu`), shared with the callback.
        self.seen = {}
        #: CPU seconds of this sampling thread (left out of the tree's).
        self.own_cpu = 0.0

    def run(self):
        import psutil

        while not self.stopped.is_set():
            procs = _tree(self.me)
            _cpu(procs, self.seen)
            rss = 0.0
            for p in procs:
                try:
                    info = p.memory_full_info()
                except psutil.Error:
                    continue
                rss += info.rss
                if p.pid != self.me.pid:
                    self.worker_uss = max(self.worker_uss, info.uss)
            self.tree_rss = max(self.tree_rss, rss)
            self.own_cpu = time.thread_time()
            self.stopped.wait(self.interval)


def worker(spec):
    """One fit in this fresh process; prints a JSON record."""
    import psutil

    from emgmm import GaussianMixture

    X = np.load(spec["data"], mmap_mode="r") if spec["memmap"] else np.load(
        spec["data"])
    start = dict(np.load(spec["start"]))
    me = psutil.Process()
    sampler = Sampler()
    cpu, seconds, pairs, phases = [], [], [], []

    def tree_cpu():
        return _cpu(_tree(me), sampler.seen) - sampler.own_cpu

    last = [tree_cpu(), time.perf_counter()]

    def callback(record):
        if record.get("event") != "iteration":
            return
        now = tree_cpu()
        cpu.append(now - last[0])
        seconds.append(time.perf_counter() - last[1])
        pairs.append(record.get("pairs_per_row"))
        phases.append(record.get("phase_seconds"))
        last[:] = [now, time.perf_counter()]

    if "estimator" in start:  # a fitted 'factor' start (FS), warm-started
        gm = pickle.loads(start["estimator"].tobytes()).set_params(
            tol=0.0, max_iter=spec["iters"], warm_start=True, n_jobs=spec["n_jobs"],
            callback=callback, schedule=spec.get("schedule", "auto"))
    else:
        gm = GaussianMixture(
            start["weights"].size, tol=0.0, max_iter=spec["iters"], reg_covar=1e-6,
            weights_init=start["weights"], means_init=start["means"],
            precisions_init=start["precisions"], n_jobs=spec["n_jobs"],
            callback=callback)
    sampler.start()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tic = time.perf_counter()
        last[:] = [tree_cpu(), time.perf_counter()]
        gm.fit(X)
        wall = time.perf_counter() - tic
    sampler.stopped.set()
    sampler.join()
    print(json.dumps({
        "n_jobs": spec["n_jobs"], "cpu_seconds": cpu, "iteration_seconds": seconds,
        "pairs_per_row": pairs, "phase_seconds": phases, "fit_seconds": wall,
        "lower_bounds": [float(v) for v in gm.lower_bounds_],
        "worker_uss_mb": sampler.worker_uss / 2**20,
        "processes_seen": len(sampler.seen),
        "tree_rss_mb": sampler.tree_rss / 2**20,
    }))


def make_start(name, n, iters, out, start_n=None):
    """A start for the workers' runs: ``n`` patches, ``iters`` iterations of emgmm on
    the first ``start_n`` of them (default all) from the 'random from data' start of
    bench_em.py, saved with its weights, means and precisions."""
    from emgmm import GaussianMixture

    side = {"E": 30, "G": 50, "FS": 50}[name]
    K = {"E": 200, "G": 50, "FS": 200}[name]
    X = patch_data(n, side, seed=0)
    head = X[:start_n or n]
    if name == "FS":
        gm = GaussianMixture(K, covariance_type="factor", n_factors=32, tol=0.0,
                             max_iter=iters, random_state=0)
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            gm.fit(head)
        np.save(out.with_suffix(".X.npy"), X)
        np.savez(out, estimator=np.frombuffer(pickle.dumps(gm), dtype=np.uint8))
        return
    weights, means, precisions = initial_parameters(head, K, "full", seed=0)
    gm = GaussianMixture(K, tol=0.0, max_iter=iters, reg_covar=1e-6,
                         weights_init=weights, means_init=means,
                         precisions_init=precisions)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gm.fit(head)
    np.save(out.with_suffix(".X.npy"), X)
    np.savez(out, weights=gm.weights_, means=gm.means_, precisions=gm.precisions_)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="E")
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--n-jobs", default="1,2,40")
    parser.add_argument("--iters", type=int, default=4)
    parser.add_argument("--start-iters", type=int, default=5)
    parser.add_argument("--start-n", type=int, default=None,
                        help="rows the start is fitted on (default: all n)")
    parser.add_argument("--make-start", action="store_true")
    parser.add_argument("--schedule", default="auto",
                        help="the schedule of configuration FS's fits")
    parser.add_argument("--memmap", action="store_true",
                        help="pass X as a memory map of the .npy file")
    parser.add_argument("--folder", default="/tmp/emgmm-bench-workers")
    parser.add_argument("--out", default=None)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(json.loads(args.worker))
        return 0
    folder = Path(args.folder)
    folder.mkdir(parents=True, exist_ok=True)
    start = folder / f"{args.config}{args.n}_start.npz"
    if args.make_start or not start.exists():
        make_start(args.config, args.n, args.start_iters, start, args.start_n)
    rows = []
    for n_jobs in [int(v) for v in args.n_jobs.split(",")]:
        spec = dict(data=str(start.with_suffix(".X.npy")), start=str(start),
                    iters=args.iters, n_jobs=n_jobs, memmap=args.memmap,
                    schedule=args.schedule)
        out = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)],
                             capture_output=True, text=True, check=False)
        if out.returncode:
            raise RuntimeError(out.stderr)
        row = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(row)
        later = row["cpu_seconds"][1:]
        print(f"n_jobs={n_jobs}: CPU s/iter {np.mean(later):.2f} (iterations 2+), "
              f"wall s/iter {np.mean(row['iteration_seconds'][1:]):.2f}, worker USS "
              f"{row['worker_uss_mb']:.0f} MB, tree RSS {row['tree_rss_mb']:.0f} MB",
              flush=True)
    base = np.mean(rows[0]["cpu_seconds"][1:])
    for row in rows:
        row["cpu_ratio_to_first"] = float(np.mean(row["cpu_seconds"][1:]) / base)
    result = {"config": args.config, "n": args.n, "iters": args.iters,
              "memmap": args.memmap, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "cpu_count": os.cpu_count(), "rows": rows}
    out = (Path(args.out) if args.out
           else RESULTS / f"workers_{args.config}{args.n}.json")
    out.write_text(json.dumps(result, indent=1))
    print(f"written {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
