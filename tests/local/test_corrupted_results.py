"""A result changed in storage is a clear ResultError, never another value.

Unpickling alone cannot tell: one flipped bit in the pickled integer of a result
payload still unpickles, to another integer. The runner seals what it stores
(``runner.protocol.seal``: the pickle framed with its SHA-256) and every reader checks.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import kinetic
from runner import protocol

pytestmark = pytest.mark.local


@kinetic.run()
def scaled(x: int) -> int:
    return x * 1_000_003


def test_every_flipped_byte_of_a_stored_result_is_a_result_error(kinetic_env: Path) -> None:
    job = scaled.run_async(7)
    assert job.result(timeout=60, cleanup=False) == 7_000_021
    path = kinetic_env / "storage" / job.job_id / "result.pkl"
    stored = path.read_bytes()
    assert stored.startswith(protocol.SEAL)
    wrong: list[tuple[int, object]] = []
    messages: set[bool] = set()
    for position in range(len(stored)):
        for flip in (0x01, 0x80):
            changed = bytearray(stored)
            changed[position] ^= flip
            path.write_bytes(bytes(changed))
            try:
                value = kinetic.attach(job.job_id).result(timeout=30, cleanup=False)
            except kinetic.ResultError as exc:
                messages.add("corrupted" in str(exc))
            else:
                wrong.append((position, value))
    assert wrong == []
    assert messages == {True}
    for cut in (0, 1, len(protocol.SEAL) + 10, len(stored) - 1):  # truncated
        path.write_bytes(stored[:cut])
        with pytest.raises(kinetic.ResultError, match="corrupted"):
            kinetic.attach(job.job_id).result(timeout=30, cleanup=False)
    path.write_bytes(stored)
    assert kinetic.attach(job.job_id).result(timeout=30) == 7_000_021


def test_unsealed_payloads_of_older_runners_still_load(kinetic_env: Path) -> None:
    job = scaled.run_async(2)
    assert job.result(timeout=60, cleanup=False) == 2_000_006
    path = kinetic_env / "storage" / job.job_id / "result.pkl"
    path.write_bytes(protocol.unseal(path.read_bytes()))
    assert kinetic.attach(job.job_id).result(timeout=30) == 2_000_006


def test_an_outcome_object_whose_payload_changed_is_refused() -> None:
    import cloudpickle

    payload = cloudpickle.dumps(protocol.result_payload(success=True, result=12345))
    data = protocol.encode_outcome({"state": "succeeded"}, payload)
    header, body = protocol.decode_outcome(data)
    assert (header["state"], body) == ("succeeded", payload)
    changed = bytearray(data)
    changed[-5] ^= 0x01
    with pytest.raises(ValueError, match="SHA-256"):
        protocol.decode_outcome(bytes(changed))
