"""A named cluster must be the one a job goes to (see
:func:`kinetic._core.kube_context.check_named_cluster`): checked at submission, before
anything is written. Blocking (reads the kubeconfig): call it in a worker thread."""

from __future__ import annotations

import os
from pathlib import Path

from kinetic._core import kubeconfig
from kinetic._core.config import Settings
from kinetic._core.kube_context import OVERRIDE_ENV, check_named_cluster, gke_context_name
from kinetic._exceptions import ConfigError


def check_cluster_choice(settings: Settings) -> None:
    """Refuse a job for a named cluster that would run on another, non-GKE cluster.

    Nothing to check for the local backend, a defaulted cluster, a context named outright
    (``KINETIC_KUBE_CONTEXT``), in-cluster configuration, or a kubeconfig that cannot be
    read (the backend reports that when it loads it).

    :raises ConfigError: naming the cluster, the active context and the two ways out.
    """
    if settings.backend == "local" or not settings.cluster_named:
        return
    if os.environ.get(OVERRIDE_ENV):
        return
    wanted = gke_context_name(settings.project, settings.zone, settings.cluster)
    if wanted is None:
        return
    from kinetic._backends.gke.endpoint import locate, read_kubeconfig

    paths = locate(None, os.environ, Path.home())
    if paths is None:
        return
    try:
        config, _ = read_kubeconfig(paths)
        names, current = kubeconfig.list_contexts(config)
    except ConfigError:
        return
    check_named_cluster(wanted, names, current)
