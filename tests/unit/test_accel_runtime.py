"""The accelerator runtime of an image: which lines it takes from the user's requirements.

Pure rules (:mod:`kinetic._core.accel_runtime`): no resolver, no network.
"""

from __future__ import annotations

import pytest

from kinetic._core import accel_runtime
from kinetic._core.accel_runtime import DEFAULTS, runtime_request
from kinetic._core.requirements import parse_requirements_txt, requirements_lines

JAX, KERAS = DEFAULTS["jax"], DEFAULTS["keras"]


def split(text: str, category: str) -> accel_runtime.RuntimeRequest:
    return runtime_request(parse_requirements_txt(text), category)


@pytest.mark.parametrize(
    ("category", "jax_line"),
    [("cpu", f"jax=={JAX}"), ("gpu", f"jax[cuda12]=={JAX}"), ("tpu", f"jax[tpu]=={JAX}")],
)
def test_every_category_gets_jax_for_its_platform_and_keras(category: str, jax_line: str) -> None:
    request = split("numpy>=1.26\ntabulate==0.9.0\n", category)
    assert request.runtime_lines == (jax_line, f"keras=={KERAS}")
    assert requirements_lines(request.project) == ["numpy>=1.26", "tabulate==0.9.0"]
    assert request.is_default
    assert request.notes == ()


def test_a_users_jax_pin_picks_the_runtimes_version_on_each_platform() -> None:
    tpu = split("jax==0.7.0\nnumpy\n", "tpu")
    assert tpu.runtime_lines[0] == "jax[tpu]==0.7.0"
    assert not tpu.is_default
    [note] = tpu.notes
    assert "requirements.txt:1" in note
    assert "'jax==0.7.0'" in note
    assert "'jax[tpu]==0.7.0'" in note
    assert split("jax==0.7.0\n", "gpu").runtime_lines[0] == "jax[cuda12]==0.7.0"
    cpu = split("jax==0.7.0\n", "cpu")
    assert cpu.runtime_lines[0] == "jax==0.7.0"
    assert cpu.notes == ()  # nothing changed: nothing to say


def test_a_specifier_the_default_satisfies_keeps_the_shared_default() -> None:
    request = split("jax[tpu]>=0.4.30\nkeras>=3\n", "tpu")
    assert request.runtime_lines == (f"jax[tpu]=={JAX}", f"keras=={KERAS}")
    assert request.is_default
    excluding = split("jax<0.5\n", "tpu")
    assert excluding.runtime_lines[0] == "jax[tpu]<0.5"


def test_keras_and_companion_pins_join_the_runtime() -> None:
    request = split("keras==3.8.0\njaxlib==0.7.0\nlibtpu==0.0.19.1\nflax\n", "tpu")
    assert request.runtime_lines == (
        f"jax[tpu]=={JAX}",
        "keras==3.8.0",
        "jaxlib==0.7.0",
        "libtpu==0.0.19.1",
    )
    assert [r.origin.source for r in request.user_runtime if r.origin] == [
        "requirements.txt:1",
        "requirements.txt:2",
        "requirements.txt:3",
    ]
    assert requirements_lines(request.project) == ["flax"]


def test_a_wrong_platforms_plugin_is_left_out_with_a_note() -> None:
    request = split("libtpu-nightly\njax-cuda12-plugin==0.7.0\n", "gpu")
    assert "libtpu" not in " ".join(request.runtime_lines)
    assert "jax-cuda12-plugin==0.7.0" in request.runtime_lines
    [note] = request.notes
    assert "requirements.txt:1" in note
    assert "kn:keep" in note


def test_kn_keep_lines_are_kept_apart_verbatim_with_a_note_each() -> None:
    text = "jax==0.7.0  # kn:keep\nnumpy\njaxlib==0.4.30  # kn:keep\nflax # kn:keep\n"
    request = split(text, "tpu")
    # Neither rewritten nor in the runtime (whose pins they are not held to), nor among
    # the project's lines (which are).
    assert request.runtime_lines == (f"jax[tpu]=={JAX}", f"keras=={KERAS}")
    assert request.is_default
    assert requirements_lines(request.project) == ["numpy"]
    assert requirements_lines(request.kept) == ["jax==0.7.0", "jaxlib==0.4.30", "flax"]
    assert len(request.notes) == 3
    first = request.notes[0]
    assert first.startswith("requirements.txt:1: 'jax==0.7.0' is marked `# kn:keep`")
    assert "not held to its pins" in first
    assert "no longer guaranteed" in first
    assert "jax[tpu]" not in first  # not rewritten
    assert split("numpy\n", "tpu").kept == ()


def test_urls_and_options_for_runtime_names_stay_the_users() -> None:
    text = "-e git+https://example.invalid/jax.git#egg=jax\njax @ https://example.invalid/j.whl\n"
    request = split(text, "cpu")
    assert request.is_default
    assert len(request.project) == 2


def test_markers_are_kept_on_rewritten_lines() -> None:
    request = split("jax==0.7.0; python_version >= '3.10'\n", "tpu")
    assert request.runtime_lines[0] == 'jax[tpu]==0.7.0; python_version >= "3.10"'


def test_the_last_jax_line_wins() -> None:
    assert split("jax==0.6.0\njax==0.7.0\n", "cpu").runtime_lines[0] == "jax==0.7.0"


def test_unknown_category_is_refused() -> None:
    with pytest.raises(ValueError, match="tpu"):
        runtime_request([], "npu")


@pytest.mark.parametrize(
    ("base", "python"),
    [
        ("python:3.11-slim", "3.11"),
        ("python:3.12", "3.12"),
        ("reg.example:5000/team/python:3.10-bookworm", "3.10"),
        ("local/debian-py:bookworm", accel_runtime.DEFAULT_PYTHON),
        ("ubuntu:22.04", accel_runtime.DEFAULT_PYTHON),
    ],
)
def test_image_python_from_the_base_images_tag(base: str, python: str) -> None:
    assert accel_runtime.image_python(base) == python


def test_the_docs_table_of_defaults_is_this_releases() -> None:
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "dependencies.md").read_text()
    assert f"| `jax` (and `jaxlib`, the CUDA plugin) | {DEFAULTS['jax']} |" in page
    assert f"| `keras` | {DEFAULTS['keras']} |" in page
    assert f"`jax[tpu]=={DEFAULTS['jax']}` requires" in page
