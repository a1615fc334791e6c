"""Two real ``dpproxy serve`` processes sharing one durable ledger, under concurrent clients.

Each process is a subprocess of its own (``python -m proxy.cli serve``) in front of the session's
PostgreSQL, so the only thing they share is the ledger schema and its advisory lock. 32 client
threads send overlapping, budget-spending DP queries to both; the test checks that nobody hangs,
that refusals are clean ``53400`` errors, that answers from history keep flowing once the budget
is gone, and that an independent recomputation of the per-cell spend from the stored
measurements stays within the table's total.
"""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from proxy.config import load_config
from proxy.engine.budget import CellBudget, cell_charges, float_up
from proxy.storage.postgres_ledger import stored_query
from proxy.storage.provision import provision_roles
from sqlmap.cube import Cube
from sqlmap.vector import LinearQuery

from .conftest import CONFIG, ROOT

# every condition touches many cells, and many of them overlap
CONDITIONS = [
    "age >= 25",
    "age < 45",
    "age >= 35 AND age < 55",
    "sex = 'Male'",
    "sex = 'Female'",
    "income = '>50K'",
    "race = 'White'",
    "education = 'Bachelors'",
    "hours_per_week >= 41",
    "capital_gain >= 1",
    "sex = 'Female' AND income = '>50K'",
    "age < 35 AND hours_per_week < 35",
]


def dp_sql(condition: str, accuracy: int = 150, confidence: float = 0.9) -> str:
    return (
        f"SELECT COUNT(*) FROM adult WHERE {condition} "
        f"WITH ACCURACY {accuracy} CONFIDENCE {confidence}"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_config(path: Path, adult_dsn: str, schema: str, total_budget: float) -> Path:
    """The repository's config.yaml plus a backend, a ledger, and a small budget on adult."""
    roles = provision_roles(adult_dsn, CONFIG.cubes)
    data: dict[str, Any] = yaml.safe_load((ROOT / "config.yaml").read_text())
    data["tables"]["adult"]["total_budget"] = total_budget
    data["backend"] = {"dsn": roles.reader_dsn, "passthrough_dsn": roles.passthrough_dsn}
    data["ledger"] = {"dsn": adult_dsn, "schema": schema}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@dataclass
class ServeProcess:
    """One ``dpproxy serve`` subprocess."""

    config: Path
    log_path: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60, port: int | None = None) -> None:
        self.port = port or free_port()
        log = self.log_path.open("ab")
        try:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "proxy.cli",
                    "--config",
                    str(self.config),
                    "serve",
                    "--port",
                    str(self.port),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dpproxy exited ({self.proc.returncode}):\n{self.log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        raise TimeoutError(f"dpproxy did not start:\n{self.log()}")

    @property
    def dsn(self) -> str:
        return f"postgresql://analyst:analyst@127.0.0.1:{self.port}/demo?connect_timeout=10"

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@pytest.fixture()
def ledger_schema(adult_dsn: str) -> Iterator[str]:
    schema = f"ledger_{uuid.uuid4().hex[:8]}"
    yield schema
    with psycopg.connect(adult_dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def adult_cube(config: Path) -> Cube:
    return next(c for c in load_config(config).cubes if c.qualified_name == "public.adult")


def recomputed_spend(dsn: str, schema: str, cube: Cube) -> tuple[Fraction, int]:
    """Max per-cell spend recomputed cell by cell from the stored measurements, and how many
    there are; checks that the ledger's ``most_spent`` (dp.budget's) is that maximum."""
    ledger = CellBudget(cube.qualified_name, total=Fraction(cube.total_budget))
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT t.n_cells, t.measures, t.shape, m.axes, m.core_index, m.core_weights, "
            f'm.budget FROM "{schema}".measurements m '
            f'JOIN "{schema}".tables t ON t.id = m.table_id WHERE t.name = %s ORDER BY m.id',
            (cube.qualified_name,),
        ).fetchall()
        (most_spent,) = conn.execute(
            f'SELECT most_spent FROM "{schema}".tables WHERE name = %s', (cube.qualified_name,)
        ).fetchone() or (None,)
    for n_cells, measures, shape, axes, index, weights, budget in rows:
        factored = stored_query(
            n_cells, measures, shape, axes=axes, core_index=index, core_weights=weights
        )
        listed = LinearQuery(
            cube.n_coordinates, factored.cells, factored.weights, measures=cube.measure_reach
        )
        ledger.commit(cell_charges(listed, Fraction(budget)))
    assert most_spent == float_up(ledger.spent - ledger.carried)
    return ledger.spent, len(rows)


SOURCE = re.compile(r"source (\w+); budget charged ([0-9.e-]+)")


@dataclass
class Outcome:
    sql: str
    estimate: float | None = None
    notice: str | None = None
    sqlstate: str | None = None

    @property
    def source(self) -> str | None:
        m = SOURCE.search(self.notice or "")
        return m.group(1) if m else None


def ask(conn: psycopg.Connection[Any], notices: list[str], sql: str) -> Outcome:
    notices.clear()
    try:
        row = conn.execute(sql).fetchone()
    except psycopg.Error as e:
        return Outcome(sql, sqlstate=e.sqlstate)
    assert row is not None and len(notices) == 1, (row, notices)
    return Outcome(sql, float(row[0]), notices[0])


def client(dsn: str, queries: list[str]) -> list[Outcome]:
    notices: list[str] = []
    out = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        for sql in queries:
            out.append(ask(conn, notices, sql))
    return out


@pytest.mark.slow
def test_two_processes_share_one_ledger(adult_dsn: str, ledger_schema: str, tmp_path: Path) -> None:
    config = write_config(tmp_path / "config.yaml", adult_dsn, ledger_schema, 0.08)
    cube = adult_cube(config)
    procs = [ServeProcess(config, tmp_path / f"dpproxy{i}.log") for i in range(2)]
    try:
        for p in procs:
            p.start()
        rng = random.Random(5)
        plans = []
        for i in range(32):
            qs = [dp_sql(rng.choice(CONDITIONS)) for _ in range(5)]
            qs += rng.sample(qs, 2)  # repeats
            qs.append(dp_sql(CONDITIONS[i % 4], accuracy=400))  # wide: history soon suffices
            plans.append((procs[i % 2].dsn, qs))
        start = threading.Barrier(len(plans))

        def run(dsn: str, qs: list[str]) -> list[Outcome]:
            start.wait(30)
            return client(dsn, qs)

        with ThreadPoolExecutor(len(plans)) as pool:
            futures = [pool.submit(run, dsn, qs) for dsn, qs in plans]
            results = [f.result(timeout=120) for f in futures]  # no deadlock
        outcomes = [o for r in results for o in r]

        # refusals are clean budget errors; everything else was answered with one notice
        assert {o.sqlstate for o in outcomes if o.sqlstate} <= {"53400"}
        sources = [o.source for o in outcomes if o.sqlstate is None]
        assert all(s in {"fresh", "combined", "history"} for s in sources), sources
        assert sources.count("fresh") + sources.count("combined") >= 1
        assert any(o.sqlstate == "53400" for o in outcomes), "the budget was never exhausted"

        # once the budget is gone, free answers keep flowing: each process answers again,
        # from history, much of what it answered before. (Not all of it: an estimator combining
        # several overlapping entries may have a wider interval at the requested confidence
        # than the one measurement that first answered the query; it then costs budget again,
        # or is refused.)
        reasked: list[Outcome] = []
        for i, p in enumerate(procs):
            mine = results[i::2]
            answered = sorted({o.sql for r in mine for o in r if o.sqlstate is None})
            again = client(p.dsn, answered)
            reasked += again
            assert {o.sqlstate for o in again if o.sqlstate} <= {"53400"}
            assert {o.source for o in again if o.sqlstate is None} <= {
                "history",
                "combined",
                "fresh",
            }
            assert sum(o.source == "history" for o in again) >= 1
            assert any("source history" in (o.notice or "") for r in mine for o in r)

        spent, n = recomputed_spend(adult_dsn, ledger_schema, cube)
        spending = [o for o in outcomes + reasked if o.source in {"fresh", "combined"}]
        assert n == len(spending)  # one measurement per spending answer, none lost
        assert spent <= Fraction(cube.total_budget)
    except BaseException:
        for p in procs:
            print(f"---- {p.log_path.name} ----\n{p.log()[-5000:]}")
        raise
    finally:
        for p in procs:
            p.stop()
