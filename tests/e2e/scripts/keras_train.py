"""examples/keras_digits.py's model and data with the knobs the adapter's e2e tests need:
`nan_at_step` puts a NaN into one batch (an input layer adds a variable the knob sets to NaN
for that step), `sleep_s` slows each step so a test can signal it mid-epoch, `kill_at_step`
makes the process vanish (SIGKILL, as a reclaimed machine) as that step ends, `out` is where the
final weights and optimizer state go (.npz), `dropout` adds a Dropout layer. Each optimizer
step appends "<pid> <step>" to steps.log.
"""

import os
import signal
import sys
import time
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parents[3] / "examples"))
from keras_digits import digits  # noqa: E402

from prudent.keras import PrudentCallback  # noqa: E402

torch.set_num_threads(1)


class Poison(keras.layers.Layer):
    def build(self, shape):
        self.value = self.add_weight(shape=(), initializer="zeros", trainable=False)

    def call(self, x):
        return x + self.value


class Knobs(keras.callbacks.Callback):
    def __init__(self, nan_at_step: int, sleep_s: float, kill_at_step: int) -> None:
        super().__init__()
        self.nan_at_step, self.sleep_s, self.kill_at_step = nan_at_step, sleep_s, kill_at_step

    def step(self) -> int:
        return int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))

    def on_train_batch_begin(self, batch, logs=None):
        poison = self.model.layers[0].value
        poison.assign(float("nan") if self.step() + 1 == self.nan_at_step else 0.0)

    def on_train_batch_end(self, batch, logs=None):
        if not logs:  # a batch the resumed run skips (trained before the interruption)
            return
        with open("steps.log", "a") as log:
            log.write(f"{os.getpid()} {self.step()}\n")
        time.sleep(self.sleep_s)
        if self.step() == self.kill_at_step:
            os.kill(os.getpid(), signal.SIGKILL)


cb = PrudentCallback(name="keras-train", config={
    "learning_rate": 0.05, "hidden": 32, "epochs": 3, "batch_size": 64, "nan_at_step": -1,
    "sleep_s": 0.0, "kill_at_step": -1, "out": "final.npz", "dropout": 0.0})
cfg = cb.config
out = cfg["out"]  # read with the others, not only once training is over
keras.utils.set_random_seed(0)
(x, y), (xv, yv) = digits()
model = keras.Sequential([keras.Input((64,)), Poison(),
                          keras.layers.Dense(cfg["hidden"], activation="relu"),
                          *([keras.layers.Dropout(cfg["dropout"])] if cfg["dropout"] else []),
                          keras.layers.Dense(10)])
model.compile(optimizer=keras.optimizers.SGD(cfg["learning_rate"], momentum=0.9),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])
model.fit(x, y, epochs=cfg["epochs"], batch_size=cfg["batch_size"], validation_data=(xv, yv),
          verbose=0, callbacks=[Knobs(cfg["nan_at_step"], cfg["sleep_s"], cfg["kill_at_step"]), cb])
state = [keras.ops.convert_to_numpy(v) for v in model.weights + model.optimizer.variables]
np.savez(out, *state)
print(f"DONE {int(keras.ops.convert_to_numpy(model.optimizer.iterations))}")
