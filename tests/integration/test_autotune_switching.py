"""Exactly once, provably: every sample index a SwitchingLoader delivers, with switches at every
possible point, against a plain DataLoader run with the same seed (real worker processes, on CPU).

Each run also reads the main process's random stream after every epoch: a switch must leave it as
the plain run leaves it, or later epochs' shuffles (and the user's own draws) would differ.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, DistributedSampler, IterableDataset, get_worker_info

from gpufeed.autotune.switching import SwitchingLoader, normalized, worker_died
from gpufeed.settings import LoaderSettings

from tests.paths import REPO


ROOT = REPO
SEED = 1234
EPOCHS = 2


class Indexed(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


class WorkerSeeds(Indexed):
    """Each item with the torch seed of the process that made it: a worker's seed is base_seed + id."""

    def __getitem__(self, i: int) -> tuple[int, int]:
        return i, torch.initial_seed() % 100_003


class Sharded(IterableDataset):
    """Split between workers by get_worker_info(), as the torch docs show."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(start, self.n, step))


class EagerRandomBatches:
    """A custom batch sampler that shuffles from the global generator when iter() is called (not
    lazily, as a generator would): the draw comes before the DataLoader's base seed."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        order = torch.randperm(self.n).tolist()
        sizes = [3, 1, 4, 2, 5]
        batches, at = [], 0
        for k in range(len(order)):
            size = sizes[k % len(sizes)]
            if at >= len(order):
                break
            batches.append(order[at:at + size])
            at += size
        return iter(batches)

    def __len__(self) -> int:
        return len(list(iter(self)))


class DiesAtThreeWorkers(Indexed):
    """A worker of a three-worker pool kills itself at one index, as the OOM killer would."""

    def __getitem__(self, i: int) -> int:
        info = get_worker_info()
        if info is not None and info.num_workers == 3 and i == 7:
            os.kill(os.getpid(), signal.SIGKILL)
        return i


def _items(batch) -> list:
    if isinstance(batch, (list, tuple)):  # (indices, seeds): one pair per sample
        return list(zip(*(t.tolist() for t in batch)))
    return [batch] if isinstance(batch, int) else batch.tolist()


def _run(loader, epochs: int = EPOCHS, switches: dict | None = None, set_epoch: bool = False):
    """(batches per epoch, a main-process draw after each epoch). ``switches`` maps (epoch, k) to
    settings requested just before the k-th ``next()`` of that epoch (k=0: right after iter(), while
    the workers start)."""
    switches = switches or {}
    epochs_out, draws = [], []
    for epoch in range(epochs):
        if set_epoch:
            loader.sampler.set_epoch(epoch)
        batches, it, k = [], iter(loader), 0
        while True:
            if (epoch, k) in switches:
                loader.request(switches[(epoch, k)])
            try:
                batch = next(it)
            except StopIteration:
                break
            batches.append(_items(batch))
            k += 1
        epochs_out.append(batches)
        draws.append(torch.randint(0, 2 ** 31, (1,)).item())
    return epochs_out, draws


def _plain(make, **kw):
    torch.manual_seed(SEED)
    return _run(make(), **kw)


def _switched(make, switches=None, **kw):
    torch.manual_seed(SEED)
    loader = SwitchingLoader(make())
    try:
        return _run(loader, switches=switches, **kw), loader
    finally:
        loader.close()


W1 = LoaderSettings(num_workers=1, prefetch_factor=3)
W0 = LoaderSettings(num_workers=0)
W3P = LoaderSettings(num_workers=3, prefetch_factor=1, persistent_workers=True)


def _shuffled(n=22, batch_size=4, **kw):
    return lambda: DataLoader(Indexed(n), batch_size=batch_size, shuffle=True, num_workers=2, **kw)


def test_no_switch_is_the_plain_run_including_worker_seeds():
    make = lambda: DataLoader(WorkerSeeds(12), batch_size=3, shuffle=True, num_workers=2)
    (batches, draws), _ = _switched(make)
    assert (batches, draws) == _plain(make)
    seeds = {seed for epoch in batches for batch in epoch for _, seed in batch}
    assert len(seeds) == 2 * EPOCHS  # two workers per epoch, fresh base seed each epoch


class Switches:
    """A listener that only notes where each switch happened."""

    def __init__(self) -> None:
        self.where: list[str] = []

    def on_batch(self, *args):
        return None

    def on_switch(self, old, new, where, t) -> None:
        self.where.append(where)

    def on_epoch(self, epoch) -> None:
        pass


def test_the_listener_hears_each_epochs_end_after_its_last_batch():
    """``on_epoch_end`` once the loop asked past an epoch's last batch (a switch inside it included),
    before the next epoch's ``on_epoch``: the controller leaves the loop's time between them
    (evaluation, checkpoints) out of its period."""
    heard: list = []

    class Heard(Switches):
        def on_batch(self, *args):
            heard.append("batch")

        def on_epoch(self, epoch) -> None:
            heard.append(("epoch", epoch))

        def on_epoch_end(self) -> None:
            heard.append("end")

    torch.manual_seed(SEED)
    loader = SwitchingLoader(_shuffled(batch_size=4, drop_last=True)(), listener=Heard())
    try:
        _run(loader, switches={(0, 2): W1})
    finally:
        loader.close()
    assert heard == [("epoch", 1), *["batch"] * 5, "end", ("epoch", 2), *["batch"] * 5, "end"]


@pytest.mark.parametrize("at", range(0, 13))
def test_a_mid_epoch_switch_at_every_point(at):
    """22 samples, batches of 2 with drop_last: 11 batches; k=0 is while the workers start, k=10
    before the last batch, k=11 after it, k=12 after the epoch ended (then at the next one's start).
    Once the old pool has taken the last batches of the order, the switch waits for the next epoch."""
    make = _shuffled(batch_size=2, drop_last=True)
    switches = {(0, at): W1, (1, at): W3P, (1, at + 1): W0}
    torch.manual_seed(SEED)
    loader = SwitchingLoader(make(), listener=Switches())
    try:
        batches, draws = _run(loader, switches=switches)
    finally:
        loader.close()
    assert (batches, draws) == _plain(make)
    assert [len(b) for b in batches] == [11, 11]
    assert loader.samples_delivered == 2 * 11 * 2
    if at <= 5:  # the first pool (2 workers x prefetch 2) has not taken the whole order yet
        assert loader.listener.where[:2] == ["mid-epoch", "mid-epoch"]


def test_every_sample_once_without_drop_last():
    make = _shuffled(n=23, batch_size=5)
    (batches, draws), loader = _switched(make, {(0, 1): W1, (0, 2): W0, (0, 3): W3P, (1, 2): W1})
    assert (batches, draws) == _plain(make)
    assert sorted(i for b in batches[0] for i in b) == list(range(23))
    assert loader.samples_delivered == 2 * 23


def test_persistent_workers_as_the_users_setting():
    make = _shuffled(persistent_workers=True)
    (batches, draws), _ = _switched(make, {(0, 2): W1, (1, 0): LoaderSettings(num_workers=2, persistent_workers=True)},
                                    epochs=3)
    assert (batches, draws) == _plain(make, epochs=3)


def test_distributed_sampler():
    make = lambda: DataLoader(Indexed(30), batch_size=4, num_workers=2,
                              sampler=DistributedSampler(Indexed(30), num_replicas=2, rank=1, shuffle=True, seed=7))
    (batches, draws), _ = _switched(make, {(0, 1): W0, (1, 3): W3P}, set_epoch=True)
    assert (batches, draws) == _plain(make, set_epoch=True)
    assert batches[0] != batches[1]  # set_epoch reshuffled through the wrapper


def test_custom_batch_sampler_drawing_before_the_base_seed():
    make = lambda: DataLoader(Indexed(17), batch_sampler=EagerRandomBatches(17), num_workers=2)
    (batches, draws), _ = _switched(make, {(0, 2): W1, (1, 0): W0, (1, 4): W3P})
    assert (batches, draws) == _plain(make)


def test_batch_size_none_and_main_process_loading():
    make = lambda: DataLoader(Indexed(9), batch_size=None, shuffle=True, num_workers=0)
    (batches, draws), loader = _switched(make, {(0, 3): W1, (1, 5): W0})
    assert (batches, draws) == _plain(make)
    assert loader.samples_delivered == 18


def test_iterable_dataset_switches_only_at_epoch_boundaries_and_keeps_its_workers():
    make = lambda: DataLoader(Sharded(20), batch_size=3, num_workers=2)
    switches = {(0, 2): LoaderSettings(num_workers=3, prefetch_factor=4), (1, 0): LoaderSettings(prefetch_factor=1)}
    (batches, draws), loader = _switched(make, switches, epochs=3)
    assert (batches, draws) == _plain(make, epochs=3)
    assert loader.settings.num_workers == 2  # the worker count decides which items come: never changed
    assert loader.settings.prefetch_factor == 1 and loader.switches == 2  # at epochs 2 and 3's starts


def test_a_worker_killed_mid_epoch_loses_nothing_after_backing_off():
    make = lambda: DataLoader(DiesAtThreeWorkers(24), batch_size=2, num_workers=2)
    (batches, draws), loader = _switched(make, {(0, 1): LoaderSettings(num_workers=3)})
    assert (batches, draws) == _plain(make)
    assert loader.settings == loader.user  # backed off to the user's own settings


def test_a_worker_killed_at_the_users_own_settings_raises_as_a_plain_run_does():
    """torch says "DataLoader worker (pid N) is killed by signal", or, when the kill lands just after
    the worker queued a batch, re-raises the ConnectionResetError of fetching it: either is what a
    plain run raises, and neither is swallowed. In a process of its own: torch's SIGCHLD handler can
    raise its error a moment after the first, in whatever code runs then (CI: inside pytest.raises'
    own exit), so the process's last words are what a plain run would end with."""
    child = textwrap.dedent("""
        from torch.utils.data import DataLoader
        from gpufeed.autotune.switching import SwitchingLoader
        from tests.integration.test_autotune_switching import DiesAtThreeWorkers
        loader = SwitchingLoader(DataLoader(DiesAtThreeWorkers(24), batch_size=2, num_workers=3))
        try:
            list(loader)
        finally:
            loader.close()
        print("delivered every batch")
    """)
    ran = subprocess.run([sys.executable, "-c", child], cwd=ROOT, capture_output=True, text=True, timeout=120)
    last = ran.stderr.strip().splitlines()[-1] if ran.stderr.strip() else ""
    assert ran.returncode != 0 and "delivered every batch" not in ran.stdout, ran.stdout
    said = last.partition(": ")[2]  # torch: "... is killed by signal: Killed." or "... exited unexpectedly"
    assert (last.startswith("RuntimeError:") and worker_died(RuntimeError(said))) \
        or last.startswith("ConnectionResetError:"), ran.stderr[-2000:]


class _Workers:
    def __init__(self, *alive: bool) -> None:
        self._workers = [type("P", (), {"is_alive": lambda self, a=a: a})() for a in alive]


def test_a_connection_error_is_a_death_only_when_a_worker_is_gone():
    assert worker_died(RuntimeError("DataLoader worker (pid 7) is killed by signal: Killed."))
    assert not worker_died(RuntimeError("Caught ValueError in DataLoader worker process 0."))
    assert worker_died(ConnectionResetError(104, "Connection reset by peer"), _Workers(True, False))
    assert not worker_died(ConnectionResetError(104, "Connection reset by peer"), _Workers(True, True))
    assert not worker_died(ConnectionResetError(104, "Connection reset by peer"))   # no pool to look at
    assert not worker_died(ValueError("the dataset's own"), _Workers(False))


class _ToldWhileWaiting:
    """A pool whose death torch's SIGCHLD handler reports (raising) while the autotuner waits for it."""

    def __init__(self, told: RuntimeError) -> None:
        self.told, self.calls = told, 0
        self._workers = [self]

    def is_alive(self) -> bool:
        self.calls += 1
        if self.calls == 2:
            raise self.told
        return True


def test_torchs_own_word_of_a_death_while_waiting_for_it_is_that_death():
    reset = ConnectionResetError(104, "Connection reset by peer")
    assert worker_died(reset, _ToldWhileWaiting(RuntimeError("DataLoader worker (pid 9) is killed by signal: Killed.")))
    with pytest.raises(RuntimeError, match="something else"):  # not torch's word of a death: not swallowed
        worker_died(reset, _ToldWhileWaiting(RuntimeError("something else")))


def test_settings_are_spelled_one_way():
    user = LoaderSettings(num_workers=2, prefetch_factor=2, persistent_workers=False, pin_memory=False)
    assert normalized(LoaderSettings(num_workers=0, prefetch_factor=4), user) == normalized(LoaderSettings(num_workers=0), user)
    assert normalized(LoaderSettings(), user) == user


def test_each_new_pool_times_the_fork_of_its_workers_and_a_kept_pool_does_not():
    """``spawn_s``: starting a pool, per worker, timed when workers are forked (an epoch's non-persistent
    pool, a switch's new one) and left as it was when a persistent pool is only reset."""
    loader = SwitchingLoader(_shuffled(n=40)())
    try:
        assert loader.spawn_s is None
        it = iter(loader)
        first = loader.spawn_s
        assert first is not None and 0 < first < 1.0  # one fork of this process: milliseconds
        next(it)
        loader.request(W3P)
        next(it)  # the switch: a pool of 3 persistent workers forked now
        switched = loader.spawn_s
        assert switched is not None and switched != first
        list(it)
        loader.spawn_s = None
        list(iter(loader))  # the next epoch resets the persistent pool: nothing forked
        assert loader.spawn_s is None
        loader.request(W0)
        list(iter(loader))  # no workers: nothing forked
        assert loader.spawn_s is None
    finally:
        loader.close()


class Pools(Switches):
    """Notes where each switch happened and the worker processes running right after it."""

    def __init__(self) -> None:
        super().__init__()
        self.loader = None
        self.pids: list[list[int]] = []

    def on_batch(self, *args):
        if len(self.pids) < len(self.where):
            self.pids.append(self.loader.worker_pids())
        return None


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("at", [0, 1, 3, 5, 7])
def test_a_prefetch_only_switch_changes_the_running_pool_in_place(at, persistent):
    """Deeper, then shallower, mid-epoch: the same workers go on (no pool forked), the batches are the
    plain run's, the batches in flight reach the deeper depth at once, and fall to the shallower one
    by deliveries, with nothing sent meanwhile (torch refuses to send more than its depth)."""
    make = _shuffled(n=64, batch_size=2, persistent_workers=persistent)   # 32 batches, 2 workers x 2
    deep, shallow = (LoaderSettings(num_workers=2, prefetch_factor=f, persistent_workers=persistent) for f in (5, 1))
    torch.manual_seed(SEED)
    listener = Pools()
    loader = listener.loader = SwitchingLoader(make(), listener=listener)
    depths = []
    try:
        epochs, draws, it = [], [], iter(loader)
        first_pool = loader.worker_pids()
        for epoch in range(EPOCHS):
            batches, k = [], 0
            if epoch:
                it = iter(loader)
            for k in range(10 ** 6):
                if (epoch, k) == (0, at):
                    loader.request(deep)
                if (epoch, k) == (0, at + 8):
                    loader.request(shallow)
                try:
                    batch = next(it)
                except StopIteration:
                    break
                live = loader._live.current
                if epoch == 0:
                    depths.append((loader.settings.prefetch_factor, len(live._task_info)))  # sent, not delivered
                batches.append(_items(batch))
            epochs.append(batches)
            draws.append(torch.randint(0, 2 ** 31, (1,)).item())
    finally:
        loader.close()
    assert (epochs, draws) == _plain(make, epochs=EPOCHS)
    assert listener.where == ["mid-epoch, in place"] * 2
    assert listener.pids[0] == listener.pids[1] == first_pool and len(first_pool) == 2  # no pool started
    deep = [n for f, n in depths if f == 5]
    assert deep[0] == 10  # raised at once: 2 workers x 5
    # lowered: one fewer in flight per delivery, none sent, down to 2 workers x 1, then 2 while the order lasts
    shallow = [n for f, n in depths[len(deep):] if f == 1]
    assert shallow[0] == deep[-1] - 1 and shallow == sorted(shallow, reverse=True)
    assert 2 in shallow and max(shallow[shallow.index(2):]) == 2


def test_a_prefetch_only_switch_at_an_epoch_start_keeps_the_persistent_pool():
    """Requested between epochs: the persistent pool is kept (same workers) and its next reset sends
    the new depth; the batches are the plain run's."""
    make = _shuffled(n=40, batch_size=2, persistent_workers=True)
    torch.manual_seed(SEED)
    listener = Pools()
    loader = listener.loader = SwitchingLoader(make(), listener=listener)
    try:
        it = iter(loader)
        pool = loader.worker_pids()
        first = list(map(_items, it))
        draw0 = torch.randint(0, 2 ** 31, (1,)).item()
        loader.request(LoaderSettings(num_workers=2, prefetch_factor=4, persistent_workers=True))
        it = iter(loader)
        assert loader._live.current._tasks_outstanding == 8  # primed at 2 workers x 4
        second = list(map(_items, it))
        draw1 = torch.randint(0, 2 ** 31, (1,)).item()
    finally:
        loader.close()
    assert ([first, second], [draw0, draw1]) == _plain(make, epochs=2)
    assert listener.where == ["epoch start"] and listener.pids[0] == pool


def test_no_torch_warning_for_a_worker_count_the_search_chose():
    """torch warns when ``num_workers`` exceeds the cores; for a count the search chose (and measured)
    that warning is noise in the user's log, twice per switch. The user's own loader still warns."""
    import warnings
    many = (os.cpu_count() or 1) + 2
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        DataLoader(Indexed(8), num_workers=many)
        assert any("This DataLoader will create" in str(w.message) for w in said)  # torch's own check
        said.clear()
        loader = SwitchingLoader(_shuffled(n=40)())
        try:
            it = iter(loader)
            next(it)
            loader.request(LoaderSettings(num_workers=many, persistent_workers=True))
            list(it)
            list(iter(loader))
        finally:
            loader.close()
    assert loader.settings.num_workers == many
    assert not [w for w in said if "This DataLoader will create" in str(w.message)]
