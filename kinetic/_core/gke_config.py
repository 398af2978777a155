"""GKE backend knobs from ``KINETIC_*`` variables. Pure: the environment is passed in.

| variable | meaning | default |
|---|---|---|
| ``KINETIC_GKE_SERVICE_ACCOUNT`` | pods' ``serviceAccountName`` | ``kinetic`` when the namespace has it (``kinetic up``), else the namespace default |
| ``KINETIC_GKE_HOST_NETWORK`` | ``hostNetwork: true`` (clusters without a CNI) | false |
| ``KINETIC_GKE_JOB_API_ACCESS`` | mount the pods' service account token: jobs that submit jobs | false |
| ``KINETIC_GKE_IMAGE_PULL_POLICY`` | ``Always``/``IfNotPresent``/``Never`` | Kubernetes' choice |
| ``KINETIC_GKE_START_GRACE`` | seconds a job may be unable to start before it fails | 300 |
| ``KINETIC_K8S_QPS`` / ``KINETIC_K8S_BURST`` | client-side API rate limit | 20 / 40 |
| ``KINETIC_IMAGE_REGISTRY`` | where bundled images are pushed | the project's Artifact Registry ``kinetic`` |
| ``STORAGE_EMULATOR_HOST`` | forwarded to pods when set (a GCS emulator) | unset |
| ``KINETIC_IMAGE_BASE`` | base image (with ``python3`` and ``venv``) of built images | ``python:X.Y-slim``, the submitting Python's ``X.Y`` |
| ``KINETIC_GKE_COORDINATOR_HOST`` | the address a coordinated pool's coordinator listens on (a one-node cluster on the host's network: ``127.0.0.1``) | its pod's |
| ``KINETIC_GKE_POOL_ENGINE`` | how a batch's worker pool coordinates: ``coordinated`` (a coordinator) or ``pool`` (leaderless; ``docs/pool-protocol.md``) | ``coordinated`` |
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kinetic._core.k8s_spec import PodOptions
from kinetic._exceptions import ConfigError
from runner.protocol import python_version

DEFAULT_START_GRACE = 300.0


def default_base_image(python: str) -> str:
    """The base image of built images for a client on Python ``python`` (``X.Y``): that
    Python's slim image, as a payload's code loads only in the Python that pickled it."""
    return f"python:{python}-slim"


DEFAULT_BASE_IMAGE = default_base_image(python_version())
"""This interpreter's: ``python:X.Y-slim``."""
_FORWARDED = ("STORAGE_EMULATOR_HOST",)
"""Variables of the submitting process that every pod gets (when set)."""
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


@dataclass(frozen=True)
class GKEOptions:
    """Backend knobs.

    :ivar pod: pod-level options (service account, host network, pull policy).
    :ivar start_grace: seconds a job may stay unable to start before a waiter fails it.
    :ivar qps: sustained Kubernetes API requests per second.
    :ivar burst: Kubernetes API requests allowed at once.
    :ivar image_registry: registry for built runner images, or None.
    :ivar base_image: base image of built runner images.
    :ivar pool_engine: how a batch's worker pool coordinates: ``coordinated`` (a
        coordinator in the batch's Jobs: ``docs/pool-protocol.md``, "The coordinated
        pool"; the default) or ``pool`` (leaderless, through storage).
    :ivar coordinator_host: the address a coordinated pool's coordinator listens on
        and its workers connect to; None: its pod's.
    """

    pod: PodOptions = field(default_factory=PodOptions)
    start_grace: float = DEFAULT_START_GRACE
    qps: float = 20.0
    burst: int = 40
    image_registry: str | None = None
    base_image: str = DEFAULT_BASE_IMAGE
    pool_engine: str = "coordinated"
    coordinator_host: str | None = None


def env_flag(env: Mapping[str, str], name: str) -> bool:
    """The boolean variable ``name`` (unset: false).

    :raises ConfigError: when it is neither true nor false.
    """
    value = env.get(name, "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{name} must be true or false, got {value!r}")


def _number(env: Mapping[str, str], name: str, default: float, minimum: float) -> float:
    raw = env.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"{name} must be at least {minimum}, got {raw!r}")
    return value


def options_from_env(env: Mapping[str, str]) -> GKEOptions:
    """Read the knobs of the module docstring from ``env``.

    :raises ConfigError: on a malformed value.
    """
    pod = PodOptions(
        service_account=env.get("KINETIC_GKE_SERVICE_ACCOUNT") or None,
        host_network=env_flag(env, "KINETIC_GKE_HOST_NETWORK"),
        api_access=env_flag(env, "KINETIC_GKE_JOB_API_ACCESS"),
        image_pull_policy=env.get("KINETIC_GKE_IMAGE_PULL_POLICY") or None,
        # A submitter that talks to a storage emulator needs its pods to talk to it too.
        extra_env={k: env[k] for k in _FORWARDED if env.get(k)},
    )
    return GKEOptions(
        pod=pod,
        start_grace=_number(env, "KINETIC_GKE_START_GRACE", DEFAULT_START_GRACE, 0.0),
        qps=_number(env, "KINETIC_K8S_QPS", 20.0, 0.001),
        burst=int(_number(env, "KINETIC_K8S_BURST", 40, 1)),
        image_registry=env.get("KINETIC_IMAGE_REGISTRY") or None,
        base_image=env.get("KINETIC_IMAGE_BASE") or DEFAULT_BASE_IMAGE,
        pool_engine=_pool_engine(env),
        coordinator_host=env.get("KINETIC_GKE_COORDINATOR_HOST") or None,
    )


def _pool_engine(env: Mapping[str, str]) -> str:
    """:raises ConfigError: ``KINETIC_GKE_POOL_ENGINE`` names no engine."""
    value = (env.get("KINETIC_GKE_POOL_ENGINE") or "coordinated").strip().lower()
    if value not in ("pool", "coordinated"):
        raise ConfigError(f"KINETIC_GKE_POOL_ENGINE must be pool or coordinated, got {value!r}")
    return value
