"""The narrow interfaces between job orchestration and the places jobs run.

A backend (:class:`Backend`) observes a single job whose artifacts are in its storage,
and ends it. It also answers what a submission (:mod:`kinetic._engine.submit`,
:mod:`kinetic._engine.batch_submit`) must know of it, without the submission asking
which backend it is: where a job's records and outputs go and how it runs
(:meth:`Backend.placement`), what to check before anything is built or written
(:meth:`Backend.get_ready`), and how a job is launched, in two steps
(:meth:`Backend.prepare_launch`, before anything is written, and :meth:`Launch.start`
once the job's objects are stored: a process for the local backend, Kubernetes
objects for the cluster ones). Batches go to its batch engine
(:class:`BatchRunner`, the backend's ``batch_runner``): it runs a recorded batch,
reports its progress, and answers for one input of it (:meth:`BatchRunner.input_activity`
and the methods after it). Whether a handle is a single job or a batch input is decided
once, by the job engine (:mod:`kinetic._engine.batch_runner`): a backend's single-job
methods are never given a batch input.

Neither unpickles anything: result payloads are the job engine's business. Every
method is a coroutine bounded by a timeout (its own default or an argument) and raises
only Kinetic errors.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple, Protocol, TypeAlias

import anyio

from kinetic._core.status import StatusReport
from kinetic._storage.base import Storage
from runner import protocol

if TYPE_CHECKING:  # annotations only: `import kinetic` loads none of the cluster rules
    from kinetic._core.accelerators import AcceleratorConfig
    from kinetic._core.config import Settings
    from kinetic._core.gke_config import GKEOptions
    from kinetic._core.secret_spec import Secret

StatusCallback = Callable[[StatusReport], Awaitable[None]]

Loaded: TypeAlias = dict[int, tuple[protocol.OutcomeHeader, bytes]]
"""Outcomes read in one pass: input index -> its header and its (pickled) payload."""


@dataclass
class BatchEvents:
    """What one look at a batch (its engine's stream, or its records) taught."""

    done: list[tuple[int, protocol.InputState]] = field(default_factory=list)
    """(index, state) in completion order."""
    running: list[int] = field(default_factory=list)
    snapshot_complete: bool = False
    stop: protocol.StopRecord | None = None
    """The batch's stop record, once it stopped and nothing of it runs any more."""


class JobRef(Protocol):
    """What a backend needs to know about a job (a JobHandle satisfies it)."""

    @property
    def job_id(self) -> str: ...

    @property
    def k8s_name(self) -> str: ...

    @property
    def namespace(self) -> str: ...

    @property
    def group_id(self) -> str | None: ...

    @property
    def group_index(self) -> int | None: ...


@dataclass(frozen=True)
class Placement:
    """What a submission needs to know of its backend: where a job's (or a batch's)
    records and outputs go, and how its jobs run.

    :ivar bucket_name: the handle's storage location (a bucket, or the local storage
        directory); ``cluster_name`` and ``zone`` are the handle's other location fields.
    :ivar outputs: the default outputs folder (a job's own is ``{outputs}/{job_id}``).
    :ivar images: what the images of its jobs' pods are built from (base image,
        registry); None where jobs run on this machine with this interpreter (see
        :attr:`runs_here`).
    :ivar batch_concurrency: a batch's inputs that run at once when ``max_concurrent``
        is not given.
    :ivar pod_chunk: the most inputs in one stored chunk of a batch that runs each
        input in a pod of its own (a pod downloads the chunk holding its input); None
        where a batch never does.
    """

    bucket_name: str
    cluster_name: str
    zone: str
    outputs: str
    images: GKEOptions | None
    batch_concurrency: int
    pod_chunk: int | None = None

    @property
    def runs_here(self) -> bool:
        """Whether jobs run on this machine with this interpreter (the local backend):
        no image is built (the interpreter is checked for the project's requirements
        instead), data is read in place, and volumes are private to the job. Otherwise
        they run in pods of an image, which a batch's manifest describes."""
        return self.images is None

    def output_dir(self, job_id: str) -> str:
        """Job ``job_id``'s default outputs folder."""
        return f"{self.outputs}/{job_id}"


@dataclass(frozen=True)
class NewJob:
    """What a backend needs to get a job ready to launch (:meth:`Backend.prepare_launch`).

    :ivar image: the image its pods run (empty where jobs run with this interpreter).
    :ivar env: the captured variables its process starts with.
    :ivar runner_image: the image Kinetic's runner is delivered from into a custom
        ``image`` (:mod:`kinetic._core.runner_delivery`), else empty.
    :ivar secrets: the Kubernetes Secrets its pods read (a local job's are in its spec).
    """

    job_id: str
    namespace: str
    image: str
    accelerator: AcceleratorConfig
    output_dir: str
    env: Mapping[str, str]
    func_name: str
    runner_image: str = ""
    secrets: tuple[Secret, ...] = ()
    timeout: float | None = None
    """The run-time limit (its runner enforces it; a cluster backend backs it up)."""
    retries: int = 0
    """The ``retries`` count (its runner retries; a cluster backend replaces lost pods)."""


class Launch(Protocol):
    """A job ready to start, made by :meth:`Backend.prepare_launch` before anything is
    written; nothing is kept in the backend between the two steps."""

    def with_gcs_fuse(self, buckets: Iterable[str]) -> Launch:
        """Mount these buckets read-only (``fuse=True`` data) in the job's pods (a job
        that runs here reads its data in place: the same launch)."""
        ...

    async def start(self, job: JobRef) -> None:
        """Start the job. Its spec, payload and handle (``job``) are already stored.

        :raises ConfigError: the job can never start there (a missing namespace).
        :raises BackendError: it could not be started; nothing keeps running then.
        """
        ...


class Backend(Protocol):
    """Runs single jobs and reports on them (never given a batch input: those go to
    the backend's ``batch_runner``, a :class:`BatchRunner`, where it has one)."""

    @property
    def name(self) -> str:
        """``"local"``, ``"gke"`` or ``"pathways"``."""
        ...

    @property
    def storage(self) -> Storage:
        """Where this backend's jobs keep their objects."""
        ...

    @property
    def ended_jobs_hold_resources(self) -> bool:
        """Whether a job that ended still holds something only cancelling releases (a
        Kubernetes object); False where ending releases everything, so cleaning up an
        ended job is deleting its objects."""
        ...

    def placement(self, settings: Settings) -> Placement:
        """Where jobs and batches submitted with ``settings`` go, and how they run. Pure."""
        ...

    async def get_ready(self) -> None:
        """Before a job's (or batch's) image is built or anything is written: check that
        this backend can run it, and settle what its pods run as.

        :raises ConfigError: it cannot (the error says how to fix it).
        :raises BackendError: the cluster failed or could not be reached.
        """
        ...

    def prepare_launch(self, job: NewJob) -> Launch:
        """Get ``job`` ready to launch. Pure: nothing is written or created.

        :raises ConfigError: on a job this backend cannot run.
        """
        ...

    async def status(self, job: JobRef) -> StatusReport:
        """The job's current status, with the reason when it failed or is stuck."""
        ...

    async def wait(self, job: JobRef, on_change: StatusCallback | None = None) -> StatusReport:
        """Wait, without wall-clock polling where an event exists, until the job is terminal.

        ``on_change`` is awaited with each distinct status observed, the first included.
        Cancelling the wait does not affect the job.
        """
        ...

    async def logs(self, job: JobRef, *, tail: int | None = None) -> str:
        """The job's output so far (the last ``tail`` lines when given)."""
        ...

    def follow_logs(self, job: JobRef, finished: anyio.Event | None = None) -> AsyncIterator[str]:
        """Yield output as it is written, from the start, until the job ends.

        ``finished``, when given, is set by a caller that already saw the job end: the
        stream then reads what is left and stops at once.
        """
        ...

    async def cancel(self, job: JobRef) -> None:
        """End the job if it is still running. Idempotent."""
        ...

    async def read_result(self, job: JobRef) -> bytes:
        """The job's pickled result payload.

        :raises ObjectNotFoundError: when the job has not recorded one.
        """
        ...

    async def delete_objects(self, job: JobRef) -> None:
        """Delete what the job stored. Shared, content-addressed artifacts are kept."""
        ...

    async def list_job_ids(self) -> list[str]:
        """Ids of the jobs this backend knows (live or recorded)."""
        ...

    async def aclose(self) -> None:
        """Release connections and background watches."""
        ...


class InputActivity(NamedTuple):
    """What a batch engine sees of an input its records do not settle yet.

    :ivar running: the input, or its batch's engine, is at work.
    :ivar waiting: why a running batch cannot start the input yet, or None.
    """

    running: bool
    waiting: str | None = None


class BatchRunner(Protocol):
    """Runs batches recorded in :attr:`storage`, reports their progress, and answers
    for one input of them (the input's outcome and the batch's stop record are read
    with :meth:`load_many` and :meth:`read_stop`; the rest is engine-specific)."""

    @property
    def storage(self) -> Storage: ...

    async def launch(self, group_id: str) -> None:
        """Make sure the (durably recorded) batch gets driven. Idempotent."""
        ...

    def follow(self, group_id: str, known: Collection[int]) -> AsyncIterator[BatchEvents]:
        """Drive or follow the batch: yield what finished (inputs not in ``known``, a live
        view of the caller's records), the running inputs, and the stop record once it
        stopped with nothing left running. Endless: the caller stops iterating when
        every input is accounted for. Cancelling it never affects the batch."""
        ...

    async def snapshot(self, group_id: str, known: Collection[int]) -> BatchEvents:
        """One look at the batch, without driving it. ``snapshot_complete`` means
        ``running`` is the whole set of running inputs."""
        ...

    async def load_many(self, group_id: str, indices: list[int]) -> Loaded:
        """Headers and payloads of the given inputs that have outcomes."""
        ...

    async def cancel(self, group_id: str) -> None:
        """Stop the batch: no queued input starts, running ones end. On return every
        input is accounted for (an outcome, or the stop record)."""
        ...

    async def release(self, group_id: str) -> None:
        """Free the compute objects a finished batch leaves behind (cleanup)."""
        ...

    # -- one input (``job``: a handle with ``group_id`` and ``group_index`` set) ------

    async def read_stop(self, group_id: str) -> protocol.StopRecord | None:
        """The batch's stop record, or None while it has none."""
        ...

    async def input_activity(self, job: JobRef) -> InputActivity:
        """Whether the input (of a recorded batch, without an outcome) is at work."""
        ...

    async def input_changed(self, job: JobRef) -> None:
        """Return once the input may have changed state (driving its batch, where the
        engine is driven by its consumers). Cancelling it never affects the batch."""
        ...

    async def input_logs(self, job: JobRef) -> str:
        """The input's output so far (or all of it, once it ended)."""
        ...

    async def cancel_input(self, job: JobRef) -> None:
        """End the input, which has no outcome yet: record it cancelled (unless an
        outcome stands meanwhile) and stop its run."""
        ...


def input_index(job: JobRef) -> int:
    """The index of batch input ``job`` in its batch.

    :raises ValueError: when ``job`` has none.
    """
    index = job.group_index
    if index is None:
        raise ValueError(f"job {job.job_id} belongs to a batch but has no index")
    return index
