"""``gs://`` and ``hf://`` data in real local-backend jobs (GCS on fake-gcs-server)."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

import kinetic
from kinetic import Data
from kinetic._storage.gcs import GCSStorage

pytestmark = [pytest.mark.storage, pytest.mark.local]


@kinetic.run()
def look(path: str) -> object:
    if os.path.isdir(path):
        return sorted(
            (os.path.relpath(os.path.join(d, f), path), open(os.path.join(d, f)).read())
            for d, _, fs in os.walk(path)
            for f in fs
        )
    with open(path) as f:
        return f.read()


@pytest.fixture
def filled_bucket(gcs_bucket: str) -> str:
    async def fill() -> None:
        store = GCSStorage(gcs_bucket)
        try:
            await store.write("datasets/train/a.txt", b"alpha")
            await store.write("datasets/train/sub/b.txt", b"beta")
            await store.write("datasets/trainer.txt", b"not in the prefix")
            await store.write("weights.bin", b"W")
        finally:
            await store.aclose()

    anyio.run(fill)
    return gcs_bucket


def test_gcs_directory_and_single_object_download(filled_bucket: str) -> None:
    assert look(Data(f"gs://{filled_bucket}/datasets/train/")) == [
        ("a.txt", "alpha"),
        ("sub/b.txt", "beta"),
    ]
    # A single object downloads too (the original silently downloaded nothing).
    assert look(Data(f"gs://{filled_bucket}/weights.bin")) == "W"


def test_missing_gcs_object_fails_at_job_start_naming_the_uri(filled_bucket: str) -> None:
    uri = f"gs://{filled_bucket}/nope.bin"
    with pytest.raises(kinetic.JobFailedError, match=uri) as info:
        look(Data(uri))
    assert info.value.phase == "resolve"


def test_hf_dataset_is_loaded_in_the_job_and_handed_over_as_a_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "project"
    (project / "tinyset").mkdir(parents=True)
    (project / "pyproject.toml").write_text("")
    (project / "tinyset" / "train.csv").write_text("text,label\nhello,1\nworld,0\n")
    monkeypatch.setenv("KINETIC_PACKAGE_ROOT", str(project))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))

    @kinetic.run()
    def rows(path: str) -> list[dict[str, object]]:
        import datasets

        return list(datasets.load_from_disk(path))

    assert rows(Data("hf://tinyset?split=train")) == [
        {"text": "hello", "label": 1},
        {"text": "world", "label": 0},
    ]
