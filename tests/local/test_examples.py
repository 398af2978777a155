"""The Keras and JAX examples run as written, on the local backend.

``examples/keras_training.py`` is the original's front-page example (a small
``keras.Sequential`` fit whose final loss comes back); ``examples/jax_training.py`` a
jitted training step; ``examples/checkpointing.py`` a Keras fit that checkpoints to a
fixed ``KINETIC_OUTPUT_DIR`` and resumes after a stop; ``examples/sweep.py`` a
hyper-parameter sweep with ``run_async_map``. Each runs as a real job with this
interpreter (the test extra holds the runtime's default jax and keras), with
``KERAS_BACKEND`` set by Kinetic.
"""

from __future__ import annotations

import importlib.util
import math
import sys
import uuid
from pathlib import Path
from types import ModuleType

import pytest

import kinetic
from kinetic._core.accel_runtime import DEFAULTS

pytestmark = [pytest.mark.local, pytest.mark.timeout(240)]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load_example(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """Import ``examples/{name}.py`` as a user's script would be: its directory is the
    project (no requirements file there)."""
    monkeypatch.setenv("KINETIC_PACKAGE_ROOT", str(EXAMPLES))
    monkeypatch.delenv("KERAS_BACKEND", raising=False)
    module_name = f"kt_example_{name}_{uuid.uuid4().hex[:8]}"
    spec = importlib.util.spec_from_file_location(module_name, EXAMPLES / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    monkeypatch.setattr(sys, "modules", {**sys.modules})  # forgotten after the test
    spec.loader.exec_module(module)
    return module


def test_keras_example_fits_and_returns_its_final_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    example = load_example("keras_training", monkeypatch)
    assert isinstance(example.train, kinetic.RemoteFunction)
    job = example.train.run_async(epochs=3)
    loss = job.result(timeout=200, cleanup=False)
    assert isinstance(loss, float)
    assert math.isfinite(loss)
    logs = job.logs() or ""
    assert "on the jax backend" in logs  # KERAS_BACKEND=jax, set by Kinetic
    assert f"keras {DEFAULTS['keras']}" in logs
    job.cleanup()


def test_jax_example_runs_a_jitted_training_step(monkeypatch: pytest.MonkeyPatch) -> None:
    example = load_example("jax_training", monkeypatch)
    out = example.train(steps=100)
    assert out["device"] == "cpu"
    assert out["jax"] == DEFAULTS["jax"]
    assert out["final_loss"] < out["first_loss"] / 10  # it trained


def test_checkpointing_example_resumes_where_the_stopped_run_was(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KINETIC_EXAMPLE_CHECKPOINTS", str(tmp_path / "checkpoints"))
    example = load_example("checkpointing", monkeypatch)
    with pytest.raises(RuntimeError, match="stopped after epoch 2"):
        example.train(4, stop_after=2)
    assert (tmp_path / "checkpoints" / "epoch.txt").read_text() == "2"
    out = example.train(4)
    assert out["resumed_from"] == 2
    assert out["epochs"] == 4
    assert math.isfinite(out["loss"])
    assert (tmp_path / "checkpoints" / "model.keras").is_file()


def test_sweep_example_runs_one_job_per_rate_and_picks_the_best(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    example = load_example("sweep", monkeypatch)
    best = example.sweep([0.001, 0.05, 0.2])
    assert best["learning_rate"] == 0.2  # the largest stable rate converges furthest
    assert best["loss"] < 0.05
    printed = capsys.readouterr().out
    inputs = [line.split()[1] for line in printed.splitlines() if line.startswith("input ")]
    assert sorted(inputs) == ["0", "1", "2"]
