"""The Kubernetes objects of a coordinated pool batch (kinetic/_core/k8s_coordinated.py)
and the knob that asks for one."""

from __future__ import annotations

import base64

import pytest

from kinetic._core import accelerators, k8s_coordinated, k8s_spec, secret_spec
from kinetic._core.gke_config import options_from_env
from kinetic._exceptions import ConfigError
from runner.pool.coordinator.wire import TOKEN_ENV

GID = "grp-1234abcd5678"


def _template(accel: str) -> k8s_spec.JobTemplate:
    return k8s_spec.JobTemplate(
        namespace="ns",
        image="reg/img:t",
        bucket="b",
        accelerator=accelerators.parse_accelerator(accel),
        output_dir="gs://b/out",
        secrets=(
            secret_spec.Secret("api-key", keys={"key": "API_KEY"}),
            secret_spec.Secret("certs", mount="/etc/certs"),
        ),
        timeout=60.0,
    )


def _env(container: dict[str, object]) -> dict[str, object]:
    return {e["name"]: e for e in container["env"]}  # type: ignore[attr-defined,index]


def test_the_coordinator_runs_on_a_plain_node_with_the_token_and_its_address() -> None:
    job = k8s_coordinated.coordinator_job_manifest(_template("l4"), group_id=GID)
    assert job["metadata"]["name"] == f"kinetic-{GID}-coordinator"
    assert job["metadata"]["labels"][k8s_spec.GROUP_ID_LABEL] == GID  # deleted with the pool
    spec = job["spec"]
    assert (spec["completions"], spec["parallelism"]) == (1, 1)
    assert "podFailurePolicy" not in spec  # one that crashed is replaced: the next epoch
    assert "activeDeadlineSeconds" not in spec  # the inputs' limit is not its own
    pod = spec["template"]["spec"]
    assert "nodeSelector" not in pod  # no accelerator, but any node: its workers' too
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert not pod.get("volumes")  # none of the user's Secrets
    container = pod["containers"][0]
    assert "nvidia.com/gpu" not in str(container["resources"])
    assert container["command"][2:] == [
        "runner.pool.coordinator", "--storage", "gs://b", "--group", GID,
        "--host", "$(KINETIC_POD_IP)",  # its pod's address only
    ]  # fmt: skip
    env = _env(container)
    assert env["KINETIC_POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env[TOKEN_ENV]["valueFrom"]["secretKeyRef"] == {  # type: ignore[index]
        "name": f"kinetic-{GID}-token",
        "key": "token",
    }
    assert "API_KEY" not in env
    on_loopback = k8s_coordinated.coordinator_job_manifest(
        _template("cpu"), group_id=GID, host="127.0.0.1"
    )
    command = on_loopback["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[-2:] == ["--host", "127.0.0.1"]
    assert options_from_env({"KINETIC_GKE_COORDINATOR_HOST": "127.0.0.1"}).coordinator_host


def test_a_coordinated_pools_workers_read_the_token_and_a_leaderless_pools_do_not() -> None:
    template = _template("cpu")
    leaderless = k8s_spec.pool_job_manifest(template, group_id=GID, workers=3)
    coordinated = k8s_coordinated.with_token(
        k8s_spec.pool_job_manifest(template, group_id=GID, workers=3), GID
    )
    token = _env(coordinated["spec"]["template"]["spec"]["containers"][0])[TOKEN_ENV]
    assert token == k8s_coordinated.token_env(GID)
    assert TOKEN_ENV not in _env(leaderless["spec"]["template"]["spec"]["containers"][0])


def test_the_token_secret_holds_the_token_under_the_batchs_labels() -> None:
    secret = k8s_coordinated.token_secret(GID, "ab" * 32)
    assert secret["kind"] == "Secret"
    assert base64.b64decode(secret["data"]["token"]).decode() == "ab" * 32
    assert secret["metadata"]["labels"][k8s_spec.GROUP_ID_LABEL] == GID


def test_the_pool_engine_is_chosen_by_a_knob() -> None:
    assert options_from_env({}).pool_engine == "coordinated"
    chosen = options_from_env({"KINETIC_GKE_POOL_ENGINE": "Pool"})
    assert chosen.pool_engine == "pool"
    with pytest.raises(ConfigError, match="KINETIC_GKE_POOL_ENGINE must be pool or coordinated"):
        options_from_env({"KINETIC_GKE_POOL_ENGINE": "leader"})


def test_a_batch_records_the_engine_its_backend_asks_for() -> None:
    from kinetic._backends.base import Placement
    from kinetic._core.gke_config import GKEOptions
    from kinetic._engine.batch_submit import _engine
    from runner import protocol

    def place(engine: str) -> Placement:
        return Placement("b", "c", "z", "gs://b/out", GKEOptions(pool_engine=engine), 4)

    assert _engine(place("pool"), pod_per_input=False) == protocol.ENGINE_POOL
    coordinated = place("coordinated")
    assert _engine(coordinated, pod_per_input=False) == protocol.ENGINE_COORDINATED
    assert _engine(coordinated, pod_per_input=True) == protocol.ENGINE_POD_PER_INPUT


def test_a_failed_coordinator_job_is_the_batchs_failure() -> None:
    failed = {"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}}  # fmt: skip
    reason = k8s_coordinated.coordinator_failure(failed)
    assert reason is not None
    assert reason.startswith("the pool's coordinator failed: ")
    assert "BackoffLimitExceeded" in reason
    complete = {"status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    assert k8s_coordinated.coordinator_failure(complete) is None
    assert k8s_coordinated.coordinator_failure({"status": {}}) is None
    assert k8s_coordinated.coordinator_failure(None) is None
