"""Regenerate the PostgreSQL reference data in tests/wire/data from a live server (manual tool).

The suite never runs this; it reads the JSON files it wrote. To refresh them, start a
PostgreSQL (16.2 made the committed files) on 127.0.0.1 that trusts user ``postgres`` and
asks role ``ann`` (password ``pw``, owner of privileges on ``t(a int, b text)``) for
scram-sha-256, then run ``uv run python tests/wire/data/regenerate.py PORT``.
"""

from __future__ import annotations

import json
import random
import socket
import struct
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import scramp

from proxy.wire import (
    AuthenticationSASL,
    AuthenticationSASLContinue,
    AuthenticationSASLFinal,
    BackendMessage,
    Bind,
    Close,
    CopyData,
    CopyDone,
    DataRow,
    Describe,
    ErrorResponse,
    Execute,
    Message,
    MessageBuffer,
    Parse,
    Query,
    ReadyForQuery,
    SASLInitialResponse,
    SASLResponse,
    StartupMessage,
    Sync,
    Target,
    Terminate,
    decode_backend,
)

HERE = Path(__file__).parent


class Client:
    """A blocking PostgreSQL client made of the codec, recording every byte both ways."""

    def __init__(
        self, port: int, parameters: dict[str, str], password: str = "", minor: int = 0
    ) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.buffer = MessageBuffer()
        self.sent: list[bytes] = []
        self.received: list[bytes] = []
        self.password = password
        self.send(StartupMessage(parameters, 3, minor))
        self.startup = self.until_ready()

    def send(self, *messages: Message | StartupMessage) -> None:
        """Send messages in one write."""
        data = b"".join(message.encode() for message in messages)
        self.sent.append(data)
        self.sock.sendall(data)

    def receive(self) -> BackendMessage:
        """Read one message."""
        while (raw := self.buffer.take_message()) is None:
            data = self.sock.recv(65536)
            if not data:
                raise EOFError
            self.received.append(data)
            self.buffer.feed(data)
        return decode_backend(raw)

    def until_ready(self) -> list[BackendMessage]:
        """Read up to ReadyForQuery, answering SCRAM and copying in two rows on request."""
        messages: list[BackendMessage] = []
        scram: scramp.ScramClient | None = None
        while not isinstance(message := self.receive(), ReadyForQuery):
            messages.append(message)
            if isinstance(message, AuthenticationSASL):
                scram = scramp.ScramClient(list(message.mechanisms), "ann", self.password)
                first = scram.get_client_first().encode()
                self.send(SASLInitialResponse("SCRAM-SHA-256", first))
            elif isinstance(message, AuthenticationSASLContinue) and scram is not None:
                scram.set_server_first(message.data.decode())
                self.send(SASLResponse(scram.get_client_final().encode()))
            elif isinstance(message, AuthenticationSASLFinal) and scram is not None:
                scram.set_server_final(message.data.decode())
            elif message.TYPE == b"G":
                self.send(CopyData(b"1\tone\n"), CopyData(b"2\t\\N\n"), CopyDone())
        return [*messages, message]

    def value(self, sql: str, oid: int, param: bytes, fmt: int) -> bytes | str | None:
        """One parameter in, first column out as text; an error gives "ERROR <SQLSTATE>"."""
        self.send(Parse("", sql, (oid,)), Bind("", "", (fmt,), (param,), (0,)), Execute(""), Sync())
        for message in self.until_ready():
            if isinstance(message, ErrorResponse):
                return f"ERROR {message.sqlstate}"
            if isinstance(message, DataRow):
                value = message.values[0]
                return None if value is None else value.decode()
        raise AssertionError("no row")


def float_cases(rng: random.Random) -> Iterator[float]:
    """Floats around every formatting boundary, plus random bit patterns."""
    yield from (
        0.0,
        -0.0,
        float("inf"),
        float("-inf"),
        float("nan"),
        5e-324,
        2.2250738585072014e-308,
    )
    yield from (1.7976931348623157e308, 0.1, 0.3, 1 / 3, 2.0**53, 2.0**53 + 2, 123456789012345.0)
    for exponent in range(-20, 24):
        for mantissa in (1.0, 9.999999999999999, 1.5, 2.0):
            yield mantissa * 10.0**exponent
    for _ in range(300):
        value = struct.unpack("!d", rng.getrandbits(64).to_bytes(8, "big"))[0]
        if value == value:  # one NaN above is enough
            yield value
    for _ in range(100):
        yield rng.randint(-(10**9), 10**9) / 10 ** rng.randint(0, 12)


def numeric_cases(rng: random.Random) -> Iterator[str]:
    """Numeric literals: zeros with scales, group boundaries, random digits and exponents."""
    yield from ("0", "0.0000", "-0", "-0.00", "9999", "10000", "0.0001", "0.00001", "-1.5")
    yield from ("1e1000", "1e-1000", "NaN", "Infinity", "-Infinity", "12345678.9", "1.10")
    for _ in range(250):
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 40)))
        sign = rng.choice(("", "-"))
        yield (
            f"{sign}{digits}e{rng.randint(-45, 30)}" if rng.random() < 0.5 else f"{sign}0.{digits}"
        )


def numeric_binary_cases(rng: random.Random) -> Iterator[bytes]:
    """Hand-made binary numerics, many not in the normal form PostgreSQL itself sends."""
    header = struct.Struct("!HhHH")
    for _ in range(80):
        groups = [
            rng.choice((0, 0, 1, 9999, rng.randint(0, 9999))) for _ in range(rng.randint(0, 5))
        ]
        sign = rng.choice((0x0000, 0x4000, 0x4000, 0xC000, 0xD000, 0xF000))
        dscale = rng.choice((0, 1, 2, 3, 4, 5, 8, 13))
        yield header.pack(len(groups), rng.randint(-3, 3), sign, dscale) + struct.pack(
            f"!{len(groups)}H", *groups
        )
    yield from (header.pack(1, 0, 0x1000, 0) + b"\x00\x01", header.pack(0, 0, 0, 0x4000))
    yield from (header.pack(1, 0, 0, 0) + b"\x27\x10", header.pack(2, 0, 0, 0) + b"\x00\x01")
    yield from (header.pack(1, 0, 0, 0) + b"\x00\x01\x00", header.pack(0, 0, 0, 0)[:7])


TEXT_INPUTS: dict[int, Sequence[str]] = {
    20: (" 42 ", "-0", "+7", "0x1F", "0X1f", "0o17", "0b101", "1_000", "1__0", "_1", "1_",
         "9223372036854775807", "9223372036854775808", "-9223372036854775808", "", " ",
         "12a", "1.0", "0x", "1e3", "\uff11", "- 1", "0x7FFFFFFFFFFFFFFF", "-0x8000000000000000",
         "0x_7f", "-0x_7f", "0x_", "1_000_000", "-0b_1", "0x8000000000000000"),
    23: ("2147483647", "2147483648", "-2147483648", "-2147483649", "007", " +1 ", "1 2"),
    701: ("NaN", "nan", "-nan", "inf", "-Infinity", "+inf", "infinity", "INF", "1e400", "-1e400",
          "1e-400", "4.9e-324", "2.4e-324", "  1.5  ", ".5", "5.", "1e", "e1", "1_0", "- 1",
          "1e+5", "1E5", "0.0", "-0", "1.7976931348623157e308", "1.8e308", "", "0.1", "1,5",
          "infinit", "nan1", "0e999999", "1_000", "0x10", "-0x1.8p1", "0x.8", "0x1p2000",
          "0x1p-2000", "0x0p0", "0x1g", "0x", "1e5_0"),
    16: ("t", "TRUE", "yes", "y", "on", "o", "of", "off", "1", "0", "10", " true ", "tr",
         "truee", "", "f", "n", "No", "OFF ", "\ttrue"),
    1700: (" 1.50 ", "-0", "-0.00", "1e3", "1E-3", ".5", "5.", "NaN", "-NaN", "+Infinity", "inf",
           "-inf", "1e", "12e-3", "", "1.2.3", "--1", "+.5e+2", " NaN ", "Infinit", "1_000",
           "1_000.5_5", "0x1F", "-0x_1f", "0o17", "0b_1", "1e1_0", ".5_5", "1_", "1._5", "_1",
           "1e-16383", "1e-16384", "1e131071", "1e131072", "1e-1001", "0x", "1e999999999999999999"),
}  # fmt: skip


def values(port: int) -> dict[str, object]:
    """Ask PostgreSQL how it prints, sends and reads values."""
    rng = random.Random(20240601)
    client = Client(port, {"user": "postgres", "database": "postgres"})
    as_text = "SELECT $1::text"
    float8 = [
        [struct.pack("!d", f).hex(), client.value(as_text, 701, struct.pack("!d", f), 1)]
        for f in float_cases(rng)
    ]
    numeric = [
        [text, client.value(as_text, 1700, text.encode(), 0),
         client.value("SELECT numeric_send($1)::text", 1700, text.encode(), 0)]
        for text in numeric_cases(rng)
    ]  # fmt: skip
    recv = [
        [data.hex(), client.value(as_text, 1700, data, 1)] for data in numeric_binary_cases(rng)
    ]
    inputs = [
        [oid, text, client.value(as_text, oid, text.encode(), 0)]
        for oid, texts in TEXT_INPUTS.items()
        for text in texts
    ]
    client.send(Terminate())
    return {"float8_out": float8, "numeric": numeric, "numeric_recv": recv, "text_input": inputs}


def session(port: int) -> dict[str, object]:
    """Record one scripted conversation covering most backend messages."""
    client = Client(port, {"user": "ann", "database": "postgres"}, password="pw")
    client.send(Query("TRUNCATE t"))
    client.until_ready()
    client.send(
        Query("SELECT 1::int8 AS i, 0.1::float8 AS f, -1.5::numeric AS n, 'hé' AS s, true AS b")
    )
    client.until_ready()
    for sql in ("SELECT nope", "", "DO $$BEGIN RAISE NOTICE 'hi'; END$$", "COPY t FROM STDIN"):
        client.send(Query(sql))
        client.until_ready()
    client.send(Query("COPY (SELECT * FROM t ORDER BY a) TO STDOUT"))
    client.until_ready()
    sql = "SELECT x::numeric, x::float8 / 3 FROM generate_series(1, $1) x"
    client.send(Parse("s1", sql, (23,)), Describe(Target.STATEMENT, "s1"), Sync())
    client.until_ready()
    bind = Bind("p1", "s1", (1,), (b"\x00\x00\x00\x02",), (1,))
    client.send(bind, Describe(Target.PORTAL, "p1"), Execute("p1", 1), Execute("p1", 0), Sync())
    client.until_ready()
    client.send(Parse("", "SET search_path = public"), Bind("", ""), Describe(Target.PORTAL, ""))
    client.send(Execute(""), Close(Target.STATEMENT, "s1"), Sync())
    client.until_ready()
    client.send(Terminate())
    options = {"user": "postgres", "database": "postgres", "_pq_.dpproxy_test": "1"}
    negotiated = Client(port, options, minor=9)
    negotiated.send(Terminate())
    return {
        "sent": [data.hex() for data in client.sent],
        "received": [data.hex() for data in client.received],
        "negotiate_sent": [data.hex() for data in negotiated.sent],
        "negotiate_received": [data.hex() for data in negotiated.received],
    }


def dump(data: dict[str, object]) -> str:
    """JSON with one list item per line, for readable diffs."""
    entries = []
    for key, value in data.items():
        if isinstance(value, list):
            items = ",\n".join(" " + json.dumps(item, ensure_ascii=False) for item in value)
            entries.append(f"{json.dumps(key)}: [\n{items}\n]")
        else:
            entries.append(f"{json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}")
    return "{\n" + ",\n".join(entries) + "\n}\n"


def main(port: int) -> None:
    """Write both reference files."""
    about = "Recorded from PostgreSQL 16.2 by tests/wire/data/regenerate.py"
    for name, data in (("pg16_values.json", values(port)), ("pg16_session.json", session(port))):
        (HERE / name).write_text(dump({"about": about, **data}), encoding="utf-8")


if __name__ == "__main__":
    main(int(sys.argv[1]))
