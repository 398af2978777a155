"""``secrets=``: validation, what a pod's manifest says, what storage records, and the
status of a pod whose Secret is missing. Pure, but for the local resolution's files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import kinetic
from kinetic._backends.gke.engine import batch_job
from kinetic._core import accelerators, k8s_spec, k8s_status, lws_spec, secret_spec
from kinetic._core.secret_spec import Secret, check_secrets
from kinetic._core.status import JobStatus
from kinetic._engine.submit import RunOptions
from kinetic._exceptions import ConfigError, DataError
from runner import protocol
from runner import secrets as local

DB = Secret("db", keys={"password": "DB_PASSWORD", "user": "DB_USER"})
CERTS = Secret("certs", mount="/etc/certs/")


def template(*secrets: Secret, accel: str = "cpu", **kw: Any) -> k8s_spec.JobTemplate:
    return k8s_spec.JobTemplate(
        namespace="ns",
        image="reg/img:t",
        bucket="p-kn-c-jobs",
        accelerator=accelerators.parse_accelerator(accel),
        output_dir="gs://p-kn-c-jobs/outputs/job-1234abcd",
        env={"DB_PASSWORD": "captured", "OTHER": "1"},
        secrets=secrets,
        **kw,
    )


def pod_of(job: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = job["spec"]["template"]["spec"]
    return spec


def test_secret_is_public_and_compares_by_value() -> None:
    assert kinetic.Secret is kinetic.aio.Secret is Secret
    assert Secret("db", keys={"a": "A"}) == Secret("db", keys={"a": "A"})
    assert CERTS.mount == "/etc/certs"  # normalized
    assert "certs" in repr(CERTS)
    assert check_secrets(["db", CERTS]) == (Secret("db"), CERTS)


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda: Secret("DB"), "not a Kubernetes Secret name"),
        (lambda: Secret("db_1"), "not a Kubernetes Secret name"),
        (lambda: Secret("-db"), "not a Kubernetes Secret name"),
        (lambda: Secret("a" * 254), "not a Kubernetes Secret name"),
        (lambda: Secret(""), "non-empty string"),
        (lambda: Secret("db", keys={}), "non-empty dict"),
        (lambda: Secret("db", keys={"pass word": "X"}), "not a Secret key"),
        (lambda: Secret("db", keys={"k": "1X"}), "not an environment variable name"),
        (lambda: Secret("db", keys={"k": "A-B"}), "not an environment variable name"),
        (lambda: Secret("db", keys={"k": "KINETIC_STORAGE"}), "set by Kinetic"),
        (lambda: Secret("db", keys={"k": "JOB_ID"}), "set by Kinetic"),
        (lambda: Secret("db", keys={"k": "K"}, mount="/s"), "not both"),
        (lambda: Secret("db", mount="etc/certs"), "absolute path"),
        (lambda: Secret("db", mount="/"), "hide the whole directory"),
        (lambda: Secret("db", mount="/etc/"), "hide the whole directory"),
        (lambda: Secret("db", mount="/kinetic-fuse/b"), "overlaps /kinetic-fuse"),
        (lambda: Secret("db", mount="/opt"), "overlaps /opt/kinetic-runner"),
        (lambda: Secret("db", mount="/proc/x"), "overlaps /proc"),
        (lambda: check_secrets("db"), "must be a list"),
        (lambda: check_secrets([3]), "must hold Secret names"),
        (lambda: check_secrets({"db": 1}), "must be a list"),
        (
            lambda: check_secrets([Secret("a", keys={"k": "X"}), Secret("b", keys={"j": "X"})]),
            "X is given by secret 'a' and by secret 'b'",
        ),
        (
            lambda: check_secrets([Secret("a", mount="/s"), Secret("b", mount="/s/t")]),
            "one in the other",
        ),
    ],
)
def test_invalid_references_are_config_errors(make: Any, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        make()


def test_run_checks_secrets_at_decoration_time() -> None:
    with pytest.raises(ConfigError, match="not a Kubernetes Secret name"):
        kinetic.run(secrets=["Bad_Name"])
    with pytest.raises(ConfigError, match="must be a list"):
        kinetic.aio.run(secrets="db")
    data = kinetic.Data("/tmp")
    with pytest.raises(ConfigError, match="overlaps the volume at /data"):
        RunOptions(volumes={"/data": data}, secrets=(Secret("c", mount="/data/certs"),))
    with pytest.raises(DataError):  # the volume's own check comes first
        RunOptions(volumes={"data": data}, secrets=(CERTS,))


def test_the_manifest_reads_whole_secrets_keys_and_files() -> None:
    job = k8s_spec.job_manifest(template(Secret("api"), DB, CERTS), "job-1234abcd")
    pod = pod_of(job)
    container = pod["containers"][0]
    assert container["envFrom"] == [{"secretRef": {"name": "api"}}]
    env = {e["name"]: e for e in container["env"]}
    # The mapped key replaces the captured variable of the same name; nothing holds a value.
    assert env["DB_PASSWORD"] == {
        "name": "DB_PASSWORD",
        "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}},
    }
    assert env["DB_USER"]["valueFrom"]["secretKeyRef"] == {"name": "db", "key": "user"}
    assert [e["name"] for e in container["env"]].count("DB_PASSWORD") == 1
    assert "captured" not in json.dumps(job)
    assert env["OTHER"]["value"] == "1"
    assert env["JOB_ID"]["value"] == "job-1234abcd"
    volume = {
        "name": "kinetic-secret-2",
        "secret": {"secretName": "certs", "defaultMode": 0o400, "optional": True},
    }
    assert volume in pod["volumes"]
    assert {"name": "kinetic-secret-2", "mountPath": "/etc/certs", "readOnly": True} in (
        container["volumeMounts"]
    )
    told = json.loads(env[secret_spec.MOUNTS_ENV]["value"])
    assert told == {"namespace": "ns", "secrets": [{"name": "certs", "mount": "/etc/certs"}]}


def test_no_secrets_no_change() -> None:
    job = k8s_spec.job_manifest(template(), "job-1234abcd")
    container = pod_of(job)["containers"][0]
    assert "envFrom" not in container
    assert "volumes" not in pod_of(job)
    assert secret_spec.MOUNTS_ENV not in {e["name"] for e in container["env"]}


def test_every_kind_of_pod_gets_them() -> None:
    t = template(DB, CERTS, runner_image="reg/runner:1")
    member = k8s_spec.member_job_manifest(t, group_id="grp-0123456789ab", index=3, attempt=1)
    pool = k8s_spec.pool_job_manifest(t, group_id="grp-0123456789ab", workers=2)
    single = k8s_spec.job_manifest(template(DB, CERTS, accel="tpu-v6e-16"), "job-1234abcd")
    lws = lws_spec.lws_manifest(
        single, accelerator=accelerators.parse_accelerator("tpu-v6e-16"), version="v1"
    )
    pods = [
        pod_of(member),
        pod_of(pool),
        lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"],
    ]
    for pod in pods:
        names = {v["name"] for v in pod["volumes"]}
        assert "kinetic-secret-1" in names
        mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
        assert "/etc/certs" in mounts
        refs = [e for e in pod["containers"][0]["env"] if "valueFrom" in e]
        assert {"name": "db", "key": "password"} in [
            e["valueFrom"].get("secretKeyRef") for e in refs
        ]


def test_a_batch_records_references_and_rebuilds_the_same_pods() -> None:
    records = secret_spec.records((Secret("api"), DB, CERTS))
    assert records == [
        {"name": "api"},
        {"name": "db", "keys": {"password": "DB_PASSWORD", "user": "DB_USER"}},
        {"name": "certs", "mount": "/etc/certs"},
    ]
    assert [secret_spec.from_record(r) for r in records] == [Secret("api"), DB, CERTS]

    class Backend:
        bucket = "p-kn-c-jobs"

        class options:
            pod = k8s_spec.PodOptions()

    manifest: Any = {
        "func_name": "f",
        "spec": {"output_dir": "gs://p-kn-c-jobs/outputs", "env": {}},
        "gke": {
            "image": "reg/img:t",
            "namespace": "ns",
            "accelerator": "cpu",
            "fuse_buckets": [],
            "secrets": json.loads(json.dumps(records)),  # as read back from storage
        },
    }
    job = batch_job(Backend(), manifest, lambda t: k8s_spec.job_manifest(t, "grp-0123456789ab"))  # type: ignore[arg-type]
    expected = k8s_spec.job_manifest(template(Secret("api"), DB, CERTS), "grp-0123456789ab")
    assert pod_of(job)["volumes"] == pod_of(expected)["volumes"]
    assert pod_of(job)["containers"][0]["envFrom"] == pod_of(expected)["containers"][0]["envFrom"]


def _pod(waiting: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "team-a"},
        "status": {
            "phase": "Pending",
            "containerStatuses": [{"image": "reg/img:t", "state": {"waiting": waiting}}],
        },
    }


def test_a_missing_secret_is_named_with_its_namespace() -> None:
    report = k8s_status.pod_report(
        _pod({"reason": "CreateContainerConfigError", "message": 'secret "db" not found'})
    )
    assert report.status is JobStatus.PENDING
    assert k8s_status.cannot_start(report)
    assert report.reason is not None
    assert "the Secret 'db' does not exist in namespace 'team-a'" in report.reason
    key = "couldn't find key password in Secret team-a/db"
    report = k8s_status.pod_report(_pod({"reason": "CreateContainerConfigError", "message": key}))
    assert report.reason is not None
    assert "the Secret 'db' in namespace 'team-a' has no key 'password'" in report.reason
    other = k8s_status.pod_report(_pod({"reason": "CreateContainerConfigError", "message": "x"}))
    assert other.reason is not None
    assert "for image 'reg/img:t'" in other.reason


# -- local resolution (runner/secrets.py) ---------------------------------------------------


def write_secret(folder: Path, name: str, data: Any, mode: int = 0o600) -> Path:
    folder.mkdir(mode=0o700, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps(data))
    path.chmod(mode)
    return path


def env_for(folder: Path, **extra: str) -> dict[str, str]:
    return {local.DIR_ENV: str(folder), **extra}


def test_local_secrets_resolve_from_the_file_then_the_environment(tmp_path: Path) -> None:
    folder = tmp_path / "secrets"
    write_secret(folder, "api", {"API_TOKEN": "t0k", "not-a-name": "x"})
    write_secret(folder, "db", {"password": "s3cret", "user": "me"})
    refs: list[protocol.SecretRecord] = [
        {"name": "api"},
        {"name": "db", "keys": {"password": "DB_PASSWORD"}},
        {"name": "cache", "keys": {"url": "CACHE_URL"}},
    ]
    found = local.resolve(refs, env_for(folder, CACHE_URL="redis://x", DB_PASSWORD="env"))
    assert found.whole == {"API_TOKEN": "t0k"}
    assert found.mapped == {"DB_PASSWORD": "s3cret", "CACHE_URL": "redis://x"}
    assert "s3cret" not in repr(found)
    assert "t0k" not in repr(found)


@pytest.mark.parametrize(
    ("refs", "words"),
    [
        ([{"name": "gone"}], "secret 'gone' is not on this machine: write its keys"),
        ([{"name": "gone", "keys": {"k": "GONE_K"}}], "set GONE_K in the submitting environment"),
        ([{"name": "db", "keys": {"nope": "X"}}], "has no key 'nope'"),
        ([{"name": "db", "mount": "/etc/db"}], "cannot mount secrets as files"),
    ],
)
def test_unresolvable_local_secrets_say_what_to_do(
    tmp_path: Path, refs: list[protocol.SecretRecord], words: str
) -> None:
    folder = tmp_path / "secrets"
    write_secret(folder, "db", {"password": "s3cret"})
    with pytest.raises(local.SecretError, match=words) as caught:
        local.resolve(refs, env_for(folder))
    assert "s3cret" not in str(caught.value)


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o602])
def test_a_secret_file_others_can_read_or_write_is_refused(tmp_path: Path, mode: int) -> None:
    folder = tmp_path / "secrets"
    path = write_secret(folder, "db", {"password": "s3cret"}, mode=mode)
    with pytest.raises(local.SecretError, match=f"chmod 600 {path}"):
        local.resolve([{"name": "db"}], env_for(folder))


def test_a_folder_others_can_write_a_link_or_not_json_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "secrets"
    write_secret(folder, "db", {"password": "s3cret"})
    folder.chmod(0o777)
    with pytest.raises(local.SecretError, match=f"chmod 700 {folder}"):
        local.resolve([{"name": "db"}], env_for(folder))
    folder.chmod(0o700)
    (folder / "link.json").symlink_to(folder / "db.json")
    with pytest.raises(local.SecretError, match="cannot open"):
        local.resolve([{"name": "link"}], env_for(folder))
    write_secret(folder, "list", ["a"])
    with pytest.raises(local.SecretError, match="JSON object of string keys"):
        local.resolve([{"name": "list"}], env_for(folder))
    (folder / "bad.json").write_text("{")
    (folder / "bad.json").chmod(0o600)
    with pytest.raises(local.SecretError, match="is not JSON"):
        local.resolve([{"name": "bad"}], env_for(folder))


def test_the_default_folder_is_under_home(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/someone")
    assert local.secrets_dir({}) == Path("/home/someone/.kinetic/secrets")


def test_a_pods_missing_mounted_secret_is_named(tmp_path: Path) -> None:
    present, empty = tmp_path / "present", tmp_path / "empty"
    present.mkdir()
    (present / "tls.crt").write_text("x")
    empty.mkdir()
    (empty / "..data").mkdir()  # what kubelet leaves in a secret volume

    def told(*records: dict[str, str]) -> dict[str, str]:
        value = {"namespace": "team-a", "secrets": list(records)}
        return {local.MOUNTS_ENV: json.dumps(value)}

    local.check_mounted({})
    local.check_mounted(told({"name": "certs", "mount": str(present)}))
    for folder in (empty, tmp_path / "absent"):
        with pytest.raises(local.SecretError, match="'gone' does not exist in namespace 'team-a'"):
            local.check_mounted(told({"name": "gone", "mount": str(folder)}))


def test_the_runner_knows_the_spec_key_and_the_phase() -> None:
    known = protocol.JobSpec.__required_keys__ | protocol.JobSpec.__optional_keys__
    assert "secrets" in known
    assert "secrets" in protocol.PHASES
    assert protocol.PHASES.index("secrets") < protocol.PHASES.index("deserialize")
