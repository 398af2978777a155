"""Another user on the machine can neither run jobs as you nor steer your batches.

The second account is uid 65534 (:mod:`tests.other_user`; these tests need root, as CI
runs them). It does what the issue that found the hole did: it lists every abstract
``@kinetic-`` socket in ``/proc/net/unix`` and knocks on each with a request.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import kinetic
from kinetic._backends._process import ProcessRef, is_alive
from kinetic._backends.local import job_environment
from kinetic._backends.local_gpus import apply_job_env
from runner.batch import socket_address as batch_socket_address
from runner.launcher import launcher_tag, socket_address
from tests.fix_dap import DapClient
from tests.other_user import (
    OTHER_UID,
    as_other_user,
    kinetic_socket_names,
    knock,
    knock_on_kinetic_sockets,
    need_root,
    start_as_other_user,
)

pytestmark = pytest.mark.local


@kinetic.run()
def square(x: int) -> int:
    return x * x


@kinetic.run()
def slow_square(x: int) -> int:
    time.sleep(0.3)
    return x * x


def own_launcher_tag(root: Path) -> str:
    """The tag of ``root``'s launcher for this interpreter, as the local backend makes it."""
    env = job_environment(root / "contexts")
    apply_job_env(env, "cpu", root)
    return launcher_tag(sys.executable, env)


def launcher_name(root: Path) -> str:
    """The abstract socket name (as ``/proc/net/unix`` shows it) of ``root``'s launcher
    for this interpreter, as the local backend addresses it."""
    return "@" + socket_address(root.absolute(), own_launcher_tag(root))[1:].decode()


def launcher_request(root: Path, planted: Path, **changes: Any) -> bytes:
    """What the second account sent the launcher: run a job, log into ``planted``;
    ``changes`` replace fields of the request."""
    request = {
        "v": 1,
        "args": ["--storage", (root / "storage").as_uri(), "--job-id", "job-0badc0de"],
        "cwd": "/",
        "env": {},
        "log": str(planted),
        "status": f"{planted}.status",
        **changes,
    }
    return json.dumps(request).encode() + b"\n"


def refusals(log: Path) -> list[str]:
    text = log.read_text() if log.exists() else ""
    return [line for line in text.splitlines() if "refused a connection" in line]


def wait_until(check: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
    return value


def test_the_launcher_serves_only_its_own_user(kinetic_env: Path) -> None:
    need_root()
    assert square(3) == 9  # the root's launcher now listens
    planted = kinetic_env / "storage" / "planted.log"

    def probe() -> list[dict[str, Any]]:
        return knock_on_kinetic_sockets(lambda name: launcher_request(kinetic_env, planted))

    knocked = [k for k in as_other_user(probe) if k["name"].startswith("@kinetic-launcher-")]
    own = launcher_name(kinetic_env)
    assert own in [k["name"] for k in knocked]
    for k in knocked:
        # Ours is visible and connectable; a launcher left by an earlier test may have
        # reached its idle exit between the listing and the knock, and refuses.
        assert k["connected"] or (k["name"] != own and "refused" in k["end"]), k
        assert k["received"] == ""  # ... but nothing is read or answered
    assert not planted.exists()
    assert not Path(f"{planted}.status").exists()
    # One line per refused knock (the knock ends when the launcher closes, after it
    # logged): here, the probe's one.
    log = kinetic_env / "launcher" / f"{own_launcher_tag(kinetic_env)}.log"
    logged = refusals(log)
    assert len(logged) == [k["name"] for k in knocked].count(own) == 1, logged
    assert f"uid {OTHER_UID}" in logged[0]
    # A flood is logged up to a bound (runner.peer: 20 lines, then one that says so).
    request = launcher_request(kinetic_env, planted)
    as_other_user(lambda: [knock(own, request) for _ in range(24)])
    lines = log.read_text().splitlines()
    assert len(refusals(log)) == 20
    assert sum("further refused connections are not logged" in line for line in lines) == 1
    assert not planted.exists()
    assert square(4) == 16  # and it still serves its own user


def files_under(*dirs: Path) -> set[Path]:
    return {p for d in dirs for p in d.rglob("*")}


# One field of an otherwise valid request each, and what the error says: {out} is a
# directory outside the store, {store} the launcher's store, {root} the local root.
BAD_REQUESTS = {
    "storage": ({"storage": "{out}/other-root/storage"}, "the storage must be"),
    "job id": ({"job-id": "../escape"}, "not a job id"),
    "cwd": ({"cwd": "{out}"}, "cwd '{out}' lies outside this launcher's store"),
    "log": ({"log": "{out}/job.log"}, "log '{out}/job.log' lies outside"),
    "log through ..": ({"log": "{store}/../job.log"}, "log '{root}/job.log' lies outside"),
    "log, relative": ({"log": "job.log"}, "log must be an absolute path"),
    "status": ({"status": "{out}/job.status"}, "status '{out}/job.status' lies outside"),
    "final": ({"final": "{out}/final.json"}, "final '{out}/final.json' lies outside"),
}


@pytest.mark.parametrize("bad", [None, *BAD_REQUESTS])
def test_the_launcher_forks_only_inside_its_own_store(
    kinetic_env: Path, tmp_path: Path, bad: str | None
) -> None:
    """Even from its own user, a request naming a path outside the launcher's store, or
    another store, or a job id that is not one, is answered with an error, and nothing
    is created. (``None``: the same request unchanged is served, so each refusal is
    the one field's.)"""
    assert square(3) == 9
    launcher = launcher_name(kinetic_env)
    assert launcher in kinetic_socket_names()
    store, out = (kinetic_env / "storage").absolute(), tmp_path / "outside"
    out.mkdir()
    job_dir = store / "job-0badc0de"
    job_dir.mkdir()

    def fill(text: str) -> str:
        return text.format(out=out, store=store, root=kinetic_env.absolute())

    fields: dict[str, Any] = {
        "cwd": str(job_dir),
        "log": str(job_dir / "job.log"),
        "status": str(job_dir / "job.status"),
        "final": str(job_dir / "final.json"),
    }
    storage, job_id = store.as_uri(), "job-0badc0de"
    expected = ""
    if bad is not None:
        change, expected = BAD_REQUESTS[bad]
        ((key, value),) = change.items()
        if key == "storage":
            storage = Path(fill(value)).as_uri()
        elif key == "job-id":
            job_id = value
        else:
            fields[key] = fill(value)
    args = ["--storage", storage, "--job-id", job_id]
    before = files_under(kinetic_env, tmp_path)
    answer = json.loads(
        knock(launcher, launcher_request(kinetic_env, out, args=args, **fields))["received"]
    )
    if bad is None:  # served: the job (which finds no spec) runs, and its leader says so
        assert "pid" in answer, answer
        wait_until(lambda: Path(fields["status"]).exists() or Path(fields["final"]).exists())
        assert Path(fields["log"]).exists()
        return
    assert "error" in answer, answer
    assert fill(expected) in answer["error"]
    assert files_under(kinetic_env, tmp_path) == before


def test_a_batch_supervisor_ignores_other_users(kinetic_env: Path) -> None:
    need_root()
    batch = slow_square.run_async_map(range(12), max_concurrent=2)
    store = (kinetic_env / "storage").absolute().as_uri()
    group_dir = kinetic_env / "storage" / "_groups" / batch.group_id
    supervisor = "@" + batch_socket_address(group_dir, store, batch.group_id)[1:].decode()
    wait_until(lambda: supervisor in kinetic_socket_names())

    def probe() -> list[dict[str, Any]]:
        # Cancel the batch, cancel two inputs, and ask for the event stream.
        return knock_on_kinetic_sockets(lambda name: b"C\nc 0\nc 5\np\n")

    knocked = [k for k in as_other_user(probe) if k["name"].startswith("@kinetic-batch-")]
    assert supervisor in [k["name"] for k in knocked]
    for k in knocked:
        assert k["connected"]
        assert k["received"] == ""
    assert batch.results() == [x * x for x in range(12)]
    log = kinetic_env / "storage" / "_groups" / batch.group_id / "supervisor.log"
    logged = refusals(log)  # one line per refused knock: the probe's one
    assert len(logged) == [k["name"] for k in knocked].count(supervisor) == 1, logged
    assert f"uid {OTHER_UID}" in logged[0]


def test_a_batch_supervisors_name_cannot_be_predicted_or_squatted(kinetic_env: Path) -> None:
    """The name was ``sha256(storage URL | group id)``, both visible in ``ps``: another
    user bound it after a supervisor died, and blocked the resumed batch. Now it has a
    random part kept in the batch's private folder."""
    need_root()
    import hashlib

    batch = slow_square.run_async_map(range(6), max_concurrent=2)
    store = (kinetic_env / "storage").absolute().as_uri()
    group_dir = kinetic_env / "storage" / "_groups" / batch.group_id
    supervisor = "@" + batch_socket_address(group_dir, store, batch.group_id)[1:].decode()
    predictable = hashlib.sha256(f"{store}|{batch.group_id}".encode()).hexdigest()[:32]
    squat_name = b"\0kinetic-batch-" + predictable.encode()
    assert supervisor != "@" + squat_name[1:].decode()
    secret = group_dir / "supervisor.secret"

    def squat(ready: Callable[[], None]) -> str:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.bind(squat_name)  # what the attacker held
            sock.listen(1)
            ready()
            try:
                secret.read_text()
                return "read"
            except OSError as exc:
                time.sleep(3.0)  # held while the batch runs
                return type(exc).__name__

    squatter = start_as_other_user(squat)
    squatter.wait_ready()
    assert batch.results(timeout=120) == [x * x for x in range(6)]
    assert squatter.result() == "PermissionError"


def test_a_launcher_name_taken_by_another_user_gets_nothing(
    kinetic_env: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Another user who binds the launcher's name first receives no request: the job
    runs without the launcher, and the warning says why."""
    address = b"\0" + launcher_name(kinetic_env)[1:].encode()

    def squat(ready: Callable[[], None]) -> str:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(address)
        listener.listen(8)
        listener.settimeout(20.0)
        ready()
        received = b""
        try:
            conn, _ = listener.accept()  # the job's submitter knocks ...
            conn.settimeout(5.0)
            while chunk := conn.recv(65536):  # ... and hangs up without a word
                received += chunk
        except TimeoutError:
            return "nobody came"
        return received.decode(errors="replace")

    squatter = start_as_other_user(squat)
    squatter.wait_ready()
    with caplog.at_level("WARNING", logger="kinetic"):
        assert square(5) == 25
    assert squatter.result() == ""
    assert any(f"uid {OTHER_UID}" in r.getMessage() for r in caplog.records), caplog.text
    assert os.stat(kinetic_env).st_uid == os.geteuid()


@pytest.mark.parametrize("unsafe", ["another user's", "writable by others"])
def test_a_local_root_others_can_write_is_refused(kinetic_env: Path, unsafe: str) -> None:
    """Payloads in a root another user may write could be theirs: no job runs from it."""
    kinetic_env.mkdir(mode=0o700)
    if unsafe == "another user's":
        need_root()
        os.chown(kinetic_env, OTHER_UID, OTHER_UID)
    else:
        kinetic_env.chmod(0o777)
    with pytest.raises(kinetic.ConfigError, match="unsafe local root") as caught:
        square(2)
    assert ("uid 65534" if unsafe == "another user's" else "chmod 700") in str(caught.value)
    assert not (kinetic_env / "storage").exists()  # nothing was written there
    with pytest.raises(kinetic.ConfigError, match="unsafe local root"):
        square.run_async_map([1, 2])
    assert not (kinetic_env / "storage").exists()


@kinetic.run(debug=True)
def debugged(x: int) -> int:
    return x + 1


def dap_probe(address: str | tuple[str, int]) -> str:
    """Connect and send a DAP ``initialize``: ``answered`` (debugpy answers any client at
    once, in DAP's framing), ``closed`` (hung up unread: end of stream, or a reset since
    our request was left unread), ``not a debugger`` (another server that happens to
    listen at that address answered something else), or why the connection could not be
    made."""
    family = socket.AF_UNIX if isinstance(address, str) else socket.AF_INET
    body = json.dumps({"seq": 1, "type": "request", "command": "initialize", "arguments": {}})
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(60.0)  # a loaded machine; refusals are immediate
        try:
            sock.connect(address)
        except OSError as exc:
            return type(exc).__name__
        try:
            sock.sendall(f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
            answer = sock.recv(4096)
        except (ConnectionResetError, BrokenPipeError):
            return "closed"
        if not answer:
            return "closed"
        # debugpy's port number inside its private network may be one that another
        # server (a test's loopback server) listens on in the machine's: that is not
        # the debugger, and must not read as one.
        return "answered" if answer.startswith(b"Content-Length:") else "not a debugger"


def test_a_local_debug_session_is_reachable_by_its_user_only(
    kinetic_env: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """debugpy runs whatever its client sends: no other user reaches it, neither at its
    port, nor through the job's socket, nor through the forward ``debug_attach`` opens."""
    need_root()
    job = debugged.run_async(1)
    with caplog.at_level("WARNING", logger="kinetic"), job.debug_attach(local_port=0) as forward:
        marker = json.loads((kinetic_env / "storage" / job.job_id / "debug.json").read_text())
        assert marker["socket"]  # the kernel gave the debugger a private network
        assert Path(marker["socket"]).parent.stat().st_mode & 0o777 == 0o700

        def probe() -> dict[str, str]:
            return {
                "debugpy's port": dap_probe(("127.0.0.1", marker["port"])),
                "the job's socket": dap_probe(marker["socket"]),
                "the forward": dap_probe(("127.0.0.1", forward.local_port)),
            }

        reached = as_other_user(probe, timeout=200.0)  # three probes of up to 60 s each
        assert reached["debugpy's port"] != "answered"  # not on this machine's loopback
        assert reached["the job's socket"] == "PermissionError"  # its directory is 0700
        assert reached["the forward"] == "closed"  # accepted, then closed unread
        assert dap_probe(("127.0.0.1", forward.local_port)) == "answered"  # its user: yes
    assert any(f"uid {OTHER_UID}" in r.getMessage() for r in caplog.records), caplog.text
    assert not any("is not private" in r.getMessage() for r in caplog.records)
    job.cancel()


def test_a_debugger_without_privileges_is_private_though_the_job_runs_threads() -> None:
    """The attack: a debug job's module imports numpy, whose thread pool starts while
    the function is unpickled, before debugpy starts; the kernel grants a user
    namespace only to a process with one thread. The runner enters it at the job's
    start, so the debugger still gets a network of its own that no one else reaches.
    A job that could not (threads before any namespace) fails in phase ``debug``
    instead of listening where another user can attach."""

    # Imported here: the other user cannot read this interpreter's files under /root.
    import contextlib
    import io
    import tempfile
    import threading

    import runner.debug_net  # what _listen_privately imports
    import runner.userns  # noqa: F401 - what enter_job_namespaces imports
    from runner.debug import _listen_privately
    from runner.isolation import enter_job_namespaces, refusal
    from runner.protocol import PhaseError
    from runner.store import FileStore

    def plain_user_job(enter_first: bool) -> dict[str, Any]:
        held = []

        def listen() -> int:  # stands in for debugpy: a TCP listener on loopback
            server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            server.bind(("127.0.0.1", 0))
            server.listen(1)
            held.append(server)
            return int(server.getsockname()[1])

        if enter_first:  # what the runner does before it reads the payload
            store = FileStore(Path(tempfile.gettempdir()))
            enter_job_namespaces(store, {"debug": {"wait": 1.0, "source_root": ""}}, None)
        # What unpickling a function whose module imports numpy does: threads start.
        stop = threading.Event()
        threading.Thread(target=stop.wait, daemon=True).start()
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr):
                port, path, _ = _listen_privately(listen, refused=refusal())
        except PhaseError as exc:
            return {"phase": exc.phase, "error": str(exc), "refusal": refusal()}
        finally:
            stop.set()
        # This (main) thread is in the machine's network, as every other local user is.
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.settimeout(5.0)
            try:
                probe.connect(("127.0.0.1", port))
                from_the_machine = "connected"
            except OSError as exc:
                from_the_machine = type(exc).__name__
        return {"socket": path, "stderr": stderr.getvalue(), "from the machine": from_the_machine}

    seen = as_other_user(lambda: plain_user_job(enter_first=True))
    if seen.get("refusal") is None:  # the kernel allows unprivileged user namespaces
        assert seen.get("socket"), seen  # private, though threads ran first
        assert Path(seen["socket"]).name == "debugpy.sock"
        assert seen["from the machine"] != "connected"
        assert seen["stderr"] == ""
    else:  # refused: the job fails, naming the opt-in; it never listens silently
        assert seen["phase"] == "debug"
        assert "KINETIC_DEBUG_SHARED_PORT=1" in seen["error"]
    late = as_other_user(lambda: plain_user_job(enter_first=False))
    assert late["phase"] == "debug", late  # no silent fallback to the shared loopback
    assert "any local user could attach to it and run code as you" in late["error"]
    assert "the job already runs threads" in late["error"]
    assert "KINETIC_DEBUG_SHARED_PORT=1" in late["error"]


# Runs ``python ARGS`` in a user namespace of its own (root mapped onto itself) whose
# kernel limit on new network namespaces is 0: the kernel refuses one to that process
# and everything it starts (its job launcher, its jobs), and to nothing else.
_WITHOUT_NETWORK_NAMESPACES = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from runner.userns import enter_user_namespace

    try:
        enter_user_namespace()
        Path("/proc/sys/user/max_net_namespaces").write_text("0")
    except OSError as exc:
        print(exc, file=sys.stderr)
        sys.exit(77)
    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
    """
)
_SUBMIT_DEBUG_JOBS = textwrap.dedent(
    """
    import os

    import kinetic

    @kinetic.run(debug=True)
    def debugged(x):
        return x + 1

    refused = debugged.run_async(0).job_id
    os.environ["KINETIC_DEBUG_SHARED_PORT"] = "1"  # accepted: the machine's loopback
    print(refused, debugged.run_async(1).job_id, debugged.run_async(2).job_id)
    """
)


def test_a_debugger_the_kernel_keeps_on_loopback_fails_unless_accepted(
    kinetic_env: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Where the kernel refuses the job a network namespace, a debug job fails in phase
    ``debug``, saying why and how to accept a shared port. Accepted
    (``KINETIC_DEBUG_SHARED_PORT=1``), it works on the machine's loopback, its log says
    in one line that any local user can attach there (true: the second account reaches
    it), and so does ``debug_attach``. debugpy's adapter ends with the job, or with its
    cancel."""
    need_root()
    submitted = subprocess.run(
        [sys.executable, "-c", _WITHOUT_NETWORK_NAMESPACES, "-c", _SUBMIT_DEBUG_JOBS],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if submitted.returncode == 77:
        pytest.skip(f"no user namespace with limits of its own here: {submitted.stderr}")
    assert submitted.returncode == 0, submitted.stderr
    refused, *jobs = [kinetic.attach(job_id) for job_id in submitted.stdout.split()]
    with pytest.raises(kinetic.JobFailedError) as failed:
        refused.result(timeout=60)
    assert failed.value.phase == "debug"
    assert "could not get a private network" in str(failed.value)
    assert "KINETIC_DEBUG_SHARED_PORT=1" in str(failed.value)
    assert not (kinetic_env / "storage" / refused.job_id / "debug.json").exists()
    markers = []
    for job in jobs:
        marker_file = kinetic_env / "storage" / job.job_id / "debug.json"
        text = wait_until(lambda f=marker_file: f.exists() and f.read_text(), timeout=60)
        marker = json.loads(text)
        assert marker["socket"] is None  # refused: no private network
        assert marker["helpers"]  # debugpy's adapter, to end with the job
        markers.append(marker)
        warnings = [line for line in job.logs().splitlines() if "WARNING" in line]
        assert len(warnings) == 1, warnings
        assert "could not get a private network" in warnings[0]
        assert f"127.0.0.1:{marker['port']}," in warnings[0]
        assert "any user of this machine can attach and run code as you" in warnings[0]
    exposed, debugged_job = jobs

    # The exposure is real: another user reaches debugpy's port. (Connecting is enough,
    # and a client takes debugpy's one session: this job is not debugged further.)
    def connect() -> str:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.settimeout(30.0)
            sock.connect(("127.0.0.1", markers[0]["port"]))
            return "connected"

    assert as_other_user(connect) == "connected"
    exposed.cancel()
    # Its own user debugs the other job to its value, told that the session is shared.
    with (
        caplog.at_level("WARNING", logger="kinetic"),
        debugged_job.debug_attach(local_port=0) as forward,
        DapClient(forward.local_port) as dap,
    ):
        dap.attach()
        assert debugged_job.result(timeout=60) == 3
    (warning,) = [r.getMessage() for r in caplog.records if "is not private" in r.getMessage()]
    assert f"127.0.0.1:{markers[1]['port']}" in warning
    for ref in [ProcessRef.from_dict(h) for marker in markers for h in marker["helpers"]]:
        wait_until(lambda ref=ref: not is_alive(ref), timeout=10)


def test_a_cancelled_debug_job_leaves_no_debugger_running(kinetic_env: Path) -> None:
    """debugpy's adapter daemonizes, out of the job's process group: cancelling the job
    ends it too (a job that ends by itself ends it on its way out)."""
    job = debugged.run_async(1)
    marker_file = kinetic_env / "storage" / job.job_id / "debug.json"
    wait_until(marker_file.exists, timeout=60)
    helpers = json.loads(marker_file.read_text())["helpers"]
    if not helpers:
        pytest.skip("no private network here: debugpy's adapter is not tracked")
    adapters = [ProcessRef.from_dict(h) for h in helpers]
    assert all(is_alive(ref) for ref in adapters)
    job.cancel()
    for ref in adapters:
        wait_until(lambda ref=ref: not is_alive(ref), timeout=10)


@kinetic.run()
def save_weights() -> str:
    out = Path(os.environ["KINETIC_OUTPUT_DIR"])
    (out / "model-weights.bin").write_bytes(b"weights")
    return str(out)


def test_a_jobs_outputs_stay_private_under_a_root_others_can_read(
    kinetic_env: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A local root made before by hand (``0755``) was accepted, and ``outputs/`` and each
    job's output folder were made with the umask: the other user read the victim's
    ``model-weights.bin``. Every folder Kinetic makes is private, and such a root is
    named in a warning."""
    need_root()
    kinetic_env.mkdir(mode=0o755)
    kinetic_env.chmod(0o755)
    with caplog.at_level("WARNING", logger="kinetic"):
        out = Path(save_weights())
    (warning,) = [r.getMessage() for r in caplog.records if "readable by other" in r.getMessage()]
    assert f"chmod 700 {kinetic_env}" in warning
    weights = out / "model-weights.bin"
    assert weights.read_bytes() == b"weights"
    for folder in (kinetic_env / "outputs", out):
        assert folder.stat().st_mode & 0o077 == 0, oct(folder.stat().st_mode)

    def steal() -> str:
        try:
            return weights.read_text()
        except OSError as exc:
            return type(exc).__name__

    assert as_other_user(steal) == "PermissionError"
