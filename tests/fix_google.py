"""A stateful stand-in for the Google REST APIs ``kinetic up`` calls beside GKE's,
served on loopback (``tests.loopback_http``, a port per API host): none of them has an
emulator (DESIGN.md §6).

It speaks their documented wire format:

* Artifact Registry v1: repositories under ``/v1/projects/{p}/locations/{l}``,
  ``create`` with ``?repositoryId=`` answering a long-running ``Operation``
  (``{"name", "done"}``, polled at ``GET /v1/{name}``, done after ``polls`` polls),
  ``GET {repo}:getIamPolicy`` and ``POST {repo}:setIamPolicy {"policy"}``;
* IAM v1: ``POST /v1/projects/{p}/serviceAccounts {"accountId", "serviceAccount"}``
  (ids of 6-30 characters ``[a-z]([-a-z0-9]*[a-z0-9])``, else 400), ``GET``/``DELETE``
  by email, ``POST ...:getIamPolicy`` / ``:setIamPolicy``; a policy naming a service
  account the API does not know (yet) is refused with 400 "does not exist";
* Resource Manager v1: ``GET /v1/projects/{p}`` with ``projectNumber``;
* Storage JSON v1: ``GET``/``PUT /storage/v1/b/{bucket}/iam``.

Every policy carries an ``etag``; a ``setIamPolicy`` with a stale one is refused
with 409 ``ABORTED``. Errors are ``{"error": {"code", "message", "status"}}``.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

from aiohttp import web

from kinetic._infra import identity, registry
from tests.loopback_http import Loopback, Request, reply, serve, serve_in_thread

ACCOUNT_ID = re.compile(r"[a-z](?:[-a-z0-9]{4,28}[a-z0-9])")
PROJECT_NUMBER = "123456789012"
HOSTS = {
    identity.IAM_API: "iam.googleapis.com",
    identity.CRM_API: "cloudresourcemanager.googleapis.com",
    identity.STORAGE_API: "storage.googleapis.com",
    registry.API: "artifactregistry.googleapis.com",
}
"""The host of each API root, by :class:`~kinetic._infra.google_rest.GoogleRest`'s key."""


def error(code: int, status: str, message: str) -> web.Response:
    return reply(code, json={"error": {"code": code, "message": message, "status": status}})


def roots(server: Loopback) -> dict[str, str]:
    """``GoogleRest``'s ``roots``: each API at its host's port of ``server``."""
    return {api: server.urls[host] for api, host in HOSTS.items()}


class FakeGoogle:
    """The state of one project ``project``: repositories, service accounts, buckets
    and the IAM policy of each."""

    def __init__(self, project: str = "p", polls: int = 1) -> None:
        self.project = project
        self.polls = polls
        self.repositories: dict[str, dict[str, Any]] = {}
        self.accounts: dict[str, dict[str, Any]] = {}
        self.buckets: set[str] = set()
        self.policies: dict[str, dict[str, Any]] = {}
        self.operations: dict[str, dict[str, Any]] = {}
        self.requests: list[Request] = []
        self.faults: list[web.Response] = []
        """Answers to give instead of the next requests (``BREAK``: a transport fault)."""
        self.unknown_for: dict[str, int] = {}
        """email -> how many more policies naming it are refused (propagation)."""
        self.interfere: dict[str, dict[str, Any]] = {}
        """resource -> a binding someone else adds just before our next set."""
        self._serial = 0

    # -- helpers for tests ------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def serve(self) -> AsyncIterator[dict[str, str]]:
        """Serve the APIs in the running loop; yields ``GoogleRest``'s ``roots``."""
        async with serve(self.handle, *HOSTS.values()) as server:
            yield roots(server)

    @contextlib.contextmanager
    def serve_in_thread(self) -> Iterator[dict[str, str]]:
        """:meth:`serve`, on a thread of its own (for code that runs its own loops)."""
        with serve_in_thread(self.handle, *HOSTS.values()) as server:
            yield roots(server)

    def policy(self, resource: str) -> dict[str, Any]:
        return self.policies.setdefault(resource, {"version": 1, "etag": "BwA=", "bindings": []})

    def members(self, resource: str, role: str) -> list[str]:
        found: list[str] = []
        for b in self.policy(resource).get("bindings", []):
            if b["role"] == role:
                found += b["members"]
        return found

    def add_repository(self, name: str) -> None:
        self.repositories[name] = {"name": name, "format": "DOCKER", "createTime": self._time()}
        self.policy(name)

    def add_account(self, email: str) -> None:
        self.accounts[email] = self._account(email)
        self.policy(f"projects/{self.project}/serviceAccounts/{email}")

    def writes(self) -> list[Request]:
        return [r for r in self.requests if r.method != "GET" and not _reads(r)]

    # -- the wire ---------------------------------------------------------------------

    def _time(self) -> str:
        self._serial += 1
        return f"2026-01-01T00:00:{self._serial:02d}Z"

    def _account(self, email: str) -> dict[str, Any]:
        self._serial += 1
        return {
            "name": f"projects/{self.project}/serviceAccounts/{email}",
            "projectId": self.project,
            "uniqueId": str(100000 + self._serial),
            "email": email,
        }

    async def handle(self, request: Request) -> web.Response:
        self.requests.append(request)
        if self.faults:
            return self.faults.pop(0)
        assert request.headers["authorization"].startswith("Bearer "), request.headers
        host, path, method = request.host, request.path, request.method
        body: Any = json.loads(request.content) if request.content else None
        if host == "artifactregistry.googleapis.com":
            return self._registry(method, path, request.params, body)
        if host == "iam.googleapis.com":
            return self._iam(method, path, body)
        if host == "cloudresourcemanager.googleapis.com":
            if method == "GET" and path == f"/v1/projects/{self.project}":
                return reply(200, json={"projectId": self.project, "projectNumber": PROJECT_NUMBER})
            return error(403, "PERMISSION_DENIED", "no such project")
        if host == "storage.googleapis.com":
            m = re.fullmatch(r"/storage/v1/b/([^/]+)/iam", path)
            assert m, path
            if m[1] not in self.buckets:
                return error(404, "NOT_FOUND", "The specified bucket does not exist.")
            if method == "GET":
                assert request.params.get("optionsRequestedPolicyVersion") == "3"
                return reply(200, json={**self.policy(m[1]), "kind": "storage#policy"})
            assert method == "PUT"
            return self._set_policy(m[1], body)
        raise AssertionError(f"unexpected host {host}")

    def _registry(self, method: str, path: str, params: dict[str, str], body: Any) -> web.Response:
        if m := re.fullmatch(r"/v1/(projects/[^/]+/locations/[^/]+/operations/[^/:]+)", path):
            op = self.operations.get(m[1])
            if op is None:
                return error(404, "NOT_FOUND", "no such operation")
            op["polls"] -= 1
            if op["polls"] <= 0 and not op["done"]:
                op["done"] = True
                op["then"]()
            return reply(200, json={"name": op["name"], "done": op["done"]})
        if m := re.fullmatch(r"/v1/(projects/([^/]+)/locations/([^/]+))/repositories", path):
            assert method == "POST", method
            assert body["format"] == "DOCKER", body
            name = f"{m[1]}/repositories/{params['repositoryId']}"
            if name in self.repositories:
                return error(409, "ALREADY_EXISTS", f"the repository already exists: {name}")
            return self._operation(m[1], lambda: self._made_repository(name, body))
        if m := re.fullmatch(
            r"/v1/(projects/[^/]+/locations/[^/]+/repositories/[^/:]+)(:\w+)?", path
        ):
            name, verb = m[1], m[2]
            if name not in self.repositories:
                return error(404, "NOT_FOUND", f"Requested entity was not found: {name}")
            if verb == ":getIamPolicy":
                assert method == "GET"
                assert params.get("options.requestedPolicyVersion") == "3"
                return reply(200, json=self.policy(name))
            if verb == ":setIamPolicy":
                assert method == "POST"
                return self._set_policy(name, body["policy"])
            if method == "GET":
                return reply(200, json=self.repositories[name])
            assert method == "DELETE"
            location = name.rsplit("/repositories/", 1)[0]
            return self._operation(location, lambda: self._forget(name))
        raise AssertionError(f"unexpected Artifact Registry path {path}")

    def _made_repository(self, name: str, body: dict[str, Any]) -> None:
        self.repositories[name] = {"name": name, **body, "createTime": self._time()}
        self.policy(name)

    def _forget(self, resource: str) -> None:
        self.repositories.pop(resource, None)
        self.policies.pop(resource, None)

    def _operation(self, location: str, then: Any) -> web.Response:
        name = f"{location}/operations/op-{len(self.operations) + 1}"
        self.operations[name] = {"name": name, "done": False, "polls": self.polls, "then": then}
        return reply(200, json={"name": name, "done": False})

    def _iam(self, method: str, path: str, body: Any) -> web.Response:
        root = f"/v1/projects/{self.project}/serviceAccounts"
        if path == root:
            assert method == "POST"
            account = body["accountId"]
            if not ACCOUNT_ID.fullmatch(account):
                return error(400, "INVALID_ARGUMENT", f"invalid account id {account!r}")
            address = f"{account}@{self.project}.iam.gserviceaccount.com"
            if address in self.accounts:
                return error(409, "ALREADY_EXISTS", f"Service account {account} already exists")
            self.accounts[address] = {**self._account(address), **body["serviceAccount"]}
            self.policy(f"projects/{self.project}/serviceAccounts/{address}")
            return reply(200, json=self.accounts[address])
        m = re.fullmatch(re.escape(root) + r"/([^/:]+)(:\w+)?", path)
        assert m, path
        address, verb = m[1], m[2]
        if address not in self.accounts:
            return error(404, "NOT_FOUND", f"Unknown service account {address}")
        resource = f"projects/{self.project}/serviceAccounts/{address}"
        if verb == ":getIamPolicy":
            assert method == "POST"
            assert body == {"options": {"requestedPolicyVersion": 3}}, body
            return reply(200, json=self.policy(resource))
        if verb == ":setIamPolicy":
            assert method == "POST"
            return self._set_policy(resource, body["policy"])
        if method == "GET":
            return reply(200, json=self.accounts[address])
        assert method == "DELETE"
        del self.accounts[address]
        self.policies.pop(resource, None)
        return reply(200, json={})

    def _set_policy(self, resource: str, policy: dict[str, Any]) -> web.Response:
        current = self.policy(resource)
        if resource in self.interfere:  # someone else's edit lands first
            current["bindings"].append(self.interfere.pop(resource))
            current["etag"] = f"Bw{self._serial}{len(current['bindings'])}="
            self._serial += 1
        if policy.get("etag") != current["etag"]:
            return error(409, "ABORTED", "There were concurrent policy changes.")
        for b in policy.get("bindings", []):
            for member in b["members"]:
                address = member.removeprefix("serviceAccount:")
                if self.unknown_for.get(address, 0) > 0:
                    self.unknown_for[address] -= 1
                    return error(
                        400, "INVALID_ARGUMENT", f"Service account {address} does not exist."
                    )
        self._serial += 1
        stored = {
            "version": policy.get("version", 1),
            "etag": f"Bw{self._serial}=",
            "bindings": policy.get("bindings", []),
        }
        self.policies[resource] = stored
        return reply(200, json=stored)


def _reads(request: Request) -> bool:
    return request.path.endswith(":getIamPolicy")
