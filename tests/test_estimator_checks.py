"""scikit-learn's estimator checks for emgmm.GaussianMixture.

The default estimator and one instance per covariance type (with two components, so
that the multi-component code paths run) go through every check of
``parametrize_with_checks``. No check is expected to fail: ``EXPECTED_FAILED_CHECKS`` is
empty. If a check ever cannot apply, list it there with its reason (the dict is passed
as ``expected_failed_checks``, which marks those checks xfail with that reason).
"""

from sklearn.utils.estimator_checks import parametrize_with_checks

from emgmm import GaussianMixture

COVARIANCE_TYPES = ("full", "tied", "diag", "spherical")

ESTIMATORS = [GaussianMixture()] + [
    GaussianMixture(n_components=2, covariance_type=ct) for ct in COVARIANCE_TYPES
]

# check name -> reason. Empty: every check applies to a drop-in GaussianMixture.
EXPECTED_FAILED_CHECKS: dict[str, str] = {}


def _expected_failed_checks(estimator):
    return dict(EXPECTED_FAILED_CHECKS)


@parametrize_with_checks(ESTIMATORS, expected_failed_checks=_expected_failed_checks)
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)
