"""``kinetic doctor``'s checks of who the pods are and what they may touch.

The pods' Kubernetes service account (``service-account``): the one
``KINETIC_GKE_SERVICE_ACCOUNT`` names, else ``kinetic`` when ``kinetic up`` made
it, else the namespace's default (the GKE backend's own choice,
:mod:`kinetic._backends.gke.pod_identity`). Where jobs reach Google Cloud for real
(a project and no storage emulator), it should carry the Workload Identity
annotation, and then, through the Google APIs:

* ``google-service-account``: the Google service account exists and lets the KSA
  act as it (``roles/iam.workloadIdentityUser`` for
  ``serviceAccount:{project}.svc.id.goog[{namespace}/{ksa}]``);
* ``bucket-access``: it may read and write the jobs bucket's objects;
* ``registry-access``: it, and the node pools' accounts (which pull the images), may
  read the image repository.

Each result that is not ok carries the command that fixes it (``kinetic up`` makes
all of it). The verdicts are pure functions of what was read; :func:`google_checks`
does the reading.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kinetic._cli.doctor_result import CheckResult, fail, ok, warn
from kinetic._core.config import Settings
from kinetic._exceptions import KineticError
from kinetic._infra import identity, registry
from kinetic._infra.iam import Grant, has_member

UP_ACCOUNT = "kinetic"
BUCKET_ROLES = ("roles/storage.objectUser", "roles/storage.objectAdmin", "roles/storage.admin")
"""Roles of which one gives a member object access on the bucket."""
REGISTRY_ROLES = (
    registry.READER_ROLE,
    "roles/artifactregistry.writer",
    "roles/artifactregistry.repoAdmin",
    "roles/artifactregistry.admin",
)


def workload_identity_applies(settings: Settings, env: Mapping[str, str]) -> bool:
    """Whether the jobs reach Google Cloud for real: a project, no storage emulator."""
    return bool(settings.project) and not env.get("STORAGE_EMULATOR_HOST")


def annotation(account: Mapping[str, Any] | None) -> str | None:
    if account is None:
        return None
    return ((account.get("metadata") or {}).get("annotations") or {}).get(
        identity.WI_ANNOTATION
    ) or None


def service_account_result(
    namespace: str,
    name: str,
    account: Mapping[str, Any] | None,
    *,
    explicit: bool,
    workload_identity: bool,
    gsa: str | None = None,
) -> CheckResult:
    """The pods' service account ``name`` (``account``: as read, None: absent). Pure.

    :param explicit: ``KINETIC_GKE_SERVICE_ACCOUNT`` named it.
    :param gsa: the Google service account ``kinetic up`` would bind it to.
    """
    where = f"{namespace}/{name}"
    up = f"kinetic up --service-account {name}" if name != UP_ACCOUNT else "kinetic up"
    if account is None:
        source = "KINETIC_GKE_SERVICE_ACCOUNT" if explicit else "the namespace's default"
        return fail(
            "service-account",
            f"service account {where} ({source}) does not exist",
            f"kubectl create serviceaccount {name} -n {namespace}, or `{up}` "
            "(which binds it through Workload Identity)",
        )
    bound = annotation(account)
    if not workload_identity:
        return ok("service-account", f"pods run as {where}")
    if bound is not None:
        return ok("service-account", f"pods run as {where}, acting as {bound} (Workload Identity)")
    if not explicit and name == "default":
        return warn(
            "service-account",
            f"pods run as {where}: `kinetic up` made no service account in {namespace}, so "
            "jobs reach Google Cloud as the nodes' account (often without bucket access)",
            "kinetic up (it makes `kinetic`, bound through Workload Identity to a Google "
            "service account with access to the bucket and the image repository)",
        )
    annotate = f"kubectl annotate serviceaccount {name} -n {namespace} {identity.WI_ANNOTATION}="
    return warn(
        "service-account",
        f"pods run as {where}, which has no {identity.WI_ANNOTATION} annotation: jobs "
        "reach Google Cloud as the nodes' account",
        f"`{up}`, or {annotate}{gsa or 'GSA_EMAIL'}",
    )


def account_result(
    project: str, namespace: str, ksa: str, gsa: str, account: Any, policy: Any
) -> CheckResult:
    """The Google service account and its Workload Identity grant. Pure."""
    name = "google-service-account"
    member = identity.wi_member(project, namespace, ksa)
    if account is None:
        return fail(
            name,
            f"{gsa} (the service account's annotation) does not exist",
            f"kinetic up, or gcloud iam service-accounts create {gsa.split('@')[0]} "
            f"--project {project}",
        )
    if policy is None or not has_member(policy, identity.WI_ROLE, member):
        return fail(
            name,
            f"{gsa} does not let {namespace}/{ksa} act as it ({identity.WI_ROLE} for "
            f"{member} is missing)",
            f"kinetic up, or gcloud iam service-accounts add-iam-policy-binding {gsa} "
            f"--role {identity.WI_ROLE} --member '{member}'",
        )
    return ok(name, f"{namespace}/{ksa} acts as {gsa}")


def _holds(policy: Any, roles: Sequence[str], member: str) -> bool:
    return policy is not None and any(has_member(policy, r, member) for r in roles)


def bucket_result(bucket: str, gsa: str, policy: Any) -> CheckResult:
    """Whether the Google service account may use the bucket's objects. Pure."""
    member = identity.sa_member(gsa)
    if _holds(policy, BUCKET_ROLES, member):
        return ok("bucket-access", f"{gsa} may read and write gs://{bucket}")
    return fail(
        "bucket-access",
        f"{gsa} has no object role on gs://{bucket}"
        + (" (no such bucket)" if policy is None else ""),
        f"kinetic up, or gcloud storage buckets add-iam-policy-binding gs://{bucket} "
        f"--member {member} --role {identity.BUCKET_ROLE}",
    )


def registry_result(
    project: str, region: str, gsa: str, nodes: Sequence[str] | None, policy: Any
) -> CheckResult:
    """Whether the pods' and the nodes' accounts may read the image repository. Pure.

    :param nodes: the node pools' accounts (None: unknown, not checked).
    """
    url = registry.repository_url(project, region)
    if policy is None:
        return fail(
            "registry-access",
            f"no repository {url}",
            f"kinetic up, or gcloud artifacts repositories create {registry.REPOSITORY} "
            f"--repository-format=docker --location {region} --project {project}",
        )
    lacking = [
        a
        for a in [gsa, *(nodes or ())]
        if not _holds(policy, REGISTRY_ROLES, f"serviceAccount:{a}")
    ]
    if not lacking:
        who = "the pods' and the nodes' accounts" if nodes else "the pods' account"
        return ok("registry-access", f"{who} may read {url}")
    # A project-wide role may grant it too: not an error for certain.
    grants = "; ".join(
        f"gcloud artifacts repositories add-iam-policy-binding {registry.REPOSITORY} "
        f"--location {region} --project {project} --member serviceAccount:{a} "
        f"--role {registry.READER_ROLE}"
        for a in lacking
    )
    return warn(
        "registry-access",
        f"{', '.join(lacking)} cannot read {url} (unless granted project-wide): pulls of "
        "its images may fail",
        f"kinetic up, or {grants}",
    )


async def google_checks(
    rest: Any,
    settings: Settings,
    *,
    ksa: str,
    gsa: str,
    node_accounts: Sequence[str] | None,
    timeout: float,
) -> list[CheckResult]:
    """Read what the verdicts above need (through a :class:`GoogleRest`) and judge.

    :raises KineticError: a read failed (the caller turns it into a failed check).
    """
    project, region = str(settings.project), settings.region
    ns = settings.namespace
    account = await rest.send(identity.get_service_account(project, gsa), timeout=timeout)
    wi = Grant(
        "service-account",
        f"projects/{project}/serviceAccounts/{gsa}",
        identity.WI_ROLE,
        identity.wi_member(project, ns, ksa),
    )
    policy = None
    if account is not None:
        policy = await rest.send(identity.get_policy(wi), timeout=timeout)
    results = [account_result(project, ns, ksa, gsa, account, policy)]
    bucket = settings.bucket_name
    member = identity.sa_member(gsa)
    bucket_policy = await rest.send(
        identity.get_policy(Grant("bucket", bucket, identity.BUCKET_ROLE, member)),
        timeout=timeout,
    )
    results.append(bucket_result(bucket, gsa, bucket_policy))
    repo_policy = await rest.send(
        registry.get_iam_policy(registry.repository_name(project, region)), timeout=timeout
    )
    results.append(registry_result(project, region, gsa, node_accounts, repo_policy))
    return results


async def node_accounts_of(
    settings: Settings, rest: Any, token: Any, timeout: float
) -> list[str] | None:
    """The node pools' service accounts of the settings' GKE cluster (None: it cannot
    be read, e.g. not a GKE cluster)."""
    from kinetic._infra.container import ContainerClient

    try:
        async with ContainerClient(
            token, project=str(settings.project), location=settings.zone, attempts=2
        ) as container:
            cluster = await container.get_cluster(settings.cluster)
        if cluster is None:
            return None
        accounts = [p.service_account for p in cluster.pools]
        number = None
        if any(a in ("", "default") for a in accounts):
            doc = await rest.send(identity.get_project(str(settings.project)), timeout=timeout)
            number = identity.project_number(doc or {})
        return identity.node_accounts(accounts, number)
    except KineticError:
        return None
