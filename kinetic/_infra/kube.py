"""The Kubernetes side of ``up``/``down``/``status``: thin calls on :class:`KubeClient`.

Each call goes through the client's one boundary (rate limit, deadline, retries of
transient faults, translation into :class:`~kinetic.BackendError` /
:class:`~kinetic.ConfigError`), with the object paths of :class:`ObjectRef`. Reads
of several objects run concurrently in one task group. Deletions carry the uid the
record holds as a precondition: an object someone re-created since ``up`` is never
deleted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

import anyio

from kinetic._backends.gke.client import KubeClient, KubeHTTPError
from kinetic._core.exception_groups import one_error
from kinetic._exceptions import BackendError
from kinetic._infra.plan import ObjectRef, Record, parse_record, record_manifest, record_ref

DEFAULT_TIMEOUT = 30.0
Deleted = Literal["deleted", "gone", "changed"]


def _status_of(exc: BaseException) -> int | None:
    cause = exc.__cause__
    return cause.status if isinstance(cause, KubeHTTPError) else None


async def read(kube: KubeClient, ref: ObjectRef, *, timeout: float = DEFAULT_TIMEOUT) -> Any:
    """The object, or None when it (or its namespace) does not exist."""
    return await kube.get(ref.path, what=f"get {ref}", timeout=timeout)


async def read_all(
    kube: KubeClient, refs: Iterable[ObjectRef], *, timeout: float = DEFAULT_TIMEOUT
) -> dict[ObjectRef, dict[str, Any] | None]:
    """Every object of ``refs`` (None where absent), read concurrently."""
    found: dict[ObjectRef, dict[str, Any] | None] = {}

    async def one(ref: ObjectRef) -> None:
        found[ref] = await read(kube, ref, timeout=timeout)

    with one_error():
        async with anyio.create_task_group() as tg:
            for ref in refs:
                tg.start_soon(one, ref)
    return found


async def read_record(
    kube: KubeClient, namespace: str, *, timeout: float = DEFAULT_TIMEOUT
) -> tuple[Record, dict[str, Any] | None]:
    """The record of ``up`` in ``namespace`` and its ConfigMap (None: no record).

    :raises ConfigError: a ConfigMap of that name exists but is no record.
    """
    configmap = await read(kube, record_ref(namespace), timeout=timeout)
    return parse_record(configmap), configmap


async def create(
    kube: KubeClient, ref: ObjectRef, manifest: Mapping[str, Any], *, timeout: float
) -> dict[str, Any]:
    """Create the object; return it as the API server stored it (with its uid).

    :raises BackendError: refused (it appeared meanwhile: HTTP 409; forbidden; invalid).
    """
    created = await kube._request(  # the client's one boundary; it has no generic create
        "POST", ref.collection, what=f"create {ref}", body=dict(manifest), timeout=timeout
    )
    if not isinstance(created, dict):  # a retried POST whose first attempt won
        created = await read(kube, ref, timeout=timeout)
    if not isinstance(created, dict):
        raise BackendError(f"{ref} is missing right after its creation")
    return created


async def write_record(
    kube: KubeClient,
    namespace: str,
    record: Record,
    existing: Mapping[str, Any] | None,
    *,
    timeout: float = DEFAULT_TIMEOUT,
) -> None:
    """Create or replace the record's ConfigMap."""
    ref = record_ref(namespace)
    manifest = record_manifest(namespace, record)
    if existing is None:
        await create(kube, ref, manifest, timeout=timeout)
        return
    meta = manifest["metadata"]
    meta["resourceVersion"] = (existing.get("metadata") or {}).get("resourceVersion")
    await kube._request("PUT", ref.path, what=f"update {ref}", body=manifest, timeout=timeout)


async def delete(kube: KubeClient, ref: ObjectRef, uid: str, *, timeout: float) -> Deleted:
    """Delete ``ref`` if it is still the object of that ``uid``.

    :returns: ``deleted``; ``gone`` (it did not exist); ``changed`` (another object of
        that name exists now: left alone).
    """
    body = {"preconditions": {"uid": uid}, "propagationPolicy": "Background"}
    try:
        answer = await kube._request(
            "DELETE", ref.path, what=f"delete {ref}", body=body, timeout=timeout
        )
    except BackendError as exc:
        if _status_of(exc) == 409:  # the uid precondition failed
            return "changed"
        raise
    return "gone" if answer is None else "deleted"


async def wait_until(
    kube: KubeClient,
    ref: ObjectRef,
    *,
    gone: bool = False,
    established: bool = False,
    timeout: float,
    interval: float = 0.25,
) -> None:
    """Wait until ``ref`` is gone (``gone``) or a CRD is Established (``established``).

    :raises BackendError: not so within ``timeout`` seconds.
    """
    want = "gone" if gone else "Established"
    try:
        with anyio.fail_after(timeout):
            while True:
                obj = await read(kube, ref, timeout=timeout)
                if gone and obj is None:
                    return
                if established and obj is not None and _established(obj):
                    return
                await anyio.sleep(interval)
    except TimeoutError as exc:
        raise BackendError(f"{ref} is not {want} after {timeout:g}s") from exc


def _established(crd: Mapping[str, Any]) -> bool:
    conditions = (crd.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)
