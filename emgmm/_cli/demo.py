"""A natural-image patch prior, fitted out of core and compared with scikit-learn.

emgmm demo cuts 8x8 grayscale patches, with their mean (DC) removed as
patch priors for image restoration do, from the two photographs scikit-learn
ships (china.jpg, flower.jpg). Patches from the top 80% of each image are for
training, patches from the bottom 20% are held out. The training patches are
written to a temporary HDF5 file (deleted at the end, also on errors) and
emgmm fits a full-covariance mixture from tmp.h5:/patches with all cores.
Both are then compared on the same patches from the same initialisation:
emgmm and scikit-learn's GaussianMixture (in memory) each run
--sklearn-max-iter EM iterations (default 5, tol=0), a shorter fit
than the main one because scikit-learn is much slower. Every fit starts
from the same initial weights, means and precisions (one k-means
initialisation computed once and passed as weights_init/means_init/
precisions_init). The held-out mean log-likelihood per patch, fit time and
iterations of each fit are printed, with the difference and the time ratio
between emgmm and scikit-learn in the comparison.
A PNG shows the components by weight (weight, mean, leading covariance
eigenvectors with their variances) and patches sampled from the model beside real
held-out patches.
"""

import json
import os
import sys
import tempfile
import time
import warnings

import h5py
import numpy as np
from scipy.linalg import solve_triangular

from .._io.atomic import atomic_output, check_writable
from .errors import UsageError
from .progress import ProgressReporter, format_seconds

SUMMARY = "fit a patch prior to scikit-learn's sample images; compare with scikit-learn"


def gray_images():
    """The sample photographs shipped with scikit-learn, as grayscale images.

    Returns
    -------
    images : dict of str to ndarray of shape (427, 640), float64
        ``{"china.jpg": ..., "flower.jpg": ...}``, ITU-R 601 luma in [0, 1].
    """
    from sklearn.datasets import load_sample_images

    data = load_sample_images()
    luma = np.array([0.299, 0.587, 0.114])
    return {
        os.path.basename(name): (image.astype(np.float64) @ luma) / 255.0
        for name, image in zip(data.filenames, data.images, strict=False)
    }


def extract_patches(image, size=8):
    """All overlapping ``size`` x ``size`` patches of a 2-D image, flattened.

    Parameters
    ----------
    image : ndarray of shape (height, width)
    size : int, default=8

    Returns
    -------
    patches : ndarray of shape ((height - size + 1) * (width - size + 1), size * size)
        Row-major patches in raster order of their top-left corner (a copy).
    """
    windows = np.lib.stride_tricks.sliding_window_view(image, (size, size))
    return windows.reshape(-1, size * size).copy()


def remove_dc(patches):
    """Subtract each patch's mean.

    Parameters
    ----------
    patches : ndarray of shape (n_patches, n_pixels)

    Returns
    -------
    centred : ndarray of shape (n_patches, n_pixels)
    """
    return patches - patches.mean(axis=1, keepdims=True)


def train_test_patches(images, n_train, n_test, *, size=8, test_fraction=0.2,
                       random_state=0):
    """DC-removed patches: training from the top, held out from the bottom.

    The rows of each image are split at ``1 - test_fraction`` of its height;
    training patches lie entirely above the split and held-out patches
    entirely below, so no pixel is shared between the two sets.

    Parameters
    ----------
    images : iterable of ndarray of shape (height, width)
    n_train, n_test : int
        Numbers of patches drawn at random without replacement (all available
        patches if fewer).
    size : int, default=8
    test_fraction : float, default=0.2
    random_state : int, default=0

    Returns
    -------
    train : ndarray of shape (n_train, size * size), float64
    test : ndarray of shape (n_test, size * size), float64
    """
    rng = np.random.default_rng(random_state)
    train, test = [], []
    for image in images:
        split = int(round(image.shape[0] * (1 - test_fraction)))
        train.append(extract_patches(image[:split], size))
        test.append(extract_patches(image[split:], size))
    out = []
    for parts, n in ((train, n_train), (test, n_test)):
        patches = np.concatenate(parts)
        pick = rng.choice(len(patches), size=min(n, len(patches)), replace=False)
        out.append(remove_dc(patches[np.sort(pick)]))
    return out[0], out[1]


def kmeans_init(X, n_components, *, reg_covar=1e-6, max_samples=20_000,
                random_state=0):
    """Initial full-covariance parameters from one k-means run.

    k-means (``n_init=1``) runs on at most ``max_samples`` rows; every row of
    ``X`` is then labelled with its nearest centre and each component gets the
    weight, mean and covariance (plus ``reg_covar`` on the diagonal) of its
    rows, as scikit-learn's ``init_params="kmeans"`` does.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_features)
    n_components : int
    reg_covar : float, default=1e-6
    max_samples : int, default=20000
    random_state : int, default=0

    Returns
    -------
    weights : ndarray of shape (n_components,)
    means : ndarray of shape (n_components, n_features)
    precisions : ndarray of shape (n_components, n_features, n_features)
        Symmetric positive definite inverses of the covariances.
    """
    from sklearn.cluster import KMeans

    rng = np.random.default_rng(random_state)
    subset = X[rng.choice(len(X), size=min(max_samples, len(X)), replace=False)]
    kmeans = KMeans(n_components, n_init=1, random_state=random_state).fit(subset)
    labels = kmeans.predict(X)
    n_features = X.shape[1]
    eye = np.eye(n_features)
    weights = np.bincount(labels, minlength=n_components) / len(X)
    means = np.empty((n_components, n_features))
    precisions = np.empty((n_components, n_features, n_features))
    for k in range(n_components):
        members = X[labels == k]
        means[k] = members.mean(axis=0) if len(members) else kmeans.cluster_centers_[k]
        diff = members - means[k]
        cov = diff.T @ diff / max(len(members), 1) + reg_covar * eye
        inv_chol = solve_triangular(np.linalg.cholesky(cov), eye, lower=True)
        precision = inv_chol.T @ inv_chol
        precisions[k] = (precision + precision.T) / 2
    weights = np.maximum(weights, np.finfo(float).tiny)
    return weights / weights.sum(), means, precisions


def tile(vector, size=8, *, scale=3, symmetric=False):
    """Render a flattened ``size`` x ``size`` patch as an 8-bit grayscale array.

    Parameters
    ----------
    vector : ndarray of shape (size * size,)
    size : int, default=8
    scale : int, default=3
        Each pixel becomes ``scale`` x ``scale`` pixels.
    symmetric : bool, default=False
        Map 0 to mid-gray and the largest absolute value to black or white
        (for eigenvectors); otherwise stretch min..max to 0..255.

    Returns
    -------
    pixels : ndarray of shape (size * scale, size * scale), uint8
    """
    patch = vector.reshape(size, size)
    if symmetric:
        peak = np.abs(patch).max()
        scaled = 0.5 + 0.5 * patch / peak if peak > 0 else np.full_like(patch, 0.5)
    else:
        span = patch.max() - patch.min()
        scaled = (patch - patch.min()) / span if span > 0 else np.full_like(patch, 0.5)
    pixels = np.round(255 * scaled).astype(np.uint8)
    return np.kron(pixels, np.ones((scale, scale), dtype=np.uint8))


def _text_height():
    from PIL import Image, ImageDraw, ImageFont

    box = ImageDraw.Draw(Image.new("L", (1, 1))).textbbox(
        (0, 0), "Ag0.9e-3", font=ImageFont.load_default())
    return box[3] + 2


def _components_panel(weights, means, covariances, *, n_eigenvectors, groups_per_row,
                      max_components, size, scale):
    """The components by decreasing weight (at most ``max_components``): per
    component its weight, its mean and its leading eigenvectors, each with its
    variance (eigenvalue) below it; a caption and column labels above."""
    from PIL import Image, ImageDraw, ImageFont

    font, line = ImageFont.load_default(), _text_height()
    side, gap, label_width = size * scale, 6, 36
    group_width = label_width + (1 + n_eigenvectors) * (side + gap) + 3 * gap
    order = np.argsort(weights, kind="stable")[::-1][:max_components]
    n_rows = -(-len(order) // groups_per_row)
    row_height = side + line + gap
    top = 2 * line + gap
    panel = Image.new("L", (groups_per_row * group_width, top + n_rows * row_height),
                      255)
    draw = ImageDraw.Draw(panel)
    rest = 1.0 - float(np.sum(weights[order]))
    draw.text((gap, 0), f"{len(order)} of {len(weights)} components by weight"
              + (f" (the other {len(weights) - len(order)} hold {rest:.1%} of it)"
                 if len(order) < len(weights) else "")
              + "; per component: weight, mean, eigenvectors of the covariance "
              "(largest variance first, variance below)", fill=0, font=font)
    labels = ["weight", "mean"] + [f"ev{j + 1}" for j in range(n_eigenvectors)]
    for col in range(min(groups_per_row, len(order))):
        x0 = col * group_width + gap
        draw.text((x0, line), labels[0], fill=0, font=font)
        for j, text in enumerate(labels[1:]):
            draw.text((x0 + label_width + j * (side + gap), line), text, fill=0,
                      font=font)
    for position, k in enumerate(order):
        row, col = divmod(position, groups_per_row)
        y, x0 = top + row * row_height, col * group_width + gap
        variances, vectors = np.linalg.eigh(covariances[k])
        draw.text((x0, y + side // 2 - line // 2), f"{weights[k]:.3f}", fill=0,
                  font=font)
        tiles = [tile(means[k], size, scale=scale)]
        tiles += [tile(vectors[:, -1 - j], size, scale=scale, symmetric=True)
                  for j in range(n_eigenvectors)]
        for j, pixels in enumerate(tiles):
            x = x0 + label_width + j * (side + gap)
            panel.paste(Image.fromarray(pixels, mode="L"), (x, y))
            if j:
                draw.text((x, y + side), _short(variances[-j]), fill=0, font=font)
    return panel


def _short(value):
    """``1.2e-3`` for 0.0012: a variance in the width of a tile."""
    return f"{value:.1e}".replace("e-0", "e-").replace("e+0", "e+")


def _samples_panel(samples, real, *, per_row, size, scale):
    """Patches drawn from the model beside real held-out patches (each patch
    contrast-stretched on its own), with a caption above each grid."""
    from PIL import Image, ImageDraw, ImageFont

    font, line = ImageFont.load_default(), _text_height()
    side, gap = size * scale, 4
    grid_width = per_row * (side + gap)
    n_rows = -(-max(len(samples), len(real)) // per_row)
    panel = Image.new("L", (2 * grid_width + 4 * gap,
                            line + n_rows * (side + gap) + gap),
                      255)
    draw = ImageDraw.Draw(panel)
    for g, (title, patches) in enumerate((("samples from the model", samples),
                                          ("real held-out patches", real))):
        x0 = g * (grid_width + 4 * gap) + gap
        draw.text((x0, 0), title, fill=0, font=font)
        for i, patch in enumerate(patches):
            row, col = divmod(i, per_row)
            panel.paste(Image.fromarray(tile(patch, size, scale=scale), mode="L"),
                        (x0 + col * (side + gap), line + row * (side + gap)))
    return panel


def components_image(weights, means, covariances, *, samples=None, real=None,
                     n_eigenvectors=5, groups_per_row=4, max_components=48, size=8,
                     scale=4):
    """The demo's picture: the components by weight and, below, samples from the
    model beside real patches.

    The top panel shows at most ``max_components`` components in decreasing weight,
    ``groups_per_row`` per row: the weight, the mean (contrast-stretched) and the
    leading eigenvectors of the covariance (largest eigenvalue first, 0 as
    mid-gray) with their variances; a caption says how many components are shown
    and what weight the others hold. The bottom panel (when ``samples`` and
    ``real`` are given) shows patches drawn from the model beside real ones.

    Parameters
    ----------
    weights : ndarray of shape (n_components,)
    means : ndarray of shape (n_components, size * size)
    covariances : ndarray of shape (n_components, size * size, size * size)
    samples, real : ndarray of shape (n, size * size) or None, default=None
    n_eigenvectors : int, default=5
    groups_per_row : int, default=4
    max_components : int, default=48
    size, scale : int, default=8, 4

    Returns
    -------
    image : PIL.Image.Image
        Mode ``"L"``.
    """
    from PIL import Image

    panels = [_components_panel(weights, means, covariances,
                                n_eigenvectors=n_eigenvectors,
                                groups_per_row=groups_per_row,
                                max_components=max_components, size=size, scale=scale)]
    if samples is not None and real is not None:
        per_row = 16
        panels.append(_samples_panel(samples, real, per_row=per_row, size=size,
                                     scale=scale))
    width = max(p.width for p in panels)
    image = Image.new("L", (width, sum(p.height for p in panels) + 8), 255)
    y = 0
    for p in panels:
        image.paste(p, (0, y))
        y += p.height + 8
    return image


def add_arguments(parser):
    """Add the ``emgmm demo`` options to an argparse parser.

    Parameters
    ----------
    parser : argparse.ArgumentParser
    """
    parser.add_argument("--n-patches", type=int, default=30_000,
                        help="training patches (default %(default)s)")
    parser.add_argument("--n-test", type=int, default=10_000,
                        help="held-out patches (default %(default)s)")
    parser.add_argument("-k", "--n-components", type=int, default=200,
                        help="mixture components (default %(default)s)")
    parser.add_argument("--max-iter", type=int, default=20,
                        help="EM iterations at most (default %(default)s)")
    parser.add_argument("--tol", type=float, default=1e-3,
                        help="convergence threshold (default %(default)s)")
    parser.add_argument("--n-jobs", type=int, default=-1,
                        help="emgmm workers (default %(default)s: all cores)")
    parser.add_argument("--sklearn-max-iter", type=int, default=5,
                        help="EM iterations of the comparison with scikit-learn, "
                             "run by both with tol=0 (default %(default)s)")
    parser.add_argument("--random-state", type=int, default=0,
                        help="seed of the patches and the fits (default %(default)s)")
    parser.add_argument("--output-dir", default=".",
                        help="where the PNG goes (default: current directory)")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no progress on stderr")
    parser.add_argument("--json", action="store_true",
                        help="print the results as JSON instead of a table")


def _fit_result(model, seconds, test):
    return {"heldout_score": float(model.score(test)),
            "fit_seconds": seconds, "n_iter": int(model.n_iter_),
            "converged": bool(model.converged_),
            "last_lower_bound": float(model.lower_bounds_[-1])}


def _fit_emgmm(train, init, args, max_iter, tol, *, quiet):
    from sklearn.exceptions import ConvergenceWarning

    from .. import GaussianMixture

    weights, means, precisions = init
    with tempfile.TemporaryDirectory(prefix="emgmm-demo-") as tmp:
        h5_path = os.path.join(tmp, "tmp.h5")
        with h5py.File(h5_path, "w") as f:
            f.create_dataset("patches", data=train,
                             chunks=(min(4096, len(train)), train.shape[1]))
        model = GaussianMixture(
            args.n_components, covariance_type="full", tol=tol, max_iter=max_iter,
            weights_init=weights, means_init=means, precisions_init=precisions,
            random_state=args.random_state, n_jobs=args.n_jobs,
            callback=None if quiet else ProgressReporter(max_iter),
        )
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            model.fit(f"{h5_path}:/patches")
        seconds = time.perf_counter() - start
    model.set_params(callback=None)
    return model, seconds


def _fit_sklearn(train, init, args, max_iter, tol):
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.mixture import GaussianMixture

    weights, means, precisions = init
    model = GaussianMixture(
        args.n_components, covariance_type="full", tol=tol,
        max_iter=max_iter, weights_init=weights, means_init=means,
        precisions_init=precisions, init_params="random_from_data",
        random_state=args.random_state,
    )
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(train)
    return model, time.perf_counter() - start


def _print_table(results, out):
    r = results
    print(f"emgmm demo: {r['patch_size']}x{r['patch_size']} grayscale patches, mean "
          f"removed, from {', '.join(r['images'])}", file=out)
    print(f"  {r['n_train']} training patches (top 80% of each image), "
          f"{r['n_test']} held-out patches (bottom 20%), {r['n_components']} "
          "full-covariance components", file=out)
    print(f"  every fit starts from the same k-means initialisation "
          f"({format_seconds(r['init_seconds'])})", file=out)
    header = (f"  {'':36}{'iterations':>10}{'held-out log-lik/patch':>24}"
              f"{'fit time':>10}{'converged':>11}")

    def row(label, fit):
        print(f"  {label:36}{fit['n_iter']:>10}{fit['heldout_score']:>24.6f}"
              f"{fit['fit_seconds']:>9.1f}s{'yes' if fit['converged'] else 'no':>11}",
              file=out)

    print(header, file=out)
    row(f"emgmm, HDF5 on disk, n_jobs={r['n_jobs']}", r["emgmm"])
    print(f"  comparison on the same patches, {r['comparison_max_iter']} iterations "
          "(tol=0):", file=out)
    row("  emgmm, HDF5 on disk", r["emgmm_comparison"])
    row("  scikit-learn, in memory", r["sklearn"])
    print(f"  |emgmm - scikit-learn| held-out score {r['score_difference']:.3g}; "
          f"scikit-learn time / emgmm time {r['speedup']:.2f}", file=out)
    print(f"  components by weight, and samples beside real patches: {r['png']}",
          file=out)
    print(f"  total time {format_seconds(r['total_seconds'])}", file=out)


def run(args):
    """Run the demo with parsed ``add_arguments`` options.

    Parameters
    ----------
    args : argparse.Namespace

    Returns
    -------
    status : int
        0 on success.

    Raises
    ------
    UsageError
        If a size option is not positive, or ``--n-patches`` is below ``-k``.
    FileNotFoundError, PermissionError
        If ``--output-dir`` does not exist, or cannot be written (before any work).
    ValueError
        If the images hold fewer training patches than ``-k``.
    """
    for name in ("n_patches", "n_test", "n_components", "max_iter",
                 "sklearn_max_iter"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
    if args.n_patches < args.n_components:
        raise UsageError(f"--n-patches {args.n_patches} is fewer than the "
                         f"{args.n_components} components of -k: use more patches "
                         "or fewer components")
    # the picture's folder before minutes of fitting, not after them
    check_writable(_png_path(args), "output")
    return _run(args)


#: Patches of each kind (drawn from the model, real) in the picture's lower panel.
_N_SHOWN_PATCHES = 32


def _png_path(args):
    return os.path.join(args.output_dir, "emgmm_demo_components.png")


def _say(args, message):
    if not args.quiet:
        print(message, file=sys.stderr, flush=True)


def _run(args):
    total_start = time.perf_counter()
    images = gray_images()
    train, test = train_test_patches(images.values(), args.n_patches, args.n_test,
                                     random_state=args.random_state)
    if len(train) < args.n_components:
        raise ValueError(f"{len(train)} training patches for {args.n_components} "
                         "components: use more patches or fewer components")
    _say(args, f"k-means initialisation of {args.n_components} components on "
               f"{len(train)} patches ...")
    start = time.perf_counter()
    init = kmeans_init(train, args.n_components, random_state=args.random_state)
    init_seconds = time.perf_counter() - start
    _say(args, f"fitting emgmm on {len(train)} patches from a temporary HDF5 file ...")
    model, seconds = _fit_emgmm(train, init, args, args.max_iter, args.tol,
                                quiet=args.quiet)
    fits = {"emgmm": _fit_result(model, seconds, test)}
    n_iter = args.sklearn_max_iter
    _say(args, f"comparison: emgmm, {n_iter} iterations ...")
    short, seconds = _fit_emgmm(train, init, args, n_iter, 0.0, quiet=True)
    fits["emgmm_comparison"] = _fit_result(short, seconds, test)
    _say(args, f"comparison: scikit-learn, {n_iter} iterations in memory ...")
    sk_model, seconds = _fit_sklearn(train, init, args, n_iter, 0.0)
    fits["sklearn"] = _fit_result(sk_model, seconds, test)

    png = _png_path(args)
    samples, _ = model.sample(_N_SHOWN_PATCHES)
    picture = components_image(model.weights_, model.means_, model.covariances_,
                               samples=samples, real=test[:_N_SHOWN_PATCHES])
    with atomic_output(png) as tmp_path:
        picture.save(tmp_path, format="PNG")
    results = dict(
        images=list(images), patch_size=8, n_train=len(train), n_test=len(test),
        n_components=args.n_components, max_iter=args.max_iter, tol=args.tol,
        comparison_max_iter=n_iter, n_jobs=args.n_jobs, init_seconds=init_seconds,
        **fits,
        score_difference=abs(fits["emgmm_comparison"]["heldout_score"]
                             - fits["sklearn"]["heldout_score"]),
        speedup=(fits["sklearn"]["fit_seconds"]
                 / fits["emgmm_comparison"]["fit_seconds"]),
        png=png, total_seconds=time.perf_counter() - total_start,
    )
    if args.json:
        print(json.dumps(results))
    else:
        _print_table(results, sys.stdout)
    return 0
