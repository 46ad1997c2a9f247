"""A Keras script whose tf.data pipeline waits on (simulated) storage, for ``gpufeed tune``.

Each element is read through a Python call that sleeps ``--sleep-ms`` (a read from slow storage;
sleeping releases the GIL, so parallel calls overlap the reads, as DataLoader workers do), in a
``map`` without num_parallel_calls and no prefetch: the loop waits for input. The validation
pipeline is made at other lines and must be left alone. ``--report FILE`` writes both pipelines'
stages as the script holds them (each stage's type and num_parallel_calls, and the options).
``--hang-after N``: the read of the N+1-th element never returns (storage that hangs);
``--loop``: a custom loop (``for x, y in train: step(x, y)``, a ``tf.function`` step) instead of ``fit``.

    python tf_tune_target.py [--epochs 20] [--sleep-ms 4] [--report FILE] [--hang-after N] [--loop]
"""
import argparse
import itertools
import json
import time

import numpy as np
import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=20)
p.add_argument("--sleep-ms", type=float, default=4.0)
p.add_argument("--report", default=None)
p.add_argument("--hang-after", type=int, default=None)
p.add_argument("--loop", action="store_true")
args = p.parse_args()

N, D, BATCH = 1024, 32, 16
features = np.random.default_rng(0).random((N, D), dtype=np.float32)
labels = np.random.default_rng(1).integers(0, 10, N)


reads = itertools.count()


def read(index):
    time.sleep(args.sleep_ms / 1000.0)  # the storage's latency
    if args.hang_after is not None and next(reads) >= args.hang_after:
        time.sleep(3600)
    return features[index]


def load(index, label):
    x = tf.numpy_function(read, [index], tf.float32)
    x.set_shape((D,))
    return x, label


train = tf.data.Dataset.from_tensor_slices((np.arange(N), labels)).shuffle(N, seed=0)
train = train.map(load)
train = train.batch(BATCH)
val = tf.data.Dataset.from_tensor_slices((np.arange(64), labels[:64])).map(load).batch(BATCH)


def stages(dataset):
    out = []
    while dataset is not None:
        calls = getattr(dataset, "_num_parallel_calls", None)
        out.append([type(dataset).__name__.lstrip("_"), None if calls is None else int(calls.numpy())])
        inputs = dataset._inputs()
        dataset = inputs[0] if inputs else None
    return out


if args.report:
    with open(args.report, "w") as f:
        options = train.options()
        json.dump({"train": stages(train), "val": stages(val),
                   "train_options": {"deterministic": options.deterministic,
                                     "private_threadpool_size": options.threading.private_threadpool_size,
                                     "max_intra_op_parallelism": options.threading.max_intra_op_parallelism}}, f)

model = tf.keras.Sequential([tf.keras.Input((D,)), tf.keras.layers.Dense(32, activation="relu"),
                             tf.keras.layers.Dense(10)])
loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
if args.loop:
    optimizer = tf.keras.optimizers.SGD(0.01)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            value = loss(y, model(x, training=True))
        optimizer.apply_gradients(zip(tape.gradient(value, model.trainable_variables), model.trainable_variables))

    for epoch in range(args.epochs):
        for x, y in train:
            step(x, y)
else:
    model.compile(tf.keras.optimizers.SGD(0.01), loss)
    model.fit(train, validation_data=val, epochs=args.epochs, verbose=2)
print("tf_tune_target: done", flush=True)
