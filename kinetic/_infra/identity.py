"""Who the pods and the nodes are to Google, and what they may touch. Pure.

Theory of operation
-------------------
A job's pod runs as the Kubernetes service account ``up`` makes (``kinetic`` in the
jobs' namespace, the KSA). With Workload Identity (on in every cluster ``up``
creates) a KSA acts as a Google service account (the GSA) when two things hold:

* the KSA carries the annotation ``iam.gke.io/gcp-service-account: GSA_EMAIL``
  (:data:`WI_ANNOTATION`, set by :func:`kinetic._infra.plan.desired_objects`);
* the GSA's own IAM policy grants ``roles/iam.workloadIdentityUser`` to the member
  ``serviceAccount:{project}.svc.id.goog[{namespace}/{ksa}]`` (:func:`wi_member`).

``up`` makes one GSA per cluster and namespace (:func:`account_id`), and grants
(:func:`wanted_grants`): object access on the jobs bucket
(``roles/storage.objectUser``) and read access on the image repository
(``roles/artifactregistry.reader``) to the GSA; read access on the repository to
the node pools' service accounts too, so that the kubelet may pull the images
(a pool of the project's default Compute Engine account is
``{number}-compute@developer.gserviceaccount.com``: :func:`node_accounts`).

What ``up`` creates in Google Cloud is recorded as :class:`CloudItem` entries (the
repository, the GSA, each grant it added), beside the Kubernetes objects, so that
``down`` removes exactly those: a pre-existing repository or GSA is never deleted,
and a grant that was there before ``up`` is never revoked.

The IAM API's shapes, from its reference: ``serviceAccounts.create`` is ``POST
/v1/projects/{p}/serviceAccounts`` with ``{"accountId", "serviceAccount":
{"displayName", "description"}}`` (account ids: 6-30 characters,
``[a-z]([-a-z0-9]*[a-z0-9])``) and answers the ``ServiceAccount`` (``email``,
``uniqueId``); ``get``/``delete`` are at ``/v1/projects/{p}/serviceAccounts/{email}``;
``getIamPolicy``/``setIamPolicy`` are ``POST .../{email}:getIamPolicy`` (body
``{"options": {"requestedPolicyVersion": 3}}``) and ``POST ...:setIamPolicy``
(``{"policy": ...}``). The Storage JSON API's bucket policy is ``GET``/``PUT
/storage/v1/b/{bucket}/iam``. The project number comes from the Resource Manager's
``GET /v1/projects/{project}`` (``projectNumber``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kinetic._exceptions import ConfigError
from kinetic._infra import registry
from kinetic._infra.iam import POLICY_VERSION, Call, Grant

IAM_API = "iam"
IAM_ROOT = "https://iam.googleapis.com"
CRM_API = "cloudresourcemanager"
CRM_ROOT = "https://cloudresourcemanager.googleapis.com"
STORAGE_API = "storage"
STORAGE_ROOT = "https://storage.googleapis.com"

WI_ANNOTATION = "iam.gke.io/gcp-service-account"
WI_ROLE = "roles/iam.workloadIdentityUser"
BUCKET_ROLE = "roles/storage.objectUser"
REPOSITORY_ROLE = registry.READER_ROLE
_ACCOUNT_ID = re.compile(r"[a-z](?:[-a-z0-9]{4,28}[a-z0-9])")


# --------------------------------------------------------------------------- names


def account_id(cluster: str, namespace: str) -> str:
    """The GSA's account id for the jobs of ``namespace`` in ``cluster``:
    ``kn-{cluster}-{namespace}`` when that fits (6-30 characters), else a shortened
    form with a digest of both, so that two pairs never share a GSA."""
    plain = re.sub(r"[^a-z0-9-]+", "-", f"kn-{cluster}-{namespace}".lower()).strip("-")
    if _ACCOUNT_ID.fullmatch(plain):
        return plain
    digest = hashlib.sha256(f"{cluster}/{namespace}".encode()).hexdigest()[:8]
    return f"{plain[:18].rstrip('-')}-{digest}"


def email(project: str, account: str) -> str:
    """A user-managed service account's email."""
    return f"{account}@{project}.iam.gserviceaccount.com"


def wi_member(project: str, namespace: str, ksa: str) -> str:
    """The IAM member a KSA is, to Workload Identity."""
    return f"serviceAccount:{project}.svc.id.goog[{namespace}/{ksa}]"


def sa_member(address: str) -> str:
    return f"serviceAccount:{address}"


def node_accounts(pool_accounts: Iterable[str], project_number: str | None) -> list[str]:
    """The emails of the node pools' service accounts (sorted, once each); a pool
    whose account is ``default`` (or unset) uses the default Compute Engine one.

    :raises ConfigError: a pool uses the default account and the number is unknown.
    """
    found: set[str] = set()
    for account in pool_accounts:
        if account and account != "default":
            found.add(account)
            continue
        if not project_number:
            raise ConfigError("the project's number is needed for its default node account")
        found.add(f"{project_number}-compute@developer.gserviceaccount.com")
    return sorted(found)


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class CloudSpec:
    """What ``up`` sets up in Google Cloud for one cluster and namespace.

    :ivar project: the GCP project.
    :ivar region: the cluster's region (the repository's location).
    :ivar cluster: the GKE cluster.
    :ivar namespace: the jobs' namespace.
    :ivar ksa: the pods' Kubernetes service account.
    :ivar bucket: the jobs bucket (None: no bucket grant).
    :ivar node_accounts: the node pools' service accounts (pull access).
    :ivar repository: the repository id.
    """

    project: str
    region: str
    cluster: str
    namespace: str
    ksa: str
    bucket: str | None = None
    node_accounts: tuple[str, ...] = ()
    repository: str = registry.REPOSITORY

    @property
    def account_id(self) -> str:
        return account_id(self.cluster, self.namespace)

    @property
    def gsa(self) -> str:
        """The GSA's email."""
        return email(self.project, self.account_id)

    @property
    def repository_name(self) -> str:
        return registry.repository_name(self.project, self.region, self.repository)


def wanted_grants(spec: CloudSpec) -> list[Grant]:
    """Every grant ``up`` wants, in the order it adds them."""
    gsa = sa_member(spec.gsa)
    grants: list[Grant] = []
    if spec.bucket:
        grants.append(Grant("bucket", spec.bucket, BUCKET_ROLE, gsa))
    grants.append(Grant("repository", spec.repository_name, REPOSITORY_ROLE, gsa))
    for node in spec.node_accounts:
        grants.append(Grant("repository", spec.repository_name, REPOSITORY_ROLE, sa_member(node)))
    grants.append(
        Grant(
            "service-account",
            f"projects/{spec.project}/serviceAccounts/{spec.gsa}",
            WI_ROLE,
            wi_member(spec.project, spec.namespace, spec.ksa),
        )
    )
    return grants


# --------------------------------------------------------------------------- the record


CLOUD_KINDS = ("repository", "service-account", "grant")


@dataclass(frozen=True)
class CloudItem:
    """Something ``up`` created in Google Cloud.

    :ivar kind: ``repository`` (``name``: its resource name), ``service-account``
        (``name``: its email) or ``grant`` (``grant`` says which).
    :ivar name: see ``kind``.
    :ivar uid: what tells this one from a later one of the same name (the GSA's
        ``uniqueId``, the repository's ``createTime``); empty for a grant.
    :ivar grant: the grant, for kind ``grant``.
    """

    kind: str
    name: str
    uid: str = ""
    grant: Grant | None = None

    def __post_init__(self) -> None:
        if self.kind not in CLOUD_KINDS:
            raise ValueError(f"unknown kind {self.kind!r}")
        if (self.kind == "grant") != (self.grant is not None):
            raise ValueError("a grant item, and only one, carries its grant")

    def __str__(self) -> str:
        if self.grant is not None:
            return f"IAM grant {self.grant}"
        if self.kind == "repository":
            return f"Artifact Registry repository {self.name}"
        return f"Google service account {self.name}"

    def to_doc(self) -> dict[str, str]:
        doc = {"kind": self.kind, "name": self.name, "uid": self.uid}
        if self.grant is not None:
            doc.update(target=self.grant.target, role=self.grant.role, member=self.grant.member)
        return doc

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> CloudItem:
        """:raises KeyError, TypeError, ValueError: not an item."""
        kind, name = str(doc["kind"]), str(doc["name"])
        grant = None
        if kind == "grant":
            grant = Grant(str(doc["target"]), name, str(doc["role"]), str(doc["member"]))
        return cls(kind, name, str(doc.get("uid") or ""), grant)


def grant_item(grant: Grant) -> CloudItem:
    return CloudItem("grant", grant.resource, "", grant)


def removal_order(items: Iterable[CloudItem]) -> list[CloudItem]:
    """The order ``down`` removes them: the grants first (newest first), then the
    GSA, then the repository (a grant on a deleted resource is gone with it, but one
    on a pre-existing resource must be revoked while its member still exists)."""
    rank = {"grant": 0, "service-account": 1, "repository": 2}
    ordered = list(reversed(list(items)))
    return sorted(ordered, key=lambda i: rank[i.kind])


# --------------------------------------------------------------------------- calls


def get_project(project: str) -> Call:
    return Call(CRM_API, "GET", f"/v1/projects/{project}", what=f"get project {project}")


def project_number(doc: Mapping[str, Any]) -> str | None:
    value = doc.get("projectNumber")
    return str(value) if value else None


def _sa_path(project: str, address: str) -> str:
    return f"/v1/projects/{project}/serviceAccounts/{address}"


def get_service_account(project: str, address: str) -> Call:
    return Call(IAM_API, "GET", _sa_path(project, address), what=f"get service account {address}")


def create_service_account(project: str, account: str, *, cluster: str, namespace: str) -> Call:
    body = {
        "accountId": account,
        "serviceAccount": {
            "displayName": f"Kinetic jobs of {cluster}/{namespace}"[:100],
            "description": "Pods of Kinetic jobs act as this account (created by `kinetic up`)",
        },
    }
    return Call(
        IAM_API,
        "POST",
        f"/v1/projects/{project}/serviceAccounts",
        body=body,
        what=f"create service account {email(project, account)}",
    )


def delete_service_account(project: str, address: str) -> Call:
    return Call(
        IAM_API, "DELETE", _sa_path(project, address), what=f"delete service account {address}"
    )


def get_policy(grant: Grant) -> Call:
    """The call that reads the IAM policy ``grant`` is part of."""
    if grant.target == "bucket":
        return Call(
            STORAGE_API,
            "GET",
            f"/storage/v1/b/{grant.resource}/iam",
            params={"optionsRequestedPolicyVersion": str(POLICY_VERSION)},
            what=f"get the IAM policy of gs://{grant.resource}",
        )
    if grant.target == "repository":
        return registry.get_iam_policy(grant.resource)
    if grant.target == "service-account":
        return Call(
            IAM_API,
            "POST",
            f"/v1/{grant.resource}:getIamPolicy",
            body={"options": {"requestedPolicyVersion": POLICY_VERSION}},
            what=f"get the IAM policy of {grant.resource}",
        )
    raise ValueError(f"unknown grant target {grant.target!r}")


def set_policy(grant: Grant, policy: Mapping[str, Any]) -> Call:
    """The call that writes ``policy`` back where ``grant`` lives."""
    if grant.target == "bucket":
        return Call(
            STORAGE_API,
            "PUT",
            f"/storage/v1/b/{grant.resource}/iam",
            body=dict(policy),
            what=f"set the IAM policy of gs://{grant.resource}",
        )
    if grant.target == "repository":
        return registry.set_iam_policy(grant.resource, policy)
    if grant.target == "service-account":
        return Call(
            IAM_API,
            "POST",
            f"/v1/{grant.resource}:setIamPolicy",
            body={"policy": dict(policy)},
            what=f"set the IAM policy of {grant.resource}",
        )
    raise ValueError(f"unknown grant target {grant.target!r}")
