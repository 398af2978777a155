"""The typed batch records of ``runner.protocol`` and ``run_async_map``'s options."""

from __future__ import annotations

from typing import Any

import pytest

from kinetic._core.inputs import MapOptions
from kinetic._engine.handle import JobHandle
from kinetic._exceptions import ConfigError
from runner import protocol
from runner.pool.book import stop_kills
from runner.pool.options import PoolOptions

# --- which Jobs belong to a batch ------------------------------------------------------


@pytest.mark.parametrize("group_id", ["grp-0123abcd", "grp-0123456789ab", "grp-" + "f" * 32])
def test_every_attempt_of_every_input_belongs_to_its_group(group_id: str) -> None:
    for index in (0, 1, 255, 65536, 0xFFFFFFFF):
        for attempt in (0, 1, 12):
            attempt_id = protocol.member_attempt_id(group_id, index, attempt)
            assert protocol.attempt_in_group(attempt_id, group_id), attempt_id


def test_ids_of_other_batches_and_jobs_do_not_belong() -> None:
    group = "grp-0123456789ab"
    member = protocol.member_attempt_id(group, 7, 0)
    # Another batch whose id starts with the same digits (ids have 8 to 32 of them).
    longer = "grp-0123456789abcdef"
    assert not protocol.attempt_in_group(protocol.member_attempt_id(longer, 7, 0), group)
    assert not protocol.attempt_in_group(member, longer)
    shorter = "grp-01234567"
    assert not protocol.attempt_in_group(member, shorter)
    assert not protocol.attempt_in_group(protocol.member_attempt_id(shorter, 7, 0), group)
    # Single jobs, other batches, malformed suffixes.
    assert not protocol.attempt_in_group("job-0123456789ab", group)
    assert not protocol.attempt_in_group(protocol.member_job_id("grp-ffffffffffff", 7), group)
    assert not protocol.attempt_in_group(member + "-a", group)
    assert not protocol.attempt_in_group(member + "-ax", group)
    assert not protocol.attempt_in_group(member + "-b1", group)
    assert not protocol.attempt_in_group(member.upper(), group)
    assert not protocol.attempt_in_group(member[:-1] + "g", group)


# --- records ---------------------------------------------------------------------------


def test_outcome_headers_keep_only_the_keys_that_are_set() -> None:
    failed: protocol.FinalRecord = {
        "state": "failed",
        "phase": "execute",
        "error": "boom",
        "error_type": None,
    }
    header = protocol.outcome_header(2, failed, claim=1, worker="pod-a")
    assert header == {
        "attempt": 2,
        "claim": 1,
        "worker": "pod-a",
        "state": "failed",
        "phase": "execute",
        "error": "boom",
    }
    assert protocol.ended_header("failed", 1, "lost", None) == {
        "state": "failed",
        "attempt": 1,
        "error": "lost",
    }
    assert protocol.ended_header("failed", 1, "lost", "execute")["phase"] == "execute"


def test_outcome_objects_round_trip_and_refuse_foreign_bytes() -> None:
    header = protocol.cancelled_header()
    data = protocol.encode_outcome(header, b"\x80payload\nwith newline")
    assert protocol.decode_outcome(data) == (header, b"\x80payload\nwith newline")
    for bad in (b"", b"[]\nx", b'{"attempt": 0}\nx', b'{"state": "succeeded"}'):
        with pytest.raises(ValueError):  # noqa: PT011 - JSON's own message, or ours
            protocol.decode_outcome(bad)


def test_unknown_states_count_as_failed() -> None:
    assert [protocol.as_input_state(s) for s in protocol.INPUT_STATES] == list(
        protocol.INPUT_STATES
    )
    assert protocol.as_input_state("?") == "failed"
    assert protocol.as_input_state(None) == "failed"


def test_stop_records_say_whether_running_inputs_end() -> None:
    options = PoolOptions(total=4, chunk_size=2, fail_fast=True)
    assert stop_kills(protocol.stop_record("cancelled", "the batch was cancelled"), options)
    assert not stop_kills(protocol.stop_record("fail_fast", "input 1 failed"), options)
    assert stop_kills(
        protocol.stop_record("fail_fast", "input 1 failed"),
        PoolOptions(total=4, chunk_size=2, fail_fast=True, cancel_running_on_fail=True),
    )
    stop = protocol.load_stop(protocol.dump_json(protocol.stop_record("failed", "x", "fetch")))
    assert stop == {"reason": "failed", "detail": "x", "phase": "fetch"}


def _manifest(options: protocol.MapOptionsRecord, **gke: Any) -> protocol.BatchManifest:
    manifest: dict[str, Any] = {"total": 10, "chunk_size": 4, "options": options}
    if gke:
        manifest["gke"] = gke
    return protocol.load_manifest(protocol.dump_json(manifest))


def test_the_engine_and_pool_options_come_from_the_manifest() -> None:
    options = MapOptions(retries=2, fail_fast=True).record(default_concurrency=3)
    old = _manifest(options)
    assert protocol.batch_engine(old) == protocol.ENGINE_POD_PER_INPUT
    pool = _manifest(options, engine=protocol.ENGINE_POOL, lease_s=12.0)
    assert protocol.batch_engine(pool) == protocol.ENGINE_POOL
    coordinated = _manifest(options, engine=protocol.ENGINE_COORDINATED)
    assert protocol.batch_engine(coordinated) == protocol.ENGINE_COORDINATED
    got = PoolOptions.from_manifest(pool)
    assert (got.total, got.chunk_size, got.workers, got.retries) == (10, 4, 3, 2)
    assert got.fail_fast
    assert not got.cancel_running_on_fail
    assert got.lease_s == 12.0
    assert got.max_claims == 2 + 1 + protocol.POOL_MAX_CLAIMS_EXTRA
    assert not got.reuse_process
    assert PoolOptions.from_manifest(old).lease_s == protocol.POOL_LEASE_SECONDS
    reuse = _manifest(options, engine=protocol.ENGINE_POOL, reuse_process=True)
    assert PoolOptions.from_manifest(reuse).reuse_process


# --- MapOptions ------------------------------------------------------------------------


def test_map_options_resolve_the_backend_default_concurrency() -> None:
    assert MapOptions().record(default_concurrency=8) == {
        "input_mode": "auto",
        "max_concurrent": 8,
        "retries": 0,
        "fail_fast": False,
        "cancel_running_on_fail": False,
    }
    opts = MapOptions(
        input_mode="kwargs", max_concurrent=2, fail_fast=True, cancel_running_on_fail=True
    )
    record = opts.record(default_concurrency=8)
    assert record["max_concurrent"] == 2
    assert record["input_mode"] == "kwargs"
    assert record["cancel_running_on_fail"] is True


def test_map_options_are_frozen_with_a_private_copy_of_the_tags() -> None:
    tags = {"team": "ml"}
    opts = MapOptions(name="squares", tags=tags)
    tags["team"] = "changed"
    assert dict(opts.tags) == {"team": "ml"}
    with pytest.raises(TypeError):
        opts.tags["x"] = "y"  # type: ignore[index]
    with pytest.raises(AttributeError):
        opts.retries = 3  # type: ignore[misc]
    assert opts == MapOptions(name="squares", tags={"team": "ml"})
    assert hash(opts) == hash(MapOptions(name="squares", tags={"team": "other"}))
    assert "squares" in repr(opts)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"input_mode": "bogus"}, "input_mode must be one of auto, single, args, kwargs"),
        ({"max_concurrent": 0}, "max_concurrent must be a positive integer or None"),
        ({"max_concurrent": True}, "max_concurrent"),
        ({"retries": -1}, "retries must be a non-negative integer"),
        ({"retries": 1.5}, "retries"),
        ({"fail_fast": "yes"}, "fail_fast must be True or False"),
        ({"cancel_running_on_fail": 1}, "cancel_running_on_fail must be True or False"),
        ({"reuse_process": "yes"}, "reuse_process must be True or False"),
        ({"name": 3}, "name must be a string"),
        ({"tags": {"a": 1}}, "tags must be a dict of strings to strings"),
        ({"tags": [("a", "b")]}, "tags"),
    ],
)
def test_invalid_map_options_raise_config_errors(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        MapOptions(**kwargs)


def test_single_jobs_and_batches_share_one_spec_and_handle_builder() -> None:
    from kinetic._core.records import job_names, job_spec, shared_handle

    spec = job_spec(
        job_id="job-1",
        func_name="f",
        payload_sha256="a" * 64,
        context_sha256="b" * 64,
        cwd=None,
        sys_path=[""],
        env={"K": "V"},
        output_dir="/out",
        has_data=False,
        install=["numpy==2.0"],
        install_kept=["jaxlib==0.4.30"],
    )
    assert spec["context_key"] == protocol.context_key("b" * 64)
    assert spec["install"] == ["numpy==2.0"]
    assert spec["install_kept"] == ["jaxlib==0.4.30"]
    bare = job_spec(**{**spec_args(), "install": ()})
    assert "install" not in bare
    assert "install_kept" not in bare
    shared = shared_handle(
        backend="gke",
        project="p",
        bucket_name="b",
        cluster_name="c",
        zone="z",
        namespace="default",
        image_uri="img",
        accelerator="l4:spot",
        func_name="f",
        debug=False,
    )
    handle = JobHandle(**shared, job_id="job-1", **job_names("job-1", "f"))
    assert (handle.k8s_name, handle.display_name) == ("kinetic-job-1", "kinetic-f-job-1")
    assert handle.accelerator == "l4:spot"  # a batch's inputs keep ":spot" as single jobs do


def spec_args() -> dict[str, Any]:
    return {
        "job_id": "g",
        "func_name": "f",
        "payload_sha256": "a" * 64,
        "context_sha256": "b" * 64,
        "cwd": None,
        "sys_path": [],
        "env": {},
        "output_dir": "/out",
        "has_data": False,
    }


@pytest.mark.parametrize("group_id", ["grp-0123abcd", "grp-0123456789ab", "grp-" + "f" * 24])
def test_a_member_job_id_names_its_batch_and_input(group_id: str) -> None:
    for index in (0, 7, 4095):
        job_id = protocol.member_job_id(group_id, index)
        assert protocol.parse_member_job_id(job_id) == (group_id, index)


@pytest.mark.parametrize("job_id", ["job-1d902d8c", "job-xyz", "grp-0123456789ab00000000", ""])
def test_other_ids_are_no_member_ids(job_id: str) -> None:
    assert protocol.parse_member_job_id(job_id) is None
