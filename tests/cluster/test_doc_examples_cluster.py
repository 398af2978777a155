"""The examples marked ``<!-- example: cluster -->`` run on the testbed's Kubernetes.

Each page's cluster examples run in order in one fresh interpreter (see
:mod:`tests.doc_examples`), with the environment a user of the test cluster would
set (docs/test-cluster.md): a project, a fresh bucket on the GCS emulator, the testbed's
kubeconfig, and bundled images built by Docker and pushed to the testbed's registry.
The examples themselves name no backend: a configured project sends them to GKE.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kinetic.testing import local_environment
from tests.doc_examples import REPO, clean_environment, extract, pages, run_session
from tests.fix_cluster import GKETarget, current_context

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

_CLUSTER_PAGES = [p for p in pages() if any(e.kind == "cluster" for e in extract(p))]


def _cluster_env(gke: GKETarget, tmp_path: Path) -> dict[str, str]:
    bed = gke.testbed.env
    # A local root all the same (nothing of the developer's ~/.kinetic is touched), but no
    # KINETIC_BACKEND: the configured project alone must send the examples to GKE.
    local = {k: v for k, v in local_environment(tmp_path).items() if k != "KINETIC_BACKEND"}
    return clean_environment(
        {
            **local,
            "KINETIC_PROJECT": gke.project,
            "KINETIC_CLUSTER": gke.cluster,
            "KINETIC_NAMESPACE": gke.namespace,
            "KUBECONFIG": bed["KUBECONFIG"],
            "KINETIC_KUBE_CONTEXT": current_context(bed["KUBECONFIG"]),
            "STORAGE_EMULATOR_HOST": bed["STORAGE_EMULATOR_HOST"],
            "DOCKER_HOST": bed["DOCKER_HOST"],
            "KINETIC_GKE_HOST_NETWORK": bed.get("KINETIC_TESTBED_HOST_NETWORK", "false"),
            "KINETIC_GKE_SERVICE_ACCOUNT": bed["KINETIC_TESTBED_SERVICE_ACCOUNT"],
            "KINETIC_IMAGE_REGISTRY": f"{bed['KINETIC_TESTBED_REGISTRY']}/kt",
            "KINETIC_IMAGE_BASE": bed["KINETIC_TESTBED_BASE_IMAGE"],
            "KINETIC_BUILDER": "docker",
        }
    )


def test_some_page_has_cluster_examples() -> None:
    # The marker is only worth something if examples use it.
    assert _CLUSTER_PAGES


@pytest.mark.parametrize("page", _CLUSTER_PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_cluster_examples_run(page: Path, gke: GKETarget, tmp_path: Path) -> None:
    env = _cluster_env(gke, tmp_path)
    assert "KINETIC_BACKEND" not in env
    examples = [e for e in extract(page) if e.kind == "cluster"]
    outcome = run_session(examples, tmp_path / "example", env, timeout=540)
    assert outcome.returncode == 0, outcome.output
    # The jobs went through the testbed's bucket: their project archives stay there
    # (content-addressed) after the jobs themselves were cleaned up.
    assert gke.object_names("default/"), outcome.output
