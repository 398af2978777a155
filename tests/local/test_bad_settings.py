"""Settings that name something that does not exist are clear errors, not silently
the defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

import kinetic
from kinetic._cli import main
from tests.fix_env import job_dirs

pytestmark = pytest.mark.local


def plain(x: int) -> int:
    return x


def test_a_missing_profile_is_an_error_with_no_profiles_file(
    monkeypatch: pytest.MonkeyPatch,
    kinetic_env: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("KINETIC_PROFILE", "ghost")
    with pytest.raises(kinetic.ProfileError, match=r"'ghost' \(KINETIC_PROFILE\) does not"):
        kinetic.run()(plain).run_async(1)
    assert job_dirs(kinetic_env) == []
    assert main(["config", "show"]) == 2
    assert "'ghost'" in capsys.readouterr().err
    # Creating it is how the user gets out of this.
    assert main(["profile", "create", "ghost", "--project", "p"]) == 0
    monkeypatch.delenv("KINETIC_PROFILE")
    assert main(["profile", "ls"]) == 0


KIND_KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: kind, cluster: {server: "https://127.0.0.1:9"}}]
users: [{name: kind, user: {token: t}}]
contexts: [{name: kind-dev, context: {cluster: kind, user: kind}}]
current-context: kind-dev
"""


def test_a_named_cluster_without_a_context_is_not_the_active_kind_cluster(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from kinetic._engine.submit import RunOptions, target_settings

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KIND_KUBECONFIG)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    named = kinetic.run(backend="gke", project="p", zone="europe-west4-a", cluster="prod")
    with pytest.raises(
        kinetic.ConfigError, match="cluster 'prod' .* has no kubeconfig context"
    ) as e:
        named(plain).run_async(1)
    assert "KINETIC_KUBE_CONTEXT=kind-dev" in str(e.value)
    assert "get-credentials prod --zone europe-west4-a --project p" in str(e.value)
    monkeypatch.setenv("KINETIC_CLUSTER", "prod")  # named by the environment: the same
    with pytest.raises(kinetic.ConfigError, match="has no kubeconfig context"):
        target_settings(RunOptions(backend="gke", project="p"))
    # Asked for the active context outright: that is where the job goes.
    monkeypatch.setenv("KINETIC_KUBE_CONTEXT", "kind-dev")
    assert target_settings(RunOptions(backend="gke", project="p"))[0].cluster == "prod"
    # No cluster named at all: the active context, as before.
    monkeypatch.delenv("KINETIC_KUBE_CONTEXT")
    monkeypatch.delenv("KINETIC_CLUSTER")
    settings, _ = target_settings(RunOptions(backend="gke", project="p"))
    assert not settings.cluster_named
