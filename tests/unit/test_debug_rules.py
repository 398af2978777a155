"""Debug mode's pure rules: wait setting, ready marker, launch configuration, and the
framing of the Kubernetes websocket port-forward (no loop, no IO)."""

from __future__ import annotations

import json

import pytest

from kinetic import ConfigError
from kinetic._core import debug


def test_wait_timeout_default_env_and_bad_values() -> None:
    assert debug.wait_timeout({}) == 600.0
    assert debug.wait_timeout({"KINETIC_DEBUG_WAIT_TIMEOUT": " 2.5 "}) == 2.5
    for bad in ("0", "-1", "soon", "nan", "inf"):
        with pytest.raises(ConfigError, match="KINETIC_DEBUG_WAIT_TIMEOUT"):
            debug.wait_timeout({"KINETIC_DEBUG_WAIT_TIMEOUT": bad})


def test_marker_round_trip_and_corruption() -> None:
    data = json.dumps(
        {
            "port": 40123,
            "host_index": None,
            "code_root": "/w/ws",
            "cwd": "/w/ws/src",
            "wait_timeout": 9,
        }
    ).encode()
    marker = debug.parse_marker(data)
    assert (marker.port, marker.host_index, marker.code_root, marker.wait_timeout) == (
        40123,
        None,
        "/w/ws",
        9.0,
    )
    for bad in (b"[]", b"{", b'{"port": 0}', b'{"port": "80"}', b'{"port": 70000}'):
        with pytest.raises(ValueError, match=r"marker|Expecting|delimiter"):
            debug.parse_marker(bad)


def test_launch_configuration_maps_the_project() -> None:
    config = debug.launch_configuration("job-1", 5678, local_root=None, remote_root="/tmp/r/ws")
    assert config["request"] == "attach"
    assert config["connect"] == {"host": "127.0.0.1", "port": 5678}
    assert config["pathMappings"] == [
        {"localRoot": "${workspaceFolder}", "remoteRoot": "/tmp/r/ws"}
    ]
    mine = debug.launch_configuration("job-1", 1, local_root="/home/me/p", remote_root="/x")
    assert mine["pathMappings"][0]["localRoot"] == "/home/me/p"
    assert "pathMappings" not in debug.launch_configuration(
        "job-1", 1, local_root=None, remote_root=""
    )


def test_port_forward_framing() -> None:
    port = (5678).to_bytes(2, "little")
    dec = debug.PortForwardDecoder(5678)
    assert not dec.ready
    assert dec.receive(b"\x00" + port) == debug.ForwardData(b"")
    assert not dec.ready
    assert dec.receive(b"\x01" + port) == debug.ForwardData(b"")
    assert dec.ready
    assert dec.receive(b"\x00hello") == debug.ForwardData(b"hello")
    assert dec.receive(b"\x01socat not found\n") == debug.ForwardError("socat not found")
    assert debug.encode_data(b"hi") == b"\x00hi"

    # The first frame may carry data right after the prefix.
    dec = debug.PortForwardDecoder(5678)
    assert dec.receive(b"\x00" + port + b"Content") == debug.ForwardData(b"Content")

    for bad in (b"", b"\x02" + port, b"\x00\x01", b"\x00" + (80).to_bytes(2, "little")):
        with pytest.raises(ValueError, match="port-forward"):
            debug.PortForwardDecoder(5678).receive(bad)
