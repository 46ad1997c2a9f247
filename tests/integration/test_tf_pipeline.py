"""Reading a tf.data pipeline's structure from the dataset object (measure/inside/tf_pipeline.py)."""
from __future__ import annotations

import pytest

tf = pytest.importorskip("tensorflow", reason="TensorFlow is in the test extra: pip install -e '.[test]'")

from gpufeed.measure.inside.tf_pipeline import describe  # noqa: E402


def test_stages_options_and_python_calls_are_read():
    def to_python(x):
        return tf.py_function(lambda v: v * 2, [x], tf.int64)

    files = tf.data.Dataset.range(4)
    dataset = (files.interleave(lambda i: tf.data.Dataset.range(i), cycle_length=2)
               .map(to_python)
               .map(lambda x: x + 1, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
               .cache()
               .batch(8, drop_remainder=True)
               .prefetch(3))
    options = tf.data.Options()
    options.autotune.enabled = False
    options.deterministic = True
    d = describe(dataset.with_options(options))
    ops = [s["op"] for s in d["stages"]]
    assert ops == ["Options", "Prefetch", "Batch", "Cache", "ParallelMap", "Map", "Interleave", "Range"]
    stage = {s["op"]: s for s in d["stages"]}
    assert stage["Prefetch"]["buffer_size"] == 3
    assert stage["Batch"]["batch_size"] == 8 and stage["Batch"]["drop_remainder"] is True
    assert stage["ParallelMap"]["num_parallel_calls"] == -1 and stage["ParallelMap"]["deterministic"] == "false"
    assert stage["Map"]["python_ops"] == ["EagerPyFunc"]
    assert "python_ops" not in stage["ParallelMap"]
    assert stage["Interleave"]["cycle_length"] == 2
    assert d["options"]["autotune"] is False and d["options"]["deterministic"] is True
    assert d["cardinality"] is None  # unknown through interleave


def test_generator_is_a_python_stage_and_random_map_is_stateful():
    generated = tf.data.Dataset.from_generator(lambda: iter(range(3)), output_signature=tf.TensorSpec((), tf.int32))
    assert any("GeneratorDataset" in s.get("python_ops", []) for s in describe(generated)["stages"])
    noisy = tf.data.Dataset.range(3).map(lambda x: tf.cast(x, tf.float32) + tf.random.uniform(()))
    (stage,) = [s for s in describe(noisy)["stages"] if s["op"] == "Map"]
    assert stage.get("stateful") is True
    plain = tf.data.Dataset.range(3).map(lambda x: x * 2)
    (stage,) = [s for s in describe(plain)["stages"] if s["op"] == "Map"]
    assert "stateful" not in stage
    assert describe(plain.batch(2))["cardinality"] == 2
