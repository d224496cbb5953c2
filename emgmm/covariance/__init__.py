"""The covariance types: parameterisation, log-density and statistics kernels, M step."""
