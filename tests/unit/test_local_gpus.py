"""Accelerators on the user's machine, the pure parts: which GPUs a job gets, what a job's
accelerator means locally, and how the machine's GPUs are found."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from kinetic._backends.local_gpus import apply_job_env, parse_declared, select_gpus
from kinetic._core.accelerators import (
    LocalGpu,
    gpu_model_matches,
    names_gpu_model,
    parse_accelerator,
    plan_local,
)
from kinetic._exceptions import AcceleratorError, ConfigError
from runner.gpu_lease import REQUEST_ENV, GpuRequest, choose, visible_devices

# --------------------------------------------------------------------------- choosing GPUs


def test_choose_grants_the_first_free_gpus_in_machine_order() -> None:
    assert choose(("0", "1", "2", "3"), set(), 1) == ("0",)
    assert choose(("0", "1", "2", "3"), {"0", "2"}, 2) == ("1", "3")
    assert choose(("3", "1"), set(), 2) == ("3", "1")


def test_choose_waits_rather_than_granting_part_of_a_request() -> None:
    assert choose(("0", "1", "2"), {"1", "2"}, 2) is None
    assert choose(("0", "1"), {"0", "1"}, 1) is None


@pytest.mark.parametrize("count", [0, -1, 3])
def test_choose_refuses_a_request_that_could_never_be_granted(count: int) -> None:
    with pytest.raises(ValueError, match="cannot grant"):
        choose(("0", "1"), set(), count)


@pytest.mark.parametrize("seed", range(20))
def test_a_machine_shared_by_many_jobs_never_grants_a_gpu_twice(seed: int) -> None:
    """Jobs of 1-4 GPUs arrive, finish, crash or are cancelled (all three just drop the
    holder's locks) on an 8-GPU machine; waiting jobs look again after every release."""
    rng = random.Random(seed)
    machine = tuple(str(i) for i in range(8))
    held: dict[int, tuple[str, ...]] = {}
    waiting: list[tuple[int, int]] = []
    granted_after_wait = 0
    for job in range(400):
        if held and rng.random() < 0.5:
            del held[rng.choice(sorted(held))]  # ended, crashed or cancelled
            still: list[tuple[int, int]] = []
            for waiter, count in waiting:
                busy = {gpu for ids in held.values() for gpu in ids}
                got = choose(machine, busy, count)
                if got is None:
                    still.append((waiter, count))
                else:
                    held[waiter] = got
                    granted_after_wait += 1
            waiting = still
        count = rng.choice((1, 1, 2, 4))
        busy = {gpu for ids in held.values() for gpu in ids}
        got = choose(machine, busy, count)
        if got is None:
            assert len(machine) - len(busy) < count  # it waits only when it must
            waiting.append((job, count))
        else:
            assert len(got) == count
            assert not busy & set(got)
            held[job] = got
        taken = [gpu for ids in held.values() for gpu in ids]
        assert len(taken) == len(set(taken))  # never granted twice
    assert granted_after_wait > 0  # releases did hand GPUs to waiting jobs


def test_gpu_request_travels_in_one_variable() -> None:
    request = GpuRequest(2, ("0", "1", "3"), "/r/gpus")
    assert GpuRequest.from_env({REQUEST_ENV: request.to_env()}) == request
    assert request.max_holders == 1
    assert GpuRequest.from_env({}) is None
    with pytest.raises(ValueError, match="malformed"):
        GpuRequest.from_env({REQUEST_ENV: '{"count": 1}'})
    with pytest.raises(ValueError, match="cannot grant"):
        GpuRequest(3, ("0", "1"), "/r/gpus")


def test_visible_devices_numbers_gpus_as_nvml_does() -> None:
    assert visible_devices(("2", "0")) == {
        "CUDA_VISIBLE_DEVICES": "2,0",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }


# --------------------------------------------------------------------------- local plans

H100S = (LocalGpu("0", "NVIDIA H100 80GB HBM3"), LocalGpu("1", "NVIDIA H100 80GB HBM3"))
DECLARED = (LocalGpu("0"), LocalGpu("1"))


def test_cpu_jobs_hold_no_gpu_and_say_cpu_to_jax() -> None:
    plan = plan_local(parse_accelerator("cpu:2"), H100S)
    assert (plan.gpus, plan.jax_platforms, plan.warning) == (0, "cpu", None)


@pytest.mark.parametrize(("name", "count"), [("gpu", 1), ("gpu:2", 2), ("h100x2", 2), ("2", 2)])
def test_gpu_jobs_hold_their_count_and_say_cuda(name: str, count: int) -> None:
    plan = plan_local(parse_accelerator(name), H100S, requested=name)
    assert (plan.gpus, plan.jax_platforms, plan.warning) == (count, "cuda", None)


def test_a_model_the_machine_lacks_runs_on_what_it_has_with_a_warning() -> None:
    plan = plan_local(parse_accelerator("gpu-l4"), H100S, requested="gpu-l4")
    assert plan.gpus == 1
    assert plan.warning is not None
    assert "l4" in plan.warning
    assert "NVIDIA H100 80GB HBM3" in plan.warning


def test_no_model_warning_for_generic_names_or_declared_gpus() -> None:
    # "gpu" resolves to a catalog model (l4) but names none.
    assert plan_local(parse_accelerator("gpu"), H100S, requested="gpu").warning is None
    assert plan_local(parse_accelerator("l4"), DECLARED, requested="l4").warning is None


def test_more_gpus_than_the_machine_has_lists_the_machines_gpus() -> None:
    with pytest.raises(AcceleratorError) as info:
        plan_local(parse_accelerator("gpu:4"), H100S, requested="gpu:4")
    message = str(info.value)
    assert "needs 4 GPU(s)" in message
    assert "0 (NVIDIA H100 80GB HBM3), 1 (NVIDIA H100 80GB HBM3)" in message
    with pytest.raises(AcceleratorError, match="has 0: none"):
        plan_local(parse_accelerator("gpu"), (), requested="gpu")


def test_tpus_are_an_error_unless_emulated_on_cpus() -> None:
    cfg = parse_accelerator("tpu-v5litepod-4")
    with pytest.raises(AcceleratorError, match="KINETIC_LOCAL_ACCELERATOR=cpu"):
        plan_local(cfg, H100S)
    plan = plan_local(cfg, H100S, tpu_on_cpu=True)
    assert (plan.gpus, plan.jax_platforms) == (0, "cpu")
    assert plan.warning is not None
    assert "tpu-v5litepod-4" in plan.warning


@pytest.mark.parametrize(
    ("gpu_type", "model", "matches"),
    [
        ("h100", "NVIDIA H100 80GB HBM3", True),
        ("h100", "NVIDIA H100 PCIe", True),
        ("l4", "NVIDIA L4", True),
        ("l4", "NVIDIA L40S", False),
        ("a100-80gb", "NVIDIA A100-SXM4-80GB", True),
        ("a100-80gb", "NVIDIA A100-SXM4-40GB", False),
        ("a100", "NVIDIA A100-SXM4-40GB", True),
        ("a100", "NVIDIA A100-SXM4-80GB", False),
        ("t4", "Tesla T4", True),
        ("v100", "Tesla V100-SXM2-16GB", True),
        ("p4", "Tesla P40", False),
    ],
)
def test_gpu_model_matches(gpu_type: str, model: str, matches: bool) -> None:
    assert gpu_model_matches(gpu_type, model) is matches


@pytest.mark.parametrize(
    ("name", "names_model"),
    [("gpu", False), ("gpu:2", False), ("gpu-4", False), ("2", False), ("gpu:spot", False)]
    + [("l4", True), ("gpu-l4", True), ("h100x2", True), ("nvidia-l4:spot", True)],
)
def test_names_gpu_model(name: str, names_model: bool) -> None:
    assert names_gpu_model(name) is names_model


# --------------------------------------------------------------------------- inventory


def test_declared_gpus() -> None:
    assert parse_declared("0,2") == ("0", "2")
    assert parse_declared(" 1 , 03 ") == ("1", "3")
    assert parse_declared("") == () == parse_declared("none")
    with pytest.raises(ConfigError, match="not a GPU index"):
        parse_declared("0,gpu1")
    with pytest.raises(ConfigError, match="twice"):
        parse_declared("1,1")


def test_the_variable_restricts_nvml_or_declares_without_it() -> None:
    assert select_gpus(H100S, None) == H100S
    assert select_gpus(None, None) == ()
    assert select_gpus(H100S, "1") == (H100S[1],)
    assert select_gpus(H100S, "") == ()
    assert select_gpus(None, "0,2") == (LocalGpu("0"), LocalGpu("2"))
    with pytest.raises(ConfigError, match="NVML does not report"):
        select_gpus(H100S, "0,5")


# --------------------------------------------------------------------------- environment


def test_job_environment_is_the_pods(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KINETIC_LOCAL_GPUS", "0")  # declared (or restricting NVML's)
    env = {REQUEST_ENV: "stale", "JAX_PLATFORMS": "tpu"}
    apply_job_env(env, "cpu", tmp_path)
    pod = {"JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": "", "KERAS_BACKEND": "jax"}
    assert env == pod
    apply_job_env(env, "tpu-v6e-8", tmp_path)  # admitted: emulated on CPUs
    assert env == pod
    own = {"KERAS_BACKEND": "torch"}  # the user's own choice stays
    apply_job_env(own, "cpu", tmp_path)
    assert own["KERAS_BACKEND"] == "torch"
    apply_job_env(env, "gpu:spot", tmp_path)
    assert env["JAX_PLATFORMS"] == "cuda"
    assert env["CUDA_VISIBLE_DEVICES"] == ""  # until the job's lease names its GPUs
    assert json.loads(env[REQUEST_ENV]) == {
        "count": 1,
        "ids": ["0"],
        "dir": str(tmp_path / "gpus"),
    }
