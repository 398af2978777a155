"""runner.pool.patient_store: a pool worker waits out a passing storage failure (on a real
file store whose storage service fails at set times) instead of dying of it, and a
create whose answer was lost is known to have won."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.pool.patient_store import PatientStore
from runner.store import FileStore, StoreUnavailable


class Outage(FileStore):
    """A file store whose service fails its next ``failing`` requests (OSError), as
    storage does while unreachable; ``lost_answers``: creates that land but fail."""

    def __init__(self, root: Path, failing: int = 0, lost_answers: int = 0) -> None:
        super().__init__(root)
        self.failing, self.lost_answers, self.requests = failing, lost_answers, 0

    def _request(self) -> None:
        self.requests += 1
        if self.failing:
            self.failing -= 1
            raise StoreUnavailable("503 Service Unavailable")

    def read(self, key: str) -> bytes:
        self._request()
        return super().read(key)

    def write(self, key: str, data: bytes, *, fresh: bool = False) -> None:
        self._request()
        super().write(key, data)

    def create_if_absent(self, key: str, data: bytes) -> bool:
        self._request()
        won = super().create_if_absent(key, data)
        if self.lost_answers:
            self.lost_answers -= 1
            raise StoreUnavailable("connection reset after the request was served")
        return won

    def read_versioned(self, key: str) -> tuple[bytes, int]:
        self._request()
        return super().read_versioned(key)

    def replace_if(self, key: str, data: bytes, generation: int) -> int | None:
        self._request()
        made = super().replace_if(key, data, generation)
        if self.lost_answers:
            self.lost_answers -= 1
            raise StoreUnavailable("connection reset after the request was served")
        return made

    def list(self, prefix: str) -> list[str]:
        self._request()
        return super().list(prefix)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def patient(store: Outage, clock: Clock, patience: float = 30.0) -> PatientStore:
    return PatientStore(store, patience=patience, clock=clock, sleep=clock.sleep)


def test_an_outage_shorter_than_the_patience_is_waited_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clock = Clock()
    store = Outage(tmp_path, failing=4)
    p = patient(store, clock)
    p.write("a", b"1")
    assert store.read("a") == b"1"
    assert clock.slept == [0.5, 1.0, 2.0, 4.0]  # growing pauses
    assert p.retried == 4
    err = capsys.readouterr().err
    assert err.count("kinetic runner: storage write of a failed (503 Service Unavailable)") == 4


def test_a_longer_outage_raises_its_error_once_the_patience_is_spent(tmp_path: Path) -> None:
    clock = Clock()
    p = patient(Outage(tmp_path, failing=100), clock, patience=10.0)
    with pytest.raises(OSError, match="503"):
        p.list("")
    assert sum(clock.slept) == pytest.approx(10.0)
    assert max(clock.slept) <= 8.0


def test_a_missing_object_is_an_answer_not_a_failure(tmp_path: Path) -> None:
    clock = Clock()
    store = Outage(tmp_path)
    with pytest.raises(FileNotFoundError):
        patient(store, clock).read("absent")
    assert store.requests == 1
    assert clock.slept == []


def test_a_create_whose_answer_was_lost_knows_it_won(tmp_path: Path) -> None:
    clock = Clock()
    store = Outage(tmp_path, lost_answers=1)
    assert patient(store, clock).create_if_absent("claims/0000000.000", b"mine") is True
    assert FileStore(tmp_path).read("claims/0000000.000") == b"mine"


def test_a_create_another_won_meanwhile_is_lost(tmp_path: Path) -> None:
    clock = Clock()
    store = Outage(tmp_path, failing=1)
    FileStore(tmp_path).create_if_absent("claims/0000000.000", b"theirs")
    assert patient(store, clock).create_if_absent("claims/0000000.000", b"mine") is False
    assert FileStore(tmp_path).read("claims/0000000.000") == b"theirs"


def test_a_failure_that_will_not_pass_is_raised_at_once(tmp_path: Path) -> None:
    class Refusing(FileStore):
        def read(self, key: str) -> bytes:
            raise OSError("403 Forbidden: the pods' account may not read the bucket")

    clock = Clock()
    with pytest.raises(OSError, match="403"):
        PatientStore(Refusing(tmp_path), patience=30.0, clock=clock, sleep=clock.sleep).read("k")
    assert clock.slept == []


def test_a_replace_whose_answer_was_lost_is_known_to_have_won(tmp_path: Path) -> None:
    clock = Clock()
    store = Outage(tmp_path)
    made = store.create_versioned("claims/0", b"lease to 10")
    assert made is not None
    store.lost_answers = 1
    renewed = patient(store, clock).replace_if("claims/0", b"lease to 20", made)
    assert renewed is not None
    assert store.read_versioned("claims/0") == (b"lease to 20", renewed)
    # Lost to another replacer (its generation moved on): still lost, however retried.
    store.lost_answers = 1
    assert patient(store, clock).replace_if("claims/0", b"taken", made) is None
    assert store.read("claims/0") == b"lease to 20"
