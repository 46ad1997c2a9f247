"""Offloading the training DataLoader to Ray (gpufeed/offload/): the parts that need no cluster.

Settings through the environment, the options' checks before anything runs (Ray missing, an
unreachable cluster: one sentence, exit 3, the command never started), naming the part of a dataset
that cannot be pickled, the pool's round robin, and the sizing of cores. Runs on a real Ray are in
tests/integration/test_offload_ray.py (one process) and tests/integration/test_offload_cluster.py (two nodes).
"""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from gpufeed import cli
from gpufeed import thresholds as th
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
    base = dict(cpu_count=2, loader_cpu_bound_samples_per_s=100.0, compute_per_batch_ms=40.0, steps=100, samples=3200,
                samples_per_s=100.0)
    return SimpleNamespace(**{**base, **kw})


def test_cores_needed_from_the_what_if_model_first():
    from gpufeed.analysis.offload_sizing import FROM_MODEL, cores_needed
    best = SimpleNamespace(samples_per_s=100.0, high=112.0)  # the best local setting, with its range
    model = SimpleNamespace(cannot_predict=None, cores_for_ceiling=9, best=best, ceiling_samples_per_s=800.0)
    needed = cores_needed(_metrics(), model, ["python", "t.py"])
    assert (needed.cores, needed.host_cores, needed.source) == (9, 2, FROM_MODEL)
    assert needed.command == "gpufeed run --offload ray --ray-address ADDRESS --ray-workers 9 -- python t.py"
    assert "needs 9 cores" in needed.sentence() and needed.command in needed.sentence()
    # The model says these cores already reach the ceiling: nothing to offload.
    assert cores_needed(_metrics(), SimpleNamespace(cannot_predict=None, cores_for_ceiling=None), []) is None
    # A ceiling 1.4x the best local setting: not worth a cluster (OFFLOAD_ADVICE_MIN_GAIN).
    close = SimpleNamespace(cannot_predict=None, cores_for_ceiling=3, best=best, ceiling_samples_per_s=140.0)
    assert cores_needed(_metrics(), close, []) is None


def test_cores_needed_from_cpu_per_sample_and_step_time_without_the_model():
    from gpufeed.analysis.offload_sizing import FROM_RATES, cores_needed
    # 2 cores make 100 samples/s: 20 ms of CPU a sample; the step takes 32 samples in 40 ms: 800
    # samples/s, so 16 cores.
    needed = cores_needed(_metrics(), SimpleNamespace(cannot_predict="too few steps"), ["python", "t.py"])
    assert (needed.cores, needed.source) == (16, FROM_RATES)
    assert cores_needed(_metrics(compute_per_batch_ms=1000.0), None, []) is None  # 2 cores keep up
    assert cores_needed(_metrics(loader_cpu_bound_samples_per_s=None), None, []) is None  # not measured: silent
    # The step alone would be 1.25x the measured rate: not worth a cluster.
    assert cores_needed(_metrics(samples_per_s=640.0), None, []) is None


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
    """Under torchrun without --ray-address each rank would start its own local Ray: the loader is not
    offloaded, and rank 0 says why, once, when the probe installs. With an address, each rank offloads."""
    from gpufeed.measure.inside import dataloader_hook
    from gpufeed.offload import hook
    monkeypatch.setenv(*next(iter(OffloadSettings().to_env().items())))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", rank)
    hook.install_from_env()
    assert hook._state is None and not any(isinstance(p, hook._Offload) for p in dataloader_hook.providers())
    err = capsys.readouterr().err
    assert err.count("--offload is off: this job has 2 ranks and no --ray-address") == (1 if said else 0)
    for name, value in (("WORLD_SIZE", "1"),  # one rank: offloaded as ever
                        (*next(iter(OffloadSettings(address="127.0.0.1:6379").to_env().items())),)):  # a cluster
        monkeypatch.setenv(name, value)
        try:
            hook.install_from_env()
            assert hook._state is not None and hook._state in dataloader_hook.providers()
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


class _FakeRay:
    """Just enough of Ray for ``Pool``: actors whose start is decided by ``starts`` (the n-th actor asked
    for starts, or its creation is lost), a ``kill`` that blocks forever on an actor that never started
    (as Ray 2.60's waits for the registration that never comes), and a clock-free ``wait``."""

    class exceptions:
        RayError = Exception

    def __init__(self, starts, free_cpus: int) -> None:
        import threading
        self.starts, self.free_cpus, self.asked, self.killed = list(starts), free_cpus, [], []
        self._never = threading.Event()
        self.cloudpickle = SimpleNamespace(register_pickle_by_value=lambda module: None)

    def new_actor(self):
        n = len(self.asked)
        actor = SimpleNamespace(n=n, started=self.starts[n] if n < len(self.starts) else True)
        actor.ready = SimpleNamespace(remote=lambda: ("ready", n))
        self.asked.append(actor)
        return actor

    def wait(self, refs, num_returns, timeout):
        ready = [r for r in refs if self.asked[r[1]].started]
        if len(ready) < num_returns:
            time.sleep(min(timeout, 0.02))
        return ready, [r for r in refs if r not in ready]

    def get(self, ref):
        return f"node{ref[1] % 2}", 100 + ref[1]

    def available_resources(self):
        return {"CPU": self.free_cpus}

    def kill(self, actor):
        if not actor.started:
            self._never.wait()  # never returns: the caller must not wait for it
        self.killed.append(actor.n)


def _fake_pool(monkeypatch, fake: _FakeRay, stuck_s: float = 0.05):
    from gpufeed.offload import ray_engine
    monkeypatch.setattr(th, "OFFLOAD_STUCK_START_S", stuck_s)
    monkeypatch.setattr(ray_engine, "_batch_maker",
                        lambda ray: SimpleNamespace(options=lambda **kw: SimpleNamespace(remote=fake.new_actor)))


def test_a_worker_whose_start_was_lost_is_asked_for_again_when_a_cpu_is_free(monkeypatch):
    fake = _FakeRay(starts=[False, True, True], free_cpus=1)
    _fake_pool(monkeypatch, fake)
    t0 = time.monotonic()
    pool = Pool.start(fake, 2, timeout_s=5.0)
    assert [s.ready for s in pool.slots] == [True, True] and len(fake.asked) == 3  # actor 0 asked for again
    assert [s.worker_id for s in pool.slots] == [0, 1] and pool.slots[0].attempt == 1
    assert time.monotonic() - t0 < 2.0  # the kill of the lost one, which never returns, did not hold the start


def test_no_cpu_free_means_a_slow_start_not_a_lost_one(monkeypatch):
    """The cluster busy: the worker waits for a CPU, it is not asked for again (that would lose its place)."""
    fake = _FakeRay(starts=[True, False], free_cpus=0)
    _fake_pool(monkeypatch, fake)
    pool = Pool.start(fake, 2, timeout_s=0.5)
    assert len(fake.asked) == 2 and [s.ready for s in pool.slots] == [True, False] and pool.slots[1].lost


def test_the_wait_for_a_lost_start_doubles_at_each_new_attempt(monkeypatch):
    from gpufeed.offload.ray_engine import Slot
    monkeypatch.setattr(th, "OFFLOAD_STUCK_START_S", 10.0)
    slot = Slot(0, actor=None, ready_ref=None, asked_t=100.0)
    assert not slot.stuck(109.0) and slot.stuck(110.0)
    slot.attempt = 2
    assert not slot.stuck(139.0) and slot.stuck(140.0)


def test_closing_gives_a_starting_worker_time_to_start_before_it_is_killed(monkeypatch):
    """A worker killed while Ray places it kept its CPU: close waits for the start, then kills."""
    fake = _FakeRay(starts=[True, True], free_cpus=0)
    _fake_pool(monkeypatch, fake)
    pool = Pool.start(fake, 2, timeout_s=1.0)
    replacement = pool.replace(pool.slots[1])
    replacement_actor = replacement.actor
    replacement_actor.started = False
    waited = []
    real_wait = fake.wait

    def wait(refs, num_returns, timeout):
        if any(r[1] == replacement_actor.n for r in refs):
            waited.append(timeout)
            replacement_actor.started = True  # it starts while close waits for it
        return real_wait(refs, num_returns, timeout)
    fake.wait = wait
    pool.close()
    assert waited and replacement_actor.n in fake.killed and pool.slots == []
