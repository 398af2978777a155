"""``kinetic.Data`` end to end on the local backend: the function only ever sees paths."""

from __future__ import annotations

import os
from collections import OrderedDict, defaultdict
from pathlib import Path
from typing import Any, NamedTuple

import pytest

import kinetic
from kinetic import Data
from tests.fix_env import job_dirs

pytestmark = pytest.mark.local


class Pair(NamedTuple):
    left: Any
    right: Any


@kinetic.run()
def read_paths(obj: Any) -> Any:
    """Replace every path string in ``obj`` by what it names (file text or dir listing)."""

    def look(x: Any) -> Any:
        if isinstance(x, str) and os.path.isdir(x):
            return sorted(
                os.path.relpath(os.path.join(d, f), x) for d, _, fs in os.walk(x) for f in fs
            )
        if isinstance(x, str) and os.path.isfile(x):
            with open(x) as f:
                return f.read()
        if isinstance(x, Pair):
            return Pair(look(x.left), look(x.right))
        if isinstance(x, (list, tuple)):
            return type(x)(look(v) for v in x)
        if isinstance(x, dict):
            out = type(x)() if not isinstance(x, defaultdict) else defaultdict(x.default_factory)
            for k, v in x.items():
                out[k] = look(v)
            return out
        return x

    return {"value": look(obj), "types": type(obj).__name__}


@kinetic.run()
def read_volume(mount: str) -> list[str]:
    return sorted(os.listdir(mount))


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    root = tmp_path / "dataset"
    (root / "nested").mkdir(parents=True)
    (root / "a.txt").write_text("alpha")
    (root / "nested" / "b.txt").write_text("beta")
    (root / "empty").mkdir()
    return root


def test_file_and_directory_arguments_become_paths(dataset: Path) -> None:
    out = read_paths([Data(dataset / "a.txt"), Data(dataset)])
    assert out["value"] == ["alpha", ["a.txt", "nested/b.txt"]]


def test_nested_containers_keep_their_types(dataset: Path) -> None:
    f = Data(dataset / "a.txt")
    obj = {
        "pair": Pair(f, 1),
        "ordered": OrderedDict(x=f),
        "default": defaultdict(list, y=[f]),
        "tuple": (1, (f,)),
    }
    out = read_paths(obj)["value"]
    assert out["pair"] == ["alpha", 1] or out["pair"] == Pair("alpha", 1)
    assert out["ordered"] == OrderedDict(x="alpha")
    assert isinstance(out["ordered"], OrderedDict)
    assert out["default"] == {"y": ["alpha"]}
    assert out["tuple"] == [1, ["alpha"]] or out["tuple"] == (1, ("alpha",))


def test_unchanged_data_is_uploaded_once(dataset: Path, kinetic_env: Path) -> None:
    assert read_paths(Data(dataset))["value"] == ["a.txt", "nested/b.txt"]
    cache = kinetic_env / "storage" / "default" / "data-cache"
    files = sorted(p for p in cache.rglob("*") if p.is_file())
    stamps = {p: p.stat().st_mtime_ns for p in files}
    assert len(files) == 2
    assert read_paths(Data(dataset))["value"] == ["a.txt", "nested/b.txt"]
    again = sorted(p for p in cache.rglob("*") if p.is_file())
    assert again == files
    assert {p: p.stat().st_mtime_ns for p in again} == stamps


def test_interrupted_upload_is_completed_not_trusted(dataset: Path, kinetic_env: Path) -> None:
    read_paths(Data(dataset))
    storage = kinetic_env / "storage" / "default"
    markers = list((storage / "data-markers").iterdir())
    assert len(markers) == 1
    digest = markers[0].name
    # Simulate a crash mid-upload: the marker (written last) and one file are gone.
    markers[0].unlink()
    (storage / "data-cache" / digest / "nested" / "b.txt").unlink()
    assert read_paths(Data(dataset))["value"] == ["a.txt", "nested/b.txt"]
    assert (storage / "data-markers" / digest).is_file()
    assert (storage / "data-cache" / digest / "nested" / "b.txt").read_text() == "beta"


def test_changed_data_is_uploaded_again(dataset: Path) -> None:
    assert read_paths(Data(dataset / "a.txt"))["value"] == "alpha"
    (dataset / "a.txt").write_text("ALPHA")
    assert read_paths(Data(dataset / "a.txt"))["value"] == "ALPHA"


def test_volumes_are_mounted_at_absolute_paths(dataset: Path, tmp_path: Path) -> None:
    mount = str(tmp_path / "mnt" / "data")
    fn = kinetic.run(volumes={mount: Data(dataset)})(read_volume.__wrapped__)
    assert fn(mount) == ["a.txt", "empty", "nested"]


def test_fuse_on_the_local_backend_uses_the_path_in_place(dataset: Path) -> None:
    @kinetic.run()
    def where(path: str) -> str:
        return path

    assert where(Data(dataset, fuse=True)) == str(dataset.resolve())


def test_local_data_inside_the_project_is_not_in_the_context(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kinetic_env: Path
) -> None:
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "pyproject.toml").write_text("")
    (project / "data" / "big.bin").write_bytes(b"x" * 1000)
    monkeypatch.setenv("KINETIC_PACKAGE_ROOT", str(project))
    assert read_paths(Data(project / "data"))["value"] == ["big.bin"]
    import zipfile

    contexts = list((kinetic_env / "storage" / "default" / "contexts").iterdir())
    names = {n for c in contexts for n in zipfile.ZipFile(c).namelist()}
    assert "pyproject.toml" in names
    assert not any(n.startswith("data/") for n in names)


@pytest.mark.parametrize(
    ("volumes", "match"),
    [
        ({"relative/path": None}, "absolute"),
        ({"/proc/x": None}, "reserved"),
        ({"/etc": None}, "reserved"),
        ({"/": None}, "reserved"),
    ],
)
def test_bad_volumes(volumes: dict[str, Any], match: str, dataset: Path) -> None:
    mounts = {k: Data(dataset) for k in volumes}
    with pytest.raises(kinetic.DataError, match=match):
        kinetic.run(volumes=mounts)


def test_data_in_a_set_or_as_a_key_is_refused(dataset: Path, kinetic_env: Path) -> None:
    with pytest.raises(kinetic.DataError, match="set"):
        read_paths.run_async({Data(dataset)})
    with pytest.raises(kinetic.DataError, match="key"):
        read_paths.run_async({Data(dataset): 1})
    assert job_dirs(kinetic_env) == []


def test_missing_and_empty_paths(tmp_path: Path) -> None:
    with pytest.raises(kinetic.DataError):
        Data(tmp_path / "nope")
    with pytest.raises(kinetic.DataError):
        Data("")
    with pytest.raises(kinetic.DataError):
        Data("hf://imdb", fuse=True)


def test_batch_inputs_with_data_share_one_upload(dataset: Path, kinetic_env: Path) -> None:
    shared = Data(dataset / "a.txt")
    batch = read_paths.run_async_map([[shared, i] for i in range(20)], input_mode="single")
    values = [r["value"] for r in batch.results()]
    assert values == [["alpha", i] for i in range(20)]
    markers = list((kinetic_env / "storage" / "default" / "data-markers").iterdir())
    assert len(markers) == 1


def test_batch_input_with_data_in_a_set_is_named(dataset: Path) -> None:
    with pytest.raises(kinetic.DataError, match="input 1"):
        read_paths.run_async_map([1, {Data(dataset)}])
