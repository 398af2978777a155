"""The local backend says once what a GPU or TPU job's image would have that this
interpreter lacks (its runtime: JAX's CUDA plugin or libtpu, Keras), and gives every job
``KERAS_BACKEND=jax`` unless the user chose another."""

from __future__ import annotations

import logging
import os

import pytest

import kinetic
from kinetic._engine import interpreter_checks

pytestmark = pytest.mark.local


def keras_backend() -> str | None:
    return os.environ.get("KERAS_BACKEND")


def said(caplog: pytest.LogCaptureFixture, words: str) -> list[str]:
    """The warnings of Kinetic's loggers that hold ``words``; forgets what was logged."""
    found = [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("kinetic.")
        and r.levelno == logging.WARNING
        and words in r.getMessage()
    ]
    caplog.clear()
    return found


def test_a_tpu_job_names_what_its_image_has_and_this_interpreter_lacks(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("KINETIC_LOCAL_ACCELERATOR", "cpu")  # TPU jobs on this machine's CPUs
    monkeypatch.setattr(interpreter_checks, "_warned_categories", set())
    monkeypatch.delenv("KERAS_BACKEND", raising=False)
    remote = kinetic.run(accelerator="tpu-v5litepod-4")(keras_backend)
    assert remote() == "jax"
    warnings = said(caplog, "TPU job's image")
    assert len(warnings) == 1
    assert "libtpu (JAX's TPU backend)" in warnings[0]
    assert "keras (" not in warnings[0]  # the test extra holds keras and jax
    assert remote() == "jax"
    assert said(caplog, "TPU job's image") == []  # said once


def test_a_gpu_batch_names_what_its_image_has_and_this_interpreter_lacks_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("KINETIC_LOCAL_GPUS", "0")  # one declared GPU: no job here uses it
    monkeypatch.setattr(interpreter_checks, "_warned_categories", set())
    monkeypatch.delenv("KERAS_BACKEND", raising=False)
    remote = kinetic.run(accelerator="gpu")(echo_backend)
    assert remote.run_async_map(range(3)).results() == ["jax"] * 3
    warnings = said(caplog, "GPU job's image")
    assert len(warnings) == 1
    assert "jax-cuda12-plugin (JAX's CUDA plugin)" in warnings[0]
    assert remote.run_async_map(range(2)).results() == ["jax"] * 2
    assert said(caplog, "GPU job's image") == []  # said once


def echo_backend(_: int) -> str | None:
    return os.environ.get("KERAS_BACKEND")


def test_the_users_keras_backend_wins_and_cpu_jobs_say_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(interpreter_checks, "_warned_categories", set())
    monkeypatch.setenv("KERAS_BACKEND", "torch")
    assert kinetic.run()(keras_backend)() == "torch"
    monkeypatch.delenv("KERAS_BACKEND")
    assert kinetic.run()(keras_backend)() == "jax"
    assert said(caplog, "job's image") == []


def test_what_a_gpu_job_lacks_here_is_named() -> None:
    missing = interpreter_checks.missing_runtime("gpu")
    assert missing == ["jax-cuda12-plugin (JAX's CUDA plugin)"]  # jax, keras: installed
    assert interpreter_checks.missing_runtime("cpu") == []
