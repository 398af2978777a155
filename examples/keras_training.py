"""Train a small Keras model as a Kinetic job and get its final loss back.

    python examples/keras_training.py

No requirements file is needed: every image Kinetic builds carries Keras and JAX for its
accelerator, and jobs run with ``KERAS_BACKEND=jax``. On a TPU or GPU, pass its name
(``KINETIC_EXAMPLE_ACCELERATOR=tpu-v6e-8`` or ``l4``); the default, ``cpu``, runs on this
machine's local backend when no GCP project is configured.
"""

import os

import kinetic

ACCELERATOR = os.environ.get("KINETIC_EXAMPLE_ACCELERATOR", "cpu")


@kinetic.run(accelerator=ACCELERATOR)
def train(epochs: int = 5, seed: int = 0) -> float:
    """Fit a two-layer regression network on random data; return the last epoch's loss."""
    import keras
    import numpy as np

    keras.utils.set_random_seed(seed)
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(1024, 16)).astype("float32")
    targets = features @ rng.normal(size=(16, 1)).astype("float32") + 0.1

    model = keras.Sequential(
        [keras.Input(shape=(16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(1)]
    )
    model.compile(optimizer="adam", loss="mse")
    history = model.fit(features, targets, epochs=epochs, batch_size=64, verbose=0)
    print(f"keras {keras.__version__} on the {keras.backend.backend()} backend")
    return float(history.history["loss"][-1])


if __name__ == "__main__":
    print(f"final loss: {train():.4f}")
