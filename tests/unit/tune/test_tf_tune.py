"""``gpufeed tune`` for tf.data, without TensorFlow: the settings and the config file, how a trial's
pipeline is matched and checked (synthetic ``tf_pipeline`` events), and the search on synthetic
throughput curves. The end-to-end runs of a real TensorFlow script are in tests/integration/test_tf_tune_cli.py."""
from __future__ import annotations

import json

import pytest

from gpufeed.measure.inside.probe_config import ProbeConfig
from gpufeed.record import validate
from gpufeed.measure.inside.tf_overrides import PipelineOverrides, is_pipeline_config, parallel_calls
from gpufeed.settings import AUTOTUNE, PipelineSettings
from gpufeed.tune import tf_target
from gpufeed.tune.result import TuneResult, pipeline_paste_line
from gpufeed.tune.tf_search import AUTOTUNE_EVERYWHERE, PipelineSearch, pipeline_cheapness
from tests.unit.tune.test_tune_search import Workload, fake_diagnosis

# The training pipeline of tests/workloads/tf_tune_target.py as the probe records it: last stage first.
PIPELINE = {"pid": 1, "loader_id": 0, "options": {"deterministic": None},
            "stages": [{"op": "Batch", "batch_size": 16, "site": "t.py:40"},
                       {"op": "Map", "site": "t.py:39", "python_ops": ["PyFunc"]},
                       {"op": "Interleave", "cycle_length": 4, "site": "t.py:38"},
                       {"op": "Shuffle", "site": "t.py:37"}, {"op": "TensorSlice"}]}


# -- the settings and the config file ------------------------------------------------------------------
def test_settings_round_trip_and_labels():
    s = PipelineSettings(parallel_calls=AUTOTUNE, prefetch=4, deterministic=False, max_intra_op_parallelism=1)
    assert PipelineSettings.from_dict(s.to_dict()) == s
    assert s.label() == "parallel AUTOTUNE prefetch 4 unordered intra-op 1"
    assert PipelineSettings().label() == "as is"
    assert set(s.config_dict()) == {"parallel_calls", "prefetch", "deterministic", "private_threadpool_size",
                                    "max_intra_op_parallelism"}


@pytest.mark.parametrize("settings, message", [
    ({"num_workers": 4}, "unknown tf.data setting 'num_workers'"),
    ({"parallel_calls": 0}, "at least 1, or -1 for tf.data.AUTOTUNE"),
    ({"parallel_calls": -2}, "at least 1, or -1 for tf.data.AUTOTUNE"),
    ({"private_threadpool_size": -1}, "at least 1"),
    ({"prefetch": "8"}, "must be a whole number"),
    ({"deterministic": 0}, "must be true or false"),
    ({"parallel_calls": True}, "must be a whole number"),
])
def test_bad_settings_are_refused_by_name(settings, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        PipelineSettings.from_dict(settings)


def test_config_file_round_trip_through_the_probe_configuration():
    target = PipelineOverrides(PipelineSettings(parallel_calls=8, prefetch=AUTOTUNE), end="t.py:40",
                               stages=("t.py:39", "t.py:38"))
    data = json.loads(target.to_json())
    assert data["framework"] == "tensorflow" and is_pipeline_config(data)
    assert not is_pipeline_config({"format": "gpufeed.loader-settings/1", "settings": {"num_workers": 2}})
    # Carried to the command in the probe configuration, read back there as it was written.
    env = target.to_env()
    assert list(env) == ["GPUFEED_PIPELINE_OVERRIDES"]
    assert PipelineOverrides.from_json(ProbeConfig.from_env(env).pipeline_overrides) == target


@pytest.mark.parametrize("data, message", [
    ({"framework": "tensorflow", "settings": {"parallel_calls": 2}}, "site in"),
    ({"framework": "tensorflow", "site": "t.py:4", "stages": "t.py:3", "settings": {}}, "stages in"),
    ({"framework": "tensorflow", "site": "t.py:4", "setings": {}}, "unknown key 'setings'"),
    ({"format": "gpufeed.pipeline-settings/9", "site": "t.py:4"}, "has format"),
])
def test_bad_config_files_are_refused(data, message):
    with pytest.raises(ValueError, match=message):
        PipelineOverrides.from_dict(data)


# -- matching the training pipeline, and checking a trial ran with its settings --------------------------
def test_parallel_calls_per_stage():
    assert parallel_calls("map", {}, 8) == 8
    assert parallel_calls("interleave", {"cycle_length": 4}, 8) == 4       # never past the script's cycle
    assert parallel_calls("interleave", {"cycle_length": 4}, AUTOTUNE) == AUTOTUNE
    assert parallel_calls("interleave", {"cycle_length": None}, 8) == 8
    assert parallel_calls("batch", {"num_parallel_calls": None}, 8) is None  # a sequential batch stays so
    assert parallel_calls("batch", {"num_parallel_calls": 2}, 8) == 8


def test_target_is_the_training_pipelines_end_and_its_parallel_stages():
    target = tf_target.pipeline_target(PIPELINE)
    assert target.end == "t.py:40"
    assert target.stages == ("t.py:39", "t.py:38")  # the map and interleave; not the shuffle or the batch
    with pytest.raises(tf_target.PipelineNotLocated, match="no call site"):
        tf_target.pipeline_target({"stages": [{"op": "Prefetch"}, {"op": "ReincarnatedPerDeviceGenerator"}]})


def _ran(parallel, prefetch=None, deterministic=None):
    """The pipeline a trial records once its settings were applied."""
    stages = [{"op": "Batch", "batch_size": 16, "site": "t.py:40"},
              {"op": "ParallelMap", "num_parallel_calls": parallel, "site": "t.py:39"},
              {"op": "ParallelInterleave", "num_parallel_calls": parallel if parallel == AUTOTUNE else min(parallel, 4),
               "cycle_length": 4, "site": "t.py:38"}, {"op": "TensorSlice"}]
    if prefetch is not None:
        stages.insert(0, {"op": "Prefetch", "buffer_size": prefetch})
    if deterministic is not None:
        stages.insert(0, {"op": "Options", "site": "t.py:40"})
    return {"stages": stages, "options": {"deterministic": deterministic}}


def test_a_trial_is_checked_against_the_pipeline_it_ran():
    target = tf_target.pipeline_target(PIPELINE)
    settings = PipelineSettings(parallel_calls=8, prefetch=AUTOTUNE, deterministic=False)
    assert tf_target.not_applied(_ran(8, AUTOTUNE, False), settings, target) is None
    assert "num_parallel_calls=2, not 8" in tf_target.not_applied(_ran(2, AUTOTUNE, False), settings, target)
    assert "prefetch(AUTOTUNE)" in tf_target.not_applied(_ran(8, None, False), settings, target)
    assert "deterministic=None, not False" in tf_target.not_applied(_ran(8, AUTOTUNE, None), settings, target)
    moved = _ran(8, AUTOTUNE, False)
    for stage in moved["stages"]:
        stage["site"] = "t.py:90" if stage.get("site") else None
    assert "not made at t.py:40" in tf_target.not_applied(moved, settings, target)
    assert tf_target.not_applied(None, settings, target) == "no tf.data pipeline was iterated for training"


def test_paste_line_names_each_stage_where_the_script_makes_it():
    line = pipeline_paste_line(PipelineSettings(parallel_calls=8, prefetch=AUTOTUNE, deterministic=False),
                               PIPELINE["stages"])
    assert line == ("interleave(..., num_parallel_calls=8) at t.py:38; map(..., num_parallel_calls=8) at t.py:39; "
                    ".prefetch(tf.data.AUTOTUNE) after t.py:40; options = tf.data.Options(); "
                    "options.deterministic = False; .with_options(options) after t.py:40")


# -- the search ----------------------------------------------------------------------------------------
def latency_bound(s: PipelineSettings) -> float:
    """A map that waits on storage: each parallel call adds throughput far past 2 cores, as long as
    a thread runs it: tf.data's shared pool has one per core (AUTOTUNE stops there too), a private
    pool as many as it is given."""
    n = s.parallel_calls
    calls = 1 if n is None else 2 if n == AUTOTUNE else n
    threads = s.private_threadpool_size or 2
    return 100.0 * min(calls, threads, 24) * (1.05 if s.prefetch is not None else 1.0)


def cpu_bound(s: PipelineSettings) -> float:
    """A map that computes: 2 cores, contention beyond; AUTOTUNE finds the cores."""
    n = s.parallel_calls
    calls = 1 if n is None else 2 if n == AUTOTUNE else n
    return 500.0 * min(calls, 2) / (1 + 0.05 * max(calls - 2, 0))


def search(rate, diagnosis=lambda s: fake_diagnosis(), **kw) -> TuneResult:
    kw.setdefault("parallel_stages", True)
    return PipelineSearch(Workload(rate, diagnosis), PipelineSettings(), cpu_count=2, **kw).run(command=["t.py"])


def test_latency_bound_map_climbs_past_autotune_and_the_cores():
    result = search(latency_bound)
    assert result.best.settings.parallel_calls >= 16
    assert result.best.settings.private_threadpool_size == result.best.settings.parallel_calls
    assert result.speedup > 10
    # Up to the cores the shared pool runs the calls; past them each step brings its own pool.
    assert {t.settings.parallel_calls: t.settings.private_threadpool_size for t in result.trials
            if t.settings.parallel_calls in (2, 4, 8)} == {2: None, 4: 4, 8: 8}
    auto = next(t for t in result.trials if t.why == AUTOTUNE_EVERYWHERE)
    assert auto.settings == PipelineSettings(parallel_calls=AUTOTUNE, prefetch=AUTOTUNE)
    assert result.best.samples_per_s > 4 * auto.samples_per_s
    assert len(result.trials) <= 12


def test_cpu_bound_map_ties_go_to_autotune_over_a_fixed_count():
    """AUTOTUNE reaches the cores as fixed 2 does: tied, AUTOTUNE wins (it follows the machine the
    job runs on); more calls lose to contention and end the climb."""
    result = search(cpu_bound)
    assert result.best.settings.parallel_calls == AUTOTUNE
    assert 1.8 < result.speedup < 2.2
    assert max(t.settings.parallel_calls or 0 for t in result.trials) <= 8


def test_a_pipeline_that_does_not_wait_keeps_the_scripts_own():
    result = search(lambda s: 1000.0, diagnosis=lambda s: fake_diagnosis(data_wait=0.0))
    assert result.best.settings == PipelineSettings()
    assert {t.settings.parallel_calls for t in result.trials} <= {None, AUTOTUNE}  # no climb


def test_unordered_is_tried_only_when_it_could_help_and_kept_only_when_faster():
    faster_unordered = search(lambda s: latency_bound(s) * (1.3 if s.deterministic is False else 1.0))
    assert faster_unordered.best.settings.deterministic is False
    tied = search(latency_bound)
    assert any(t.settings.deterministic is False for t in tied.trials)
    assert tied.best.settings.deterministic is None     # no faster: the order is kept
    kept_by_script = search(latency_bound, ordered=False)
    assert all(t.settings.deterministic is None for t in kept_by_script.trials)


def test_threading_options_only_when_the_cores_are_full():
    full = search(cpu_bound, diagnosis=lambda s: fake_diagnosis(cores_used=1.95))
    assert any(t.settings.max_intra_op_parallelism == 1 for t in full.trials)
    assert any(t.settings.private_threadpool_size == 2 for t in full.trials)
    idle = search(cpu_bound, diagnosis=lambda s: fake_diagnosis(cores_used=1.0))
    assert all(t.settings.max_intra_op_parallelism is None for t in idle.trials)
    # A pool only beside the climb's calls past the cores (4 and 8 here), never one of one per core.
    assert all(t.settings.private_threadpool_size in (None, t.settings.parallel_calls) for t in idle.trials)
    assert all(t.settings.private_threadpool_size != 2 for t in idle.trials)


def test_without_a_stage_to_parallelise_only_prefetch_and_options_are_tried():
    result = search(latency_bound, parallel_stages=False)
    assert all(t.settings.parallel_calls is None for t in result.trials)


def test_ties_order():
    ordered = sorted([PipelineSettings(parallel_calls=4), PipelineSettings(parallel_calls=AUTOTUNE, prefetch=AUTOTUNE),
                      PipelineSettings(), PipelineSettings(parallel_calls=2, deterministic=False)],
                     key=pipeline_cheapness)
    assert ordered == [PipelineSettings(), PipelineSettings(parallel_calls=AUTOTUNE, prefetch=AUTOTUNE),
                       PipelineSettings(parallel_calls=4), PipelineSettings(parallel_calls=2, deterministic=False)]


def test_tune_json_and_best_config_say_tensorflow_and_read_back():
    result = search(latency_bound)
    result.target = tf_target.pipeline_target(PIPELINE)
    doc = json.loads(json.dumps(result.to_dict()))
    assert doc["framework"] == "tensorflow" and doc["dataloader_kwargs"] is None
    assert validate.doc_problem(doc, validate.TUNE_DOC) is None
    assert set(doc["best"]["config"]) == set(PipelineSettings().config_dict())
    back = TuneResult.from_dict(doc)
    assert back.best.settings == result.best.settings and back.framework == "tensorflow"
    config = result.config_file()
    assert config["framework"] == "tensorflow" and config["site"] == "t.py:40"
    assert PipelineOverrides.from_dict(json.loads(json.dumps(config))).settings == result.best.settings


def test_run_config_reads_either_framework_from_the_file(tmp_path):
    from gpufeed.cli.running import _read_config
    from gpufeed.settings import Overrides
    path = tmp_path / "best-config.json"
    path.write_text(json.dumps({"framework": "tensorflow", "site": "t.py:40", "stages": ["t.py:39"],
                                "settings": {"parallel_calls": 8}}))
    assert _read_config(path) == PipelineOverrides(PipelineSettings(parallel_calls=8), "t.py:40", ("t.py:39",))
    path.write_text(json.dumps({"framework": "pytorch", "site": "t.py:12", "settings": {"num_workers": 4}}))
    config = _read_config(path)
    assert isinstance(config, Overrides) and config.settings.num_workers == 4 and config.framework == "pytorch"
    path.write_text(json.dumps({"framework": "jax", "settings": {}}))
    with pytest.raises(ValueError, match="framework 'jax'"):
        _read_config(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        _read_config(path)


def test_a_tf_trials_live_rate_reads_the_steps_python_saw(tmp_path):
    """tune's progress while a TensorFlow trial runs: its steps come from the trace at the end, so the
    rate so far is read from the ticks the probe writes (tf_steps_seen), after the warm-up."""
    from gpufeed.analysis.steps import live_samples_per_s
    from gpufeed.record import schema
    from gpufeed.record.writer import JsonlWriter

    events = JsonlWriter(tmp_path / schema.EVENTS_DIR / "7.jsonl")
    assert live_samples_per_s(tmp_path, 5) is None
    for i in range(9):  # a Keras train_function call of 4 steps every 0.25 s: 16 steps/s of 16 samples
        events.write({"kind": "tf_steps_seen", "pid": 7, "t": 10.0 + 0.25 * i, "steps": 4 * (i + 1), "batch_size": 16})
        if i == 2:  # warm-up steps left out: only one tick after them so far
            assert live_samples_per_s(tmp_path, 10) is None
    assert live_samples_per_s(tmp_path, 10) == pytest.approx(16 * 16)
    events.write({"kind": "tf_steps_seen", "pid": 8, "t": 1.0, "steps": 20, "batch_size": 1})  # another process
    events.close()
    assert live_samples_per_s(tmp_path, 10) == pytest.approx(16 * 16)
