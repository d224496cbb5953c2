"""The runtime: executor over joblib, BLAS limits, work buffers, the memory model."""
