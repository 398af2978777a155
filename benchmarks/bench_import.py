"""``import kinetic`` time: this project versus the original (``keras-kinetic==0.0.4``).

Both are imported as ``kinetic``, so each lives in its own venv (``benchmarks/envs.sh``)
and is measured in fresh subprocesses, interleaved round by round in this one run:

- net import time = median wall of ``python -c "import kinetic"`` minus median wall of
  ``python -c pass`` with the same interpreter (start-up and ``site`` cancel out);
- target (DESIGN §7): ours <= 0.25x the original's;
- the runner's start-up import, ``python -c "import runner._main"`` (kinetic env), against
  ``python -c "import cloudpickle"``, its one unavoidable dependency;
- ``-X importtime`` tables (median of a few runs): the heaviest modules behind each import,
  and the modules the runner imports beyond cloudpickle's own.

Usage: ``python benchmarks/bench_import.py [--rounds 10]`` (any interpreter) after
``bash benchmarks/envs.sh``. Writes ``benchmarks/results/bench_import.json``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _common import env_python, machine, median, ms, summary, time_subprocess, verdict
from _common import write_results as write

TARGET_RATIO = 0.25


def clean_env() -> dict[str, str]:
    """The environment minus anything that changes what gets imported."""
    env = dict(os.environ)
    for name in (
        "PYTHONPATH",
        "PYTHONSTARTUP",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONPROFILEIMPORTTIME",
    ):
        env.pop(name, None)
    return env


def importtime(
    python: Path, code: str, *, cwd: str, env: dict[str, str]
) -> dict[str, tuple[int, int, int]]:
    """One ``-X importtime`` run: module -> (self us, cumulative us, depth)."""
    done = subprocess.run(
        [str(python), "-X", "importtime", "-c", code],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    table: dict[str, tuple[int, int, int]] = {}
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, cum_us, name = line.replace("import time:", "", 1).split("|")
        raw_name = name.rstrip()
        depth = (len(raw_name) - len(raw_name.lstrip(" "))) // 2
        table[raw_name.strip()] = (int(self_us), int(cum_us), depth)
    return table


def importtime_median(
    python: Path, code: str, *, cwd: str, env: dict[str, str], runs: int
) -> dict[str, dict[str, Any]]:
    """Median self/cumulative microseconds per module over ``runs`` runs."""
    selfs: dict[str, list[int]] = defaultdict(list)
    cums: dict[str, list[int]] = defaultdict(list)
    depth: dict[str, int] = {}
    for _ in range(runs):
        for mod, (s, c, d) in importtime(python, code, cwd=cwd, env=env).items():
            selfs[mod].append(s)
            cums[mod].append(c)
            depth[mod] = d
    return {
        mod: {
            "self_ms": round(median(selfs[mod]) / 1000, 2),
            "cumulative_ms": round(median(cums[mod]) / 1000, 2),
            "depth": depth[mod],
        }
        for mod in selfs
    }


def top(table: dict[str, dict[str, Any]], key: str, n: int) -> list[dict[str, Any]]:
    ranked = sorted(table.items(), key=lambda kv: kv[1][key], reverse=True)[:n]
    return [{"module": mod, **vals} for mod, vals in ranked]


def print_top(title: str, rows: Sequence[dict[str, Any]]) -> None:
    print(f"  {title}")
    for row in rows:
        print(
            f"    {row['cumulative_ms']:8.2f} ms cum {row['self_ms']:7.2f} ms self  "
            f"{'  ' * row['depth']}{row['module']}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="timed rounds (default 10)")
    parser.add_argument("--importtime-runs", type=int, default=3)
    parser.add_argument("--top", type=int, default=15)
    ns = parser.parse_args()

    ours, orig = env_python("kinetic"), env_python("orig")
    env = clean_env()
    # A neutral cwd: from the repository, `-c` would import the source tree's `kinetic`.
    cwd = tempfile.mkdtemp(prefix="kinetic-bench-import-")
    commands: dict[str, list[str]] = {
        "ours_pass": [str(ours), "-c", "pass"],
        "ours_import": [str(ours), "-c", "import kinetic"],
        "orig_pass": [str(orig), "-c", "pass"],
        "orig_import": [str(orig), "-c", "import kinetic"],
        "ours_cloudpickle": [str(ours), "-c", "import cloudpickle"],
        "ours_runner": [str(ours), "-c", "import runner._main"],
    }
    # The right packages, not a stray copy from the cwd or PYTHONPATH:
    check = "import kinetic, importlib.metadata as m; print(kinetic.__file__, m.version('{}'))"
    for name, py, dist in (("ours", ours, "kinetic-aio"), ("orig", orig, "keras-kinetic")):
        where = subprocess.run(
            [str(py), "-c", check.format(dist)],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        print(f"{name}: kinetic from {where}")

    for argv in commands.values():  # warm-up: bytecode caches and the page cache
        for _ in range(2):
            time_subprocess(argv, cwd=cwd, env=env)
    samples: dict[str, list[float]] = {k: [] for k in commands}
    names = list(commands)
    for r in range(ns.rounds):
        # Rotate the order so drift in machine load does not favour one command.
        for name in names[r % len(names) :] + names[: r % len(names)]:
            samples[name].append(time_subprocess(commands[name], cwd=cwd, env=env))

    med = {k: median(v) for k, v in samples.items()}
    ours_net = med["ours_import"] - med["ours_pass"]
    orig_net = med["orig_import"] - med["orig_pass"]
    runner_net = med["ours_runner"] - med["ours_pass"]
    cloudpickle_net = med["ours_cloudpickle"] - med["ours_pass"]
    ratio = ours_net / orig_net

    print(f"\nwall times, median of {ns.rounds} interleaved rounds (ms):")
    for k, v in samples.items():
        s = summary(v)
        print(f"  {k:18s} {s['median_ms']:8.1f}  (p25 {s['p25_ms']:.1f}, p75 {s['p75_ms']:.1f})")
    print("\nnet import time (minus `python -c pass`):")
    print(f"  import kinetic, ours      {ms(ours_net):8.1f} ms")
    print(f"  import kinetic, original  {ms(orig_net):8.1f} ms")
    print(
        f"  ratio ours/original       {ratio:8.3f}   target <= {TARGET_RATIO}  "
        f"{verdict(ratio, TARGET_RATIO)}"
    )
    print(f"  import runner._main       {ms(runner_net):8.1f} ms")
    print(f"  import cloudpickle        {ms(cloudpickle_net):8.1f} ms")

    runs = ns.importtime_runs
    tables = {
        "ours_kinetic": importtime_median(ours, "import kinetic", cwd=cwd, env=env, runs=runs),
        "orig_kinetic": importtime_median(orig, "import kinetic", cwd=cwd, env=env, runs=runs),
        "runner": importtime_median(ours, "import runner._main", cwd=cwd, env=env, runs=runs),
        "cloudpickle": importtime_median(ours, "import cloudpickle", cwd=cwd, env=env, runs=runs),
    }
    beyond = {m: v for m, v in tables["runner"].items() if m not in tables["cloudpickle"]}
    report_tables = {
        "ours_kinetic_top_cumulative": top(tables["ours_kinetic"], "cumulative_ms", ns.top),
        "ours_kinetic_top_self": top(tables["ours_kinetic"], "self_ms", ns.top),
        "orig_kinetic_top_cumulative": top(tables["orig_kinetic"], "cumulative_ms", 10),
        "runner_top_cumulative": top(tables["runner"], "cumulative_ms", ns.top),
        "runner_beyond_cloudpickle_top_self": top(beyond, "self_ms", ns.top),
    }
    beyond_self_ms = round(sum(v["self_ms"] for v in beyond.values()), 2)
    print(f"\n-X importtime (median of {runs} runs; importtime itself inflates figures):")
    print_top(
        "import kinetic (ours), heaviest cumulative:", report_tables["ours_kinetic_top_cumulative"]
    )
    print_top("import kinetic (ours), heaviest self:", report_tables["ours_kinetic_top_self"])
    print_top(
        "import kinetic (original), heaviest cumulative:",
        report_tables["orig_kinetic_top_cumulative"],
    )
    print_top("import runner._main, heaviest cumulative:", report_tables["runner_top_cumulative"])
    print_top(
        f"runner modules not imported by `import cloudpickle` ({len(beyond)} modules, "
        f"{beyond_self_ms} ms self in all), heaviest self:",
        report_tables["runner_beyond_cloudpickle_top_self"],
    )

    path = write(
        "bench_import",
        {
            "benchmark": "bench_import",
            "machine": machine(),
            "rounds": ns.rounds,
            "wall": {k: summary(v) for k, v in samples.items()},
            "net_ms": {
                "ours_import_kinetic": ms(ours_net),
                "orig_import_kinetic": ms(orig_net),
                "ours_import_runner_main": ms(runner_net),
                "ours_import_cloudpickle": ms(cloudpickle_net),
            },
            "ratio_ours_over_orig": round(ratio, 4),
            "target_ratio": TARGET_RATIO,
            "verdict": verdict(ratio, TARGET_RATIO),
            "runner_beyond_cloudpickle": {"modules": len(beyond), "self_ms": beyond_self_ms},
            "importtime": report_tables,
        },
    )
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
