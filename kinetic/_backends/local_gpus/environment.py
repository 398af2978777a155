"""What a local job's accelerator means on this machine: admission, warnings, environment.

:func:`admit` runs when a job or batch is submitted, before anything is written: it
refuses what the machine cannot do (more GPUs than it has, a TPU without the CPU
opt-in) and says once what it substitutes. :func:`apply_job_env` gives an admitted
job the environment its pod would have: the same ``JAX_PLATFORMS``, ``KERAS_BACKEND=jax``
unless the user set it, no GPU for a CPU job (``CUDA_VISIBLE_DEVICES=""``), and for a GPU job the request its own process
turns into an exclusive lease (:mod:`runner.gpu_lease`) before it runs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import MutableMapping
from pathlib import Path

from kinetic._backends.local_gpus.inventory import machine_gpus
from kinetic._core.accel_runtime import KERAS_BACKEND
from kinetic._core.accelerators import (
    LOCAL_ACCELERATOR_CHOICES,
    AcceleratorConfig,
    LocalPlan,
    parse_accelerator,
    plan_local,
)
from kinetic._core.config import Settings
from kinetic._exceptions import ConfigError
from runner.gpu_lease import REQUEST_ENV, GpuRequest

log = logging.getLogger(__name__)

_WARNED_LOCK = threading.Lock()
_warned: set[str] = set()


def lock_dir(root: Path) -> Path:
    """Where the GPU locks of the jobs of local root ``root`` live."""
    return Path(root) / "gpus"


def admit(cfg: AcceleratorConfig, *, requested: str | None, settings: Settings) -> LocalPlan:
    """How the local backend will run ``cfg``; prints its warning once per process.

    Blocking the first time a GPU job asks (NVML is read once per process).

    :param requested: the accelerator name as the user wrote it.
    :raises AcceleratorError: a TPU without the CPU opt-in, or more GPUs than the
        machine has (listing them).
    :raises ConfigError: for a bad ``KINETIC_LOCAL_ACCELERATOR`` or ``KINETIC_LOCAL_GPUS``.
    """
    choice = settings.local_accelerator
    if choice is not None and choice not in LOCAL_ACCELERATOR_CHOICES:
        raise ConfigError(
            f"KINETIC_LOCAL_ACCELERATOR (or the profile's local_accelerator) is {choice!r}; "
            f"the only value is 'cpu' (run TPU jobs on this machine's CPUs)"
        )
    machine = machine_gpus() if cfg.kind == "gpu" else ()
    plan = plan_local(cfg, machine, requested=requested, tpu_on_cpu=choice == "cpu")
    if plan.warning is not None:
        _warn_once(plan.warning)
    return plan


def apply_job_env(env: MutableMapping[str, str], accelerator: str, root: Path) -> None:
    """Give a job already admitted for ``accelerator`` (so a TPU here is emulated on
    CPUs) the environment its pod would have, in ``env``.

    :raises AcceleratorError: when the machine no longer has the GPUs it needs.
    """
    cfg = parse_accelerator(accelerator or "cpu")
    machine = machine_gpus() if cfg.kind == "gpu" else ()
    plan = plan_local(cfg, machine, tpu_on_cpu=True)
    env["JAX_PLATFORMS"] = plan.jax_platforms
    env.setdefault("KERAS_BACKEND", KERAS_BACKEND)  # as in every image Kinetic builds
    # Until its lease names its GPUs, and for good when it needs none, a job sees none.
    env["CUDA_VISIBLE_DEVICES"] = ""
    env.pop(REQUEST_ENV, None)
    if plan.gpus:
        request = GpuRequest(plan.gpus, tuple(gpu.id for gpu in machine), str(lock_dir(root)))
        env[REQUEST_ENV] = request.to_env()


def _warn_once(message: str) -> None:
    with _WARNED_LOCK:
        if message in _warned:
            return
        _warned.add(message)
    log.warning("%s", message)
