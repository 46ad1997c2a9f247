"""The one DataLoader hook: settings reach every loader class however it is built, once, and
providers see each moment in their order (``gpufeed/measure/inside/dataloader_hook.py``)."""
from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from gpufeed.measure.inside import dataloader_hook
from gpufeed.measure.inside.loader_tag import tag_of
from gpufeed.measure.inside.overrides import OverrideProvider
from gpufeed.settings import LoaderSettings, Overrides

DATA = TensorDataset(torch.arange(32.0).unsqueeze(1))


class DefinedBefore(DataLoader):
    """A subclass defined before the hook is installed, with an ``__init__`` of its own (**kwargs)."""

    def __init__(self, dataset, note="x", **kwargs):
        self.note = note
        super().__init__(dataset, **kwargs)


@pytest.fixture
def reports():
    """The hook with an override provider for 2 persistent workers; the override events it reports."""
    events: list[dict] = []
    provider = OverrideProvider(Overrides(LoaderSettings(num_workers=2, persistent_workers=True)),
                                report=lambda kind, **fields: events.append(dict(fields, kind=kind)))
    dataloader_hook.add(provider)
    try:
        yield events
    finally:
        dataloader_hook.uninstall()


def test_settings_reach_a_plain_loader_once(reports):
    loader = DataLoader(DATA, batch_size=4)
    assert (loader.num_workers, loader.persistent_workers) == (2, True)
    assert len(reports) == 1 and reports[0]["site"].endswith("test_dataloader_hook.py:" + str(_line_of("loader = DataLoader(DATA, batch_size=4)")))


def test_settings_reach_a_subclass_whose_init_never_calls_torchs(reports):
    """torchdata's StatefulDataLoader re-implements DataLoader.__init__ without calling it."""
    class OwnInit(DataLoader):
        def __init__(self, dataset, batch_size=1, num_workers=0, persistent_workers=False):
            # What StatefulDataLoader does: its own attributes, never DataLoader.__init__.
            self.dataset, self.batch_size = dataset, batch_size
            self.num_workers, self.persistent_workers = num_workers, persistent_workers

    loader = OwnInit(DATA, batch_size=4)
    assert (loader.num_workers, loader.persistent_workers) == (2, True)
    assert len(reports) == 1
    assert tag_of(loader).site.endswith(f":{_line_of('loader = OwnInit(DATA, batch_size=4)')}")


def test_a_subclass_calling_super_is_overridden_once_where_its_signature_takes_the_settings(reports):
    loader = DefinedBefore(DATA, note="y", batch_size=4)
    assert (loader.note, loader.num_workers, loader.persistent_workers) == ("y", 2, True)
    assert len(reports) == 1


def test_a_subclass_whose_signature_lacks_the_settings_is_overridden_in_torchs_init(reports):
    class FixedWorkers(DataLoader):
        def __init__(self, dataset):  # takes no num_workers: its own call to torch's passes 0
            super().__init__(dataset, batch_size=4, num_workers=0)

    loader = FixedWorkers(DATA)
    assert (loader.num_workers, loader.persistent_workers) == (2, True)
    assert len(reports) == 1
    # Noted where the user built it, not inside the subclass.
    assert tag_of(loader).site.endswith(f":{_line_of('loader = FixedWorkers(DATA)')}")


def test_gpufeeds_own_loaders_are_built_past_the_providers(reports):
    loader = dataloader_hook.build_plain(DataLoader, DATA, batch_size=4, num_workers=0)
    assert loader.num_workers == 0 and not reports and tag_of(loader).gpufeeds_own


def test_providers_see_iteration_in_their_order_and_may_stand_in():
    seen: list[str] = []

    class StandIn(dataloader_hook.Provider):
        order = 30

        def iterable(self, loader, tag, role):
            seen.append(f"iterable:{role}")
            return [1, 2, 3] if role == "train" else None

    class Watch(dataloader_hook.Provider):
        order = 90

        def made(self, loader, iterator, t_created, role):
            seen.append(f"made:{role[0]}")

    dataloader_hook.add(Watch())
    dataloader_hook.add(StandIn())
    try:
        assert [type(p).__name__ for p in dataloader_hook.providers()] == ["StandIn", "Watch"]
        loader = DataLoader(DATA, batch_size=4)
        assert list(loader) == [1, 2, 3]  # the stand-in, iterated in the loader's place
        with torch.no_grad():  # an evaluation pass: torch's own iterator, seen by the watcher
            assert len(list(loader)) == 8
        assert seen == ["iterable:train", "iterable:eval", "made:eval"]
    finally:
        dataloader_hook.uninstall()
    assert "__init_subclass__" not in DataLoader.__dict__ and not dataloader_hook.providers()


def _line_of(text: str) -> int:
    """The line of this file holding ``text`` (its first occurrence after the helpers above)."""
    lines = open(__file__).read().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line and "_line_of" not in line)
