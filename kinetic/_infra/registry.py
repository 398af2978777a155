"""The Artifact Registry REST API (v1) calls ``kinetic up`` makes. Pure.

Bundled images go to ``{region}-docker.pkg.dev/{project}/kinetic``: the Docker
repository ``kinetic`` of the project in the cluster's region
(:attr:`kinetic._core.config.Settings.default_registry`). Its resource name is
``projects/{project}/locations/{region}/repositories/kinetic``.

Shapes, from the API's reference: ``repositories.create`` is ``POST
/v1/{parent}/repositories?repositoryId=ID`` with a ``Repository`` body (``format``
``DOCKER``, ``description``, ``labels``) and answers a long-running ``Operation``
(``name``, ``done``, ``error`` ``{code, message}`` when it failed), polled at
``GET /v1/{operation name}``; ``repositories.get`` and ``repositories.delete``
(an ``Operation`` too) take the repository's name; ``getIamPolicy`` is ``GET
/v1/{name}:getIamPolicy?options.requestedPolicyVersion=3`` and ``setIamPolicy``
``POST /v1/{name}:setIamPolicy`` with ``{"policy": ...}``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kinetic._infra.iam import POLICY_VERSION, Call

API = "artifactregistry"
API_ROOT = "https://artifactregistry.googleapis.com"
REPOSITORY = "kinetic"
READER_ROLE = "roles/artifactregistry.reader"


def repository_name(project: str, region: str, repository: str = REPOSITORY) -> str:
    """The repository's resource name."""
    return f"projects/{project}/locations/{region}/repositories/{repository}"


def repository_url(project: str, region: str, repository: str = REPOSITORY) -> str:
    """Where images of the repository are pushed (``{region}-docker.pkg.dev/...``)."""
    return f"{region}-docker.pkg.dev/{project}/{repository}"


def get_repository(name: str) -> Call:
    return Call(API, "GET", f"/v1/{name}", what=f"get repository {name}")


def create_repository(
    project: str,
    region: str,
    repository: str = REPOSITORY,
    *,
    labels: Mapping[str, str] | None = None,
) -> Call:
    body: dict[str, Any] = {
        "format": "DOCKER",
        "description": "Images of Kinetic jobs (created by `kinetic up`)",
    }
    if labels:
        body["labels"] = dict(labels)
    return Call(
        API,
        "POST",
        f"/v1/projects/{project}/locations/{region}/repositories",
        params={"repositoryId": repository},
        body=body,
        what=f"create repository {repository_name(project, region, repository)}",
    )


def delete_repository(name: str) -> Call:
    return Call(API, "DELETE", f"/v1/{name}", what=f"delete repository {name}")


def get_operation(name: str) -> Call:
    return Call(API, "GET", f"/v1/{name}", what=f"get operation {name}")


def get_iam_policy(name: str) -> Call:
    return Call(
        API,
        "GET",
        f"/v1/{name}:getIamPolicy",
        params={"options.requestedPolicyVersion": str(POLICY_VERSION)},
        what=f"get the IAM policy of repository {name}",
    )


def set_iam_policy(name: str, policy: Mapping[str, Any]) -> Call:
    return Call(
        API,
        "POST",
        f"/v1/{name}:setIamPolicy",
        body={"policy": dict(policy)},
        what=f"set the IAM policy of repository {name}",
    )


@dataclass(frozen=True)
class LongOperation:
    """A ``google.longrunning.Operation``: done or not, and what went wrong."""

    name: str
    done: bool
    error: str | None = None


def parse_operation(doc: Mapping[str, Any]) -> LongOperation:
    """Read an ``Operation``.

    :raises ValueError: it has no name (not an operation).
    """
    name = doc.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"not an operation: {json.dumps(dict(doc))[:200]}")
    err = doc.get("error")
    message = None
    if isinstance(err, Mapping) and (err.get("code") or err.get("message")):
        message = f"{err.get('message') or 'failed'} (code {err.get('code')})"
    return LongOperation(name=name, done=bool(doc.get("done")), error=message)
