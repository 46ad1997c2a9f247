"""tf.data settings applied at construction, in this process (measure/inside/tf_overrides.py): each
stage notes where it was made; the settings reach the training pipeline's stages and no other's."""
from __future__ import annotations

import pytest

tf = pytest.importorskip("tensorflow", reason="TensorFlow is in the test extra: pip install -e '.[test]'")

from gpufeed.measure.inside import tf_overrides  # noqa: E402
from gpufeed.measure.inside.tf_pipeline import describe  # noqa: E402
from gpufeed.settings import AUTOTUNE, PipelineSettings  # noqa: E402
from gpufeed.tune import tf_target  # noqa: E402


@pytest.fixture
def patch():
    def patch_with(overrides=None):
        tf_overrides.unpatch_datasets()
        tf_overrides.patch_datasets(overrides, say=False)
    yield patch_with
    tf_overrides.unpatch_datasets()


def build():
    """A training pipeline over several lines, and a validation pipeline on one line of its own."""
    train = tf.data.Dataset.range(8)
    train = train.interleave(lambda i: tf.data.Dataset.range(i, i + 3), cycle_length=2)
    train = train.map(lambda x: x * 2)
    train = train.batch(4)
    val = tf.data.Dataset.range(8).map(lambda x: x + 1).batch(4)
    return train, val


def elements(dataset) -> list[int]:
    return sorted(int(x) for batch in dataset.as_numpy_iterator() for x in batch)


def test_settings_reach_the_training_pipeline_only_and_change_no_element(patch):
    patch()  # sites only, as under gpufeed diagnose: the first run of a tune
    train, val = build()
    first = describe(train)
    assert [s["op"] for s in first["stages"]] == ["Batch", "Map", "Interleave", "Range"]
    target = tf_target.pipeline_target(first)
    sites = [s["site"] for s in first["stages"][:3]]
    assert target.end == sites[0] and target.stages == tuple(sites[1:])
    assert len(set(sites)) == 3 and all(site.startswith("tests/integration/test_tf_overrides.py:") for site in sites)
    before = elements(train), elements(val)

    settings = PipelineSettings(parallel_calls=8, prefetch=AUTOTUNE, deterministic=False, max_intra_op_parallelism=1)
    patch(tf_overrides.PipelineOverrides(settings, target.end, target.stages))
    train, val = build()
    ran = describe(train)
    assert [s["op"] for s in ran["stages"]] == ["Options", "Prefetch", "Batch", "ParallelMap", "ParallelInterleave",
                                                 "Range"]
    stage = {s["op"]: s for s in ran["stages"]}
    assert stage["ParallelMap"]["num_parallel_calls"] == 8
    assert stage["ParallelMap"]["gpufeed_override"] == {"num_parallel_calls": 8}
    assert stage["ParallelInterleave"]["num_parallel_calls"] == 2       # capped at its cycle_length
    assert stage["Prefetch"]["buffer_size"] == AUTOTUNE
    assert ran["options"]["deterministic"] is False and ran["options"]["max_intra_op_parallelism"] == 1
    assert tf_target.not_applied(ran, settings, target) is None
    assert [s["op"] for s in describe(val)["stages"]] == ["Batch", "Map", "Range"]  # made at another line
    assert (elements(train), elements(val)) == before  # faster, perhaps out of order: the same elements


def test_a_prefetch_at_the_end_gets_the_buffer_and_a_sequential_batch_stays_so(patch):
    def pipeline():
        ds = tf.data.Dataset.range(8).batch(2)
        return ds.prefetch(1)
    patch()
    end = describe(pipeline())["stages"][0]["site"]
    patch(tf_overrides.PipelineOverrides(PipelineSettings(parallel_calls=4, prefetch=3), end, ()))
    ran = describe(pipeline())
    assert [(s["op"], s.get("buffer_size")) for s in ran["stages"]] == [("Prefetch", 3), ("Batch", None),
                                                                        ("Range", None)]
