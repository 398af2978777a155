"""``python -m runner.pool --storage gs://BUCKET --group GID``: a pool worker
(:class:`runner.pool.worker.Worker`); a coordinated pool's when the batch's token is in
its environment (:mod:`runner.pool.coordinator.worker`)."""

import os
import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from runner.job import parse_args
from runner.pool.coordinator.wire import TOKEN_ENV
from runner.pool.counting import CountingStore
from runner.pool.pod_env import worker_ordinal
from runner.pool.worker import Worker
from runner.scratch import scratch_dir
from runner.store import RunnerStore, open_store


def main(argv: Sequence[str] | None = None) -> int:
    """Run this pod's worker; its exit status."""
    args = parse_args(sys.argv[1:] if argv is None else argv, set())
    if not isinstance(args.get("storage"), str) or not isinstance(args.get("group"), str):
        raise SystemExit("usage: python -m runner.pool --storage URL --group GROUP_ID")
    name = os.environ.get("KINETIC_WORKER") or f"{socket.gethostname()}-{os.getpid()}"
    make: Callable[[RunnerStore, str, str, Path, int | None], Worker] = Worker
    if os.environ.get(TOKEN_ENV):
        from runner.pool.coordinator.worker import coordinated_worker

        make = coordinated_worker
    store = CountingStore(open_store(str(args["storage"])))
    try:
        with scratch_dir("worker") as workdir:
            return make(store, str(args["group"]), name, workdir, worker_ordinal()).run()
    finally:
        store.close()


if __name__ == "__main__":
    sys.exit(main())
