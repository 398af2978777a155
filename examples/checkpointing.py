"""Checkpoint a Keras training job to ``KINETIC_OUTPUT_DIR`` and resume it after a stop.

    python examples/checkpointing.py

Every job gets a place for what it writes, ``KINETIC_OUTPUT_DIR``: a folder on the local
backend, a ``gs://`` prefix on GKE. It is per job by default; a **fixed** ``output_dir``
lets a second run find the first one's checkpoint, so a job stopped half way (a spot node
reclaimed, a ``cancel()``, a crash) continues where it was. Keras 3 saves ``.keras``
files to local paths and, on GKE, to ``gs://`` URIs alike.
"""

import os
import tempfile

import kinetic

CHECKPOINTS = os.environ.get("KINETIC_EXAMPLE_CHECKPOINTS") or tempfile.mkdtemp()


@kinetic.run(accelerator="cpu", output_dir=CHECKPOINTS)
def train(epochs: int, stop_after: int | None = None) -> dict[str, float | int]:
    """Train for ``epochs`` epochs in all, resuming from the last checkpoint; with
    ``stop_after``, stop (raise) once that many epochs ran in this run."""
    import keras
    import numpy as np

    out = os.environ["KINETIC_OUTPUT_DIR"]
    checkpoint = os.path.join(out, "model.keras")
    rng = np.random.default_rng(0)
    features = rng.normal(size=(512, 8)).astype("float32")
    targets = features @ rng.normal(size=(8, 1)).astype("float32")

    if os.path.exists(checkpoint):
        model = keras.saving.load_model(checkpoint)
        with open(os.path.join(out, "epoch.txt")) as f:
            done = int(f.read())
    else:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input(shape=(8,)), keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
        done = 0
    print(f"starting at epoch {done}")

    loss = float("nan")
    for epoch in range(done, epochs):
        history = model.fit(features, targets, epochs=1, batch_size=64, verbose=0)
        loss = float(history.history["loss"][-1])
        model.save(checkpoint)  # after the model, the epoch: a stop between them redoes one
        with open(os.path.join(out, "epoch.txt"), "w") as f:
            f.write(str(epoch + 1))
        if stop_after is not None and epoch + 1 - done >= stop_after:
            raise RuntimeError(f"stopped after epoch {epoch + 1}")
    return {"resumed_from": done, "epochs": epochs, "loss": loss}


if __name__ == "__main__":
    try:
        train(6, stop_after=3)
    except RuntimeError as exc:  # the job's own exception, re-raised here
        print("first run:", exc)
    print("second run:", train(6))  # {'resumed_from': 3, 'epochs': 6, 'loss': ...}
