"""The examples of the public docstrings run as doctests, and they pass.

Only the public names (``emgmm.__all__``) are collected: their Examples sections
are part of the documentation (docs/api.rst) and must stay true.
"""

import doctest

import pytest

import emgmm

PUBLIC = sorted(name for name in emgmm.__all__ if name != "__version__")


def _doctests(name):
    finder = doctest.DocTestFinder(exclude_empty=True)
    return [t for t in finder.find(getattr(emgmm, name), f"emgmm.{name}", globs={})
            if t.examples]


@pytest.mark.parametrize("name", PUBLIC)
def test_public_docstring_examples_pass(name):
    runner = doctest.DocTestRunner(
        optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    )
    for test in _doctests(name):
        runner.run(test)
    assert runner.failures == 0, f"{runner.failures} failing example(s) in emgmm.{name}"


def test_estimator_has_examples():
    examples = sum(len(t.examples) for t in _doctests("GaussianMixture"))
    assert examples >= 3
