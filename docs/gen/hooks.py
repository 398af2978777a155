"""MkDocs hooks: pages generated from the code at build time, never copied by hand.

* ``accelerators.md`` from the catalog in :mod:`kinetic._core.accelerators`;
* ``configuration.md`` from the settings in :mod:`kinetic._core.config` (and the
  variable-only knobs that ``kinetic config show`` lists).

The generators are plain functions returning Markdown, so tests can call them
(``tests/unit/test_doc_pages.py``); :func:`on_files` adds their pages to the build.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Sequence
from typing import Any

GENERATED_NOTE = (
    "<!-- Generated at build time by docs/gen/hooks.py from {source}: edit the code, "
    "not this page. -->\n\n"
)


def _table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    def cell(value: object) -> str:
        if value is None or value == "":
            return "—"
        return str(value).replace("|", "\\|")

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _code(value: object) -> str:
    return f"`{value}`"


def accelerators_page() -> str:
    """The accelerator catalog as Markdown: every name Kinetic can request."""
    from kinetic._core import accel_runtime, k8s_spec
    from kinetic._core import accelerators as acc

    gpu_rows = []
    for gpu_type, gpu in acc.GPU_CATALOG.items():
        for count in sorted(gpu.machine_types):
            cfg = acc.make_gpu(gpu_type, count)
            gpu_rows.append((_code(cfg.name), count, _code(cfg.machine_type), _code(cfg.gke_label)))
    tpu_rows = []
    for tpu_type, tpu in acc.TPU_CATALOG.items():
        for chips in sorted(tpu.slices):
            t = acc.make_tpu(tpu_type, chips)
            tpu_rows.append(
                (
                    _code(t.name),
                    chips,
                    _code(t.topology),
                    t.num_nodes,
                    _code(t.machine_type),
                    _code(t.gke_accelerator),
                )
            )
    forms = "\n".join(acc.valid_forms())
    default_tpu = acc.parse_accelerator("tpu")
    default_gpu = acc.parse_accelerator("gpu")
    return (
        GENERATED_NOTE.format(source="kinetic/_core/accelerators.py") + "# Accelerators\n\n"
        "`@kinetic.run(accelerator=...)` takes a name from this catalog. Names are "
        "case-insensitive; any name may end in `:spot` (or pass `spot=True`) for spot "
        f"capacity — see [cost](cost.md). `gpu` alone is `{default_gpu.name}`, `tpu` alone "
        f"is `{default_tpu.name}`. The same catalog is printed by `kinetic accelerators` "
        "(and `kinetic accelerators resolve NAME` shows what one name becomes).\n\n"
        "## Accepted forms\n\n"
        f"```text\n{forms}\n```\n\n"
        "An unknown name is a `kinetic.AcceleratorError` (a `ConfigError`) at decoration "
        "time, and its message lists these forms.\n\n"
        "## CPU\n\n"
        + _table(
            ("name", "means"),
            [
                (
                    _code("cpu"),
                    (
                        f"a small default (on GKE a request of {k8s_spec.DEFAULT_CPU_REQUEST} "
                        f"CPU and {k8s_spec.DEFAULT_MEMORY_REQUEST} of memory)"
                    ),
                ),
                (_code("cpu:N"), f"N CPUs, with {k8s_spec.MEMORY_PER_CPU_GI} GiB of memory each"),
                (_code("cpu:N:Mgi"), "N CPUs and M GiB of memory"),
            ],
        )
        + "\n## GPUs\n\n"
        "Each GPU type at each count it is offered with, most capable first "
        "(`gpu:N` picks the first type offering N). Spellings: `gpu-l4`, `l4`, "
        "`gpu:l4`, `nvidia-l4`; `l4x4`, `gpu-l4x4` or `gpu:l4-4` for four.\n\n"
        + _table(("name", "GPUs", "machine type", "GKE label"), gpu_rows)
        + "\n## TPUs\n\n"
        "Each TPU type at each slice size, most capable first. Counts are **chips**, "
        "as in the original Kinetic (`v4-8` is 8 chips); a slice may also be named by "
        "its topology (`v5e-2x4`), and `v5e` is an alias of `v5litepod`. The one "
        "exception is `v3-8`, the original's example accelerator: Cloud TPU's name of "
        "the single-host v3 slice, which counts TensorCores (2 per chip), so it means "
        "`v3-4`. A slice on more than one host is a multi-host job: see "
        "[distributed training](distributed.md).\n\n"
        "Two accelerators the original's documentation names are refused, with an "
        "`AcceleratorError` that says why and names the nearest slices GKE offers: "
        "TPU v2 (`v2-8`, any size: GKE's oldest TPU is v3) and the 2048-chip v3 slice "
        "(`v3-2048`, 32x64: a v3 Pod is 1024 chips, so the whole Pod is `v3-1024`).\n\n"
        + _table(
            ("name", "chips", "topology", "hosts", "machine type", "GKE accelerator"), tpu_rows
        )
        + "\n## What a name becomes on GKE\n\n"
        f"A GPU job's pod selects nodes labelled `{acc.LABEL_GPU_ACCELERATOR}`, requests "
        f"`{acc.RESOURCE_GPU}` and tolerates its taint; a TPU job's pod selects "
        f"`{acc.LABEL_TPU_ACCELERATOR}` and `{acc.LABEL_TPU_TOPOLOGY}` and requests "
        f"`{acc.RESOURCE_TPU}` (per host); spot adds `{acc.LABEL_SPOT}=true` and its "
        "toleration. The job sees `JAX_PLATFORMS` set to "
        + ", ".join(
            f"`{acc.jax_platforms(c)}` for {c.kind.upper()}"
            for c in (acc.CpuConfig(), default_gpu, default_tpu)
        )
        + ".\n\n## Keras and JAX on every accelerator\n\n"
        "Every image Kinetic builds carries JAX for its accelerator ("
        + ", ".join(
            f"{_code(accel_runtime.default_lines(c)[0].split('==')[0])} for {c.upper()}"
            for c in accel_runtime.CATEGORIES
        )
        + ", at the versions of [the table of defaults](dependencies.md#the-accelerator-runtime-in-every-image)) "
        "and Keras, and jobs run with `KERAS_BACKEND=jax` unless you set it. "
        "So a function that does `import keras` needs no requirements file: "
        "`examples/keras_training.py` (a `keras.Sequential` fit that returns its final "
        "loss) and `examples/jax_training.py` (a jitted training step) run as they are, "
        "with `KINETIC_EXAMPLE_ACCELERATOR` naming any accelerator of this page. Pinning "
        "`jax` or `keras` in your requirements picks their versions.\n\n"
        "## On the local backend\n\n"
        "A CPU job runs as is. A GPU job holds that many of this machine's GPUs, "
        "exclusively (`CUDA_VISIBLE_DEVICES`); a model the machine lacks runs on the "
        "model it has, with one warning (and one naming what of the image's runtime this "
        "interpreter lacks: JAX's CUDA plugin, Keras). A TPU job is an `AcceleratorError` "
        "unless you "
        "opt in to running it on CPUs with `KINETIC_LOCAL_ACCELERATOR` = "
        + ", ".join(_code(c) for c in acc.LOCAL_ACCELERATOR_CHOICES)
        + ". See [the local backend](local-backend.md).\n"
    )


def configuration_page() -> str:
    """Every setting, how it is set and its default, as Markdown."""
    import kinetic
    from kinetic._cli.config import KNOBS
    from kinetic._core import config

    defaults = config.resolve_settings(env={}, profile=None, home="~")
    explained = {
        row.name: row
        for row in config.explain_settings(defaults, arguments={}, env={}, profile=None)
    }
    run_params = set(inspect.signature(kinetic.run).parameters)
    rows = []
    for name, variable in config.SETTING_VARIABLES.items():
        value: Any = getattr(defaults, name)
        detail = explained[name].detail
        if name == "backend":
            with_project = config.resolve_settings(
                env={"KINETIC_PROJECT": "p"}, profile=None, home="~"
            )
            shown = f"`{value}` without a project, `{with_project.backend}` with one"
        elif name == "project":
            shown = "`GOOGLE_CLOUD_PROJECT`, else none (then the backend is `local`)"
        elif value is None:
            shown = detail or "none"
        elif detail:
            shown = f"`{value}` ({detail})"
        else:
            shown = _code(value)
        rows.append(
            (
                _code(name),
                _code(f"{name}=") if name in run_params else None,
                _code(variable),
                _code(name) if name in config.PROFILE_FIELDS else None,
                shown,
            )
        )
    knob_rows = [(_code(var), unset) for _name, var, unset in KNOBS]
    sources = " > ".join(config.SETTING_SOURCES)
    return (
        GENERATED_NOTE.format(source="kinetic/_core/config.py and kinetic/_cli/config.py")
        + "# Configuration\n\n"
        f"Every setting resolves with the precedence **{sources}**: an argument of "
        "`kinetic.run` (or of `attach`, `list_jobs`, the `kinetic` command's options) wins, "
        "then the `KINETIC_*` environment variable, then the active "
        "[profile](profiles.md), then the default. `kinetic config show` prints each "
        "setting's value and where it came from.\n\n"
        "## Settings\n\n"
        + _table(("setting", "argument", "environment", "profile field", "default"), rows)
        + "\nDerived from these: the jobs bucket `{project}-kn-{cluster}-jobs` and the "
        "bundled-image registry `{region}-docker.pkg.dev/{project}/kinetic` (unless "
        "`KINETIC_IMAGE_REGISTRY` is set), where the region is the zone without its "
        "last letter.\n\n"
        "## Knobs set only by environment variables\n\n"
        + _table(("variable", "when unset"), knob_rows)
        + "\nThe full list, including the variables jobs see, is on "
        "[environment variables](environment-variables.md).\n\n"
        "## The profiles file\n\n"
        "`~/.kinetic/profiles.json` (`KINETIC_PROFILES_FILE` overrides), the original's "
        "format; a profile may set " + ", ".join(_code(f) for f in config.PROFILE_FIELDS) + ":\n\n"
        '```json\n{"current": "dev", "profiles": {"dev": {"project": "my-project", '
        '"zone": "us-central1-a", "cluster": "kinetic-cluster"}}}\n```\n\n'
        "See [profiles](profiles.md).\n"
    )


PAGES = {"accelerators.md": accelerators_page, "configuration.md": configuration_page}


def on_files(files: Any, config: Any) -> Any:
    """MkDocs event: add the generated pages to the build."""
    from mkdocs.structure.files import File

    for name, generate in PAGES.items():
        files.append(File.generated(config, name, content=generate()))
    return files
