"""GPUs on the user's machine: real jobs and batches on the local backend, with two GPUs
declared (``KINETIC_LOCAL_GPUS=0,1``), so that no test needs a real one. What is checked
is what a job sees (``CUDA_VISIBLE_DEVICES``, ``JAX_PLATFORMS``) and that no GPU is ever
held by two running jobs."""

from __future__ import annotations

import itertools
import json
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import kinetic
from runner.gpu_lease import GpuRequest, try_acquire
from tests.fix_env import job_dirs

pytestmark = pytest.mark.local

_SEEN = ("CUDA_VISIBLE_DEVICES", "JAX_PLATFORMS", "CUDA_DEVICE_ORDER")


@pytest.fixture(autouse=True)
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KINETIC_LOCAL_GPUS", "0,1")


def seen() -> dict[str, str | None]:
    return {name: os.environ.get(name) for name in _SEEN}


def hold(marker_dir: str, name: str) -> str:
    """Say which GPUs this job got, then keep them until told to let go (or 2 minutes)."""
    ids = os.environ["CUDA_VISIBLE_DEVICES"]
    Path(marker_dir, f"{name}.tmp").write_text(ids)
    Path(marker_dir, f"{name}.tmp").rename(Path(marker_dir, f"{name}.gpus"))  # whole, at once
    deadline = time.monotonic() + 120  # a failed test must not leave it running for ever
    while not Path(marker_dir, f"{name}.release").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return ids


def timed(x: int) -> tuple[str, float, float]:
    # CLOCK_MONOTONIC is one clock for every process of the machine.
    start = time.monotonic()
    time.sleep(0.3)
    return os.environ["CUDA_VISIBLE_DEVICES"], start, time.monotonic()


def eventually(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def gpus_of(marker_dir: Path, name: str) -> str:
    path = marker_dir / f"{name}.gpus"
    eventually(path.exists, f"job {name} to get its GPUs")
    return path.read_text()


def kill_job(root: Path, job: kinetic.JobHandle) -> None:
    launch = json.loads((root / "storage" / job.job_id / "launch.json").read_text())
    os.killpg(launch["pgid"], signal.SIGKILL)


def waits_for_gpus(job: kinetic.JobHandle) -> bool:
    report = job.status_report()
    return report.status is kinetic.JobStatus.PENDING and "waiting for" in (report.reason or "")


def test_gpu_jobs_see_exactly_their_gpus() -> None:
    assert kinetic.run(accelerator="gpu")(seen)() == {
        "CUDA_VISIBLE_DEVICES": "0",
        "JAX_PLATFORMS": "cuda",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }
    assert kinetic.run(accelerator="h100x2")(seen)()["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_cpu_jobs_see_no_gpu() -> None:
    assert kinetic.run(accelerator="cpu")(seen)() == {
        "CUDA_VISIBLE_DEVICES": "",
        "JAX_PLATFORMS": "cpu",
        "CUDA_DEVICE_ORDER": None,
    }


def test_gpus_are_exclusive_and_freed_by_a_killed_or_cancelled_job(
    tmp_path: Path, kinetic_env: Path
) -> None:
    fn = kinetic.run(accelerator="gpu")(hold)
    jobs: list[kinetic.JobHandle] = []
    try:
        _exclusive_then_freed(fn, jobs, tmp_path, kinetic_env)
    finally:
        for job in jobs:  # on failure: end what still runs
            job.cancel()


def _exclusive_then_freed(
    fn: kinetic.RemoteFunction[[str, str], str],
    jobs: list[kinetic.JobHandle],
    tmp_path: Path,
    kinetic_env: Path,
) -> None:
    a, b = fn.run_async(str(tmp_path), "a"), fn.run_async(str(tmp_path), "b")
    jobs += [a, b]
    a_ids, b_ids = gpus_of(tmp_path, "a"), gpus_of(tmp_path, "b")
    assert {a_ids, b_ids} == {"0", "1"}

    c = fn.run_async(str(tmp_path), "c")  # both GPUs are taken: it waits, queued
    jobs.append(c)
    eventually(lambda: waits_for_gpus(c), "job c to report that it waits for GPUs")
    assert not (tmp_path / "c.gpus").exists()
    assert "waiting for 1 GPU(s)" in (c.logs() or "")

    kill_job(kinetic_env, a)  # kill -9: the kernel drops its locks
    assert gpus_of(tmp_path, "c") == a_ids
    with pytest.raises(kinetic.JobFailedError):
        a.result(timeout=30)

    d = fn.run_async(str(tmp_path), "d")
    jobs.append(d)
    eventually(lambda: waits_for_gpus(d), "job d to report that it waits for GPUs")
    c.cancel()
    assert gpus_of(tmp_path, "d") == a_ids
    with pytest.raises(kinetic.JobCancelledError):
        c.result(timeout=30)

    for name in "bd":
        (tmp_path / f"{name}.release").touch()
    assert b.result(timeout=60) == b_ids
    assert d.result(timeout=60) == a_ids


def test_a_gpu_batch_runs_one_input_per_free_gpu() -> None:
    batch = kinetic.run(accelerator="gpu")(timed).run_async_map(range(6), max_concurrent=6)
    runs = batch.results(timeout=120)
    assert len(runs) == 6
    assert {ids for ids, _, _ in runs} == {"0", "1"}  # one id each, both GPUs used
    # Never more than two at once, and never one GPU for two running inputs.
    edges = sorted([(start, 1) for _, start, _ in runs] + [(end, -1) for _, _, end in runs])
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    assert peak <= 2
    for gpu in ("0", "1"):
        spans = sorted((s, e) for ids, s, e in runs if ids == gpu)
        assert all(e1 <= s2 for (_, e1), (s2, _) in itertools.pairwise(spans))


def die_once_on_a_gpu(marker_dir: str, x: int) -> str:
    marker = Path(marker_dir, f"{x}.died")
    if x == 1 and not marker.exists():
        marker.touch()
        os.kill(os.getpid(), signal.SIGKILL)  # the worker dies holding its GPU
    return os.environ["CUDA_VISIBLE_DEVICES"]


def test_a_killed_batch_worker_frees_its_gpu_for_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One GPU: the worker that replaces the dead one can only start once it is free.
    monkeypatch.setenv("KINETIC_LOCAL_GPUS", "0")
    fn = kinetic.run(accelerator="gpu")(die_once_on_a_gpu)
    batch = fn.run_async_map([(str(tmp_path), x) for x in range(4)], retries=1)
    assert batch.results(timeout=120) == ["0"] * 4
    assert (tmp_path / "1.died").exists()


def test_a_gpu_batch_waits_while_other_jobs_hold_every_gpu(kinetic_env: Path) -> None:
    # The machine's GPUs, held by another process of this root (as a job would hold them).
    lease = try_acquire(GpuRequest(2, ("0", "1"), str(kinetic_env / "gpus")))
    assert lease is not None
    try:
        batch = kinetic.run(accelerator="gpu")(timed).run_async_map(range(2))
        member = batch.jobs[0]
        assert member is not None
        group_dir = kinetic_env / "storage" / "_groups" / batch.group_id
        eventually((group_dir / "gpu_wait.json").exists, "the batch to wait for GPUs")
        report = member.status_report()
        assert report.status is kinetic.JobStatus.PENDING
        assert "waiting for GPUs" in (report.reason or "")
        time.sleep(0.5)
        assert batch.status_counts().get("SUCCEEDED", 0) == 0
    finally:
        lease.close()
    assert [ids for ids, _, _ in batch.results(timeout=120)] in (["0", "0"], ["0", "1"])


def test_more_gpus_than_the_machine_has_is_a_clear_error(kinetic_env: Path) -> None:
    with pytest.raises(kinetic.AcceleratorError) as info:
        kinetic.run(accelerator="gpu:4")(seen).run_async()
    assert "0 (model unknown), 1 (model unknown)" in str(info.value)
    with pytest.raises(kinetic.AcceleratorError, match="needs 8 GPU"):
        kinetic.run(accelerator="h100x8")(timed).run_async_map(range(2))
    assert job_dirs(kinetic_env) == []


def test_tpu_code_runs_on_cpus_only_when_asked(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, kinetic_env: Path
) -> None:
    fn = kinetic.run(accelerator="v5e-2x4")(seen)
    with pytest.raises(kinetic.AcceleratorError, match="KINETIC_LOCAL_ACCELERATOR=cpu"):
        fn.run_async()
    assert job_dirs(kinetic_env) == []
    monkeypatch.setenv("KINETIC_LOCAL_ACCELERATOR", "cpu")
    assert fn() == {"CUDA_VISIBLE_DEVICES": "", "JAX_PLATFORMS": "cpu", "CUDA_DEVICE_ORDER": None}
    assert fn()["JAX_PLATFORMS"] == "cpu"
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "emulated" in r.getMessage()
    ]
    assert len(warnings) == 1
    assert "tpu-v5litepod-8" in warnings[0]
