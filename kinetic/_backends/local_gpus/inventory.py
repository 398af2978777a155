"""This machine's GPUs: what NVML reports, restricted (or declared) by ``KINETIC_LOCAL_GPUS``.

NVML is reached through ``nvidia-ml-py`` (import name ``pynvml``, the ``gpu`` extra). It
is asked once per process: the answer does not change while we run, and starting NVML
costs tens of milliseconds. The variable is read on every call (it is cheap, and tests
change it):

* unset: every GPU NVML reports (none without NVML);
* ``0,2``: with NVML, only those of its GPUs (an id it does not report is an error);
  without NVML, GPUs of unknown model with those ids — how a machine without a GPU, a
  test for one, declares some;
* empty (or ``none``): no GPU at all.

Ids are NVML indices, which jobs receive in ``CUDA_VISIBLE_DEVICES`` (with
``CUDA_DEVICE_ORDER=PCI_BUS_ID``, so that CUDA numbers the GPUs the way NVML does).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
from collections.abc import Mapping
from typing import Any

from kinetic._core.accelerators import LocalGpu, describe_machine
from kinetic._exceptions import ConfigError

GPUS_ENV = "KINETIC_LOCAL_GPUS"


@functools.cache
def nvml_gpus() -> tuple[LocalGpu, ...] | None:
    """The GPUs NVML reports, in NVML index order; None when NVML is unavailable (the
    ``gpu`` extra is not installed, or there is no NVIDIA driver). Blocking; the first
    call of the process asks NVML, later calls return its answer."""
    try:
        nvml: Any = importlib.import_module("pynvml")
    except ImportError:
        return None
    try:
        nvml.nvmlInit()
    except nvml.NVMLError:
        return None
    try:
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            name = nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(index))
            if isinstance(name, bytes):  # older bindings return bytes
                name = name.decode(errors="replace")
            gpus.append(LocalGpu(str(index), str(name)))
        return tuple(gpus)
    except nvml.NVMLError:
        return None
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()


def parse_declared(value: str) -> tuple[str, ...]:
    """The ids in a ``KINETIC_LOCAL_GPUS`` value (``"0,2"``); ``()`` for ``""``/``none``. Pure.

    :raises ConfigError: for an id that is not a GPU index, or one named twice.
    """
    text = value.strip().lower()
    if text in ("", "none"):
        return ()
    ids = tuple(part.strip() for part in text.split(","))
    for gpu in ids:
        if not gpu.isdigit():
            raise ConfigError(
                f"{GPUS_ENV}={value!r}: {gpu!r} is not a GPU index; expected e.g. 0,2"
            )
    if len(set(ids)) != len(ids):
        raise ConfigError(f"{GPUS_ENV}={value!r} names a GPU twice")
    return tuple(str(int(gpu)) for gpu in ids)


def machine_gpus(environ: Mapping[str, str] | None = None) -> tuple[LocalGpu, ...]:
    """The GPUs local jobs may use (see the module docstring). Blocking the first time.

    :raises ConfigError: when ``KINETIC_LOCAL_GPUS`` is malformed, or names a GPU that
        NVML does not report (the message lists those it does).
    """
    env = os.environ if environ is None else environ
    return select_gpus(nvml_gpus(), env.get(GPUS_ENV))


def select_gpus(found: tuple[LocalGpu, ...] | None, declared: str | None) -> tuple[LocalGpu, ...]:
    """The GPUs jobs may use, from NVML's answer (None: no NVML) and ``KINETIC_LOCAL_GPUS``
    (None: unset), by the rules of the module docstring. Pure.

    :raises ConfigError: as :func:`machine_gpus`.
    """
    if declared is None:
        return found or ()
    ids = parse_declared(declared)
    if found is None:
        return tuple(LocalGpu(gpu) for gpu in ids)
    by_id = {gpu.id: gpu for gpu in found}
    unknown = [gpu for gpu in ids if gpu not in by_id]
    if unknown:
        raise ConfigError(
            f"{GPUS_ENV} names GPU(s) {', '.join(unknown)}, which NVML does not report; "
            f"this machine has: {describe_machine(found)}"
        )
    return tuple(by_id[gpu] for gpu in ids)
