"""GKE batches on the cluster testbed: a worker pool versus one Kubernetes Job per input.

Same run, same function (a trivial ``square``), same testbed:

* **pool** (the default): ``--inputs`` inputs (default 1,000) on one Job of
  ``--workers`` pods (default 4);
* **pod per input** (``pod_per_input=True``): ``--per-input-inputs`` inputs (default
  100: with one pod start-up per input, 1,000 would take most of an hour on this 2-core
  testbed) with ``--workers`` Jobs alive at once.

For each: submission → every value (``results(cleanup=False)``), inputs/s; then
``cleanup()``. Kubernetes requests are counted at the client by method over the whole
life of the batch (submission, following, cleanup); storage objects written per input
by the pods are counted in the bucket (claims and outcomes for the pool; outcomes and
logs per pod). Targets (issue 9): pool ≥ 20× the per-input path's inputs/s, ≤ 0.01
Kubernetes requests per input.

Needs the testbed: it runs ``tests/testbed/up`` itself. Writes
``benchmarks/results/gke_pool.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import ensure_kinetic_interpreter, machine, verdict, write_results
from benchmarks.bench_cluster import testbed_target


def square(x: int) -> int:
    return x * x


async def one_batch(fn: Any, bucket: str, namespace: str, n: int, workers: int, pods: bool) -> Any:
    from kinetic._engine import runtime
    from kinetic._settings import load_settings

    # The backend the jobs use (same cluster context and client), to count its requests.
    project, cluster = bucket.split("-kn-")[0], bucket.split("-kn-")[1].removesuffix("-jobs")
    settings = load_settings(backend="gke", project=project, cluster=cluster, namespace=namespace)
    backend = runtime.backend_for_settings(settings)
    methods: Counter[str] = Counter()
    opened = backend.client._open

    async def counting_open(method: str, path: str, **kw: Any) -> Any:
        methods[method] += 1
        return await opened(method, path, **kw)

    backend.client._open = counting_open  # type: ignore[method-assign]
    try:
        started = time.perf_counter()
        batch = await fn.aio.run_async_map(range(n), max_concurrent=workers, pod_per_input=pods)
        submitted = time.perf_counter() - started
        values = await batch.results(cleanup=False)
        elapsed = time.perf_counter() - started
        assert values == [i * i for i in range(n)]
        names = [k async for k in backend.storage.list(f"_groups/{batch.group_id}/")]
        by_pods = [k for k in names if "/results/" in k or "/logs/" in k or "/claims/" in k]
        await batch.cleanup()
    finally:
        backend.client._open = opened  # type: ignore[method-assign]
    requests = sum(methods.values())
    return {
        "inputs": n,
        "workers" if not pods else "jobs_alive": workers,
        "submit_s": round(submitted, 2),
        "all_values_s": round(elapsed, 2),
        "inputs_per_s": round(n / elapsed, 2),
        "k8s_requests": dict(sorted(methods.items())),
        "k8s_requests_per_input": round(requests / n, 4),
        "k8s_writes_per_input": round(sum(c for m, c in methods.items() if m != "GET") / n, 4),
        "storage_objects_per_input_by_pods": round(len(by_pods) / n, 2),
    }


def main() -> None:
    ensure_kinetic_interpreter()
    parser = argparse.ArgumentParser()
    parser.add_argument("--inputs", type=int, default=1000)
    parser.add_argument("--per-input-inputs", type=int, default=100)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()

    import kinetic
    from kinetic._engine import runtime

    env, image, cluster, bucket = testbed_target("p")
    namespace = env["KINETIC_TESTBED_NAMESPACE"]
    fn = kinetic.run(
        backend="gke",
        project="kb",
        cluster=cluster,
        namespace=namespace,
        container_image=image,
        accelerator="cpu",
    )(square)

    async def run_all() -> dict[str, Any]:
        # Warm-up: image pulled on the node, context archive stored, backend made.
        for pods in (False, True):
            warm = await fn.aio.run_async_map([1, 2], max_concurrent=2, pod_per_input=pods)
            await warm.results()
        out = {
            "pool": await one_batch(fn, bucket, namespace, args.inputs, args.workers, False),
            "pod_per_input": await one_batch(
                fn, bucket, namespace, args.per_input_inputs, args.workers, True
            ),
        }
        await runtime.aclose_backends()
        return out

    results = anyio.run(run_all)
    ratio = results["pool"]["inputs_per_s"] / results["pod_per_input"]["inputs_per_s"]
    per_input = results["pool"]["k8s_requests_per_input"]
    results["pool_vs_pod_per_input_throughput"] = round(ratio, 1)
    results["targets"] = {
        "throughput_ratio >= 20": verdict(ratio, 20.0, lower_is_better=False),
        "pool k8s requests per input <= 0.01": verdict(per_input, 0.01),
    }
    minutes = args.inputs / results["pod_per_input"]["inputs_per_s"] / 60
    results["note"] = (
        "single-node testbed (k8s v1.20 on Docker, 2 cores shared by the cluster, the pods "
        "and this client), fake-gcs-server; the per-input path measured on "
        f"{args.per_input_inputs} inputs: at its rate, {args.inputs} would take about "
        f"{minutes:.0f} minutes here (one pod start-up per input)"
    )
    results["machine"] = machine()
    path = write_results("gke_pool", results)
    print(json.dumps(results, indent=2))
    print(f"written to {path}")


if __name__ == "__main__":
    main()
