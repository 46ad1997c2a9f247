"""The bundled demo: a small, plain PyTorch training script to point gpufeed at.

``python -m gpufeed.demo.train`` generates a few hundred JPEG images, then
trains a small CNN on them through a deliberately poor DataLoader
configuration (one worker, simulated network-storage latency per read), so
the run is clearly input-bound.  The script knows nothing about gpufeed.
"""
