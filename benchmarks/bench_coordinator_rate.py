"""The coordinator's own cost per outcome, at full speed (no time dilated).

The simulation (``bench_pool_sim.py``) slows time 2-10x, so its coordinator never hears
more than about 2,000 outcomes a real second; a pool of 1,000 workers with 50 ms inputs
sends 20,000. Here a coordinator process (``python -m runner.pool.coordinator`` on
loopback, over a directory store) serves ``--inputs`` inputs to ``--workers`` workers
simulated in this process: asyncio connections that prove the batch's token, answer
each span at once with an outcome per input (the record of a small result, as a worker
sends it) and ask for the next. The inputs take no time, so the coordinator is the
bound, or this process is: the figure that holds either way is the coordinator
process's CPU time per outcome (its rusage), which says how many outcomes one core of
it takes a second. Every input is checked committed exactly once.

Writes ``benchmarks/results/coordinator_rate.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import REPO, machine, write_results


def small(x: int) -> int:
    return x * x


async def one_worker(name: str, host: str, port: int, token: bytes, seconds: float) -> int:
    """A worker that runs nothing: an outcome for each input handed to it, at once."""
    from runner import protocol, results_log
    from runner.job import build_success
    from runner.pool.coordinator import messages as m
    from runner.pool.coordinator import wire
    from runner.pool.coordinator.server import first_frame

    reader, writer = await asyncio.open_connection(host, port)
    decoder = wire.Decoder()
    challenge, _ = await first_frame(reader, decoder)
    assert isinstance(challenge, wire.Challenge)
    nonce = wire.new_nonce()
    proof = wire.hello_proof(token, challenge.nonce, nonce, name)
    writer.write(wire.encode(wire.Greeting(m.Hello(name), nonce, proof)))
    welcome, frames = await first_frame(reader, decoder)
    assert isinstance(welcome, wire.Welcome)
    wire.check_welcome(token, challenge, nonce, welcome)
    sent = 0
    while True:
        for frame in frames:
            if isinstance(frame, m.Exit):
                writer.close()
                return sent
            if isinstance(frame, m.Assign):
                out = []
                for index in frame.indices:
                    payload, record = build_success(index * index)
                    header = protocol.outcome_header(0, record, worker=name)
                    data = results_log.encode(index, header, payload)
                    out.append(wire.encode(m.Outcome(index, data, False, seconds)))
                out.append(wire.encode(m.More()))
                writer.write(b"".join(out))  # buffered: reading goes on meanwhile
                sent += len(frame.indices)
        data = await reader.read(1 << 16)
        if not data:
            return sent
        frames = decoder.feed(data)


def run_once(inputs: int, workers: int, seconds: float) -> dict[str, Any]:
    from runner.pool.coordinator import commits, wire
    from runner.results_log import decode_burst
    from tests.local.test_pool_worker import GID, record

    token = secrets.token_bytes(32)
    with tempfile.TemporaryDirectory(prefix="kinetic-bench-coord-") as tmp:
        root = Path(tmp)
        store = record(root, small, [((i,), {}) for i in range(inputs)], max_concurrent=workers)
        env = {**os.environ, "PYTHONPATH": str(REPO), wire.TOKEN_ENV: token.hex()}
        argv = [sys.executable, "-m", "runner.pool.coordinator"]
        argv += ["--storage", f"file://{root}", "--group", GID, "--host", "127.0.0.1"]
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL)
        try:
            key = commits.coordinator_key(GID, 0)
            deadline = time.monotonic() + 60
            while not (root / key).exists():
                assert time.monotonic() < deadline, "the coordinator did not start"
                time.sleep(0.02)
            where = commits.decode_coordinator(store.read(key))
            started = time.monotonic()

            async def pool() -> list[int]:
                return await asyncio.gather(
                    *(
                        one_worker(f"w{k}", where["host"], where["port"], token, seconds)
                        for k in range(workers)
                    )
                )

            sent = sum(asyncio.run(pool()))
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, with its rusage
            wall = time.monotonic() - started
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 0, proc.returncode
        committed: list[int] = []
        for name in store.list(commits.commits_prefix(GID)):
            committed += [i for i, _, _ in decode_burst(store.read(name))]
        assert sorted(committed) == list(range(inputs)), "an input lost or committed twice"
        cpu = usage.ru_utime + usage.ru_stime
        n_commits = len(store.list(commits.commits_prefix(GID)))
    return {
        "inputs": inputs,
        "workers": workers,
        "outcomes_sent": sent,
        "wall_s": round(wall, 3),
        "outcomes_per_s": round(inputs / wall, 1),
        "coordinator_cpu_s": round(cpu, 3),
        "coordinator_cpu_us_per_outcome": round(cpu / inputs * 1e6, 2),
        "outcomes_per_coordinator_cpu_s": round(inputs / cpu, 1),
        "commits": n_commits,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=int, default=100_000)
    parser.add_argument("--workers", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--input-s", type=float, default=0.05, help="the pace workers report")
    args = parser.parse_args()
    rows = []
    for workers in args.workers:
        row = run_once(args.inputs, workers, args.input_s)
        rows.append(row)
        print(
            f"{workers:>5} workers, {row['inputs']:,} outcomes: {row['outcomes_per_s']:,.0f}/s "
            f"end to end; the coordinator {row['coordinator_cpu_us_per_outcome']} us of CPU "
            f"an outcome ({row['outcomes_per_coordinator_cpu_s']:,.0f} a CPU second), "
            f"{row['commits']} commits",
            flush=True,
        )
    write_results("coordinator_rate", {"machine": machine(), "args": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
