"""Faults injected on the testbed: nothing lost.

Every test here points its jobs at :class:`tests.faultproxy.FaultProxy` instances in
front of fake-gcs-server (``STORAGE_EMULATOR_HOST``, which the pods inherit: their
runner's storage traffic meets the same faults) and the kube-apiserver (a kubeconfig
whose server is the proxy, serving TLS). The proxies answer 5xx and 429, reset
connections before or after the upstream served a request, and add latency, at set
rates from a seed. No timed asserts: the times are figures, written with the faults
counted to ``benchmarks/results/faults.json`` (see benchmarks/README.md).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

import anyio
import pytest

import kinetic
from kinetic._engine import runtime
from runner import protocol
from tests.faultproxy import Faults
from tests.fix_cluster import REPO, GKETarget, run_python
from tests.fix_faults import NONE, Faulty, slow_triple, waiting_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]


@pytest.fixture(autouse=True)
def _leaderless(monkeypatch: pytest.MonkeyPatch) -> None:
    """The leaderless pool (not the default engine): these tests look at its bursts and claims."""
    monkeypatch.setenv("KINETIC_GKE_POOL_ENGINE", "pool")


STORAGE_FAULTS = Faults(rate=0.10, latency_rate=0.10, seed=24)
API_FAULTS = Faults(rate=0.05, latency_rate=0.05, seed=42)
FIGURES = REPO / "benchmarks" / "results" / "faults.json"


def triple(x: int) -> int:
    return 3 * x


def outcomes(gke: GKETarget, group_id: str) -> Counter[int]:
    """How many outcome records each input has in storage, read from the names: the
    bursts' ranges of inputs, and single outcome objects."""
    found: Counter[int] = Counter()
    prefix = protocol.group_bursts_prefix(group_id)
    for key in gke.object_names(prefix):
        span = protocol.parse_burst_name(key.removeprefix(prefix))
        if span is not None:
            found.update(range(span[0], span[1]))
    singles = protocol.group_results_prefix(group_id)
    for key in gke.object_names(singles):
        if key.endswith(".res"):
            found[int(key.removeprefix(singles).removesuffix(".res"))] += 1
    return found


def record(section: str, figures: dict[str, Any]) -> None:
    """Merge one test's figures into ``benchmarks/results/faults.json``."""
    try:
        doc = json.loads(FIGURES.read_text())
    except (OSError, ValueError):
        doc = {}
    doc["about"] = (
        "tests/cluster/test_faults.py on the testbed: fault proxies in front of "
        "fake-gcs-server and the kube-apiserver (tests/faultproxy.py)"
    )
    doc[section] = {"date": time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime()), **figures}
    FIGURES.parent.mkdir(parents=True, exist_ok=True)
    FIGURES.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


def test_a_500_input_pool_batch_under_faults_loses_and_doubles_nothing(faulty: Faulty) -> None:
    n, workers = 500, 4
    fn = kinetic.run(**faulty.gke.run_args())(triple)
    runs: dict[str, dict[str, Any]] = {}
    for label, storage, api in (("baseline", NONE, NONE), ("faults", STORAGE_FAULTS, API_FAULTS)):
        faulty.set(storage, api)
        before = faulty.snapshot()
        started = time.monotonic()
        batch = fn.run_async_map(range(n), max_concurrent=workers)
        values = batch.results(timeout=420, cleanup=False)
        elapsed = time.monotonic() - started
        faulty.set(NONE, NONE)
        group = f"_groups/{batch.group_id}/"
        recorded = outcomes(faulty.gke, batch.group_id)
        claims = faulty.gke.object_names(group + "claims/")
        batch.cleanup()
        assert values == [3 * i for i in range(n)], label  # every value right, in order
        assert sorted(recorded) == list(range(n)), label  # an outcome for every input
        runs[label] = {
            "seconds": round(elapsed, 2),
            "inputs_per_s": round(n / elapsed, 1),
            "values_lost": n - sum(v == 3 * i for i, v in enumerate(values)),
            "values_duplicated": len(values) - len(set(values)),
            # An input whose worker stalled past its lease may be recorded twice (the
            # first record stands): counted, never a value reported twice.
            "inputs_recorded_twice": sum(1 for c in recorded.values() if c > 1),
            "claims": len(claims),
            "proxies": faulty.since(before),
        }
    extra = runs["faults"]["seconds"] - runs["baseline"]["seconds"]
    record(
        "pool_batch_500",
        {
            "inputs": n,
            "workers": workers,
            "storage_faults": STORAGE_FAULTS.rate,
            "api_faults": API_FAULTS.rate,
            "extra_seconds": round(extra, 2),
            # Every injected fault was met by the client sending again (or, for a watch,
            # reconnecting): the values all arrived.
            "retries": runs["faults"]["proxies"]["storage"]["injected"]
            + runs["faults"]["proxies"]["api"]["injected"],
            "slowdown": round(runs["faults"]["seconds"] / runs["baseline"]["seconds"], 2),
            **runs,
        },
    )


def test_20_concurrent_jobs_under_faults_are_right_or_fail_clearly(faulty: Faulty) -> None:
    n, timeout = 20, 240.0  # the one node runs a few at a time (faulty: start grace 240 s)
    fn = kinetic.run(**faulty.gke.run_args())(triple)
    outcomes: dict[int, Any] = {}
    waited: dict[int, float] = {}

    async def one(i: int) -> None:
        started = time.monotonic()
        try:
            job = await fn.aio.run_async(i)
            outcomes[i] = await job.result(timeout=timeout)
        except kinetic.KineticError as exc:
            outcomes[i] = exc
        waited[i] = time.monotonic() - started

    async def main() -> None:
        try:
            async with anyio.create_task_group() as tg:
                for i in range(n):
                    tg.start_soon(one, i)
        finally:
            await runtime.aclose_backends()

    faulty.set(STORAGE_FAULTS, API_FAULTS)
    before = faulty.snapshot()
    started = time.monotonic()
    anyio.run(main)
    elapsed = time.monotonic() - started
    faulty.set(NONE, NONE)
    faults = faulty.since(before)
    errors = {i: v for i, v in outcomes.items() if isinstance(v, BaseException)}
    assert sorted(outcomes) == list(range(n))
    for i, value in outcomes.items():
        if i not in errors:
            assert value == 3 * i
    for i, exc in errors.items():  # a clear error naming where it failed, never a hang
        assert not isinstance(exc, kinetic.JobTimeoutError), (i, exc)
        assert isinstance(exc, kinetic.KineticError), (i, exc)
    record(
        "single_jobs_20",
        {
            "jobs": n,
            "storage_faults": STORAGE_FAULTS.rate,
            "api_faults": API_FAULTS.rate,
            "seconds": round(elapsed, 2),
            "slowest_job_seconds": round(max(waited.values()), 2),
            "values_right": n - len(errors),
            "retries": faults["storage"]["injected"] + faults["api"]["injected"],
            "values_lost": 0,
            "clear_errors": {str(i): f"{type(e).__name__}: {e}"[:300] for i, e in errors.items()},
            "proxies": faults,
        },
    )


def test_waiters_resume_after_the_apiserver_goes_away_during_a_watch(faulty: Faulty) -> None:
    n, outage = 6, 8.0
    fn = kinetic.run(**faulty.gke.run_args())(slow_triple)
    seen: dict[str, Any] = {}

    async def main() -> None:
        backend = faulty.gke.backend()
        try:
            jobs = [await fn.aio.run_async(6.0 + 0.2 * i) for i in range(n)]
            # The waiters' watch is open; once every pod runs, the apiserver goes away
            # (all connections dropped, new ones refused) while the jobs end (they sleep
            # 6-7 s; the outage lasts longer).
            async with waiting_for(jobs) as waited:
                watch = backend.cluster.watch(faulty.gke.namespace)
                seen["connects_before"] = watch.connects
                faulty.api.outage(outage)
                seen["outage_at"] = time.monotonic()
            seen["done_at"] = max(waited.arrived.values())
            seen["connects_after"] = watch.connects
            seen["values"] = waited.values
            for job in jobs:
                await job.cleanup()
        finally:
            await runtime.aclose_backends()

    before = faulty.snapshot()
    anyio.run(main)
    counts = faulty.since(before)["api"]
    assert counts.get("outages") == 1
    assert counts.get("dropped", 0) >= 1  # the watch's connections among them
    assert seen["values"] == {i: 3 * (6.0 + 0.2 * i) for i in range(n)}
    assert seen["connects_after"] > seen["connects_before"]  # it resumed
    record(
        "apiserver_outage_during_watch",
        {
            "stand_in": "the API proxy drops every connection and refuses new ones "
            f"(listening socket closed) for {outage} s; the real apiserver keeps running",
            "jobs": n,
            "outage_seconds": outage,
            "connections_dropped": counts.get("dropped", 0),
            "watch_reconnects": seen["connects_after"] - seen["connects_before"],
            "last_result_after_outage_end_s": round(
                seen["done_at"] - seen["outage_at"] - outage, 2
            ),
            "values_lost": 0,
        },
    )


def pause(x: int) -> int:
    time.sleep(0.2)
    return x


def test_a_pool_batch_outlives_storage_going_away(faulty: Faulty) -> None:
    # Storage refuses every connection for a while mid-batch: requests use up their
    # retries, workers exit (their pods are replaced, their claims taken over once their
    # leases end) and the follower's steps fail. Nothing may be lost, and results() must
    # wait on, not give up.
    n, outage = 60, 6.0
    fn = kinetic.run(**faulty.gke.run_args())(pause)
    batch = fn.run_async_map(range(n), max_concurrent=3)
    for _ in range(600):
        if len(outcomes(faulty.gke, batch.group_id)) >= 10:
            break
        time.sleep(0.2)
    else:
        pytest.fail("the pool made no progress")
    before = faulty.snapshot()
    started = time.monotonic()
    faulty.storage.outage(outage)
    values = batch.results(timeout=400, cleanup=False)
    elapsed = time.monotonic() - started
    claims = faulty.gke.object_names(f"_groups/{batch.group_id}/claims/")
    recorded = outcomes(faulty.gke, batch.group_id)
    batch.cleanup()
    assert values == list(range(n))
    assert sorted(recorded) == list(range(n))
    record(
        "storage_outage_during_pool_batch",
        {
            "inputs": n,
            "outage_seconds": outage,
            "connections_dropped": faulty.since(before)["storage"].get("dropped", 0),
            "claims": len(claims),
            "inputs_recorded_twice": sum(1 for c in recorded.values() if c > 1),
            "seconds_from_outage_to_all_values": round(elapsed, 2),
            "values_lost": 0,
        },
    )


def test_a_corrupted_result_in_storage_is_a_result_error(faulty: Faulty) -> None:
    fn = kinetic.run(**faulty.gke.run_args())(triple)
    job = fn.run_async(7_000_007)
    assert job.result(timeout=180, cleanup=False) == 21_000_021
    key = f"{job.job_id}/result.pkl"
    stored = faulty.get_object(key)
    for position in (len(stored) // 2, len(stored) - 20, 3):
        changed = bytearray(stored)
        changed[position] ^= 0x01
        faulty.put_object(key, bytes(changed))
        with pytest.raises(kinetic.ResultError, match="corrupted"):
            kinetic.attach(job.job_id, backend="gke", **_where(faulty)).result(
                timeout=60, cleanup=False
            )
    faulty.put_object(key, stored[: len(stored) // 2])  # truncated
    with pytest.raises(kinetic.ResultError, match="corrupted"):
        kinetic.attach(job.job_id, backend="gke", **_where(faulty)).result(
            timeout=60, cleanup=False
        )
    job.cleanup()

    # A pool batch's burst of outcomes: its inputs fail with a ResultError, the rest arrive.
    batch = fn.run_async_map(range(6), max_concurrent=2)
    assert batch.results(timeout=240, cleanup=False) == [3 * i for i in range(6)]
    prefix = protocol.group_bursts_prefix(batch.group_id)
    key, first, end = next(
        (k, span[0], span[1])
        for k in faulty.gke.object_names(prefix)
        if (span := protocol.parse_burst_name(k.removeprefix(prefix))) and span[0] <= 2 < span[1]
    )
    stored = faulty.get_object(key)
    changed = bytearray(stored)
    changed[-12] ^= 0x01
    faulty.put_object(key, bytes(changed))
    assert faulty.get_object(key) == bytes(changed)
    # Another process (this one's loop keeps the outcomes it read) attaches and reads.
    code = f"""
import kinetic
batch = kinetic.attach_batch({batch.group_id!r}, backend="gke", **{_where(faulty)!r})
out = batch.results(timeout=120, cleanup=False, return_exceptions=True)
print([type(v).__name__ if isinstance(v, BaseException) else v for v in out])
print(out[2])
"""
    shown = run_python(code).stdout.splitlines()
    expected = ["ResultError" if first <= i < end else 3 * i for i in range(6)]
    assert shown[0] == str(expected), shown
    assert "corrupted" in shown[1], shown
    batch.cleanup()
    record("corrupted_results", {"single_job": "ResultError", "pool_outcome": "ResultError"})


def _where(faulty: Faulty) -> dict[str, str]:
    return {"project": faulty.gke.project, "cluster": faulty.gke.cluster}
