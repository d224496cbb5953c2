"""The EM engine: passes over a source (both schedules), the E step, one EM run.

Imports no scikit-learn: worker processes unpickle its task functions.
"""
