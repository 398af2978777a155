"""Debug mode on the testbed: a real pod waits in debugpy, ``debug_attach`` forwards a
local port to it through the Kubernetes API's port-forward (websockets, no kubectl),
and a real DAP client attaches, stops at a breakpoint, continues, and the value
comes back. A debug pod nobody attaches to fails bounded, in phase ``debug``.
"""

from __future__ import annotations

import inspect
import os
import time

import pytest

import kinetic
from tests.fix_cluster import REPO, GKETarget
from tests.fix_dap import DapClient

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


def doubled(x: int) -> int:
    y = x * 2  # BREAK HERE
    return y + 1


def _break_line() -> int:
    lines, first = inspect.getsourcelines(doubled)
    return first + next(i for i, line in enumerate(lines) if "# BREAK HERE" in line)


@pytest.fixture(autouse=True)
def shared_port_on_the_node_network(gke: GKETarget, monkeypatch: pytest.MonkeyPatch) -> bool:
    """The testbed has no CNI: its pods use the node's network, where debugpy's port is
    the node's. Debugging there must be accepted (KINETIC_DEBUG_SHARED_PORT=1)."""
    on_node = os.environ.get("KINETIC_GKE_HOST_NETWORK", "").lower() in ("1", "true")
    if on_node:
        monkeypatch.setenv("KINETIC_DEBUG_SHARED_PORT", "1")
    return on_node


def test_debug_on_the_node_network_is_refused_unless_accepted(
    gke: GKETarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KINETIC_GKE_HOST_NETWORK", "true")
    monkeypatch.delenv("KINETIC_DEBUG_SHARED_PORT", raising=False)
    fn = kinetic.run(**gke.run_args(debug=True))(doubled)
    before = gke.object_names("")
    with pytest.raises(kinetic.ConfigError, match="KINETIC_DEBUG_SHARED_PORT=1"):
        fn.run_async(1)
    assert gke.object_names("") == before  # nothing was written


def test_debug_attach_through_the_kubernetes_port_forward(
    gke: GKETarget, shared_port_on_the_node_network: bool, caplog: pytest.LogCaptureFixture
) -> None:
    fn = kinetic.run(**gke.run_args(debug=True))(doubled)
    job = fn.run_async(20)
    with (
        caplog.at_level("WARNING", logger="kinetic"),
        job.debug_attach(local_port=0, timeout=180) as forward,
    ):
        # A session on the node's network is said not to be private; one in a pod's own
        # network is.
        shared = [r for r in caplog.records if "is not private" in r.getMessage()]
        assert len(shared) == int(shared_port_on_the_node_network), caplog.text
        assert f"pod {gke.namespace}/kinetic-{job.job_id}" in forward.target
        mappings = forward.launch_config["pathMappings"]
        # The project as submitted here, and the pod's copy of it.
        assert mappings[0]["localRoot"] == str(REPO)
        assert mappings[0]["remoteRoot"].endswith("/workspace")
        # The pod waits for a client: the function has not run.
        time.sleep(1.0)
        assert job.status() is kinetic.JobStatus.RUNNING
        with DapClient(forward.local_port, timeout=60) as client:
            client.attach({__file__: [_break_line()]}, path_mappings=mappings)
            stopped = client.stopped(timeout=60)
            frame = client.top_frame(stopped["threadId"])
            assert frame["line"] == _break_line()
            assert frame["source"]["path"] == __file__  # mapped back to this machine
            client.resume(stopped["threadId"])
            assert job.result(timeout=120) == 41
        assert not forward.errors, forward.errors
    assert forward.closed
    # Debug jobs keep their artifacts after the value is read.
    assert gke.object_names(f"{job.job_id}/")
    job.cleanup()


def test_unattended_debug_pod_fails_bounded_in_phase_debug(
    gke: GKETarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KINETIC_DEBUG_WAIT_TIMEOUT", "3")
    fn = kinetic.run(**gke.run_args(debug=True))(doubled)
    job = fn.run_async(1)
    with pytest.raises(
        kinetic.JobFailedError, match="no debugger client attached within 3s"
    ) as info:
        job.result(timeout=180)
    assert info.value.phase == "debug"
    job.cleanup()
