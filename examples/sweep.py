"""A hyper-parameter sweep: one job per learning rate with ``run_async_map``.

    python examples/sweep.py

``run_async_map`` records every input durably and returns a ``BatchHandle`` at once; on
the local backend a pool of worker processes runs them, on GKE a pool of pods.
``as_completed()`` hands back each input as it finishes; ``results()`` all the values in
input order. Each input's ``KINETIC_OUTPUT_DIR`` is its own (created by the job).
"""

import os

import kinetic

ACCELERATOR = os.environ.get("KINETIC_EXAMPLE_ACCELERATOR", "cpu")
LEARNING_RATES = [0.001, 0.01, 0.1, 0.5]


@kinetic.run(accelerator=ACCELERATOR)
def fit(learning_rate: float, steps: int = 100) -> dict[str, float]:
    """Gradient descent on a small linear regression; the final loss for this rate."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 4))
    y = x @ np.array([1.0, -2.0, 0.5, 3.0]) + 0.1
    w, b = np.zeros(4), 0.0
    for _ in range(steps):
        error = x @ w + b - y
        w -= learning_rate * 2 * x.T @ error / len(y)
        b -= learning_rate * 2 * float(error.mean())
    loss = float(np.mean((x @ w + b - y) ** 2))
    out = os.environ["KINETIC_OUTPUT_DIR"]
    os.makedirs(out, exist_ok=True)  # a batch input's folder is not made in advance
    with open(os.path.join(out, "loss.txt"), "w") as f:
        f.write(f"{loss}\n")
    return {"learning_rate": learning_rate, "loss": loss}


def sweep(rates: list[float] = LEARNING_RATES) -> dict[str, float]:
    """Run one job per rate; return the best rate and its loss."""
    batch = fit.run_async_map(rates, name="lr-sweep", max_concurrent=4)
    for handle in batch.as_completed():  # as each input finishes
        print(f"input {handle.group_index} done: {handle.status().value}")
    results = batch.results()  # in input order; a failed input raises kinetic.BatchError
    return min(results, key=lambda r: r["loss"])


if __name__ == "__main__":
    print("best:", sweep())
