"""`cluster=` chooses the kubeconfig context, per job, without touching the active one.

One kubeconfig with the testbed's context active and two GKE-named contexts: one for the
testbed itself, one for a cluster whose API server is unreachable. Jobs in one process go
to each by `cluster=`: the reachable one returns its value, the other fails to launch
and leaves nothing behind, and the file's active context never changes.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

import kinetic
from tests.fix_cluster import GKETarget, create_bucket

pytestmark = pytest.mark.cluster

ZONE = "us-central1-a"


def square(x: int) -> int:
    return x * x


def _kubeconfig(gke: GKETarget, tmp_path: Path, dead_cluster: str) -> Path:
    source = Path(gke.testbed.env["KUBECONFIG"])
    config: dict[str, Any] = yaml.safe_load(source.read_text())
    active = config["current-context"]
    base = next(c for c in config["contexts"] if c["name"] == active)["context"]
    config["clusters"].append({"name": "unreachable", "cluster": {"server": "https://127.0.0.1:9"}})
    config["contexts"] += [
        {"name": f"gke_{gke.project}_{ZONE}_{gke.cluster}", "context": dict(base)},
        {
            "name": f"gke_{gke.project}_{ZONE}_{dead_cluster}",
            "context": {**base, "cluster": "unreachable"},
        },
    ]
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


def _objects(gke: GKETarget, bucket: str) -> list[str]:
    url = f"{gke.emulator}/storage/v1/b/{bucket}/o"
    with urllib.request.urlopen(url, timeout=10) as resp:
        return [i["name"] for i in json.loads(resp.read()).get("items", [])]


def _job_objects(names: list[str]) -> list[str]:
    return [n for n in names if not n.startswith("default/contexts/")]


def test_two_clusters_side_by_side_in_one_process(
    gke: GKETarget, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = f"{gke.cluster}x"
    dead_bucket = f"{gke.project}-kn-{dead}-jobs"
    create_bucket(gke.emulator, gke.project, dead_bucket)
    path = _kubeconfig(gke, tmp_path, dead)
    before = yaml.safe_load(path.read_text())["current-context"]
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.delenv("KINETIC_KUBE_CONTEXT")  # each cluster= has its context here

    live = kinetic.run(**gke.run_args(zone=ZONE))(square)
    unreachable = kinetic.run(**gke.run_args(zone=ZONE, cluster=dead))(square)

    job = live.run_async(6)
    with pytest.raises(kinetic.BackendError):
        unreachable.run_async(7)
    assert job.result(timeout=180) == 36
    # The failed launch left no job behind (context archives are shared, content-addressed).
    assert _job_objects(_objects(gke, dead_bucket)) == []
    # A handle finds its cluster again from its fields, in this process or another.
    again = kinetic.attach(live.run_async(8).job_id, project=gke.project, cluster=gke.cluster)
    assert again.result(timeout=180) == 64
    assert yaml.safe_load(path.read_text())["current-context"] == before


def test_an_unknown_context_override_is_a_clear_error(
    gke: GKETarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KINETIC_KUBE_CONTEXT", "no-such-context")
    fn = kinetic.run(**gke.run_args())(square)
    with pytest.raises(kinetic.ConfigError, match="no-such-context"):
        fn.run_async(1)
    assert _job_objects(gke.object_names()) == []
