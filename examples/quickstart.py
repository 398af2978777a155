"""Kinetic quickstart: run functions as durable jobs on this machine.

    python examples/quickstart.py

With no GCP project configured, jobs run on the local backend: each call is a
real, detached process whose records live under ~/.kinetic/local (or
KINETIC_LOCAL_ROOT). The same code targets GKE once a project is configured.
"""

import os
import platform

import kinetic


@kinetic.run(accelerator="cpu")
def estimate_pi(samples: int) -> float:
    """A small Monte Carlo job: prints progress, writes an artifact, returns a value."""
    import random

    rng = random.Random(samples)
    inside = 0
    for i in range(1, samples + 1):
        x, y = rng.random(), rng.random()
        inside += x * x + y * y <= 1.0
        if i % (samples // 4) == 0:
            print(f"[{platform.node()} pid {os.getpid()}] {i}/{samples} samples")
    out_dir = os.environ["KINETIC_OUTPUT_DIR"]  # set inside every job
    with open(os.path.join(out_dir, "estimate.txt"), "w") as f:
        f.write(str(4 * inside / samples))
    return 4 * inside / samples


if __name__ == "__main__":
    # Blocking call: runs as a job, streams its output, returns its value.
    print("pi ~", estimate_pi(200_000))

    # Or submit and keep the handle: it can be attached from any other process.
    job = estimate_pi.run_async(100_000)
    print("submitted", job.job_id, "status:", job.status().value)
    print("pi ~", job.result(), "from", job.job_id)
