"""Faulty data files: a file-backed source truncated or rewritten while a pass reads
it ends in an error that names the file (never SIGBUS), in fit, predict,
score_samples and the command line, for every source kind and with workers; damaged
files are told apart by what can be checked (the file's signature and size, a retry
with HDF5 file locking off, the .npy header), never by words of another library's
message."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from emgmm import GaussianMixture
from emgmm._io.sources import as_source

h5py = pytest.importorskip("h5py")

ROWS, COLS = 6000, 4

# Installed in every process of a child run (its workers too) through
# sitecustomize: the first block read in any of them cuts the data file to its
# first 128 bytes while the block is still in use. A SIGBUS in the child is a
# negative return code, not a dead test session.
_SITECUSTOMIZE = textwrap.dedent("""
    import os
    if os.environ.get("EMGMM_TEST_CUT"):
        import numpy as np
        import emgmm._io.sources as sources
        path, marker = os.environ["EMGMM_TEST_CUT"].split(os.pathsep)
        read = sources.Source.read

        def mapped(array):  # (an array over a file map: its bases hold a memmap)
            while array is not None:
                if isinstance(array, np.memmap):
                    return True
                array = getattr(array, "base", None)
            return False

        def read_then_cut(self, start, stop, dtype=None):
            block = read(self, start, stop, dtype)
            if isinstance(self, sources.ArraySource) and not mapped(self.array):
                return block
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return block
            os.truncate(path, 128)
            return block

        sources.Source.read = read_then_cut
""")

_CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    import emgmm
    kind, where, n_jobs, path, spec = sys.argv[1:6]
    n_jobs = None if n_jobs == "None" else int(n_jobs)
    data = spec
    if kind in ("memmap", "memmap-c"):
        mode = "c" if kind == "memmap-c" else "r"  # (copy-on-write: read as an array)
        data = np.memmap(path, dtype=np.float64, mode=mode, shape=(%(rows)d, %(cols)d))
    gm = emgmm.GaussianMixture(3, max_iter=2, random_state=0, init_params="random")
    if where != "fit":
        gm.fit(np.random.default_rng(0).standard_normal((50, %(cols)d)))
    gm.set_params(block_size=200, n_jobs=n_jobs)
    getattr(gm, where)(data)
    print("no error")
""" % {"rows": ROWS, "cols": COLS})  # noqa: UP031


def _write(tmp_path, kind):
    X = np.random.default_rng(0).standard_normal((ROWS, COLS))
    if kind == "h5":
        path = tmp_path / "x.h5"
        with h5py.File(path, "w") as f:
            f["x"] = X
        return path, f"{path}:/x"
    if kind in ("memmap", "memmap-c"):
        path = tmp_path / "x.raw"
        X.tofile(path)
        return path, str(path)
    path = tmp_path / "x.npy"
    np.save(path, X)
    return path, str(path)


def _run(args, tmp_path, path):
    """Run ``python args`` with the file cut during its first block read."""
    (tmp_path / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]),
               EMGMM_TEST_CUT=f"{path}{os.pathsep}{tmp_path / 'cut'}")
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=300, env=env)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["npy", "memmap", "h5"])
@pytest.mark.parametrize("where,n_jobs", [("fit", "None"), ("fit", "2"),
                                          ("predict", "None"),
                                          ("score_samples", "None")])
def test_file_truncated_during_a_pass_names_the_file(tmp_path, kind, where, n_jobs):
    path, spec = _write(tmp_path, kind)
    out = _run(["-c", _CHILD, kind, where, n_jobs, str(path), spec], tmp_path, path)
    assert out.returncode == 1, (out.returncode, out.stderr[-2000:])
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("OSError"), last
    assert str(path) in last and ("truncated" in last or "modified" in last), last
    assert "MemoryError" not in out.stderr


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["npy", "h5"])
def test_cli_predict_on_a_file_truncated_during_the_pass(tmp_path, kind):
    path, spec = _write(tmp_path, kind)
    model = tmp_path / "m.h5"
    X = np.random.default_rng(0).standard_normal((50, COLS))
    np.save(tmp_path / "small.npy", X)
    fit = subprocess.run([sys.executable, "-m", "emgmm", "fit",
                          str(tmp_path / "small.npy"), "-k", "2", "-q",
                          "-o", str(model)],
                         capture_output=True, text=True)
    assert fit.returncode == 0, fit.stderr
    out = _run(["-m", "emgmm", "predict", str(model), spec, "--block-size", "200",
                "-o", str(tmp_path / "labels.npy")], tmp_path, path)
    assert out.returncode == 1, (out.returncode, out.stderr[-2000:])
    assert str(path) in out.stderr and "truncated" in out.stderr, out.stderr
    assert not (tmp_path / "labels.npy").exists()


@pytest.mark.slow
@pytest.mark.parametrize("n_jobs", ["None", "1"])
def test_copy_on_write_memmap_truncated_during_fit(tmp_path, n_jobs):
    """A memmap that emgmm reads as an array (mode 'c'): its blocks are copied out
    of the map after a check of the file's size, never used as views."""
    path, spec = _write(tmp_path, "memmap-c")
    out = _run(["-c", _CHILD, "memmap-c", "fit", n_jobs, str(path), spec], tmp_path,
               path)
    assert out.returncode == 1, (out.returncode, out.stderr[-2000:])
    last = out.stderr.strip().splitlines()[-1]
    assert (last.startswith("OSError") and str(path) in last
            and "truncated" in last), last


_DYING_WORKER = textwrap.dedent("""
    import os
    if (os.environ.get("EMGMM_TEST_DIE")
            and os.getpid() != int(os.environ["EMGMM_TEST_DIE"])):
        import emgmm._io.sources as sources
        read = sources.Source.read

        def cut_and_die(self, start, stop, dtype=None):
            os.truncate(self.filename, 128)
            os._exit(1)  # as a worker killed by SIGBUS would vanish

        sources.Source.read = cut_and_die
""")


@pytest.mark.slow
def test_worker_death_on_a_cut_file_names_the_file_not_memory(tmp_path):
    path, spec = _write(tmp_path, "npy")
    (tmp_path / "sitecustomize.py").write_text(_DYING_WORKER)
    code = textwrap.dedent(f"""
        import os
        os.environ["EMGMM_TEST_DIE"] = str(os.getpid())
        import emgmm
        emgmm.GaussianMixture(3, n_jobs=2, max_iter=2, block_size=200,
                              init_params="random", random_state=0).fit({spec!r})
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, env=env)
    assert out.returncode == 1, (out.returncode, out.stderr[-2000:])
    last = out.stderr.strip().splitlines()[-1]
    assert (last.startswith("OSError") and str(path) in last
            and "truncated" in last), last
    assert "MemoryError" not in last


@pytest.mark.parametrize("where", ["fit", "score"])
def test_hdf5_file_cut_after_opening_gives_one_message_with_or_without_workers(
        tmp_path, monkeypatch, where):
    """An HDF5 file cut to half its size once emgmm has opened it: the reads through
    this process's handle (n_jobs=None) and the worker processes that open it by
    name (n_jobs=2) raise the same error, naming the file (the workers said 'Cannot
    open HDF5 file ... damaged or truncated')."""
    from emgmm import GaussianMixture
    from emgmm._io import sources

    X = np.random.default_rng(0).standard_normal((ROWS, COLS))
    start = GaussianMixture(3, random_state=0).fit(X[:500])
    make_source = sources.HDF5Source.__init__

    def make_then_cut(self, *args, **kwargs):
        make_source(self, *args, **kwargs)
        os.truncate(self.filename, os.path.getsize(self.filename) // 2)

    monkeypatch.setattr(sources.HDF5Source, "__init__", make_then_cut)
    errors = []
    for n_jobs in (None, 2):
        path = tmp_path / "x.h5"
        with h5py.File(path, "w") as f:
            f["x"] = X
        # (a start given in full: the workers' pass is the fit's first read)
        gm = GaussianMixture(3, max_iter=2, block_size=200, n_jobs=n_jobs,
                             weights_init=start.weights_, means_init=start.means_,
                             precisions_init=start.precisions_)
        if where == "score":
            gm = start.set_params(n_jobs=n_jobs, block_size=200)
        with pytest.raises(OSError) as info:
            getattr(gm, where)(f"{path}:/x")
        errors.append((type(info.value), str(info.value)))
    assert errors[0] == errors[1]
    assert errors[0][0] is OSError
    assert f"{path} (of {path}:/x) was truncated while emgmm was reading it" in \
        errors[0][1]


def _damaged(tmp_path, how):
    raw = _hdf5_bytes(tmp_path)
    if how == "superblock-version":  # h5py: "bad superblock version number"
        raw[8] = 7
    elif how == "eof-address":
        raw[40:56] = b"\xff" * 16
    elif how == "truncated":
        raw = raw[: len(raw) // 2]
    path = tmp_path / f"{how}.h5"
    path.write_bytes(bytes(raw))
    return path


@pytest.mark.parametrize("how", ["superblock-version", "eof-address", "truncated"])
def test_damaged_hdf5_file_is_not_called_locked(tmp_path, how):
    path = _damaged(tmp_path, how)
    with pytest.raises(OSError) as info:
        as_source(f"{path}:/x")
    message = str(info.value)
    assert "HDF5_USE_FILE_LOCKING" not in message and "locked" not in message
    assert str(path) in message
    assert "damaged or truncated" in message
    assert f"{path.stat().st_size} bytes" in message


def test_hdf5_error_from_fit_names_the_damage(tmp_path):
    path = _damaged(tmp_path, "superblock-version")
    with pytest.raises(OSError, match="damaged or truncated"):
        GaussianMixture(2).fit(f"{path}:/x")


def test_file_without_hdf5_signature_given_as_a_dataset(tmp_path):
    path = tmp_path / "text.h5"
    path.write_text("not hdf5 at all\n" * 100)
    with pytest.raises(OSError, match="no HDF5 signature") as info:
        as_source(f"{path}:/x")
    assert "HDF5_USE_FILE_LOCKING" not in str(info.value)


def test_object_npy_for_init_array_is_told_by_its_header(tmp_path, monkeypatch):
    """The CLI tells an object array by the .npy header's dtype, not by numpy's
    words ('allow_pickle')."""
    from emgmm._cli import command as cli

    path = tmp_path / "objects.npy"
    np.save(path, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)

    def load_fails_otherwise(*args, **kwargs):
        raise ValueError("some other wording of numpy's")

    monkeypatch.setattr(np, "load", load_fails_otherwise)
    with pytest.raises(cli.CommandError, match="holds Python objects, not numbers"):
        cli._load_init_array(str(path), "--means-init")


def test_missing_dataset_message_is_not_a_quoted_repr(tmp_path):
    """29.6: a KeyError's str() is the repr of its argument ("'...'" quoted twice);
    the missing-dataset error prints as its message."""
    path = tmp_path / "x.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.zeros((10, 2))
    with pytest.raises(KeyError) as info:
        as_source(f"{path}:/missing")
    assert str(info.value) == f"HDF5 file {path} has no dataset '/missing'."


def _hdf5_bytes(tmp_path):
    path = tmp_path / "good.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.random.default_rng(0).standard_normal((100, 3))
    return bytearray(path.read_bytes())


def test_truncated_npy_is_named_truncated(tmp_path):
    """A .npy cut short (its data shorter than its header says) is named truncated,
    not left at numpy's mmap wording."""
    path = tmp_path / "X.npy"
    np.save(path, np.ones((100, 3)))
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 40)
    with pytest.raises(ValueError, match=r"X\.npy.*shorter than its header says"):
        as_source(str(path))
