"""Worker start-up each epoch, counted where it costs (issue 36.2): a loader whose workers start again
at every epoch, in ``iter(loader)`` (forking them) where no ``next()`` waits, so its data wait alone
stays under the search's 5%. Its live periods count the start-up as diagnose does (the input share:
waits plus iter(); the restart share: iter() plus each epoch's first batch), so the controller
searches and turns persistent workers on; a loader whose start-up is cheap is left alone."""
from __future__ import annotations

import time

import pytest

from gpufeed.autotune.controller import HOLD, Controller
from gpufeed.autotune.memory import HostMemory
from gpufeed.autotune.model import Period
from gpufeed.settings import LoaderSettings
from tests.unit.autotune.test_autotune_controller import SimulatedLoader

EPOCH = 40       # batches per epoch
STEP = 0.010     # the training step
WAIT = 0.0002    # next() with workers running


def run(iter_s: float, first_wait_s: float = 0.02, batches: int = 20_000) -> tuple[Controller, SimulatedLoader]:
    """The loop: each epoch starts with iter() (``iter_s`` unless persistent workers, 1 ms then) and a
    first batch that waits ``first_wait_s`` (unless persistent); every other batch waits 0.2 ms."""
    loader = SimulatedLoader(LoaderSettings(num_workers=2))
    controller = Controller(loader, period_s=2.0, min_batches=10, cpu_count=4, memory=HostMemory(lambda: (None, None)))
    t = 0.0
    for i in range(batches):
        settings = loader.settings
        persistent = bool(settings.persistent_workers)
        if i % EPOCH == 0:
            controller.on_epoch(i // EPOCH + 1)
            cost = 0.001 if persistent and i else iter_s
            t += cost
            controller.on_iter(cost)
        wait = first_wait_s if i % EPOCH == 0 and not persistent else WAIT
        t += wait
        request = t - wait
        wanted = controller.on_batch(request, t, 8, settings)
        t += STEP
        if wanted is not None:
            old, loader.settings = loader.settings, wanted
            controller.on_switch(old, wanted, "mid-epoch", t)
        if controller.settled is not None and controller._window is None and controller._asks.empty():
            break
        if any(e["action"] == HOLD for e in controller.events) and i > 2000:
            break
        time.sleep(0)
    return controller, loader


def test_a_period_counts_the_start_up_in_iter_as_the_input_pipelines_cost():
    s = LoaderSettings(num_workers=2, prefetch_factor=2, persistent_workers=False)
    p = Period(s, 400.0, 0.03, 0.5, 4.0, 200, startup_share=0.01, cores_used=1.0, main_cores=0.5,
               host_busy_cores=1.0, iter_share=0.30)
    assert p.input_share == pytest.approx(0.33) and p.restart_share == pytest.approx(0.31)
    m = p.facts(4, 200).metrics
    # diagnose's fields, filled as diagnose fills them: the fact functions read the same numbers
    from gpufeed.analysis.rules.facts import input_share, restart_share
    assert m.startup_in_iter_share == 0.30 and m.restart_wait_share == 0.01
    assert m.worker_startup_share == pytest.approx(0.31)
    assert input_share(m) == pytest.approx(0.33) and restart_share(m) == pytest.approx(0.31)
    assert Period.from_dict(p.to_dict()).iter_share == 0.30


def test_workers_started_again_each_epoch_get_persistent_workers():
    controller, loader = run(iter_s=0.3)
    assert not any(e["action"] == HOLD for e in controller.events)
    measured = [e["period"] for e in controller.events if e["action"] == "measured"]
    assert measured[0]["wait_share"] < 0.05 < measured[0]["iter_share"]   # what the wait alone missed
    assert controller.settled is not None and controller.settled.persistent_workers is True
    assert loader.settings.persistent_workers is True


def test_a_cheap_start_up_is_left_alone():
    controller, loader = run(iter_s=0.002, first_wait_s=0.001, batches=3000)
    assert any(e["action"] == HOLD for e in controller.events)
    assert loader.settings == loader.user
