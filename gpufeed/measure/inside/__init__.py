"""Measurement inside the training process: the probe and how it gets there without code changes."""
