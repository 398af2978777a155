"""Accelerator catalog: accelerator names -> resolved hardware configs -> GKE pod fields.

Pure logic, no IO. The single source of truth for which CPU/GPU/TPU shapes Kinetic can
request, how their names are spelled, which GKE node labels, machine types, resources
and tolerations they map to, and how the local backend runs them on the user's machine
(:func:`plan_local`).

Accepted names (case and surrounding whitespace ignored; any name may end in ``:spot``):

* CPU: ``cpu``, ``cpu:N`` (N CPUs), ``cpu:N:Mgi`` (N CPUs and M GiB of memory).
* GPU: ``gpu`` (one L4), ``gpu:N`` / ``gpu-N`` (the most capable GPU type offered with N
  GPUs), ``<type>`` / ``<type>xN`` with an optional ``gpu:`` or ``gpu-`` prefix. ``<type>``
  is a short name (``l4``, ``a100-80gb``) or the GKE label (``nvidia-l4``).
* TPU: ``tpu`` (v5litepod, 4 chips), ``tpu:N`` / ``tpu-N`` (the most capable TPU type
  offered with N chips), ``<type>``, ``<type>-N`` (N chips) or ``<type>-AxB[xC]``
  (topology), with an optional ``tpu:`` or ``tpu-`` prefix. ``v5e`` is an alias of
  ``v5litepod``.
* A bare number N means ``gpu:N`` if some GPU type offers N GPUs, else ``tpu:N``.

These are the names keras-kinetic 0.0.4 accepted, with the same meanings, so that node
pools created for the original keep matching, plus the names its documentation uses
that its parser refused:

* ``v3-8`` (``tpu-v3-8``, ``tpu:v3-8``), the original's example accelerator, is Cloud
  TPU's name of the single-host v3 slice (8 TensorCores, 2 per chip): ``v3-4`` here.
  Every other TPU count is chips, not TensorCores, as in the original (``v4-8`` is 8 chips).
* ``<type>-N`` for N GPUs (``gpu:l4-2``), like ``<type>xN``.

Names the original documents whose hardware GKE does not offer are refused with an
:class:`~kinetic.AcceleratorError` saying so and naming the nearest slice it does offer:
TPU v2 (``v2-8``; GKE's oldest TPU is v3) and the original's 2048-chip v3 slice
(``v3-2048``, 32x64: a v3 Pod is 1024 chips). GKE labels v3 nodes by machine type:
``tpu-v3-device`` for the single-host ``ct3-hightpu-4t``, ``tpu-v3-slice`` for the
multi-host ``ct3p-hightpu-4t`` (the original selected ``tpu-v3-podslice``, which no GKE
node carries).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from kinetic._exceptions import AcceleratorError

__all__ = [
    "GPU_CATALOG",
    "LABEL_GPU_ACCELERATOR",
    "LABEL_SPOT",
    "LABEL_TPU_ACCELERATOR",
    "LABEL_TPU_TOPOLOGY",
    "LOCAL_ACCELERATOR_CHOICES",
    "RESOURCE_GPU",
    "RESOURCE_TPU",
    "TPU_CATALOG",
    "AcceleratorConfig",
    "CpuConfig",
    "GpuConfig",
    "GpuSpec",
    "LocalGpu",
    "LocalPlan",
    "TpuConfig",
    "TpuSpec",
    "TpuTopology",
    "describe_machine",
    "gpu_model_matches",
    "jax_platforms",
    "make_gpu",
    "make_tpu",
    "names_gpu_model",
    "node_selector",
    "parse_accelerator",
    "plan_local",
    "resource_limits",
    "resource_requests",
    "tolerations",
    "valid_forms",
]

# GKE node labels, extended resources and taints.
LABEL_GPU_ACCELERATOR = "cloud.google.com/gke-accelerator"
LABEL_TPU_ACCELERATOR = "cloud.google.com/gke-tpu-accelerator"
LABEL_TPU_TOPOLOGY = "cloud.google.com/gke-tpu-topology"
LABEL_SPOT = "cloud.google.com/gke-spot"
RESOURCE_GPU = "nvidia.com/gpu"
RESOURCE_TPU = "google.com/tpu"


# --------------------------------------------------------------------------- configs


@dataclass(frozen=True)
class CpuConfig:
    """A CPU-only job. ``cpus``/``memory_gi`` of ``None`` leave the amount to the backend.

    :raises AcceleratorError: on construction, if ``cpus`` or ``memory_gi`` is not
        positive, or ``memory_gi`` is given without ``cpus`` (it would have no name).
    """

    cpus: int | None = None
    memory_gi: int | None = None
    spot: bool = False

    def __post_init__(self) -> None:
        if self.cpus is not None and self.cpus <= 0:
            raise AcceleratorError(f"CPU count must be positive, got {self.cpus}")
        if self.memory_gi is not None and (self.cpus is None or self.memory_gi <= 0):
            raise AcceleratorError(
                f"memory_gi={self.memory_gi} needs a positive value and a CPU count"
            )

    @property
    def kind(self) -> Literal["cpu"]:
        return "cpu"

    @property
    def name(self) -> str:
        """Canonical name (``cpu``, ``cpu:4``, ``cpu:4:16gi``); parses back to this config."""
        if self.cpus is None:
            return "cpu"
        if self.memory_gi is None:
            return f"cpu:{self.cpus}"
        return f"cpu:{self.cpus}:{self.memory_gi}gi"


@dataclass(frozen=True)
class GpuConfig:
    """``count`` GPUs of ``gpu_type`` on one node of ``machine_type``."""

    gpu_type: str  # short name, e.g. "l4"
    count: int
    gke_label: str  # value of cloud.google.com/gke-accelerator, e.g. "nvidia-l4"
    machine_type: str  # GKE node pool machine type, e.g. "g2-standard-4"
    spot: bool = False

    @property
    def kind(self) -> Literal["gpu"]:
        return "gpu"

    @property
    def name(self) -> str:
        """Canonical name (``gpu-l4``, ``gpu-a100x4``); parses back to this config."""
        if self.count == 1:
            return f"gpu-{self.gpu_type}"
        return f"gpu-{self.gpu_type}x{self.count}"


@dataclass(frozen=True)
class TpuConfig:
    """A TPU slice of ``chips`` chips in ``topology``, spread over ``num_nodes`` nodes."""

    tpu_type: str  # e.g. "v5litepod"
    chips: int
    topology: str  # e.g. "2x2"; value of cloud.google.com/gke-tpu-topology
    gke_accelerator: str  # value of cloud.google.com/gke-tpu-accelerator
    machine_type: str  # e.g. "ct5lp-hightpu-4t"
    num_nodes: int  # nodes (VMs) in the slice; > 1 means multi-host
    spot: bool = False

    @property
    def kind(self) -> Literal["tpu"]:
        return "tpu"

    @property
    def name(self) -> str:
        """Canonical name (``tpu-v5litepod-4``); parses back to this config."""
        return f"tpu-{self.tpu_type}-{self.chips}"

    @property
    def chips_per_node(self) -> int:
        """Chips on each node: what each pod of the slice requests as ``google.com/tpu``."""
        return self.chips // self.num_nodes


AcceleratorConfig = CpuConfig | GpuConfig | TpuConfig


# --------------------------------------------------------------------------- catalog


@dataclass(frozen=True)
class GpuSpec:
    """Catalog entry of a GPU type: its GKE label and the machine type for each count."""

    gke_label: str
    machine_types: Mapping[int, str]  # GPU count -> machine type


@dataclass(frozen=True)
class TpuTopology:
    """One slice shape of a TPU type; ``gke_accelerator`` overrides the type's label."""

    topology: str
    machine_type: str
    num_nodes: int
    gke_accelerator: str | None = None


@dataclass(frozen=True)
class TpuSpec:
    """Catalog entry of a TPU type: its GKE label, default size and slice shapes."""

    gke_accelerator: str
    default_chips: int
    slices: Mapping[int, TpuTopology]  # chips -> shape


def _gpu(gke_label: str, machine_types: dict[int, str]) -> GpuSpec:
    return GpuSpec(gke_label, MappingProxyType(machine_types))


def _n1(*sizes: int) -> dict[int, str]:
    # Older GPUs attach to N1 machines; the size grows with the GPU count.
    return dict(zip((1, 2, 4, 8), (f"n1-standard-{n}" for n in sizes), strict=False))


# Listed most capable first: a bare count ("gpu:4") picks the first type offering it.
GPU_CATALOG: Mapping[str, GpuSpec] = MappingProxyType(
    {
        "h100": _gpu("nvidia-h100-80gb", {n: f"a3-highgpu-{n}g" for n in (1, 2, 4, 8)}),
        "a100-80gb": _gpu("nvidia-a100-80gb", {n: f"a2-ultragpu-{n}g" for n in (1, 2, 4, 8, 16)}),
        "a100": _gpu(
            "nvidia-tesla-a100",
            {n: f"a2-highgpu-{n}g" for n in (1, 2, 4, 8)} | {16: "a2-megagpu-16g"},
        ),
        "l4": _gpu(
            "nvidia-l4", {n: f"g2-standard-{m}" for n, m in ((1, 4), (2, 24), (4, 48), (8, 96))}
        ),
        "v100": _gpu("nvidia-tesla-v100", _n1(8, 16, 32, 64)),
        "t4": _gpu("nvidia-tesla-t4", _n1(4, 8, 16)),
        "p100": _gpu("nvidia-tesla-p100", _n1(4, 8, 16)),
        "p4": _gpu("nvidia-tesla-p4", _n1(4, 8, 16)),
    }
)


def _tpu(
    gke_accelerator: str,
    default_chips: int,
    machine_type: str,
    topologies: str,
    *,
    whole_slice_machines: Mapping[str, str] | None = None,
    machine_labels: Mapping[str, str] | None = None,
) -> TpuSpec:
    """Catalog entry from space-separated topologies; chips and node counts are derived.

    A slice has as many chips as the product of its topology's dimensions, and spans
    chips / chips-per-VM nodes, where the machine type's "-<N>t" suffix is chips per VM.
    ``whole_slice_machines`` names, per topology, a bigger machine holding the whole slice;
    ``machine_labels``, per machine type, the GKE label its nodes carry when it is not
    ``gke_accelerator``.
    """
    slices: dict[int, TpuTopology] = {}
    for topology in topologies.split():
        chips = math.prod(int(d) for d in topology.split("x"))
        machine = (whole_slice_machines or {}).get(topology, machine_type)
        per_vm = int(machine.rsplit("-", 1)[1].removesuffix("t"))
        label = (machine_labels or {}).get(machine)
        slices[chips] = TpuTopology(topology, machine, max(1, chips // per_vm), label)
    return TpuSpec(gke_accelerator, default_chips, MappingProxyType(slices))


# Listed most capable first, like GPU_CATALOG. Shapes follow GKE's TPU planning tables and
# match the node pools keras-kinetic creates.
TPU_CATALOG: Mapping[str, TpuSpec] = MappingProxyType(
    {
        "v6e": _tpu("tpu-v6e-slice", 8, "ct6e-standard-4t", "2x4 4x4"),
        "v5p": _tpu("tpu-v5p-slice", 8, "ct5p-hightpu-4t", "2x2x2 2x2x4 2x4x4"),
        "v5litepod": _tpu(
            "tpu-v5-lite-podslice",
            4,
            "ct5lp-hightpu-4t",
            "1x1 2x2 2x4 4x4 4x8 8x8 8x16 16x16",
            whole_slice_machines={"1x1": "ct5lp-hightpu-1t", "2x4": "ct5lp-hightpu-8t"},
        ),
        "v4": _tpu(
            "tpu-v4-podslice",
            4,
            "ct4p-hightpu-4t",
            "2x2x1 2x2x2 2x2x4 2x4x4 4x4x4 4x4x8 4x8x8 8x8x8 8x8x16 8x16x16 16x16x16",
        ),
        "v3": _tpu(
            "tpu-v3-slice",
            4,
            "ct3p-hightpu-4t",
            # A v3 Pod is 1024 chips (32x32): no bigger slice exists (see _NOT_ON_GKE).
            "2x2 4x4 4x8 8x8 8x16 16x16 16x32 32x32",
            # The single-host v3 slice is a non-pod (ct3) machine, which GKE labels as a
            # device rather than a slice.
            whole_slice_machines={"2x2": "ct3-hightpu-4t"},
            machine_labels={"ct3-hightpu-4t": "tpu-v3-device"},
        ),
    }
)

# Cloud TPU names that count TensorCores where Kinetic counts chips, kept because the
# original's documentation uses them: (type, count in the name) -> chips.
_CLOUD_TPU_NAMES: Mapping[tuple[str, int], int] = MappingProxyType({("v3", 8): 4})

# Accelerators the original's documentation names that GKE does not offer: type (any
# size) or (type, chips), with why and what to ask for instead. The topology a refused
# slice would have had is refused the same way.
_V2_NOT_ON_GKE = (
    "GKE does not offer TPU v2 (its oldest TPU is v3). The nearest slices it offers: "
    "'tpu-v3-4' (Cloud TPU's v3-8: the same single-host 2x2 shape, one generation newer), "
    "'tpu-v5litepod-4' or 'tpu-v5litepod-8' (single host), 'tpu-v6e-8'"
)
_V3_2048_NOT_ON_GKE = (
    "GKE offers no 2048-chip (32x64) TPU v3 slice: a v3 Pod is 1024 chips. The nearest: "
    "'tpu-v3-1024' (32x32, the whole Pod, which Cloud TPU calls v3-2048), "
    "or 'tpu-v4-2048' / 'tpu-v5litepod-256' for a newer type"
)
_NOT_ON_GKE: Mapping[str | tuple[str, int], str] = MappingProxyType(
    {"v2": _V2_NOT_ON_GKE, ("v3", 2048): _V3_2048_NOT_ON_GKE}
)
_NOT_ON_GKE_TOPOLOGIES: Mapping[tuple[str, str], str] = MappingProxyType(
    {("v3", "32x64"): _V3_2048_NOT_ON_GKE}
)

_DEFAULT_GPU = "l4"
_DEFAULT_TPU = "v5litepod"
_TPU_ALIASES: Mapping[str, str] = MappingProxyType({"v5e": "v5litepod"})
# GKE labels are accepted as GPU type names ("nvidia-tesla-t4").
_GPU_ALIASES: Mapping[str, str] = MappingProxyType(
    {spec.gke_label: name for name, spec in GPU_CATALOG.items()}
)

_COUNT = re.compile(r"[0-9]+")
_CPU = re.compile(r"cpu(?::([0-9]+)(?::([0-9]+)gi)?)?")
# No GPU type or label contains "x", so the last "x<digits>" is the count.
_GPU_MULTI = re.compile(r"([^x]+)x([0-9]+)")
# No GPU type or label ends in "-<digits>", so a trailing one is the count ("l4-2").
_GPU_DASH = re.compile(r"(.+)-([0-9]+)")
_TPU_TOPOLOGY = re.compile(r"([a-z0-9_]+)-([0-9]+x[0-9]+(?:x[0-9]+)?)")
_TPU_CHIPS = re.compile(r"([a-z0-9_]+)-([0-9]+)")


# --------------------------------------------------------------------------- factories


def make_gpu(gpu_type: str, count: int, *, spot: bool = False) -> GpuConfig:
    """Resolve ``count`` GPUs of catalog type ``gpu_type`` (short name or GKE label).

    :raises AcceleratorError: unknown type, or a count the type is not offered with.
    """
    gpu_type = _GPU_ALIASES.get(gpu_type, gpu_type)
    spec = GPU_CATALOG.get(gpu_type)
    if spec is None:
        raise _error(f"unknown GPU type {gpu_type!r}")
    machine_type = spec.machine_types.get(count)
    if machine_type is None:
        raise _error(
            f"GPU count {count} not supported for {gpu_type!r}; "
            f"supported: {_join(spec.machine_types)}"
        )
    return GpuConfig(gpu_type, count, spec.gke_label, machine_type, spot)


def make_tpu(tpu_type: str, chips: int, *, spot: bool = False) -> TpuConfig:
    """Resolve a ``chips``-chip slice of catalog type ``tpu_type`` (``v5e`` allowed).

    :raises AcceleratorError: unknown type, or a chip count the type has no slice for.
    """
    tpu_type = _TPU_ALIASES.get(tpu_type, tpu_type)
    spec = TPU_CATALOG.get(tpu_type)
    if spec is None:
        if tpu_type in _NOT_ON_GKE:
            raise _error(_NOT_ON_GKE[tpu_type])
        raise _error(f"unknown TPU type {tpu_type!r}")
    shape = spec.slices.get(chips)
    if shape is None:
        if (tpu_type, chips) in _NOT_ON_GKE:
            raise _error(_NOT_ON_GKE[tpu_type, chips])
        hint = (
            " (counts are chips, not Cloud TPU's TensorCores, 2 per v3 chip)"
            if tpu_type == "v3"
            else ""
        )
        raise _error(
            f"chip count {chips} not supported for {tpu_type!r}; "
            f"supported: {_join(spec.slices)}{hint}"
        )
    return TpuConfig(
        tpu_type,
        chips,
        shape.topology,
        shape.gke_accelerator or spec.gke_accelerator,
        shape.machine_type,
        shape.num_nodes,
        spot,
    )


# --------------------------------------------------------------------------- parsing


def parse_accelerator(name: str, *, spot: bool = False) -> AcceleratorConfig:
    """Resolve an accelerator name (see the module docstring) into a config.

    A ``:spot`` suffix, or ``spot=True``, requests spot capacity.

    :raises AcceleratorError: ``name`` is not a string, or cannot be parsed, or names a
        type/count/topology missing from the catalog. The message lists the valid forms.
    """
    if not isinstance(name, str):
        raise _error(f"accelerator must be a string, got {type(name).__name__}")
    s = name.strip().lower()
    if s.endswith(":spot"):
        spot = True
        s = s[: -len(":spot")]
    try:
        return _parse(s, spot)
    except AcceleratorError as exc:
        # Name what the user typed; the inner message only knows the normalized part.
        raise AcceleratorError(f"Invalid accelerator {name!r}: {exc}") from None


def _parse(s: str, spot: bool) -> AcceleratorConfig:
    m = _CPU.fullmatch(s)
    if m:
        cpus = int(m.group(1)) if m.group(1) else None
        memory_gi = int(m.group(2)) if m.group(2) else None
        if cpus == 0 or memory_gi == 0:
            raise _error("CPU count and memory must be positive")
        return CpuConfig(cpus, memory_gi, spot)

    # "gpu-l4" and "gpu:l4" mean the same; remember whether a family was named, because
    # then a failure is final instead of falling through to the other family.
    family: Literal["gpu", "tpu"] | None = None
    body = s
    for prefix in ("gpu", "tpu"):
        if s == prefix:
            if prefix == "gpu":
                return make_gpu(_DEFAULT_GPU, 1, spot=spot)
            return make_tpu(_DEFAULT_TPU, TPU_CATALOG[_DEFAULT_TPU].default_chips, spot=spot)
        if s.startswith((f"{prefix}:", f"{prefix}-")):
            family, body = prefix, s[len(prefix) + 1 :]
            break

    if family != "tpu":
        gpu = _parse_gpu(body, explicit=family == "gpu", spot=spot)
        if gpu is not None:
            return gpu
        if family == "gpu":
            raise _error(f"unknown GPU {body!r}")
    tpu = _parse_tpu(body, explicit=family == "tpu", spot=spot)
    if tpu is not None:
        return tpu
    if family == "tpu":
        raise _error(f"unknown TPU {body!r}")
    raise _error("unknown accelerator")


def _parse_gpu(body: str, *, explicit: bool, spot: bool) -> GpuConfig | None:
    """GPU config for ``body``, or None if it is not a GPU name (so TPUs may be tried)."""
    if _COUNT.fullmatch(body):
        count = int(body)
        for gpu_type, spec in GPU_CATALOG.items():
            if count in spec.machine_types:
                return make_gpu(gpu_type, count, spot=spot)
        if explicit:
            counts = {c for spec in GPU_CATALOG.values() for c in spec.machine_types}
            raise _error(f"no GPU type supports count {count}; supported: {_join(counts)}")
        return None
    gpu_type = _GPU_ALIASES.get(body, body)
    if gpu_type in GPU_CATALOG:
        return make_gpu(gpu_type, 1, spot=spot)
    m = _GPU_MULTI.fullmatch(body)
    if m:
        gpu_type = _GPU_ALIASES.get(m.group(1), m.group(1))
        if gpu_type in GPU_CATALOG:
            return make_gpu(gpu_type, int(m.group(2)), spot=spot)
    m = _GPU_DASH.fullmatch(body)
    if m:
        gpu_type = _GPU_ALIASES.get(m.group(1), m.group(1))
        if gpu_type in GPU_CATALOG:
            return make_gpu(gpu_type, int(m.group(2)), spot=spot)
    return None


def _parse_tpu(body: str, *, explicit: bool, spot: bool) -> TpuConfig | None:
    """TPU config for ``body``, or None if it is not a TPU name."""
    if _COUNT.fullmatch(body):
        chips = int(body)
        for tpu_type, spec in TPU_CATALOG.items():
            if chips in spec.slices:
                return make_tpu(tpu_type, chips, spot=spot)
        if explicit:
            counts = {c for spec in TPU_CATALOG.values() for c in spec.slices}
            raise _error(f"no TPU type supports {chips} chips; supported: {_join(counts)}")
        return None
    tpu_type = _TPU_ALIASES.get(body, body)
    if tpu_type in TPU_CATALOG or tpu_type in _NOT_ON_GKE:
        named = TPU_CATALOG.get(tpu_type)
        return make_tpu(tpu_type, named.default_chips if named else 0, spot=spot)
    m = _TPU_TOPOLOGY.fullmatch(body)
    if m:
        tpu_type = _TPU_ALIASES.get(m.group(1), m.group(1))
        if tpu_type in _NOT_ON_GKE:
            raise _error(_NOT_ON_GKE[tpu_type])
        tpu_spec = TPU_CATALOG.get(tpu_type)
        if tpu_spec is not None:
            for chips, shape in tpu_spec.slices.items():
                if shape.topology == m.group(2):
                    return make_tpu(tpu_type, chips, spot=spot)
            if (tpu_type, m.group(2)) in _NOT_ON_GKE_TOPOLOGIES:
                raise _error(_NOT_ON_GKE_TOPOLOGIES[tpu_type, m.group(2)])
            topologies = ", ".join(shape.topology for shape in tpu_spec.slices.values())
            raise _error(
                f"topology {m.group(2)!r} not supported for {tpu_type!r}; supported: {topologies}"
            )
    m = _TPU_CHIPS.fullmatch(body)
    if m:
        tpu_type = _TPU_ALIASES.get(m.group(1), m.group(1))
        if tpu_type in TPU_CATALOG or tpu_type in _NOT_ON_GKE:
            count = int(m.group(2))
            chips = _CLOUD_TPU_NAMES.get((tpu_type, count), count)
            return make_tpu(tpu_type, chips, spot=spot)
    return None


def valid_forms() -> list[str]:
    """Human-readable accepted forms, with every catalog type and its sizes."""
    gpus = "; ".join(
        f"{name} x{_join(spec.machine_types, sep='/')}" for name, spec in GPU_CATALOG.items()
    )
    tpus = "; ".join(
        f"{name} {_join(spec.slices, sep='/')} chips" for name, spec in TPU_CATALOG.items()
    )
    return [
        "cpu | cpu:<cpus> | cpu:<cpus>:<memory>gi   e.g. cpu, cpu:4, cpu:4:16gi",
        f"gpu | gpu:<count>   one {_DEFAULT_GPU}, or the most capable GPU offered with <count>",
        "[gpu-|gpu:]<type>[x<count>|-<count>]   e.g. gpu-l4, l4, l4x4, l4-2, h100x8, nvidia-l4",
        f"  GPU types and counts: {gpus}",
        f"tpu | tpu:<chips>   {_DEFAULT_TPU} with 4 chips, or the most capable TPU with <chips>",
        "[tpu-|tpu:]<type>[-<chips>|-<topology>]   e.g. tpu-v5litepod-4, v6e-8, v5e-2x4, v3-4",
        f"  TPU types and chips ('v5e' = v5litepod): {tpus}",
        "  counts are chips; Cloud TPU's 'v3-8' (TensorCores) is v3-4. Not on GKE: TPU v2",
        "append ':spot' to any form for spot capacity   e.g. l4:spot, tpu-v6e-8:spot",
    ]


def _error(reason: str) -> AcceleratorError:
    forms = "\n  ".join(valid_forms())
    return AcceleratorError(f"{reason}. Valid forms:\n  {forms}")


def _join(counts: Mapping[int, object] | set[int], sep: str = ", ") -> str:
    return sep.join(str(c) for c in sorted(counts))


# --------------------------------------------------------------------------- pod fields


def node_selector(cfg: AcceleratorConfig) -> dict[str, str]:
    """GKE node selector that lands the pod on nodes carrying ``cfg``'s hardware."""
    selector: dict[str, str] = {}
    if cfg.kind == "gpu":
        selector[LABEL_GPU_ACCELERATOR] = cfg.gke_label
    elif cfg.kind == "tpu":
        selector[LABEL_TPU_ACCELERATOR] = cfg.gke_accelerator
        selector[LABEL_TPU_TOPOLOGY] = cfg.topology
    if cfg.spot:
        selector[LABEL_SPOT] = "true"
    return selector


def resource_limits(cfg: AcceleratorConfig) -> dict[str, str]:
    """Container resource limits for one pod (for TPUs, one node of the slice)."""
    if cfg.kind == "gpu":
        return {RESOURCE_GPU: str(cfg.count)}
    if cfg.kind == "tpu":
        # Each pod of a multi-host slice runs on its own node and claims that node's chips.
        return {RESOURCE_TPU: str(cfg.chips_per_node)}
    limits: dict[str, str] = {}
    if cfg.cpus is not None:
        limits["cpu"] = str(cfg.cpus)
    if cfg.memory_gi is not None:
        limits["memory"] = f"{cfg.memory_gi}Gi"
    return limits


def resource_requests(cfg: AcceleratorConfig) -> dict[str, str]:
    """Container resource requests: equal to the limits.

    Kubernetes requires requests == limits for extended resources (GPUs, TPUs); for CPU
    jobs it gives the pod Guaranteed QoS, so an explicit ``cpu:N`` really gets N CPUs.
    """
    return resource_limits(cfg)


def tolerations(cfg: AcceleratorConfig) -> list[dict[str, str]]:
    """Tolerations for the taints GKE puts on accelerator and spot nodes."""
    result: list[dict[str, str]] = []
    if cfg.kind == "gpu":
        result.append({"key": RESOURCE_GPU, "operator": "Exists", "effect": "NoSchedule"})
    elif cfg.kind == "tpu":
        result.append({"key": RESOURCE_TPU, "operator": "Exists", "effect": "NoSchedule"})
    if cfg.spot:
        result.append(
            {"key": LABEL_SPOT, "operator": "Equal", "value": "true", "effect": "NoSchedule"}
        )
    return result


def jax_platforms(cfg: AcceleratorConfig) -> str:
    """Value for the ``JAX_PLATFORMS`` environment variable of the job."""
    return {"cpu": "cpu", "gpu": "cuda", "tpu": "tpu"}[cfg.kind]


# --------------------------------------------------------------------------- local backend


LOCAL_ACCELERATOR_CHOICES = ("cpu",)
"""Values of ``KINETIC_LOCAL_ACCELERATOR``: ``cpu`` runs TPU jobs locally on CPUs."""

_GENERIC_GPU = re.compile(r"gpu(?:[:-][0-9]+)?|[0-9]+")
_TOKENS = re.compile(r"[a-z0-9]+")


@dataclass(frozen=True)
class LocalGpu:
    """One GPU of this machine: its NVML index, and its model (None: declared, unknown)."""

    id: str
    model: str | None = None

    def __str__(self) -> str:
        return f"{self.id} ({self.model or 'model unknown'})"


@dataclass(frozen=True)
class LocalPlan:
    """How the local backend runs a job of some accelerator on this machine.

    :ivar gpus: how many of the machine's GPUs the job holds (0: it holds and sees none).
    :ivar jax_platforms: the job's ``JAX_PLATFORMS``: what its pod would have
        (:func:`jax_platforms` of what actually runs it).
    :ivar warning: what the user should be told once (a GPU model the machine lacks,
        a TPU emulated on CPUs), or None.
    """

    gpus: int
    jax_platforms: str
    warning: str | None = None


def gpu_model_matches(gpu_type: str, model: str) -> bool:
    """Whether the NVML model name ``model`` ("NVIDIA H100 80GB HBM3") is catalog type
    ``gpu_type`` ("h100"): every word of the type is a word of the name, and the
    40 GB A100 is not the 80 GB one."""
    words = set(_TOKENS.findall(model.lower()))
    wanted = set(_TOKENS.findall(gpu_type.lower()))
    if gpu_type == "a100" and "80gb" in words:
        return False
    return wanted <= words


def names_gpu_model(requested: str | None) -> bool:
    """Whether an accelerator name asks for a GPU model (``l4``, ``h100x2``) rather than
    any GPU (``gpu``, ``gpu:2``, ``2``), which :func:`parse_accelerator` resolves to a
    catalog model too."""
    if requested is None:
        return False
    name = requested.strip().lower().removesuffix(":spot")
    return _GENERIC_GPU.fullmatch(name) is None


def describe_machine(machine: tuple[LocalGpu, ...] | list[LocalGpu]) -> str:
    """The machine's GPUs for messages: ``0 (NVIDIA L4), 1 (NVIDIA L4)`` or ``none``."""
    return ", ".join(str(gpu) for gpu in machine) or "none"


def plan_local(
    cfg: AcceleratorConfig,
    machine: tuple[LocalGpu, ...] | list[LocalGpu],
    *,
    requested: str | None = None,
    tpu_on_cpu: bool = False,
) -> LocalPlan:
    """How the local backend runs ``cfg`` on a machine with the GPUs ``machine``. Pure.

    CPU jobs hold no GPU. A GPU job holds ``cfg.count`` GPUs of whatever model the
    machine has (a warning names both models when the name asked for one the machine
    lacks). A TPU job runs on CPUs only when ``tpu_on_cpu`` (the user opted in).

    :param requested: the accelerator name as written: a generic ``gpu`` names no model.
    :raises AcceleratorError: for a TPU without the opt-in, or more GPUs than the
        machine has (the message lists the machine's GPUs).
    """
    if cfg.kind == "cpu":
        return LocalPlan(0, jax_platforms(cfg))
    if cfg.kind == "tpu":
        if not tpu_on_cpu:
            raise AcceleratorError(
                f"the local backend has no TPU for accelerator {cfg.name!r}. To run TPU code "
                "on this machine's CPUs (JAX_PLATFORMS=cpu), set KINETIC_LOCAL_ACCELERATOR=cpu "
                "or 'local_accelerator': 'cpu' in your profile; or use a GKE backend "
                "(set KINETIC_PROJECT)"
            )
        return LocalPlan(
            0,
            jax_platforms(CpuConfig()),
            warning=f"accelerator {cfg.name!r} is emulated on this machine's CPUs "
            "(JAX_PLATFORMS=cpu, KINETIC_LOCAL_ACCELERATOR=cpu)",
        )
    if cfg.count > len(machine):
        raise AcceleratorError(
            f"accelerator {cfg.name!r} needs {cfg.count} GPU(s); this machine has "
            f"{len(machine)}: {describe_machine(machine)}. GPUs are found through NVML "
            "(pip install 'kinetic-aio[gpu]') or declared with KINETIC_LOCAL_GPUS=0,1,...; "
            "ask for fewer, or use a GKE backend (set KINETIC_PROJECT)"
        )
    warning = None
    models = sorted({gpu.model for gpu in machine if gpu.model})
    if (
        names_gpu_model(requested)
        and models
        and not any(gpu_model_matches(cfg.gpu_type, m) for m in models)
    ):
        warning = (
            f"accelerator {cfg.name!r} asks for {cfg.gpu_type} GPUs, which this machine "
            f"lacks: the job runs on its {' / '.join(models)}"
        )
    return LocalPlan(cfg.count, jax_platforms(cfg), warning)
