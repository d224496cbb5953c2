"""Sphinx configuration of the emgmm documentation.

Build (warnings are errors, as in .ci/run)::

    python -m sphinx -W --keep-going -b html docs docs/_build/html
"""

import emgmm

project = "emgmm"
author = "emgmm developers"
copyright = "2026, emgmm developers"
release = emgmm.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "numpydoc",
]

# No network during the build: no intersphinx inventories are fetched, so
# references to numpy, scipy and scikit-learn are written as plain literals.
intersphinx_mapping: dict = {}

# The API pages are written by hand (docs/api.rst); autosummary only makes tables.
autosummary_generate = False
# No default members: under Sphinx 9 a default "members" overrides the explicit member
# lists of docs/api.rst (the methods inherited from BaseMixture went missing and
# scikit-learn's generated set_*_request methods came in).
autodoc_default_options: dict = {}
autodoc_typehints = "none"

numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
# Every numpydoc check on the documented (public) objects, as build errors under -W,
# except: no "See Also" (SA01) or extended summary (ES01) required everywhere, and
# Examples (EX01) only where written (the estimator has them, run as doctests by
# tests/test_docstrings.py).
numpydoc_validation_checks = {"all", "SA01", "ES01", "EX01"}

exclude_patterns = ["_build"]
html_theme = "alabaster"
html_static_path: list = []
html_theme_options = {"description": "Exact, out-of-core, parallel EM"}
