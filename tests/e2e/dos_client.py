"""A misbehaving session and a pinging one, run in a client process of their own (issue 16).

One session repeats a case (the largest GROUP BY, long statements, pipelines, absurd accuracies)
while another times round trips of a pass-through ``SELECT 1``; `ping_while` runs each in a
process of its own, apart from dpproxy and from each other, so that no client's Python work
shares a GIL with dpproxy or with the other client:

    python -m tests.e2e.dos_client ping DSN    # one latency per line until stdin closes
    python -m tests.e2e.dos_client CASE DSN    # one run per line of stdin, one outcome each

`tests/e2e/test_dos.py` and `bench/dos_bench.py` use `ping_while`.
"""

from __future__ import annotations

import itertools
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import psycopg

from proxy.wire import BackendMessage, ErrorResponse, Parse, Query, Sync
from tests.e2e.rawclient import RawClient, kinds

ROOT = Path(__file__).parent.parent.parent

#: The longest statement the default limits accept (limits.max_statement_bytes).
STATEMENT_LIMIT = 1 << 20
#: The largest GROUP BY the default limits allow, in values: 2 x 5 x 16 = 160 groups times three
#: overlapping aggregates = 480 values, under limits.max_values (500); about 5 s of planning.
LARGEST_GROUP_BY = (
    "SELECT sex, race, education, COUNT(*), COUNT(*) FILTER (WHERE age < 25), "
    "COUNT(*) FILTER (WHERE hours_per_week >= 41) FROM adult "
    "GROUP BY sex, race, education WITH ACCURACY {accuracy}"
)
_accuracies = itertools.count(400)  # a new query each run: planned, measured, recorded afresh


@dataclass(frozen=True)
class Target:
    """Where the sessions connect."""

    dsn: str

    def connect(self) -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(self.dsn, autocommit=True, connect_timeout=10)

    def raw(self) -> RawClient:
        url = urlsplit(self.dsn)
        assert url.port is not None
        return RawClient.connect(url.port, url.username or "", url.password or "")


def _error_code(messages: list[BackendMessage]) -> str:
    errors = [m for m in messages if isinstance(m, ErrorResponse)]
    return errors[0].sqlstate if len(errors) == 1 else f"unexpected {kinds(messages)}"


def largest_group_by(target: Target) -> str:
    with target.connect() as conn:
        sql = LARGEST_GROUP_BY.format(accuracy=next(_accuracies))
        try:
            return f"{len(conn.execute(sql).fetchall())} rows"
        except psycopg.Error as e:  # 57014 past the planning time limit on a slow machine
            return e.sqlstate or "?"


def parsed_megabyte(target: Target) -> str:
    """A statement just under the size limit that must be parsed (it names the table)."""
    padding = "adult " * ((STATEMENT_LIMIT - 200) // 6)
    with target.connect() as conn:
        rows = conn.execute(f"/* {padding} */ SELECT COUNT(*) FROM adult WITH ACCURACY 100")
        return f"{len(rows.fetchall())} rows"


def comment_2mb(target: Target) -> str:
    client = target.raw()
    client.send(Query("/*" + "adult " * ((2 << 20) // 6) + "*/ SELECT COUNT(*) FROM adult"))
    replies = client.until_ready()
    client.close()
    return _error_code(replies)


def accuracy_1e30(target: Target) -> str:
    started = time.monotonic()
    with target.connect() as conn:
        try:
            conn.execute("SELECT COUNT(*) FROM adult GROUP BY sex WITH ACCURACY 1e30")
        except psycopg.Error as e:
            return (e.sqlstate or "?") + (" at once" if time.monotonic() - started < 5 else "")
    return "answered"


def pipelined_parses(target: Target) -> str:
    client = target.raw()
    client.send(*[Parse("", "SELECT COUNT(*) FROM adult WITH ACCURACY 100")] * 10_000, Sync())
    replies = client.until_ready()
    client.close()
    return kinds(replies[-2:])


def query_256mib(target: Target) -> str:
    """A Query message of 256 MiB, streamed in 1 MiB chunks."""
    size, chunk = 256 << 20, b"x" * (1 << 20)
    client = target.raw()
    client.send_bytes(b"Q" + struct.pack("!i", size + 4 + 1))
    for _ in range(size // len(chunk)):
        client.send_bytes(chunk)
    client.send_bytes(b"\x00")
    replies = client.until_ready()
    client.close()
    return _error_code(replies)


CASES: dict[str, Callable[[Target], str]] = {
    f.__name__: f
    for f in (
        largest_group_by,
        parsed_megabyte,
        comment_2mb,
        accuracy_1e30,
        pipelined_parses,
        query_256mib,
    )
}


def _until_eof() -> threading.Event:
    """An event set once stdin closes: the parent's signal to stop."""
    closed = threading.Event()

    def watch() -> None:
        sys.stdin.read()
        closed.set()

    threading.Thread(target=watch, daemon=True).start()
    return closed


def ping(target: Target) -> None:
    """Time SELECT 1 round trips until stdin closes, one latency (seconds) per line."""
    stop = _until_eof()
    with target.connect() as conn:
        conn.execute("SELECT 1")
        while not stop.is_set():
            started = time.perf_counter()
            conn.execute("SELECT 1").fetchone()
            print(time.perf_counter() - started, flush=True)
            time.sleep(0.005)


def misbehave(target: Target, case: str) -> None:
    """Run a case once per line read from stdin, printing one outcome per run."""
    action = CASES[case]
    print("ready", flush=True)
    for _ in sys.stdin:
        try:
            outcome = action(target)
        except Exception as e:  # reported as an outcome
            outcome = f"failed: {e!r}"
        print(outcome, flush=True)


def _process(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.e2e.dos_client", *args],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _collect(process: subprocess.Popen[str], lines: list[str]) -> threading.Thread:
    def read() -> None:
        assert process.stdout is not None
        with process.stdout:
            lines.extend(line.strip() for line in process.stdout)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return reader


def ping_while(dsn: str, case: str | None, pings: int) -> tuple[list[float], list[str]]:
    """Round trips of SELECT 1 on one session, for as long as ``case`` runs on another.

    Each session is a process of its own. The case runs again and again, one run at a time,
    until ``pings`` round trips have been measured and its last run is over.

    Returns:
        The latencies (seconds) and the case's outcomes.
    """
    pinger = _process("ping", dsn)
    attacker = _process(case, dsn) if case is not None else None
    pinged: list[str] = []
    outcomes: list[str] = []
    readers = [_collect(pinger, pinged)]
    if attacker is not None:
        readers.append(_collect(attacker, outcomes))
    deadline = time.monotonic() + 600
    lines = 1 if attacker is not None else 0  # lines the attacker owes: "ready", then outcomes
    first = None  # the first ping while the case runs
    try:
        while True:
            if time.monotonic() > deadline or pinger.poll() is not None:
                raise RuntimeError(f"no progress: {len(pinged)} pings, {outcomes}")
            if len(outcomes) == lines and pinged:  # started, and the last run is over
                if first is not None and len(pinged) - first >= pings:
                    break
                if first is None:
                    first = len(pinged)
                if attacker is not None:
                    assert attacker.stdin is not None
                    attacker.stdin.write("run\n")
                    attacker.stdin.flush()
                    lines += 1
            time.sleep(0.02)
    finally:
        for process in (attacker, pinger):
            if process is not None:
                if process.stdin is not None and not process.stdin.closed:
                    process.stdin.close()
                process.wait(60)
        for reader in readers:
            reader.join(60)
    return [float(line) for line in pinged[first:]], outcomes[1:]


def main(argv: list[str]) -> int:
    role, dsn = argv
    if role == "ping":
        ping(Target(dsn))
    else:
        misbehave(Target(dsn), role)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
