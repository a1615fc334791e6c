"""Another analyst's pass-through latency while one session misbehaves (issue 16).

Starts a throw-away PostgreSQL (pgserver's binaries) and ``dpproxy serve`` as a process of its
own, then measures round trips of ``SELECT 1`` on one session, idle and while another session
runs each case of `tests.e2e.dos_client` again and again (each session a process of its own):
the largest GROUP BY the default limits allow, a 1 MB statement dpproxy must parse, a 2 MB
comment, ``WITH ACCURACY 1e30``, 10,000 pipelined Parse messages and a 256 MiB Query.

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
import sys
import tempfile
import time
from pathlib import Path

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
from proxy.storage.provision import provision_roles  # noqa: E402
from tests.e2e.dos_client import CASES, ping_while  # noqa: E402


def peak_mib(pid: int) -> float:
    """The process's peak resident memory so far (Linux VmHWM), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


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
        print(
            f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs; "
            f"date: {time.strftime('%Y-%m-%d %H:%M %Z')}; load: {os.getloadavg()[0]:.2f}"
        )
        print(
            f"{'while':<18} {'p50 ms':>7} {'p95 ms':>7} {'max ms':>7} {'runs':>5} {'CPU s':>6} "
            f"{'peak MiB':>8}  outcomes"
        )
        for case in [None, *CASES]:
            before = cpu_seconds(process.pid)
            latencies, outcomes = ping_while(dsn, case, args.pings)
            used = cpu_seconds(process.pid) - before
            p50 = statistics.median(latencies) * 1000
            p95 = statistics.quantiles(latencies, n=20)[-1] * 1000
            print(
                f"{case or 'idle':<18} {p50:7.2f} {p95:7.2f} {max(latencies) * 1000:7.1f} "
                f"{len(outcomes):5d} {used:6.2f} {peak_mib(process.pid):8.1f}  "
                f"{', '.join(sorted(set(outcomes)))}"
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
