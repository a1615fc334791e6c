"""Pass-through and DP throughput of dpproxy, in one run on this machine.

1. pgbench select-only (simple protocol) against the same PostgreSQL three ways: directly,
   through PgBouncer, and through dpproxy; all over TCP on 127.0.0.1, all as the pass-through
   role.
2. DP answers served from history per second, with N concurrent asyncpg clients repeating DP
   queries that earlier answers already determine.

Needs pgbench and pgbouncer (Debian: ``apt-get install postgresql-contrib pgbouncer``); uses
pgserver's PostgreSQL binaries for a throw-away server listening on TCP.

    uv run python bench/proxy_bench.py [--seconds 20] [--clients 8] [--dp-clients 16] [--loop auto]

Prints the figures; record them in docs/benchmarks.md with the machine and date.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from proxy.auth import make_verifier  # noqa: E402
from proxy.config import load_config  # noqa: E402
from proxy.demo import load_adult  # noqa: E402
from proxy.storage.provision import ANALYST_DATABASE, PASSTHROUGH_ROLE, provision_roles  # noqa: E402

#: The bench user's pass-through role (every analyst logs in as one of their own).
BENCH_ROLE = "dpproxy_pt_bench"

DP_QUERIES = [
    "SELECT COUNT(*) FROM adult WITH ACCURACY 200",
    "SELECT sex, COUNT(*) FROM adult GROUP BY sex WITH ACCURACY 300",
    "SELECT COUNT(*) FROM adult WHERE age >= 25 WITH ACCURACY 400",
    "SELECT COUNT(*) FILTER (WHERE income = '>50K') FROM adult WITH ACCURACY 300",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pg_bin() -> Path:
    import pgserver

    return Path(pgserver.__file__).parent / "pginstall" / "bin"


def as_pg_user(args: list[str]) -> list[str]:
    """PostgreSQL and PgBouncer refuse to run as root: use pgserver's system user then."""
    if os.geteuid() == 0:
        return ["runuser", "-u", "pgserver", "--", *args]
    return args


def start_postgres(work: Path, port: int) -> None:
    data = work / "pg"
    subprocess.run(
        as_pg_user(
            [
                str(pg_bin() / "initdb"),
                "-D",
                str(data),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ]
        ),
        check=True,
        capture_output=True,
    )
    options = (
        f"-h 127.0.0.1 -p {port} -k {work} -c max_connections=200 -c fsync=off "
        "-c shared_buffers=256MB"
    )
    subprocess.run(
        as_pg_user(
            [
                str(pg_bin() / "pg_ctl"),
                "-D",
                str(data),
                "-o",
                options,
                "-l",
                str(work / "pg.log"),
                "-w",
                "start",
            ]
        ),
        check=True,
        capture_output=True,
    )


def stop_postgres(work: Path) -> None:
    subprocess.run(
        as_pg_user([str(pg_bin() / "pg_ctl"), "-D", str(work / "pg"), "-m", "fast", "stop"]),
        capture_output=True,
        check=False,
    )


def start_pgbouncer(work: Path, port: int, pg_port: int, pool: int) -> subprocess.Popen[bytes]:
    (work / "userlist.txt").write_text(f'"{BENCH_ROLE}" ""\n')
    (work / "pgbouncer.ini").write_text(f"""[databases]
{ANALYST_DATABASE} = host=127.0.0.1 port={pg_port} dbname={ANALYST_DATABASE} user={BENCH_ROLE}
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {work}/userlist.txt
pool_mode = transaction
default_pool_size = {pool}
max_client_conn = 200
logfile = {work}/pgbouncer.log
pidfile = {work}/pgbouncer.pid
""")
    process = subprocess.Popen(
        as_pg_user(["pgbouncer", str(work / "pgbouncer.ini")]),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_port(port)
    return process


def start_dpproxy(
    work: Path, port: int, reader: str, passthrough: str, ledger: str, loop: str
) -> subprocess.Popen[bytes]:
    config = (ROOT / "config.yaml").read_text()
    config += f"""
listen:
  port: {port}
backend:
  dsn: "{reader}"
  passthrough_dsn: "{passthrough}"
ledger:
  dsn: "{ledger}"
users:
  bench: "{make_verifier("bench")}"
"""
    (work / "dpproxy.yaml").write_text(config)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "proxy.cli",
            "--config",
            str(work / "dpproxy.yaml"),
            "serve",
            "--loop",
            loop,
            "--log-level",
            "WARNING",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=open(work / "dpproxy.log", "wb"),
    )
    wait_port(port)
    return process


def wait_port(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"nothing listens on port {port}")


def cpu_seconds(pid: int, fields_from: int = 11, fields_to: int = 15) -> float:
    """CPU time of a process so far (Linux /proc): user + system, with its children's."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[fields_from:fields_to]) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Run:
    """One pgbench run: its rate and who spent the machine's CPU, in us per transaction."""

    tps: float
    pgbench: float
    postgres: float
    proxy: float
    proxy_kernel: float  # the share of the proxy's CPU spent in the kernel
    proxy_busy: float  # the proxy's CPU, in CPUs
    total: float  # every process's CPU on the machine
    idle: float  # the machine's idle share

    @property
    def other(self) -> float:
        """CPU of everything else on the machine (other jobs, kernel threads)."""
        return self.total - self.pgbench - self.postgres - self.proxy


def machine_jiffies() -> tuple[int, int]:
    """(all, idle) CPU time of the machine so far, in clock ticks (Linux /proc/stat)."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields), fields[3] + fields[4]


def tree_seconds(root: int) -> float:
    """CPU time of a process and its children, live or reaped (PostgreSQL's backends)."""
    total = cpu_seconds(root)  # includes the children it has reaped
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # exited meanwhile
            continue
        fields = text.rsplit(")", 1)[1].split()
        if int(fields[1]) == root:  # the parent pid
            total += sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    return total


def measure(postmaster: int, proxy: int | None, seconds: int, bench: Callable[[], float]) -> Run:
    """Run ``bench`` (returns tps) and share out the CPU it took."""
    proxy_before = (cpu_seconds(proxy), cpu_seconds(proxy, 12, 13)) if proxy else (0.0, 0.0)
    pg_before, machine_before, mine_before = tree_seconds(postmaster), machine_jiffies(), os.times()
    tps = bench()
    machine_after, mine_after = machine_jiffies(), os.times()
    time.sleep(1)  # for the run's backends to exit, and their time to reach the postmaster
    pg_after = tree_seconds(postmaster)
    proxy_used = proxy_kernel = 0.0
    if proxy:
        proxy_used = cpu_seconds(proxy) - proxy_before[0]
        proxy_kernel = cpu_seconds(proxy, 12, 13) - proxy_before[1]
    per_txn = 1e6 / (tps * seconds)
    pgbench_used = (mine_after.children_user + mine_after.children_system) - (
        mine_before.children_user + mine_before.children_system
    )
    ticks = machine_after[0] - machine_before[0]
    idle_ticks = machine_after[1] - machine_before[1]
    busy = (ticks - idle_ticks) / os.sysconf("SC_CLK_TCK")
    return Run(
        tps=tps,
        pgbench=pgbench_used * per_txn,
        postgres=(pg_after - pg_before) * per_txn,
        proxy=proxy_used * per_txn,
        proxy_kernel=proxy_kernel / proxy_used if proxy_used else 0.0,
        proxy_busy=proxy_used / seconds,
        total=busy * per_txn,
        idle=idle_ticks / ticks if ticks else 0.0,
    )


def has_uvloop() -> bool:
    return importlib.util.find_spec("uvloop") is not None


def pgbench(
    port: int, user: str, database: str, clients: int, seconds: int, password: str | None = None
) -> float:
    env = {**os.environ, "PGPASSWORD": password or "", "PGCLIENTENCODING": "UTF8"}
    result = subprocess.run(
        [
            "pgbench",
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
            "-U",
            user,
            "-n",
            "-S",
            "-c",
            str(clients),
            "-j",
            "2",
            "-T",
            str(seconds),
            database,
        ],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    match = re.search(r"tps = ([\d.]+) \(without initial connection time\)", result.stdout)
    if match is None:
        raise RuntimeError(result.stdout + result.stderr)
    return float(match.group(1))


async def dp_rate(port: int, clients: int, seconds: float) -> tuple[float, int]:
    """DP answers per second from history with ``clients`` concurrent connections."""
    kwargs = {
        "host": "127.0.0.1",
        "port": port,
        "user": "bench",
        "password": "bench",
        "database": "demo",
    }
    warm = await asyncpg.connect(**kwargs)
    for sql in DP_QUERIES:  # the fresh measurements, once
        await warm.fetch(sql)
    await warm.close()
    conns = [await asyncpg.connect(**kwargs) for _ in range(clients)]
    count = 0
    deadline = time.monotonic() + seconds

    async def worker(conn: asyncpg.Connection, offset: int) -> None:
        nonlocal count
        i = offset
        while time.monotonic() < deadline:
            await conn.fetch(DP_QUERIES[i % len(DP_QUERIES)])
            count += 1
            i += 1

    start = time.monotonic()
    await asyncio.gather(*(worker(c, i) for i, c in enumerate(conns)))
    elapsed = time.monotonic() - start
    for conn in conns:
        await conn.close()
    return count / elapsed, count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--dp-clients", type=int, default=16)
    parser.add_argument("--scale", type=int, default=10)
    parser.add_argument(
        "--loop", default="auto", choices=["auto", "asyncio", "uvloop"], help="dpproxy's loop"
    )
    args = parser.parse_args()
    for tool in ("pgbench", "pgbouncer"):
        if shutil.which(tool) is None:
            print(
                f"{tool} is not installed (apt-get install postgresql-contrib pgbouncer)",
                file=sys.stderr,
            )
            return 1
    work = Path(tempfile.mkdtemp(prefix="dpproxy-bench-"))
    os.chmod(work, 0o777)
    if os.geteuid() == 0:
        shutil.chown(work, "pgserver", "pgserver")
    pg_port, bouncer_port, proxy_port = free_port(), free_port(), free_port()
    processes: list[subprocess.Popen[bytes]] = []
    start_postgres(work, pg_port)
    try:
        admin = f"postgresql://postgres@127.0.0.1:{pg_port}/postgres"
        load_adult(admin)
        # pgbench's tables are public ones, in the analyst database beside Adult's stand-in
        roles = provision_roles(admin, load_config(ROOT / "config.yaml").cubes, users=["bench"])
        subprocess.run(
            [
                "pgbench",
                "-i",
                "-q",
                "-s",
                str(args.scale),
                "-h",
                "127.0.0.1",
                "-p",
                str(pg_port),
                "-U",
                "postgres",
                ANALYST_DATABASE,
            ],
            check=True,
            capture_output=True,
        )
        with psycopg.connect(roles.analyst_admin_dsn, autocommit=True) as conn:
            conn.execute(
                "GRANT SELECT ON pgbench_accounts, pgbench_branches, pgbench_tellers "
                f"TO {PASSTHROUGH_ROLE}"
            )
        processes.append(start_pgbouncer(work, bouncer_port, pg_port, args.clients))
        try:
            processes.append(
                start_dpproxy(
                    work,
                    proxy_port,
                    roles.reader_dsn,
                    roles.passthrough_dsn,
                    roles.analyst_admin_dsn,
                    args.loop,
                )
            )
        except TimeoutError:
            sys.stderr.write((work / "dpproxy.log").read_text())
            raise
        print(
            f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, "
            f"{platform.platform()}"
        )
        print(f"date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
        print(f"pgbench -S -c {args.clients} -j 2 -T {args.seconds}, scale {args.scale}")
        print(f"dpproxy event loop: {args.loop}{' (uvloop installed)' if has_uvloop() else ''}")
        postmaster = int((work / "pg" / "postmaster.pid").read_text().split()[0])
        bouncer_pid = int((work / "pgbouncer.pid").read_text())

        def run(port: int, user: str, db: str, proxy: int | None, password: str = "") -> Run:
            return measure(postmaster, proxy, args.seconds, lambda: pgbench(
                port, user, db, args.clients, args.seconds, password=password
            ))  # fmt: skip

        direct = run(pg_port, BENCH_ROLE, ANALYST_DATABASE, None)
        print(f"  direct:    {direct.tps:10.0f} tps")
        bouncer = run(bouncer_port, BENCH_ROLE, ANALYST_DATABASE, bouncer_pid)
        print(
            f"  pgbouncer: {bouncer.tps:10.0f} tps  "
            f"({bouncer.tps / direct.tps:.2f}x direct; pgbouncer busy {bouncer.proxy_busy:.0%} "
            f"of a CPU, {bouncer.proxy:.0f} us CPU per transaction, "
            f"{bouncer.proxy_kernel:.0%} of it in the kernel)"
        )
        proxied = run(proxy_port, "bench", "demo", processes[1].pid, password="bench")
        print(
            f"  dpproxy:   {proxied.tps:10.0f} tps  "
            f"({proxied.tps / direct.tps:.2f}x direct, {proxied.tps / bouncer.tps:.2f}x pgbouncer; "
            f"dpproxy busy {proxied.proxy_busy:.0%} of a CPU, {proxied.proxy:.0f} us CPU "
            f"per transaction, {proxied.proxy_kernel:.0%} of it in the kernel)"
        )
        print("CPU per transaction (us): pgbench + postgres + proxy + others = all; machine idle")
        for name, r in (("direct", direct), ("pgbouncer", bouncer), ("dpproxy", proxied)):
            print(
                f"  {name + ':':10s} {r.pgbench:5.1f} + {r.postgres:5.1f} + {r.proxy:5.1f} "
                f"+ {r.other:5.1f} = {r.total:5.1f}; idle {r.idle:.0%}"
            )
        # with both cores busy, tps is about the CPU per second over the CPU per transaction
        d, b, p = (r.total - r.other for r in (direct, bouncer, proxied))
        print(
            f"tps ratios if no other process took CPU: dpproxy/direct {d / p:.2f}, "
            f"dpproxy/pgbouncer {b / p:.2f}, pgbouncer/direct {d / b:.2f}"
        )
        rate, count = asyncio.run(dp_rate(proxy_port, args.dp_clients, args.seconds))
        print(
            f"DP answers from history, {args.dp_clients} clients: {rate:.0f}/s "
            f"({count} in {args.seconds} s)"
        )
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
            process.wait(30)
        stop_postgres(work)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
