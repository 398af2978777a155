"""Google REST calls as values, and IAM policy edits. Pure.

A :class:`Call` names the API it goes to (``iam``, ``artifactregistry``,
``cloudresourcemanager``, ``storage``), its method, path, query and JSON body; the
IO edge (:mod:`kinetic._infra.google_rest`) sends it. No IO here.

IAM policies are read-modify-written: get the policy (with its ``etag``), add or
remove one member of one role's binding, set it back with the same ``etag`` (the
API refuses a stale one with HTTP 409 ``ABORTED``: read again and retry). The edits
below touch one member of one unconditional binding and leave everything else as
it was -- other members, other roles, conditional bindings, the version.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

POLICY_VERSION = 3
"""The policy version requested (conditional bindings are only readable at 3)."""


@dataclass(frozen=True)
class Call:
    """One Google REST call.

    :ivar api: which API root it goes to (a key of the client's base URLs).
    :ivar method: the HTTP method.
    :ivar path: the path under the API root.
    :ivar params: query parameters.
    :ivar body: the JSON body, or None.
    :ivar what: the call in words, for errors.
    """

    api: str
    method: str
    path: str
    params: Mapping[str, str] = field(default_factory=dict)
    body: dict[str, Any] | None = None
    what: str = ""


@dataclass(frozen=True, order=True)
class Grant:
    """One member bound to one role on one resource (``target`` says which kind:
    ``bucket``, ``repository`` or ``service-account``; ``resource`` names it)."""

    target: str
    resource: str
    role: str
    member: str

    def __str__(self) -> str:
        return f"{self.role} for {self.member} on {self.target} {self.resource}"


def _unconditional(binding: Mapping[str, Any], role: str) -> bool:
    return binding.get("role") == role and not binding.get("condition")


def has_member(policy: Mapping[str, Any], role: str, member: str) -> bool:
    """Whether ``member`` holds ``role`` unconditionally in ``policy``."""
    return any(
        _unconditional(b, role) and member in (b.get("members") or [])
        for b in policy.get("bindings") or []
    )


def with_member(policy: Mapping[str, Any], role: str, member: str) -> dict[str, Any] | None:
    """``policy`` plus ``member`` in ``role`` (None: it is there already). The etag is
    kept, so that setting the result fails if the policy changed meanwhile."""
    if has_member(policy, role, member):
        return None
    doc = copy.deepcopy(dict(policy))
    bindings: list[dict[str, Any]] = doc.setdefault("bindings", [])
    for b in bindings:
        if _unconditional(b, role):
            b.setdefault("members", []).append(member)
            break
    else:
        bindings.append({"role": role, "members": [member]})
    return doc


def without_member(policy: Mapping[str, Any], role: str, member: str) -> dict[str, Any] | None:
    """``policy`` less ``member`` in ``role`` (None: it was not there). A binding left
    with no member goes (the APIs refuse empty ones)."""
    if not has_member(policy, role, member):
        return None
    doc = copy.deepcopy(dict(policy))
    kept: list[dict[str, Any]] = []
    for b in doc.get("bindings") or []:
        if _unconditional(b, role):
            b["members"] = [m for m in b.get("members") or [] if m != member]
            if not b["members"]:
                continue
        kept.append(b)
    doc["bindings"] = kept
    return doc
