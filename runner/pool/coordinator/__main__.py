"""``python -m runner.pool.coordinator --storage URL --group GID --host ADDRESS``: a
coordinated pool's coordinator (:class:`runner.pool.coordinator.server.Server`), the
batch's token in :data:`~runner.pool.coordinator.wire.TOKEN_ENV`."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Sequence

from runner.pool.coordinator.server import CoordinatorError, Server, token_from_env
from runner.store import open_store


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runner.pool.coordinator")
    parser.add_argument("--storage", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--host", required=True, help="the address to listen on")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--advertise", help="the address workers connect to (default: --host)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        token = token_from_env()
    except CoordinatorError as e:
        print(f"kinetic coordinator: {e}", file=sys.stderr, flush=True)
        return 2
    store = open_store(args.storage)
    server = Server(store, args.group, token, readers=lambda: open_store(args.storage))

    async def run() -> int:
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, server.terminate)
        return await server.serve(args.host, args.port, args.advertise or args.host)

    try:
        return asyncio.run(run())
    except CoordinatorError as e:
        print(f"kinetic coordinator: {e}", file=sys.stderr, flush=True)
        return 2
    finally:
        server.close()
        store.close()


if __name__ == "__main__":
    sys.exit(main())
