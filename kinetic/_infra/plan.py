"""What ``kinetic up`` sets up inside a cluster, and what ``down`` takes away. Pure.

Theory of operation
-------------------
``up`` wants a fixed list of objects (:func:`desired_objects`), in creation order:
the namespace, the pods' service account, a Role and a RoleBinding giving that
account what a Kinetic client needs in the namespace, and the LeaderWorkerSet CRD
(cluster-scoped), each labelled ``app.kubernetes.io/managed-by=kinetic``. Beside
them, outside Kubernetes, the jobs bucket.

Given what exists (one GET per object), :func:`decide_up` says, per object:
``create`` (absent), ``keep`` (present, and created by an earlier ``up`` -- its uid is
in the record) or ``foreign`` (present, made by someone else: left alone, never
modified, never recorded). What ``up`` creates is written to the **record**, a
ConfigMap ``kinetic-setup`` in the namespace holding each object's kind, name and
uid, and whether the bucket was created (:class:`Record`).

``down`` reads the record and removes exactly the recorded objects
(:func:`down_order`: the reverse of creation, the namespace last), each deleted with
a uid precondition, so an object that was deleted and re-created by someone else
since ``up`` is left alone. A pre-existing namespace, service account or CRD is
never in the record, so ``down`` never touches it. Running ``up`` twice creates
nothing the second time and leaves the record unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from kinetic._exceptions import ConfigError
from kinetic._infra.identity import WI_ANNOTATION, CloudItem

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "kinetic"
RECORD_NAME = "kinetic-setup"
RECORD_KEY = "record.json"
RECORD_VERSION = 1
DEFAULT_SERVICE_ACCOUNT = "kinetic"
ROLE_NAME = "kinetic"
LWS_CRD_NAME = "leaderworkersets.leaderworkerset.x-k8s.io"

_API = {
    # kind -> (API prefix, resource plural, namespaced)
    "Namespace": ("/api/v1", "namespaces", False),
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "ConfigMap": ("/api/v1", "configmaps", True),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
    "CustomResourceDefinition": (
        "/apis/apiextensions.k8s.io/v1",
        "customresourcedefinitions",
        False,
    ),
}
_API_VERSION = {
    "Namespace": "v1",
    "ServiceAccount": "v1",
    "ConfigMap": "v1",
    "Role": "rbac.authorization.k8s.io/v1",
    "RoleBinding": "rbac.authorization.k8s.io/v1",
    "CustomResourceDefinition": "apiextensions.k8s.io/v1",
}

ROLE_RULES: tuple[dict[str, Any], ...] = (
    {
        "apiGroups": ["batch"],
        "resources": ["jobs"],
        "verbs": ["create", "get", "list", "watch", "delete", "deletecollection"],
    },
    {
        "apiGroups": [""],
        "resources": ["pods"],
        "verbs": ["get", "list", "watch", "delete", "deletecollection"],
    },
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["pods/portforward"], "verbs": ["create"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "list", "watch"]},
    {
        "apiGroups": ["leaderworkerset.x-k8s.io"],
        "resources": ["leaderworkersets"],
        "verbs": ["create", "get", "list", "watch", "delete", "deletecollection"],
    },
)
"""What a Kinetic client does in its namespace (submit, watch, read logs, attach a
debugger, cancel, clean up Jobs and LeaderWorkerSets). Bound to the pods' service
account, whose token a job's pod gets only when it asks (``KINETIC_GKE_JOB_API_ACCESS``:
a fan-out driver running in the cluster); the runner alone needs no Kubernetes API
access, and by default no pod has it."""


POD_SECURITY_LABELS = {
    "pod-security.kubernetes.io/enforce": "baseline",
    "pod-security.kubernetes.io/warn": "restricted",
    "pod-security.kubernetes.io/audit": "restricted",
}
"""Pod Security admission on the namespace ``up`` creates: no pod there may be
privileged, share the node's namespaces or mount its paths (``baseline``, enforced);
what ``restricted`` would refuse besides is reported (Kinetic's images run as root in
the container, without capabilities; GPU and TPU devices come from the device plugins,
which ``baseline`` allows). A cluster without a CNI, whose pods need the node's network
(``KINETIC_GKE_HOST_NETWORK``), must use a namespace of its own making."""


@dataclass(frozen=True, order=True)
class ObjectRef:
    """One Kubernetes object by kind and name (``namespace`` None: cluster-scoped)."""

    kind: str
    name: str
    namespace: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in _API:
            raise ValueError(f"unsupported kind {self.kind!r}")
        if _API[self.kind][2] != (self.namespace is not None):
            raise ValueError(f"{self.kind} {self.name!r}: namespace given wrongly")

    @property
    def collection(self) -> str:
        """The API path objects of this kind are created at."""
        prefix, plural, _ = _API[self.kind]
        if self.namespace is None:
            return f"{prefix}/{plural}"
        return f"{prefix}/namespaces/{self.namespace}/{plural}"

    @property
    def path(self) -> str:
        """The object's own API path."""
        return f"{self.collection}/{self.name}"

    def __str__(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind} {where}{self.name}"


@dataclass(frozen=True)
class SetupSpec:
    """What ``up`` sets up.

    :ivar namespace: the jobs' namespace.
    :ivar service_account: the pods' service account (``KINETIC_GKE_SERVICE_ACCOUNT``).
    :ivar bucket: the jobs bucket, or None (no project: no bucket).
    :ivar project: the GCP project the bucket belongs to.
    :ivar location: the bucket's location (the zone's region).
    :ivar lws_crd: install the LeaderWorkerSet CRD (``pathways``) when absent.
    :ivar gcp_service_account: the Google service account the pods act as through
        Workload Identity (the service account's ``iam.gke.io/gcp-service-account``
        annotation), or None.
    :ivar project_number: the project's number, when known (Resource Manager): an
        existing bucket of that name must belong to it. None where there is no
        project to ask (a storage emulator).
    """

    namespace: str
    service_account: str = DEFAULT_SERVICE_ACCOUNT
    bucket: str | None = None
    project: str | None = None
    location: str | None = None
    lws_crd: bool = True
    gcp_service_account: str | None = None
    project_number: str | None = None

    def __post_init__(self) -> None:
        for what, value in (
            ("namespace", self.namespace),
            ("service account", self.service_account),
        ):
            if not _dns_label(value):
                raise ConfigError(
                    f"invalid {what} {value!r}: lower-case letters, digits and '-', "
                    "at most 63 characters, starting and ending with a letter or digit"
                )


def _dns_label(name: str) -> bool:
    ok = all(c.isascii() and (c.islower() or c.isdigit() or c == "-") for c in name)
    return ok and 0 < len(name) <= 63 and name[0] != "-" and name[-1] != "-"


def labelled(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``manifest`` carrying the managed-by label (other labels kept)."""
    doc = json.loads(json.dumps(manifest))  # deep copy of plain JSON
    meta = doc.setdefault("metadata", {})
    meta.setdefault("labels", {})[MANAGED_BY_LABEL] = MANAGED_BY
    return dict(doc)


def record_ref(namespace: str) -> ObjectRef:
    """Where the record of ``up`` lives."""
    return ObjectRef("ConfigMap", RECORD_NAME, namespace)


def desired_objects(
    spec: SetupSpec, lws_crd: Mapping[str, Any] | None
) -> list[tuple[ObjectRef, dict[str, Any]]]:
    """The objects ``up`` wants, in creation order, each with its labelled manifest.

    :param lws_crd: the packaged LeaderWorkerSet CRD (left out when None or when
        ``spec.lws_crd`` is false).
    """
    ns, sa = spec.namespace, spec.service_account

    def obj(kind: str, name: str, namespace: str | None, **rest: Any) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name}
        if namespace is not None:
            meta["namespace"] = namespace
        return labelled({"apiVersion": _API_VERSION[kind], "kind": kind, "metadata": meta, **rest})

    # Pods of this account get no token unless their spec asks (KINETIC_GKE_JOB_API_ACCESS).
    account = obj("ServiceAccount", sa, ns, automountServiceAccountToken=False)
    if spec.gcp_service_account:
        account["metadata"]["annotations"] = {WI_ANNOTATION: spec.gcp_service_account}
    namespace = obj("Namespace", ns, None)
    namespace["metadata"]["labels"].update(POD_SECURITY_LABELS)
    wanted: list[tuple[ObjectRef, dict[str, Any]]] = [
        (ObjectRef("Namespace", ns), namespace),
        (ObjectRef("ServiceAccount", sa, ns), account),
        (
            ObjectRef("Role", ROLE_NAME, ns),
            obj("Role", ROLE_NAME, ns, rules=[dict(r) for r in ROLE_RULES]),
        ),
        (
            ObjectRef("RoleBinding", ROLE_NAME, ns),
            obj(
                "RoleBinding",
                ROLE_NAME,
                ns,
                roleRef={
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": ROLE_NAME,
                },
                subjects=[{"kind": "ServiceAccount", "name": sa, "namespace": ns}],
            ),
        ),
    ]
    if spec.lws_crd and lws_crd is not None:
        name = lws_crd.get("metadata", {}).get("name")
        if lws_crd.get("kind") != "CustomResourceDefinition" or not name:
            raise ConfigError("the packaged LeaderWorkerSet CRD is not a named CRD")
        wanted.append((ObjectRef("CustomResourceDefinition", name), labelled(lws_crd)))
    return wanted


# --------------------------------------------------------------------------- the record


@dataclass(frozen=True)
class Recorded:
    """An object ``up`` created: its reference and uid."""

    ref: ObjectRef
    uid: str


@dataclass(frozen=True)
class Record:
    """What ``up`` created in (and for) one namespace, in creation order.

    :ivar objects: the Kubernetes objects (the record's own ConfigMap excluded).
    :ivar bucket: the jobs bucket when ``up`` created it, else None.
    :ivar cloud: what it created in Google Cloud (repository, Google service
        account, IAM grants), in creation order.
    """

    objects: tuple[Recorded, ...] = ()
    bucket: str | None = None
    cloud: tuple[CloudItem, ...] = ()

    def uid_of(self, ref: ObjectRef) -> str | None:
        """The recorded uid of ``ref``, or None when ``up`` did not create it."""
        return next((r.uid for r in self.objects if r.ref == ref), None)

    def adding(
        self,
        created: Sequence[Recorded],
        bucket: str | None = None,
        cloud: Sequence[CloudItem] = (),
    ) -> Record:
        """This record plus ``created`` (and the bucket, when given, and ``cloud``)."""
        known = {r.ref for r in self.objects}
        fresh = tuple(r for r in created if r.ref not in known)
        more = tuple(i for i in cloud if i not in self.cloud)
        return Record(self.objects + fresh, bucket or self.bucket, self.cloud + more)

    def without_cloud(self) -> Record:
        """This record less its Google Cloud items (``down`` removed them)."""
        return Record(self.objects, self.bucket)

    @property
    def empty(self) -> bool:
        return not self.objects and self.bucket is None and not self.cloud

    def to_json(self) -> str:
        doc = {
            "version": RECORD_VERSION,
            "objects": [
                {"kind": r.ref.kind, "name": r.ref.name, "namespace": r.ref.namespace, "uid": r.uid}
                for r in self.objects
            ],
            "bucket": self.bucket,
            "cloud": [i.to_doc() for i in self.cloud],
        }
        return json.dumps(doc, indent=1, sort_keys=True)


def record_manifest(namespace: str, record: Record) -> dict[str, Any]:
    """The record as its ConfigMap (labelled)."""
    return labelled(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": RECORD_NAME, "namespace": namespace},
            "data": {RECORD_KEY: record.to_json()},
        }
    )


def parse_record(configmap: Mapping[str, Any] | None) -> Record:
    """The record held by ``configmap`` (None: no record, an empty one).

    :raises ConfigError: the ConfigMap exists but is not a record Kinetic can read
        (``down`` then refuses to guess what to delete).
    """
    if configmap is None:
        return Record()
    where = f"ConfigMap {RECORD_NAME}"
    try:
        doc = json.loads((configmap.get("data") or {})[RECORD_KEY])
        if doc.get("version") != RECORD_VERSION:
            raise ValueError(f"unknown version {doc.get('version')!r}")
        objects = tuple(
            Recorded(ObjectRef(o["kind"], o["name"], o.get("namespace")), str(o["uid"]))
            for o in doc.get("objects", [])
        )
        bucket = doc.get("bucket")
        if bucket is not None and not isinstance(bucket, str):
            raise ValueError("bucket must be a string")
        cloud = tuple(CloudItem.from_doc(i) for i in doc.get("cloud") or [])
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{where} is not a record of `kinetic up` ({exc}); left alone") from exc
    return Record(objects, bucket, cloud)


# --------------------------------------------------------------------------- decisions

Action = Literal["create", "keep", "foreign"]


@dataclass(frozen=True)
class Step:
    """What ``up`` does with one object: ``create`` it, ``keep`` it (made by an earlier
    ``up``), or leave it alone (``foreign``: it existed before)."""

    ref: ObjectRef
    action: Action
    manifest: dict[str, Any] = field(compare=False, repr=False, default_factory=dict)


def uid_of(obj: Mapping[str, Any] | None) -> str | None:
    """An API object's uid (None: no object)."""
    if obj is None:
        return None
    return str((obj.get("metadata") or {}).get("uid") or "") or None


def decide_up(
    wanted: Sequence[tuple[ObjectRef, dict[str, Any]]],
    live: Mapping[ObjectRef, Mapping[str, Any] | None],
    record: Record,
) -> list[Step]:
    """One step per wanted object, in order, given what exists (``live``: the object,
    or None when absent) and the record of earlier ``up`` runs."""
    steps: list[Step] = []
    for ref, manifest in wanted:
        found = live.get(ref)
        if found is None:
            steps.append(Step(ref, "create", manifest))
        elif record.uid_of(ref) is not None and record.uid_of(ref) == uid_of(found):
            steps.append(Step(ref, "keep", manifest))
        else:
            steps.append(Step(ref, "foreign", manifest))
    return steps


def down_order(record: Record) -> list[Recorded]:
    """The recorded objects in the order ``down`` deletes them: the reverse of their
    creation, except that a recorded namespace goes last (deleting it first would
    take the record, and with it the knowledge of what else to delete)."""
    namespaces = [r for r in record.objects if r.ref.kind == "Namespace"]
    others = [r for r in record.objects if r.ref.kind != "Namespace"]
    return list(reversed(others)) + list(reversed(namespaces))


def owns_namespace(record: Record, namespace: str) -> bool:
    """Whether ``up`` created ``namespace`` (``down`` then deletes it, with its content)."""
    return record.uid_of(ObjectRef("Namespace", namespace)) is not None


# --------------------------------------------------------------------------- status


@dataclass(frozen=True)
class StatusRow:
    """One line of ``kinetic status``.

    :ivar component: ``cluster``, ``pool``, ``namespace``, ``service-account``, ...
    :ivar name: the object's name.
    :ivar present: whether it exists.
    :ivar managed: ``kinetic up`` (created by ``up``, removed by ``down``),
        ``pre-existing`` (left alone) or None (absent).
    :ivar detail: more, for humans.
    """

    component: str
    name: str
    present: bool
    managed: str | None = None
    detail: str | None = None


_COMPONENT = {
    "Namespace": "namespace",
    "ServiceAccount": "service-account",
    "Role": "role",
    "RoleBinding": "role-binding",
    "CustomResourceDefinition": "lws-crd",
}


def status_rows(
    wanted: Sequence[tuple[ObjectRef, dict[str, Any]]],
    live: Mapping[ObjectRef, Mapping[str, Any] | None],
    record: Record,
    *,
    bucket: str | None,
    bucket_present: bool | None,
) -> list[StatusRow]:
    """The in-cluster part of ``kinetic status`` (and the bucket). Pure.

    :param bucket: the jobs bucket (None: no project, no bucket row).
    """
    rows: list[StatusRow] = []
    for step in decide_up(wanted, live, record):
        present = step.action != "create"
        managed = {"create": None, "keep": "kinetic up", "foreign": "pre-existing"}[step.action]
        detail = None
        if step.ref.kind == "ServiceAccount" and present:
            detail = identity_detail(step.manifest, live.get(step.ref))
        rows.append(StatusRow(_COMPONENT[step.ref.kind], step.ref.name, present, managed, detail))
    if bucket is not None:  # no project: no bucket to speak of
        ours = record.bucket == bucket
        managed = None if not bucket_present else ("kinetic up" if ours else "pre-existing")
        rows.append(StatusRow("bucket", f"gs://{bucket}", bool(bucket_present), managed))
    return rows


def annotation_of(obj: Mapping[str, Any] | None) -> str | None:
    """The Workload Identity annotation of a service account (None: none)."""
    if obj is None:
        return None
    return ((obj.get("metadata") or {}).get("annotations") or {}).get(WI_ANNOTATION) or None


def identity_detail(wanted: Mapping[str, Any], found: Mapping[str, Any] | None) -> str | None:
    """What ``kinetic status`` says of the pods' service account: whom it acts as
    in Google Cloud, and whether that is what ``up`` wants. Pure."""
    want, have = annotation_of(wanted), annotation_of(found)
    if have is None:
        return f"no {WI_ANNOTATION} annotation (wanted: {want})" if want else None
    if want and have != want:
        return f"acts as {have}, not {want}"
    return f"acts as {have} (Workload Identity)"


def missing(rows: Sequence[StatusRow]) -> list[StatusRow]:
    """The rows of things that do not exist (``up`` would create them)."""
    return [r for r in rows if not r.present]
