"""The dashboard: jobs and batches in a browser, served on ``127.0.0.1`` behind a token.

From a shell, ``kinetic dashboard`` (it prints the URL). From an async application::

    async with anyio.create_task_group() as tg:
        dashboard = await tg.start(kinetic.dashboard.serve)
        print(dashboard.url)          # http://127.0.0.1:PORT/?t=TOKEN
        ...
        tg.cancel_scope.cancel()      # stops it

:func:`serve` is the async original; :func:`run` blocks on Kinetic's loop thread until
interrupted (what the command runs). See docs/dashboard.md.
"""

from __future__ import annotations

from collections.abc import Callable

from kinetic._dashboard import Dashboard, serve

__all__ = ["Dashboard", "run", "serve"]


def run(
    *,
    port: int = 0,
    token: str | None = None,
    backend: str | None = None,
    project: str | None = None,
    zone: str | None = None,
    cluster: str | None = None,
    namespace: str | None = None,
    on_ready: Callable[[Dashboard], object] | None = None,
) -> None:
    """Serve the dashboard until Ctrl-C (blocking); ``on_ready`` is called with the
    :class:`Dashboard` once it listens. Parameters as :func:`serve`.

    :raises KeyboardInterrupt: on Ctrl-C, after the server stopped.
    """
    import anyio

    from kinetic._core.exception_groups import one_error
    from kinetic._sync.portal import call

    async def main() -> None:
        # A ConfigError or a port in use reaches the caller as itself, not in a group.
        with one_error():
            async with anyio.create_task_group() as tg:
                dashboard: Dashboard = await tg.start(
                    lambda task_status: serve(
                        port=port,
                        token=token,
                        backend=backend,
                        project=project,
                        zone=zone,
                        cluster=cluster,
                        namespace=namespace,
                        task_status=task_status,
                    )
                )
                if on_ready is not None:
                    on_ready(dashboard)

    call(main)
