"""What the installed pytest plugin costs a session that never uses Kinetic.

pytest imports every installed ``pytest11`` entry point at start. Measured in fresh
subprocesses of this interpreter, interleaved round by round in this one run:

- net cost = median wall of ``python -c "import pytest, kinetic_pytest"`` (what the entry
  point loads now) minus that of ``python -c "import pytest"``;
- the same for ``import pytest, kinetic.testing`` (what it loaded before: all of
  ``kinetic``), side by side;
- target (issue 39): the plugin costs a session that does not use it < 10 ms.

Usage: ``python benchmarks/bench_pytest_plugin.py [--rounds 15]`` in an environment with
kinetic-aio installed. Writes ``benchmarks/results/pytest_plugin.json``.
"""

from __future__ import annotations

import argparse
import sys

from _common import REPO, machine, median, ms, summary, time_subprocess, verdict
from _common import write_results as write

TARGET_MS = 10.0
CASES = {
    "pytest": "import pytest",
    "entry point (kinetic_pytest)": "import pytest, kinetic_pytest",
    "kinetic.testing (before)": "import pytest, kinetic.testing",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    samples: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(args.rounds):
        for name, code in CASES.items():  # interleaved: drift touches every case alike
            samples[name].append(time_subprocess([sys.executable, "-c", code], cwd=REPO))
    base = median(samples["pytest"])
    net = {name: ms(median(s) - base) for name, s in samples.items() if name != "pytest"}
    plugin_ms = net["entry point (kinetic_pytest)"]
    result = {
        "machine": machine(),
        "rounds": args.rounds,
        "wall": {name: summary(s) for name, s in samples.items()},
        "net_ms": net,
        "target_ms": TARGET_MS,
        "verdict": verdict(plugin_ms, TARGET_MS),
    }
    path = write("pytest_plugin", result)
    for name, value in net.items():
        print(f"{name:32s} +{value:8.1f} ms over `import pytest`")
    print(f"target < {TARGET_MS} ms: {result['verdict']}  ({path})")


if __name__ == "__main__":
    main()
