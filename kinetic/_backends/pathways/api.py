"""The LeaderWorkerSet API: version discovery (once per process) and the few calls made.

Every request goes through :class:`~kinetic._backends.gke.client.KubeClient`'s one
door (its ``_request``, used here on purpose rather than growing the GKE client), so the rate limit, deadline, retries and error translation of that module hold
here too. The served version of ``leaderworkerset.x-k8s.io`` is asked of the API
discovery endpoint (``GET /apis/{group}``) the first time a cluster is used, and kept
for the life of the process; a cluster without the CRD is a :class:`~kinetic.ConfigError`
that says how to install it (and is asked again next time: it may have been installed
meanwhile).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

from kinetic._backends.gke.client import DEFAULT_TIMEOUT, KubeClient, KubeHTTPError
from kinetic._core import lws_spec
from kinetic._exceptions import BackendError, ConfigError

_VERSIONS: dict[tuple[str, ...], str] = {}
"""Discovered versions, by (kubeconfig, context, group): one discovery per process."""
_VERSIONS_LOCK = threading.Lock()


def _cache_key(client: KubeClient, group: str) -> tuple[str, ...]:
    # The client loads $KUBECONFIG lazily; name the file it will use.
    return (repr(client), os.environ.get("KUBECONFIG", ""), group)


def forget_versions() -> None:
    """Drop every cached version (the next call discovers again)."""
    with _VERSIONS_LOCK:
        _VERSIONS.clear()


class LwsApi:
    """LeaderWorkerSets of one cluster.

    :param client: the loop's Kubernetes client.
    :param group: the API group (``leaderworkerset.x-k8s.io``; tests name a fake one).
    """

    def __init__(self, client: KubeClient, group: str = lws_spec.GROUP) -> None:
        self.client = client
        self.group = group

    def __repr__(self) -> str:
        return f"LwsApi({self.client!r}, {self.group!r})"

    def _missing(self) -> ConfigError:
        return ConfigError(
            f"the Kubernetes cluster does not serve LeaderWorkerSets ({self.group}), "
            f"which the pathways backend needs: {lws_spec.INSTALL_HINT}"
        )

    async def version(self, *, timeout: float = DEFAULT_TIMEOUT) -> str:
        """The served version of the API (``v1``), discovered once per process.

        :raises ConfigError: the cluster does not serve the group (no CRD).
        :raises BackendError: the API server failed or could not be reached.
        """
        key = _cache_key(self.client, self.group)
        with _VERSIONS_LOCK:
            found = _VERSIONS.get(key)
        if found is not None:
            return found
        doc = await self.client.get(
            f"/apis/{self.group}", what=f"discover API group {self.group}", timeout=timeout
        )
        versions = [v.get("version") for v in (doc or {}).get("versions") or []]
        preferred = ((doc or {}).get("preferredVersion") or {}).get("version")
        version = "v1" if "v1" in versions else preferred or (versions[0] if versions else None)
        if not isinstance(version, str) or not version:
            raise self._missing()
        with _VERSIONS_LOCK:
            _VERSIONS[key] = version
        return version

    def _forget(self) -> None:
        with _VERSIONS_LOCK:
            _VERSIONS.pop(_cache_key(self.client, self.group), None)

    def _path(self, version: str, namespace: str, name: str | None = None) -> str:
        base = f"/apis/{self.group}/{version}/namespaces/{namespace}/{lws_spec.PLURAL}"
        return f"{base}/{name}" if name else base

    async def create(
        self, namespace: str, manifest: Mapping[str, Any], *, timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        """Create a LeaderWorkerSet (``manifest``'s ``apiVersion`` is set here).

        An LWS API that rejects the group restart policy ``None`` (releases before it
        existed) gets its older spelling, ``Default``, which means the same.

        :raises ConfigError: the namespace or the CRD does not exist.
        :raises BackendError: refused (exists already, invalid) or unreachable.
        """
        name = manifest["metadata"]["name"]
        body = dict(manifest)
        for attempt in range(2):
            version = await self.version(timeout=timeout)
            body["apiVersion"] = f"{self.group}/{version}"
            try:
                created = await self.client._request(
                    "POST",
                    self._path(version, namespace),
                    what=f"create LeaderWorkerSet {namespace}/{name}",
                    namespace=namespace,
                    body=body,
                    timeout=timeout,
                )
            except BackendError as exc:
                cause = exc.__cause__
                if (
                    attempt == 0
                    and isinstance(cause, KubeHTTPError)
                    and cause.status == 422
                    and "restartPolicy" in str(cause.body.get("message") or "")
                ):
                    body = _with_group_restart_policy(body, "Default")
                    continue
                raise
            if created is not None or await self.get(namespace, name, timeout=timeout):
                return  # None: a retried POST whose first attempt had created it
            # 404 on the collection: the version cached is no longer served.
            self._forget()
        raise self._missing()

    async def get(
        self, namespace: str, name: str, *, timeout: float = DEFAULT_TIMEOUT
    ) -> dict[str, Any] | None:
        """The LeaderWorkerSet's JSON, or None when it does not exist."""
        version = await self.version(timeout=timeout)
        result: dict[str, Any] | None = await self.client._request(
            "GET",
            self._path(version, namespace, name),
            what=f"get LeaderWorkerSet {namespace}/{name}",
            timeout=timeout,
        )
        return result

    async def delete(self, namespace: str, name: str, *, timeout: float = DEFAULT_TIMEOUT) -> bool:
        """Delete a LeaderWorkerSet and, in the foreground, what it owns. False when it
        did not exist."""
        version = await self.version(timeout=timeout)
        result = await self.client._request(
            "DELETE",
            self._path(version, namespace, name),
            what=f"delete LeaderWorkerSet {namespace}/{name}",
            body={"propagationPolicy": "Foreground", "gracePeriodSeconds": 0},
            timeout=timeout,
        )
        return result is not None

    async def list(
        self, namespace: str, selector: str, *, timeout: float = DEFAULT_TIMEOUT
    ) -> list[dict[str, Any]]:
        """LeaderWorkerSets matching ``selector`` in ``namespace``."""
        version = await self.version(timeout=timeout)
        result = await self.client._request(
            "GET",
            self._path(version, namespace),
            what=f"list LeaderWorkerSets in {namespace}",
            namespace=namespace,
            query=[("labelSelector", selector)],
            timeout=timeout,
        )
        return list((result or {}).get("items") or [])


def _with_group_restart_policy(manifest: Mapping[str, Any], policy: str) -> dict[str, Any]:
    out = dict(manifest)
    spec = dict(out["spec"])
    template = dict(spec["leaderWorkerTemplate"])
    template["restartPolicy"] = policy
    spec["leaderWorkerTemplate"] = template
    out["spec"] = spec
    return out
