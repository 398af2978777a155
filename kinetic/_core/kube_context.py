"""Which kubeconfig context a job's cluster is: pure rules, no IO.

``gcloud container clusters get-credentials`` names a cluster's context
``gke_{project}_{zone}_{cluster}``. A job goes to that context when the kubeconfig has
it, whatever context is active, so two clusters work side by side in one process and
the user's active context is never changed. ``KINETIC_KUBE_CONTEXT`` names a context
outright. Without either, the active context is used — unless it is another GKE
cluster's, where sending the job there would be a silent mistake.
"""

from __future__ import annotations

from collections.abc import Sequence

from kinetic._exceptions import ConfigError

OVERRIDE_ENV = "KINETIC_KUBE_CONTEXT"


def gke_context_name(project: str | None, zone: str | None, cluster: str | None) -> str | None:
    """``gke_{project}_{zone}_{cluster}``, or None when one of them is unknown."""
    if not (project and zone and cluster):
        return None
    return f"gke_{project}_{zone}_{cluster}"


def choose_context(
    wanted: str | None,
    override: str | None,
    available: Sequence[str],
    current: str | None,
) -> str | None:
    """The context to load, or None for the kubeconfig's active one.

    :param wanted: the job's cluster as a context name (:func:`gke_context_name`).
    :param override: ``KINETIC_KUBE_CONTEXT``, when set.
    :param available: the kubeconfig's context names.
    :param current: its active context.
    :raises ConfigError: for an override the kubeconfig lacks, or a cluster with no
        context while the active one is a different GKE cluster's.
    """
    if override:
        if override not in available:
            raise ConfigError(
                f"{OVERRIDE_ENV}={override!r} is not a context of the kubeconfig "
                f"(it has: {', '.join(available) or 'none'})"
            )
        return override
    if wanted is None or wanted in available:
        return wanted
    if current and current.startswith("gke_") and current != wanted:
        _, project, zone, cluster = (wanted.split("_", 3) + ["", "", ""])[:4]
        raise ConfigError(
            f"the kubeconfig has no context {wanted!r} for cluster {cluster!r}, and its active "
            f"context {current!r} is another GKE cluster's: run `gcloud container clusters "
            f"get-credentials {cluster} --zone {zone} --project {project}`, or set "
            f"{OVERRIDE_ENV} to the context to use"
        )
    return None  # a cluster of another kind (a test cluster): its active context


def check_named_cluster(wanted: str, available: Sequence[str], current: str | None) -> None:
    """A cluster the user named (``cluster=``/``zone=``) must have its context, unless
    they asked for one outright (``KINETIC_KUBE_CONTEXT``, checked by the caller).

    Otherwise :func:`choose_context` sends the job to the active context when that is no
    GKE cluster's (kind, k3d), while its records go to the named cluster's bucket.

    :raises ConfigError: ``wanted`` is not in ``available`` and ``current`` is a context
        of another kind (a different GKE cluster's is :func:`choose_context`'s error).
    """
    if wanted in available or not current or current.startswith("gke_"):
        return
    _, project, zone, cluster = (wanted.split("_", 3) + ["", "", ""])[:4]
    raise ConfigError(
        f"cluster {cluster!r} (project {project!r}, zone {zone!r}) has no kubeconfig context "
        f"{wanted!r}, and the active context {current!r} is not that GKE cluster: the job "
        f"would run there while its records went to cluster {cluster!r}'s bucket. Run "
        f"`gcloud container clusters get-credentials {cluster} --zone {zone} --project "
        f"{project}`, or set {OVERRIDE_ENV}={current} to use the active context"
    )
