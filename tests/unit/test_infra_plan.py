"""The pure parts of cluster set-up: the plan of ``up``, the record, ``down``'s order,
status rows, and the Container API's requests and readings."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kinetic._exceptions import AcceleratorError, ConfigError
from kinetic._infra import gke_api
from kinetic._infra.ops import describe, packaged_lws_crd
from kinetic._infra.plan import (
    LWS_CRD_NAME,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    ObjectRef,
    Record,
    Recorded,
    SetupSpec,
    decide_up,
    desired_objects,
    down_order,
    missing,
    parse_record,
    record_manifest,
    status_rows,
)

CRD = packaged_lws_crd()
SPEC = SetupSpec(namespace="jobs", service_account="runner", bucket="p-kn-c-jobs", project="p")


def live_of(wanted: list[tuple[ObjectRef, dict[str, Any]]], uids: dict[str, str]) -> dict:
    """Objects that exist (by kind), with the given uids; the others absent."""
    return {
        ref: ({"metadata": {"name": ref.name, "uid": uids[ref.kind]}} if ref.kind in uids else None)
        for ref, _ in wanted
    }


def test_the_packaged_crd_is_the_lws_crd_and_carries_no_ownership_label() -> None:
    assert CRD["kind"] == "CustomResourceDefinition"
    assert CRD["metadata"]["name"] == LWS_CRD_NAME
    assert CRD["spec"]["names"]["kind"] == "LeaderWorkerSet"
    # `up` adds the label when it creates it; the testbed adds its own.
    assert MANAGED_BY_LABEL not in CRD["metadata"].get("labels", {})


def test_up_wants_namespace_first_then_account_rbac_and_crd_all_labelled() -> None:
    wanted = desired_objects(SPEC, CRD)
    assert [str(ref) for ref, _ in wanted] == [
        "Namespace jobs",
        "ServiceAccount jobs/runner",
        "Role jobs/kinetic",
        "RoleBinding jobs/kinetic",
        f"CustomResourceDefinition {LWS_CRD_NAME}",
    ]
    for ref, manifest in wanted:
        assert manifest["metadata"]["labels"][MANAGED_BY_LABEL] == MANAGED_BY
        assert manifest["kind"] == ref.kind
        assert manifest["metadata"]["name"] == ref.name
    binding = wanted[3][1]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "runner", "namespace": "jobs"}
    ]
    assert binding["roleRef"]["name"] == wanted[2][1]["metadata"]["name"]
    rules = {
        (g, r)
        for rule in wanted[2][1]["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
    }
    assert {("batch", "jobs"), ("", "pods"), ("", "pods/log"), ("", "events")} <= rules
    assert ("leaderworkerset.x-k8s.io", "leaderworkersets") in rules
    # The CRD's manifest is the packaged one, plus the label; the original is untouched.
    assert wanted[4][1]["spec"] == CRD["spec"]
    assert MANAGED_BY_LABEL not in CRD["metadata"].get("labels", {})


def test_up_makes_a_namespace_under_pod_security_and_an_account_without_tokens() -> None:
    (_, namespace), (_, account) = desired_objects(SPEC, CRD)[:2]
    labels = namespace["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "baseline"
    assert labels["pod-security.kubernetes.io/warn"] == "restricted"
    assert labels["pod-security.kubernetes.io/audit"] == "restricted"
    assert labels[MANAGED_BY_LABEL] == MANAGED_BY
    assert account["automountServiceAccountToken"] is False


def test_up_leaves_the_crd_out_when_asked() -> None:
    spec = SetupSpec(namespace="jobs", lws_crd=False)
    assert all(ref.kind != "CustomResourceDefinition" for ref, _ in desired_objects(spec, CRD))


@pytest.mark.parametrize("bad", ["", "Jobs", "-x", "x-", "a_b", "x" * 64])
def test_a_bad_namespace_or_account_name_is_a_config_error(bad: str) -> None:
    with pytest.raises(ConfigError, match="invalid namespace"):
        SetupSpec(namespace=bad)
    with pytest.raises(ConfigError, match="invalid service account"):
        SetupSpec(namespace="ok", service_account=bad)


def test_object_paths() -> None:
    assert ObjectRef("Namespace", "n").path == "/api/v1/namespaces/n"
    assert (
        ObjectRef("ServiceAccount", "s", "n").collection == "/api/v1/namespaces/n/serviceaccounts"
    )
    assert (
        ObjectRef("RoleBinding", "r", "n").path
        == "/apis/rbac.authorization.k8s.io/v1/namespaces/n/rolebindings/r"
    )
    assert (
        ObjectRef("CustomResourceDefinition", "c").path
        == "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/c"
    )
    with pytest.raises(ValueError, match="namespace"):
        ObjectRef("Namespace", "n", "n")
    with pytest.raises(ValueError, match="namespace"):
        ObjectRef("Role", "r")


def test_absent_objects_are_created_and_existing_ones_left_alone() -> None:
    wanted = desired_objects(SPEC, CRD)
    live = live_of(wanted, {"Namespace": "u-ns", "CustomResourceDefinition": "u-crd"})
    steps = decide_up(wanted, live, Record())
    assert [(s.ref.kind, s.action) for s in steps] == [
        ("Namespace", "foreign"),
        ("ServiceAccount", "create"),
        ("Role", "create"),
        ("RoleBinding", "create"),
        ("CustomResourceDefinition", "foreign"),
    ]
    assert steps[1].manifest["metadata"]["name"] == "runner"


def test_up_again_keeps_what_it_created_and_creates_nothing() -> None:
    wanted = desired_objects(SPEC, CRD)
    uids = {ref.kind: f"u-{ref.kind}" for ref, _ in wanted}
    record = Record(tuple(Recorded(ref, uids[ref.kind]) for ref, _ in wanted[:4]))
    steps = decide_up(wanted, live_of(wanted, uids), record)
    assert [s.action for s in steps] == ["keep"] * 4 + ["foreign"]


def test_an_object_recreated_by_someone_else_is_not_ours_any_more() -> None:
    wanted = desired_objects(SPEC, CRD)
    ref = wanted[1][0]
    record = Record((Recorded(ref, "old-uid"),))
    steps = decide_up(wanted, live_of(wanted, {"ServiceAccount": "new-uid"}), record)
    assert steps[1].action == "foreign"


def test_the_record_round_trips_through_its_configmap() -> None:
    ns = ObjectRef("Namespace", "jobs")
    sa = ObjectRef("ServiceAccount", "runner", "jobs")
    record = Record((Recorded(ns, "u1"),)).adding([Recorded(sa, "u2"), Recorded(ns, "dup")], "b")
    assert record.objects == (Recorded(ns, "u1"), Recorded(sa, "u2"))
    assert record.bucket == "b"
    cm = record_manifest("jobs", record)
    assert cm["metadata"] == {
        "name": "kinetic-setup",
        "namespace": "jobs",
        "labels": {MANAGED_BY_LABEL: MANAGED_BY},
    }
    assert parse_record(json.loads(json.dumps(cm))) == record
    assert parse_record(None) == Record()
    assert parse_record(None).empty


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"record.json": "not json"},
        {"record.json": json.dumps({"version": 99, "objects": []})},
        {"record.json": json.dumps({"version": 1, "objects": [{"kind": "Pod", "name": "x"}]})},
        {"record.json": json.dumps({"version": 1, "objects": [], "bucket": 3})},
    ],
)
def test_a_configmap_that_is_no_record_is_refused(data: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="not a record"):
        parse_record({"data": data})


def test_down_deletes_in_reverse_with_the_namespace_last() -> None:
    refs = [ref for ref, _ in desired_objects(SPEC, CRD)]
    record = Record(tuple(Recorded(r, f"u{i}") for i, r in enumerate(refs)))
    assert [r.ref.kind for r in down_order(record)] == [
        "CustomResourceDefinition",
        "RoleBinding",
        "Role",
        "ServiceAccount",
        "Namespace",
    ]
    # Only what is recorded: a pre-existing namespace is never in the order.
    partial = Record(tuple(Recorded(r, "u") for r in refs[2:4]))
    assert [r.ref.kind for r in down_order(partial)] == ["RoleBinding", "Role"]
    assert down_order(Record()) == []


def test_downs_prompt_lists_what_it_deletes() -> None:
    refs = [ref for ref, _ in desired_objects(SPEC, CRD)]
    lines = describe(Record((Recorded(refs[0], "a"), Recorded(refs[2], "b")), "b1"), "jobs")
    assert lines == [
        "Role jobs/kinetic",
        "bucket gs://b1 and every object in it",
        "ConfigMap jobs/kinetic-setup (the record of `kinetic up`)",
        "Namespace jobs and everything in it",
    ]
    assert describe(Record(), "jobs") == []


def test_status_rows_say_what_exists_and_who_made_it() -> None:
    wanted = desired_objects(SPEC, CRD)
    uids = {"Namespace": "n", "ServiceAccount": "s", "CustomResourceDefinition": "c"}
    record = Record((Recorded(wanted[1][0], "s"),), bucket="p-kn-c-jobs")
    rows = status_rows(
        wanted, live_of(wanted, uids), record, bucket="p-kn-c-jobs", bucket_present=True
    )
    assert [(r.component, r.present, r.managed) for r in rows] == [
        ("namespace", True, "pre-existing"),
        ("service-account", True, "kinetic up"),
        ("role", False, None),
        ("role-binding", False, None),
        ("lws-crd", True, "pre-existing"),
        ("bucket", True, "kinetic up"),
    ]
    assert [r.component for r in missing(rows)] == ["role", "role-binding"]
    no_project = status_rows(
        wanted, live_of(wanted, uids), Record(), bucket=None, bucket_present=None
    )
    assert all(r.component != "bucket" for r in no_project)


# --------------------------------------------------------------------------- GKE requests


def test_cluster_requests() -> None:
    get = gke_api.get_cluster("p", "us-central1-a", "c")
    assert (get.method, get.path) == ("GET", "/v1/projects/p/locations/us-central1-a/clusters/c")
    create = gke_api.create_cluster("p", "z", "c", min_nodes=1, max_nodes=2)
    assert (create.method, create.path) == ("POST", "/v1/projects/p/locations/z/clusters")
    assert create.body is not None
    cluster = create.body["cluster"]
    assert cluster["name"] == "c"
    assert cluster["resourceLabels"] == {"managed-by": "kinetic"}
    assert cluster["workloadIdentityConfig"] == {"workloadPool": "p.svc.id.goog"}
    [pool] = cluster["nodePools"]
    assert pool["autoscaling"] == {"enabled": True, "minNodeCount": 1, "maxNodeCount": 2}
    assert gke_api.delete_cluster("p", "z", "c").method == "DELETE"
    op = gke_api.get_operation("p", "z", "operation-1")
    assert op.path == "/v1/projects/p/locations/z/operations/operation-1"
    with pytest.raises(ConfigError, match="project"):
        gke_api.get_cluster("", "z", "c")


def test_pool_requests() -> None:
    body = gke_api.node_pool("l4x4", min_nodes=0, max_nodes=3)
    req = gke_api.create_pool("p", "z", "c", body)
    assert (req.method, req.path) == ("POST", "/v1/projects/p/locations/z/clusters/c/nodePools")
    assert req.body == {"nodePool": body}
    delete = gke_api.delete_pool("p", "z", "c", "kn-gpu-l4x4")
    assert delete.path == "/v1/projects/p/locations/z/clusters/c/nodePools/kn-gpu-l4x4"
    assert gke_api.list_pools("p", "z", "c").path.endswith("/clusters/c/nodePools")


def test_a_gpu_pool_from_the_catalog() -> None:
    body = gke_api.node_pool("l4x4", min_nodes=0, max_nodes=3)
    assert body["name"] == "kn-gpu-l4x4"
    assert body["config"]["machineType"] == "g2-standard-48"
    assert body["config"]["accelerators"][0]["acceleratorType"] == "nvidia-l4"
    assert body["config"]["accelerators"][0]["acceleratorCount"] == "4"
    assert body["autoscaling"] == {"enabled": True, "minNodeCount": 0, "maxNodeCount": 3}
    assert body["initialNodeCount"] == 0
    assert "spot" not in body["config"]


def test_a_spot_pool_is_tainted_for_spot_jobs_only() -> None:
    for body in (gke_api.node_pool("gpu-t4", spot=True), gke_api.node_pool("gpu-t4:spot")):
        assert body["name"] == "kn-gpu-t4-spot"
        assert body["config"]["spot"] is True
        assert body["config"]["taints"] == [
            {"key": "cloud.google.com/gke-spot", "value": "true", "effect": "NO_SCHEDULE"}
        ]


def test_tpu_pools_single_and_multi_host() -> None:
    single = gke_api.node_pool("tpu-v5litepod-4")
    assert single["config"]["machineType"] == "ct5lp-hightpu-4t"
    assert "placementPolicy" not in single
    assert single["autoscaling"]["maxNodeCount"] == 1
    multi = gke_api.node_pool("tpu-v6e-16")
    assert multi["config"]["machineType"] == "ct6e-standard-4t"
    assert multi["placementPolicy"] == {"type": "COMPACT", "tpuTopology": "4x4"}
    assert multi["initialNodeCount"] == 4
    assert multi["autoscaling"] == {"enabled": True, "minNodeCount": 0, "maxNodeCount": 4}
    with pytest.raises(ConfigError, match="multi-host slice of 4 nodes"):
        gke_api.node_pool("tpu-v6e-16", max_nodes=2)


def test_cpu_pools_leave_room_for_gke() -> None:
    assert gke_api.node_pool("cpu")["config"]["machineType"] == "e2-standard-4"
    assert gke_api.node_pool("cpu:4")["config"]["machineType"] == "e2-standard-8"
    assert gke_api.node_pool("cpu", machine_type="n2-highmem-8")["config"]["machineType"] == (
        "n2-highmem-8"
    )


def test_pool_errors() -> None:
    with pytest.raises(AcceleratorError):
        gke_api.node_pool("gpu-nope")
    with pytest.raises(ConfigError, match="node counts"):
        gke_api.node_pool("l4", min_nodes=3, max_nodes=1)
    with pytest.raises(ConfigError, match="node counts"):
        gke_api.node_pool("l4", min_nodes=-1)
    with pytest.raises(ConfigError, match="invalid node pool name"):
        gke_api.node_pool("l4", name="Bad_Name")
    assert len(gke_api.pool_name(gke_api.parse_accelerator("tpu-v5litepod-256:spot"))) <= 40


def test_operations_are_read() -> None:
    running = gke_api.parse_operation(
        {"name": "op-1", "status": "RUNNING", "operationType": "CREATE_CLUSTER"}
    )
    assert (running.done, running.error, running.kind) == (False, None, "CREATE_CLUSTER")
    done = gke_api.parse_operation({"name": "op-1", "status": "DONE"})
    assert done.done
    assert done.error is None
    failed = gke_api.parse_operation(
        {"name": "op-1", "status": "DONE", "error": {"code": 8, "message": "quota exceeded"}}
    )
    assert failed.done
    assert failed.error == "quota exceeded"
    with pytest.raises(ValueError, match="not an operation"):
        gke_api.parse_operation({"status": "DONE"})


def test_clusters_and_pools_are_read() -> None:
    info = gke_api.parse_cluster(
        {
            "name": "c",
            "status": "RUNNING",
            "location": "z",
            "endpoint": "1.2.3.4",
            "masterAuth": {"clusterCaCertificate": "Q0E="},
            "currentMasterVersion": "1.30.1",
            "resourceLabels": {"managed-by": "kinetic"},
            "nodePools": [gke_api.node_pool("l4x4", max_nodes=3) | {"status": "RUNNING"}],
        }
    )
    assert info.managed
    assert info.endpoint == "1.2.3.4"
    assert info.version == "1.30.1"
    [pool] = info.pools
    assert (pool.name, pool.accelerator, pool.min_nodes, pool.max_nodes, pool.managed) == (
        "kn-gpu-l4x4",
        "nvidia-l4 x4",
        0,
        3,
        True,
    )
    assert not gke_api.parse_cluster({"name": "x"}).managed
    config = gke_api.kubeconfig(info, "tok")
    assert config["clusters"][0]["cluster"]["server"] == "https://1.2.3.4"
    assert config["users"][0]["user"] == {"token": "tok"}
    with pytest.raises(ConfigError, match="no endpoint"):
        gke_api.kubeconfig(gke_api.parse_cluster({"name": "x", "status": "PROVISIONING"}), "t")


def test_error_answers_are_read() -> None:
    body = json.dumps({"error": {"code": 404, "message": "not found: c", "status": "NOT_FOUND"}})
    assert gke_api.error_message(404, body.encode()) == ("NOT_FOUND", "not found: c")
    assert gke_api.error_message(502, b"<html>bad gateway") == ("", "<html>bad gateway")
