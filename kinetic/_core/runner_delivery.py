"""Kinetic's runner, delivered into the pods of a custom image. Pure: dicts in, dicts out.

A custom image is the user's (``container_image="..."``): one made for the original
Kinetic carries Python and ``cloudpickle``, not Kinetic. Its jobs run anyway, because
the runner comes with the job instead of with the image:

1. an init container of the **runner image** (Kinetic's own dependencies and source on
   the client's Python, :func:`kinetic._images.delivery.ensure_runner_image`) copies
   Kinetic's ``kinetic`` and ``runner`` packages and ``cloudpickle`` to
   ``{MOUNT}/src``, and its other dependencies to ``{MOUNT}/deps``, in a volume of the
   pod (an ``emptyDir``);
2. the job's container runs ``python3 -m runner ...`` in ``{MOUNT}/src`` (its working
   directory, which ``-m`` puts first on ``sys.path``; the image's ``PYTHONPATH`` is
   left alone), so Kinetic's runner and the ``cloudpickle`` that matches the client's
   are found first, and the runner appends ``{MOUNT}/deps`` to ``sys.path``
   (:data:`runner.DEPS_ENV`): the image's own packages win over Kinetic's copies, so the
   user's code sees the versions it was built with. (The runner then works in the
   job's own folder, as in any image.)

What the image needs is ``python3`` of the client's ``X.Y`` (compiled dependencies
are the client's Python's, and a payload loads only in the Python that pickled it).
A runner of another Python fails the job in phase ``fetch`` naming both versions
before it opens the store (:data:`runner.protocol.PYTHON_ENV`; it says so in the pod's
termination message, where the job's status finds it), and an image without
``python3`` fails in phase ``fetch`` too (:mod:`kinetic._core.k8s_status`).
"""

from __future__ import annotations

from typing import Any

from kinetic._core import image_spec
from runner import DEPS_ENV
from runner.protocol import PYTHON_ENV, python_version

VOLUME = "kinetic-runner"
INIT_CONTAINER = "kinetic-runner"
MOUNT = "/opt/kinetic-runner"
SOURCES = f"{MOUNT}/src"
"""Kinetic's packages and ``cloudpickle``: first on the job's path."""
DEPS = f"{MOUNT}/deps"
"""Kinetic's other dependencies: after the image's own packages."""
PYTHON = "python3"
"""The interpreter a custom image must have (the original required it too)."""
INIT_RESOURCES = {"cpu": "100m", "memory": "128Mi"}

# The runner image's layout (kinetic._core.image_spec): sources in /opt/kinetic, the
# dependencies in the venv at /opt/venv. Bytecode and the venv's installers stay behind.
_COPY = f"""\
set -eu
site=$(echo /opt/venv/lib/python*/site-packages)
mkdir -p {SOURCES} {DEPS}
cp -R /opt/kinetic/kinetic /opt/kinetic/runner "$site/cloudpickle" {SOURCES}/
for entry in "$site"/*; do
  case "${{entry##*/}}" in
    cloudpickle|pip|pip-*|setuptools|setuptools-*|_distutils_hack|distutils-precedence.pth|__pycache__) ;;
    *) cp -R "$entry" {DEPS}/ ;;
  esac
done
"""


def needs_delivery(image: str) -> bool:
    """Whether a custom image's pods get the runner delivered: yes, unless the image is
    one Kinetic built (its repository is one of
    :data:`kinetic._core.image_spec.KINETIC_REPOSITORIES`), whose
    runner is its own. Pure."""
    path = image.split("@", 1)[0]
    name = path.rsplit("/", 1)[-1].split(":", 1)[0]
    return name not in image_spec.KINETIC_REPOSITORIES


def copy_script() -> str:
    """The init container's ``sh`` script: the runner image's packages into the volume."""
    return _COPY


def with_delivered_runner(
    pod_spec: dict[str, Any], runner_image: str, *, pull_policy: str | None = None
) -> None:
    """Make the pod spec's job container (its first) run the runner delivered from
    ``runner_image``: the volume, the init container, the mount (read-only), the working
    directory and the dependencies' folder. In place. The container's command is the
    caller's (its interpreter :data:`PYTHON`)."""
    container = pod_spec["containers"][0]
    init: dict[str, Any] = {
        "name": INIT_CONTAINER,
        "image": runner_image,
        "command": ["sh", "-c", copy_script()],
        "volumeMounts": [{"name": VOLUME, "mountPath": MOUNT}],
        "resources": {"requests": dict(INIT_RESOURCES), "limits": dict(INIT_RESOURCES)},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    if pull_policy is not None:
        init["imagePullPolicy"] = pull_policy
    pod_spec.setdefault("initContainers", []).append(init)
    pod_spec.setdefault("volumes", []).append({"name": VOLUME, "emptyDir": {}})
    container.setdefault("volumeMounts", []).append(
        {"name": VOLUME, "mountPath": MOUNT, "readOnly": True}
    )
    container["workingDir"] = SOURCES
    ours = {DEPS_ENV: DEPS, PYTHON_ENV: python_version()}
    env = [v for v in container["env"] if v["name"] not in ours]
    env += [{"name": name, "value": value} for name, value in ours.items()]
    container["env"] = sorted(env, key=lambda v: v["name"])
