"""TensorFlow training scripts written the way people write them, one per mode:

fit_slow_map   Keras fit on a tf.data pipeline whose map (a random augmentation: stateful, so
               TensorFlow cannot parallelise it by itself) runs without num_parallel_calls, no prefetch
custom_loop    the same pipeline in a custom loop: `for x, y in dataset: train_step(x, y)`, tf.function
generator      Keras fit on Dataset.from_generator, a Python generator doing the work
good           Keras fit on a cached, prefetched pipeline feeding a larger model: compute-bound
fixed          fit_slow_map with gpufeed's fixes: map(num_parallel_calls=AUTOTUNE), prefetch(AUTOTUNE)
"""
import os
import signal
import sys
import time

import numpy as np
import tensorflow as tf

mode = sys.argv[1]
epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 2
N, D = 1024, 64
features = np.random.default_rng(0).random((N, D), dtype=np.float32)
labels = np.random.default_rng(1).integers(0, 10, N)


def augment(x, y):
    x = x + tf.random.uniform(tf.shape(x), maxval=0.01)   # random: a stateful function
    # Few ops on a 64 x 64 tile, not many on the row: TensorFlow's profiler traces every op, and its
    # tracing (outside the traced wait) grew with their number (500 rounds on the row: 45-56% waited).
    tile = tf.tile(x[None, :], [64, 1])
    for _ in range(150):
        tile = tf.sin(tile) * 1.0001 + 0.0001
    return tile[0], y


def generate():
    # 120 rounds: about 3 ms of Python a batch of 16, more than the 3 ms step, so the loop waits about
    # half the time (40 rounds waited 33% on an idle machine and 17% once in CI).
    for i in range(N):
        x = features[i]
        for _ in range(120):
            x = np.sin(x) * 1.0001
        yield x.astype(np.float32), labels[i]


# "good": each epoch starts by refilling the shuffle buffer (~3 ms of real input wait); a 15 ms step
# keeps that near 1.5% of the time, well under the 5% bar (a 5 ms step put it right on it: CI flaked).
width = 2048 if mode == "good" else 32
model = tf.keras.Sequential([tf.keras.Input((D,)), tf.keras.layers.Dense(width, activation="relu"),
                             tf.keras.layers.Dense(width, activation="relu"), tf.keras.layers.Dense(10)])
loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
if mode == "generator":
    dataset = tf.data.Dataset.from_generator(
        generate, output_signature=(tf.TensorSpec((D,), tf.float32), tf.TensorSpec((), tf.int64))).batch(16)
elif mode == "good":
    dataset = tf.data.Dataset.from_tensor_slices((features, labels)).cache().shuffle(N).batch(64).prefetch(tf.data.AUTOTUNE)
elif mode == "fixed":
    dataset = (tf.data.Dataset.from_tensor_slices((features, labels))
               .map(augment, num_parallel_calls=tf.data.AUTOTUNE).batch(16).prefetch(tf.data.AUTOTUNE))
else:
    dataset = tf.data.Dataset.from_tensor_slices((features, labels)).map(augment).batch(16)

t0 = time.perf_counter()
if mode == "custom_loop":
    optimizer = tf.keras.optimizers.SGD(0.01)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            value = loss(y, model(x, training=True))
        optimizer.apply_gradients(zip(tape.gradient(value, model.trainable_variables), model.trainable_variables))
        return value

    # The script times its own next() calls, as a check on the waits gpufeed reads from the trace.
    waits = open(os.environ["TF_TRAIN_WAITS"], "w") if os.environ.get("TF_TRAIN_WAITS") else None
    for epoch in range(epochs):
        batches = iter(dataset)
        while True:
            t_request = time.perf_counter()
            try:
                x, y = next(batches)
            except StopIteration:
                break
            if waits:
                waits.write(f"{t_request} {time.perf_counter()}\n")
                waits.flush()
            value = train_step(x, y)
        print(f"epoch {epoch + 1} loss {float(value):.4f}")
else:
    model.compile(tf.keras.optimizers.SGD(0.01), loss)
    callbacks = []
    if os.environ.get("TF_TRAIN_SIGTERM_AT"):  # killed mid-run, as a scheduler would
        class Terminate(tf.keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                if batch == int(os.environ["TF_TRAIN_SIGTERM_AT"]):
                    os.kill(os.getpid(), signal.SIGTERM)
        callbacks.append(Terminate())
    model.fit(dataset, epochs=epochs, verbose=2, callbacks=callbacks)
print(f"trained in {time.perf_counter() - t0:.2f}s")
