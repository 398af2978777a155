"""Google access tokens for Cloud Build and Artifact Registry, from the Google auth
library (gcloud-aio-auth: Application Default Credentials), never hand-rolled."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any, cast

import anyio
import anyio.to_thread

from kinetic._exceptions import BackendError
from kinetic._http import TokenSource

CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
_GOOGLE_REGISTRY_SUFFIXES = ("-docker.pkg.dev", "gcr.io")

log = logging.getLogger(__name__)


BUILD_APIS = "Cloud Build / Artifact Registry"
"""What the images' tokens are for (the default purpose named when there are none)."""


@contextlib.asynccontextmanager
async def google_token_source(purpose: str = BUILD_APIS) -> AsyncIterator[TokenSource]:
    """A token source for the cloud-platform scope (Application Default Credentials:
    ``GOOGLE_APPLICATION_CREDENTIALS``, gcloud's user credentials, or the metadata
    server), whose session is closed on exit. Needs the asyncio backend.

    :param purpose: the APIs the tokens are for, named when there are no credentials.

    :raises BackendError: no credentials could be found (on entry) or refreshed (from
        the source).
    """
    import aiohttp
    from gcloud.aio.auth import Token  # imported late: only these paths need it

    from kinetic._net import tls_closing_connector, trust_context

    # The token endpoint is reached with the one trust configuration (kinetic._net),
    # on a session of ours: the library's own would trust aiohttp's default context.
    await anyio.to_thread.run_sync(trust_context)  # built once, off the loop
    session = aiohttp.ClientSession(connector=tls_closing_connector())
    try:
        # The constructor reads the credentials file: not on the event loop.
        token = await anyio.to_thread.run_sync(
            # cast: the library's annotation names requests' Session (its REST build's).
            lambda: Token(scopes=[CLOUD_PLATFORM_SCOPE], session=cast(Any, session))
        )
    except Exception as exc:  # the auth library raises many kinds; translated here
        with anyio.CancelScope(shield=True):
            await session.close()
        raise _no_credentials(purpose, exc) from exc

    async def get() -> str:
        try:
            return await token.get() or ""
        except Exception as exc:
            raise _no_credentials(purpose, exc) from exc

    try:
        yield get
    finally:
        # Closing is cleanup: the caller's own outcome stands whatever happens here.
        with anyio.CancelScope(shield=True):
            try:
                await token.close()  # a session it was given stays open: ours, below
                await session.close()
            except Exception as exc:  # noqa: BLE001
                log.debug("closing the Google auth session failed: %s", exc)


def _no_credentials(purpose: str, exc: BaseException) -> BackendError:
    return BackendError(
        f"no usable Google credentials for {purpose} ({exc}); run "
        "`gcloud auth application-default login` or set GOOGLE_APPLICATION_CREDENTIALS"
    )


def is_google_registry(host: str) -> bool:
    """Whether ``host`` is Artifact Registry or Container Registry (Google tokens work)."""
    return host.endswith(_GOOGLE_REGISTRY_SUFFIXES)


async def google_registry_credentials() -> tuple[str, str]:
    """Basic credentials Google registries accept at their token service.

    :raises BackendError: no usable credentials.
    """
    async with google_token_source() as get:
        return "oauth2accesstoken", await get()
