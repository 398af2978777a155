"""A seeded fault explorer for the pool protocol: real worker machines
(runner.pool.machine) and their book, over one in-memory store whose objects have
generations (tests/unit/pool_driver.py), stepped by a scheduler that interleaves their
operations and injects what pods meet on GCS:

- a request **delayed**: its effect lands later (past a lease, at times), and its answer
  after that, while the other workers go on;
- a **lost answer**: the request landed, its answer did not; the shell tries again, as
  runner.pool.patient_store does (a create or replace that finds its own bytes has won);
- a worker **paused** (GC, throttling) that resumes, with its requests in flight;
- a worker **crashed** at any step (its buffer and running input lost; the Job
  controller starts another);
- a worker **terminated** (SIGTERM: its pod deleted, its node drained) at any step: as
  runner/pool/worker.py does, it ends its input, writes what it buffered and exits; another
  starts;
- **clock skew**: each worker's wall clock is off by up to a tenth of the lease;
- a **429 storm**: the bucket refuses every write for a while (GCS's rate limit, met by
  the whole pool at once). The storage client backs off and tries again, so each write
  sent meanwhile lands after the storm, at its worker's back-off, all of them within
  a moment (renewals included: leases run out together); a write still refused when
  the patient store's patience (a quarter of the lease) is spent kills its worker, the
  write not landed (runner.pool.patient_store raises; the pod restarts seconds later),
  its inputs running meanwhile where the courier carries the write.

The invariants, checked after every step (:meth:`Exploration.check_step`) and at the end
(:meth:`Exploration.check_end`):

1. **One holder**: of the live workers holding a span, at most one still has its claim
   as it wrote it; any other's was replaced since (the fence: its next write of the
   claim fails, and it lets go).
2. **Every input has an outcome**, once the batch settled, and every outcome is the
   function's value (``index**2``) or a recorded failure (``max_claims`` crashes).
3. **Readers agree**: two readers that look at different times report the same outcome
   of every input (and never change one they reported).
4. **No outcome is visible unless durable**: readers read only the store.

Replay a failing seed with ``explore(seed)``; the test prints it.
"""

from __future__ import annotations

import pickle
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from runner import protocol, results_log
from runner.pool.book import PoolBook
from runner.pool.machine import WorkerMachine
from runner.pool.ops import Create, Exit, Kill, List, Op, Read, Replace, Run, Sleep, Write
from runner.pool.options import PoolOptions
from runner.pool.outcomes import OWN_OUTCOME, OutcomeChoice, outcome_rank
from tests.unit.pool_driver import GID, generation, ok

LEASE = 30.0
MAX_DELAY = 45.0
"""The longest a request is held in flight (one and a half leases)."""
PATIENCE = LEASE / 4
"""How long a worker's store tries a refused request again (the pod's
``PatientStore.patience``) before it raises and the worker dies."""


@dataclass
class Worker:
    name: str
    machine: WorkerMachine
    skew: float
    awake_at: float = 0.0
    in_flight: tuple[Op, float] | None = None
    """A storage request sent and not answered: it lands at the time given."""
    running: tuple[int, float] | None = None
    """The input running and when it ends."""
    wrote: dict[str, bytes] = field(default_factory=dict)
    """What this worker's writes that landed left in each object."""
    ordinal: int | None = None
    """Its Indexed Job completion index (a replacement pod has its predecessor's)."""
    gives_up_at: float | None = None
    """When its store gives up the write a 429 storm refuses (the worker dies then)."""


class Reader:
    """A process following the batch (``results()``, ``kinetic batch status``): it looks
    now and then, as kinetic/_backends/gke/pool.py does — bursts, outcomes of their own,
    then claims — and reports each input's outcome by the rule every reader follows
    (docs/pool-protocol.md, "Which outcome of an input stands")."""

    def __init__(self, options: PoolOptions) -> None:
        self.book = PoolBook(options)
        self.choice: OutcomeChoice[tuple[str, bytes]] = OutcomeChoice(options.lease_s)
        self.read: set[str] = set()
        self.reported: dict[int, tuple[str, bytes]] = {}

    def look(self, objects: dict[str, bytes], now: float, *, no_writer: bool = False) -> None:
        bursts, singles = protocol.group_bursts_prefix(GID), protocol.group_results_prefix(GID)
        claims = protocol.group_claims_prefix(GID)
        new_bursts = [k for k in sorted(objects) if k.startswith(bursts) and k not in self.read]
        new_singles = [k for k in sorted(objects) if k.startswith(singles) and k not in self.read]
        for key in sorted(k for k in objects if k.startswith(claims)):
            claim = protocol.parse_claim_name(key.removeprefix(claims))
            if claim is not None:
                self.book.learn_listed(*claim)
        for key in new_singles:
            single = protocol.parse_outcome_name(key.removeprefix(singles))
            assert single is not None
            header, payload = protocol.decode_outcome(objects[key])
            self.choice.offer(single, OWN_OUTCOME, (header["state"], payload), first=True, seen=now)
        for key in new_bursts:
            name = key.removeprefix(bursts)
            parsed = protocol.parse_burst_name(name)
            assert parsed is not None
            first = self.book.first_claim(parsed[2], parsed[3])
            for index, header, payload in results_log.decode_burst(objects[key]):
                value = (header["state"], payload)
                self.choice.offer(index, outcome_rank(name), value, first=first, seen=now)
        self.read.update(new_bursts + new_singles)
        self.reported.update(self.choice.release(float("inf") if no_writer else now))


@dataclass
class Exploration:
    """One seeded run (see the module docstring)."""

    seed: int
    objects: dict[str, bytes] = field(default_factory=dict)
    now: float = 1_000.0
    log: list[str] = field(default_factory=list)
    machine_type: type[WorkerMachine] = WorkerMachine
    """The machines' class (a subclass records their operations: test_pool_replay)."""
    storms_on: bool = True
    """Whether 429 storms come (drawn from a generator of their own: a run without them
    is the same schedule as before they were added, which test_pool_replay pins)."""

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.storm_rng = random.Random(f"storms {self.seed}")
        self.storm_until = float("-inf")
        self.storms = self.storm_writes = self.storm_kills = 0
        self.inputs = self.rng.randint(1, 12)
        self.workers = self.rng.randint(1, 5)
        self.options = PoolOptions(
            total=self.inputs,
            chunk_size=64,
            workers=self.workers,
            lease_s=LEASE,
            max_claims=4,
            burst_s=1.0,
        )
        self.claims = protocol.group_claims_prefix(GID)
        self.bursts = protocol.group_bursts_prefix(GID)
        self.live: dict[str, Worker] = {}
        self.started = 0
        self.crashes = 0
        self.readers = [Reader(self.options), Reader(self.options)]
        # Odd seeds' workers carry a request across an input's end, as the pod's
        # courier does (runner.pool.courier; the machine's ``overlap``): a request held
        # in flight then outlasts inputs, which end and start meanwhile.
        self.overlap = self.seed % 2 == 1
        # Half the seeds give the workers ordinals, as an Indexed Job does: worker k
        # starts in region k, and a replacement pod in its predecessor's.
        ordinals = self.rng.random() < 0.5
        for k in range(self.workers):
            self.start(k if ordinals else None)

    # -- the world ---------------------------------------------------------------------

    def start(self, ordinal: int | None = None, at: float | None = None) -> None:
        name = f"w{self.started}"
        self.started += 1
        machine = self.machine_type(
            self.options, GID, name, wait_max=LEASE / 6, ordinal=ordinal, overlap=self.overlap
        )
        skew = self.rng.uniform(-LEASE / 10, LEASE / 10)
        awake_at = self.now if at is None else at
        self.live[name] = Worker(name, machine, skew, awake_at=awake_at, ordinal=ordinal)

    def crash(self, worker: Worker, *, landed: bool | None = None, restart_in: float = 0.0) -> None:
        """``worker`` dies; the request it had in flight reached the store or not
        (``landed``; None: either, by the draw); another starts ``restart_in`` later."""
        self.log.append(f"{self.now:.2f} crash {worker.name}")
        del self.live[worker.name]
        self.crashes += 1
        if worker.in_flight is not None and (
            landed if landed is not None else self.rng.random() < 0.5
        ):
            self.land(worker, worker.in_flight[0])  # it had reached the store
        self.start(worker.ordinal, at=self.now + restart_in)  # the Job controller's new pod

    def terminate(self, worker: Worker) -> None:
        """SIGTERM, as runner/pool/worker.py's wind_up answers it: the request under way ends,
        the running input is ended (no outcome), the buffer is written; then the worker
        exits and the Job controller starts another."""
        self.log.append(f"{self.now:.2f} SIGTERM {worker.name}")
        machine = worker.machine
        if worker.in_flight is not None:
            op, _ = worker.in_flight
            worker.in_flight = worker.gives_up_at = None
            self.answer(worker, op, self.land(worker, op))
        machine.book.learn_stop(protocol.stop_record("cancelled", "SIGTERM"))
        if machine.running is not None:
            machine.ended(machine.running[0])
        worker.running = None
        for _ in range(1_000):
            op = machine.next(wall=self.now + worker.skew, mono=self.now, pick=self.rng.random())
            if isinstance(op, Exit):
                break
            if isinstance(op, (Run, Kill)):
                if machine.running is not None:
                    machine.ended(op.index)
            elif not isinstance(op, Sleep):
                self.answer(worker, op, self.land(worker, op))
        else:
            raise AssertionError(f"seed {self.seed}: {worker.name} never wound up")
        del self.live[worker.name]
        self.start(worker.ordinal)

    def land(self, worker: Worker, op: Op) -> int | None:
        """Apply ``worker``'s storage request; the answer's value (generation, or None)."""
        objects = self.objects
        if isinstance(op, Create):
            if op.key in objects:
                return None
        elif isinstance(op, Replace):
            current = objects.get(op.key)
            if current is None or generation(current) != op.generation:
                return None
        elif not isinstance(op, Write):
            return None
        objects[op.key] = worker.wrote[op.key] = op.data
        return generation(op.data)

    def answer(self, worker: Worker, op: Op, landed: int | None) -> None:
        """Answer a request whose effect ``land`` applied (reads and listings are
        answered from the store as it is now)."""
        machine = worker.machine
        if isinstance(op, List):
            keys = sorted(k for k in self.objects if k.startswith(op.prefix))
            machine.listed(op.prefix, keys)
        elif isinstance(op, Read):
            data = self.objects.get(op.key)
            machine.read(op.key, data, None if data is None else generation(data))
        elif isinstance(op, Create):
            machine.created(op.key, landed)
        elif isinstance(op, Replace):
            machine.replaced(op.key, landed)
        elif isinstance(op, Write):
            machine.written(op.key)

    def retry_after_loss(self, worker: Worker, op: Op, landed: int | None) -> int | None:
        """A lost answer, tried again: a create or replace that finds its own bytes won
        (runner.pool.patient_store); another try otherwise."""
        if isinstance(op, (Create, Replace)):
            current = self.objects.get(op.key)
            if current == op.data:
                return generation(current)
            return self.land(worker, op)
        return landed

    # -- the scheduler ------------------------------------------------------------------

    def step(self) -> bool:
        """One event; False when the run is over."""
        rng = self.rng
        if not self.live:
            return False
        awake = [w for w in self.live.values() if w.awake_at <= self.now]
        if not awake:
            self.now = min(w.awake_at for w in self.live.values())
            return True
        worker = rng.choice(awake)
        for reader in self.readers:
            if rng.random() < 0.02:
                reader.look(self.objects, self.now)
        if self.storms_on and self.storm_until < self.now and self.storm_rng.random() < 0.0005:
            # GCS's rate limit met by the whole pool: every write refused for a while.
            self.storm_until = self.now + self.storm_rng.uniform(0, LEASE)
            self.storms += 1
            self.log.append(f"{self.now:.2f} 429 storm until {self.storm_until:.2f}")
        roll = rng.random()
        if roll < 0.004:
            self.crash(worker)
            return True
        if roll < 0.005:
            self.terminate(worker)
            return True
        if roll < 0.01:  # paused: a GC, throttling, a stalled connection
            worker.awake_at = self.now + rng.uniform(0, 2 * LEASE)
            return True
        self.advance(worker)
        self.now += rng.choice((0.0, 0.001, 0.01, 0.1))
        return True

    def advance(self, worker: Worker) -> None:
        machine, rng = worker.machine, self.rng
        if worker.gives_up_at is not None and self.now >= worker.gives_up_at:
            self.storm_kills += 1
            self.log.append(f"{self.now:.2f} {worker.name}'s write refused past its patience")
            # Its store raised: the pod dies and is started again after a while.
            self.crash(worker, landed=False, restart_in=self.storm_rng.uniform(1.0, 10.0))
            return
        if worker.in_flight is not None:
            op, lands = worker.in_flight
            if self.now < lands:
                wakes = lands if worker.gives_up_at is None else min(lands, worker.gives_up_at)
                if self.overlap:
                    self.carry_on(worker, wakes)
                else:
                    worker.awake_at = wakes
                return
            worker.in_flight = worker.gives_up_at = None
            landed = self.land(worker, op)
            if rng.random() < 0.05:
                landed = self.retry_after_loss(worker, op, landed)
            self.answer(worker, op, landed)
            return
        if worker.running is not None and self.now >= worker.running[1]:
            index = worker.running[0]
            worker.running = None
            machine.ran(index, *ok(index))
        wall = self.now + worker.skew
        op = machine.next(wall=wall, mono=self.now, pick=rng.random())
        if isinstance(op, (List, Read, Create, Write, Replace)):
            # Writes of claims are where the races are: held in flight more often, and
            # longer (past a lease, at times), as bursts now and then; other requests
            # now and then, briefly.
            claim = isinstance(op, (Create, Write, Replace)) and op.key.startswith(self.claims)
            burst = isinstance(op, Write) and op.key.startswith(self.bursts)
            delay = rng.random()
            if isinstance(op, (Create, Write, Replace)) and self.now < self.storm_until:
                self.refused(worker, op)
            elif (claim and delay < 0.3) or (burst and delay < 0.05):
                worker.in_flight = (op, self.now + rng.uniform(0, MAX_DELAY))
            elif delay < 0.1:
                worker.in_flight = (op, self.now + rng.uniform(0, 1.0))
            else:
                self.answer(worker, op, self.land(worker, op))
        elif isinstance(op, Run):
            self.run(worker, op)
        elif isinstance(op, Kill):
            worker.running = None
            machine.ended(op.index)
        elif isinstance(op, Sleep):
            until = self.now + op.seconds
            if worker.running is not None:
                until = min(until, worker.running[1])
            worker.awake_at = until
        elif isinstance(op, Exit):
            self.log.append(f"{self.now:.2f} {worker.name} exits: {op.reason}")
            del self.live[worker.name]

    def refused(self, worker: Worker, op: Op) -> None:
        """A write sent during a 429 storm: tried again at the client's back-off, it
        lands after the storm; one that the storm outlasts past the patience is given up
        (the worker dies then, nothing landed: :meth:`advance`)."""
        self.storm_writes += 1
        lands = self.storm_until + self.storm_rng.uniform(0, 2.0)
        worker.in_flight = (op, lands)
        if lands - self.now > PATIENCE:
            worker.gives_up_at = self.now + PATIENCE

    def run(self, worker: Worker, op: Run) -> None:
        """Start ``op``'s input: a short one, or one that outlasts a lease."""
        long = self.rng.random() < 0.4
        seconds = self.rng.uniform(2 * LEASE, 4 * LEASE) if long else self.rng.uniform(0.01, 2.0)
        worker.running = (op.index, self.now + seconds)

    def carry_on(self, worker: Worker, lands: float) -> None:
        """A request of ``worker`` is under way (``overlap``): its input ends meanwhile,
        and the machine may hand out the span's next one, else a wait for the answer."""
        machine = worker.machine
        if worker.running is not None:
            index, ends = worker.running
            if self.now < ends:
                worker.awake_at = min(lands, ends)
                return
            worker.running = None
            machine.ran(index, *ok(index))
        op = machine.next(wall=self.now + worker.skew, mono=self.now, pick=self.rng.random())
        assert isinstance(op, (Run, Sleep)), f"seed {self.seed}: {op!r} with a request out"
        if isinstance(op, Run):
            self.run(worker, op)
        else:
            worker.awake_at = min(lands, self.now + op.seconds)

    # -- invariants ---------------------------------------------------------------------

    def check_step(self) -> None:
        """Invariant 1, after every step: of the live workers that hold a span, at most
        one still has its claim as it wrote it; any other's was replaced since (the
        fence), so its next write of it fails and it lets go."""
        unfenced: dict[int, list[str]] = {}
        for worker in self.live.values():
            span = worker.machine.span
            if span is None:
                continue
            key = protocol.group_claim_key(GID, span.start, span.number)
            if key in worker.wrote and self.objects.get(key) == worker.wrote[key]:
                unfenced.setdefault(span.start, []).append(worker.name)
        for start, names in unfenced.items():
            assert len(names) == 1, f"seed {self.seed}: span {start} held by {names} at once"

    def takeovers(self) -> int:
        """Claims that took a span over (claim number 1 and up)."""
        return sum(1 for k in self.objects if k.startswith(self.claims) and not k.endswith(".000"))

    def outcomes(self) -> dict[int, list[tuple[protocol.OutcomeHeader, bytes]]]:
        found: dict[int, list[tuple[protocol.OutcomeHeader, bytes]]] = {}
        bursts, singles = protocol.group_bursts_prefix(GID), protocol.group_results_prefix(GID)
        for key, data in sorted(self.objects.items()):
            if key.startswith(bursts):
                for index, header, payload in results_log.decode_burst(data):
                    found.setdefault(index, []).append((header, payload))
            elif key.startswith(singles):
                single = protocol.parse_outcome_name(key.removeprefix(singles))
                assert single is not None
                found.setdefault(single, []).append(protocol.decode_outcome(data))
        return found

    def check_end(self) -> None:
        """Invariants 2 to 4, once the run is over."""
        for reader in self.readers:  # no worker is left: every record is in sight
            reader.look(self.objects, self.now, no_writer=True)
        first, second = (reader.reported for reader in self.readers)
        assert sorted(first) == list(range(self.inputs)), f"seed {self.seed}: unreported"
        differ = sorted(i for i in first if first[i] != second[i])
        assert not differ, f"seed {self.seed}: readers disagree on inputs {differ}"
        found = self.outcomes()
        assert sorted(found) == list(range(self.inputs)), (
            f"seed {self.seed}: inputs without an outcome: "
            f"{sorted(set(range(self.inputs)) - set(found))}"
        )
        for index, each in found.items():
            for header, payload in each:
                if header["state"] == "succeeded":
                    value = pickle.loads(payload)["result"]
                    assert value == index * index, f"seed {self.seed}: input {index} = {value}"
                else:
                    assert "not run again" in str(header.get("error")), (
                        f"seed {self.seed}: input {index} failed: {header}"
                    )


def explore(
    seed: int,
    *,
    steps: int = 60_000,
    check: Callable[[Exploration], None] | None = None,
    machine_type: type[WorkerMachine] = WorkerMachine,
    storms: bool = True,
) -> Exploration:
    """Run seed ``seed`` to its end, checking the invariants; the exploration."""
    run = Exploration(seed, machine_type=machine_type, storms_on=storms)
    for _ in range(steps):
        if not run.step():
            break
        run.check_step()
        if check is not None:
            check(run)
    else:
        raise AssertionError(f"seed {seed}: the pool did not finish in {steps} steps")
    run.check_end()
    return run
