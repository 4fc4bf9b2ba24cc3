"""Keras 3 (torch backend) with prudent: a small MLP on scikit-learn's bundled 8x8 digits.

    python examples/keras_digits.py                       # prudent registers the run itself
    prudent run --max-restarts 3 -- python examples/keras_digits.py
    prudent run --set learning_rate=0.02 --set epochs=8 -- python examples/keras_digits.py
    prudent preflight -- python examples/keras_digits.py

The prudent lines are marked ``# prudent``. Reaches about 97% validation accuracy in a few
seconds on 2 CPU cores.
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "torch")  # prudent.keras runs on the torch backend

import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

from prudent.keras import PrudentCallback  # noqa: E402


def digits(seed: int = 0) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    images, labels = load_digits(return_X_y=True)
    x, y = (images / 16.0).astype("float32"), labels.astype("int64")
    order = np.random.default_rng(seed).permutation(len(x))
    train, val = order[:1437], order[1437:]  # 80 / 20
    return (x[train], y[train]), (x[val], y[val])


def build(hidden: int, learning_rate: float) -> keras.Model:
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(hidden, activation="relu"),
                              keras.layers.Dense(hidden, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def main() -> None:
    prudent_cb = PrudentCallback(name="keras-digits", config={  # prudent
        "learning_rate": 0.05, "hidden": 64, "epochs": 6, "batch_size": 32, "seed": 0})
    cfg = prudent_cb.config  # prudent: the hyperparameters after --set or the tuner
    keras.utils.set_random_seed(cfg["seed"])
    (x, y), (xv, yv) = digits(cfg["seed"])
    model = build(cfg["hidden"], cfg["learning_rate"])
    history = model.fit(x, y, epochs=cfg["epochs"], batch_size=cfg["batch_size"],
                        validation_data=(xv, yv), verbose=0,
                        callbacks=[prudent_cb])  # prudent
    print(f"final validation accuracy {history.history['val_accuracy'][-1]:.4f}")


if __name__ == "__main__":
    main()
