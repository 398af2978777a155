"""The pure parts of the pods' identity and the image repository: names, Workload
Identity members, IAM policy edits, the grants ``up`` wants, the record of what it
made in Google Cloud, the service account's annotation and ``down``'s lines."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from kinetic._exceptions import ConfigError
from kinetic._infra import identity, registry
from kinetic._infra.iam import Grant, has_member, with_member, without_member
from kinetic._infra.identity import WI_ANNOTATION, CloudItem, CloudSpec, grant_item
from kinetic._infra.ops import describe
from kinetic._infra.plan import (
    ObjectRef,
    Record,
    Recorded,
    SetupSpec,
    desired_objects,
    identity_detail,
    parse_record,
    record_manifest,
)

ACCOUNT_ID = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])")


def test_account_ids_follow_the_iam_rules_and_never_collide() -> None:
    assert identity.account_id("kinetic-cluster", "default") == "kn-kinetic-cluster-default"
    long = identity.account_id("a-very-long-cluster-name-indeed", "team-namespace")
    other = identity.account_id("a-very-long-cluster-name-indeed", "team-namespace2")
    for made in (long, other, identity.account_id("c", "n"), identity.account_id("C_1", "x")):
        assert 6 <= len(made) <= 30, made
        assert ACCOUNT_ID.fullmatch(made), made
    assert long != other
    assert identity.email("p", "kn-c-n") == "kn-c-n@p.iam.gserviceaccount.com"


def test_the_workload_identity_member_and_the_node_accounts() -> None:
    assert identity.wi_member("proj", "jobs", "kinetic") == (
        "serviceAccount:proj.svc.id.goog[jobs/kinetic]"
    )
    assert identity.node_accounts(["default", "n@p.iam.gserviceaccount.com", ""], "42") == [
        "42-compute@developer.gserviceaccount.com",
        "n@p.iam.gserviceaccount.com",
    ]
    with pytest.raises(ConfigError, match="number"):
        identity.node_accounts(["default"], None)


def test_the_repository_is_where_bundled_images_go() -> None:
    from kinetic._core.config import Settings

    s = Settings("gke", "proj", "europe-west4-b", "c", "default", "/tmp")
    assert registry.repository_url("proj", s.region) == s.default_registry
    assert registry.repository_name("proj", "europe-west4") == (
        "projects/proj/locations/europe-west4/repositories/kinetic"
    )
    call = registry.create_repository("proj", "europe-west4", labels={"managed-by": "kinetic"})
    assert (call.method, call.path, dict(call.params)) == (
        "POST",
        "/v1/projects/proj/locations/europe-west4/repositories",
        {"repositoryId": "kinetic"},
    )
    assert call.body is not None
    assert call.body["format"] == "DOCKER"


def test_operations_are_read_with_their_errors() -> None:
    assert registry.parse_operation({"name": "o", "done": True}).error is None
    failed = registry.parse_operation(
        {"name": "o", "done": True, "error": {"code": 7, "message": "denied"}}
    )
    assert failed.error == "denied (code 7)"
    with pytest.raises(ValueError, match="not an operation"):
        registry.parse_operation({"done": True})


def test_policy_edits_touch_one_member_and_keep_the_rest() -> None:
    policy: dict[str, Any] = {
        "version": 3,
        "etag": "BwX=",
        "bindings": [
            {"role": "r", "members": ["user:a"]},
            {"role": "r", "members": ["user:b"], "condition": {"expression": "x"}},
            {"role": "s", "members": ["user:c"]},
        ],
    }
    assert with_member(policy, "r", "user:a") is None
    added = with_member(policy, "r", "user:z")
    assert added is not None
    assert added["etag"] == "BwX="
    assert added["version"] == 3
    assert added["bindings"][0]["members"] == ["user:a", "user:z"]
    assert added["bindings"][1]["members"] == ["user:b"]  # the conditional one untouched
    assert policy["bindings"][0]["members"] == ["user:a"]  # the input is not changed
    assert not has_member(policy, "r", "user:b")  # only conditionally
    fresh = with_member({"etag": "e"}, "new", "user:q")
    assert fresh == {"etag": "e", "bindings": [{"role": "new", "members": ["user:q"]}]}
    removed = without_member(added, "r", "user:a")
    assert removed is not None
    assert removed["bindings"][0]["members"] == ["user:z"]
    emptied = without_member(policy, "s", "user:c")
    assert emptied is not None
    assert [b["role"] for b in emptied["bindings"]] == ["r", "r"]  # no empty binding left
    assert without_member(policy, "s", "user:nobody") is None


def test_up_wants_these_grants() -> None:
    spec = CloudSpec("p", "us-central1", "c", "jobs", "kinetic", "b", ("n@x",))
    gsa = "serviceAccount:kn-c-jobs@p.iam.gserviceaccount.com"
    repo = "projects/p/locations/us-central1/repositories/kinetic"
    assert identity.wanted_grants(spec) == [
        Grant("bucket", "b", "roles/storage.objectUser", gsa),
        Grant("repository", repo, "roles/artifactregistry.reader", gsa),
        Grant("repository", repo, "roles/artifactregistry.reader", "serviceAccount:n@x"),
        Grant(
            "service-account",
            "projects/p/serviceAccounts/kn-c-jobs@p.iam.gserviceaccount.com",
            "roles/iam.workloadIdentityUser",
            "serviceAccount:p.svc.id.goog[jobs/kinetic]",
        ),
    ]
    no_bucket = CloudSpec("p", "r", "c", "jobs", "kinetic")
    assert [g.target for g in identity.wanted_grants(no_bucket)] == [
        "repository",
        "service-account",
    ]


ITEMS = (
    CloudItem("repository", "projects/p/locations/r/repositories/kinetic", "2026-01-01T00:00:00Z"),
    CloudItem("service-account", "kn-c-jobs@p.iam.gserviceaccount.com", "1234"),
    grant_item(Grant("bucket", "b", "roles/storage.objectUser", "serviceAccount:x")),
    grant_item(Grant("service-account", "projects/p/serviceAccounts/x", "r", "m")),
)


def test_the_record_keeps_the_cloud_items_and_reads_older_records() -> None:
    record = Record((Recorded(ObjectRef("Namespace", "jobs"), "u1"),), "b", ITEMS)
    back = parse_record(record_manifest("jobs", record))
    assert back == record
    older = {"version": 1, "objects": [], "bucket": None}  # before the cloud items
    assert parse_record({"data": {"record.json": json.dumps(older)}}) == Record()
    assert not Record(cloud=ITEMS[:1]).empty
    assert record.adding([], None, ITEMS[:2]) == record  # nothing twice
    assert record.without_cloud() == Record(record.objects, "b")
    bad = {"version": 1, "objects": [], "cloud": [{"kind": "volcano", "name": "x"}]}
    with pytest.raises(ConfigError, match="not a record"):
        parse_record({"data": {"record.json": json.dumps(bad)}})


def test_down_removes_the_grants_first_then_the_account_then_the_repository() -> None:
    assert [i.kind for i in identity.removal_order(ITEMS)] == [
        "grant",
        "grant",
        "service-account",
        "repository",
    ]
    assert identity.removal_order(ITEMS)[0] == ITEMS[3]  # the newest grant first
    lines = describe(Record(cloud=ITEMS), "jobs")
    assert lines[:2] == [
        "IAM grant r for m on service-account projects/p/serviceAccounts/x",
        "IAM grant roles/storage.objectUser for serviceAccount:x on bucket b",
    ]
    assert "Google service account kn-c-jobs@p.iam.gserviceaccount.com" in lines
    assert (
        "Artifact Registry repository projects/p/locations/r/repositories/kinetic "
        "and every image in it"
    ) in lines


def test_the_service_account_carries_the_workload_identity_annotation() -> None:
    spec = SetupSpec(namespace="jobs", gcp_service_account="g@p.iam.gserviceaccount.com")
    wanted = dict(desired_objects(spec, None))
    account = wanted[ObjectRef("ServiceAccount", "kinetic", "jobs")]
    assert account["metadata"]["annotations"] == {WI_ANNOTATION: "g@p.iam.gserviceaccount.com"}
    plain = dict(desired_objects(SetupSpec(namespace="jobs"), None))
    assert "annotations" not in plain[ObjectRef("ServiceAccount", "kinetic", "jobs")]["metadata"]
    # What `kinetic status` says of it.
    found = {"metadata": {"annotations": {WI_ANNOTATION: "g@p.iam.gserviceaccount.com"}}}
    assert (
        identity_detail(account, found) == "acts as g@p.iam.gserviceaccount.com (Workload Identity)"
    )
    assert "no iam.gke.io/gcp-service-account annotation" in str(identity_detail(account, {}))
    other = {"metadata": {"annotations": {WI_ANNOTATION: "o@p"}}}
    assert identity_detail(account, other) == "acts as o@p, not g@p.iam.gserviceaccount.com"
    assert identity_detail(plain[ObjectRef("ServiceAccount", "kinetic", "jobs")], {}) is None
