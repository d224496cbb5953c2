"""The execution settings' docstrings have one source
(``emgmm._mixture.parameter_docs.EXECUTION_SETTINGS``): every estimator that takes a
setting documents it with that paragraph, and no marker is left unfilled."""

import inspect

import pytest

from emgmm import BayesianGaussianMixture, GaussianMixture, GaussianMixtureIC
from emgmm._mixture.parameter_docs import EXECUTION_SETTINGS, fill_parameter_docs

ESTIMATORS = (GaussianMixture, BayesianGaussianMixture, GaussianMixtureIC)


@pytest.mark.parametrize("estimator", ESTIMATORS, ids=lambda e: e.__name__)
def test_each_setting_is_documented_from_the_one_source(estimator):
    if estimator.__doc__ is None:
        pytest.skip("docstrings stripped (python -OO)")
    params = inspect.signature(estimator).parameters
    settings = [name for name in EXECUTION_SETTINGS if name in params]
    assert len(settings) >= 8
    for name in settings:
        description = EXECUTION_SETTINGS[name].partition("\n")[2]
        indented = "\n".join("    " + line for line in description.split("\n"))
        assert f"\n    {name} : " in estimator.__doc__
        assert indented in estimator.__doc__, name
    assert "%(" not in estimator.__doc__


def test_a_marker_or_extra_of_no_setting_is_refused():
    class Documented:
        """Doc.

        Parameters
        ----------
        %(block_size)s
        """

    filled = fill_parameter_docs(block_size="Its own words.")(Documented)
    assert "Rows per block; overrides ``working_memory``.\n" in filled.__doc__
    assert filled.__doc__.endswith("            Its own words.\n        ")

    class Unknown:
        """%(no_such_setting)s"""

    with pytest.raises(KeyError, match="no_such_setting"):
        fill_parameter_docs()(Unknown)
    with pytest.raises(KeyError, match="no %\\(name\\)s marker for \\['n_jobs'\\]"):
        fill_parameter_docs(n_jobs="Words.")(Documented)
