"""Inputs and outputs: data sources, model files, checkpoints, atomic writes."""
