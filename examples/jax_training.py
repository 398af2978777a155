"""A jitted JAX training loop (linear regression by gradient descent) as a Kinetic job.

    python examples/jax_training.py

JAX comes from the job's image (CPU ``jax``, ``jax[cuda12]`` or ``jax[tpu]`` by
accelerator), so no requirements file is needed. Set
``KINETIC_EXAMPLE_ACCELERATOR=tpu-v6e-8`` (or ``l4``, ...) to run on an accelerator.
"""

import os

import kinetic

ACCELERATOR = os.environ.get("KINETIC_EXAMPLE_ACCELERATOR", "cpu")


@kinetic.run(accelerator=ACCELERATOR)
def train(steps: int = 200, learning_rate: float = 0.1) -> dict[str, float | str]:
    """Fit ``y = x @ w + b`` with a jitted gradient step; return the losses and the device."""
    import jax
    import jax.numpy as jnp

    key_x, key_w = jax.random.split(jax.random.key(0))
    x = jax.random.normal(key_x, (512, 8))
    y = x @ jax.random.normal(key_w, (8,)) + 0.5

    def loss(params: tuple[jax.Array, jax.Array]) -> jax.Array:
        w, b = params
        return jnp.mean((x @ w + b - y) ** 2)

    @jax.jit
    def step(params: tuple[jax.Array, jax.Array]) -> tuple[tuple[jax.Array, jax.Array], jax.Array]:
        value, grads = jax.value_and_grad(loss)(params)
        new = jax.tree.map(lambda p, g: p - learning_rate * g, params, grads)
        return new, value

    params = (jnp.zeros(8), jnp.zeros(()))
    first = float(loss(params))
    for _ in range(steps):
        params, _ = step(params)
    return {
        "first_loss": first,
        "final_loss": float(loss(params)),
        "device": str(jax.devices()[0].platform),
        "jax": jax.__version__,
    }


if __name__ == "__main__":
    print(train())
