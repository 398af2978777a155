"""``kinetic init``: the decisions (pure), then the command in process: the local way,
joining a cluster of the fake Container API (tests/unit/cli_gke.py), creating one
(``up`` itself is tested with the up/down tests: here it is recorded), the prompts on a
terminal and the refusals without one."""

from __future__ import annotations

import io
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from kinetic._cli import infra, main
from kinetic._cli import init_plan as plan
from kinetic._exceptions import ConfigError
from kinetic._settings import load_settings
from tests.unit.cli_gke import FakeProjectGKE, gke  # noqa: F401 - the fixture

# --------------------------------------------------------------------------- pure


def found(**kw: Any) -> plan.Found:
    return plan.Found(**{"credentials": "/adc.json", "project": "p", **kw})


def test_default_choice() -> None:
    assert plan.default_choice(found(credentials=None)) == "local"
    assert plan.default_choice(found(project=None)) == "local"
    assert plan.default_choice(found(clusters=(("a", "z"),))) == "join"
    assert plan.default_choice(found()) == "create"


def test_cluster_to_join() -> None:
    f = found(clusters=(("a", "z1"), ("b", "z2"), ("a", "z3")))
    assert plan.cluster_to_join(f, "b") == ("b", "z2")
    assert plan.cluster_to_join(f, "a") is None  # two of that name: the zone says which
    assert plan.cluster_to_join(f, "a", "z3") == ("a", "z3")
    assert plan.cluster_to_join(f, "c") is None
    assert plan.cluster_to_join(f, None) is None
    assert plan.cluster_to_join(found(clusters=(("a", "z"),)), None) == ("a", "z")


def test_profile_fields_and_names() -> None:
    assert plan.profile_fields("local", project="p", zone="z", cluster="c", namespace="n") == {}
    assert plan.profile_fields("join", project="p", zone="z", cluster="c", namespace="default") == {
        "project": "p",
        "zone": "z",
        "cluster": "c",
    }
    assert (
        plan.profile_fields("create", project="p", zone="z", cluster="c", namespace="ml")[
            "namespace"
        ]
        == "ml"
    )
    with pytest.raises(ConfigError):
        plan.profile_fields("join", project=None, zone="z", cluster="c", namespace=None)
    assert plan.profile_name("local", None, None) == "local"
    assert plan.profile_name("join", "c", None) == "c"
    assert plan.profile_name("join", "c", "mine") == "mine"


def test_reconcile() -> None:
    doc = {"profiles": {"dev": {"project": "p"}}}
    assert plan.reconcile(doc, "new", {}) == ("created", None)
    assert plan.reconcile(doc, "dev", {"project": "p"})[0] == "kept"
    assert plan.reconcile(doc, "dev", {"project": "q"}) == ("replaced", {"project": "p"})


def test_credentials_and_gcloud_config() -> None:
    assert plan.credentials_path({"GOOGLE_APPLICATION_CREDENTIALS": "/k.json"}, "/h") == "/k.json"
    assert plan.credentials_path({"CLOUDSDK_CONFIG": "/c"}, "/h") == (
        "/c/application_default_credentials.json"
    )
    assert (
        plan.credentials_path({}, "/h") == "/h/.config/gcloud/application_default_credentials.json"
    )
    assert plan.gcloud_project("[core]\naccount = me\nproject = proj-1\n") == "proj-1"
    assert plan.gcloud_project("[core]\naccount = me\n") is None
    assert plan.gcloud_project("not ini") is None
    assert plan.credential_result("/x", False, None).level == "warn"
    assert plan.credential_result("/x", True, None).level == "ok"
    assert plan.credential_result("/x", False, "169.254.169.254").level == "ok"


def test_get_credentials_command_and_answers() -> None:
    assert plan.get_credentials_command("p", "us-central1-a", "c")[-4:] == [
        "--zone", "us-central1-a", "--project", "p",
    ]  # fmt: skip
    assert plan.get_credentials_command("p", "us-central1", "c")[-4:-2] == [
        "--region", "us-central1",
    ]  # fmt: skip
    options = list(plan.CHOICES)
    assert plan.parse_answer("", "local", options) == "local"
    assert plan.parse_answer("2", "local", options) == "create"
    assert plan.parse_answer(" Jo ", "local", options) == "join"
    assert plan.parse_answer("9", "local", options) is None
    assert plan.parse_answer("x", "local", options) is None


def test_overriding_variables() -> None:
    assert plan.overriding({"KINETIC_PROJECT": "p"}, "local") == ["KINETIC_PROJECT"]
    assert plan.overriding({"KINETIC_BACKEND": "local"}, "local") == []
    assert plan.overriding({"KINETIC_BACKEND": "local"}, "join") == ["KINETIC_BACKEND"]
    assert plan.overriding({}, "join") == []


# --------------------------------------------------------------------------- in process


class Terminal(io.StringIO):
    """stdin on a terminal, with the user's answers typed in advance."""

    def isatty(self) -> bool:
        return True


def stdin(monkeypatch: pytest.MonkeyPatch, answers: str | None) -> None:
    """``answers`` typed on a terminal; None: stdin is no terminal (and empty)."""
    monkeypatch.setattr("sys.stdin", io.StringIO("") if answers is None else Terminal(answers))


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def profiles() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(Path(os.environ["KINETIC_PROFILES_FILE"]).read_text())
    return document


@pytest.fixture(autouse=True)
def piped(monkeypatch: pytest.MonkeyPatch) -> None:
    """stdin is no terminal, unless a test types on one (:func:`stdin`)."""
    stdin(monkeypatch, None)


@pytest.fixture
def no_google(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "no-adc.json"))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # no gcloud


@pytest.fixture
def google(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Credentials (never read: the session's token is fixed) and a fake gcloud on the
    PATH that records its arguments; yields the file it records them in."""
    monkeypatch.setenv("HOME", str(tmp_path))
    adc = tmp_path / "adc.json"
    adc.write_text("{}")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(adc))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "gcloud-args"
    gcloud = bin_dir / "gcloud"
    gcloud.write_text(f'#!/bin/sh\necho "$@" >> {record}\n')
    gcloud.chmod(gcloud.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return record


@pytest.mark.usefixtures("no_google")
def test_no_terminal_and_no_flag_exits_2_at_once_naming_the_flags(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, err = run(capsys, "init")
    assert (code, out) == (2, "")
    assert "stdin is not a terminal" in err
    assert "--local, --join CLUSTER, --create or --doctor" in err
    assert not Path(os.environ["KINETIC_PROFILES_FILE"]).exists()


@pytest.mark.usefixtures("no_google")
@pytest.mark.parametrize("args", [["--local"], ["--yes"], ["--local", "--yes", "--json"]])
def test_local_saves_an_empty_current_profile(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    """Without Google credentials, --yes alone goes local too."""
    code, out, err = run(capsys, "init", *args)
    assert code == 0, err
    assert profiles() == {"current": "local", "profiles": {"local": {}}}
    assert load_settings().backend == "local"
    if "--json" in args:
        doc = json.loads(out)
        assert (doc["choice"], doc["profile"], doc["fields"]) == ("local", "local", {})
        assert doc["profile_action"] == "created"
        assert {c["name"] for c in doc["checks"]} >= {"python", "local-root", "credentials"}
    else:
        assert "profile local (no project: the local backend) created" in out
        assert "credentials  warn" in out
    # Again: the same profile, kept.
    code, out, _ = run(capsys, "init", "--local", "--json")
    assert json.loads(out)["profile_action"] == "kept"


@pytest.mark.usefixtures("no_google")
def test_an_overriding_variable_is_named(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KINETIC_PROJECT", "elsewhere")
    code, _, err = run(capsys, "init", "--local")
    assert code == 0
    assert "KINETIC_PROJECT=elsewhere is set: it takes precedence over profile local" in err


@pytest.mark.usefixtures("no_google")
def test_a_profile_with_other_settings_is_replaced_only_when_asked(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert run(capsys, "profile", "create", "local", "--project", "p")[0] == 0
    code, _, err = run(capsys, "init", "--local")
    assert code == 2
    assert "profile 'local' exists with other settings (project p)" in err
    assert "--force" in err
    assert run(capsys, "init", "--local", "--name", "here")[0] == 0
    assert profiles()["current"] == "here"
    assert run(capsys, "init", "--local", "--force")[0] == 0
    assert profiles()["profiles"]["local"] == {}
    # On a terminal, it asks.
    assert run(capsys, "profile", "create", "local", "--project", "p", "--force")[0] == 0
    stdin(monkeypatch, "y\n")
    code, _, err = run(capsys, "init", "--local")
    assert code == 0
    assert "Replace profile local (project p)? [y/N]" in err


@pytest.mark.usefixtures("no_google")
def test_on_a_terminal_it_asks_and_defaults_to_local_without_credentials(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    stdin(monkeypatch, "join\nwhat\n\n")
    code, out, err = run(capsys, "init")
    assert code == 0, err
    assert "How do you want to run jobs?" in err
    assert "Choice [local]: " in err
    assert "join needs Google credentials" in err  # the first answer is refused
    assert "answer 1-4" in err  # the second
    assert profiles()["current"] == "local"  # the third: the default
    assert "How do you want" not in out  # prompts stay off stdout


@pytest.mark.usefixtures("no_google")
def test_stdin_ending_mid_question_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    stdin(monkeypatch, "")
    code, _, err = run(capsys, "init")
    assert code == 2
    assert "no answer (stdin ended)" in err


@pytest.mark.usefixtures("no_google")
def test_doctor_way_runs_the_doctor(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, err = run(capsys, "init", "--doctor", "--json")
    assert code == 0, err
    assert [c["name"] for c in json.loads(out)["checks"]][:3] == ["python", "packages", "settings"]
    stdin(monkeypatch, "4\n")
    code, out, _ = run(capsys, "init")
    assert code == 0
    assert out.splitlines()[-1] == "4 ok, 1 skip"  # doctor's summary


def test_join_saves_the_clusters_location_and_adds_its_context(
    gke: FakeProjectGKE,  # noqa: F811
    google: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gke.add_cluster("train", location="europe-west4-b")
    gke.add_cluster("other", location="us-east1")
    code, out, err = run(capsys, "--project", "p", "init", "--join", "train", "--json")
    assert code == 0, err
    doc = json.loads(out)
    fields = {"project": "p", "zone": "europe-west4-b", "cluster": "train"}
    assert (doc["choice"], doc["profile"], doc["fields"]) == ("join", "train", fields)
    assert profiles() == {"current": "train", "profiles": {"train": fields}}
    # Without --yes (and no terminal) gcloud is not run: the next step says how.
    assert doc["kubeconfig"] == "missing"
    assert doc["next"][0].startswith(
        "gcloud container clusters get-credentials train --zone europe-west4-b --project p"
    )
    assert not google.exists()
    assert gke.requests[0].url.path == "/v1/projects/p/locations/-/clusters"
    # --yes runs it.
    code, out, err = run(capsys, "--project", "p", "init", "--join", "other", "--yes")
    assert code == 0, err
    assert (
        google.read_text()
        == "container clusters get-credentials other --region us-east1 --project p\n"
    )
    assert "profile other (project p, zone us-east1, cluster other) created" in out
    assert load_settings().cluster == "other"


def test_join_unknown_cluster_exits_3(
    gke: FakeProjectGKE,  # noqa: F811
    google: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gke.add_cluster("train")
    code, _, err = run(capsys, "--project", "p", "init", "--join", "nope")
    assert code == 3
    assert "no GKE cluster 'nope' in project p (found: train (z))" in err
    assert not Path(os.environ["KINETIC_PROFILES_FILE"]).exists()


def test_join_without_a_project_is_a_usage_error(
    google: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = run(capsys, "init", "--join", "c")
    assert code == 2
    assert "init --join needs a GCP project: --project P, or gcloud config set project P" in err


def test_the_project_comes_from_gclouds_configuration(
    gke: FakeProjectGKE,  # noqa: F811
    google: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = tmp_path / "gcloud-config"
    (config / "configurations").mkdir(parents=True)
    (config / "active_config").write_text("work")
    (config / "configurations" / "config_work").write_text("[core]\nproject = p\n")
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(config))
    gke.add_cluster("only")
    code, out, err = run(capsys, "init", "--yes", "--json")  # the one cluster: joined
    assert code == 0, err
    doc = json.loads(out)
    assert (doc["choice"], doc["fields"]["project"], doc["kubeconfig"]) == ("join", "p", "added")
    project = next(c for c in doc["checks"] if c["name"] == "project")
    assert project["detail"] == "p (gcloud config)"


def test_yes_alone_never_creates(
    gke: FakeProjectGKE,  # noqa: F811
    google: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, _, err = run(capsys, "--project", "p", "init", "--yes")
    assert code == 2
    assert "--local, --join CLUSTER, --create or --doctor" in err
    gke.add_cluster("a")
    gke.add_cluster("b")
    code, _, err = run(capsys, "--project", "p", "init", "--yes")
    assert code == 2  # two clusters: which one?


def test_on_a_terminal_join_offers_the_projects_clusters(
    gke: FakeProjectGKE,  # noqa: F811
    google: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gke.add_cluster("a")
    gke.add_cluster("b", location="us-west1-c")
    stdin(monkeypatch, "\n2\nn\n")  # the default (join), cluster 2, no gcloud
    code, _, err = run(capsys, "--project", "p", "init")
    assert code == 0, err
    assert "Choice [join]: " in err
    assert "use a GKE cluster of project p: a (z), b (us-west1-c)" in err
    assert "Which cluster? [a]: " in err
    assert "Add its kubeconfig context (gcloud container clusters get-credentials b" in err
    assert not google.exists()
    assert profiles()["profiles"]["b"]["zone"] == "us-west1-c"


def test_create_runs_up_then_saves_the_profile(
    gke: FakeProjectGKE,  # noqa: F811
    google: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran: list[Any] = []

    def up(ns: Any) -> int:
        ran.append(ns)
        print(json.dumps({"namespace": "default", "outcomes": []}) if ns.json else "ITEM RESULT")
        return 0

    monkeypatch.setattr(infra, "run", up)
    code, out, err = run(
        capsys, "--project", "p", "--zone", "asia-east1-a", "init", "--create", "--json"
    )
    assert code == 0, err
    doc = json.loads(out)  # one document: up's is inside it
    assert doc["up"] == {"namespace": "default", "outcomes": []}
    assert (ran[0].group, ran[0].project, ran[0].zone, ran[0].cluster) == (
        "up", "p", "asia-east1-a", "kinetic-cluster",
    )  # fmt: skip
    assert profiles()["profiles"]["kinetic-cluster"]["zone"] == "asia-east1-a"
    # On a terminal it asks for the name and the zone (default: the current profile's).
    stdin(monkeypatch, "create\nbig\n\nn\n")
    code, out, err = run(capsys, "--project", "p", "init", "--name", "big-one")
    assert code == 0, err
    assert "Choice [create]: Name of the new cluster [kinetic-cluster]: " in err
    assert (ran[-1].cluster, ran[-1].zone) == ("big", "asia-east1-a")
    assert "ITEM RESULT" in out
    assert profiles()["current"] == "big-one"


def test_create_failing_saves_nothing(
    google: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(infra, "run", lambda ns: 4)
    assert run(capsys, "--project", "p", "init", "--create")[0] == 4
    assert not Path(os.environ["KINETIC_PROFILES_FILE"]).exists()
