"""The index install path, pure: its Dockerfiles and contexts, the hashed requirement
files, which path a build takes, which indexes it may use. No IO, no event loop."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from kinetic._core import image_spec, index_install
from kinetic._core.config import explain_settings, resolve_settings
from kinetic._core.index_install import HashedPin
from kinetic._exceptions import ConfigError
from kinetic._images import index_build, modes, runner_image
from kinetic._images.cloudbuild import CloudBuildBuilder
from kinetic._images.docker import DockerBuilder
from kinetic._storage.local import LocalStorage

H1, H2, H3 = "a" * 64, "b" * 64, "c" * 64
UV_OUTPUT = f"""\
# a comment uv might write
--index-url https://mirror.example/simple
numpy==2.1.3 \\
    --hash=sha256:{H2} \\
    --hash=sha256:{H1}
six==1.16.0 \\
    --hash=sha256:{H3}
"""


def test_choose_install_defaults_per_builder_and_honours_an_explicit_choice() -> None:
    assert index_install.choose_install(None, "cloudbuild") == "index"
    assert index_install.choose_install(None, "docker") == "wheels"
    assert index_install.choose_install("index", "docker") == "index"
    assert index_install.choose_install("wheels", "cloudbuild") == "wheels"
    with pytest.raises(ConfigError, match=r"'pypi'.*KINETIC_BUILD_INSTALL.*'index', 'wheels'"):
        index_install.choose_install("pypi", "docker")


def test_the_setting_resolves_like_the_others_and_says_its_default() -> None:
    env = {"KINETIC_BUILD_INSTALL": "index"}
    settings = resolve_settings(env=env, profile={"build_install": "wheels"}, home="/h")
    assert settings.build_install == "index"
    from_profile = resolve_settings(env={}, profile={"build_install": "wheels"}, home="/h")
    assert from_profile.build_install == "wheels"
    unset = resolve_settings(env={}, profile=None, home="/h")
    assert unset.build_install is None
    rows = {r.name: r for r in explain_settings(unset, arguments={}, env={}, profile=None)}
    assert rows["build_install"].source == "default"
    assert rows["build_install"].detail == "index on cloudbuild, wheels on docker"


def test_make_builder_gives_each_builder_its_install_path(tmp_path: Path) -> None:
    docker_env = {"DOCKER_HOST": "unix:///run/docker.sock"}
    plain = resolve_settings(env={}, profile=None, home="/h")
    docker = modes.make_builder(plain, None, docker_env)
    assert isinstance(docker, DockerBuilder)
    assert docker.install == "wheels"
    forced = resolve_settings(env={"KINETIC_BUILD_INSTALL": "index"}, profile=None, home="/h")
    assert modes.make_builder(forced, None, docker_env).install == "index"

    cloud = resolve_settings(env={"KINETIC_PROJECT": "p"}, profile=None, home="/h")
    store = LocalStorage(tmp_path)
    builder = modes.make_builder(cloud, store, {})
    assert isinstance(builder, CloudBuildBuilder)
    assert builder.install == "index"
    cloud_wheels = resolve_settings(
        env={"KINETIC_PROJECT": "p", "KINETIC_BUILD_INSTALL": "wheels"}, profile=None, home="/h"
    )
    assert modes.make_builder(cloud_wheels, store, {}).install == "wheels"
    bad = resolve_settings(env={"KINETIC_BUILD_INSTALL": "both"}, profile=None, home="/h")
    with pytest.raises(ConfigError, match="KINETIC_BUILD_INSTALL"):
        modes.make_builder(bad, None, docker_env)


def test_hashed_requirements_are_parsed_from_uv_and_written_for_pip() -> None:
    pins = index_install.parse_hashed(UV_OUTPUT)
    assert pins == (
        HashedPin("numpy", "2.1.3", (H1, H2)),
        HashedPin("six", "1.16.0", (H3,)),
    )
    text = index_install.hashed_requirements_text(pins, ("--index-url https://mirror.example/s",))
    assert text == (
        "--index-url https://mirror.example/s\n"
        f"numpy==2.1.3 \\\n    --hash=sha256:{H1} \\\n    --hash=sha256:{H2}\n"
        f"six==1.16.0 \\\n    --hash=sha256:{H3}\n"
    )
    # What is written reads back the same.
    assert index_install.parse_hashed(text) == pins


def test_a_pin_without_a_hash_is_refused() -> None:
    with pytest.raises(ValueError, match=r"six==1\.16\.0 has no hash"):
        index_install.parse_hashed(f"numpy==2.1.3 --hash=sha256:{H1}\nsix==1.16.0\n")


def test_the_build_uses_the_configured_index_else_the_images_default() -> None:
    assert index_install.configured_index({}) == ()
    both = {"PIP_INDEX_URL": "https://pip.example/simple", "UV_INDEX_URL": "https://uv.example/s"}
    assert index_install.configured_index(both) == ("--index-url https://uv.example/s",)
    assert index_install.configured_index({"PIP_INDEX_URL": "https://pip.example/simple"}) == (
        "--index-url https://pip.example/simple",
    )
    newest = {**both, "UV_DEFAULT_INDEX": "https://default.example/simple"}
    assert index_install.configured_index(newest) == ("--index-url https://default.example/simple",)
    # The project's own index wins; its extra indexes go beside the configured one.
    own = ["--index-url https://own.example/simple", "tabulate"]
    assert index_install.build_index_options(both, own) == (own[0],)
    extra = ["--extra-index-url https://extra.example/simple", "tabulate"]
    assert index_install.build_index_options(both, extra) == (
        "--index-url https://uv.example/s",
        extra[0],
    )


@pytest.mark.parametrize(
    ("option", "why"),
    [
        ("--index-url https://me:s3cret@private.example/simple", "carries credentials"),
        ("--extra-index-url file:///opt/pypi/simple", "not reachable from a build"),
        ("-i /opt/wheels", "not reachable from a build"),
    ],
)
def test_an_index_a_build_cannot_use_is_refused_with_the_reason(option: str, why: str) -> None:
    refusal = index_install.index_refusal([option])
    assert refusal is not None
    assert why in refusal
    assert "s3cret" not in refusal
    # The context assembly refuses it before resolving anything.
    with pytest.raises(index_build.IndexUnavailable, match=why):
        index_build.project_files("r/kinetic-runtime:k1", [option, "six"], (), (), "3.11", {})


def test_an_https_index_is_usable() -> None:
    assert index_install.index_refusal(["--index-url https://mirror.example/simple"]) is None
    assert index_install.index_refusal([]) is None


def test_a_line_that_is_not_on_an_index_is_refused() -> None:
    with pytest.raises(index_build.IndexUnavailable, match="not a distribution on a package"):
        index_build.project_files(
            "r/kinetic-runtime:k1", ["mylib @ file:///src/mylib"], (), (), "3.11", {}
        )


def test_the_index_env_image_installs_hashed_pins_from_the_index() -> None:
    dockerfile = index_install.env_dockerfile("python:3.11-slim")
    assert dockerfile.startswith("# Kinetic environment image")
    assert "FROM python:3.11-slim\n" in dockerfile
    assert "pip install --require-hashes --no-deps --only-binary=:all:" in dockerfile
    assert "--no-index" not in dockerfile
    assert "wheels" not in dockerfile
    assert "ENV PATH=/opt/venv/bin:$PATH KERAS_BACKEND=jax" in dockerfile
    files = index_install.env_context_files("python:3.11-slim", "six==1 \\\n --hash=x\n")
    assert set(files) == {"Dockerfile", "requirements.txt"}


def test_the_index_project_image_keeps_the_runtimes_pins_and_installs_kept_lines_last() -> None:
    plain = index_install.project_dockerfile("reg/kinetic-runtime:k1")
    assert "-c /tmp/runtime-constraints.txt -r /tmp/user-requirements.txt" in plain
    assert "kept" not in plain
    files = index_install.project_context_files(
        "reg/kinetic-runtime:k1", "user\n", ["jax==0.10.2", "keras==3.1"], "kept\n"
    )
    assert set(files) == {
        "Dockerfile",
        "user-requirements.txt",
        "runtime-constraints.txt",
        "kept-requirements.txt",
    }
    dockerfile = files["Dockerfile"].decode()
    assert dockerfile.index("user-requirements") < dockerfile.index("kept-requirements")
    kept_step = dockerfile[dockerfile.index("COPY kept-requirements") :]
    assert "--require-hashes" in kept_step
    assert "runtime-constraints" not in kept_step
    assert files["runtime-constraints.txt"] == b"jax==0.10.2\nkeras==3.1\n"


def test_an_index_context_holds_no_wheels_and_stays_small() -> None:
    # A GPU runtime's size: ~60 distributions, a dozen files each.
    pins = [
        HashedPin(f"dist-{i}", "1.0.0", tuple(f"{i:02d}{j:062d}" for j in range(12)))
        for i in range(60)
    ]
    text = index_install.hashed_requirements_text(pins)
    tar = image_spec.build_context(index_install.env_context_files("python:3.11-slim", text))
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        names = archive.getnames()
    assert names == ["Dockerfile", "requirements.txt"]
    assert not any(name.endswith(".whl") for name in names)
    assert len(tar) < 100_000


def test_an_images_tag_does_not_depend_on_the_install_path() -> None:
    # The tags are computed over the plan alone; the two paths' Dockerfiles differ.
    env = runner_image.env_plan("reg", "python:3.11-slim", ("six==1.16.0",))
    assert env.tag == image_spec.env_tag("python:3.11-slim", ("six==1.16.0",))
    assert index_install.env_dockerfile("python:3.11-slim") != image_spec.env_dockerfile(
        "python:3.11-slim"
    )
    project = runner_image.project_plan(runner_image.runner_plan(env), ("tabulate",))
    assert project.tag == image_spec.project_tag(project.base_image, ("tabulate",))
