"""An Adult stream through a real ``dpproxy serve`` over the wire, and the same stream in process.

A throw-away embedded PostgreSQL (pgserver) gets the Adult table; ``dpproxy serve`` runs as a
subprocess in front of it with the repository's ``config.yaml`` (total budget 1, durable ledger
in that PostgreSQL). psycopg sends each statement (simple protocol); the answer and its interval
come from the result columns, the source and charged budget from the NOTICE, a refusal is
SQLSTATE 53400. True answers come from the same table, queried directly as the superuser. The
in-process :class:`~bench.evaluation.systems.Dpproxy` then answers the identical statements,
translated by the same translator. dpproxy's decisions depend on public inputs only (query
vectors, budgets, accuracy), so both runs must make exactly the same decisions and charges; the
noise (the server's CSPRNG vs a seeded source) differs, so R_i and E agree only statistically.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import psycopg

from bench.evaluation.adult import AdultStatement, adult_cube, adult_histogram, translate
from bench.evaluation.run import Trace, run_stream
from bench.evaluation.systems import Answer, Dpproxy
from bench.evaluation.workload import Item
from sqlmap.canonical import histogram_from_rows, histogram_sql
from sqlmap.cube import Cube

__all__ = ["WireRun", "run_wire"]

ROOT = Path(__file__).resolve().parents[2]
_NOTICE = re.compile(r"source (\w+); budget charged ([0-9.eE+-]+)")


@dataclass
class WireRun:
    """Both runs' traces and what was checked."""

    wire: Trace
    in_process: Trace
    statements: int
    histogram_matches: bool
    same_decisions: int = 0
    different_decisions: list[str] = field(default_factory=list)
    seconds: float = 0.0


def _embedded(data_dir: Path) -> Any:
    """A throw-away embedded PostgreSQL, as :func:`proxy.embedded.start_embedded` starts it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pgserver's note about XDG_RUNTIME_DIR
        from pgserver.postgres_server import get_server

    data_dir.mkdir(parents=True, exist_ok=True)
    return get_server(data_dir, cleanup_mode="stop")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(port: int, process: subprocess.Popen[bytes], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"dpproxy exited with {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"dpproxy did not listen on {port}")


def _truths(
    admin: psycopg.Connection[tuple[Any, ...]], statement: AdultStatement
) -> dict[object, float]:
    """The true value of each group (``None`` for an ungrouped statement)."""
    return {
        (row[0] if statement.group else None): float(row[-1])
        for row in admin.execute(statement.truth_sql).fetchall()
    }


def run_wire(
    statements: Sequence[AdultStatement], seed: int, log: Callable[[str], None] = print
) -> WireRun:
    """Send ``statements`` through a fresh dpproxy; replay them in process with ``seed``."""
    cube = adult_cube()
    x = adult_histogram(cube)
    items = translate(cube, statements)
    work = Path(tempfile.mkdtemp(prefix="dpproxy-eval-"))
    os.chmod(work, 0o777)
    server = _embedded(work / "pgdata")
    admin_dsn = str(server.get_uri())
    port = _free_port()
    config = work / "dpproxy.yaml"
    config.write_text((ROOT / "config.yaml").read_text() + f"\nlisten:\n  port: {port}\n")
    with open(work / "dpproxy.log", "wb") as server_log:
        process = subprocess.Popen(
            [sys.executable, "-m", "proxy.cli", "--config", str(config), "serve"],
            cwd=ROOT,
            env={**os.environ, "DPPROXY_DATA_DIR": str(work / "pgdata")},
            stdout=subprocess.DEVNULL,
            stderr=server_log,
        )
        try:
            _wait(port, process)
            wire, matches, seconds = _send(statements, items, admin_dsn, port, cube, x)
        except BaseException:
            log((work / "dpproxy.log").read_text()[-4000:])
            raise
        finally:
            process.terminate()
            process.wait(30)
            server.cleanup()
            shutil.rmtree(work, ignore_errors=True)
    in_process = run_stream(Dpproxy(x.size, cube.total_budget, seed, ()), items, x)
    result = WireRun(wire, in_process, len(statements), matches, seconds=seconds)
    for i, (a, b, ca, cb) in enumerate(
        zip(wire.source, in_process.source, wire.budget, in_process.budget)
    ):
        if a == b and abs(ca - cb) <= 1e-5 * max(abs(cb), 1e-12) + 1e-9:
            result.same_decisions += 1
        else:
            result.different_decisions.append(
                f"value {i}: wire {a} {ca:.6g}, in process {b} {cb:.6g}"
            )
    return result


def _send(
    statements: Sequence[AdultStatement],
    items: Sequence[Item],
    admin_dsn: str,
    port: int,
    cube: Cube,
    x: npt.NDArray[np.int64],
) -> tuple[Trace, bool, float]:
    """Send every statement; a trace of answers, whether the histograms agree, and seconds."""
    trace = Trace("dpproxy over the wire")
    dsn = f"postgresql://analyst:analyst@127.0.0.1:{port}/demo"
    notices: list[str] = []
    start = time.perf_counter()
    with (
        psycopg.connect(admin_dsn, autocommit=True) as admin,
        psycopg.connect(dsn, autocommit=True, connect_timeout=30) as conn,
    ):
        rows = admin.execute(histogram_sql(cube)).fetchall()
        matches = bool(np.array_equal(histogram_from_rows(cube, rows), x))
        conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        for statement, item in zip(statements, items):
            notices.clear()
            begin = time.perf_counter()
            try:
                answer_rows = conn.execute(statement.sql).fetchall()
            except psycopg.Error as e:
                if e.sqlstate != "53400":
                    raise
                answer_rows = []
            trace.seconds.append(time.perf_counter() - begin)
            truths = _truths(admin, statement)
            if not answer_rows:
                for request in item.requests:
                    trace.add(None, request.query.evaluate(x), request.accuracy.eps, math.nan)
                continue
            for row, notice, request in zip(answer_rows, notices, item.requests):
                key = row[0] if statement.group else None
                estimate, low, high = (float(v) for v in row[-3:])
                found = _NOTICE.search(notice)
                source, charged = (found.group(1), float(found.group(2))) if found else ("?", 0.0)
                trace.add(
                    Answer(estimate, low, high, source, charged),
                    truths.get(key, 0.0),
                    request.accuracy.eps,
                    math.nan,
                )
    return trace, matches, time.perf_counter() - start
