"""``kinetic accelerators --live``: the catalog marked with the configured cluster's
node pools, read from the Container API (its fake on loopback, tests/unit/cli_gke.py)."""

from __future__ import annotations

import json

import pytest

from kinetic._cli import main
from kinetic._cli.accelerators import catalog
from kinetic._cli.accelerators_live import mark_live, pools_cell, serves
from kinetic._infra import gke_api
from tests.unit.cli_gke import FakeProjectGKE, gke  # noqa: F401 - the fixture

WHERE = ["--project", "p", "--zone", "z", "--cluster", "c"]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def pool(accelerator: str, **options: object) -> gke_api.PoolInfo:
    """The pool ``kinetic pool add`` makes for ``accelerator``, as the API lists it."""
    return gke_api.parse_pool(gke_api.node_pool(accelerator, **options))  # type: ignore[arg-type]


def test_each_shapes_pool_serves_that_shape_and_no_other_accelerator() -> None:
    rows = catalog()
    for row in rows:
        if row["category"] == "cpu":
            continue
        live = [r["name"] for r in rows if serves(r, pool(row["name"]))]
        assert live == [row["name"]], row["name"]


def test_a_cpu_pool_serves_cpu_only() -> None:
    rows = catalog()
    cpu = gke_api.parse_pool({"name": "default-pool", "config": {"machineType": "e2-standard-4"}})
    assert [r["name"] for r in rows if serves(r, cpu)] == ["cpu"]
    assert [r["name"] for r in rows if serves(r, pool("cpu"))] == ["cpu"]


def test_mark_live_lists_the_pools_and_the_strays() -> None:
    stray = gke_api.parse_pool(
        {
            "name": "odd",
            "config": {
                "machineType": "a2-highgpu-1g",
                "accelerators": [{"acceleratorType": "nvidia-made-up", "acceleratorCount": "1"}],
            },
        }
    )
    spot = pool("l4x4", spot=True, name="l4-spot")
    marked, other = mark_live(catalog(), [pool("l4x4"), spot, stray])
    l4 = next(r for r in marked if r["name"] == "gpu-l4x4")
    assert l4["live"] is True
    assert [(p["name"], p["spot"]) for p in l4["pools"]] == [
        ("kn-gpu-l4x4", False),
        ("l4-spot", True),
    ]
    assert pools_cell(l4["pools"]) == "kn-gpu-l4x4, l4-spot (spot)"
    assert [p.name for p in other] == ["odd"]
    assert sum(r["live"] for r in marked) == 1
    assert pools_cell([]) is None


def test_live_json_marks_the_clusters_pools(
    gke: FakeProjectGKE,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    gke.add_cluster("c", pools=("l4x4", "v5e-2x4", "tpu-v5litepod-16"))
    code, out, err = run(capsys, *WHERE, "accelerators", "--live", "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert [r["name"] for r in rows] == [r["name"] for r in catalog()]
    live = {r["name"]: [p["name"] for p in r["pools"]] for r in rows if r["live"]}
    assert live == {
        "cpu": ["default-pool"],
        "gpu-l4x4": ["kn-gpu-l4x4"],
        "tpu-v5litepod-8": ["kn-tpu-v5litepod-8"],
        "tpu-v5litepod-16": ["kn-tpu-v5litepod-16"],
    }
    assert gke.requests[-1].url.path == "/v1/projects/p/locations/z/clusters/c/nodePools"
    assert gke.requests[-1].headers["authorization"] == "Bearer t0ken"


def test_live_table(gke: FakeProjectGKE, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    gke.add_cluster("c", pools=("h100",))
    code, out, err = run(capsys, *WHERE, "accelerators", "--live")
    assert code == 0, err
    header, *lines = out.splitlines()
    assert header.split() == [
        "NAME", "CATEGORY", "CHIPS", "HOSTS", "TOPOLOGY", "MACHINE_TYPE", "LIVE", "POOLS",
    ]  # fmt: skip
    h100 = next(line for line in lines if line.startswith("gpu-h100 "))
    assert h100.split()[-2:] == ["yes", "kn-gpu-h100"]
    l4 = next(line for line in lines if line.startswith("gpu-l4 "))
    assert l4.split()[-2:] == ["no", "-"]


def test_live_without_a_cluster_configured_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run(capsys, "accelerators", "--live")
    assert code == 2
    assert out == ""
    assert err.startswith("kinetic: accelerators --live reads the node pools")
    assert "--project P --cluster C" in err


def test_live_with_no_such_cluster(
    gke: FakeProjectGKE,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run(capsys, *WHERE, "accelerators", "--live", "--json")
    assert code == 2
    assert out == ""
    assert err.startswith("kinetic: ")
    assert "c" in err


def test_live_when_the_api_fails(gke: FakeProjectGKE, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    from tests.unit.test_infra_gke_rest import error

    gke.add_cluster("c")
    gke.faults = [error(403, "PERMISSION_DENIED", "no")]
    code, out, err = run(capsys, *WHERE, "accelerators", "--live")
    assert code == 1
    assert out == ""
    assert "PERMISSION_DENIED" in err
