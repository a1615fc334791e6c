"""Random and truncated protocol messages: the server answers or closes, never crashes or hangs,
and other sessions keep working meanwhile."""

from __future__ import annotations

import random
import socket
import struct
import threading

import psycopg
import pytest

from proxy.wire import FRONTEND_LIMITS, Query, StartupMessage, Sync
from tests.e2e.conftest import Proxy
from tests.e2e.rawclient import Closed, RawClient

TYPES = sorted(FRONTEND_LIMITS) + [b"?", b"\x00", b"Z"]


def frame(kind: bytes, payload: bytes) -> bytes:
    return kind + struct.pack("!i", len(payload) + 4) + payload


def random_payload(rng: random.Random) -> bytes:
    pieces = []
    for _ in range(rng.randint(0, 6)):
        choice = rng.random()
        if choice < 0.3:
            pieces.append(rng.randbytes(rng.randint(0, 12)))
        elif choice < 0.6:
            pieces.append(
                rng.choice([b"", b"s1", b"SELECT 1", b"SELECT COUNT(*) FROM adult", b"\xff\xfe"])
                + b"\x00"
            )
        elif choice < 0.8:
            pieces.append(struct.pack("!h", rng.choice([0, 1, 2, -1, 32767, -32768])))
        else:
            pieces.append(struct.pack("!i", rng.choice([0, 1, -1, 4, 2**31 - 1, -(2**31)])))
    return b"".join(pieces)


class Witness(threading.Thread):
    """A well-behaved client running queries while the fuzzer works."""

    def __init__(self, proxy: Proxy) -> None:
        super().__init__(daemon=True)
        self.proxy = proxy
        self.stop = threading.Event()
        self.done = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.proxy.dsn(), autocommit=True, connect_timeout=10) as conn:
                while not self.stop.is_set():
                    assert conn.execute("SELECT 1").fetchone() == (1,)
                    assert conn.execute("SELECT COUNT(*) FROM adult WITH ACCURACY 1000").fetchone()
                    self.done += 1
        except BaseException as e:  # reported by the test
            self.error = e


def answers_or_closes(client: RawClient) -> bool:
    """After the junk: Sync and a query; True if the server answers or closes within the timeout."""
    try:
        client.send(Sync(), Query("SELECT 1"))
        while True:
            message = client.read()
            if message.TYPE == b"D":
                return True
    except (Closed, ConnectionError):
        return True
    except TimeoutError:
        return False


def run_fuzz(proxy: Proxy, seed: int, rounds: int) -> None:
    rng = random.Random(seed)
    witness = Witness(proxy)
    witness.start()
    try:
        for i in range(rounds):
            case = rng.random()
            if case < 0.25:  # garbage or truncated start-up, then hang up
                client = RawClient.open(proxy.port, timeout=10)
                startup = StartupMessage({"user": "analyst", "database": "demo"}).encode()
                junk = rng.choice(
                    [
                        rng.randbytes(rng.randint(0, 64)),
                        startup[: rng.randint(0, len(startup))],
                        struct.pack("!i", rng.randint(-5, 20_000)) + rng.randbytes(8),
                    ]
                )
                client.send_bytes(junk)
                client.sock.shutdown(socket.SHUT_WR)
                assert client.closed(), (
                    f"seed {seed} round {i}: no close after start-up junk {junk!r}"
                )
            elif case < 0.4:  # a truncated typed message after start-up, then hang up
                client = RawClient.connect(proxy.port)
                data = frame(rng.choice(TYPES), random_payload(rng))
                client.send_bytes(data[: rng.randint(1, len(data))])
                client.sock.shutdown(socket.SHUT_WR)
                assert client.closed(), f"seed {seed} round {i}: no close after truncated {data!r}"
            else:  # well-framed random messages, then Sync and a query
                client = RawClient.connect(proxy.port)
                data = b"".join(
                    frame(rng.choice(TYPES), random_payload(rng)) for _ in range(rng.randint(1, 5))
                )
                client.send_bytes(data)
                assert answers_or_closes(client), f"seed {seed} round {i}: hang after {data!r}"
            client.close()
            assert witness.error is None, (
                f"seed {seed} round {i}: witness failed: {witness.error!r}"
            )
    finally:
        witness.stop.set()
        witness.join(30)
    assert witness.error is None, repr(witness.error)
    assert witness.done > 0
    with psycopg.connect(proxy.dsn(), autocommit=True, connect_timeout=10) as conn:
        assert conn.execute("SELECT 2").fetchone() == (2,)
    assert "session failed" not in proxy.log.getvalue()  # no internal error along the way


def test_fuzz(proxy: Proxy) -> None:
    run_fuzz(proxy, seed=20240611, rounds=120)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(5))
def test_fuzz_long(proxy: Proxy, seed: int) -> None:
    run_fuzz(proxy, seed=seed, rounds=1000)
