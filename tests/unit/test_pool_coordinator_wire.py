"""The coordinated pool's frames and handshake (runner/pool/coordinator/wire.py)."""

from __future__ import annotations

import struct

import pytest

from runner.pool.coordinator import messages as m
from runner.pool.coordinator import wire

TOKEN = bytes(range(32))

FRAMES: list[wire.Frame] = [
    wire.Challenge(b"c" * 16, 3),
    wire.Welcome(b"p" * 32),
    wire.Greeting(m.Hello("pod-7", (4, 5), wants=False), b"n" * 16, b"q" * 32),
    m.Outcome(12, b"\x1eKR1 a record", True, 0.25),
    m.Outcome(13, None, False, 1.5),
    m.More(),
    m.Beat(),
    m.Assign((1, 2, 3)),
    m.Drop((9,)),
    m.Ack(()),
    m.Exit("cancelled", kill=True),
    m.Read("_groups/g/inputs/000003.pkl"),
    m.Data("_groups/g/fn.pkl", b"\x80\x05 the function"),
    m.Data("_groups/g/inputs/000003.pkl", b""),
    m.Data("elsewhere", None),
]


def test_every_frame_reads_back_whole_however_the_stream_is_cut() -> None:
    stream = b"".join(wire.encode(f) for f in FRAMES)
    for piece in (1, 7, len(stream)):
        decoder = wire.Decoder()
        out: list[wire.Frame] = []
        for at in range(0, len(stream), piece):
            out += decoder.feed(stream[at : at + piece])
        assert out == FRAMES


def test_the_handshake_proves_the_token_both_ways() -> None:
    challenge = wire.Challenge(wire.new_nonce(), 0)
    nonce = wire.new_nonce()
    hello = m.Hello("w1")
    greeting = wire.Greeting(hello, nonce, wire.hello_proof(TOKEN, challenge.nonce, nonce, "w1"))
    wire.check_greeting(TOKEN, challenge, greeting)
    welcome = wire.Welcome(wire.welcome_proof(TOKEN, challenge.nonce, nonce))
    wire.check_welcome(TOKEN, challenge, nonce, welcome)
    with pytest.raises(wire.WireError, match="does not hold the batch's token"):
        wire.check_greeting(b"another batch's", challenge, greeting)
    # A greeting recorded on one connection is refused on another (a fresh challenge),
    # and under another worker's name.
    with pytest.raises(wire.WireError, match="does not hold"):
        wire.check_greeting(TOKEN, wire.Challenge(wire.new_nonce(), 0), greeting)
    renamed = wire.Greeting(m.Hello("w2"), nonce, greeting.proof)
    with pytest.raises(wire.WireError, match="does not hold"):
        wire.check_greeting(TOKEN, challenge, renamed)
    with pytest.raises(wire.WireError, match="coordinator does not hold"):
        wire.check_welcome(TOKEN, challenge, wire.new_nonce(), welcome)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (struct.pack(">I", wire.MAX_FRAME + 1), "a frame of"),
        (struct.pack(">I", 0), "a frame of 0 bytes"),
        (struct.pack(">IB", 3, 99) + b"{}", "unknown kind 99"),
        (struct.pack(">IB", 3, 7) + b"[]", "not an object"),
        (struct.pack(">IB", 20, 7) + b'{"indices":[-1, 2]}', "an input index -1"),
        (struct.pack(">IB", 5, 7) + b"\xff\xfe\xfd\xfc", "does not parse"),
    ],
)
def test_bytes_that_are_no_frame_are_refused(data: bytes, match: str) -> None:
    with pytest.raises(wire.WireError, match=match):
        wire.Decoder().feed(data)


def test_an_outcome_says_one_of_record_and_own_object() -> None:
    both = wire.encode(m.Outcome(1, b"r", False, 0.1)).replace(b'"own":false', b'"own":true ')
    with pytest.raises(wire.WireError, match="both a record and an object"):
        wire.Decoder().feed(both)


def test_a_frame_over_the_limit_is_not_sent() -> None:
    with pytest.raises(wire.WireError, match="over the limit"):
        wire.encode(m.Outcome(1, bytes(wire.MAX_FRAME), False, 0.1))
