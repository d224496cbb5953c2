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
autodoc_default_options = {"members": True, "inherited-members": False}
autodoc_typehints = "none"

numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

exclude_patterns = ["_build"]
html_theme = "alabaster"
html_static_path: list = []
html_theme_options = {"description": "Exact, out-of-core, parallel EM"}


# TEMPORARY (phase 1 of issue 23, while emgmm/ is being moved): one docstring
# writes the shape "(n_features_in_,)", which reStructuredText reads as a link to
# a target "n_features_in". The docstring itself is fixed after the move; then
# this hook goes.
def _quote_trailing_underscore_shape(app, what, name, obj, options, lines):
    lines[:] = [s.replace("(n_features_in_,)", "(``n_features_in_``,)") for s in lines]


def setup(app):
    app.connect("autodoc-process-docstring", _quote_trailing_underscore_shape)
