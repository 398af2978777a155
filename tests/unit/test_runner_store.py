"""The runner's stores: ``file://`` with the standard library only, other schemes
through the plug-ins its launcher names (:data:`runner.store.STORES_ENV`), and
Kinetic's launchers naming Kinetic's ``gs://`` store."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from kinetic._core import accelerators, k8s_spec, store_plugins
from runner import store
from runner.store import STORES_ENV, FileStore, open_store

ROOT = Path(__file__).resolve().parents[2]

PLUGIN = """
from pathlib import Path

from runner.store import FileStore, register_store


def open_mem(url):
    rest = url.removeprefix("mem://")
    if not rest:
        raise ValueError("mem:// needs a folder")
    return FileStore(Path("/" + rest))


register_store("mem", open_mem)
"""


@pytest.fixture
def no_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store, "_OPENERS", {})


def test_a_plugin_named_by_the_launcher_opens_its_scheme(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_plugins: None
) -> None:
    (tmp_path / "fix_mem_store.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(STORES_ENV, " , fix_mem_store")
    opened = open_store(f"mem://{tmp_path.as_posix().lstrip('/')}/objects")
    assert isinstance(opened, FileStore)
    opened.write("a/b", b"x")
    assert (tmp_path / "objects" / "a" / "b").read_bytes() == b"x"
    with pytest.raises(SystemExit, match="mem:// needs a folder"):
        open_store("mem://")


def test_a_scheme_without_a_plugin_says_how_stores_are_added(
    monkeypatch: pytest.MonkeyPatch, no_plugins: None
) -> None:
    monkeypatch.delenv(STORES_ENV, raising=False)
    with pytest.raises(SystemExit, match=f"unsupported storage URL 'gs://b'.*{STORES_ENV}"):
        open_store("gs://b")
    with pytest.raises(SystemExit, match="unsupported storage URL 'nowhere'"):
        open_store("nowhere")


def test_a_plugin_that_cannot_be_imported_is_named(
    monkeypatch: pytest.MonkeyPatch, no_plugins: None
) -> None:
    monkeypatch.setenv(STORES_ENV, "no_such_store_module")
    with pytest.raises(SystemExit, match="'no_such_store_module'.*cannot be imported"):
        open_store("gs://b")


def test_the_runner_opens_a_file_store_without_importing_kinetic(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from runner.store import open_store\n"
        f"open_store({(tmp_path.as_uri())!r}).write('k', b'v')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'kinetic'))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
    assert (tmp_path / "k").read_bytes() == b"v"


def test_kinetics_pods_name_its_gcs_store_and_it_is_importable() -> None:
    template = k8s_spec.JobTemplate(
        namespace="ns",
        image="reg/img:t",
        bucket="p-kn-c-jobs",
        accelerator=accelerators.parse_accelerator("cpu"),
        output_dir="gs://p-kn-c-jobs/outputs/job-1234abcd",
    )
    container = k8s_spec.job_manifest(template, "job-1234abcd")["spec"]["template"]["spec"][
        "containers"
    ][0]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert env[STORES_ENV] == store_plugins.GCS_STORE
    assert importlib.util.find_spec(store_plugins.GCS_STORE) is not None
