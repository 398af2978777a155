"""``kinetic init``: first set-up. Check this machine, then join a cluster, create one,
or go local, and end with a saved, current profile.

    kinetic [--project P --zone Z --cluster C --namespace N] init
        [--local | --join CLUSTER | --create | --doctor]
        [--name PROFILE] [--force] [--yes] [--timeout S] [--json]

Theory of operation
-------------------
1. *Look* (asks nothing, changes nothing): ``kinetic doctor``'s checks of this machine
   (Python, Kinetic's packages, the local root), then Google credentials (found where
   the Google auth library looks), the gcloud CLI, and the GCP project (the settings',
   else gcloud's configured one). With credentials and a project, the project's GKE
   clusters are listed (the Container API, every location).
2. *Choose* (:mod:`kinetic._cli.init_plan`): a flag says which way; else, on a terminal,
   a menu asks (its default: local without credentials or a project, join when the
   project has a cluster, else create); ``--yes`` alone takes the default, except
   create, which costs money and must be asked for. When stdin is not a terminal and
   nothing says which way, ``init`` exits 2 at once, naming the flags: it never waits
   for input that cannot come.
3. *Go*: ``local`` saves an empty profile (no project: the local backend);
   ``join`` saves the cluster's project, location and name; ``create`` runs
   ``kinetic up`` first; both then make sure the kubeconfig has the cluster's context
   (``gcloud container clusters get-credentials``, when gcloud is there and the user
   agrees or passed ``--yes``; else the command is printed). ``doctor`` runs
   ``kinetic doctor``. The profile becomes the current one; a profile of that name
   with other settings is replaced only with ``--force`` (or a yes on a terminal).

Prompts and progress go to stderr; stdout has the report (``--json``: one document).
Exit status: 0 done, 1 a step failed (``up``, the local root, ``doctor``'s checks), 2
bad usage or nothing to go on without asking, 3 no such cluster, 4 a GKE operation
outlasted ``--timeout``, 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from kinetic._cli import init_plan as plan
from kinetic._cli._output import EXIT_FAILED, EXIT_OK, EXIT_USAGE, emit_json, report_error, table
from kinetic._cli.doctor_result import CheckResult
from kinetic._core.config import Settings
from kinetic._exceptions import BackendError, ConfigError, KineticError

DEFAULT_TIMEOUT = 1800.0
"""Seconds a GKE operation of ``--create`` may take (as ``kinetic up``)."""
CHECK_TIMEOUT = 10.0
GCLOUD_TIMEOUT = 120.0


class ClusterNotFoundError(ConfigError, LookupError):
    """The project has no cluster of that name (exit status 3)."""


class NoAnswerError(ConfigError):
    """A question could not be answered: stdin ended (exit status 2)."""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``init`` command."""
    p = sub.add_parser(
        "init",
        help="first set-up: check this machine, then join a cluster, create one, or go local",
        description=(
            "Check the local tools and credentials, then join an existing GKE cluster, "
            "create one (kinetic up), run jobs locally, or troubleshoot (kinetic doctor); "
            "save the result as the current profile. Asks on a terminal; flags for scripts."
        ),
    )
    p.set_defaults(way=None)
    way = p.add_mutually_exclusive_group()
    way.add_argument(
        "--local", dest="way", action="store_const", const="local", help="run jobs locally"
    )
    way.add_argument("--join", metavar="CLUSTER", help="use this existing GKE cluster")
    way.add_argument(
        "--create",
        dest="way",
        action="store_const",
        const="create",
        help="create a GKE cluster (kinetic up)",
    )
    way.add_argument(
        "--doctor", dest="way", action="store_const", const="doctor", help="run kinetic doctor"
    )
    p.add_argument("--name", help="the profile's name (default: the cluster's, or local)")
    p.add_argument(
        "--force", action="store_true", help="replace a profile of that name and other settings"
    )
    p.add_argument("-y", "--yes", action="store_true", help="ask nothing: take the defaults")
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        help=f"seconds a GKE operation may take (default: {DEFAULT_TIMEOUT:g})",
    )
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")


def run(ns: argparse.Namespace) -> int:
    """Run ``init``; return the exit status."""
    try:
        return _init(ns)
    except KineticError as exc:
        return report_error(exc)


def _init(ns: argparse.Namespace) -> int:
    import anyio

    from kinetic._settings import load_settings

    way: str | None = "join" if ns.join else ns.way
    if way == "doctor":
        return _doctor(ns)
    interactive = sys.stdin.isatty() and not ns.yes
    if way is None and not interactive and not ns.yes:
        print(f"kinetic: {plan.not_a_terminal(False)}", file=sys.stderr)
        return EXIT_USAGE
    settings = load_settings(
        project=ns.project, zone=ns.zone, cluster=ns.cluster, namespace=ns.namespace
    )
    checks, found = anyio.run(_look, ns, settings, way in (None, "join"))
    if not ns.json:
        table(("check", "status", "detail", "fix"), [_row(r) for r in checks], title="kinetic init")
    if way is None:
        way = _ask_way(found, settings) if interactive else _default_way(found)
        if way == "doctor":
            return _doctor(ns)
    report: dict[str, Any] = {"choice": way, "checks": [_doc(r) for r in checks]}
    if way == "local":
        failed = [r for r in checks if r.name == "local-root" and r.level == "fail"]
        if failed:
            print(f"kinetic: {failed[0].detail}; {failed[0].hint}", file=sys.stderr)
            return EXIT_FAILED
        cluster: str | None = None
        fields: dict[str, str] = {}
    else:
        went = _to_cluster(ns, way, found, settings, interactive, report)
        if isinstance(went, int):
            return went
        cluster, fields = went
    name = plan.profile_name(way, cluster, ns.name)
    path, action = _save(name, fields, ns.force, interactive)
    report |= {
        "profile": name,
        "fields": fields,
        "profiles_file": str(path),
        "profile_action": action,
    }
    report["next"] = plan.next_steps(way)
    if report.get("kubeconfig") == "missing":
        command = " ".join(
            plan.get_credentials_command(fields["project"], fields["zone"], fields["cluster"])
        )
        report["next"].insert(0, f"{command}    add the cluster's kubeconfig context")
    _warn_overrides(way, name)
    if ns.json:
        emit_json(report)
        return EXIT_OK
    shown = ", ".join(f"{k} {v}" for k, v in fields.items()) or "no project: the local backend"
    print(f"profile {name} ({shown}) {action} in {path}; it is the current profile")
    print("next:", *(f"  {step}" for step in report["next"]), sep="\n")
    return EXIT_OK


def _to_cluster(
    ns: argparse.Namespace,
    way: str,
    found: plan.Found,
    settings: Settings,
    interactive: bool,
    report: dict[str, Any],
) -> tuple[str, dict[str, str]] | int:
    """Join or create: the cluster's name and the profile's fields (or ``up``'s exit
    status when it failed); ``report`` gets ``up``'s document and the kubeconfig's state.
    """
    if not found.project:
        raise ConfigError(
            f"init --{way} needs a GCP project: --project P, or gcloud config set project P"
        )
    if way == "join":
        cluster, location = _which_cluster(ns, found, interactive)
    else:
        cluster, location = _ask_where(settings, interactive)
        up = _create(ns, found.project, location, cluster)
        if isinstance(up, int):
            return up
        report["up"] = up
    fields = plan.profile_fields(
        way, project=found.project, zone=location, cluster=cluster, namespace=settings.namespace
    )
    report["kubeconfig"] = _kube_context(found, location, cluster, interactive, ns.yes)
    return cluster, fields


def _warn_overrides(way: str, name: str) -> None:
    """Name the variables of this shell that take precedence over the saved profile."""
    for variable in plan.overriding(os.environ, way):
        print(
            f"kinetic: {variable}={os.environ[variable]} is set: it takes precedence over "
            f"profile {name} in this shell",
            file=sys.stderr,
        )
    if os.environ.get("KINETIC_PROFILE") not in (None, "", name):
        print(
            f"kinetic: KINETIC_PROFILE={os.environ['KINETIC_PROFILE']} still selects another "
            "profile in this shell",
            file=sys.stderr,
        )


# --------------------------------------------------------------------------- look


async def _look(
    ns: argparse.Namespace, settings: Settings, list_clusters: bool
) -> tuple[list[CheckResult], plan.Found]:
    """The checks of this machine, and what was found (see the module docstring)."""
    import anyio.to_thread

    from kinetic._cli import doctor_checks as dc

    results = [
        dc.python_result(sys.version_info[:3]),
        dc.packages_result(dc._kinetic_version(), dc._versions(dc.PACKAGES)),
    ]
    env = dict(os.environ)
    # The local root must be usable whichever way init goes: checked as for local.
    ctx = dc._Env(settings=replace(settings, backend="local"), env=env, timeout=CHECK_TIMEOUT)
    results += await dc._gather(ctx, [dc._local_root(ctx)])
    found = await anyio.to_thread.run_sync(_found_here, settings, env)
    results += [
        plan.credential_result(
            plan.credentials_path(env, str(Path.home())),
            found.credentials is not None and not found.credentials.startswith("the metadata"),
            env.get("GCE_METADATA_HOST") or env.get("GCE_METADATA_ROOT"),
        ),
        plan.gcloud_result(found.gcloud),
        plan.project_result(found),
    ]
    if list_clusters and found.cloud:
        found = await _list_clusters(ns, found)
    return results, found


def _found_here(settings: Settings, env: Mapping[str, str]) -> plan.Found:
    """Credentials, project and gcloud, from files and the PATH (blocking)."""
    path = plan.credentials_path(env, str(Path.home()))
    credentials = path if path and os.path.exists(path) else None
    metadata = env.get("GCE_METADATA_HOST") or env.get("GCE_METADATA_ROOT")
    if credentials is None and metadata:
        credentials = f"the metadata server at {metadata}"
    project, source = settings.project, "settings"
    if not project:
        project, source = _gcloud_project(env), "gcloud config"
    return plan.Found(
        credentials=credentials,
        project=project,
        project_source=source if project else None,
        gcloud=shutil.which("gcloud"),
    )


def _gcloud_project(env: Mapping[str, str]) -> str | None:
    config = Path(env.get("CLOUDSDK_CONFIG") or Path.home() / ".config" / "gcloud")
    try:
        active = (config / "active_config").read_text(encoding="utf-8").strip() or "default"
    except OSError:
        active = "default"
    try:
        text = (config / "configurations" / f"config_{active}").read_text(encoding="utf-8")
    except OSError:
        return None
    return plan.gcloud_project(text)


async def _list_clusters(ns: argparse.Namespace, found: plan.Found) -> plan.Found:
    from kinetic._cli import infra

    target = infra._target(argparse.Namespace(**{**vars(ns), "project": found.project}))
    try:
        async with infra._session(target) as session:
            clusters = await (await session.container()).list_clusters()
    except KineticError as exc:
        return replace(found, cluster_error=str(exc))
    return replace(found, clusters=tuple((c.name, c.location) for c in clusters))


# --------------------------------------------------------------------------- choose


def _prompt(question: str) -> str:
    """Ask on stderr (stdout stays the report's); read one line.

    :raises NoAnswerError: stdin ended.
    """
    print(question, end="", file=sys.stderr, flush=True)
    line = sys.stdin.readline()
    if not line:
        print(file=sys.stderr)
        raise NoAnswerError(f"no answer (stdin ended): pass {plan.FLAGS} and --yes")
    return line.strip()


def _yes(question: str, default: bool) -> bool:
    answer = _prompt(f"{question} [{'Y/n' if default else 'y/N'}] ").lower()
    return default if not answer else answer in ("y", "yes")


def _ask_way(found: plan.Found, settings: Settings) -> str:
    options = plan.menu(found, settings.cluster, settings.zone)
    names = [name for name, _ in options]
    default = plan.default_choice(found)
    print("How do you want to run jobs?", file=sys.stderr)
    for i, (name, text) in enumerate(options, 1):
        print(f"  {i}) {name:<7} {text}", file=sys.stderr)
    while True:
        choice = plan.parse_answer(_prompt(f"Choice [{default}]: "), default, names)
        if choice is None:
            print(f"kinetic: answer 1-{len(names)} or {', '.join(names)}", file=sys.stderr)
        elif choice in ("join", "create") and not found.cloud:
            missing = "Google credentials" if not found.credentials else "a GCP project"
            print(
                f"kinetic: {choice} needs {missing}: gcloud auth application-default login; "
                "gcloud config set project P (or --project P). Choose another way, or "
                "Ctrl-C and come back",
                file=sys.stderr,
            )
        else:
            return choice


def _default_way(found: plan.Found) -> str:
    """``--yes`` without a flag: the default way, when it needs no more answers."""
    way = plan.default_choice(found)
    if way == "create" or (way == "join" and plan.cluster_to_join(found, None) is None):
        raise ConfigError(plan.not_a_terminal(True))
    return way


def _which_cluster(ns: argparse.Namespace, found: plan.Found, interactive: bool) -> tuple[str, str]:
    if found.cluster_error:
        raise BackendError(
            f"the clusters of project {found.project} could not be listed: {found.cluster_error}"
        )
    listed = ", ".join(f"{n} ({loc})" for n, loc in found.clusters) or "none"
    if ns.join:
        match = plan.cluster_to_join(found, ns.join, ns.zone)
        if match is None:
            raise ClusterNotFoundError(
                f"no GKE cluster {ns.join!r} in project {found.project}"
                + (f", zone {ns.zone}" if ns.zone else "")
                + f" (found: {listed}); init --create makes one"
            )
        return match
    if not found.clusters:
        raise ClusterNotFoundError(
            f"project {found.project} has no GKE cluster to join: init --create makes one"
        )
    if len(found.clusters) == 1 or not interactive:
        return found.clusters[0]
    for i, (n, loc) in enumerate(found.clusters, 1):
        print(f"  {i}) {n} ({loc})", file=sys.stderr)
    names = [n for n, _ in found.clusters]
    while True:
        picked = plan.parse_answer(_prompt(f"Which cluster? [{names[0]}]: "), names[0], names)
        if picked is not None:
            return found.clusters[names.index(picked)]


def _ask_where(settings: Settings, interactive: bool) -> tuple[str, str]:
    cluster, zone = settings.cluster, settings.zone
    if interactive:
        cluster = _prompt(f"Name of the new cluster [{cluster}]: ") or cluster
        zone = _prompt(f"Zone [{zone}]: ") or zone
    return cluster, zone


# --------------------------------------------------------------------------- go


def _doctor(ns: argparse.Namespace) -> int:
    from kinetic._cli import doctor

    return doctor.run(argparse.Namespace(**{**vars(ns), "timeout": CHECK_TIMEOUT}))


def _create(ns: argparse.Namespace, project: str, zone: str, cluster: str) -> Any:
    """``kinetic up`` for the new cluster: its exit status when it failed, else its
    ``--json`` document (None when its table went to stdout)."""
    from kinetic._cli import infra

    # As if `kinetic ... up --yes` was typed: up's own parser gives its defaults.
    parser = argparse.ArgumentParser(prog="kinetic")
    infra.add_parsers(parser.add_subparsers(dest="group"))
    flags = ["--yes", "--timeout", str(ns.timeout), *(["--json"] if ns.json else [])]
    up = parser.parse_args(["up", *flags])
    up.backend, up.project, up.zone, up.cluster = None, project, zone, cluster
    up.namespace = ns.namespace
    if not ns.json:
        code = infra.run(up)
        return code if code != EXIT_OK else None
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = infra.run(up)
    return code if code != EXIT_OK else json.loads(out.getvalue() or "null")


def _kube_context(
    found: plan.Found, location: str, cluster: str, interactive: bool, yes: bool
) -> str:
    """Make sure the kubeconfig has the cluster's context: ``present``, ``added``,
    ``failed`` (gcloud said no) or ``missing`` (not added: the next steps say how)."""
    from kinetic._core.kube_context import gke_context_name

    project = found.project or ""
    if gke_context_name(project, location, cluster) in _contexts():
        return "present"
    command = plan.get_credentials_command(project, location, cluster)
    if found.gcloud is None:
        return "missing"
    question = f"Add its kubeconfig context ({' '.join(command)})?"
    if not yes and not (interactive and _yes(question, True)):
        return "missing"
    print(f"kinetic: running {' '.join(command)}", file=sys.stderr)
    try:
        done = subprocess.run(
            [found.gcloud, *command[1:]],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=GCLOUD_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"kinetic: {' '.join(command)} failed: {exc}", file=sys.stderr)
        return "failed"
    sys.stderr.write(done.stdout + done.stderr)  # what gcloud said: progress, not the report
    if done.returncode != 0:
        print(f"kinetic: {' '.join(command)} exited {done.returncode}", file=sys.stderr)
        return "failed"
    return "added"


def _contexts() -> list[str]:
    from kinetic._backends.gke.endpoint import read_kubeconfig
    from kinetic._core import kubeconfig

    paths = kubeconfig.config_paths(os.environ, str(Path.home()))
    try:
        config, _ = read_kubeconfig(paths)
        return kubeconfig.list_contexts(config)[0]
    except ConfigError:
        return []


def _save(name: str, fields: dict[str, str], force: bool, interactive: bool) -> tuple[Path, str]:
    """Save profile ``name`` and make it current; where, and created/kept/replaced."""
    from kinetic._cli import profile
    from kinetic._settings import profiles_path

    profile.check_name(name)
    path = profiles_path()
    document = profile.read_document(path)
    action, old = plan.reconcile(document, name, fields)
    if action == "replaced" and not force:
        shown = ", ".join(f"{k} {v}" for k, v in (old or {}).items()) or "no fields"
        if not (interactive and _yes(f"Replace profile {name} ({shown})?", False)):
            raise ConfigError(
                f"profile {name!r} exists with other settings ({shown}): --name gives "
                "another name, --force replaces it"
            )
    document = profile.with_profile(document, name, fields, replace=True)
    profile.write_document(path, profile.with_current(document, name))
    return path, action


def _row(r: CheckResult) -> list[str | None]:
    return [r.name, r.level, r.detail, r.hint]


def _doc(r: CheckResult) -> dict[str, Any]:
    return asdict(r)
