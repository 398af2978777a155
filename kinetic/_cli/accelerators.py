"""``kinetic accelerators``: the accelerator catalog, and what one name resolves to.

    kinetic accelerators [--json]                   every shape Kinetic can request
    kinetic accelerators resolve NAME [--json]      one name (``l4x4``, ``v5e-2x4:spot``)
    kinetic accelerators --live [--json]            which the configured cluster has
                                                    node pools for

The catalog lists each GPU type at each count and each TPU type at each slice size,
under its canonical name (any accepted spelling, and a ``:spot`` suffix, resolve to
one of these). A name that does not parse exits with status 2 and the
:class:`~kinetic.AcceleratorError` message, which lists the valid forms. ``--live``
marks the shapes the configured GKE cluster has node pools for
(:mod:`kinetic._cli.accelerators_live`): exit 2 with no cluster configured, 1 when the
pools cannot be read.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from kinetic._cli._output import EXIT_OK, emit_json, report_error, table
from kinetic._core import accelerators as acc
from kinetic._exceptions import AcceleratorError, KineticError

COLUMNS = ("name", "category", "chips", "hosts", "topology", "machine_type", "gke_label", "spot")


def catalog() -> list[dict[str, Any]]:
    """One row per catalog shape: CPU first, then GPUs and TPUs, most capable first.

    ``chips`` is GPUs per node for GPUs and chips in the slice for TPUs; ``spot``
    says the shape can be asked for on spot capacity (``NAME:spot``). Pure.
    """
    rows: list[dict[str, Any]] = [describe(acc.CpuConfig())]
    for gpu_type, gpu in acc.GPU_CATALOG.items():
        rows.extend(describe(acc.make_gpu(gpu_type, n)) for n in sorted(gpu.machine_types))
    for tpu_type, tpu in acc.TPU_CATALOG.items():
        rows.extend(describe(acc.make_tpu(tpu_type, n)) for n in sorted(tpu.slices))
    for row in rows:
        row["spot"] = True  # every shape exists on spot capacity too
    return rows


def describe(cfg: acc.AcceleratorConfig) -> dict[str, Any]:
    """The catalog row of one resolved config (``spot``: whether it asks for spot). Pure."""
    row: dict[str, Any] = {"name": cfg.name, "category": cfg.kind}
    if isinstance(cfg, acc.GpuConfig):
        row |= {
            "chips": cfg.count,
            "hosts": 1,
            "topology": None,
            "machine_type": cfg.machine_type,
            "gke_label": cfg.gke_label,
        }
    elif isinstance(cfg, acc.TpuConfig):
        row |= {
            "chips": cfg.chips,
            "hosts": cfg.num_nodes,
            "topology": cfg.topology,
            "machine_type": cfg.machine_type,
            "gke_label": cfg.gke_accelerator,
        }
    else:
        row |= {
            "chips": None,
            "hosts": 1,
            "topology": None,
            "machine_type": None,
            "gke_label": None,
            "cpus": cfg.cpus,
            "memory_gi": cfg.memory_gi,
        }
    row["spot"] = cfg.spot
    return row


def resolution(name: str) -> dict[str, Any]:
    """What ``name`` resolves to, with the pod fields it leads to. Pure.

    :raises AcceleratorError: ``name`` does not parse (the message lists the valid forms).
    """
    cfg = acc.parse_accelerator(name)
    return {
        "input": name,
        **describe(cfg),
        "node_selector": acc.node_selector(cfg),
        "resource_limits": acc.resource_limits(cfg),
        "tolerations": acc.tolerations(cfg),
        "jax_platforms": acc.jax_platforms(cfg),
    }


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``accelerators`` command."""
    p = sub.add_parser(
        "accelerators",
        help="the accelerator catalog, or what one name resolves to",
        description="List every accelerator shape, or resolve one name.",
    )
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.add_argument(
        "--live",
        action="store_true",
        help="mark the shapes the configured cluster has node pools for",
    )
    actions = p.add_subparsers(dest="action")
    r = actions.add_parser("resolve", help="resolve one accelerator name")
    r.add_argument("name", help="an accelerator name, e.g. l4x4, tpu-v6e-8, v5e-2x4:spot")
    r.add_argument("--json", action="store_true", help="one JSON object on stdout")


def run(ns: argparse.Namespace) -> int:
    """Run ``accelerators``; return the exit status."""
    if ns.action == "resolve":
        try:
            info = resolution(ns.name)
        except AcceleratorError as exc:
            return report_error(exc)
        if ns.json:
            emit_json(info)
            return EXIT_OK
        rows = [(k, _text(v)) for k, v in info.items()]
        table(("field", "value"), rows, title=f"accelerator {ns.name!r}")
        return EXIT_OK
    rows_ = catalog()
    if ns.live:
        return _live(ns, rows_)
    if ns.json:
        emit_json(rows_)
        return EXIT_OK
    table(COLUMNS, [[row[c] for c in COLUMNS] for row in rows_], title="accelerators")
    return EXIT_OK


def _live(ns: argparse.Namespace, rows: list[dict[str, Any]]) -> int:
    from kinetic._cli import accelerators_live as live

    try:
        cluster, pools = live.read_pools(ns)
    except KineticError as exc:
        return report_error(exc)
    marked, other = live.mark_live(rows, pools)
    for p in other:
        print(
            f"kinetic: node pool {p.name} ({p.machine_type}, {p.accelerator or 'no accelerator'}) "
            "serves no shape of the catalog",
            file=sys.stderr,
        )
    if ns.json:
        emit_json(marked)
        return EXIT_OK
    columns = ("name", "category", "chips", "hosts", "topology", "machine_type", "live", "pools")
    table(
        columns,
        [[*(r[c] for c in columns[:-1]), live.pools_cell(r["pools"])] for r in marked],
        title=f"accelerators (node pools of cluster {cluster})",
        styles=["green" if r["live"] else None for r in marked],
    )
    return EXIT_OK


def _text(value: Any) -> Any:
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items()) or None
    if isinstance(value, list):
        return "; ".join(_text(v) or "" for v in value) or None
    return value
