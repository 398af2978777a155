"""The forward ``debug_attach`` returns: a loopback listener relaying to the job's debugger.

Theory of operation
-------------------
A :class:`DebugForward` listens on ``127.0.0.1:local_port`` and relays each accepted
connection to an *upstream*: the job's debugpy port on this machine
(:class:`LocalUpstream`, local backend) or on the pod's loopback through the
Kubernetes API (:class:`kinetic._backends.gke.portforward.PodPortForward`). Both
give an anyio ``ByteStream`` per connection, so the relay is one piece of code.

*Who owns the tasks.* The forward must keep serving after ``debug_attach`` returns,
whatever the caller does next (block in a sync ``result()``, leave the task that
attached, run on the facade's loop). So it owns a small event loop of its own, on a
daemon thread: its listener and every relay are tasks of that loop's task group,
and :meth:`DebugForward.close` cancels that group and joins the thread. Nothing
runs on the caller's loop; an unclosed forward dies with the process.

*Who may connect.* Any local user may connect to a loopback port, and debugpy runs
whatever its client sends: the listener relays only connections of its own user
(:class:`runner.peer.Gate`, which reads the connecting socket's owner from the
kernel), and closes others unread. A local job's upstream is its private socket.

*Bounds.* Binding and each upstream connection are bounded (``connect_timeout``),
every send by ``SEND_TIMEOUT``; reads are not, since a debugger may sit at a
breakpoint for an hour (a dead pod connection is ended by its websocket heartbeat).
A failed upstream connection closes the accepted one and is logged and kept in
:attr:`DebugForward.errors`; the listener goes on.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import threading
from types import TracebackType
from typing import Any, Protocol, Self

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
from anyio.abc import ByteStream, SocketAttribute, SocketStream

from kinetic._exceptions import BackendError, ConfigError, KineticError
from runner.peer import Gate, check_server

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
CONNECT_TIMEOUT = 10.0
SEND_TIMEOUT = 30.0
START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
MAX_ERRORS = 20


class Upstream(Protocol):
    """Where a forward's connections go. Entered on the forward's own loop."""

    def describe(self) -> str: ...

    async def __aenter__(self) -> Any: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Any: ...

    async def connect(self) -> ByteStream:
        """One new connection. :raises KineticError: (BackendError) when it cannot open."""
        ...


class LocalUpstream:
    """A local job's debugpy: through its private socket (:mod:`runner.debug_net`), or
    at a port on this machine's loopback where the job could not get one."""

    def __init__(
        self,
        port: int,
        *,
        socket_path: str | None = None,
        connect_timeout: float = CONNECT_TIMEOUT,
    ) -> None:
        self.port = port
        self.socket_path = socket_path
        self.connect_timeout = connect_timeout

    def describe(self) -> str:
        return self.socket_path or f"{LOOPBACK}:{self.port}"

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def connect(self) -> ByteStream:
        try:
            with anyio.fail_after(self.connect_timeout):
                if self.socket_path is None:
                    return await anyio.connect_tcp(LOOPBACK, self.port)
                stream = await anyio.connect_unix(self.socket_path)
        except TimeoutError as exc:
            raise BackendError(
                f"connecting to the job's debugger at {self.describe()} timed out"
            ) from exc
        except OSError as exc:
            raise BackendError(
                f"cannot connect to the job's debugger at {self.describe()}: {exc}"
            ) from exc
        try:  # the job's relay runs as us, unless another user took its place
            check_server(stream.extra(SocketAttribute.raw_socket), "the job's debug socket")
        except OSError as exc:
            await stream.aclose()
            raise BackendError(str(exc)) from exc
        return stream


class DebugForward:
    """A running forward to a debug job's debugger (``kinetic.aio`` flavour).

    Close it with ``await forward.close()``, or use it as ``async with``; closing is
    idempotent and leaves the job running (it only ends the forward).

    :ivar job_id: the job.
    :ivar local_port: the port it listens on (``127.0.0.1``).
    :ivar target: where connections go, in words.
    :ivar launch_config: the VS Code launch configuration that attaches through it.
    :ivar errors: recent failures of upstream connections (newest last).
    """

    def __init__(
        self,
        job_id: str,
        local_port: int,
        target: str,
        launch_config: dict[str, Any],
        loop: ForwardLoop,
    ) -> None:
        self.job_id = job_id
        self.local_port = local_port
        self.target = target
        self.launch_config = launch_config
        self._loop = loop

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<DebugForward {self.job_id} 127.0.0.1:{self.local_port} -> {self.target} {state}>"

    @property
    def errors(self) -> list[str]:
        return list(self._loop.errors)

    @property
    def closed(self) -> bool:
        return self._loop.stopped

    async def close(self) -> None:
        """Stop listening and end every relayed connection (the job keeps running)."""
        await anyio.to_thread.run_sync(self.close_blocking)

    def close_blocking(self) -> None:
        """:meth:`close` for a caller without a loop (the blocking facade)."""
        self._loop.stop()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class ForwardLoop:
    """The forward's own event loop, on a daemon thread; see the module docstring.

    :meth:`start` (blocking) returns once ``127.0.0.1:local_port`` is bound (0: a free
    port, then in :attr:`port`); :meth:`stop` (blocking, bounded) ends it.
    """

    def __init__(self, upstream: Upstream, local_port: int) -> None:
        self.upstream = upstream
        self.requested_port = local_port
        self.port = 0
        self.errors: list[str] = []
        self.stopped = False
        self._thread: threading.Thread | None = None
        self._token: anyio.lowlevel.EventLoopToken | None = None
        self._scope: anyio.CancelScope | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._stop_requested = False
        self._gate = Gate(f"debug forward of {upstream.describe()}", log.warning)

    def start(self) -> None:
        """Start serving. :raises ConfigError: the port is taken. :raises BackendError:
        the listener could not start."""
        thread = threading.Thread(
            target=self._run, name=f"kinetic-debug-forward-{self.requested_port}", daemon=True
        )
        self._thread = thread
        thread.start()
        if not self._ready.wait(START_TIMEOUT):
            self.stop()
            raise BackendError(f"the debug forward did not start within {START_TIMEOUT}s")
        if self._failure is not None:
            self.stopped = True
            raise self._failure

    def _run(self) -> None:
        try:
            anyio.run(self._main)
        except BaseException as exc:  # noqa: BLE001 - reported to start() or logged
            if not self._ready.is_set():
                self._failure = _translate_start_error(exc, self.requested_port)
            else:
                log.warning("the debug forward on port %s failed: %s", self.port, exc)
        finally:
            self.stopped = True
            self._ready.set()

    async def _main(self) -> None:
        with anyio.CancelScope() as scope:
            self._scope = scope
            self._token = anyio.lowlevel.current_token()
            if self._stop_requested:  # stop() came before the token existed
                scope.cancel()
            async with self.upstream:
                with anyio.fail_after(START_TIMEOUT):
                    listener = await anyio.create_tcp_listener(
                        local_host=LOOPBACK, local_port=self.requested_port
                    )
                async with listener, anyio.create_task_group() as tg:
                    self.port = int(listener.extra(SocketAttribute.local_port))
                    self._ready.set()
                    await listener.serve(self._relay, task_group=tg)

    def stop(self) -> None:
        """Cancel the loop's tasks and join its thread (bounded). Idempotent."""
        self._stop_requested = True  # before reading the token: see _main
        token, scope, thread = self._token, self._scope, self._thread
        if token is not None and scope is not None and not self.stopped:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                anyio.from_thread.run_sync(scope.cancel, token=token)
        if thread is not None and thread is not threading.current_thread():
            thread.join(STOP_TIMEOUT)
        self.stopped = True

    def _note(self, message: str) -> None:
        log.warning("debug forward on 127.0.0.1:%s: %s", self.port, message)
        self.errors.append(message)
        del self.errors[:-MAX_ERRORS]

    async def _relay(self, client: SocketStream) -> None:
        """Relay one accepted connection until either side ends it. Never raises: one
        connection's failure must not end the listener."""
        async with client:
            # Any local user may connect to a loopback port; debugpy runs what it is sent.
            if not self._gate.admit(client.extra(SocketAttribute.raw_socket)):
                return
            try:
                upstream = await self.upstream.connect()
            except KineticError as exc:
                self._note(str(exc))
                return
            except Exception as exc:  # noqa: BLE001 - see the docstring
                self._note(f"connecting to {self.upstream.describe()} failed: {exc!r}")
                return
            async with upstream, anyio.create_task_group() as tg:
                tg.start_soon(self._pipe, client, upstream, tg.cancel_scope, "to the job", True)
                tg.start_soon(self._pipe, upstream, client, tg.cancel_scope, "from the job")

    async def _pipe(
        self,
        src: ByteStream,
        dst: ByteStream,
        both: anyio.CancelScope,
        what: str,
        src_is_client: bool = False,
    ) -> None:
        """Copy ``src`` to ``dst`` until either ends, then end the other direction too.

        A reset from the local client (``src_is_client``) ends its session like a close
        does: a client that closes with replies still unread (a debugger stopped while
        the job's last events were in flight) resets its connection, which is no failure
        of the forward. Failures on the job's side are noted in :attr:`errors`.
        """
        try:
            while True:
                try:
                    data = await src.receive()
                except anyio.BrokenResourceError:
                    if not src_is_client:
                        raise
                    log.debug("debug forward on 127.0.0.1:%s: the client reset", self.port)
                    return
                with anyio.fail_after(SEND_TIMEOUT):
                    await dst.send(data)
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            pass
        except (anyio.BrokenResourceError, OSError, TimeoutError) as exc:
            self._note(f"a relayed connection broke ({what}): {exc or type(exc).__name__}")
        except Exception as exc:  # noqa: BLE001 - see _relay
            self._note(f"a relayed connection failed ({what}): {exc!r}")
        finally:
            both.cancel()  # one side ended: end the other


def _translate_start_error(exc: BaseException, port: int) -> BaseException:
    if isinstance(exc, KineticError):
        return exc
    if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
        return ConfigError(
            f"local port {port} is in use: pass another local_port= (0 picks a free one)"
        )
    if isinstance(exc, TimeoutError):
        return BackendError(f"the debug forward could not listen on port {port} in time")
    return BackendError(f"the debug forward could not start: {type(exc).__name__}: {exc}")
