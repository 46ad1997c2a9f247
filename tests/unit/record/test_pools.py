"""``record/pools.py``: which iterators of an autotuned run are pools that continue an epoch."""
from __future__ import annotations

from types import SimpleNamespace

from gpufeed.record.pools import file_pools


def _iterator(iter_id: int, t_created: float):
    return SimpleNamespace(pid=1, iter_id=iter_id, t_created=t_created, loader_id=7,
                           config=SimpleNamespace(site="train.py:12"))


def test_a_prefetch_change_in_place_starts_no_pool():
    """A switch that only changed the running pool's prefetch_factor created no iterator: the next
    epoch's iterator, created after it, is an epoch of its own, not a pool continuing the last one."""
    epochs = [_iterator(0, 0.0), _iterator(1, 5.0)]
    in_place = {"action": "switch", "pid": 1, "t": 2.0, "where": "mid-epoch, in place"}
    assert file_pools(epochs, [in_place]) == epochs
