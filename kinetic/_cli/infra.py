"""``kinetic up`` / ``down`` / ``status`` / ``pool ...``: set up a cluster for Kinetic.

    kinetic [--project P --zone Z --cluster C --namespace N] up [--use-kubeconfig]
        [--service-account SA] [--no-bucket] [--no-lws-crd]
        [--accelerator A [--min-nodes N] [--max-nodes M] [--spot]] [--timeout S] [--json]
    kinetic [...] down [--use-kubeconfig] [--keep-cluster] [--yes] [--timeout S] [--json]
    kinetic [...] status [--use-kubeconfig] [--timeout S] [--json]
    kinetic [...] pool add --accelerator A [--min-nodes N] [--max-nodes M] [--spot]
        [--name NAME] [--machine-type T] [--timeout S]
    kinetic [...] pool list [--json]
    kinetic [...] pool remove (NAME | --accelerator A [--spot]) [--yes] [--timeout S]

**Where.** With a GCP project configured (and no ``--use-kubeconfig``), the cluster is
the GKE cluster ``--cluster`` in ``--zone`` of ``--project``: ``up`` creates it when
absent (through the Container API; ``down`` deletes it only if ``up`` created it), and
its in-cluster part talks to it with a short-lived kubeconfig made from the API's
answer and a Google token. With ``--use-kubeconfig`` or no project, the cluster is the
kubeconfig's current context (any Kubernetes: kind, k3d, the testbed), and no GKE call
is made. ``pool`` commands are GKE's only.

**What.** In the cluster: the namespace, the pods' service account, a Role and a
RoleBinding, the LeaderWorkerSet CRD; beside it, the jobs bucket
``{project}-kn-{cluster}-jobs`` (when a project is set). On GKE also the Artifact
Registry repository ``{region}-docker.pkg.dev/{project}/kinetic``, a Google service
account the pods act as through Workload Identity (the service account's
``iam.gke.io/gcp-service-account`` annotation), with object access on the bucket and
read access on the repository, and the node pools' pull access to the repository
(:mod:`kinetic._infra.identity`). See :mod:`kinetic._infra.plan` for what is
recorded and why ``down`` removes exactly that.

Long steps report progress on stderr. ``down`` and ``pool remove`` list what they will
delete and ask first, unless ``--yes`` (required when stdin is not a terminal: exit
2). Exit status: 0 done (``status``: everything is there), 1 failed (``status``:
something is missing), 2 bad usage or configuration, 3 no such node pool, 4 a GKE
operation outlasted ``--timeout`` (it goes on), 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from kinetic._cli._output import (
    EXIT_FAILED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_USAGE,
    emit_json,
    report_error,
    table,
)
from kinetic._exceptions import ConfigError, KineticError

DEFAULT_TIMEOUT = 1800.0
"""Seconds a GKE operation may take (creating a cluster takes 5-10 minutes)."""
STEP_TIMEOUT = 60.0


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``up``, ``down``, ``status`` and ``pool``."""

    def where(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--use-kubeconfig",
            action="store_true",
            help="set up the kubeconfig's current cluster; make no GKE call",
        )
        p.add_argument(
            "--timeout",
            type=float,
            default=DEFAULT_TIMEOUT,
            help=f"seconds a GKE operation may take (default: {DEFAULT_TIMEOUT:g})",
        )

    def plan_flags(p: argparse.ArgumentParser) -> None:
        # As the original's: --yes answers its question (up and pool add ask none);
        # --preview prints the plan and changes nothing.
        p.add_argument("-y", "--yes", action="store_true", help="do not ask first")
        p.add_argument("--preview", action="store_true", help="print the plan; change nothing")

    def nodes(p: argparse.ArgumentParser, *, required: bool) -> None:
        p.add_argument("--accelerator", required=required, help="an accelerator of the catalog")
        p.add_argument("--min-nodes", type=int, help="autoscaling lower bound (default 0)")
        p.add_argument("--max-nodes", type=int, help="autoscaling upper bound (default 1)")
        p.add_argument("--spot", action="store_true", help="spot VMs")

    up = sub.add_parser(
        "up",
        help="set up the cluster, namespace, service account, RBAC, LWS CRD and bucket",
        description="Create what Kinetic needs and is missing; record it for `down`.",
    )
    where(up)
    up.add_argument(
        "--service-account",
        help="the pods' service account (default: KINETIC_GKE_SERVICE_ACCOUNT, else kinetic)",
    )
    up.add_argument("--no-bucket", action="store_true", help="do not create the jobs bucket")
    up.add_argument("--no-lws-crd", action="store_true", help="do not install the LWS CRD")
    nodes(up, required=False)
    up.add_argument("--json", action="store_true", help="one JSON object on stdout")
    plan_flags(up)

    down = sub.add_parser(
        "down",
        help="remove exactly what `kinetic up` created",
        description="Remove what `kinetic up` recorded; leave everything else alone.",
    )
    where(down)
    down.add_argument("--keep-cluster", action="store_true", help="keep the GKE cluster")
    down.add_argument("-y", "--yes", action="store_true", help="do not ask first")
    down.add_argument("--json", action="store_true", help="one JSON object on stdout")

    status = sub.add_parser(
        "status",
        help="what exists: cluster, pools, namespace, service account, RBAC, CRD, bucket",
        description="Show what exists of what `kinetic up` sets up.",
    )
    where(status)
    status.add_argument("--json", action="store_true", help="one JSON object on stdout")

    pool = sub.add_parser("pool", help="GKE node pools", description="GKE node pools.")
    pools = pool.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = pools.add_parser("add", help="add a node pool for an accelerator")
    nodes(add, required=True)
    add.add_argument("--name", help="pool name (default: from the accelerator)")
    add.add_argument("--machine-type", help="override the catalog's machine type")
    add.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT)
    plan_flags(add)
    listing = pools.add_parser("list", help="list the node pools")
    listing.add_argument("--json", action="store_true", help="one JSON object on stdout")
    remove = pools.add_parser("remove", help="delete a node pool")
    remove.add_argument("name", nargs="?", help="pool name")
    remove.add_argument("--accelerator", help="the pool made for this accelerator")
    remove.add_argument("--spot", action="store_true")
    remove.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT)
    plan_flags(remove)


def run(ns: argparse.Namespace) -> int:
    """Run ``up``/``down``/``status``/``pool``; return the exit status."""
    handler: Callable[[argparse.Namespace], int] = {
        "up": _up,
        "down": _down,
        "status": _status,
        "pool": _pool,
    }[ns.group]
    try:
        return handler(ns)
    except KineticError as exc:
        return report_error(exc)


# --------------------------------------------------------------------------- shared


def progress(message: str) -> None:
    """One progress line on stderr."""
    print(f"kinetic: {message}", file=sys.stderr, flush=True)


@dataclass
class _Target:
    settings: Any  # kinetic._core.config.Settings
    gke: bool
    spec: Any  # kinetic._infra.plan.SetupSpec


def _target(ns: argparse.Namespace, *, bucket: bool = True, lws_crd: bool = True) -> _Target:
    from kinetic._infra.plan import DEFAULT_SERVICE_ACCOUNT, SetupSpec
    from kinetic._settings import load_settings

    settings = load_settings(
        project=ns.project, zone=ns.zone, cluster=ns.cluster, namespace=ns.namespace
    )
    sa = (
        getattr(ns, "service_account", None)
        or os.environ.get("KINETIC_GKE_SERVICE_ACCOUNT")
        or DEFAULT_SERVICE_ACCOUNT
    )
    spec = SetupSpec(
        namespace=settings.namespace,
        service_account=sa,
        bucket=settings.bucket_name if settings.project and bucket else None,
        project=settings.project,
        location=settings.region,
        lws_crd=lws_crd,
    )
    gke = bool(settings.project) and not getattr(ns, "use_kubeconfig", False)
    if gke:  # the pods act as the Google service account `up` makes (Workload Identity)
        from dataclasses import replace

        from kinetic._infra.identity import account_id, email

        gsa = email(str(settings.project), account_id(settings.cluster, settings.namespace))
        spec = replace(spec, gcp_service_account=gsa)
    return _Target(settings, gke, spec)


CLOUD_APIS = (
    "the Container API (GKE clusters, node pools; with IAM and Artifact Registry in up/down)"
)
"""What up/down/status/pool's Google tokens are for, named when there are none."""


class _Session:
    """The clients one command uses, opened on demand and closed at its end."""

    def __init__(self, stack: contextlib.AsyncExitStack, target: _Target) -> None:
        self._stack = stack
        self.target = target
        self._token: Any = None
        self._rest: Any = None

    async def token(self) -> str:
        if self._token is None:
            from kinetic._images.gauth import google_token_source

            self._token = await self._stack.enter_async_context(google_token_source(CLOUD_APIS))
        value: str = await self._token()
        return value

    async def container(self) -> Any:
        from kinetic._infra.container import ContainerClient

        s = self.target.settings
        client = ContainerClient(self.token, project=s.project, location=s.zone)
        self._stack.push_async_callback(client.aclose)
        return client

    def rest(self) -> Any:
        """The client of IAM, Artifact Registry and Resource Manager (and bucket IAM)."""
        from kinetic._infra.google_rest import GoogleRest

        if self._rest is None:
            self._rest = GoogleRest(self.token)
            self._stack.push_async_callback(self._rest.aclose)
        return self._rest

    async def cloud_spec(self, cluster: Any) -> Any:
        """The Google Cloud side of ``up`` for ``cluster`` (a GKE ClusterInfo)."""
        from kinetic._infra.cloud import spec_for_cluster

        s, spec = self.target.settings, self.target.spec
        return await spec_for_cluster(
            self.rest(),
            project=s.project,
            region=s.region,
            cluster=s.cluster,
            namespace=spec.namespace,
            ksa=spec.service_account,
            bucket=spec.bucket,
            pool_accounts=[p.service_account for p in cluster.pools],
        )

    def buckets(self) -> Any:
        from kinetic._infra.bucket import GCS_API, BucketAdmin, emulator_url

        if self.target.spec.bucket is None:
            return None
        emulator = emulator_url(os.environ)
        admin = BucketAdmin(None if emulator else self.token, base_url=emulator or GCS_API)
        self._stack.push_async_callback(admin.aclose)
        return admin

    async def kube(self, cluster: Any = None) -> Any:
        """A Kubernetes client: on ``cluster`` (a GKE ClusterInfo) through a private,
        short-lived kubeconfig, else on the kubeconfig's current context."""
        import anyio.to_thread

        from kinetic._backends.gke.client import KubeClient

        path = None
        if cluster is not None:
            from kinetic._infra.gke_api import kubeconfig

            doc = kubeconfig(cluster, await self.token())
            path = await anyio.to_thread.run_sync(_write_private, json.dumps(doc))
            self._stack.callback(_unlink, path)
        client = KubeClient(kubeconfig=path, attempts=3, backoff=0.2)
        self._stack.push_async_callback(client.aclose)
        return client


def _write_private(text: str) -> str:
    import tempfile

    fd, path = tempfile.mkstemp(prefix="kinetic-kubeconfig-", suffix=".json")  # mode 0600
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


@contextlib.asynccontextmanager
async def _session(target: _Target) -> AsyncIterator[_Session]:
    async with contextlib.AsyncExitStack() as stack:
        yield _Session(stack, target)


def _confirm(command: str, lines: Sequence[str], yes: bool) -> int | None:
    """Show what ``command`` deletes and ask; None to go on, else the exit status."""
    if yes:
        return None
    print(f"kinetic {command} will delete:", *(f"  {x}" for x in lines), sep="\n", file=sys.stderr)
    if not sys.stdin.isatty():
        print(
            f"kinetic: {command} asks first; stdin is not a terminal: pass --yes", file=sys.stderr
        )
        return EXIT_USAGE
    if input("Proceed? [y/N] ").strip().lower() not in ("y", "yes"):
        print("kinetic: nothing removed", file=sys.stderr)
        return EXIT_FAILED
    return None


def _outcomes(rows: Sequence[Any], json_out: bool, extra: dict[str, Any] | None = None) -> None:
    if json_out:
        emit_json({**(extra or {}), "outcomes": [asdict(r) for r in rows]})
    else:
        table(("item", "result"), [[r.item, r.result] for r in rows])


# --------------------------------------------------------------------------- up


def _up(ns: argparse.Namespace) -> int:
    import anyio

    from kinetic._infra import ops
    from kinetic._infra.bucket import emulator_url
    from kinetic._infra.ops import Outcome
    from kinetic._infra.plan import DEFAULT_SERVICE_ACCOUNT

    target = _target(ns, bucket=not ns.no_bucket, lws_crd=not ns.no_lws_crd)
    pool_body = None
    pool_only = [
        flag
        for flag, given in (
            ("--min-nodes", ns.min_nodes is not None),
            ("--max-nodes", ns.max_nodes is not None),
            ("--spot", ns.spot),
        )
        if given
    ]
    if pool_only and not ns.accelerator:
        raise ConfigError(
            f"{', '.join(pool_only)} shape the node pool that --accelerator adds: "
            "name the pool's accelerator (for example --accelerator l4), or leave them out"
        )
    if ns.accelerator:
        if not target.gke:
            raise ConfigError("--accelerator adds a GKE node pool: it needs a GKE cluster")
        from kinetic._infra.gke_api import node_pool

        pool_body = node_pool(
            ns.accelerator, min_nodes=ns.min_nodes, max_nodes=ns.max_nodes, spot=ns.spot
        )
    if ns.preview:
        from kinetic._cli import preview

        lines = preview.up_plan(
            gke=target.gke, settings=target.settings, spec=target.spec, pool=pool_body
        )
        return preview.show(
            "up", "make sure these exist (creating what is missing)", lines, ns.json
        )

    async def main() -> list[Outcome]:
        async with _session(target) as session:
            done: list[Outcome] = []
            cluster = None
            s = target.settings
            if target.gke:
                container = await session.container()
                cluster, done = await ops.ensure_cluster(
                    container, s.cluster, pool=pool_body, timeout=ns.timeout, progress=progress
                )
            kube = await session.kube(cluster)
            cloud_step = None
            spec = target.spec
            if cluster is not None:
                from kinetic._infra import cloud, identity

                rest, cloud_spec = session.rest(), await session.cloud_spec(cluster)
                # An existing bucket must be the project's (an emulator's own no project).
                if spec.bucket is not None and s.project and not emulator_url(os.environ):
                    doc = await rest.send(identity.get_project(s.project), timeout=ns.timeout)
                    spec = replace(spec, project_number=identity.project_number(doc or {}))

                async def cloud_step(record: Any, created: list[Any]) -> list[Outcome]:
                    return await cloud.ensure(rest, cloud_spec, record, created, progress=progress)

            done += await ops.set_up(
                kube,
                session.buckets(),
                spec,
                timeout=STEP_TIMEOUT,
                progress=progress,
                cloud=cloud_step,
            )
            return done

    outcomes = anyio.run(main)
    _outcomes(outcomes, ns.json, {"namespace": target.spec.namespace})
    sa = target.spec.service_account
    explicit = os.environ.get("KINETIC_GKE_SERVICE_ACCOUNT")
    if not ns.json and sa != DEFAULT_SERVICE_ACCOUNT and explicit != sa:
        print(
            f"kinetic: pods run as {sa} when KINETIC_GKE_SERVICE_ACCOUNT={sa} is set "
            f"(without it, as {DEFAULT_SERVICE_ACCOUNT} when `kinetic up` made it)",
            file=sys.stderr,
        )
    return EXIT_OK


# --------------------------------------------------------------------------- down


def _down(ns: argparse.Namespace) -> int:
    import anyio

    from kinetic._infra import ops
    from kinetic._infra.ops import Outcome

    target = _target(ns)
    s = target.settings

    async def plan() -> tuple[list[str], bool]:
        async with _session(target) as session:
            lines: list[str] = []
            delete_cluster = False
            cluster = None
            if target.gke:
                cluster = await (await session.container()).get_cluster(s.cluster)
                if cluster is None:
                    return [], False
                delete_cluster = cluster.managed and not ns.keep_cluster
            kube = await session.kube(cluster)
            record = await ops.teardown_plan(kube, target.spec.namespace)
            if delete_cluster:
                if record.bucket:
                    lines.append(f"bucket gs://{record.bucket} and every object in it")
                lines += ops.cloud_lines(record)
                lines.append(f"GKE cluster {s.cluster} and everything in it")
            else:
                lines += ops.describe(record, target.spec.namespace)
            return lines, delete_cluster

    lines, delete_cluster = anyio.run(plan)
    if not lines:
        print("kinetic: nothing recorded by `kinetic up` here; nothing to remove", file=sys.stderr)
        if ns.json:
            emit_json({"outcomes": []})
        return EXIT_OK
    stop = _confirm("down", lines, ns.yes)
    if stop is not None:
        return stop

    async def main() -> list[Outcome]:
        async with _session(target) as session:
            cluster = None
            container = None
            if target.gke:
                container = await session.container()
                cluster = await container.get_cluster(s.cluster)
            kube = await session.kube(cluster)
            if delete_cluster and container is not None:
                # The cluster takes its objects along; only the bucket lives outside it.
                record = await ops.teardown_plan(kube, target.spec.namespace)
                done: list[Outcome] = []
                buckets = session.buckets()
                if record.bucket and buckets is not None:
                    progress(f"emptying and deleting bucket gs://{record.bucket}")
                    await ops.empty_bucket(record.bucket, STEP_TIMEOUT)
                    await buckets.delete(record.bucket)
                    done.append(Outcome(f"bucket gs://{record.bucket}", "deleted"))
                if record.cloud:
                    from kinetic._infra import cloud

                    done += await cloud.remove(
                        session.rest(), s.project, record.cloud, progress=progress
                    )
                progress(f"deleting GKE cluster {s.cluster} (several minutes)")
                gone = await container.delete_cluster(
                    s.cluster, timeout=ns.timeout, progress=progress
                )
                done.append(Outcome(f"GKE cluster {s.cluster}", "deleted" if gone else "gone"))
                return done
            removal = None
            if target.gke:
                from kinetic._infra import cloud

                rest = session.rest()

                async def removal(items: Any) -> list[Outcome]:
                    return await cloud.remove(rest, s.project, items, progress=progress)

            return await ops.tear_down(
                kube,
                session.buckets(),
                target.spec.namespace,
                timeout=STEP_TIMEOUT,
                progress=progress,
                cloud=removal,
            )

    _outcomes(anyio.run(main), ns.json)
    return EXIT_OK


# --------------------------------------------------------------------------- status


def _status(ns: argparse.Namespace) -> int:
    import anyio

    from kinetic._infra import ops
    from kinetic._infra.plan import StatusRow, missing

    target = _target(ns)
    s = target.settings

    async def main() -> list[StatusRow]:
        async with _session(target) as session:
            rows: list[StatusRow] = []
            cluster = None
            if target.gke:
                cluster = await (await session.container()).get_cluster(s.cluster)
                if cluster is None:
                    return [StatusRow("cluster", s.cluster, False, None, f"no cluster in {s.zone}")]
                managed = "kinetic up" if cluster.managed else "pre-existing"
                detail = f"{cluster.status}, Kubernetes {cluster.version}, {cluster.location}"
                rows.append(StatusRow("cluster", cluster.name, True, managed, detail))
                for p in cluster.pools:
                    rows.append(
                        StatusRow(
                            "pool",
                            p.name,
                            True,
                            "kinetic" if p.managed else "pre-existing",
                            _pool_detail(p),
                        )
                    )
                if not cluster.endpoint:  # still being created: nothing inside to ask yet
                    return rows
            kube = await session.kube(cluster)
            rows += await ops.inspect(kube, session.buckets(), target.spec, timeout=STEP_TIMEOUT)
            if cluster is not None:
                from kinetic._infra import cloud

                record = await ops.teardown_plan(kube, target.spec.namespace)
                spec = await session.cloud_spec(cluster)
                rows += await cloud.inspect(session.rest(), spec, record.cloud)
            return rows

    rows = anyio.run(main)
    ready = not missing(rows)
    if ns.json:
        emit_json(
            {"ready": ready, "namespace": s.namespace, "components": [asdict(r) for r in rows]}
        )
    else:
        table(
            ("component", "name", "exists", "managed by", "detail"),
            [[r.component, r.name, r.present, r.managed, r.detail] for r in rows],
            title="kinetic status",
            styles=[None if r.present else "bold red" for r in rows],
        )
        if not ready:
            print("kinetic: something is missing: `kinetic up` creates it", file=sys.stderr)
    return EXIT_OK if ready else EXIT_FAILED


def _pool_detail(p: Any) -> str:
    parts = [p.machine_type]
    if p.accelerator:
        parts.append(p.accelerator)
    if p.topology:
        parts.append(f"topology {p.topology}")
    parts.append(f"{p.min_nodes}-{p.max_nodes} nodes")
    if p.spot:
        parts.append("spot")
    parts.append(p.status)
    return ", ".join(parts)


# --------------------------------------------------------------------------- pool


def _pool(ns: argparse.Namespace) -> int:
    import anyio

    from kinetic._infra import gke_api

    target = _target(ns)
    s = target.settings
    if not target.gke:
        raise ConfigError("node pools are GKE's: set a project (--project or KINETIC_PROJECT)")

    if ns.action == "list":

        async def listing() -> list[gke_api.PoolInfo]:
            async with _session(target) as session:
                pools: list[gke_api.PoolInfo] = await (await session.container()).list_pools(
                    s.cluster
                )
                return pools

        pools = anyio.run(listing)
        if ns.json:
            emit_json({"cluster": s.cluster, "pools": [asdict(p) for p in pools]})
        else:
            table(
                ("name", "machine", "accelerator", "min", "max", "spot", "status", "kinetic"),
                [
                    [
                        p.name,
                        p.machine_type,
                        p.accelerator,
                        p.min_nodes,
                        p.max_nodes,
                        p.spot,
                        p.status,
                        p.managed,
                    ]
                    for p in pools
                ],
            )
        return EXIT_OK

    if ns.action == "add":
        body = gke_api.node_pool(
            ns.accelerator,
            min_nodes=ns.min_nodes,
            max_nodes=ns.max_nodes,
            spot=ns.spot,
            name=ns.name,
            machine_type=ns.machine_type,
        )
        if ns.preview:
            from kinetic._cli import preview

            return preview.show("pool add", "create", [preview.pool_line(body, s.cluster)])

        async def add() -> None:
            async with _session(target) as session:
                await session.token()  # no credentials: said before "creating"
                progress(f"creating node pool {body['name']} in {s.cluster}")
                await (await session.container()).create_pool(
                    s.cluster, body, timeout=ns.timeout, progress=progress
                )

        anyio.run(add)
        print(body["name"])
        return EXIT_OK

    # remove
    if bool(ns.name) == bool(ns.accelerator):
        raise ConfigError("pool remove: give a pool NAME or --accelerator (one of them)")
    name = ns.name or gke_api.pool_name(_accelerator(ns.accelerator, ns.spot))
    if ns.preview:
        from kinetic._cli import preview

        return preview.show("pool remove", "delete", [f"node pool {name} of {s.cluster}"])
    stop = _confirm(
        "kinetic pool remove will delete:", [f"node pool {name} of {s.cluster}"], ns.yes
    )
    if stop is not None:
        return stop

    async def remove() -> bool:
        async with _session(target) as session:
            progress(f"deleting node pool {name} of {s.cluster}")
            gone: bool = await (await session.container()).delete_pool(
                s.cluster, name, timeout=ns.timeout, progress=progress
            )
            return gone

    if not anyio.run(remove):
        print(f"kinetic: no node pool {name!r} in cluster {s.cluster}", file=sys.stderr)
        return EXIT_NOT_FOUND
    return EXIT_OK


def _accelerator(name: str, spot: bool) -> Any:
    from kinetic._core.accelerators import parse_accelerator

    return parse_accelerator(name, spot=spot)
