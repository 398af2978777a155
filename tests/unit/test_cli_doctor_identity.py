"""``kinetic doctor``'s checks of the pods' identity: the verdicts (pure), and the
Google reads behind them against ``tests.fix_google.FakeGoogle`` (the documented
wire format of IAM, Artifact Registry and bucket IAM, behind MockTransport)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from kinetic._cli import doctor_identity as di
from kinetic._cli.doctor_result import CheckResult
from kinetic._core.config import Settings
from kinetic._infra import cloud
from kinetic._infra.google_rest import GoogleRest
from kinetic._infra.identity import WI_ANNOTATION, CloudItem, CloudSpec
from tests.fix_google import FakeGoogle

SETTINGS = Settings("gke", "p", "us-central1-a", "c", "jobs", "/tmp")
GSA = "kn-c-jobs@p.iam.gserviceaccount.com"
NODES = "nodes@p.iam.gserviceaccount.com"


def sa(annotation: str | None = None) -> dict[str, object]:
    meta: dict[str, object] = {"name": "kinetic"}
    if annotation:
        meta["annotations"] = {WI_ANNOTATION: annotation}
    return {"metadata": meta}


def test_where_workload_identity_applies() -> None:
    assert di.workload_identity_applies(SETTINGS, {})
    assert not di.workload_identity_applies(SETTINGS, {"STORAGE_EMULATOR_HOST": "http://x"})
    no_project = Settings("gke", None, "z", "c", "jobs", "/tmp")
    assert not di.workload_identity_applies(no_project, {})


def test_the_pods_service_account_verdicts_and_their_fixes() -> None:
    def result(
        name: str, account: dict[str, object] | None, *, explicit: bool, workload_identity: bool
    ) -> CheckResult:
        return di.service_account_result(
            "jobs", name, account, explicit=explicit, workload_identity=workload_identity, gsa=GSA
        )

    bound = result("kinetic", sa(GSA), explicit=False, workload_identity=True)
    assert (bound.level, bound.detail) == (
        "ok",
        f"pods run as jobs/kinetic, acting as {GSA} (Workload Identity)",
    )
    testbed = result("kinetic", sa(), explicit=True, workload_identity=False)
    assert testbed.detail.endswith("/kinetic")
    unbound = result("kinetic", sa(), explicit=False, workload_identity=True)
    assert unbound.level == "warn"
    assert unbound.hint == (
        f"`kinetic up`, or kubectl annotate serviceaccount kinetic -n jobs {WI_ANNOTATION}={GSA}"
    )
    default = result("default", sa(), explicit=False, workload_identity=True)
    assert default.level == "warn"
    assert str(default.hint).startswith("kinetic up")
    missing = result("nobody", None, explicit=True, workload_identity=True)
    assert missing.level == "fail"
    assert str(missing.hint).startswith("kubectl create serviceaccount nobody -n jobs")
    assert "kinetic up --service-account nobody" in str(missing.hint)


@pytest.fixture
def google() -> FakeGoogle:
    fake = FakeGoogle()
    fake.buckets.add(SETTINGS.bucket_name)
    return fake


@pytest.fixture
async def rest(google: FakeGoogle) -> AsyncIterator[GoogleRest]:
    async def token() -> str:
        return "t"

    async with (
        google.serve() as roots,
        GoogleRest(token, roots=roots, poll_interval=0.001) as client,
    ):
        yield client


async def test_nothing_set_up_fails_each_piece_with_its_fix(rest: GoogleRest) -> None:
    found = await di.google_checks(
        rest, SETTINGS, ksa="kinetic", gsa=GSA, node_accounts=[NODES], timeout=10
    )
    assert [(r.name, r.level) for r in found] == [
        ("google-service-account", "fail"),
        ("bucket-access", "fail"),
        ("registry-access", "fail"),
    ]
    assert found[0].hint == (
        "kinetic up, or gcloud iam service-accounts create kn-c-jobs --project p"
    )
    assert found[1].hint is not None
    assert "gcloud storage buckets add-iam-policy-binding gs://p-kn-c-jobs" in found[1].hint
    assert found[2].hint is not None
    assert "gcloud artifacts repositories create kinetic" in found[2].hint


async def test_after_up_every_piece_is_green_and_a_lost_grant_shows(
    google: FakeGoogle, rest: GoogleRest
) -> None:
    spec = CloudSpec("p", "us-central1", "c", "jobs", "kinetic", SETTINGS.bucket_name, (NODES,))
    made: list[CloudItem] = []
    await cloud.ensure(rest, spec, (), made)
    found = await di.google_checks(
        rest, SETTINGS, ksa="kinetic", gsa=GSA, node_accounts=[NODES], timeout=10
    )
    assert [r.level for r in found] == ["ok"] * 3, found
    # Someone revokes the Workload Identity grant, and the nodes' pull access.
    grants = [i.grant for i in made if i.grant is not None]
    await cloud.revoke_grant(rest, grants[-1])
    await cloud.revoke_grant(rest, grants[2])
    found = await di.google_checks(
        rest, SETTINGS, ksa="kinetic", gsa=GSA, node_accounts=[NODES], timeout=10
    )
    assert [r.level for r in found] == ["fail", "ok", "warn"]
    assert "roles/iam.workloadIdentityUser" in str(found[0].hint)
    assert "'serviceAccount:p.svc.id.goog[jobs/kinetic]'" in str(found[0].hint)
    assert f"--member serviceAccount:{NODES}" in str(found[2].hint)
