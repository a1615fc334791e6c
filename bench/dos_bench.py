"""Another analyst's pass-through latency while one session misbehaves (issue 16).

Starts a throw-away PostgreSQL (pgserver's binaries) and ``dpproxy serve`` as a process of its
own, then measures round trips of ``SELECT 1`` on one session, idle and while another session
runs each case below again and again: the largest GROUP BY the default limits allow, a 1 MB
statement dpproxy must parse, a 2 MB comment, ``WITH ACCURACY 1e30``, 10,000 pipelined Parse
messages and a 256 MiB Query.

    uv run python bench/dos_bench.py [--pings 200]

Prints p50 / p95 / max latency per case, the CPU seconds dpproxy spent and its peak memory so
far; record them in
docs/benchmarks.md with the machine, date and load.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.proxy_bench import (  # noqa: E402
    cpu_seconds,
    free_port,
    start_dpproxy,
    start_postgres,
    stop_postgres,
)
from proxy.config import load_config  # noqa: E402
from proxy.demo import load_adult  # noqa: E402
from proxy.provision import provision_roles  # noqa: E402
from proxy.wire import Parse, Query, Sync  # noqa: E402
from tests.e2e.rawclient import RawClient  # noqa: E402

LIMITS = load_config(ROOT / "config.yaml").limits
LARGEST_GROUP_BY = (
    "SELECT sex, race, income, education, COUNT(*), COUNT(*) FILTER (WHERE age < 25), "
    "COUNT(*) FILTER (WHERE hours_per_week >= 41) FROM adult "
    "GROUP BY sex, race, income, education WITH ACCURACY {accuracy}"
)


class Cases:
    """Each case: one run of the misbehaving session, on a connection of its own."""

    def __init__(self, dsn: str, port: int) -> None:
        self.dsn, self.port = dsn, port
        self.accuracy = 400

    def raw(self) -> RawClient:
        return RawClient.connect(self.port, "bench", "bench")

    def largest_group_by(self) -> None:
        self.accuracy += 1  # a new query each run: planned, measured and recorded afresh
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            try:
                conn.execute(LARGEST_GROUP_BY.format(accuracy=self.accuracy)).fetchall()
            except (psycopg.errors.QueryCanceled, psycopg.errors.ConfigurationLimitExceeded):
                pass  # over the planning time limit, or the budget is spent

    def parsed_megabyte(self) -> None:
        padding = "adult " * ((LIMITS.max_statement_bytes - 200) // 6)
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f"/* {padding} */ SELECT COUNT(*) FROM adult WITH ACCURACY 100")

    def comment_2mb(self) -> None:
        client = self.raw()
        client.send(Query("/*" + "adult " * ((2 << 20) // 6) + "*/ SELECT 1"))
        client.until_ready()
        client.close()

    def accuracy_1e30(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            try:
                conn.execute("SELECT COUNT(*) FROM adult WITH ACCURACY 1e30")
            except psycopg.errors.InvalidParameterValue:
                pass

    def pipelined_parses(self) -> None:
        client = self.raw()
        client.send(*[Parse("", "SELECT COUNT(*) FROM adult WITH ACCURACY 100")] * 10_000, Sync())
        client.until_ready()
        client.close()

    def query_256mib(self) -> None:
        size, chunk = 256 << 20, b"x" * (1 << 20)
        client = self.raw()
        client.send_bytes(b"Q" + struct.pack("!i", size + 4 + 1))
        for _ in range(size // len(chunk)):
            client.send_bytes(chunk)
        client.send_bytes(b"\x00")
        client.until_ready()
        client.close()


def peak_mib(pid: int) -> float:
    """The process's peak resident memory so far (Linux VmHWM), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pings(dsn: str, count: int, busy: Callable[[], None] | None) -> tuple[list[float], int]:
    """``count`` round trips of SELECT 1 while ``busy`` runs again and again; also its runs."""
    runs = 0
    stop = threading.Event()

    def repeat() -> None:
        nonlocal runs
        while busy is not None and not stop.is_set():
            busy()
            runs += 1

    latencies = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT 1")
        worker = threading.Thread(target=repeat, daemon=True)
        worker.start()
        time.sleep(0.2)  # let the case start
        try:
            while len(latencies) < count:
                started = time.perf_counter()
                conn.execute("SELECT 1").fetchone()
                latencies.append(time.perf_counter() - started)
                time.sleep(0.01)
        finally:
            stop.set()
            worker.join()
    return latencies, runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pings", type=int, default=200, help="round trips per case")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dpproxy-dos-"))
    os.chmod(work, 0o777)
    if os.geteuid() == 0:
        shutil.chown(work, "pgserver", "pgserver")
    pg_port, proxy_port = free_port(), free_port()
    start_postgres(work, pg_port)
    process = None
    try:
        admin = f"postgresql://postgres@127.0.0.1:{pg_port}/postgres"
        load_adult(admin)
        roles = provision_roles(admin, load_config(ROOT / "config.yaml").cubes)
        process = start_dpproxy(
            work, proxy_port, roles.reader_dsn, roles.passthrough_dsn, admin, "auto"
        )
        dsn = f"postgresql://bench:bench@127.0.0.1:{proxy_port}/demo"
        cases = Cases(dsn, proxy_port)
        print(
            f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs; "
            f"date: {time.strftime('%Y-%m-%d %H:%M %Z')}; load: {os.getloadavg()[0]:.2f}"
        )
        print(
            f"{'while':<18} {'p50 ms':>7} {'p95 ms':>7} {'max ms':>7} {'runs':>5} {'CPU s':>6} "
            f"{'peak MiB':>8}"
        )
        for name, busy in [
            ("idle", None),
            ("largest GROUP BY", cases.largest_group_by),
            ("1 MB parsed", cases.parsed_megabyte),
            ("2 MB comment", cases.comment_2mb),
            ("ACCURACY 1e30", cases.accuracy_1e30),
            ("10,000 Parse", cases.pipelined_parses),
            ("256 MiB Query", cases.query_256mib),
        ]:
            before = cpu_seconds(process.pid)
            latencies, runs = pings(dsn, args.pings, busy)
            used = cpu_seconds(process.pid) - before
            p50 = statistics.median(latencies) * 1000
            p95 = statistics.quantiles(latencies, n=20)[-1] * 1000
            print(
                f"{name:<18} {p50:7.2f} {p95:7.2f} {max(latencies) * 1000:7.1f} {runs:5d} "
                f"{used:6.2f} {peak_mib(process.pid):8.1f}"
            )
        print(f"load after: {os.getloadavg()[0]:.2f}")
    finally:
        if process is not None:
            process.terminate()
            process.wait(30)
        stop_postgres(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
