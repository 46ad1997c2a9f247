"""Measurements taken from outside the training process: host CPU, memory, process tree, GPUs."""
