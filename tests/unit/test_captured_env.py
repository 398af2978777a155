"""capture_env_vars: which names look like secrets, and the one warning about them."""

from __future__ import annotations

import pytest

from kinetic._core.config import secret_like
from kinetic._engine import captured_env


def test_secret_like_names() -> None:
    names = [
        "HF_TOKEN",
        "AWS_SECRET_ACCESS_KEY",
        "DB_PASSWORD",
        "OPENAI_API_KEY",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "WANDB_PROJECT",
        "BATCH_SIZE",
        "LANG",
    ]
    assert secret_like(names) == [
        "AWS_SECRET_ACCESS_KEY",
        "DB_PASSWORD",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "HF_TOKEN",
        "OPENAI_API_KEY",
    ]


def test_a_captured_secret_is_named_once_per_process(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(captured_env, "_warned", set())
    environ = {"HF_TOKEN": "hf_x", "WANDB_PROJECT": "p", "WANDB_API_KEY": "k"}
    with caplog.at_level("WARNING", logger="kinetic"):
        first = captured_env.capture_job_env(["HF_TOKEN", "WANDB_*"], environ)
        again = captured_env.capture_job_env(["HF_TOKEN", "WANDB_*"], environ)
    assert first == again == environ  # sent as asked: the warning changes nothing
    (record,) = caplog.records
    assert "HF_TOKEN, WANDB_API_KEY" in record.getMessage()
    assert "WANDB_PROJECT" not in record.getMessage()
    assert "docs/security.md" in record.getMessage()
