"""``kinetic doctor`` on this machine: the local checks, and every cluster-side check
pointed at something that is not there (closed loopback ports, a missing socket).

The cluster tier (``tests/cluster/test_cli_doctor.py``) runs the same command
against the real testbed, where those checks pass.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.local


def doctor(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    proc = subprocess.run(
        [sys.executable, "-m", "kinetic", *args, "doctor", "--json", "--timeout", "5"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **(env or {})},
    )
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, {c["name"]: c for c in json.loads(proc.stdout)["checks"]}


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kubeconfig(path: Path, server: str, *, current: bool = True) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "c", "cluster": {"server": server, "insecure-skip-tls-verify": True}}
        ],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u", "namespace": "ns"}}],
    }
    if current:
        doc["current-context"] = "ctx"
    path.write_text(json.dumps(doc))  # JSON is YAML
    return path


def test_local_backend_is_healthy() -> None:
    code, checks = doctor()
    assert code == 0
    for name in ("python", "packages", "settings", "local-root"):
        assert checks[name]["level"] == "ok", checks[name]
    assert checks["cluster"]["level"] == "skip"
    assert "backend local" in checks["settings"]["detail"]


def test_an_unwritable_local_root_fails_with_its_fix(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    code, checks = doctor(env={"KINETIC_LOCAL_ROOT": str(blocker / "root")})
    assert code == 1
    assert checks["local-root"]["level"] == "fail"
    assert "KINETIC_LOCAL_ROOT" in checks["local-root"]["hint"]


def test_a_local_root_others_may_write_fails_with_its_fix(tmp_path: Path) -> None:
    root = tmp_path / "shared-root"
    root.mkdir()
    root.chmod(0o777)
    code, checks = doctor(env={"KINETIC_LOCAL_ROOT": str(root)})
    assert code == 1
    assert checks["local-root"]["level"] == "fail"
    assert "not private" in checks["local-root"]["detail"]
    assert f"chmod 700 {root}" in checks["local-root"]["hint"]


def test_a_broken_profiles_file_fails_the_settings(tmp_path: Path) -> None:
    (tmp_path / "profiles.json").write_text("[]")
    code, checks = doctor()
    assert code == 1
    assert checks["settings"]["level"] == "fail"
    assert "profiles" in checks["settings"]["detail"]
    assert checks["settings"]["hint"]


def test_unreachable_cluster_pieces_each_fail_with_a_hint(tmp_path: Path) -> None:
    port = closed_port()
    env = {
        "KUBECONFIG": str(kubeconfig(tmp_path / "kc", f"https://127.0.0.1:{port}")),
        "STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{port}",
        "KINETIC_IMAGE_REGISTRY": f"127.0.0.1:{port}",
        "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock",
    }
    code, checks = doctor("--backend", "gke", "--project", "p", env=env)
    assert code == 1
    assert checks["kubeconfig"]["level"] == "ok"
    assert "context ctx (cluster c, namespace ns)" in checks["kubeconfig"]["detail"]
    for name in ("cluster", "bucket", "registry", "builder"):
        assert checks[name]["level"] == "fail", checks[name]
        assert checks[name]["hint"], checks[name]
    assert "p-kn-kinetic-cluster-jobs" in checks["bucket"]["detail"]
    assert "DOCKER_HOST" in checks["builder"]["hint"]
    for name in ("namespace", "service-account", "lws-crd"):
        assert checks[name]["level"] == "skip"


def test_kubeconfig_problems(tmp_path: Path) -> None:
    env = {"KUBECONFIG": str(tmp_path / "missing"), "DOCKER_HOST": "unix:///nonexistent"}
    _, checks = doctor("--backend", "gke", "--project", "p", env=env)
    assert checks["kubeconfig"]["level"] == "fail"
    assert "get-credentials kinetic-cluster" in checks["kubeconfig"]["hint"]
    assert checks["cluster"]["level"] == "skip"
    path = kubeconfig(tmp_path / "kc", "https://127.0.0.1:1", current=False)
    _, checks = doctor("--backend", "gke", "--project", "p", env={"KUBECONFIG": str(path)})
    assert checks["kubeconfig"]["level"] == "fail"
    assert checks["kubeconfig"]["hint"] == "kubectl config use-context NAME"


def test_human_output_is_a_table_with_a_summary() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kinetic", "doctor"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["CHECK", "STATUS", "DETAIL", "FIX"]
    assert lines[-1] == "4 ok, 1 skip"
