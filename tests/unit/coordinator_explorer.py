"""A seeded fault explorer for the coordinated pool's coordinator
(:mod:`runner.pool.coordinator.core`).

It drives the real :class:`~runner.pool.coordinator.core.Coordinator` and simulated
workers that keep to the worker's side of :mod:`runner.pool.coordinator.messages`, over
connections that deliver in order or drop, and a store whose commit writes land, land
with their answer lost, or fail. A seeded scheduler picks each step among those
possible: deliver a message, end or start an input, reconnect, let time pass, finish a
commit write; and injects faults: a worker killed (its pod replaced by a new one), a
connection dropped, a worker paused past the silence, the coordinator crashed (its
commit under way may land after its successor started) and restarted from the commits,
a cancel, failures under ``fail_fast``. The coordinator's invariants (its module's
docstring) are checked after every step and at the end; ``explore(seed)`` replays a run.
"""

from __future__ import annotations

import random
from collections import Counter, deque
from dataclasses import dataclass, field

from runner import protocol, results_log
from runner.pool.coordinator import core
from runner.pool.coordinator import messages as m
from runner.pool.coordinator.commits import commit_rank, encode_commit
from runner.pool.coordinator.ledger import Commit

MAX_STEPS = 20_000


def value_of(index: int) -> bytes:
    return str(index * index).encode()


def record_of(index: int, failed: bool, worker: str) -> bytes:
    state: protocol.InputState = "failed" if failed else "succeeded"
    header = protocol.OutcomeHeader(state=state, worker=worker)
    return results_log.encode(index, header, value_of(index))


@dataclass
class Conn:
    id: int
    worker: str
    epoch: int
    up: deque[m.ToCoordinator] = field(default_factory=deque)
    down: deque[m.ToWorker] = field(default_factory=deque)
    hello_delivered: bool = False
    open: bool = True


@dataclass
class SimWorker:
    name: str
    rest: list[int] = field(default_factory=list)
    running: tuple[int, float] | None = None  # index, when it ends
    unacked: dict[int, m.Outcome] = field(default_factory=dict)
    conn: Conn | None = None
    alive: bool = True
    paused_until: float = 0.0
    exiting: m.Exit | None = None
    exited: bool = False
    said_at: float = 0.0
    told: set[int] = field(default_factory=set)  # dropped by the coordinator's word
    asked: bool = False  # it asked for a span and was handed none since (the Member's flag)


@dataclass
class Run:
    seed: int
    total: int
    log: list[str] = field(default_factory=list)
    commits: dict[tuple[int, int], dict[int, bytes]] = field(default_factory=dict)
    own: set[int] = field(default_factory=set)
    cancelled: set[int] = field(default_factory=set)  # by a reader: an own object, never run
    runs: Counter[int] = field(default_factory=Counter)
    crashes: int = 0
    coordinator_crashes: int = 0
    late_commits: int = 0
    stopped: str | None = None
    finished: str | None = None

    def durable(self) -> set[int]:
        found = set(self.own)
        for records in self.commits.values():
            found.update(records)
        return found

    def reader_view(self) -> dict[int, bytes]:
        """What every reader reports: an own object, else the earliest commit's."""
        view: dict[int, bytes] = {}
        for key in sorted(self.commits, key=lambda k: commit_rank(*k)):
            for index, record in self.commits[key].items():
                view.setdefault(index, record)
        return view


class World:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        rng = self.rng
        total = rng.choice([1, 5, 20, 60, 150])
        self.n_workers = rng.choice([1, 2, 4, 8])
        self.fail_fast = rng.random() < 0.2
        self.fail_rate = rng.choice([0.0, 0.0, 0.05, 0.3])
        self.run = Run(seed, total)
        self.now = 0.0
        self.epoch = 0
        self.kill_on_fail = rng.random() < 0.5
        self.coord: core.Coordinator | None = core.Coordinator(
            total, self.n_workers, fail_fast=self.fail_fast, kill_on_fail=self.kill_on_fail
        )
        self.conns: dict[int, Conn] = {}
        self.next_conn = 0
        self.workers = [SimWorker(f"w{i}") for i in range(self.n_workers)]
        self.incarnations = Counter[str]()
        self.writing: tuple[int, Commit] | None = None  # the epoch that writes it
        self.zombie_writes: list[tuple[int, Commit]] = []
        self.half_open: list[int] = []  # dropped on the worker's side, not yet noticed
        self.unlisted: list[int] = []  # cancelled by a reader, not listed by the coordinator yet
        self.listed: set[int] = set()
        self.faults = rng.randint(0, 6)
        self.cancel_at = rng.uniform(0.5, 6.0) if rng.random() < 0.15 else None
        self.assigned_after_stop = False
        self.read_at_restart: set[int] = set()

    # -- the coordinator's actions -------------------------------------------------------

    def perform(self, actions: list[core.Action]) -> None:
        for action in actions:
            if isinstance(action, core.Send):
                conn = self.conns.get(action.conn)
                if conn is not None and conn.open:
                    if isinstance(action.message, m.Assign):
                        self.check_assign(conn, action.message.indices)
                    conn.down.append(action.message)
            elif isinstance(action, core.Close):
                self.drop(action.conn, tell_coordinator=False)
            elif isinstance(action, core.WriteCommit):
                assert self.writing is None, "two commits in flight"
                self.writing = (self.epoch, action.commit)
            elif isinstance(action, core.WriteStop):
                self.run.stopped = self.run.stopped or action.reason
            elif isinstance(action, core.Finished):
                self.run.finished = action.reason

    def land(self, commit: Commit) -> None:
        key = (commit.epoch, commit.seq)
        assert key not in self.run.commits, f"commit {key} written twice"
        for index, record in commit.records.items():
            for other, records in self.run.commits.items():
                assert not (other[0] == commit.epoch and index in records), (
                    f"input {index} in commits {other} and {key} of one epoch"
                )
            decoded = results_log.decode_burst(encode_commit([record]))
            assert decoded[0][0] == index
            assert decoded[0][2] == value_of(index)
        self.run.commits[key] = dict(commit.records)

    # -- connections ---------------------------------------------------------------------

    def drop(self, conn_id: int, *, tell_coordinator: bool = True) -> None:
        conn = self.conns.get(conn_id)
        if conn is None or not conn.open:
            return
        conn.open = False
        conn.up.clear()
        conn.down.clear()
        for w in self.workers:
            if w.conn is conn:
                w.conn = None
        if tell_coordinator and self.coord is not None and conn.epoch == self.epoch:
            self.perform(self.coord.disconnected(conn_id, self.now))

    def say(self, w: SimWorker, message: m.ToCoordinator) -> None:
        w.said_at = self.now
        if w.conn is not None and w.conn.open:
            w.conn.up.append(message)

    def connect(self, w: SimWorker) -> None:
        conn = Conn(self.next_conn, w.name, self.epoch)
        self.next_conn += 1
        self.conns[conn.id] = conn
        w.conn = conn
        holding = ([w.running[0]] if w.running else []) + w.rest
        w.asked = not w.rest
        self.say(w, m.Hello(w.name, tuple(holding), wants=w.asked))
        for outcome in w.unacked.values():
            self.say(w, outcome)

    # -- the workers ---------------------------------------------------------------------

    def hear(self, w: SimWorker, message: m.ToWorker) -> None:
        if isinstance(message, m.Assign):
            if w.exiting is None:  # else: sent before the stop
                w.rest += [i for i in message.indices if i not in w.rest]
                w.told -= set(message.indices)
                w.asked = False
        elif isinstance(message, m.Drop):
            w.rest = [i for i in w.rest if i not in message.indices]
            w.told |= set(message.indices)
            if w.running is not None and w.running[0] in message.indices:
                w.running = None  # the Member ends a dropped running input
            self.ask_if_idle(w)
        elif isinstance(message, m.Ack):
            durable = self.run.durable()
            for index in message.indices:
                assert index in durable, f"input {index} acknowledged before it was durable"
                w.unacked.pop(index, None)
        elif isinstance(message, m.Exit):
            w.exiting = message
            w.rest = []
            if message.kill:
                w.running = None

    def ask_if_idle(self, w: SimWorker) -> None:
        """As the Member: a worker left with nothing to run asks for a span, once (a
        drop can empty its span; its hello said it held inputs, so it did not ask)."""
        if w.running is None and not w.rest and not w.asked and w.exiting is None:
            w.asked = True
            self.say(w, m.More())

    def worker_steps(self, w: SimWorker) -> list[str]:
        if not w.alive or w.exited or self.now < w.paused_until:
            return []
        steps = []
        if w.running is not None and self.now >= w.running[1]:
            steps.append("end")
        if w.running is None and w.rest and w.exiting is None:
            steps.append("start")
        if w.conn is None and self.coord is not None:
            steps.append("connect")
        if w.exiting is not None and not w.unacked and w.running is None:
            steps.append("exit")
        if w.conn is not None and w.conn.down and w.conn.hello_delivered:
            steps.append("hear")
        return steps

    def worker_step(self, w: SimWorker, step: str) -> None:
        if step == "end":
            assert w.running is not None
            index = w.running[0]
            w.running = None
            self.run.runs[index] += 1
            failed = self.rng.random() < self.fail_rate
            own = self.rng.random() < 0.05
            if own:
                self.run.own.add(index)
            record = None if own else record_of(index, failed, w.name)
            outcome = m.Outcome(index, record, failed, self.rng.uniform(0.05, 0.6))
            w.unacked[index] = outcome
            self.say(w, outcome)
            self.ask_if_idle(w)
        elif step == "start":
            index = w.rest.pop(0)
            w.running = (index, self.now + self.rng.uniform(0.05, 0.6))
            if not w.rest and not w.asked:
                w.asked = True
                self.say(w, m.More())
        elif step == "connect":
            self.connect(w)
        elif step == "exit":
            w.exited = True
            if w.conn is not None:
                self.drop(w.conn.id)
        elif step == "hear":
            assert w.conn is not None
            self.hear(w, w.conn.down.popleft())

    # -- faults --------------------------------------------------------------------------

    def fault(self) -> None:
        rng = self.rng
        kind = rng.choice(["kill", "drop", "half-open", "pause", "crash", "crash", "cancel"])
        live = [w for w in self.workers if w.alive and not w.exited]
        if kind == "kill" and live:
            w = rng.choice(live)
            w.alive = False
            self.run.crashes += 1
            if w.conn is not None:
                self.drop(w.conn.id)
            base = w.name.split("#")[0]
            self.incarnations[base] += 1
            self.workers.append(SimWorker(f"{base}#{self.incarnations[base]}"))
        elif kind == "half-open":  # the worker sees a reset; the coordinator, later
            open_ = [c for c in self.conns.values() if c.open]
            if open_:
                conn = rng.choice(open_)
                self.drop(conn.id, tell_coordinator=False)
                if conn.epoch == self.epoch and conn.hello_delivered:
                    self.half_open.append(conn.id)
        elif kind == "drop":
            open_ = [c for c in self.conns.values() if c.open]
            if open_:
                self.drop(rng.choice(open_).id)
        elif kind == "pause" and live:
            rng.choice(live).paused_until = self.now + rng.uniform(1.0, 6.0)
        elif kind == "crash" and self.coord is not None:
            self.crash()
        elif kind == "cancel":  # a reader cancels one input: its object of its own
            undone = sorted(set(range(self.run.total)) - self.run.durable())
            if undone:
                index = rng.choice(undone)
                self.run.own.add(index)
                self.run.cancelled.add(index)
                self.unlisted.append(index)

    def crash(self) -> None:
        self.run.coordinator_crashes += 1
        if self.writing is not None and self.rng.random() < 0.5:
            self.zombie_writes.append(self.writing)  # lands later, maybe after the restart
        self.writing = None
        self.coord = None
        for conn in list(self.conns.values()):
            self.drop(conn.id, tell_coordinator=False)

    def restart(self) -> None:
        self.epoch += 1
        self.read_at_restart = self.run.durable()
        self.listed.update(self.unlisted)  # a restart lists them
        self.unlisted = []
        self.coord = core.Coordinator(
            self.run.total,
            self.n_workers,
            epoch=self.epoch,
            durable=self.read_at_restart,
            fail_fast=self.fail_fast,
            kill_on_fail=self.kill_on_fail,
            now=self.now,
        )
        if self.run.stopped is not None:
            self.perform(self.coord.stop(self.run.stopped, self.now))

    # -- the invariants ------------------------------------------------------------------

    def check_assign(self, conn: Conn, indices: tuple[int, ...]) -> None:
        """A span handed out: not after a stop, not an input a restart read as durable,
        and none that another worker holds that the coordinator believes alive (unless
        a Drop on its way tells that worker)."""
        if self.run.stopped:
            self.assigned_after_stop = True
        assert not set(indices) & self.read_at_restart, "a durable input handed out again"
        assert not set(indices) & self.listed, "an input found done handed out"
        assert self.coord is not None
        for other in self.workers:
            c = other.conn
            if other.name == conn.worker or not other.alive or c is None or not c.open:
                continue
            seen = self.coord.workers.get(other.name)
            if not c.hello_delivered or seen is None or seen.silent:
                continue
            dropped = {i for x in c.down if isinstance(x, m.Drop) for i in x.indices}
            dropped |= other.told
            mine = set(other.rest) | ({other.running[0]} if other.running else set())
            both = (mine & set(indices)) - dropped
            assert not both, f"inputs {sorted(both)} handed to {conn.worker}, held by {other.name}"

    def check(self) -> None:
        coord = self.coord
        if coord is not None:
            held: dict[int, str] = {}
            for w in coord.workers.values():
                for index in w.holding:
                    assert index not in held, f"input {index} held by {held[index]} and {w.name}"
                    assert coord.holders.get(index) == w.name
                    held[index] = w.name
            assert set(coord.holders) == set(held)
            if coord.finished and coord.stopped is None:
                missing = set(range(self.run.total)) - self.run.durable()
                assert not missing, f"finished with inputs {sorted(missing)[:5]} not durable"
        assert not self.assigned_after_stop, "a span handed out after the stop"

    # -- the schedule --------------------------------------------------------------------

    def step(self, quiet: bool) -> bool:
        """One step; False when nothing is left to do."""
        rng = self.rng
        if self.run.finished:
            return False
        choices: list[tuple[str, object]] = []
        for conn in self.conns.values():
            if conn.open and conn.up and self.coord is not None and conn.epoch == self.epoch:
                choices.append(("deliver", conn))
        for w in self.workers:
            choices += [("worker", (w, s)) for s in self.worker_steps(w)]
        if self.writing is not None:
            choices.append(("write", None))
        if self.zombie_writes:
            choices.append(("zombie", None))
        if self.half_open and self.coord is not None:
            choices.append(("noticed", None))
        if self.coord is None:
            choices.append(("restart", None))
        if self.unlisted and self.coord is not None:
            choices.append(("list", None))
        choices.append(("time", None))
        if not quiet and self.faults > 0 and rng.random() < 0.02:
            self.faults -= 1
            self.fault()
            return True
        kind, what = rng.choice(choices)
        if kind == "deliver":
            assert isinstance(what, Conn)
            self.deliver(what)
        elif kind == "worker":
            assert isinstance(what, tuple)
            worker, which = what
            self.worker_step(worker, which)
        elif kind == "write":
            self.write()
        elif kind == "noticed":
            conn_id = self.half_open.pop(0)
            if self.conns[conn_id].epoch == self.epoch:
                self.perform(self.coord.disconnected(conn_id, self.now))  # type: ignore[union-attr]
        elif kind == "zombie":
            commit = self.zombie_writes.pop(0)[1]
            if (commit.epoch, commit.seq) not in self.run.commits:  # else: a 412
                self.land(commit)
                self.run.late_commits += 1
        elif kind == "restart":
            self.restart()
        elif kind == "list":  # the coordinator lists the outcome objects of their own
            indices, self.unlisted = self.unlisted, []
            self.listed.update(indices)
            self.perform(self.coord.own_outcomes(indices, self.now))  # type: ignore[union-attr]
        else:
            self.tick()
        return True

    def deliver(self, conn: Conn) -> None:
        assert self.coord is not None
        message = conn.up.popleft()
        if not conn.hello_delivered:
            assert isinstance(message, m.Hello)
            conn.hello_delivered = True
            self.perform(self.coord.connected(conn.id, message, self.now))
        else:
            self.perform(self.coord.received(conn.id, message, self.now))

    def write(self) -> None:
        assert self.writing is not None
        assert self.coord is not None
        _epoch, commit = self.writing
        outcome = self.rng.choice(["landed", "landed", "answer lost", "failed"])
        if outcome == "failed":
            return  # the shell tries the same name again
        if (commit.epoch, commit.seq) not in self.run.commits:
            self.land(commit)
        if outcome == "answer lost":
            return  # the next try finds it there: landed
        self.writing = None
        self.perform(self.coord.landed(commit, self.now))

    def tick(self) -> None:
        self.now += self.rng.choice([0.01, 0.05, 0.2, 0.5, 1.0])
        for w in self.workers:
            busy = w.running is not None or w.unacked or w.rest
            if (
                w.alive
                and busy
                and self.now >= w.paused_until
                and self.now - w.said_at >= core.BEAT_SECONDS
            ):
                self.say(w, m.Beat())
        if self.cancel_at is not None and self.now >= self.cancel_at:
            self.cancel_at = None
            self.run.stopped = self.run.stopped or "cancelled"
        if self.coord is not None:
            if self.run.stopped is not None and self.coord.stopped is None:
                self.perform(self.coord.stop(self.run.stopped, self.now))
                for conn in self.conns.values():  # every connected worker told at once
                    if conn.open and conn.hello_delivered and conn.epoch == self.epoch:
                        assert any(isinstance(x, m.Exit) for x in conn.down), "stop unsaid"

            self.perform(self.coord.tick(self.now))


def explore(seed: int) -> Run:
    """One seeded run; raises AssertionError, naming the step, when an invariant breaks."""
    world = World(seed)
    steps = 0
    while steps < MAX_STEPS:
        quiet = world.faults == 0
        try:
            if not world.step(quiet):
                break
            world.check()
        except AssertionError as exc:
            raise AssertionError(f"seed {seed}, step {steps}: {exc}") from exc
        steps += 1
    run = world.run
    assert run.finished is not None, f"seed {seed}: not finished after {steps} steps"
    if run.stopped is None:
        view = run.reader_view()
        missing = set(range(run.total)) - set(view) - run.own
        assert not missing, f"seed {seed}: inputs {sorted(missing)[:5]} have no outcome"
        assert all(run.runs[i] >= 1 for i in range(run.total) if i not in run.cancelled)
    return run
