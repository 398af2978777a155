"""The Google Cloud side of ``kinetic up`` / ``down`` / ``status`` (the image
repository, the pods' Google service account, the IAM grants) against the
documented wire format of Artifact Registry, IAM, Resource Manager and the Storage
JSON API's bucket policies, served by ``tests.fix_google.FakeGoogle`` on loopback
(no emulator of these exists)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import aiohttp
import pytest

from kinetic._exceptions import BackendError, KineticError
from kinetic._infra import cloud
from kinetic._infra.google_rest import GoogleRest
from kinetic._infra.identity import (
    BUCKET_ROLE,
    REPOSITORY_ROLE,
    WI_ROLE,
    CloudItem,
    CloudSpec,
)
from kinetic._infra.ops import Outcome
from tests.fix_google import PROJECT_NUMBER, FakeGoogle, error
from tests.loopback_http import BREAK

REPO = "projects/p/locations/us-central1/repositories/kinetic"
GSA = "kn-c-jobs@p.iam.gserviceaccount.com"
GSA_RESOURCE = f"projects/p/serviceAccounts/{GSA}"
NODES = "nodes@p.iam.gserviceaccount.com"
SPEC = CloudSpec(
    project="p",
    region="us-central1",
    cluster="c",
    namespace="jobs",
    ksa="kinetic",
    bucket="p-kn-c-jobs",
    node_accounts=(NODES,),
)
WI_MEMBER = "serviceAccount:p.svc.id.goog[jobs/kinetic]"


async def token() -> str:
    return "t0ken"


@pytest.fixture
def google() -> FakeGoogle:
    fake = FakeGoogle()
    fake.buckets.add("p-kn-c-jobs")
    return fake


@pytest.fixture
async def rest(google: FakeGoogle) -> AsyncIterator[GoogleRest]:
    async with (
        google.serve() as roots,
        GoogleRest(token, roots=roots, backoff=0.001, poll_interval=0.001) as client,
    ):
        yield client


def results(outcomes: list[Outcome]) -> dict[str, str]:
    return {o.item: o.result for o in outcomes}


async def test_a_fresh_project_gets_the_repository_the_account_and_every_grant(
    google: FakeGoogle, rest: GoogleRest
) -> None:
    created: list[CloudItem] = []
    outcomes = await cloud.ensure(rest, SPEC, (), created)
    assert set(results(outcomes).values()) == {"created"}
    # The documented request shapes.
    create_repo = next(r for r in google.requests if r.url.path.endswith("/repositories"))
    assert create_repo.method == "POST"
    assert create_repo.url.path == "/v1/projects/p/locations/us-central1/repositories"
    assert create_repo.params["repositoryId"] == "kinetic"
    body = json.loads(create_repo.content)
    assert body["format"] == "DOCKER"
    assert body["labels"] == {"managed-by": "kinetic"}
    create_sa = next(r for r in google.requests if r.url.path == "/v1/projects/p/serviceAccounts")
    assert json.loads(create_sa.content)["accountId"] == "kn-c-jobs"
    # What exists now.
    assert REPO in google.repositories
    assert GSA in google.accounts
    assert google.members("p-kn-c-jobs", BUCKET_ROLE) == [f"serviceAccount:{GSA}"]
    assert google.members(REPO, REPOSITORY_ROLE) == [
        f"serviceAccount:{GSA}",
        f"serviceAccount:{NODES}",
    ]
    assert google.members(GSA_RESOURCE, WI_ROLE) == [WI_MEMBER]
    # Everything is recorded, in creation order, with what tells it from a successor.
    assert [i.kind for i in created] == ["repository", "service-account"] + ["grant"] * 4
    assert created[0].uid == google.repositories[REPO]["createTime"]
    assert created[1].uid == google.accounts[GSA]["uniqueId"]
    assert [CloudItem.from_doc(i.to_doc()) for i in created] == created


async def test_up_again_changes_nothing_and_keeps_what_it_made(
    google: FakeGoogle, rest: GoogleRest
) -> None:
    first: list[CloudItem] = []
    await cloud.ensure(rest, SPEC, (), first)
    google.requests.clear()
    again: list[CloudItem] = []
    outcomes = await cloud.ensure(rest, SPEC, first, again)
    assert again == []
    assert set(results(outcomes).values()) == {"kept"}
    assert google.writes() == []


async def test_what_existed_is_left_alone_and_only_missing_grants_are_recorded(
    google: FakeGoogle, rest: GoogleRest
) -> None:
    google.add_repository(REPO)
    google.policy(REPO)["bindings"] = [
        {"role": "roles/artifactregistry.writer", "members": ["user:a@example.com"]},
        {"role": REPOSITORY_ROLE, "members": [f"serviceAccount:{NODES}"]},
    ]
    google.add_account(GSA)
    created: list[CloudItem] = []
    outcomes = results(await cloud.ensure(rest, SPEC, (), created))
    assert outcomes["Artifact Registry repository us-central1-docker.pkg.dev/p/kinetic"] == (
        "pre-existing"
    )
    assert outcomes[f"Google service account {GSA}"] == "pre-existing"
    node_grant = f"IAM grant {REPOSITORY_ROLE} for serviceAccount:{NODES} on repository {REPO}"
    assert outcomes[node_grant] == "pre-existing"
    assert [i.kind for i in created] == ["grant"] * 3
    assert all(i.grant is not None and i.grant.member != f"serviceAccount:{NODES}" for i in created)

    # down: exactly the three grants go; the repository, its other bindings, the
    # node account's pre-existing grant and the account stay.
    done = results(await cloud.remove(rest, "p", created))
    assert set(done.values()) == {"deleted"}
    assert REPO in google.repositories
    assert GSA in google.accounts
    assert google.members(REPO, "roles/artifactregistry.writer") == ["user:a@example.com"]
    assert google.members(REPO, REPOSITORY_ROLE) == [f"serviceAccount:{NODES}"]
    assert google.members("p-kn-c-jobs", BUCKET_ROLE) == []
    assert google.members(GSA_RESOURCE, WI_ROLE) == []


async def test_down_removes_exactly_what_up_made_and_leaves_a_successor(
    google: FakeGoogle, rest: GoogleRest
) -> None:
    created: list[CloudItem] = []
    await cloud.ensure(rest, SPEC, (), created)
    google.policy("p-kn-c-jobs")["bindings"].append(
        {"role": "roles/storage.admin", "members": ["user:owner@example.com"]}
    )
    # Someone deletes the account and makes another of the same name since.
    del google.accounts[GSA]
    google.add_account(GSA)
    done = await cloud.remove(rest, "p", created)
    order = [o.item.split(" ")[0:3] for o in done]
    assert [o[0] for o in order][:4] == ["IAM"] * 4  # the grants first
    outcome = results(done)
    assert outcome[f"Google service account {GSA}"] == "changed"
    assert GSA in google.accounts  # the successor stays
    assert outcome[f"Artifact Registry repository {REPO}"] == "deleted"
    assert REPO not in google.repositories
    assert google.members("p-kn-c-jobs", "roles/storage.admin") == ["user:owner@example.com"]
    assert google.members("p-kn-c-jobs", BUCKET_ROLE) == []
    # A second down finds nothing left of its own.
    again = results(await cloud.remove(rest, "p", created))
    assert again[f"Artifact Registry repository {REPO}"] == "gone"
    assert again[f"Google service account {GSA}"] == "changed"


async def test_a_concurrent_policy_change_is_read_again_and_both_survive(
    google: FakeGoogle, rest: GoogleRest
) -> None:
    google.interfere["p-kn-c-jobs"] = {"role": "roles/storage.admin", "members": ["user:x@y.z"]}
    created: list[CloudItem] = []
    await cloud.ensure(rest, SPEC, (), created)
    assert google.members("p-kn-c-jobs", "roles/storage.admin") == ["user:x@y.z"]
    assert google.members("p-kn-c-jobs", BUCKET_ROLE) == [f"serviceAccount:{GSA}"]
    refused = [r for r in google.requests if r.method == "PUT"]
    assert len(refused) == 2  # the stale etag, then the fresh one


async def test_a_new_account_not_yet_known_everywhere_is_waited_for(
    google: FakeGoogle, rest: GoogleRest
) -> None:
    google.unknown_for[GSA] = 2
    created: list[CloudItem] = []
    await cloud.ensure(rest, SPEC, (), created)
    assert google.members("p-kn-c-jobs", BUCKET_ROLE) == [f"serviceAccount:{GSA}"]


async def test_a_missing_bucket_is_an_error_naming_the_grant(
    google: FakeGoogle, rest: GoogleRest
) -> None:
    google.buckets.clear()
    created: list[CloudItem] = []
    with pytest.raises(BackendError, match="the bucket p-kn-c-jobs does not exist"):
        await cloud.ensure(rest, SPEC, (), created)
    assert [i.kind for i in created] == ["repository", "service-account"]  # recorded so far


async def test_refusals_and_faults_are_kinetic_errors_with_a_hint(
    google: FakeGoogle, rest: GoogleRest
) -> None:
    google.faults.append(error(403, "PERMISSION_DENIED", "Artifact Registry API has not been used"))
    with pytest.raises(BackendError, match=r"Artifact Registry API \(artifactregistry"):
        await cloud.ensure(rest, SPEC, (), [])
    google.faults += [BREAK] * 4  # the answer breaks off, four times: every try
    with pytest.raises(KineticError, match="ClientPayloadError") as info:
        await cloud.ensure(rest, SPEC, (), [])
    assert isinstance(info.value.__cause__, aiohttp.ClientPayloadError)
    # Transient faults are retried.
    google.faults += [error(503, "UNAVAILABLE", ""), BREAK]
    await cloud.ensure(rest, SPEC, (), [])
    assert REPO in google.repositories


async def test_the_node_pools_default_account_is_the_projects_compute_account(
    google: FakeGoogle, rest: GoogleRest
) -> None:
    spec = await cloud.spec_for_cluster(
        rest,
        project="p",
        region="us-central1",
        cluster="c",
        namespace="jobs",
        ksa="kinetic",
        bucket=None,
        pool_accounts=["default", NODES, "default"],
    )
    compute = f"{PROJECT_NUMBER}-compute@developer.gserviceaccount.com"
    assert spec.node_accounts == tuple(sorted((compute, NODES)))
    google.requests.clear()
    custom = await cloud.spec_for_cluster(
        rest,
        project="p",
        region="us-central1",
        cluster="c",
        namespace="jobs",
        ksa="kinetic",
        bucket=None,
        pool_accounts=[NODES],
    )
    assert custom.node_accounts == (NODES,)
    assert google.requests == []  # no project number needed


async def test_status_rows_show_what_exists_and_who_made_it(
    google: FakeGoogle, rest: GoogleRest
) -> None:
    before = await cloud.inspect(rest, SPEC, ())
    assert [r.present for r in before] == [False] * 2 + [False] * 4
    created: list[CloudItem] = []
    await cloud.ensure(rest, SPEC, (), created)
    after = await cloud.inspect(rest, SPEC, created)
    assert all(r.present and r.managed == "kinetic up" for r in after)
    assert [r.component for r in after] == [
        "repository",
        "google-service-account",
        *["iam-grant"] * 4,
    ]
    foreign = await cloud.inspect(rest, SPEC, ())
    assert {r.managed for r in foreign} == {"pre-existing"}
