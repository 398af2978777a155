"""A cluster that cannot be reached is said before any image is built or byte uploaded.

Bundled mode used to build (minutes; gigabytes for a GPU project) and upload before the
first request to the cluster said that it was down, or not in the kubeconfig at all.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import kinetic
from tests.local.test_cli_doctor import closed_port, kubeconfig

pytestmark = pytest.mark.local


def square(x: int) -> int:
    return x * x


@pytest.mark.parametrize("container_image", [None, "prebuilt"])
def test_an_unreachable_cluster_fails_the_submission_before_any_image_work(
    kinetic_env: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    container_image: str | None,
) -> None:
    config = kubeconfig(tmp_path / "kubeconfig", f"https://127.0.0.1:{closed_port()}")
    monkeypatch.setenv("KUBECONFIG", str(config))
    monkeypatch.setenv("KINETIC_KUBE_CONTEXT", "ctx")
    # No registry, no builder, no credentials: any image step would fail otherwise.
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "no-adc.json"))
    fn = kinetic.run(
        backend="gke", project="p", cluster="c", accelerator="cpu", container_image=container_image
    )(square)
    with pytest.raises(kinetic.BackendError) as refused:
        fn.run_async(3)
    message = str(refused.value)
    assert "the cluster cannot run jobs from here" in message
    assert "nothing was built or written" in message
    assert "kinetic doctor" in message
