"""Offload the training DataLoader to a Ray cluster, without changing the script (docs/offload.md).

- ``settings``: what ``--offload ray [--ray-address ADDR]`` asks for, carried in the environment;
- ``hook``: inside the training process, the training loader's iterators become ``RayBatches``;
- ``iterator``: ``RayBatches``, the batches in the sampler's order, exactly once, with backpressure
  and the fall-back to local workers; ``pinning``: pinning them off the loop's thread;
- ``driver``: the process (or thread) holding the Ray connection, so the training outlives the
  cluster; ``feeder``: what it runs, the batches made by the pool's workers, with retries;
- ``ray_engine``: joining or starting Ray, and the pool of workers; ``remote``: what runs on them;
- ``payload``: what is sent to them, and naming the part that cannot be;
- ``sizing``: how many cores the GPU needs, from a diagnosed run.
"""
from gpufeed.offload.errors import OffloadError
from gpufeed.settings import ENV_OFFLOAD, OffloadSettings

__all__ = ["ENV_OFFLOAD", "OffloadError", "OffloadSettings"]
