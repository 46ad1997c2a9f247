"""Things that measure: inside the training process (probe) and outside it (sampler)."""
