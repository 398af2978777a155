"""``kinetic accelerators --live``: which catalog shapes the configured cluster has node
pools for.

The pools are read as ``kinetic pool list`` reads them (the Container API, through the
same session as ``up``); :func:`mark_live` matches them to the catalog's rows, without
IO. A GPU pool serves the shape of its GPU type and count (whatever its machine type);
a TPU pool the shape of its machine type and, for a multi-host slice, its topology
(a pool without one: the single-host shape); any other pool serves ``cpu``. A pool
that serves no shape of the catalog is reported apart.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

from kinetic._exceptions import ConfigError
from kinetic._infra.gke_api import PoolInfo


def serves(row: Mapping[str, Any], pool: PoolInfo) -> bool:
    """Whether ``pool``'s nodes are of the catalog shape ``row``. Pure."""
    gpu_type, _, count = (pool.accelerator or "").rpartition(" x")
    if row["category"] == "gpu":
        return bool(gpu_type) and gpu_type == row["gke_label"] and count == str(row["chips"])
    if row["category"] == "tpu":
        if pool.machine_type != row["machine_type"]:
            return False
        return bool(pool.topology == row["topology"] if pool.topology else row["hosts"] == 1)
    return not gpu_type and not pool.machine_type.startswith("ct")


def mark_live(
    rows: Sequence[Mapping[str, Any]], pools: Sequence[PoolInfo]
) -> tuple[list[dict[str, Any]], list[PoolInfo]]:
    """The catalog's rows, each with ``live`` (a pool serves it) and ``pools`` (those
    pools: name, spot, node bounds, status), and the pools that serve no row. Pure."""
    marked: list[dict[str, Any]] = []
    used: set[str] = set()
    for row in rows:
        mine = [p for p in pools if serves(row, p)]
        used.update(p.name for p in mine)
        marked.append(
            {
                **row,
                "live": bool(mine),
                "pools": [
                    {
                        "name": p.name,
                        "spot": p.spot,
                        "min_nodes": p.min_nodes,
                        "max_nodes": p.max_nodes,
                        "status": p.status,
                    }
                    for p in mine
                ],
            }
        )
    return marked, [p for p in pools if p.name not in used]


def pools_cell(pools: Sequence[Mapping[str, Any]]) -> str | None:
    """The ``pools`` column: each pool's name, ``(spot)`` for spot ones. Pure."""
    return ", ".join(p["name"] + (" (spot)" if p["spot"] else "") for p in pools) or None


def read_pools(ns: argparse.Namespace) -> tuple[str, list[PoolInfo]]:
    """The configured cluster's name and node pools.

    :raises ConfigError: no GKE cluster is configured (no project), or it does not exist.
    :raises BackendError: no credentials, or the Container API refused or failed.
    """
    import anyio

    from kinetic._cli import infra

    target = infra._target(ns)
    s = target.settings
    if not s.project:
        raise ConfigError(
            "accelerators --live reads the node pools of the configured GKE cluster, and "
            "none is configured: set a project and cluster (--project P --cluster C, "
            "KINETIC_PROJECT, or a profile: kinetic init)"
        )

    async def listing() -> list[PoolInfo]:
        async with infra._session(target) as session:
            pools: list[PoolInfo] = await (await session.container()).list_pools(s.cluster)
            return pools

    return s.cluster, anyio.run(listing)
