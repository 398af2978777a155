"""What ``kinetic up`` / ``down`` / ``status`` do in Google Cloud beside the cluster:
the image repository, the pods' Google service account and the IAM grants
(see :mod:`kinetic._infra.identity` for what and why).

Theory of operation
-------------------
:func:`ensure` makes what is missing, in order: the repository, the GSA, then each
grant of :func:`~kinetic._infra.identity.wanted_grants`. Each thing it creates is
appended to ``created`` at once, so that the caller records it even when a later
step fails. A repository or GSA that exists is left as it is (``kept`` when the
record says ``up`` made it, else ``pre-existing``); a grant already in its policy
is not added again, and only a grant ``up`` added is recorded.

A grant is a read-modify-write of the resource's policy with its ``etag``; a
concurrent change (HTTP 409) is read again and retried. A GSA just created takes a
few seconds to be known everywhere: a policy naming it may be refused meanwhile
(HTTP 400 "does not exist"), which is retried for a bounded time.

:func:`remove` takes exactly the recorded items away, grants first
(:func:`~kinetic._infra.identity.removal_order`): a grant by removing its member
from the policy; the GSA and the repository only while they are the ones ``up``
made (same ``uniqueId`` / ``createTime``, else ``changed``, left alone).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import anyio

from kinetic._exceptions import BackendError, ConfigError
from kinetic._infra import identity, registry
from kinetic._infra.gke_api import RESOURCE_LABEL, RESOURCE_LABEL_VALUE
from kinetic._infra.google_rest import Conflict, GoogleRest
from kinetic._infra.iam import Grant, has_member, with_member, without_member
from kinetic._infra.identity import CloudItem, CloudSpec, grant_item
from kinetic._infra.ops import Outcome
from kinetic._infra.plan import StatusRow

Progress = Callable[[str], None]
STEP_TIMEOUT = 60.0
POLICY_ATTEMPTS = 5
"""Read-modify-write rounds of one policy edit (each 409 costs one)."""
PROPAGATION_ATTEMPTS = 30
"""Tries of a policy naming a GSA that the IAM API does not know everywhere yet
(``poll_interval`` apart: about a minute, as new accounts may take)."""


def _quiet(_: str) -> None:
    pass


def _ours(record: Sequence[CloudItem], kind: str, name: str) -> CloudItem | None:
    return next((i for i in record if i.kind == kind and i.name == name), None)


async def ensure(
    rest: GoogleRest,
    spec: CloudSpec,
    record: Sequence[CloudItem],
    created: list[CloudItem],
    *,
    timeout: float = STEP_TIMEOUT,
    progress: Progress = _quiet,
) -> list[Outcome]:
    """Create what ``spec`` wants and is missing (see the module docstring).

    :param record: what earlier ``up`` runs created.
    :param created: receives each item as soon as it is created.
    :raises BackendError: refused or failed (what was made so far is in ``created``).
    :raises ConfigError: a request was refused as malformed.
    """
    outcomes: list[Outcome] = []
    name = spec.repository_name
    item = f"Artifact Registry repository {registry.repository_url(spec.project, spec.region)}"
    repo = await rest.send(registry.get_repository(name), timeout=timeout)
    if repo is None:
        progress(f"creating {item}")
        labels = {RESOURCE_LABEL: RESOURCE_LABEL_VALUE}
        try:
            op = await rest.send(
                registry.create_repository(
                    spec.project, spec.region, spec.repository, labels=labels
                ),
                timeout=timeout,
            )
        except Conflict:  # made meanwhile by someone else
            outcomes.append(Outcome(item, "pre-existing"))
        else:
            await rest.wait(op, what=f"create {item}")
            repo = await rest.send(registry.get_repository(name), timeout=timeout) or {}
            created.append(CloudItem("repository", name, str(repo.get("createTime") or "")))
            outcomes.append(Outcome(item, "created"))
    else:
        outcomes.append(Outcome(item, _kept(record, "repository", name, repo.get("createTime"))))

    gsa = spec.gsa
    item = f"Google service account {gsa}"
    account = await rest.send(identity.get_service_account(spec.project, gsa), timeout=timeout)
    fresh = False
    if account is None:
        progress(f"creating {item}")
        call = identity.create_service_account(
            spec.project, spec.account_id, cluster=spec.cluster, namespace=spec.namespace
        )
        try:
            account = await rest.send(call, timeout=timeout)
        except Conflict:
            outcomes.append(Outcome(item, "pre-existing"))
        else:
            fresh = True
            created.append(CloudItem("service-account", gsa, str(account.get("uniqueId") or "")))
            outcomes.append(Outcome(item, "created"))
    else:
        outcomes.append(
            Outcome(item, _kept(record, "service-account", gsa, account.get("uniqueId")))
        )

    for grant in identity.wanted_grants(spec):
        label = f"IAM grant {grant}"
        if await add_grant(rest, grant, timeout=timeout, settle=fresh, progress=progress):
            created.append(grant_item(grant))
            outcomes.append(Outcome(label, "created"))
        elif any(i.grant == grant for i in record):
            outcomes.append(Outcome(label, "kept"))
        else:
            outcomes.append(Outcome(label, "pre-existing"))
    return outcomes


def _kept(record: Sequence[CloudItem], kind: str, name: str, uid: Any) -> str:
    ours = _ours(record, kind, name)
    return "kept" if ours is not None and ours.uid == str(uid or "") else "pre-existing"


async def add_grant(
    rest: GoogleRest,
    grant: Grant,
    *,
    timeout: float = STEP_TIMEOUT,
    settle: bool = False,
    progress: Progress = _quiet,
) -> bool:
    """Add ``grant`` to its resource's policy; False when it was there already.

    :param settle: the member's GSA was just created: retry a refusal that says it
        does not exist (yet).
    :raises BackendError: the resource does not exist, or the edit was refused.
    """
    for tries in range(1, PROPAGATION_ATTEMPTS + 1):
        try:
            return await _edit(rest, grant, add=True, timeout=timeout, progress=progress)
        except ConfigError as exc:
            if not settle or "not exist" not in str(exc) or tries == PROPAGATION_ATTEMPTS:
                raise
            await anyio.sleep(rest.poll_interval)
    raise AssertionError("unreachable")


async def revoke_grant(rest: GoogleRest, grant: Grant, *, timeout: float = STEP_TIMEOUT) -> str:
    """Remove ``grant``: ``deleted``, or ``gone`` (not there, or no such resource)."""
    try:
        removed = await _edit(rest, grant, add=False, timeout=timeout)
    except _NoResource:
        return "gone"
    return "deleted" if removed else "gone"


class _NoResource(Exception):
    pass


async def _edit(
    rest: GoogleRest, grant: Grant, *, add: bool, timeout: float, progress: Progress = _quiet
) -> bool:
    for tries in range(1, POLICY_ATTEMPTS + 1):
        policy = await rest.send(identity.get_policy(grant), timeout=timeout)
        if policy is None:
            if not add:
                raise _NoResource(grant.resource)
            raise BackendError(
                f"cannot grant {grant}: the {grant.target} {grant.resource} does not exist"
            )
        if add:
            new = with_member(policy, grant.role, grant.member)
        else:
            new = without_member(policy, grant.role, grant.member)
        if new is None:
            return False
        if add:
            progress(f"granting {grant}")
        try:
            await rest.send(identity.set_policy(grant, new), timeout=timeout)
        except Conflict:  # the policy changed since it was read: read it again
            if tries == POLICY_ATTEMPTS:
                raise
            continue
        return True
    raise AssertionError("unreachable")


async def remove(
    rest: GoogleRest,
    project: str,
    items: Sequence[CloudItem],
    *,
    timeout: float = STEP_TIMEOUT,
    progress: Progress = _quiet,
) -> list[Outcome]:
    """Remove exactly ``items`` (see the module docstring).

    :raises BackendError: a removal was refused or failed.
    """
    outcomes: list[Outcome] = []
    for item in identity.removal_order(items):
        progress(f"removing {item}")
        if item.grant is not None:
            result = await revoke_grant(rest, item.grant, timeout=timeout)
        elif item.kind == "service-account":
            found = await rest.send(identity.get_service_account(project, item.name))
            result = _removable(found, "uniqueId", item.uid)
            if result == "deleted":
                gone = await rest.send(identity.delete_service_account(project, item.name))
                result = "gone" if gone is None else "deleted"
        else:
            found = await rest.send(registry.get_repository(item.name), timeout=timeout)
            result = _removable(found, "createTime", item.uid)
            if result == "deleted":
                op = await rest.send(registry.delete_repository(item.name), timeout=timeout)
                if op is None:
                    result = "gone"
                else:
                    await rest.wait(op, what=f"delete {item}")
        outcomes.append(Outcome(str(item), result))
    return outcomes


def _removable(found: Any, key: str, uid: str) -> str:
    if found is None:
        return "gone"
    if uid and str(found.get(key) or "") != uid:
        return "changed"
    return "deleted"


async def inspect(
    rest: GoogleRest,
    spec: CloudSpec,
    record: Sequence[CloudItem],
    *,
    timeout: float = STEP_TIMEOUT,
) -> list[StatusRow]:
    """The Google Cloud rows of ``kinetic status``: the repository, the GSA and each
    grant, present or not, and whether ``up`` made it."""
    rows: list[StatusRow] = []
    repo = await rest.send(registry.get_repository(spec.repository_name), timeout=timeout)
    url = registry.repository_url(spec.project, spec.region, spec.repository)
    rows.append(_row("repository", url, repo, record, "repository", spec.repository_name))
    account = await rest.send(identity.get_service_account(spec.project, spec.gsa))
    rows.append(_row("google-service-account", spec.gsa, account, record, "service-account"))
    for grant in identity.wanted_grants(spec):
        policy = await rest.send(identity.get_policy(grant), timeout=timeout)
        present = policy is not None and has_member(policy, grant.role, grant.member)
        managed = None
        if present:
            ours = any(i.grant == grant for i in record)
            managed = "kinetic up" if ours else "pre-existing"
        rows.append(StatusRow("iam-grant", str(grant), present, managed))
    return rows


def _row(
    component: str,
    shown: str,
    found: Any,
    record: Sequence[CloudItem],
    kind: str,
    name: str | None = None,
) -> StatusRow:
    if found is None:
        return StatusRow(component, shown, False)
    ours = _ours(record, kind, name or shown) is not None
    return StatusRow(component, shown, True, "kinetic up" if ours else "pre-existing")


# --------------------------------------------------------------------------- for a cluster


async def spec_for_cluster(
    rest: GoogleRest,
    *,
    project: str,
    region: str,
    cluster: str,
    namespace: str,
    ksa: str,
    bucket: str | None,
    pool_accounts: Sequence[str],
    timeout: float = STEP_TIMEOUT,
) -> CloudSpec:
    """The :class:`CloudSpec` of a GKE cluster whose node pools run as
    ``pool_accounts`` (asking the project's number when one is ``default``).

    :raises ConfigError: the project's number is needed and cannot be read.
    """
    number = None
    if any(a in ("", "default") for a in pool_accounts):
        doc = await rest.send(identity.get_project(project), timeout=timeout)
        number = identity.project_number(doc or {})
    return CloudSpec(
        project=project,
        region=region,
        cluster=cluster,
        namespace=namespace,
        ksa=ksa,
        bucket=bucket,
        node_accounts=tuple(identity.node_accounts(pool_accounts, number)),
    )
