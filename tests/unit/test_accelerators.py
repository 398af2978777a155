"""Unit tests of the accelerator catalog: names -> configs -> GKE pod fields.

The name tables cover every name keras-kinetic 0.0.4's own tests accept, with the
configs it resolved them to, plus the examples from the design contract.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from kinetic._core import accelerators as acc
from kinetic._core.accelerators import (
    CpuConfig,
    GpuConfig,
    TpuConfig,
    jax_platforms,
    node_selector,
    parse_accelerator,
    resource_limits,
    resource_requests,
    tolerations,
    valid_forms,
)
from kinetic._exceptions import AcceleratorError, ConfigError

GPU_SEL = "cloud.google.com/gke-accelerator"
TPU_SEL = "cloud.google.com/gke-tpu-accelerator"
TOPO_SEL = "cloud.google.com/gke-tpu-topology"
SPOT_SEL = "cloud.google.com/gke-spot"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
TPU_TOLERATION = {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}
SPOT_TOLERATION = {
    "key": "cloud.google.com/gke-spot",
    "operator": "Equal",
    "value": "true",
    "effect": "NoSchedule",
}

# name -> (gpu_type, count, gke_label, machine_type)
GPU_NAMES: dict[str, tuple[str, int, str, str]] = {
    "gpu": ("l4", 1, "nvidia-l4", "g2-standard-4"),
    "gpu-l4": ("l4", 1, "nvidia-l4", "g2-standard-4"),
    "gpu:l4": ("l4", 1, "nvidia-l4", "g2-standard-4"),
    "l4": ("l4", 1, "nvidia-l4", "g2-standard-4"),
    "nvidia-l4": ("l4", 1, "nvidia-l4", "g2-standard-4"),
    "  GPU-L4\t": ("l4", 1, "nvidia-l4", "g2-standard-4"),
    "gpu:l4x2": ("l4", 2, "nvidia-l4", "g2-standard-24"),
    "l4x4": ("l4", 4, "nvidia-l4", "g2-standard-48"),
    "l4x8": ("l4", 8, "nvidia-l4", "g2-standard-96"),
    "a100-80gb": ("a100-80gb", 1, "nvidia-a100-80gb", "a2-ultragpu-1g"),
    "gpu-a100-80gb": ("a100-80gb", 1, "nvidia-a100-80gb", "a2-ultragpu-1g"),
    "gpu:a100-80gbx4": ("a100-80gb", 4, "nvidia-a100-80gb", "a2-ultragpu-4g"),
    "gpu-a100": ("a100", 1, "nvidia-tesla-a100", "a2-highgpu-1g"),
    "gpu:a100x4": ("a100", 4, "nvidia-tesla-a100", "a2-highgpu-4g"),
    "gpu-a100x4": ("a100", 4, "nvidia-tesla-a100", "a2-highgpu-4g"),
    "  GPU:A100X4  ": ("a100", 4, "nvidia-tesla-a100", "a2-highgpu-4g"),
    "a100x16": ("a100", 16, "nvidia-tesla-a100", "a2-megagpu-16g"),
    "h100": ("h100", 1, "nvidia-h100-80gb", "a3-highgpu-1g"),
    "h100x8": ("h100", 8, "nvidia-h100-80gb", "a3-highgpu-8g"),
    "gpu:v100": ("v100", 1, "nvidia-tesla-v100", "n1-standard-8"),
    "gpu:nvidia-tesla-v100x4": ("v100", 4, "nvidia-tesla-v100", "n1-standard-32"),
    "gpu:t4": ("t4", 1, "nvidia-tesla-t4", "n1-standard-4"),
    "gpu:nvidia-tesla-t4": ("t4", 1, "nvidia-tesla-t4", "n1-standard-4"),
    "t4x2": ("t4", 2, "nvidia-tesla-t4", "n1-standard-8"),
    "gpu:p100": ("p100", 1, "nvidia-tesla-p100", "n1-standard-4"),
    "p100x4": ("p100", 4, "nvidia-tesla-p100", "n1-standard-16"),
    "gpu:p4": ("p4", 1, "nvidia-tesla-p4", "n1-standard-4"),
    # A bare count picks the most capable GPU offered with that many.
    "gpu:4": ("h100", 4, "nvidia-h100-80gb", "a3-highgpu-4g"),
    "gpu-4": ("h100", 4, "nvidia-h100-80gb", "a3-highgpu-4g"),
    "8": ("h100", 8, "nvidia-h100-80gb", "a3-highgpu-8g"),
    "gpu:16": ("a100-80gb", 16, "nvidia-a100-80gb", "a2-ultragpu-16g"),
}

# name -> (tpu_type, chips, topology, gke_accelerator, machine_type, num_nodes)
TPU_NAMES: dict[str, tuple[str, int, str, str, str, int]] = {
    "tpu": ("v5litepod", 4, "2x2", "tpu-v5-lite-podslice", "ct5lp-hightpu-4t", 1),
    "tpu-v5litepod-4": ("v5litepod", 4, "2x2", "tpu-v5-lite-podslice", "ct5lp-hightpu-4t", 1),
    "v5litepod-4": ("v5litepod", 4, "2x2", "tpu-v5-lite-podslice", "ct5lp-hightpu-4t", 1),
    "tpu:v5litepod": ("v5litepod", 4, "2x2", "tpu-v5-lite-podslice", "ct5lp-hightpu-4t", 1),
    "tpu-v5litepod": ("v5litepod", 4, "2x2", "tpu-v5-lite-podslice", "ct5lp-hightpu-4t", 1),
    "tpu:v5litepod-2x2": ("v5litepod", 4, "2x2", "tpu-v5-lite-podslice", "ct5lp-hightpu-4t", 1),
    "tpu-v5litepod-2x2": ("v5litepod", 4, "2x2", "tpu-v5-lite-podslice", "ct5lp-hightpu-4t", 1),
    "tpu:v5litepod-1": ("v5litepod", 1, "1x1", "tpu-v5-lite-podslice", "ct5lp-hightpu-1t", 1),
    "tpu:v5litepod-1x1": ("v5litepod", 1, "1x1", "tpu-v5-lite-podslice", "ct5lp-hightpu-1t", 1),
    "v5e-2x4": ("v5litepod", 8, "2x4", "tpu-v5-lite-podslice", "ct5lp-hightpu-8t", 1),
    "tpu:v5e-8": ("v5litepod", 8, "2x4", "tpu-v5-lite-podslice", "ct5lp-hightpu-8t", 1),
    "tpu-v5e-8": ("v5litepod", 8, "2x4", "tpu-v5-lite-podslice", "ct5lp-hightpu-8t", 1),
    "v5litepod-16": ("v5litepod", 16, "4x4", "tpu-v5-lite-podslice", "ct5lp-hightpu-4t", 4),
    "64": ("v5litepod", 64, "8x8", "tpu-v5-lite-podslice", "ct5lp-hightpu-4t", 16),
    "tpu-v6e-8": ("v6e", 8, "2x4", "tpu-v6e-slice", "ct6e-standard-4t", 2),
    "v6e-8": ("v6e", 8, "2x4", "tpu-v6e-slice", "ct6e-standard-4t", 2),
    "tpu:v6e": ("v6e", 8, "2x4", "tpu-v6e-slice", "ct6e-standard-4t", 2),
    "tpu:8": ("v6e", 8, "2x4", "tpu-v6e-slice", "ct6e-standard-4t", 2),
    "tpu-8": ("v6e", 8, "2x4", "tpu-v6e-slice", "ct6e-standard-4t", 2),
    "v6e-4x4": ("v6e", 16, "4x4", "tpu-v6e-slice", "ct6e-standard-4t", 4),
    "tpu:v5p": ("v5p", 8, "2x2x2", "tpu-v5p-slice", "ct5p-hightpu-4t", 2),
    "tpu:v5p-2x2x2": ("v5p", 8, "2x2x2", "tpu-v5p-slice", "ct5p-hightpu-4t", 2),
    "32": ("v5p", 32, "2x4x4", "tpu-v5p-slice", "ct5p-hightpu-4t", 8),
    "tpu:v4": ("v4", 4, "2x2x1", "tpu-v4-podslice", "ct4p-hightpu-4t", 1),
    "v4-8": ("v4", 8, "2x2x2", "tpu-v4-podslice", "ct4p-hightpu-4t", 2),
    "tpu:4096": ("v4", 4096, "16x16x16", "tpu-v4-podslice", "ct4p-hightpu-4t", 1024),
    # GKE labels v3 nodes by machine type (the original selected "tpu-v3-podslice").
    "tpu:v3": ("v3", 4, "2x2", "tpu-v3-device", "ct3-hightpu-4t", 1),
    "tpu:v3-4": ("v3", 4, "2x2", "tpu-v3-device", "ct3-hightpu-4t", 1),
    "tpu-v3-4": ("v3", 4, "2x2", "tpu-v3-device", "ct3-hightpu-4t", 1),
    "tpu:v3-32": ("v3", 32, "4x8", "tpu-v3-slice", "ct3p-hightpu-4t", 8),
}

# name -> (cpus, memory_gi)
CPU_NAMES: dict[str, tuple[int | None, int | None]] = {
    "cpu": (None, None),
    " CPU ": (None, None),
    "cpu:8": (8, None),
    "cpu:4:16gi": (4, 16),
    "CPU:2:3GI": (2, 3),
}


@pytest.mark.parametrize(("name", "expected"), GPU_NAMES.items())
def test_gpu_names(name: str, expected: tuple[str, int, str, str]) -> None:
    cfg = parse_accelerator(name)
    assert isinstance(cfg, GpuConfig)
    assert cfg.kind == "gpu"
    assert (cfg.gpu_type, cfg.count, cfg.gke_label, cfg.machine_type) == expected
    assert cfg.spot is False


@pytest.mark.parametrize(("name", "expected"), TPU_NAMES.items())
def test_tpu_names(name: str, expected: tuple[str, int, str, str, str, int]) -> None:
    cfg = parse_accelerator(name)
    assert isinstance(cfg, TpuConfig)
    assert cfg.kind == "tpu"
    got = (cfg.tpu_type, cfg.chips, cfg.topology, cfg.gke_accelerator, cfg.machine_type)
    assert (*got, cfg.num_nodes) == expected
    assert cfg.spot is False


@pytest.mark.parametrize(("name", "expected"), CPU_NAMES.items())
def test_cpu_names(name: str, expected: tuple[int | None, int | None]) -> None:
    cfg = parse_accelerator(name)
    assert cfg == CpuConfig(cpus=expected[0], memory_gi=expected[1])
    assert cfg.kind == "cpu"


@pytest.mark.parametrize(
    ("name", "canonical"),
    [
        ("cpu", "cpu"),
        ("CPU:8", "cpu:8"),
        ("cpu:4:16gi", "cpu:4:16gi"),
        ("l4", "gpu-l4"),
        ("gpu:nvidia-l4", "gpu-l4"),
        ("gpu", "gpu-l4"),
        ("gpu:a100-80gbx4", "gpu-a100-80gbx4"),
        ("8", "gpu-h100x8"),
        ("tpu", "tpu-v5litepod-4"),
        ("v5e-2x4", "tpu-v5litepod-8"),
        ("tpu:v5p-2x2x2", "tpu-v5p-8"),
        ("tpu-v6e-8:spot", "tpu-v6e-8"),
    ],
)
def test_canonical_name(name: str, canonical: str) -> None:
    cfg = parse_accelerator(name)
    assert cfg.name == canonical
    # The canonical name is what handles store; it must resolve to the same hardware.
    assert parse_accelerator(canonical, spot=cfg.spot) == cfg


@pytest.mark.parametrize(
    "name", ["l4:spot", "gpu-l4:spot", "v6e-8:spot", "tpu-v6e-8:spot", "cpu:spot", "L4:SPOT"]
)
def test_spot_suffix(name: str) -> None:
    cfg = parse_accelerator(name)
    assert cfg.spot is True
    assert dataclasses.replace(cfg, spot=False) == parse_accelerator(name[: -len(":spot")])


@pytest.mark.parametrize("name", ["l4", "v6e-8", "cpu:4"])
def test_spot_keyword(name: str) -> None:
    assert parse_accelerator(name, spot=True).spot is True
    assert parse_accelerator(name).spot is False
    # spot=False cannot cancel an explicit suffix: the name asked for spot.
    assert parse_accelerator(f"{name}:spot", spot=False).spot is True


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("tpu-v99-3", "unknown TPU 'v99-3'"),
        ("", "unknown accelerator"),
        ("   ", "unknown accelerator"),
        ("gpu-", "unknown GPU ''"),
        ("tpu:", "unknown TPU ''"),
        ("unknown", "unknown accelerator"),
        ("l4:spot:spot", "unknown accelerator"),
        ("gpu:l4x16", "GPU count 16 not supported for 'l4'; supported: 1, 2, 4, 8"),
        ("h100x3", "GPU count 3 not supported for 'h100'"),
        ("gpu:32", "no GPU type supports count 32"),
        ("tpu:8192", "no TPU type supports 8192 chips"),
        ("tpu:v3-6", "chip count 6 not supported for 'v3'"),
        ("v3-2x4", "topology '2x4' not supported for 'v3'"),
        ("l4-3", "GPU count 3 not supported for 'l4'"),
        ("tpu:v5litepod-3x3", "topology '3x3' not supported for 'v5litepod'"),
        ("v5litepod-2x2x2", "topology '2x2x2' not supported"),
        ("cpu:0", "CPU count and memory must be positive"),
        ("cpu:4:0gi", "CPU count and memory must be positive"),
        ("cpu:4gi", "unknown accelerator"),
        ("cpu-4", "unknown accelerator"),
    ],
)
def test_invalid_names_list_valid_forms(name: str, reason: str) -> None:
    with pytest.raises(AcceleratorError) as info:
        parse_accelerator(name)
    message = str(info.value)
    assert message.startswith(f"Invalid accelerator {name!r}: ")
    assert reason in message
    for form in valid_forms():
        assert form in message


@pytest.mark.parametrize("value", [42, None, b"l4", ["l4"]])
def test_non_string_is_rejected(value: object) -> None:
    with pytest.raises(AcceleratorError, match=f"must be a string, got {type(value).__name__}"):
        parse_accelerator(value)  # type: ignore[arg-type]


def test_errors_are_value_errors() -> None:
    # The original raised ValueError; callers catching it must keep working.
    with pytest.raises(ValueError, match="Valid forms"):
        parse_accelerator("tpu-v99-3")
    assert issubclass(AcceleratorError, ConfigError)


def test_valid_forms_name_every_type_and_their_examples_parse() -> None:
    forms = valid_forms()
    text = "\n".join(forms)
    for type_name in [*acc.GPU_CATALOG, *acc.TPU_CATALOG, "v5e", ":spot"]:
        assert type_name in text
    examples = [
        example
        for form in forms
        if "e.g." in form
        for example in form.split("e.g.", 1)[1].replace(",", " ").split()
    ]
    assert "v5e-2x4" in examples
    assert "cpu:4:16gi" in examples
    for example in examples:
        parse_accelerator(example)


def test_catalog_slices_are_consistent() -> None:
    for tpu_type, spec in acc.TPU_CATALOG.items():
        assert spec.default_chips in spec.slices
        for chips in spec.slices:
            cfg = acc.make_tpu(tpu_type, chips)
            dims = [int(d) for d in cfg.topology.split("x")]
            assert chips == dims[0] * dims[1] * (dims[2] if len(dims) == 3 else 1)
            # GKE schedules one pod per node, so each node must hold exactly its share.
            per_vm = int(re.fullmatch(r".*-(\d+)t", cfg.machine_type).group(1))  # type: ignore[union-attr]
            assert cfg.chips_per_node * cfg.num_nodes == chips
            assert cfg.chips_per_node == min(per_vm, chips)
            assert parse_accelerator(cfg.name) == cfg
    for gpu_type, gspec in acc.GPU_CATALOG.items():
        for count in gspec.machine_types:
            cfg_gpu = acc.make_gpu(gpu_type, count)
            assert parse_accelerator(cfg_gpu.name) == cfg_gpu
            assert parse_accelerator(f"{gspec.gke_label}x{count}") == cfg_gpu


def test_catalog_is_read_only() -> None:
    with pytest.raises(TypeError):
        acc.GPU_CATALOG["b200"] = acc.GPU_CATALOG["h100"]  # type: ignore[index]
    with pytest.raises(TypeError):
        acc.TPU_CATALOG["v6e"].slices[4] = acc.TPU_CATALOG["v5litepod"].slices[4]  # type: ignore[index]


def test_configs_are_frozen_values() -> None:
    cfg = parse_accelerator("l4x2")
    assert isinstance(cfg, GpuConfig)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.count = 4  # type: ignore[misc]
    assert {cfg, parse_accelerator("gpu:l4x2")} == {cfg}


@pytest.mark.parametrize(
    ("cpus", "memory_gi", "match"),
    [(0, None, "must be positive"), (None, 4, "needs .* a CPU count"), (2, -1, "positive")],
)
def test_cpu_config_validates(cpus: int | None, memory_gi: int | None, match: str) -> None:
    with pytest.raises(AcceleratorError, match=match):
        CpuConfig(cpus=cpus, memory_gi=memory_gi)


# --------------------------------------------------------------------------- pod fields


def test_gpu_pod_fields() -> None:
    cfg = parse_accelerator("l4x4")
    assert node_selector(cfg) == {GPU_SEL: "nvidia-l4"}
    assert resource_limits(cfg) == {"nvidia.com/gpu": "4"}
    assert resource_requests(cfg) == {"nvidia.com/gpu": "4"}
    assert tolerations(cfg) == [GPU_TOLERATION]
    assert jax_platforms(cfg) == "cuda"


def test_gpu_spot_pod_fields() -> None:
    cfg = parse_accelerator("gpu-h100x8:spot")
    assert node_selector(cfg) == {GPU_SEL: "nvidia-h100-80gb", SPOT_SEL: "true"}
    assert resource_limits(cfg) == {"nvidia.com/gpu": "8"}
    assert tolerations(cfg) == [GPU_TOLERATION, SPOT_TOLERATION]


@pytest.mark.parametrize(
    ("name", "accelerator", "topology", "per_node"),
    [
        ("tpu-v5litepod-4", "tpu-v5-lite-podslice", "2x2", "4"),
        ("v5e-2x4", "tpu-v5-lite-podslice", "2x4", "8"),
        # Multi-host slices: every pod asks for its own node's chips, not the slice's.
        ("v5litepod-16", "tpu-v5-lite-podslice", "4x4", "4"),
        ("tpu-v6e-8", "tpu-v6e-slice", "2x4", "4"),
        ("v5p-32", "tpu-v5p-slice", "2x4x4", "4"),
    ],
)
def test_tpu_pod_fields(name: str, accelerator: str, topology: str, per_node: str) -> None:
    cfg = parse_accelerator(name)
    assert node_selector(cfg) == {TPU_SEL: accelerator, TOPO_SEL: topology}
    assert resource_limits(cfg) == {"google.com/tpu": per_node}
    assert resource_requests(cfg) == {"google.com/tpu": per_node}
    assert tolerations(cfg) == [TPU_TOLERATION]
    assert jax_platforms(cfg) == "tpu"


def test_tpu_spot_pod_fields() -> None:
    cfg = parse_accelerator("tpu-v6e-8", spot=True)
    assert node_selector(cfg) == {TPU_SEL: "tpu-v6e-slice", TOPO_SEL: "2x4", SPOT_SEL: "true"}
    assert tolerations(cfg) == [TPU_TOLERATION, SPOT_TOLERATION]


@pytest.mark.parametrize(
    ("name", "resources"),
    [
        ("cpu", {}),
        ("cpu:2", {"cpu": "2"}),
        ("cpu:4:16gi", {"cpu": "4", "memory": "16Gi"}),
    ],
)
def test_cpu_pod_fields(name: str, resources: dict[str, str]) -> None:
    cfg = parse_accelerator(name)
    assert node_selector(cfg) == {}
    assert resource_limits(cfg) == resources
    assert resource_requests(cfg) == resources
    assert tolerations(cfg) == []
    assert jax_platforms(cfg) == "cpu"


def test_cpu_spot_pod_fields() -> None:
    cfg = parse_accelerator("cpu:spot")
    assert node_selector(cfg) == {SPOT_SEL: "true"}
    assert tolerations(cfg) == [SPOT_TOLERATION]


def test_pod_fields_are_fresh_objects() -> None:
    # Spec builders add their own entries; that must not leak into the next job's spec.
    cfg = parse_accelerator("l4:spot")
    node_selector(cfg)["extra"] = "x"
    resource_limits(cfg)["cpu"] = "1"
    tolerations(cfg).clear()
    assert "extra" not in node_selector(cfg)
    assert resource_limits(cfg) == {"nvidia.com/gpu": "1"}
    assert len(tolerations(cfg)) == 2


def test_module_is_pure() -> None:
    # The catalog is sans-IO: it must not pull in an event loop or sockets.
    tree = ast.parse(Path(acc.__file__).read_text(encoding="utf-8"))
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        node.module.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
    }
    assert imported.isdisjoint({"asyncio", "anyio", "socket", "os", "subprocess"})


# --------------------------------------------------------------------------- the original's docs

# Every accelerator name keras-team/kinetic's documentation uses, and what it is here:
# README.md (tpu-v5e-1, v5e-1), docs/accelerators.md (the TPU and GPU tables, a100x4,
# l4x2, cpu, tpu-v6e-8), docs/guides/* (distributed_training, faq, cost_optimization,
# clusters, data, execution_modes, pytorch_training, vllm_serving, jax_training,
# llm_finetuning, gemma4_finetuning, async_jobs, batched_jobs), docs/index.rst, AGENTS.md
# and .gemini/styleguide.md (v3-8, v5e-4), the docstring of its parse_accelerator (gpu:l4-2,
# tpu:v3-8, ...), and the README of its keras-remote days (v2-8, v3-8).
# name -> (canonical name, GKE label, topology, machine type, hosts); topology None: a GPU.
V5E, V6E, V5P, V4 = "tpu-v5-lite-podslice", "tpu-v6e-slice", "tpu-v5p-slice", "tpu-v4-podslice"
V3_DEVICE, V3_SLICE = "tpu-v3-device", "tpu-v3-slice"
DOCUMENTED: dict[str, tuple[str, str, str | None, str, int]] = {
    "tpu-v5e-1": ("tpu-v5litepod-1", V5E, "1x1", "ct5lp-hightpu-1t", 1),
    "v5e-1": ("tpu-v5litepod-1", V5E, "1x1", "ct5lp-hightpu-1t", 1),
    "v5e-4": ("tpu-v5litepod-4", V5E, "2x2", "ct5lp-hightpu-4t", 1),
    "v6e-8": ("tpu-v6e-8", V6E, "2x4", "ct6e-standard-4t", 2),
    "tpu-v6e-8": ("tpu-v6e-8", V6E, "2x4", "ct6e-standard-4t", 2),
    "v6e-16": ("tpu-v6e-16", V6E, "4x4", "ct6e-standard-4t", 4),
    "tpu-v6e-16": ("tpu-v6e-16", V6E, "4x4", "ct6e-standard-4t", 4),
    "v6e": ("tpu-v6e-8", V6E, "2x4", "ct6e-standard-4t", 2),
    "v5p-8": ("tpu-v5p-8", V5P, "2x2x2", "ct5p-hightpu-4t", 2),
    "v5p-16": ("tpu-v5p-16", V5P, "2x2x4", "ct5p-hightpu-4t", 4),
    "v5p-32": ("tpu-v5p-32", V5P, "2x4x4", "ct5p-hightpu-4t", 8),
    "v5p": ("tpu-v5p-8", V5P, "2x2x2", "ct5p-hightpu-4t", 2),
    "v5litepod-1": ("tpu-v5litepod-1", V5E, "1x1", "ct5lp-hightpu-1t", 1),
    "tpu-v5litepod-1": ("tpu-v5litepod-1", V5E, "1x1", "ct5lp-hightpu-1t", 1),
    "v5litepod-4": ("tpu-v5litepod-4", V5E, "2x2", "ct5lp-hightpu-4t", 1),
    "tpu-v5litepod-4": ("tpu-v5litepod-4", V5E, "2x2", "ct5lp-hightpu-4t", 1),
    "v5litepod-8": ("tpu-v5litepod-8", V5E, "2x4", "ct5lp-hightpu-8t", 1),
    "tpu-v5litepod-8": ("tpu-v5litepod-8", V5E, "2x4", "ct5lp-hightpu-8t", 1),
    "v5litepod-16": ("tpu-v5litepod-16", V5E, "4x4", "ct5lp-hightpu-4t", 4),
    "tpu-v5litepod-16": ("tpu-v5litepod-16", V5E, "4x4", "ct5lp-hightpu-4t", 4),
    "v5litepod-32": ("tpu-v5litepod-32", V5E, "4x8", "ct5lp-hightpu-4t", 8),
    "v5litepod-64": ("tpu-v5litepod-64", V5E, "8x8", "ct5lp-hightpu-4t", 16),
    "v5litepod-128": ("tpu-v5litepod-128", V5E, "8x16", "ct5lp-hightpu-4t", 32),
    "v5litepod-256": ("tpu-v5litepod-256", V5E, "16x16", "ct5lp-hightpu-4t", 64),
    "tpu-v5litepod-2x2": ("tpu-v5litepod-4", V5E, "2x2", "ct5lp-hightpu-4t", 1),
    "tpu:v5litepod-2x2": ("tpu-v5litepod-4", V5E, "2x2", "ct5lp-hightpu-4t", 1),
    "tpu-v5litepod-2x4": ("tpu-v5litepod-8", V5E, "2x4", "ct5lp-hightpu-8t", 1),
    "v5litepod": ("tpu-v5litepod-4", V5E, "2x2", "ct5lp-hightpu-4t", 1),
    "tpu:v5litepod": ("tpu-v5litepod-4", V5E, "2x2", "ct5lp-hightpu-4t", 1),
    "tpu": ("tpu-v5litepod-4", V5E, "2x2", "ct5lp-hightpu-4t", 1),
    "tpu:8": ("tpu-v6e-8", V6E, "2x4", "ct6e-standard-4t", 2),
    "v4": ("tpu-v4-4", V4, "2x2x1", "ct4p-hightpu-4t", 1),
    "v4-4": ("tpu-v4-4", V4, "2x2x1", "ct4p-hightpu-4t", 1),
    "v4-8": ("tpu-v4-8", V4, "2x2x2", "ct4p-hightpu-4t", 2),
    "v4-16": ("tpu-v4-16", V4, "2x2x4", "ct4p-hightpu-4t", 4),
    "v4-32": ("tpu-v4-32", V4, "2x4x4", "ct4p-hightpu-4t", 8),
    "v4-64": ("tpu-v4-64", V4, "4x4x4", "ct4p-hightpu-4t", 16),
    "v4-128": ("tpu-v4-128", V4, "4x4x8", "ct4p-hightpu-4t", 32),
    "v4-256": ("tpu-v4-256", V4, "4x8x8", "ct4p-hightpu-4t", 64),
    "v4-512": ("tpu-v4-512", V4, "8x8x8", "ct4p-hightpu-4t", 128),
    "v4-1024": ("tpu-v4-1024", V4, "8x8x16", "ct4p-hightpu-4t", 256),
    "v4-2048": ("tpu-v4-2048", V4, "8x16x16", "ct4p-hightpu-4t", 512),
    "v4-4096": ("tpu-v4-4096", V4, "16x16x16", "ct4p-hightpu-4t", 1024),
    "v3": ("tpu-v3-4", V3_DEVICE, "2x2", "ct3-hightpu-4t", 1),
    "v3-4": ("tpu-v3-4", V3_DEVICE, "2x2", "ct3-hightpu-4t", 1),
    # Cloud TPU's v3-8 (8 TensorCores, 2 per chip): the single-host v3 slice, as v3-4.
    "v3-8": ("tpu-v3-4", V3_DEVICE, "2x2", "ct3-hightpu-4t", 1),
    "tpu:v3-8": ("tpu-v3-4", V3_DEVICE, "2x2", "ct3-hightpu-4t", 1),
    "tpu-v3-8": ("tpu-v3-4", V3_DEVICE, "2x2", "ct3-hightpu-4t", 1),
    "v3-16": ("tpu-v3-16", V3_SLICE, "4x4", "ct3p-hightpu-4t", 4),
    "v3-32": ("tpu-v3-32", V3_SLICE, "4x8", "ct3p-hightpu-4t", 8),
    "v3-64": ("tpu-v3-64", V3_SLICE, "8x8", "ct3p-hightpu-4t", 16),
    "v3-128": ("tpu-v3-128", V3_SLICE, "8x16", "ct3p-hightpu-4t", 32),
    "v3-256": ("tpu-v3-256", V3_SLICE, "16x16", "ct3p-hightpu-4t", 64),
    "v3-512": ("tpu-v3-512", V3_SLICE, "16x32", "ct3p-hightpu-4t", 128),
    "v3-1024": ("tpu-v3-1024", V3_SLICE, "32x32", "ct3p-hightpu-4t", 256),
    "h100": ("gpu-h100", "nvidia-h100-80gb", None, "a3-highgpu-1g", 1),
    "nvidia-h100-80gb": ("gpu-h100", "nvidia-h100-80gb", None, "a3-highgpu-1g", 1),
    "a100-80gb": ("gpu-a100-80gb", "nvidia-a100-80gb", None, "a2-ultragpu-1g", 1),
    "gpu:a100-80gb": ("gpu-a100-80gb", "nvidia-a100-80gb", None, "a2-ultragpu-1g", 1),
    "nvidia-a100-80gb": ("gpu-a100-80gb", "nvidia-a100-80gb", None, "a2-ultragpu-1g", 1),
    "a100": ("gpu-a100", "nvidia-tesla-a100", None, "a2-highgpu-1g", 1),
    "gpu-a100": ("gpu-a100", "nvidia-tesla-a100", None, "a2-highgpu-1g", 1),
    "nvidia-tesla-a100": ("gpu-a100", "nvidia-tesla-a100", None, "a2-highgpu-1g", 1),
    "a100x4": ("gpu-a100x4", "nvidia-tesla-a100", None, "a2-highgpu-4g", 1),
    "gpu:a100x4": ("gpu-a100x4", "nvidia-tesla-a100", None, "a2-highgpu-4g", 1),
    "gpu-a100x4": ("gpu-a100x4", "nvidia-tesla-a100", None, "a2-highgpu-4g", 1),
    "l4": ("gpu-l4", "nvidia-l4", None, "g2-standard-4", 1),
    "gpu-l4": ("gpu-l4", "nvidia-l4", None, "g2-standard-4", 1),
    "gpu:l4": ("gpu-l4", "nvidia-l4", None, "g2-standard-4", 1),
    "nvidia-l4": ("gpu-l4", "nvidia-l4", None, "g2-standard-4", 1),
    "l4x2": ("gpu-l4x2", "nvidia-l4", None, "g2-standard-24", 1),
    # The docstring's multi-GPU example: two L4s, like l4x2.
    "gpu:l4-2": ("gpu-l4x2", "nvidia-l4", None, "g2-standard-24", 1),
    "gpu": ("gpu-l4", "nvidia-l4", None, "g2-standard-4", 1),
    "gpu:4": ("gpu-h100x4", "nvidia-h100-80gb", None, "a3-highgpu-4g", 1),
    "v100": ("gpu-v100", "nvidia-tesla-v100", None, "n1-standard-8", 1),
    "nvidia-tesla-v100": ("gpu-v100", "nvidia-tesla-v100", None, "n1-standard-8", 1),
    "t4": ("gpu-t4", "nvidia-tesla-t4", None, "n1-standard-4", 1),
    "nvidia-tesla-t4": ("gpu-t4", "nvidia-tesla-t4", None, "n1-standard-4", 1),
    "p100": ("gpu-p100", "nvidia-tesla-p100", None, "n1-standard-4", 1),
    "nvidia-tesla-p100": ("gpu-p100", "nvidia-tesla-p100", None, "n1-standard-4", 1),
    "p4": ("gpu-p4", "nvidia-tesla-p4", None, "n1-standard-4", 1),
    "nvidia-tesla-p4": ("gpu-p4", "nvidia-tesla-p4", None, "n1-standard-4", 1),
}

# The GPU table of docs/accelerators.md: (short name, GKE label, "Multi-GPU Counts").
DOCUMENTED_GPU_COUNTS = [
    ("h100", "nvidia-h100-80gb", (1, 2, 4, 8)),
    ("a100-80gb", "nvidia-a100-80gb", (1, 2, 4, 8, 16)),
    ("a100", "nvidia-tesla-a100", (1, 2, 4, 8, 16)),
    ("l4", "nvidia-l4", (1, 2, 4, 8)),
    ("v100", "nvidia-tesla-v100", (1, 2, 4, 8)),
    ("t4", "nvidia-tesla-t4", (1, 2, 4)),
    ("p100", "nvidia-tesla-p100", (1, 2, 4)),
    ("p4", "nvidia-tesla-p4", (1, 2, 4)),
]

# Documented names of hardware GKE does not offer -> what the refusal must say.
NOT_ON_GKE: dict[str, tuple[str, ...]] = {
    "v2-8": ("GKE does not offer TPU v2", "'tpu-v3-4'", "'tpu-v5litepod-4'", "'tpu-v6e-8'"),
    "tpu-v2-8": ("GKE does not offer TPU v2", "'tpu-v3-4'"),
    "tpu:v2-32": ("GKE does not offer TPU v2",),
    "v2": ("GKE does not offer TPU v2",),
    "v2-2x2": ("GKE does not offer TPU v2",),
    "v3-2048": ("no 2048-chip (32x64) TPU v3 slice", "v3 Pod is 1024 chips", "'tpu-v3-1024'"),
    "tpu-v3-2048": ("no 2048-chip (32x64) TPU v3 slice", "'tpu-v3-1024'"),
    "v3-32x64": ("no 2048-chip (32x64) TPU v3 slice", "'tpu-v3-1024'"),
}


@pytest.mark.parametrize(("name", "expected"), DOCUMENTED.items())
def test_every_documented_name_resolves(
    name: str, expected: tuple[str, str, str | None, str, int]
) -> None:
    cfg = parse_accelerator(name)
    if isinstance(cfg, TpuConfig):
        got = (cfg.name, cfg.gke_accelerator, cfg.topology, cfg.machine_type, cfg.num_nodes)
        assert node_selector(cfg) == {TPU_SEL: expected[1], TOPO_SEL: expected[2]}
    else:
        assert isinstance(cfg, GpuConfig)
        got = (cfg.name, cfg.gke_label, None, cfg.machine_type, 1)
        assert node_selector(cfg) == {GPU_SEL: expected[1]}
    assert got == expected
    # A handle stores the canonical name: it must come back as the same hardware.
    assert parse_accelerator(cfg.name) == cfg


@pytest.mark.parametrize(("gpu_type", "label", "counts"), DOCUMENTED_GPU_COUNTS)
def test_documented_gpu_counts(gpu_type: str, label: str, counts: tuple[int, ...]) -> None:
    for count in counts:
        for name in (f"{gpu_type}x{count}", f"{label}x{count}", f"gpu:{gpu_type}-{count}"):
            cfg = parse_accelerator(name)
            assert isinstance(cfg, GpuConfig)
            assert (cfg.gpu_type, cfg.count, cfg.gke_label) == (gpu_type, count, label)


def test_documented_cpu_names() -> None:
    assert parse_accelerator("cpu") == CpuConfig()
    assert parse_accelerator("cpu:8") == CpuConfig(cpus=8)


@pytest.mark.parametrize(("name", "says"), NOT_ON_GKE.items())
def test_documented_names_gke_does_not_offer_are_refused_clearly(
    name: str, says: tuple[str, ...]
) -> None:
    with pytest.raises(AcceleratorError) as info:
        parse_accelerator(name)
    message = str(info.value)
    assert message.startswith(f"Invalid accelerator {name!r}: ")
    for part in says:
        assert part in message
    # The alternatives it names are real: each parses.
    reason = message.split(": ", 1)[1].split(". Valid forms", 1)[0]
    alternatives = re.findall(r"'(tpu-[a-z0-9-]+)'", reason)
    assert alternatives
    for alternative in alternatives:
        parse_accelerator(alternative)


def test_refused_v2_is_refused_by_the_factory_too() -> None:
    with pytest.raises(AcceleratorError, match="GKE does not offer TPU v2"):
        acc.make_tpu("v2", 4)
    with pytest.raises(AcceleratorError, match="no 2048-chip"):
        acc.make_tpu("v3", 2048)


def test_v3_labels_follow_the_machine_type() -> None:
    # GKE labels ct3-hightpu-4t nodes tpu-v3-device and ct3p-hightpu-4t ones tpu-v3-slice.
    labels = {"ct3-hightpu-4t": "tpu-v3-device", "ct3p-hightpu-4t": "tpu-v3-slice"}
    for chips in acc.TPU_CATALOG["v3"].slices:
        cfg = acc.make_tpu("v3", chips)
        assert cfg.gke_accelerator == labels[cfg.machine_type]
        assert cfg.chips <= 1024  # a v3 Pod
