"""TensorFlow training under a distribution strategy, written the way its guide writes it: the model
built in ``strategy.scope()``, then Keras ``fit`` on the dataset, or a custom loop over
``strategy.experimental_distribute_dataset(dataset)`` with ``strategy.run`` in a ``tf.function``.
The pipeline is fit_slow_map's (tf_train.py) made smaller: a random map (stateful, so TensorFlow
leaves it sequential) without num_parallel_calls, and no prefetch: the loop waits for input.

    python tf_strategy.py {fit,loop} {mirrored,one_device} [EPOCHS]

MirroredStrategy with no GPU mirrors onto the one CPU device; OneDeviceStrategy("/cpu:0").
"""
import sys
import time

import numpy as np
import tensorflow as tf

mode, kind = sys.argv[1], sys.argv[2]
epochs = int(sys.argv[3]) if len(sys.argv) > 3 else 2
N, D, BATCH = 512, 32, 16
features = np.random.default_rng(0).random((N, D), dtype=np.float32)
labels = np.random.default_rng(1).integers(0, 10, N)


def augment(x, y):
    x = x + tf.random.uniform(tf.shape(x), maxval=0.01)  # random: a stateful function
    for _ in range(300):
        x = tf.sin(x) * 1.0001 + 0.0001
    return x, y


strategy = tf.distribute.MirroredStrategy() if kind == "mirrored" else tf.distribute.OneDeviceStrategy("/cpu:0")
dataset = tf.data.Dataset.from_tensor_slices((features, labels)).map(augment).batch(BATCH)
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((D,)), tf.keras.layers.Dense(32, activation="relu"),
                                 tf.keras.layers.Dense(10)])
    optimizer = tf.keras.optimizers.SGD(0.01)
loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

t0 = time.perf_counter()
if mode == "loop":
    distributed = strategy.experimental_distribute_dataset(dataset)

    def step(x, y):
        with tf.GradientTape() as tape:
            value = tf.nn.compute_average_loss(loss(y, model(x, training=True)), global_batch_size=BATCH)
        optimizer.apply_gradients(zip(tape.gradient(value, model.trainable_variables), model.trainable_variables))
        return value

    @tf.function
    def train_step(x, y):
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(step, args=(x, y)), axis=None)

    for epoch in range(epochs):
        for x, y in distributed:
            train_step(x, y)
else:
    with strategy.scope():
        model.compile(optimizer, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(dataset, epochs=epochs, verbose=2)
print(f"trained in {time.perf_counter() - t0:.2f}s", flush=True)
