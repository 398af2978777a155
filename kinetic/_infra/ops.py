"""What ``kinetic up`` / ``down`` / ``status`` do, on clients they are given.

Theory of operation
-------------------
:func:`set_up` reads what exists (one concurrent round of GETs, plus the record),
asks :func:`~kinetic._infra.plan.decide_up` what to do, creates what is missing in
order (namespace first; the CRD waited for until Established), creates the bucket
when absent, and writes the record of what it created -- also when a later step
fails (shielded), so that ``down`` can always remove what exists. On GKE a ``cloud``
step given by the caller (:func:`kinetic._infra.cloud.ensure`: the image repository,
the pods' Google service account, the IAM grants) runs after the bucket, and what it
creates is recorded with the rest; a service account an earlier ``up`` made gets the
Workload Identity annotation it lacks. :func:`tear_down` deletes exactly the
recorded objects (:func:`~kinetic._infra.plan.down_order`, each with its uid as
precondition), removes the recorded Google Cloud items (the caller's ``cloud``
removal) and forgets them, empties and deletes the bucket if ``up`` created it,
then the record, and last the namespace if ``up`` created it (waiting until it is
gone). Each step is reported through ``progress`` and bounded by ``timeout``. A
second ``down`` finds no record and does nothing.

The clients are passed in and owned by the caller: a :class:`KubeClient` on the
cluster, and a :class:`BucketAdmin` (None: no bucket to handle).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import anyio

from kinetic._backends.gke.client import KubeClient
from kinetic._exceptions import ConfigError
from kinetic._infra import kube as k
from kinetic._infra.bucket import BucketAdmin
from kinetic._infra.container import ContainerClient
from kinetic._infra.gke_api import RESOURCE_LABEL, RESOURCE_LABEL_VALUE, ClusterInfo
from kinetic._infra.identity import WI_ANNOTATION, CloudItem, removal_order
from kinetic._infra.plan import (
    ObjectRef,
    Record,
    Recorded,
    SetupSpec,
    StatusRow,
    Step,
    annotation_of,
    decide_up,
    desired_objects,
    down_order,
    owns_namespace,
    record_ref,
    status_rows,
    uid_of,
)

Progress = Callable[[str], None]
CloudStep = Callable[[Sequence[CloudItem], list[CloudItem]], Awaitable[list["Outcome"]]]
"""Sets up the Google Cloud side given what is recorded, appending what it creates."""
CloudRemoval = Callable[[Sequence[CloudItem]], Awaitable[list["Outcome"]]]
"""Removes recorded Google Cloud items."""
STEP_TIMEOUT = 60.0
"""Seconds one step (a creation, a deletion, a wait) may take."""


def packaged_lws_crd() -> dict[str, Any]:
    """The LeaderWorkerSet CRD shipped with Kinetic (``kinetic/_infra/lws-crd.json``)."""
    text = resources.files("kinetic._infra").joinpath("lws-crd.json").read_text("utf-8")
    doc: dict[str, Any] = json.loads(text)
    return doc


@dataclass(frozen=True)
class Outcome:
    """What happened to one thing: ``created``, ``kept`` (an earlier ``up`` made it),
    ``pre-existing`` (left alone), ``deleted``, ``gone`` (already), ``changed``
    (re-created by someone since ``up``: left alone)."""

    item: str
    result: str


def _quiet(_: str) -> None:
    pass


async def ensure_cluster(
    container: ContainerClient,
    cluster: str,
    *,
    pool: Mapping[str, Any] | None = None,
    timeout: float,
    progress: Progress = _quiet,
) -> tuple[ClusterInfo, list[Outcome]]:
    """The GKE cluster, created when absent; plus the node pool ``pool`` (a body from
    :func:`~kinetic._infra.gke_api.node_pool`) when it has no pool of that name.

    :raises BackendError: refused, or an operation failed.
    :raises JobTimeoutError: an operation outlasted ``timeout`` (it goes on).
    """
    done: list[Outcome] = []
    info = await container.get_cluster(cluster)
    if info is None:
        progress(f"creating GKE cluster {cluster} in {container.location} (5-10 minutes)")
        info = await container.create_cluster(cluster, timeout=timeout, progress=progress)
        done.append(Outcome(f"GKE cluster {cluster}", "created"))
    else:
        done.append(Outcome(f"GKE cluster {cluster}", "kept" if info.managed else "pre-existing"))
    if pool is not None:
        item = f"node pool {pool['name']}"
        if any(p.name == pool["name"] for p in info.pools):
            done.append(Outcome(item, "pre-existing"))
        else:
            progress(f"creating {item}")
            await container.create_pool(cluster, pool, timeout=timeout, progress=progress)
            done.append(Outcome(item, "created"))
    return info, done


async def set_up(
    kube: KubeClient,
    buckets: BucketAdmin | None,
    spec: SetupSpec,
    *,
    lws_crd: Mapping[str, Any] | None = None,
    timeout: float = STEP_TIMEOUT,
    progress: Progress = _quiet,
    cloud: CloudStep | None = None,
) -> list[Outcome]:
    """Create what ``spec`` wants and is missing; record it. Idempotent.

    :param cloud: ``await cloud(record, created)`` sets up the Google Cloud side
        after the bucket (:func:`kinetic._infra.cloud.ensure`): it appends what it
        creates to ``created`` as it goes, recorded here with the rest.

    :raises ConfigError: a malformed record, or a bad spec.
    :raises BackendError: the API server refused or failed (what was created so far is
        recorded).
    :raises StorageError: the bucket could not be looked at or created.
    """
    wanted = desired_objects(spec, lws_crd if lws_crd is not None else packaged_lws_crd())
    live = await k.read_all(kube, [ref for ref, _ in wanted], timeout=timeout)
    record, record_map = await k.read_record(kube, spec.namespace, timeout=timeout)
    steps = decide_up(wanted, live, record)
    created: list[Recorded] = []
    made_bucket: str | None = None
    made_in_cloud: list[CloudItem] = []
    outcomes: list[Outcome] = []
    try:
        for step in steps:
            if step.action != "create":
                kept = "kept" if step.action == "keep" else "pre-existing"
                if step.ref.kind == "ServiceAccount":
                    kept = await _annotate(kube, step, live.get(step.ref), timeout, progress)
                outcomes.append(Outcome(str(step.ref), kept))
                continue
            progress(f"creating {step.ref}")
            obj = await k.create(kube, step.ref, step.manifest, timeout=timeout)
            created.append(Recorded(step.ref, uid_of(obj) or ""))
            if step.ref.kind == "CustomResourceDefinition":
                progress(f"waiting for {step.ref} to be Established")
                await k.wait_until(kube, step.ref, established=True, timeout=timeout)
            outcomes.append(Outcome(str(step.ref), "created"))
        if spec.bucket is not None and buckets is not None:
            item = f"bucket gs://{spec.bucket}"
            if await buckets.exists(spec.bucket, timeout=timeout):
                ours = record.bucket == spec.bucket
                if not ours:
                    await check_bucket_owner(buckets, spec, timeout=timeout)
                outcomes.append(Outcome(item, "kept" if ours else "pre-existing"))
            else:
                progress(f"creating {item}")
                if await buckets.create(
                    spec.bucket,
                    project=spec.project or "",
                    location=spec.location,
                    labels={RESOURCE_LABEL: RESOURCE_LABEL_VALUE},
                    timeout=timeout,
                ):
                    made_bucket = spec.bucket
                else:  # taken meanwhile, or a name another project holds (409)
                    await check_bucket_owner(buckets, spec, timeout=timeout)
                outcomes.append(Outcome(item, "created" if made_bucket else "pre-existing"))
        if cloud is not None:
            outcomes += await cloud(record.cloud, made_in_cloud)
    finally:
        if created or made_bucket or made_in_cloud:
            # Recorded even when a later step failed: `down` must find what exists.
            with anyio.CancelScope(shield=True):
                updated = record.adding(created, made_bucket, made_in_cloud)
                await k.write_record(kube, spec.namespace, updated, record_map, timeout=timeout)
    return outcomes


async def check_bucket_owner(
    buckets: BucketAdmin, spec: SetupSpec, *, timeout: float = STEP_TIMEOUT
) -> None:
    """Refuse an existing jobs bucket that the spec's project does not own.

    The bucket's name is predictable (``{project}-kn-{cluster}-jobs``) and global:
    another project may hold it, and jobs would then hand their payloads and results to
    that project. Checked where the project's number is known (not against an emulator).

    :raises ConfigError: naming the bucket, its owner and the way out.
    :raises StorageError: the bucket could not be looked at (another project's, which
        these credentials may not see, answers 403).
    """
    if spec.bucket is None or not spec.project_number:
        return
    owner = await buckets.project_number(spec.bucket, timeout=timeout)
    if owner != spec.project_number:
        raise ConfigError(
            f"the bucket gs://{spec.bucket} belongs to project number {owner}, not to "
            f"{spec.project} ({spec.project_number}): Kinetic will not send jobs to a "
            "bucket another project owns. Use another cluster name (the bucket is "
            "{project}-kn-{cluster}-jobs), or remove that bucket if it is yours"
        )


async def _annotate(
    kube: KubeClient,
    step: Step,
    found: Mapping[str, Any] | None,
    timeout: float,
    progress: Progress,
) -> str:
    """Give a service account an earlier ``up`` made the Workload Identity annotation
    it lacks (one made before ``up`` set it); a pre-existing one is left alone."""
    want = annotation_of(step.manifest)
    if step.action != "keep" or want is None or annotation_of(found) == want:
        return "kept" if step.action == "keep" else "pre-existing"
    progress(f"annotating {step.ref} with {WI_ANNOTATION}={want}")
    body = {"metadata": {"annotations": {WI_ANNOTATION: want}}}
    await kube._request(
        "PATCH", step.ref.path, what=f"annotate {step.ref}", body=body, timeout=timeout
    )
    return "annotated"


async def teardown_plan(
    kube: KubeClient, namespace: str, *, timeout: float = STEP_TIMEOUT
) -> Record:
    """What ``down`` would remove in ``namespace`` (the record; empty: nothing).

    :raises ConfigError: the record is malformed.
    """
    record, _ = await k.read_record(kube, namespace, timeout=timeout)
    return record


def describe(record: Record, namespace: str) -> list[str]:
    """The things ``down`` removes, one line each, in order (for its prompt). Pure."""
    lines = [str(r.ref) for r in down_order(record) if r.ref.kind != "Namespace"]
    lines += cloud_lines(record)
    if record.bucket:
        lines.append(f"bucket gs://{record.bucket} and every object in it")
    if not record.empty:
        lines.append(str(record_ref(namespace)) + " (the record of `kinetic up`)")
    if owns_namespace(record, namespace):
        lines.append(f"Namespace {namespace} and everything in it")
    return lines


def cloud_lines(record: Record) -> list[str]:
    """The Google Cloud things ``down`` removes, one line each, in order. Pure."""
    return [_removal_line(i) for i in removal_order(record.cloud)]


def _removal_line(item: CloudItem) -> str:
    if item.kind == "repository":
        return f"{item} and every image in it"
    return str(item)


async def tear_down(
    kube: KubeClient,
    buckets: BucketAdmin | None,
    namespace: str,
    *,
    timeout: float = STEP_TIMEOUT,
    progress: Progress = _quiet,
    empty: Callable[[str, float], Awaitable[None]] | None = None,
    cloud: CloudRemoval | None = None,
) -> list[Outcome]:
    """Remove exactly what ``up`` recorded in ``namespace`` (see the module docstring).

    :param empty: ``await empty(name, timeout)`` deletes every object of the
        bucket before it is deleted (default: through :class:`GCSStorage`).
    :param cloud: ``await cloud(items)`` removes the recorded Google Cloud items
        (:func:`kinetic._infra.cloud.remove`), after the Kubernetes objects and
        before the bucket.
    :raises ConfigError: the record is malformed (nothing is deleted).
    :raises BackendError: a deletion failed (what is left stays recorded).
    :raises StorageError: the bucket could not be emptied or deleted.
    """
    record, record_map = await k.read_record(kube, namespace, timeout=timeout)
    if record_map is None:
        return []
    outcomes: list[Outcome] = []
    order = down_order(record)
    namespaces = [r for r in order if r.ref.kind == "Namespace"]
    for r in order:
        if r.ref.kind == "Namespace":
            continue
        progress(f"deleting {r.ref}")
        result = await k.delete(kube, r.ref, r.uid, timeout=timeout)
        outcomes.append(Outcome(str(r.ref), result))
    if record.cloud:
        if cloud is None:
            raise ConfigError(
                "`kinetic up` created Google Cloud resources here (a repository, a service "
                "account, IAM grants): run `kinetic down` with the project, not --use-kubeconfig"
            )
        outcomes += await cloud(record.cloud)
        # What is gone is no longer recorded, whatever fails next.
        record = record.without_cloud()
        await k.write_record(kube, namespace, record, record_map, timeout=timeout)
        record_map = (await k.read_record(kube, namespace, timeout=timeout))[1]
    if record.bucket is not None:
        item = f"bucket gs://{record.bucket}"
        if buckets is None:
            raise ConfigError(f"{item} was created by `kinetic up` but no project is configured")
        progress(f"emptying and deleting {item}")
        await (empty or empty_bucket)(record.bucket, timeout)
        gone = await buckets.delete(record.bucket, timeout=timeout)
        outcomes.append(Outcome(item, "deleted" if gone else "gone"))
    ref = record_ref(namespace)
    result = await k.delete(kube, ref, uid_of(record_map) or "", timeout=timeout)
    outcomes.append(Outcome(str(ref), result))
    for r in namespaces:
        progress(f"deleting {r.ref} (and waiting until it is gone)")
        result = await k.delete(kube, r.ref, r.uid, timeout=timeout)
        if result == "deleted":
            await k.wait_until(kube, r.ref, gone=True, timeout=timeout)
        outcomes.append(Outcome(str(r.ref), result))
    return outcomes


async def empty_bucket(bucket: str, timeout: float) -> None:
    """Delete every object of ``bucket`` (through :class:`GCSStorage`)."""
    from kinetic._storage.gcs import GCSStorage

    async with GCSStorage(bucket) as store:
        await store.delete_prefix("", timeout=timeout)


async def inspect(
    kube: KubeClient,
    buckets: BucketAdmin | None,
    spec: SetupSpec,
    *,
    lws_crd: Mapping[str, Any] | None = None,
    timeout: float = STEP_TIMEOUT,
) -> list[StatusRow]:
    """What exists of what ``up`` sets up (rows of ``kinetic status``)."""
    wanted = desired_objects(spec, lws_crd if lws_crd is not None else packaged_lws_crd())
    refs: list[ObjectRef] = [ref for ref, _ in wanted]
    live = await k.read_all(kube, refs, timeout=timeout)
    record, _ = await k.read_record(kube, spec.namespace, timeout=timeout)
    present: bool | None = None
    if spec.bucket is not None and buckets is not None:
        present = await buckets.exists(spec.bucket, timeout=timeout)
    bucket = spec.bucket if buckets is not None else None
    return status_rows(wanted, live, record, bucket=bucket, bucket_present=present)
