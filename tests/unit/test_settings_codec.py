"""The one codec that carries settings from the runner to the training process (``gpufeed/settings.py``)."""
from __future__ import annotations

import pytest

from gpufeed.settings import (ENV_AUTOTUNE, ENV_LOADER_OVERRIDES, ENV_OFFLOAD, AutotuneSettings, LoaderSettings,
                              OffloadSettings, Overrides, env_of, read_env)


@pytest.mark.parametrize("settings", [
    Overrides(LoaderSettings(num_workers=3, persistent_workers=True), site="train.py:12", stack=("train.py:40",),
              role="train"),
    Overrides(LoaderSettings(num_workers=2), site="accelerate/data_loader.py:1100", role="train", origin="train.py:30"),
    AutotuneSettings(period_s=2.0, max_workers=8),
    OffloadSettings(address="127.0.0.1:6379", workers=4),
])
def test_every_kind_round_trips_through_its_one_variable(settings):
    env = env_of(settings)
    assert list(env) == [type(settings).ENV]
    assert read_env(type(settings), env) == settings
    assert read_env(type(settings), {}) is None


def test_the_variables_are_the_documented_ones():
    assert (Overrides.ENV, AutotuneSettings.ENV, OffloadSettings.ENV) == (
        "GPUFEED_LOADER_OVERRIDES", "GPUFEED_AUTOTUNE", "GPUFEED_OFFLOAD") == (
        ENV_LOADER_OVERRIDES, ENV_AUTOTUNE, ENV_OFFLOAD)


def test_autotune_on_off_and_options():
    assert read_env(AutotuneSettings, {ENV_AUTOTUNE: "1"}) == AutotuneSettings()
    assert read_env(AutotuneSettings, {ENV_AUTOTUNE: "0"}) is None
    assert env_of(AutotuneSettings()) == {ENV_AUTOTUNE: "1"}
    assert read_env(AutotuneSettings, {ENV_AUTOTUNE: '{"period_s": 1.5}'}).options() == {"period_s": 1.5}


@pytest.mark.parametrize("cls, text, said", [
    (Overrides, "{not json", "GPUFEED_LOADER_OVERRIDES is not valid JSON"),
    (AutotuneSettings, '{"speed": 2}', "GPUFEED_AUTOTUNE: known options: period_s, min_batches, max_workers"),
    (OffloadSettings, "[1]", "GPUFEED_OFFLOAD must be a JSON object"),
])
def test_a_bad_value_names_its_variable(cls, text, said):
    with pytest.raises(ValueError, match=said):
        read_env(cls, {cls.ENV: text})


@pytest.mark.parametrize("settings, label", [
    # A --config of prefetch_factor alone said "applied as is" (issue 31): it names what it sets, and
    # that it acts only where the script's own loader has workers.
    (LoaderSettings(prefetch_factor=4), "p4 (only with workers)"),
    (LoaderSettings(persistent_workers=True, worker_threads=1, pin_memory=True),
     "persistent t1 (only with workers) pinned"),
    (LoaderSettings(num_workers=8, prefetch_factor=4, persistent_workers=True, pin_memory=True, worker_threads=1),
     "w8 p4 persistent pinned t1"),
    (LoaderSettings(num_workers=0, prefetch_factor=4), "w0"),   # torch refuses a prefetch without workers
    (LoaderSettings(), "as is"),
])
def test_a_label_names_every_setting_that_acts(settings, label):
    assert settings.label() == label
