"""Offloading the training DataLoader to Ray (gpufeed/offload/): the parts that need no cluster.

Settings through the environment, the options' checks before anything runs (Ray missing, an
unreachable cluster: one sentence, exit 3, the command never started), naming the part of a dataset
that cannot be pickled, the pool's round robin, and the sizing of cores. Runs on a real Ray are in
tests/test_offload_ray.py (one process) and tests/test_offload_cluster.py (two nodes).
"""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest

from gpufeed import cli
from gpufeed.offload import OffloadSettings, options, payload
from gpufeed.offload.ray_engine import Pool, Slot
from tests import needs


def test_settings_travel_through_the_environment():
    settings = OffloadSettings(address="10.0.0.1:6379", workers=8, lost_after_s=2.5)
    assert OffloadSettings.from_env(settings.to_env()) == settings
    assert OffloadSettings.from_env({}) is None
    with pytest.raises(ValueError, match="unknown offload engine 'spark'"):
        OffloadSettings.from_env({"GPUFEED_OFFLOAD": '{"engine": "spark"}'})
    with pytest.raises(ValueError, match="workers must be a positive"):
        OffloadSettings.from_env({"GPUFEED_OFFLOAD": '{"workers": 0}'})


def test_ray_address_without_offload_is_a_usage_error(capsys):
    assert cli.main(["run", "--ray-address", "127.0.0.1:6379", "--", sys.executable, "-c", "pass"]) == cli.EXIT_USAGE
    assert "--ray-address and --ray-workers go with --offload ray" in capsys.readouterr().err


def test_run_needs_a_config_or_offload(capsys):
    assert cli.main(["run", "--", sys.executable, "-c", "pass"]) == cli.EXIT_USAGE
    assert "give --config FILE" in capsys.readouterr().err


def _closed_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: nothing listens there


@pytest.mark.parametrize("verb", ["run", "diagnose"])
def test_unreachable_cluster_is_refused_before_the_command_starts(verb, tmp_path):
    needs.library("ray")  # without Ray, the missing library is what is said (next test)
    marker = tmp_path / "started"
    address = f"127.0.0.1:{_closed_port()}"
    args = ["--out", str(tmp_path / "run")] if verb == "diagnose" else []
    done = subprocess.run([sys.executable, "-m", "gpufeed", verb, "--offload", "ray", "--ray-address", address, *args,
                           "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == cli.EXIT_NOT_STARTED, done.stderr
    assert f"cannot reach the Ray cluster at {address}" in done.stderr
    assert "Traceback" not in done.stderr
    assert not marker.exists()  # the training never started


def test_ray_missing_is_one_sentence_with_the_install_command(monkeypatch, capsys):
    real = options.importlib.util.find_spec
    monkeypatch.setattr(options.importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    assert cli.main(["run", "--offload", "ray", "--", sys.executable, "-c", "pass"]) == cli.EXIT_NOT_STARTED
    err = capsys.readouterr().err
    assert "--offload ray needs Ray, which is not installed: pip install 'gpufeed[ray]'" in err


def test_ray_missing_inside_the_training_process(monkeypatch):
    from gpufeed.offload import ray_engine
    from gpufeed.offload.errors import OffloadError
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(OffloadError, match=r"needs Ray, which is not installed .*pip install 'gpufeed\[ray\]'"):
        ray_engine.import_ray()


class _Inner:
    def __init__(self) -> None:
        self.paths = ["a.jpg", "b.jpg"]
        self.lock = threading.Lock()


class _Dataset:
    def __init__(self) -> None:
        self.size = 2
        self.index = {"inner": _Inner()}


def test_the_part_that_cannot_be_pickled_is_named():
    path, value, why = payload.unpicklable(pickle.dumps, _Dataset(), "dataset")
    assert path == "dataset.index['inner'].lock"
    assert type(value).__name__ == "lock" and "pickle" in why
    assert payload.unpicklable(pickle.dumps, {"fine": [1, 2]}, "dataset") is None


def _slots(ready: list[bool]) -> list[Slot]:
    return [Slot(i, actor=f"actor{i}", ready_ref=i, ready=r) for i, r in enumerate(ready)]


def test_pool_sends_batch_k_to_worker_k_mod_n_as_torch_does_and_skips_lost_ones():
    pool = Pool(ray=SimpleNamespace(), size=3, slots=_slots([True, True, True]))
    assert [pool.pick(k).worker_id for k in range(6)] == [0, 1, 2, 0, 1, 2]
    pool.slots[1].lost = True
    assert [pool.pick(k).worker_id for k in range(4)] == [0, 2, 2, 0]  # 1 % 2 -> the second usable one
    for slot in pool.slots:
        slot.lost = True
    assert pool.pick(0) is None


def _metrics(**kw):
    base = dict(cpu_count=2, loader_cpu_bound_samples_per_s=100.0, compute_per_batch_ms=40.0, steps=100, samples=3200)
    return SimpleNamespace(**{**base, **kw})


def test_cores_needed_from_the_what_if_model_first():
    from gpufeed.offload.sizing import FROM_MODEL, cores_needed
    needed = cores_needed(_metrics(), SimpleNamespace(cannot_predict=None, cores_for_ceiling=9), ["python", "t.py"])
    assert (needed.cores, needed.host_cores, needed.source) == (9, 2, FROM_MODEL)
    assert needed.command == "gpufeed run --offload ray --ray-address ADDRESS --ray-workers 9 -- python t.py"
    assert "needs 9 cores" in needed.sentence() and needed.command in needed.sentence()
    # The model says these cores already reach the ceiling: nothing to offload.
    assert cores_needed(_metrics(), SimpleNamespace(cannot_predict=None, cores_for_ceiling=None), []) is None


def test_cores_needed_from_cpu_per_sample_and_step_time_without_the_model():
    from gpufeed.offload.sizing import FROM_RATES, cores_needed
    # 2 cores make 100 samples/s: 20 ms of CPU a sample; the step takes 32 samples in 40 ms: 800
    # samples/s, so 16 cores.
    needed = cores_needed(_metrics(), SimpleNamespace(cannot_predict="too few steps"), ["python", "t.py"])
    assert (needed.cores, needed.source) == (16, FROM_RATES)
    assert cores_needed(_metrics(compute_per_batch_ms=1000.0), None, []) is None  # 2 cores keep up
    assert cores_needed(_metrics(loader_cpu_bound_samples_per_s=None), None, []) is None  # not measured: silent


def test_the_users_own_modules_travel_by_value_to_nodes_without_them(tmp_path, monkeypatch):
    ray = needs.library("ray")
    (tmp_path / "mydata.py").write_text("class Pairs:\n    def __getitem__(self, i):\n        return (i, i * i)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import mydata
    try:
        payload.ship_user_code(ray)
        blob = ray.cloudpickle.dumps(mydata.Pairs())
    finally:
        ray.cloudpickle.unregister_pickle_by_value(mydata)
        sys.modules.pop("mydata", None)
    # Another interpreter, whose path lacks the script's directory, as a node of a cluster does.
    code = "import sys, ray.cloudpickle as c; print(c.loads(sys.stdin.buffer.read())[3])"
    done = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True, cwd="/", timeout=120)
    assert done.stdout.decode().strip() == "(3, 9)", done.stderr.decode()[-2000:]


@pytest.mark.parametrize("rank, said", [("0", True), ("1", False)])
def test_several_ranks_decline_with_one_sentence_before_training(monkeypatch, capsys, rank, said):
    """Under torchrun each rank would start its own local Ray (or take every CPU of the cluster for its
    own pool): the loader is not offloaded, and rank 0 says why, once, when the probe installs."""
    from torch.utils.data import dataloader

    from gpufeed.offload import hook
    before = dataloader.DataLoader._get_iterator
    monkeypatch.setenv(*next(iter(OffloadSettings().to_env().items())))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", rank)
    hook.install_from_env()
    assert dataloader.DataLoader._get_iterator is before and hook._state is None  # nothing armed
    err = capsys.readouterr().err
    assert err.count("--offload is off: this job has 2 ranks") == (1 if said else 0)
    monkeypatch.setenv("WORLD_SIZE", "1")  # one rank: offloaded as ever
    try:
        hook.install_from_env()
        assert getattr(dataloader.DataLoader._get_iterator, hook.MARK, None) is before
    finally:
        hook.uninstall()


def test_the_actor_class_is_made_once_per_process(monkeypatch):
    """Ray exports an actor class to the cluster (a GCS write) once per class object and job: every
    pool of the process uses the same one, so only the first pool's start writes it."""
    from gpufeed.offload import ray_engine
    made = []
    fake_ray = SimpleNamespace(remote=lambda **options: lambda cls: made.append((cls, options)) or object())
    monkeypatch.setattr(ray_engine, "_BATCH_MAKER", None)
    assert ray_engine._batch_maker(fake_ray) is ray_engine._batch_maker(fake_ray)
    assert [cls.__name__ for cls, _ in made] == ["BatchMaker"] and made[0][1]["num_cpus"] == 1
