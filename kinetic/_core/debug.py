"""Debug mode's pure rules: the wait setting, the ready marker, the launch configuration,
and the framing of the Kubernetes API's websocket port-forward.

No IO here: :mod:`runner.debug` (the job's side) writes the marker this module reads;
:mod:`kinetic._debug` and :mod:`kinetic._backends.gke.portforward` do the IO.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kinetic._exceptions import ConfigError
from runner.debug import DEFAULT_WAIT, SHARED_ENV, WAIT_ENV


def wait_timeout(env: Mapping[str, str]) -> float:
    """Seconds a debug job waits for a client: ``KINETIC_DEBUG_WAIT_TIMEOUT`` or 600.

    :raises ConfigError: when the variable is not a positive, finite number.
    """
    raw = env.get(WAIT_ENV, "").strip()
    if not raw:
        return DEFAULT_WAIT
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{WAIT_ENV} must be a positive number of seconds (got {raw!r})")
    return value


def shared_port(env: Mapping[str, str]) -> bool:
    """Whether a local debug job may listen on the machine's loopback where the kernel
    refuses it a private network (``KINETIC_DEBUG_SHARED_PORT``; default: no, the job
    fails in phase ``debug`` instead).

    :raises ConfigError: when the variable is neither true nor false.
    """
    from kinetic._core.gke_config import env_flag

    return env_flag(env, SHARED_ENV)


@dataclass(frozen=True)
class ReadyMarker:
    """What a debug job says once debugpy listens (``{job_id}/debug.json``)."""

    port: int
    """debugpy's port on the job's loopback (pod or machine)."""
    host_index: int | None
    code_root: str
    """Where the job's project files are: the VS Code ``remoteRoot``."""
    source_root: str
    """The project's path on the submitting machine: the default ``localRoot``."""
    cwd: str
    wait_timeout: float
    socket: str | None = None
    """A local job's private socket to debugpy (``runner.debug_net``); None where the
    port is reached directly (a pod's loopback, or a local job whose kernel refused a
    private network)."""


def parse_marker(data: bytes) -> ReadyMarker:
    """Read a ready marker.

    :raises ValueError: when it is not one (malformed JSON, missing or invalid port).
    """
    obj = json.loads(data.decode())  # JSONDecodeError is a ValueError
    if not isinstance(obj, dict):
        raise ValueError("the debugger-ready marker is not a JSON object")  # noqa: TRY004
    port = obj.get("port")
    if not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"the debugger-ready marker has no valid port: {port!r}")
    host_index = obj.get("host_index")
    return ReadyMarker(
        port=port,
        host_index=host_index if isinstance(host_index, int) else None,
        code_root=str(obj.get("code_root") or ""),
        source_root=str(obj.get("source_root") or ""),
        cwd=str(obj.get("cwd") or ""),
        wait_timeout=float(obj.get("wait_timeout") or 0.0),
        socket=obj["socket"] if isinstance(obj.get("socket"), str) else None,
    )


def launch_configuration(
    job_id: str, port: int, *, local_root: str | None, remote_root: str
) -> dict[str, Any]:
    """A VS Code ``launch.json`` entry that attaches to the forwarded debugger.

    :param local_root: the project on this machine; None: ``${workspaceFolder}``.
    :param remote_root: the job's copy of the project (the marker's ``code_root``).
    """
    config: dict[str, Any] = {
        "name": f"Kinetic: attach to {job_id}",
        "type": "debugpy",
        "request": "attach",
        "connect": {"host": "127.0.0.1", "port": port},
        "justMyCode": False,
    }
    if remote_root:
        config["pathMappings"] = [
            {"localRoot": local_root or "${workspaceFolder}", "remoteRoot": remote_root}
        ]
    return config


# -- the port-forward websocket -------------------------------------------------------
#
# ``GET /api/v1/namespaces/NS/pods/POD/portforward?ports=P`` upgraded to a websocket with
# subprotocol ``v4.channel.k8s.io``: every binary message starts with a channel byte.
# For the i-th port, channel 2i carries data and 2i+1 errors; the first message the
# server sends on each channel begins with the port number (2 bytes, little-endian).
# The client sends data as ``b"\x00" + bytes`` (one port: channel 0).

PORT_FORWARD_PROTOCOL = "v4.channel.k8s.io"
DATA_CHANNEL = 0
ERROR_CHANNEL = 1


def encode_data(data: bytes) -> bytes:
    """A websocket message carrying ``data`` to the forwarded port."""
    return bytes((DATA_CHANNEL,)) + data


@dataclass(frozen=True)
class ForwardData:
    data: bytes


@dataclass(frozen=True)
class ForwardError:
    message: str


class PortForwardDecoder:
    """Turns the server's websocket messages for one forwarded port into events.

    ``receive(message)`` returns :class:`ForwardData` (maybe empty: a port prefix
    alone), or :class:`ForwardError` (the kubelet could not reach the port; the
    message is the server's text).

    :raises ValueError: on a message for another channel or port (a protocol error).
    """

    def __init__(self, port: int) -> None:
        self.port = port
        self._prefixed = {DATA_CHANNEL: False, ERROR_CHANNEL: False}

    @property
    def ready(self) -> bool:
        """Whether both channels' port prefixes have arrived (the stream is open)."""
        return all(self._prefixed.values())

    def receive(self, message: bytes) -> ForwardData | ForwardError:
        if not message:
            raise ValueError("empty port-forward message")
        channel, body = message[0], message[1:]
        if channel not in self._prefixed:
            raise ValueError(f"port-forward message on unexpected channel {channel}")
        if not self._prefixed[channel]:
            if len(body) < 2:
                raise ValueError("port-forward stream began without its port number")
            port = int.from_bytes(body[:2], "little")
            if port != self.port:
                raise ValueError(f"port-forward stream for port {port}, expected {self.port}")
            self._prefixed[channel] = True
            body = body[2:]
        if channel == ERROR_CHANNEL:
            if not body:
                return ForwardData(b"")
            return ForwardError(body.decode(errors="replace").strip())
        return ForwardData(body)
