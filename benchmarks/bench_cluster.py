"""The GKE backend on the cluster testbed: status latency (watch vs polling) and submission.

(a) Completion-to-observed latency. Half the jobs are observed with the shared watch
    (``backend.wait``), half with a 5 s polling loop of ``backend.status`` — same
    cluster, same run, concurrently. Two clocks start the latency: the moment the pod
    finished as the API server records it (seen by an independent raw pod watch in this
    script: the target, DESIGN §7, is <= 0.5 s from there), and the function's return
    (``time.time()``, pod and host share the clock), which adds the runner's uploads, the
    process exit and the kubelet's report (its PLEG relists every second).
(b) Submitting ``--jobs`` jobs (default 200) concurrently through ``fn.aio.run_async``:
    Kubernetes requests and storage writes per job (counted at the client), and jobs/s.
    The Jobs are deleted right after.
(c) A batch (``run_async_map(..., pod_per_input=True)``: one Job per input; the default
    worker pool is measured by ``bench_gke_pool.py``) of ``--batch-inputs`` inputs,
    ``--batch-concurrency`` Jobs alive at once: Kubernetes requests per input by method (counted at the client),
    storage writes per input by the submitter (counted at the client) and by the pods
    (objects they created), and the wall time from submission to all results.
    ``--only-batch`` runs just this part and updates it in the results file.

Needs the testbed: ``tests/testbed/up`` (the script runs it). Writes
``benchmarks/results/cluster.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import anyio

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import kinetic
from kinetic._engine import runtime
from kinetic._images.runner_image import ensure_runner_image


def finish_time(pause: float) -> float:
    time.sleep(pause)
    return time.time()


def square(x: int) -> int:
    return x * x


def noop() -> None:
    return None


def testbed_env() -> dict[str, str]:
    subprocess.run([str(REPO / "tests/testbed/up")], check=True, capture_output=True)
    env = json.loads((_testbed_cache() / "run/env.json").read_text())
    return {k: str(v) for k, v in env.items()}


def current_context(kubeconfig: str) -> str:
    """The active context of the testbed's kubeconfig."""
    import yaml

    with open(kubeconfig, encoding="utf-8") as f:
        return str(yaml.safe_load(f)["current-context"])


def _testbed_cache() -> Path:
    return Path(os.environ.get("KINETIC_TESTBED_CACHE") or Path.home() / ".cache/kinetic-testbed")


CPU_CGROUP = Path("/sys/fs/cgroup/cpu")  # the cgroup v1 cpu hierarchy, where mounted
BEHIND = "kinetic-testbed-behind"
LEAST_SHARES = "2"


@contextlib.contextmanager
def cluster_behind() -> Iterator[list[str]]:
    """The testbed (API server, etcd, kubelet, container runtime, storage emulator,
    registry, every process they started, and the pods) at the least CPU weight while
    the block runs; the names of those moved. Needs root; restored on exit.

    On GKE none of them runs on the caller's machine. On a testbed sharing the caller's
    cores they compete with its event loop for CPU as no cluster would, so this puts
    them behind it, as another machine's work would be. Where the cgroup v1 cpu
    hierarchy is mounted they go into a cgroup of their own, which the processes they
    start meanwhile (the runtime's shims and ``runc``, each in a session of its own)
    inherit; the pods' own cgroup (``docker``) gets the least weight too. Elsewhere
    each component's session group (autogroup) gets nice 19.
    """
    run = _testbed_cache() / "run"
    pids = {}
    for pidfile in sorted(run.glob("*.pid")):
        with contextlib.suppress(OSError, ValueError):
            pids[pidfile.stem] = int(pidfile.read_text())
    if not (CPU_CGROUP / "cgroup.procs").exists():
        with _sessions_niced(pids.values()):
            yield sorted(pids)
        return
    group, pods = CPU_CGROUP / BEHIND, CPU_CGROUP / "docker" / "cpu.shares"
    group.mkdir(exist_ok=True)
    (group / "cpu.shares").write_text(LEAST_SHARES)
    pods_before = pods.read_text().strip() if pods.exists() else None
    try:
        for pid in _in_root_cgroup(_descendants(set(pids.values()))):
            with contextlib.suppress(OSError):  # gone meanwhile
                (group / "cgroup.procs").write_text(str(pid))
        if pods_before is not None:
            pods.write_text(LEAST_SHARES)
        yield sorted(pids) + (["pods"] if pods_before is not None else [])
    finally:
        if pods_before is not None:
            pods.write_text(pods_before)
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (CPU_CGROUP / "cgroup.procs").write_text(pid)
        group.rmdir()


def _descendants(roots: set[int]) -> set[int]:
    """``roots`` and every process descended from them (from ``/proc``)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = (entry / "stat").read_text()
                parent = int(stat[stat.rindex(")") + 2 :].split()[1])
                children.setdefault(parent, []).append(int(entry.name))
    found, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


def _in_root_cgroup(pids: set[int]) -> list[int]:
    """Those of ``pids`` in the root cpu cgroup (a pod's processes keep their own)."""
    kept = []
    for pid in sorted(pids):
        with contextlib.suppress(OSError):
            lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
            if any(
                line.split(":")[1] in ("cpu", "cpu,cpuacct") and line.endswith(":/")
                for line in lines
            ):
                kept.append(pid)
    return kept


@contextlib.contextmanager
def _sessions_niced(pids: Iterable[int], nice: int = 19) -> Iterator[None]:
    """Each of ``pids``' session group (autogroup) at ``nice`` meanwhile."""
    restore: list[tuple[Path, str]] = []
    try:
        for pid in pids:
            group = Path(f"/proc/{pid}/autogroup")
            with contextlib.suppress(OSError, IndexError):
                restore.append((group, group.read_text().split("nice")[1].strip()))
                group.write_text(str(nice))
        yield
    finally:
        for group, before in restore:
            with contextlib.suppress(OSError):
                group.write_text(before)


def testbed_target(prefix: str) -> tuple[dict[str, str], str, str, str]:
    """Point this process at the testbed (its environment, runner image and a fresh
    bucket in project ``kb``): ``(env, image, cluster, bucket)``."""
    env = testbed_env()
    for key in ("KUBECONFIG", "STORAGE_EMULATOR_HOST", "DOCKER_HOST"):
        os.environ[key] = env[key]
    os.environ["KINETIC_GKE_HOST_NETWORK"] = env["KINETIC_TESTBED_HOST_NETWORK"]
    os.environ["KINETIC_GKE_SERVICE_ACCOUNT"] = env["KINETIC_TESTBED_SERVICE_ACCOUNT"]
    # The jobs name a cluster (its bucket) with no GKE context: the testbed's, outright.
    os.environ["KINETIC_KUBE_CONTEXT"] = current_context(env["KUBECONFIG"])
    os.environ["KINETIC_QUIET"] = "1"
    image = anyio.run(
        ensure_runner_image, env["KINETIC_TESTBED_REGISTRY"], env["KINETIC_TESTBED_BASE_IMAGE"]
    )
    cluster = f"{prefix}{uuid.uuid4().hex[:8]}"
    bucket = f"kb-kn-{cluster}-jobs"
    req = urllib.request.Request(
        f"{env['STORAGE_EMULATOR_HOST']}/storage/v1/b?project=kb",
        data=json.dumps({"name": bucket}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    urllib.request.urlopen(req, timeout=10).close()
    return env, image, cluster, bucket


async def latency(fn: Any, n: int, poll: float) -> dict[str, Any]:
    handles = [await fn.aio.run_async(1.0 + 0.1 * i) for i in range(2 * n)]
    backend = runtime.backend_for_location("gke", handles[0].bucket_name, handles[0].namespace)
    watched: list[float] = []
    polled: list[float] = []
    watched_api: list[float] = []
    polled_api: list[float] = []
    finished_at: dict[str, float] = {}
    finished = {h.job_id: anyio.Event() for h in handles}
    all_seen = anyio.Event()

    async def by_watch(h: Any) -> None:
        await backend.wait(h)
        seen = time.time()
        watched.append(seen - await h.result(cleanup=False))
        with anyio.fail_after(30):
            await finished[h.job_id].wait()
        watched_api.append(seen - finished_at[h.job_id])

    async def by_polling(h: Any) -> None:
        while not (await backend.status(h)).status.is_terminal:  # noqa: ASYNC110 - the baseline
            await anyio.sleep(poll)
        seen = time.time()
        polled.append(seen - await h.result(cleanup=False))
        with anyio.fail_after(30):
            await finished[h.job_id].wait()
        polled_api.append(seen - finished_at[h.job_id])

    async def pods_finishing() -> None:
        """An independent raw watch: when does the API server say each pod finished?"""
        from kubernetes_asyncio import client, config, watch

        await config.load_kube_config()
        async with client.ApiClient() as api:
            v1 = client.CoreV1Api(api)
            stream = watch.Watch().stream(
                v1.list_namespaced_pod, handles[0].namespace, label_selector="app=kinetic"
            )
            async for event in stream:
                pod = event["object"]
                job_id = pod.metadata.labels["job-id"]
                if pod.status.phase in ("Succeeded", "Failed") and job_id not in finished_at:
                    finished_at[job_id] = time.time()
                    if job_id in finished:
                        finished[job_id].set()
                if all_seen.is_set():
                    return

    async with anyio.create_task_group() as outer:
        outer.start_soon(pods_finishing)
        async with anyio.create_task_group() as tg:
            for i, h in enumerate(handles):
                tg.start_soon(by_watch if i % 2 == 0 else by_polling, h)
        all_seen.set()
        outer.cancel_scope.cancel()
    async with anyio.create_task_group() as tg:
        for h in handles:
            tg.start_soon(h.cleanup)

    def stats(xs: list[float]) -> dict[str, float]:
        return {
            "median_s": round(statistics.median(xs), 3),
            "max_s": round(max(xs), 3),
            "min_s": round(min(xs), 3),
        }

    return {
        "jobs_each": n,
        "poll_interval_s": poll,
        "from_pod_finished_in_api": {"watch": stats(watched_api), "poll": stats(polled_api)},
        "from_function_return": {"watch": stats(watched), "poll": stats(polled)},
    }


async def submission(fn: Any, n: int) -> dict[str, Any]:
    first = await fn.aio.run_async()  # warm: backend, context archive in storage, image
    backend = runtime.backend_for_location("gke", first.bucket_name, first.namespace)
    writes = [0]
    original = backend.storage.write

    async def counting_write(key: str, data: bytes, **kw: Any) -> None:
        writes[0] += 1
        await original(key, data, **kw)

    backend.storage.write = counting_write  # type: ignore[method-assign]
    requests_before = backend.client.requests_sent
    handles: list[Any] = []
    limiter = anyio.CapacityLimiter(64)

    async def one() -> None:
        async with limiter:
            handles.append(await fn.aio.run_async())

    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(n):
            tg.start_soon(one)
    elapsed = time.perf_counter() - started
    requests = backend.client.requests_sent - requests_before
    backend.storage.write = original  # type: ignore[method-assign]
    async with anyio.create_task_group() as tg:
        for h in [first, *handles]:
            tg.start_soon(h.cleanup)
    return {
        "jobs": n,
        "seconds": round(elapsed, 2),
        "jobs_per_s": round(n / elapsed, 1),
        "k8s_requests_per_job": round(requests / n, 2),
        "storage_writes_per_job": round(writes[0] / n, 2),
        "k8s_qps_limit": backend.options.qps,
    }


async def batch(fn: Any, n: int, limit: int, bucket: str) -> dict[str, Any]:
    warm = await fn.aio.run_async_map([0], max_concurrent=1, pod_per_input=True)  # warm
    await warm.results()
    backend = runtime.backend_for_location("gke", bucket, warm.jobs[0].namespace)
    methods: dict[str, int] = {}
    writes: list[str] = []
    opened, original = backend.client._open, backend.storage.write

    async def counting_open(method: str, path: str, **kw: Any) -> Any:
        methods[method] = methods.get(method, 0) + 1
        return await opened(method, path, **kw)

    async def counting_write(key: str, data: bytes, **kw: Any) -> None:
        writes.append(key)
        await original(key, data, **kw)

    backend.client._open = counting_open  # type: ignore[method-assign]
    backend.storage.write = counting_write  # type: ignore[method-assign]
    started = time.perf_counter()
    handle = await fn.aio.run_async_map([0] * n, max_concurrent=limit, pod_per_input=True)
    submitted = time.perf_counter() - started
    await handle.wait()
    elapsed = time.perf_counter() - started
    names = [k async for k in backend.storage.list(f"_groups/{handle.group_id}/")]
    by_pods = [k for k in names if "/results/" in k or "/logs/" in k]
    await handle.results()  # cleanup: one request deletes the batch's Jobs
    backend.client._open = opened  # type: ignore[method-assign]
    backend.storage.write = original  # type: ignore[method-assign]
    return {
        "inputs": n,
        "max_concurrent": limit,
        "submit_s": round(submitted, 2),
        "all_done_s": round(elapsed, 2),
        "k8s_requests_per_input": {m: round(c / n, 2) for m, c in sorted(methods.items())},
        "k8s_writes_per_input": round(sum(c for m, c in methods.items() if m != "GET") / n, 2),
        "storage_writes_per_input_by_submitter": round(len(writes) / n, 2),
        "submitter_writes": sorted({k.rsplit("/", 1)[-1] for k in writes}),
        "storage_objects_per_input_by_pods": round(len(by_pods) / n, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--latency-jobs", type=int, default=5)
    parser.add_argument("--batch-inputs", type=int, default=40)
    parser.add_argument("--batch-concurrency", type=int, default=8)
    parser.add_argument("--only-batch", action="store_true")
    args = parser.parse_args()
    _, image, cluster, bucket = testbed_target("b")
    opts = {
        "backend": "gke",
        "project": "kb",
        "cluster": cluster,
        "container_image": image,
        "accelerator": "cpu",
    }
    timed = kinetic.run(**opts)(finish_time)
    trivial = kinetic.run(**opts)(noop)

    squared = kinetic.run(**opts)(square)
    out = REPO / "benchmarks/results/cluster.json"

    async def run_all() -> dict[str, Any]:
        found: dict[str, Any] = {}
        if args.only_batch and out.exists():
            found = json.loads(out.read_text())
        else:
            found["latency"] = await latency(timed, args.latency_jobs, 5.0)
            found["submission"] = await submission(trivial, args.jobs)
        found["batch"] = await batch(squared, args.batch_inputs, args.batch_concurrency, bucket)
        await runtime.aclose_backends()
        return found

    results = anyio.run(run_all)
    results["note"] = "single-node testbed (k8s v1.20 on Docker, 2 cores), fake-gcs-server"
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
