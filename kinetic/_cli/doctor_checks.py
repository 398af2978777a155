"""The IO side of ``kinetic doctor``: one small coroutine per check.

Theory of operation
-------------------
:func:`run_checks` resolves the settings once and checks the local root; for a
cluster backend it then reads the kubeconfig, runs the API server (when the
kubeconfig is usable), bucket, registry and builder checks concurrently in one task
group, and last what needs a reachable API server (namespace, then service account
and LeaderWorkerSet CRD); where jobs reach Google Cloud for real, the Google side
of the pods' identity (:mod:`kinetic._cli.doctor_identity`). A check that an earlier
failure makes meaningless is ``skip``. Every check runs under ``anyio.fail_after(timeout)``
and turns its own failure into a ``fail`` result: one broken piece never hides
the others, and nothing here raises. Blocking work (reading the kubeconfig,
touching files) runs in worker threads. The clients opened here (one Kubernetes
client, one GCS store) are closed before :func:`run_checks` returns.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from kinetic._cli.doctor_result import CheckResult, fail, ok, skip, warn
from kinetic._core.config import Settings
from kinetic._exceptions import BackendError, ConfigError, KineticError
from runner.fs import check_private_dir, make_private_dirs

if TYPE_CHECKING:
    from kinetic._core.kubeconfig import ContextRef

PACKAGES = (
    "anyio",
    "aiohttp",
    "cloudpickle",
    "gcloud-aio-storage",
    "gcloud-aio-auth",
    "pyyaml",
    "tenacity",
    "rich",
    "packaging",
    "pathspec",
)
"""Distributions Kinetic imports at run time."""
_SHOWN_PACKAGES = ("cloudpickle", "anyio", "aiohttp", "gcloud-aio-storage")
"""Those whose versions the report names (every one is checked)."""
MIN_PYTHON = (3, 11)
LWS_CRD = "leaderworkersets.leaderworkerset.x-k8s.io"
LWS_INSTALL = (
    "install LeaderWorkerSet: kubectl apply --server-side -f "
    "https://github.com/kubernetes-sigs/lws/releases/download/v0.6.2/manifests.yaml"
)
_PROBE_PREFIX = "_kinetic_doctor/"

Check = Callable[[], Awaitable[CheckResult]]
Named = tuple[str, str, Check]
"""A check: its name, the hint shown when it runs out of time, and the coroutine."""

_CLUSTER_HINT = "check the kubeconfig's server and credentials, and that the cluster is up"
_BUCKET_HINT = (
    "check the credentials (gcloud auth application-default login) and the network; "
    "STORAGE_EMULATOR_HOST points at an emulator"
)
_BUILDER_HINT = (
    "Docker: is the daemon behind DOCKER_HOST running? Cloud Build: "
    "gcloud auth application-default login"
)


# --------------------------------------------------------------------------- pure parts


def python_result(version: tuple[int, int, int]) -> CheckResult:
    """Whether this Python can run Kinetic. Pure."""
    text = ".".join(map(str, version))
    if version[:2] >= MIN_PYTHON:
        return ok("python", f"Python {text} ({sys.executable})")
    need = ".".join(map(str, MIN_PYTHON))
    return fail("python", f"Python {text}", f"use Python >= {need}")


def packages_result(kinetic_version: str, versions: Mapping[str, str | None]) -> CheckResult:
    """Kinetic's version and its run-time dependencies (None: not installed). Pure."""
    missing = sorted(name for name, v in versions.items() if v is None)
    shown = [n for n in _SHOWN_PACKAGES if versions.get(n)]
    found = ", ".join(f"{n} {versions[n]}" for n in shown)
    found += f" ({len(versions)} dependencies present)"
    if missing:
        return fail(
            "packages",
            f"kinetic {kinetic_version}; missing: {', '.join(missing)}",
            "reinstall Kinetic in this environment (pip install kinetic-aio)",
        )
    return ok("packages", f"kinetic {kinetic_version}; {found}")


def kubeconfig_result(
    path: str,
    contexts: list[str] | None,
    active: ContextRef | None,
    *,
    in_cluster: bool,
    error: str | None = None,
    settings: Settings | None = None,
) -> CheckResult:
    """The kubeconfig: present, parseable, with a current context. Pure.

    :param contexts: the names of the file's contexts (None: no file).
    :param active: the current context (None: none set).
    :param in_cluster: a pod's service account is available instead.
    """
    get_creds = "gcloud container clusters get-credentials CLUSTER --zone ZONE --project PROJECT"
    if settings is not None and settings.project:
        get_creds = (
            f"gcloud container clusters get-credentials {settings.cluster} "
            f"--zone {settings.zone} --project {settings.project}"
        )
    if error is not None:
        return fail("kubeconfig", f"{path}: {error}", f"fix or regenerate it: {get_creds}")
    if contexts is None:
        if in_cluster:
            return ok("kubeconfig", "no kubeconfig; in-cluster service account")
        return fail("kubeconfig", f"no kubeconfig at {path}", f"{get_creds}, or set KUBECONFIG")
    if active is None:
        return fail(
            "kubeconfig",
            f"{path}: no current context (contexts: {', '.join(contexts) or 'none'})",
            "kubectl config use-context NAME",
        )
    where = f"cluster {active.cluster}"
    if active.namespace:
        where += f", namespace {active.namespace}"
    return ok("kubeconfig", f"{path}: context {active.name} ({where})")


def crd_result(present: bool, backend: str) -> CheckResult:
    """The LeaderWorkerSet CRD: required by ``pathways``, optional otherwise. Pure."""
    if present:
        return ok("lws-crd", f"{LWS_CRD} installed")
    detail = f"{LWS_CRD} is not installed (multi-host TPU jobs with backend='pathways' need it)"
    if backend == "pathways":
        return fail("lws-crd", detail, LWS_INSTALL)
    return warn("lws-crd", detail, LWS_INSTALL)


# --------------------------------------------------------------------------- running


@dataclass
class _Env:
    settings: Settings
    env: dict[str, str]
    timeout: float
    kube: Any = None  # KubeClient, opened when the backend is a cluster
    storage: Any = None  # GCSStorage on the jobs bucket
    pods_account: tuple[str, str | None] | None = None  # (name, its Google account)


async def run_checks(arguments: Mapping[str, str | None], timeout: float) -> list[CheckResult]:
    """Run every check (see the module docstring); never raises a check's failure."""
    from kinetic._settings import load_settings_explained

    results: list[CheckResult] = [
        python_result(sys.version_info[:3]),
        packages_result(_kinetic_version(), _versions(PACKAGES)),
    ]
    try:
        settings, rows = load_settings_explained(**arguments)
    except KineticError as exc:
        results.append(
            fail("settings", str(exc), "see `kinetic config show`; fix the profile or variable")
        )
        results.append(skip("cluster", "the settings could not be resolved"))
        return results
    profile = next((r.detail for r in rows if r.source == "profile"), None)
    where = ", ".join(
        f"{r.name} {r.value}"
        for r in rows
        if r.name in ("backend", "project", "cluster", "namespace") and r.value
    )
    results.append(ok("settings", where + (f" ({profile})" if profile else "")))
    ctx = _Env(settings=settings, env=dict(os.environ), timeout=timeout)
    try:
        results += await _gather(ctx, [_local_root(ctx)])
        if settings.backend == "local":
            results.append(
                skip("cluster", "backend is local (pass --backend gke to check a cluster)")
            )
            return results
        from kinetic._backends.gke.client import KubeClient
        from kinetic._core.kube_context import OVERRIDE_ENV, gke_context_name

        # The cluster the jobs would go to: the same context choice as the backend's.
        ctx.kube = KubeClient(
            cluster_context=gke_context_name(settings.project, settings.zone, settings.cluster),
            context_override=os.environ.get(OVERRIDE_ENV) or None,
            attempts=2,
            backoff=0.1,
        )
        kubeconfig = await _gather(ctx, [_kubeconfig(ctx)])
        results += kubeconfig
        # Without a usable kubeconfig the API server cannot be asked (and the client
        # library would only print its own complaint).
        cluster = [_cluster(ctx)] if kubeconfig[0].level == "ok" else []
        first = await _gather(ctx, [*cluster, _bucket(ctx), _registry(ctx), _builder(ctx)])
        if not cluster:
            first.insert(0, skip("cluster", "no usable kubeconfig"))
        results += first
        if any(r.name == "cluster" and r.level == "ok" for r in first):
            ns_result = await _gather(ctx, [_namespace(ctx)])
            results += ns_result
            later = [_crd(ctx)]
            if ns_result[0].level == "ok":
                later.insert(0, _service_account(ctx))
            else:
                results.append(skip("service-account", "the namespace is missing"))
            results += await _gather(ctx, later)
            from kinetic._cli.doctor_identity import workload_identity_applies

            if workload_identity_applies(settings, ctx.env):
                results += await _google_identity(ctx)
        else:
            for name in ("namespace", "service-account", "lws-crd"):
                results.append(skip(name, "the API server is not reachable"))
    finally:
        with anyio.CancelScope(shield=True):
            if ctx.kube is not None:
                await ctx.kube.aclose()
            if ctx.storage is not None:
                await ctx.storage.aclose()
    return results


async def _gather(ctx: _Env, checks: list[Named]) -> list[CheckResult]:
    """Run ``checks`` concurrently, each bounded; results in the order given."""
    out: list[CheckResult | None] = [None] * len(checks)

    async def one(i: int, name: str, hint: str, check: Check) -> None:
        try:
            with anyio.fail_after(ctx.timeout):
                out[i] = await check()
        except TimeoutError:
            out[i] = fail(name, f"no answer within {ctx.timeout:g}s", hint)
        except Exception as exc:  # noqa: BLE001 - a check's failure is its result
            out[i] = fail(name, f"{type(exc).__name__}: {exc}", hint)

    async with anyio.create_task_group() as tg:
        for i, (name, hint, check) in enumerate(checks):
            tg.start_soon(one, i, name, hint, check)
    return [r for r in out if r is not None]


def _kinetic_version() -> str:
    from kinetic._version import __version__

    return __version__


def _versions(names: tuple[str, ...]) -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for name in names:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


# --------------------------------------------------------------------------- checks


def _local_root(ctx: _Env) -> Named:
    root = Path(ctx.settings.local_root)

    def probe() -> None:
        make_private_dirs(root)  # as the local backend makes it: 0700
        path = root / f".doctor-{uuid.uuid4().hex}"
        path.write_bytes(b"ok")
        path.unlink()

    async def check() -> CheckResult:
        level = fail if ctx.settings.backend == "local" else warn
        scope = "" if ctx.settings.backend == "local" else " (local backend only)"
        try:
            await anyio.to_thread.run_sync(check_private_dir, root)
        except PermissionError as exc:  # another user's, or theirs to write (security.md)
            hint = f"chmod 700 {root}, or set KINETIC_LOCAL_ROOT to a directory of yours"
            return level("local-root", f"{root} is not private: {exc}{scope}", hint)
        except OSError:
            pass  # unreadable: the probe below says why
        try:
            await anyio.to_thread.run_sync(probe)
        except OSError as exc:
            hint = "set KINETIC_LOCAL_ROOT to a writable directory"
            return level("local-root", f"{root} is not writable: {exc}{scope}", hint)
        return ok("local-root", f"{root} is writable, and private")

    return "local-root", "is the local root on a slow or hung file system?", check


def _kubeconfig(ctx: _Env) -> Named:
    from kinetic._core.kubeconfig import config_paths

    paths = config_paths(ctx.env, str(Path.home()))
    path = os.pathsep.join(paths)  # a KUBECONFIG list is merged, as kubectl does
    in_cluster = bool(ctx.env.get("KUBERNETES_SERVICE_HOST"))

    def read() -> tuple[list[str] | None, ContextRef | None, str | None]:
        from kinetic._backends.gke.endpoint import read_kubeconfig
        from kinetic._core import kubeconfig

        if not any(os.path.exists(p) for p in paths):
            return None, None, None
        try:
            config, _ = read_kubeconfig(paths)
            names, current = kubeconfig.list_contexts(config)
            if current is None:
                return names, None, None
            return names, kubeconfig.context_ref(config, current), None
        except ConfigError as exc:
            return None, None, str(exc)

    async def check() -> CheckResult:
        contexts, active, error = await anyio.to_thread.run_sync(read)
        return kubeconfig_result(
            path, contexts, active, in_cluster=in_cluster, error=error, settings=ctx.settings
        )

    return "kubeconfig", "is the kubeconfig on a slow or hung file system?", check


def _cluster(ctx: _Env) -> Named:
    async def check() -> CheckResult:
        try:
            version = await ctx.kube.get("/version", what="get /version", timeout=ctx.timeout)
        except KineticError as exc:
            return fail("cluster", str(exc), _CLUSTER_HINT)
        text = (version or {}).get("gitVersion", "unknown version")
        return ok("cluster", f"Kubernetes {text} answers")

    return "cluster", _CLUSTER_HINT, check


def _namespace(ctx: _Env) -> Named:
    ns = ctx.settings.namespace

    async def check() -> CheckResult:
        found = await ctx.kube.read_namespace(ns, timeout=ctx.timeout)
        if found is None:
            return fail(
                "namespace",
                f"namespace {ns!r} does not exist",
                f"kubectl create namespace {ns} (or choose another: --namespace / "
                "KINETIC_NAMESPACE)",
            )
        return ok("namespace", f"namespace {ns} exists")

    return "namespace", _CLUSTER_HINT, check


def _service_account(ctx: _Env) -> Named:
    from kinetic._cli import doctor_identity as di
    from kinetic._infra.identity import account_id, email

    ns = ctx.settings.namespace
    explicit = ctx.env.get("KINETIC_GKE_SERVICE_ACCOUNT")
    project = ctx.settings.project
    gsa = email(project, account_id(ctx.settings.cluster, ns)) if project else None

    async def read(name: str) -> Any:
        return await ctx.kube.get(
            f"/api/v1/namespaces/{ns}/serviceaccounts/{name}",
            what=f"get service account {ns}/{name}",
            timeout=ctx.timeout,
        )

    async def check() -> CheckResult:
        # The GKE backend's own choice (kinetic._backends.gke.pod_identity).
        name = explicit or di.UP_ACCOUNT
        found = await read(name)
        if found is None and not explicit:
            name = "default"
            found = await read(name)
        if found is not None:
            ctx.pods_account = (name, di.annotation(found))
        return di.service_account_result(
            ns,
            name,
            found,
            explicit=bool(explicit),
            workload_identity=di.workload_identity_applies(ctx.settings, ctx.env),
            gsa=gsa,
        )

    return "service-account", _CLUSTER_HINT, check


async def _google_identity(ctx: _Env) -> list[CheckResult]:
    """The Google side of the pods' identity (see :mod:`kinetic._cli.doctor_identity`)."""
    from kinetic._cli import doctor_identity as di
    from kinetic._images.gauth import google_token_source
    from kinetic._infra.google_rest import GoogleRest

    names = ("google-service-account", "bucket-access", "registry-access")
    if ctx.pods_account is None:
        return []
    ksa, gsa = ctx.pods_account
    if gsa is None:  # not bound to a Google account: the service-account check says so
        return []
    hint = "gcloud auth application-default login (the checks read IAM policies)"
    try:
        with anyio.fail_after(ctx.timeout * 3):
            async with google_token_source() as token, GoogleRest(token, attempts=2) as rest:
                nodes = await di.node_accounts_of(ctx.settings, rest, token, ctx.timeout)
                return await di.google_checks(
                    rest, ctx.settings, ksa=ksa, gsa=gsa, node_accounts=nodes, timeout=ctx.timeout
                )
    except TimeoutError:
        return [fail(n, f"no answer within {ctx.timeout * 3:g}s", hint) for n in names]
    except KineticError as exc:
        return [warn(n, f"not checked: {exc}", hint) for n in names]


def _crd(ctx: _Env) -> Named:
    async def check() -> CheckResult:
        found = await ctx.kube.get(
            f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{LWS_CRD}",
            what=f"get CRD {LWS_CRD}",
            timeout=ctx.timeout,
        )
        return crd_result(found is not None, ctx.settings.backend)

    return "lws-crd", _CLUSTER_HINT, check


def _bucket(ctx: _Env) -> Named:
    async def check() -> CheckResult:
        from kinetic._storage.gcs import GCSStorage

        try:
            bucket = ctx.settings.bucket_name
        except KineticError as exc:
            return fail("bucket", str(exc), "set a project: --project or KINETIC_PROJECT")
        hint = (
            f"create it: gcloud storage buckets create gs://{bucket} "
            f"--project {ctx.settings.project} --location {ctx.settings.region}; "
            "check the credentials (gcloud auth application-default login)"
        )
        ctx.storage = store = GCSStorage(bucket, attempts=2, backoff=0.1)
        key = f"{_PROBE_PREFIX}{uuid.uuid4().hex}"
        try:
            await store.write(key, b"kinetic doctor", timeout=ctx.timeout)
            back = await store.read(key, timeout=ctx.timeout)
            await store.delete(key, timeout=ctx.timeout)
        except KineticError as exc:
            return fail("bucket", str(exc), hint)
        if back != b"kinetic doctor":
            return fail("bucket", f"gs://{bucket} returned other bytes than written", hint)
        return ok("bucket", f"gs://{bucket} is readable and writable")

    return "bucket", _BUCKET_HINT, check


def _registry(ctx: _Env) -> Named:
    async def check() -> CheckResult:
        from kinetic._core import image_spec
        from kinetic._images.runner_image import registry_of

        try:
            registry = ctx.env.get("KINETIC_IMAGE_REGISTRY") or ctx.settings.default_registry
        except KineticError as exc:
            return fail("registry", str(exc), "set KINETIC_IMAGE_REGISTRY")
        probe = f"{registry}/kinetic-doctor-probe:absent"
        try:
            _, name, tag = image_spec.parse_image_uri(probe)
            # Any answer about a tag that does not exist proves the registry is there.
            await registry_of(probe).has_tag(name, tag, timeout=ctx.timeout)
        except KineticError as exc:
            return fail(
                "registry",
                str(exc),
                "check KINETIC_IMAGE_REGISTRY, or create the Artifact Registry repository: "
                "kinetic up, or gcloud artifacts repositories create kinetic "
                f"--repository-format=docker --location {ctx.settings.region}",
            )
        return ok("registry", f"{registry} answers")

    return "registry", "is the registry reachable from here (network, proxy)?", check


def _builder(ctx: _Env) -> Named:
    async def check() -> CheckResult:
        from kinetic._images.builder import choose_builder

        try:
            name = choose_builder(ctx.settings.builder, project=ctx.settings.project, env=ctx.env)
        except KineticError as exc:
            return fail("builder", str(exc), "KINETIC_BUILDER must be docker or cloudbuild")
        if name == "docker":
            return await _docker(ctx)
        return await _cloud_build(ctx)

    return "builder", _BUILDER_HINT, check


async def _docker(ctx: _Env) -> CheckResult:
    from kinetic._http import HttpClient
    from kinetic._images.docker import docker_socket

    hint = (
        "start Docker or point DOCKER_HOST=unix:///path at its socket "
        "(or build with Cloud Build: KINETIC_BUILDER=cloudbuild)"
    )
    try:
        socket = docker_socket(ctx.env.get("DOCKER_HOST"))
    except KineticError as exc:
        return fail("builder", str(exc), hint)
    try:
        async with HttpClient(
            error=BackendError,
            prefix=f"Docker Engine at {socket}: ",
            base_url="http://docker",
            unix_socket=socket,
            attempts=1,
        ) as http:
            reply = await http.request(
                "GET", "/_ping", what="ping", answer=lambda reply: reply, timeout=ctx.timeout
            )
    except KineticError as exc:
        return fail("builder", str(exc), hint)
    if reply.status != 200:
        return fail("builder", f"Docker Engine at {socket} answered HTTP {reply.status}", hint)
    api = reply.headers.get("api-version", "?")
    return ok("builder", f"docker: Docker Engine at {socket} (API {api})")


async def _cloud_build(ctx: _Env) -> CheckResult:
    from kinetic._images.gauth import google_token_source

    try:
        async with google_token_source() as token:
            await token()
    except KineticError as exc:
        return fail("builder", f"cloudbuild: {exc}", "gcloud auth application-default login")
    return ok("builder", f"cloudbuild in project {ctx.settings.project} (credentials found)")
