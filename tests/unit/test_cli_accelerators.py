"""``kinetic accelerators``: the catalog listing and name resolution (pure)."""

from __future__ import annotations

import pytest

from kinetic._cli.accelerators import catalog, resolution
from kinetic._core import accelerators as acc
from kinetic._exceptions import AcceleratorError


def test_catalog_lists_every_shape_once_and_each_name_parses_back() -> None:
    rows = catalog()
    names = [r["name"] for r in rows]
    assert len(names) == len(set(names))
    gpus = sum(len(s.machine_types) for s in acc.GPU_CATALOG.values())
    tpus = sum(len(s.slices) for s in acc.TPU_CATALOG.values())
    assert len(rows) == 1 + gpus + tpus
    for row in rows:
        cfg = acc.parse_accelerator(row["name"])
        assert cfg.name == row["name"]
        assert cfg.kind == row["category"]
        assert row["spot"] is True
    by_name = {r["name"]: r for r in rows}
    assert by_name["gpu-l4x4"]["machine_type"] == "g2-standard-48"
    assert by_name["gpu-l4x4"]["chips"] == 4
    assert by_name["tpu-v5litepod-4"]["topology"] == "2x2"
    assert by_name["tpu-v5litepod-16"]["hosts"] == 4  # multi-host slice


def test_resolution_of_aliases_and_spot() -> None:
    info = resolution("v5e-2x4:spot")
    assert info["name"] == "tpu-v5litepod-8"
    assert info["spot"] is True
    assert info["node_selector"][acc.LABEL_SPOT] == "true"
    assert info["resource_limits"] == {acc.RESOURCE_TPU: "8"}
    assert resolution("cpu:4:16gi")["resource_limits"] == {"cpu": "4", "memory": "16Gi"}
    assert resolution("l4")["spot"] is False


def test_resolution_of_a_bad_name_lists_the_valid_forms() -> None:
    with pytest.raises(AcceleratorError, match="Valid forms"):
        resolution("gpu-k80")


def test_catalog_shows_the_v3_slices_gke_offers_with_gkes_labels() -> None:
    by_name = {r["name"]: r for r in catalog()}
    assert by_name["tpu-v3-4"]["gke_label"] == "tpu-v3-device"
    assert by_name["tpu-v3-1024"]["gke_label"] == "tpu-v3-slice"
    assert by_name["tpu-v3-1024"]["topology"] == "32x32"
    assert "tpu-v3-2048" not in by_name  # bigger than a v3 Pod


def test_resolution_of_the_originals_documented_names() -> None:
    # Cloud TPU's v3-8, the original's example accelerator, is the single-host v3 slice.
    info = resolution("tpu-v3-8")
    assert (info["name"], info["topology"], info["hosts"]) == ("tpu-v3-4", "2x2", 1)
    assert info["node_selector"] == {
        acc.LABEL_TPU_ACCELERATOR: "tpu-v3-device",
        acc.LABEL_TPU_TOPOLOGY: "2x2",
    }
    assert resolution("gpu:l4-2")["name"] == "gpu-l4x2"
    with pytest.raises(AcceleratorError, match="GKE does not offer TPU v2"):
        resolution("v2-8")
