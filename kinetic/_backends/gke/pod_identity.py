"""Which Kubernetes service account a job's pod runs as, when none is configured.

``KINETIC_GKE_SERVICE_ACCOUNT`` names it. Unset, the pods run as ``kinetic`` when
the jobs' namespace has that service account -- the one ``kinetic up`` makes,
bound through Workload Identity to a Google service account that may read and
write the jobs bucket -- and as the namespace's default one otherwise (a cluster
set up by other means). The answer is looked up once per backend (one GET) and
kept in its options: ``service_account`` ``None`` means "not looked up yet", ``""``
"the namespace's default" (``serviceAccountName`` is then left out).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Protocol

from kinetic._backends.gke.client import KubeClient
from kinetic._core.gke_config import GKEOptions
from kinetic._exceptions import KineticError

UP_SERVICE_ACCOUNT = "kinetic"
"""The pods' service account ``kinetic up`` makes (:data:`kinetic._infra.plan.DEFAULT_SERVICE_ACCOUNT`)."""
LOOKUP_TIMEOUT = 10.0

log = logging.getLogger(__name__)


class PodBackend(Protocol):
    """What the lookup needs of a GKE or Pathways backend."""

    namespace: str
    options: GKEOptions

    @property
    def client(self) -> KubeClient: ...


async def settle_service_account(backend: PodBackend) -> str | None:
    """Fill in the backend's pod service account when none is configured (see the
    module docstring); return it (None: the namespace's default).

    A failed lookup (no permission to read service accounts, an unreachable API
    server) leaves the namespace's default, as before ``kinetic up`` existed: the
    job's own creation then says what is wrong.
    """
    pod = backend.options.pod
    if pod.service_account is None:
        path = f"/api/v1/namespaces/{backend.namespace}/serviceaccounts/{UP_SERVICE_ACCOUNT}"
        name = ""
        try:
            found = await backend.client.get(
                path, what=f"get service account {UP_SERVICE_ACCOUNT}", timeout=LOOKUP_TIMEOUT
            )
            if found is not None:
                name = UP_SERVICE_ACCOUNT
        except KineticError as exc:
            log.debug("looking up the pods' service account failed: %s", exc)
        pod = dataclasses.replace(pod, service_account=name)
        backend.options = dataclasses.replace(backend.options, pod=pod)
    return pod.service_account or None
