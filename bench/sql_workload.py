"""A dashboard's SQL through dpproxy, and the fresh answer's backend query on 5 million rows.

1. End to end: a real ``dpproxy serve`` (a process of its own) in front of the embedded
   PostgreSQL with the Adult demo table; a stream of statements an analyst's dashboard or BI
   tool sends (counts with range filters over 1-3 dimensions, GROUP BY over 1-3 dimensions,
   SUM(CASE ...)), panels refreshed at random. Each DP statement is followed by the same plain
   aggregate sent to PostgreSQL directly. CPU per statement, from /proc (every thread, in ns):
   dpproxy's process plus PostgreSQL's work for it (the reader's query, the ledger's writes;
   every backend but the direct one), against the backend that answers the plain aggregate.
2. Backend: in a scratch database, a table of 5 million rows drawn from Adult's marginals
   (``INSERT ... SELECT`` from ``generate_series``); for each kind of statement, the plain
   aggregate against the measurement SQL the reader runs for a fresh answer of it, and the
   whole-histogram SQL it ran before (interleaved; parallel workers off, so one backend's CPU
   is all the work).
3. Restart (``--restart M``): a ledger of M measurements of the stream's vectors, stored as
   dpproxy writes them and as ledgers before factored vectors held them; the time to open it
   and a service on it (the exact budget recomputed, the history's span prepared), and the
   CPU of the first decisions after.
4. End to end at scale (``--history M``): part 1 once per M, the server started on a ledger
   filled with M measurements of statements like the stream's (:func:`history`: the budgets
   fresh answers at their accuracies spend, noise around the table's truth, so that history
   answers as in real use; the config's total budget raised by what they spent:
   :func:`raised_total`), with the server's start-up (wall and CPU) and peak RSS.

    uv run python -m bench.sql_workload [--statements 240] [--rows 5000000] [--repeats 5]
        [--skip-backend] [--skip-e2e] [--data-dir DIR] [--profile STACKS] [--wide]
        [--restart M ...] [--history M ...]

Prints markdown; record the figures in docs/benchmarks.md with the machine, date and load.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import multiprocessing
import os
import platform
import random
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import asyncpg
import numpy as np
import psycopg
from psycopg import sql as pgsql
from psycopg.conninfo import make_conninfo

from bench import engine_sql_bench
from proxy.auth import make_verifier
from proxy.config import Config, dsn_with, load_config
from proxy.demo import ADULT_COLUMNS, ADULT_ROWS, load_adult
from proxy.dp.answering import DpService
from proxy.embedded import start_embedded
from proxy.engine.budget import CellBudget, Charges
from proxy.engine.engine import QueryRequest
from proxy.engine.history import HistoryEntry
from proxy.storage.ledger_store import NewMeasurement
from proxy.storage.postgres_ledger import PostgresLedgerStore
from proxy.storage.provision import ANALYST_DATABASE, READER_ROLE, provision_roles
from proxy.storage.reader import Reader
from sqlmap.canonical import histogram_from_rows, histogram_sql, measurement_sql
from sqlmap.cube import Cube
from sqlmap.errors import ProgramLimitExceeded

ROOT = Path(__file__).resolve().parent.parent
CONFIG = load_config(ROOT / "config.yaml")
CUBE = CONFIG.cubes[0]

AGE_EDGES = (17, 25, 35, 45, 55, 65, 91)
RACES = ("White", "Black", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other")
EDUCATION = ("HS-grad", "Some-college", "Bachelors", "Masters", "Doctorate", "11th", "Assoc-voc")
GROUP_COLUMNS = ("sex", "race", "income", "education")
# the 10-dimension cube (bench/engine_sql_bench.py's "wide", 4,354,560 cells): the demo's and
# three more of Adult's columns; its NULLs ('?' in adult.data) get a bin of their own
WIDE = {name: [v for v in values if v != "?"] for name, values in engine_sql_bench.WIDE.items()}
WIDE_GROUP_COLUMNS = ("marital_status", "relationship")
#: seconds the bench's server may plan a statement (dpproxy's default: 10)
PLANNING_TIMEOUT = 600
# config.yaml's table total, raised over a pre-filled history (:func:`raised_total`)
PRIVACY_TOTAL = "\n  total_budget: 1.0\n"
PY_SPY = os.environ.get("PY_SPY", str(Path.home() / ".local/bin/py-spy"))


# -- the workload ---------------------------------------------------------------------------


def condition(rng: random.Random, column: str) -> str:
    """A filter an analyst would write on ``column``, on the cube's bin edges."""
    if column in WIDE:
        chosen = ", ".join(f"'{v}'" for v in rng.sample(WIDE[column], rng.randint(1, 2)))
        return f"{column} IN ({chosen})"
    if column == "age":
        lo, hi = sorted(rng.sample(AGE_EDGES, 2))
        return f"age >= {lo} AND age < {hi}" if lo > 17 else f"age < {hi}"
    if column == "sex":
        return f"sex = '{rng.choice(('Male', 'Female'))}'"
    if column == "race":
        return rng.choice((f"race = '{rng.choice(RACES)}'", "race <> 'White'"))
    if column == "income":
        return f"income = '{rng.choice(('>50K', '<=50K'))}'"
    if column == "education":
        chosen = ", ".join(f"'{e}'" for e in rng.sample(EDUCATION, rng.randint(1, 3)))
        return f"education IN ({chosen})"
    if column == "hours_per_week":
        return rng.choice(("hours_per_week >= 41", "hours_per_week < 35"))
    return "capital_gain > 0"


FILTER_COLUMNS = ("age", "sex", "race", "income", "education", "hours_per_week", "capital_gain")


@dataclass(frozen=True)
class Statement:
    kind: str  # count, group by, sum case
    sql: str  # plain SQL, as PostgreSQL runs it
    accuracy: int

    @property
    def dp(self) -> str:
        return f"{self.sql} WITH ACCURACY {self.accuracy}"


def panel(rng: random.Random, wide: bool = False) -> Statement:
    """One dashboard panel: a count, a GROUP BY or a SUM(CASE ...), over 1-3 dimensions."""
    filters = (*FILTER_COLUMNS, *WIDE) if wide else FILTER_COLUMNS
    groups = (*GROUP_COLUMNS, *WIDE_GROUP_COLUMNS) if wide else GROUP_COLUMNS
    kind = rng.choice(("count", "count", "group by", "group by", "sum case"))
    if kind == "count":
        where = " AND ".join(condition(rng, c) for c in rng.sample(filters, rng.randint(1, 3)))
        return Statement(kind, f"SELECT COUNT(*) FROM adult WHERE {where}", 400)
    if kind == "group by":
        keys = rng.sample(groups, rng.randint(1, 3))
        others = [c for c in filters if c not in keys]
        where = f" WHERE {condition(rng, rng.choice(others))}" if rng.random() < 0.5 else ""
        listed = ", ".join(keys)
        return Statement(
            kind, f"SELECT {listed}, COUNT(*) FROM adult{where} GROUP BY {listed}", 600
        )
    inner, outer = rng.sample(filters, 2)
    where = f" WHERE {condition(rng, outer)}" if rng.random() < 0.5 else ""
    return Statement(
        kind,
        f"SELECT SUM(CASE WHEN {condition(rng, inner)} THEN 2 ELSE 1 END) FROM adult{where}",
        800,
    )


def stream(n: int, seed: int = 10, wide: bool = False) -> list[Statement]:
    """``n`` statements: new panels, and refreshes of panels already shown (half the time)."""
    rng = random.Random(seed)
    shown: list[Statement] = []
    out = []
    for _ in range(n):
        if shown and rng.random() < 0.5:
            out.append(rng.choice(shown))
        else:
            shown.append(panel(rng, wide))
            out.append(shown[-1])
    return out


# -- CPU from /proc ---------------------------------------------------------------------------


def cpu_ns(pid: int) -> int:
    """CPU time of every thread of a process so far, in ns (Linux schedstat)."""
    total = 0
    for path in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            total += int(path.read_text().split()[0])
        except (OSError, ValueError, IndexError):  # the thread exited meanwhile
            continue
    return total


def children(parent: int) -> list[int]:
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == parent:
                pids.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):  # exited meanwhile
            continue
    return pids


def postgres_ns(postmaster: int, excluding: int) -> dict[int, int]:
    """CPU of PostgreSQL's processes (background ones included) but the ``excluding`` backend,
    by pid; listed afresh each time, so that a connection a pool opens late is counted."""
    return {p: cpu_ns(p) for p in [postmaster, *children(postmaster)] if p != excluding}


def backend_roles(conn: psycopg.Connection[tuple[int, str]]) -> dict[int, str]:
    """Which of dpproxy's jobs each PostgreSQL backend does: ``reader`` (the privileged query,
    in the private database) or ``ledger`` (the ledger and the audit log, in the analyst one)."""
    rows = conn.execute(
        "SELECT pid, datname FROM pg_stat_activity WHERE usename = %s", (READER_ROLE,)
    ).fetchall()
    return {int(p): "ledger" if db == ANALYST_DATABASE else "reader" for p, db in rows}


def peak_rss_mb(pid: int) -> float:
    """A process's peak resident set so far (``VmHWM``), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


# -- part 1: end to end ---------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wide_config(text: str) -> str:
    """config.yaml with the wide cube's three more dimensions in the demo table's."""
    anchor = "      capital_gain: {bins:"
    at = text.index("\n", text.index(anchor)) + 1
    extra = "".join(
        f"      {name}: {{values: {json.dumps(values)}, closed: true, "
        f"nullable: {'true' if len(values) < len(engine_sql_bench.WIDE[name]) else 'false'}}}\n"
        for name, values in WIDE.items()
    )
    return text[:at] + extra + text[at:]


def start_dpproxy(
    work: Path, admin_dsn: str, port: int, schema: str, wide: bool = False, m: int = 0
) -> subprocess.Popen[bytes]:
    """``dpproxy serve`` with a ledger (in ``schema``) holding ``m`` measurements (:func:`history`),
    listening on ``port``; the config's total budget raised by what they spent."""
    text = (ROOT / "config.yaml").read_text()
    assert PRIVACY_TOTAL in text
    if wide:
        text = wide_config(text)
        (work / "cube.yaml").write_text(text)
    cube_config = load_config(work / "cube.yaml") if wide else CONFIG
    roles = provision_roles(admin_dsn, cube_config.cubes, schema, users=["bench"])
    if m:
        started = time.perf_counter()
        cube = cube_config.cubes[0]
        entries = history(cube_config, m, truth(admin_dsn, cube), wide)
        spent = asyncio.run(fill_ledger(roles.ledger_dsn, schema, entries, False, cube=cube))
        filled = time.perf_counter() - started
        total = raised_total(cube_config, spent)
        text = text.replace(PRIVACY_TOTAL, f"\n  total_budget: {total}\n", 1)
        print(
            f"(ledger filled with {m:,} measurements in {filled:.0f} s; they spent "
            f"{float(spent):.4g} at the most-spent cell: total_budget raised to {total})"
        )
    config = (
        text
        + f"""
listen:
  port: {port}
backend:
  dsn: "{roles.reader_dsn}"
  passthrough_dsn: "{roles.passthrough_dsn}"
ledger:
  dsn: "{roles.ledger_dsn}"
  schema: "{schema}"
users:
  bench: "{make_verifier("bench")}"
limits:
  # wall time: on a busy machine the default 10 s refused the dearest statements (57014), which
  # then left the figures (CPU) out
  planning_timeout: {PLANNING_TIMEOUT}
"""
    )
    (work / "dpproxy.yaml").write_text(config)
    started = time.perf_counter()
    with open(work / "dpproxy.log", "wb") as log:  # the child keeps its own descriptor
        process = subprocess.Popen(
            [sys.executable, "-m", "proxy.cli", "--config", str(work / "dpproxy.yaml"), "serve"]
            + ["--log-level", "WARNING"],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    deadline = time.monotonic() + 120 + m / 100  # it loads the ledger before it listens
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            print(
                f"(server listening after {time.perf_counter() - started:.2f} s wall, "
                f"{cpu_ns(process.pid) / 1e9:.2f} s CPU: start-up and the ledger's load; "
                f"RSS {peak_rss_mb(process.pid):.0f} MB at most)"
            )
            return process
        except OSError:
            time.sleep(0.2)
    process.kill()
    raise TimeoutError((work / "dpproxy.log").read_text())


@dataclass
class Sample:
    kind: str
    source: str
    dpproxy_ms: float
    postgres_ms: float  # PostgreSQL's CPU for the DP statement
    reader_ms: float  # of which the reader's backends (the measurement's query)
    ledger_ms: float  # and the ledger's (ledger writes, audit log); the rest is background
    plain_ms: float  # the direct backend's CPU for the plain aggregate
    wall_ms: float
    plain_wall_ms: float

    @property
    def dp_ms(self) -> float:
        return self.dpproxy_ms + self.postgres_ms


def statement_source(notices: list[str]) -> str:
    """The statement's source, from a value's NOTICE or a statement's summary.

    >>> statement_source(["dp: n = 1 in [0, 2] with confidence 0.95; source combined; ..."])
    'combined'
    >>> statement_source(["dp: 2 values from t, each within ±1 with confidence 0.95 "
    ...                   "(history 1, fresh 1); budget ..."])
    'fresh'
    """
    sources = {n.split("source ", 1)[1].split(";", 1)[0] for n in notices if "source " in n}
    for n in notices:
        if " values from " in n and " (" in n:  # the summary: "(fresh 2, history 1)"
            counts = n.split(" (", 1)[1].split(")", 1)[0]
            sources.update(part.split()[0] for part in counts.split(", "))
    for source in ("fresh", "combined", "history"):
        if source in sources:
            return source
    return "unknown"


def end_to_end(
    work: Path,
    admin_dsn: str,
    postmaster: int,
    n: int,
    profile: Path | None = None,
    wide: bool = False,
    m: int = 0,
) -> list[Sample]:
    port = free_port()
    schema = f"ledger_{uuid.uuid4().hex[:8]}"
    server = start_dpproxy(work, admin_dsn, port, schema, wide, m)
    # py-spy's collapsed stacks of dpproxy (every thread, idle ones left out) over the stream
    spy = (
        subprocess.Popen(
            [PY_SPY, "record", "--pid", str(server.pid), "--format", "raw", "-o", str(profile)]
            + ["--rate", "200", "--nonblocking"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        if profile is not None
        else None
    )
    samples: list[Sample] = []
    refused: Counter[str] = Counter()  # SQLSTATE and message of each refusal
    try:
        proxy_dsn = f"postgresql://bench:bench@127.0.0.1:{port}/demo"
        with (
            psycopg.connect(proxy_dsn, autocommit=True) as dp,
            psycopg.connect(admin_dsn, autocommit=True) as direct,
        ):
            notices: list[str] = []
            dp.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
            row = direct.execute("SELECT pg_backend_pid()").fetchone()
            assert row is not None
            backend = int(row[0])
            for warm in ("SELECT 1", "SELECT COUNT(*) FROM adult WITH ACCURACY 2000"):
                dp.execute(warm).fetchall()
            for statement in stream(n, wide=wide):
                notices.clear()
                roles = backend_roles(direct)
                before = cpu_ns(server.pid), postgres_ns(postmaster, backend)
                start = time.perf_counter()
                try:
                    dp.execute(statement.dp).fetchall()
                except psycopg.errors.Error as error:
                    refused[f"{error.sqlstate}: {error.diag.message_primary}"] += 1
                    continue
                wall = time.perf_counter() - start
                after = cpu_ns(server.pid), postgres_ns(postmaster, backend)
                roles |= backend_roles(direct)
                spent = {p: ns - before[1].get(p, 0) for p, ns in after[1].items()}
                by_role = {
                    role: sum(ns for p, ns in spent.items() if roles.get(p) == role) / 1e6
                    for role in ("reader", "ledger")
                }
                plain_before = cpu_ns(backend)
                start = time.perf_counter()
                direct.execute(statement.sql).fetchall()
                plain_wall = time.perf_counter() - start
                plain = cpu_ns(backend) - plain_before
                samples.append(
                    Sample(
                        statement.kind,
                        statement_source(notices),
                        (after[0] - before[0]) / 1e6,
                        sum(spent.values()) / 1e6,
                        by_role["reader"],
                        by_role["ledger"],
                        plain / 1e6,
                        wall * 1e3,
                        plain_wall * 1e3,
                    )
                )
    finally:
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
            spy.wait(60)
        peak_rss = peak_rss_mb(server.pid)
        server.terminate()
        server.wait(30)
        # the ledger lives in the analyst database
        with psycopg.connect(dsn_with(admin_dsn, dbname=ANALYST_DATABASE), autocommit=True) as conn:
            conn.execute(pgsql.SQL("DROP SCHEMA {} CASCADE").format(pgsql.Identifier(schema)))
    print(
        f"\n{len(samples)} DP statements answered, {sum(refused.values())} refused; "
        f"dpproxy's peak RSS {peak_rss:.0f} MB\n"
    )
    for reason, count in refused.most_common():
        print(f"- refused {count}x: {reason}")
    return samples


def report_end_to_end(samples: list[Sample]) -> None:
    groups: dict[str, list[Sample]] = {"all": samples}
    for source in ("history", "fresh", "combined", "unknown"):
        groups[f"source {source}"] = [s for s in samples if s.source == source]
    for kind in ("count", "group by", "sum case"):
        groups[kind] = [s for s in samples if s.kind == kind]
    print(
        "| statements | n | DP CPU p50 (ms) | p95 | of which dpproxy p50 | reader p50 "
        "| ledger p50 | plain p50 (ms) | DP/plain, median of ratios | p95 of ratios "
        "| DP wall p50 | plain wall p50 |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, group in groups.items():
        if not group:
            continue
        ratios = [s.dp_ms / s.plain_ms for s in group if s.plain_ms > 0]
        print(
            f"| {name} | {len(group)} | {pct([s.dp_ms for s in group], 50):.2f} "
            f"| {pct([s.dp_ms for s in group], 95):.2f} "
            f"| {pct([s.dpproxy_ms for s in group], 50):.2f} "
            f"| {pct([s.reader_ms for s in group], 50):.2f} "
            f"| {pct([s.ledger_ms for s in group], 50):.2f} "
            f"| {pct([s.plain_ms for s in group], 50):.2f} | {pct(ratios, 50):.1f}x "
            f"| {pct(ratios, 95):.1f}x | {pct([s.wall_ms for s in group], 50):.2f} "
            f"| {pct([s.plain_wall_ms for s in group], 50):.2f} |"
        )
    ratio = {
        name: pct([s.dp_ms / s.plain_ms for s in groups[name] if s.plain_ms > 0], 50)
        for name in ("all", "group by")
    }
    print(
        f"\nTargets (DP / plain, median of ratios): every statement {ratio['all']:.1f}x "
        f"(<= 5x: {'met' if ratio['all'] <= 5 else 'not met'}), GROUP BY {ratio['group by']:.1f}x "
        f"(<= 10x: {'met' if ratio['group by'] <= 10 else 'not met'})"
    )


# -- part 2: the backend query on millions of rows -------------------------------------------


def synthetic_adult(admin_dsn: str, rows: int) -> str:
    """A scratch database whose ``adult`` table holds ``rows`` rows drawn from Adult's
    marginals (each column independently); its DSN. Kept between runs of the same size."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = 'dpproxy_bench'").fetchone():
            conn.execute("CREATE DATABASE dpproxy_bench")
    dsn = make_conninfo(admin_dsn, dbname="dpproxy_bench")
    load_adult(dsn, table="adult_sample")
    with psycopg.connect(dsn, autocommit=True) as conn:
        exists = conn.execute("SELECT to_regclass('public.adult') IS NOT NULL").fetchone()
        if exists and exists[0]:
            have = conn.execute("SELECT count(*) FROM adult").fetchone()
            if have and have[0] == rows:
                return dsn
        columns = [c for c, _ in ADULT_COLUMNS]
        conn.execute("DROP TABLE IF EXISTS adult, adult_numbered")
        conn.execute(
            "CREATE TABLE adult_numbered AS SELECT row_number() OVER () AS n, * FROM adult_sample"
        )
        conn.execute("CREATE TABLE adult (LIKE adult_sample)")
        # one independent draw of a sample row per column: Adult's marginals, not its joint law
        draws = pgsql.SQL(", ").join(
            pgsql.SQL("1 + floor(random() * {})::int AS {}").format(
                pgsql.Literal(ADULT_ROWS), pgsql.Identifier(f"r{i}")
            )
            for i in range(len(columns))
        )
        picks = pgsql.SQL(", ").join(
            pgsql.SQL("{}.{}").format(pgsql.Identifier(f"a{i}"), pgsql.Identifier(c))
            for i, c in enumerate(columns)
        )
        joins = pgsql.SQL(" ").join(
            pgsql.SQL("JOIN adult_numbered {a} ON {a}.n = d.{r}").format(
                a=pgsql.Identifier(f"a{i}"), r=pgsql.Identifier(f"r{i}")
            )
            for i in range(len(columns))
        )
        conn.execute(
            pgsql.SQL(
                "INSERT INTO adult SELECT {} FROM (SELECT {} FROM generate_series(1, {})) d {}"
            ).format(picks, draws, pgsql.Literal(rows), joins)
        )
        conn.execute("VACUUM ANALYZE adult")
    return dsn


BACKEND_STATEMENTS = [
    "SELECT COUNT(*) FROM adult",
    "SELECT COUNT(*) FROM adult WHERE age >= 35 AND age < 55",
    "SELECT COUNT(*) FROM adult WHERE age >= 35 AND sex = 'Female'",
    "SELECT COUNT(*) FROM adult WHERE education IN ('Bachelors', 'Masters') "
    "AND hours_per_week >= 41 AND race <> 'White'",
    "SELECT sex, COUNT(*) FROM adult GROUP BY sex",
    "SELECT race, sex, income, COUNT(*) FROM adult GROUP BY race, sex, income",
    "SELECT education, COUNT(*) FROM adult WHERE age < 35 GROUP BY education",
    "SELECT SUM(CASE WHEN income = '>50K' THEN 2 ELSE 1 END) FROM adult WHERE capital_gain > 0",
]


def timed(conn: psycopg.Connection, backend: int, sql: str) -> tuple[float, float, list[tuple]]:  # type: ignore[type-arg]
    """(backend CPU ms, wall ms, rows) of one statement."""
    before = cpu_ns(backend)
    start = time.perf_counter()
    rows = conn.execute(sql).fetchall()
    wall = time.perf_counter() - start
    return (cpu_ns(backend) - before) / 1e6, wall * 1e3, rows


def backend_queries(dsn: str, repeats: int, with_histogram: bool) -> None:
    translator = CONFIG.translator()
    print(
        "| statement | plain CPU (ms) | measurement CPU (ms) | ratio | whole histogram (ms) "
        "| ratio | same answer |"
    )
    print("|---|---|---|---|---|---|---|")
    ratios = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET max_parallel_workers_per_gather = 0")
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        backend = int(row[0])
        histogram = histogram_sql(CUBE)
        timed(conn, backend, "SELECT count(*) FROM adult")  # warm the cache
        for statement in BACKEND_STATEMENTS:
            spec = translator.translate(statement + " WITH ACCURACY 100")
            measurement = measurement_sql(CUBE, spec.queries)
            assert measurement.sql is not None
            plain_ms, measured_ms, histogram_ms = [], [], []
            for _ in range(repeats):
                cpu, _, plain_rows = timed(conn, backend, statement)
                plain_ms.append(cpu)
                cpu, _, rows = timed(conn, backend, measurement.sql)
                measured_ms.append(cpu)
            if with_histogram:
                histogram_ms.append(timed(conn, backend, histogram)[0])
            answers = measurement.answers(rows)
            plain_answers = sorted(float(r[-1]) for r in plain_rows)
            same = sorted(a for a in answers if a) == [a for a in plain_answers if a]
            ratio = statistics.median(measured_ms) / statistics.median(plain_ms)
            ratios.append(ratio)
            whole = (
                f"{statistics.median(histogram_ms):.0f} "
                f"| {statistics.median(histogram_ms) / statistics.median(plain_ms):.1f}x"
                if histogram_ms
                else "- | -"
            )
            print(
                f"| `{statement}` | {statistics.median(plain_ms):.0f} "
                f"| {statistics.median(measured_ms):.0f} | {ratio:.2f}x | {whole} "
                f"| {'yes' if same else 'NO'} |"
            )
    print(f"\nmeasurement / plain: median {statistics.median(ratios):.2f}x, max {max(ratios):.2f}x")


# -- main -----------------------------------------------------------------------------------


# -- part 3: a restart from the durable ledger ------------------------------------------------


def truth(admin_dsn: str, cube: Cube) -> np.ndarray:
    """The cube's coordinates over the demo table (counts, then each measure's sums): what the
    history's measurements measured, so that their answers agree with the stream's."""
    with psycopg.connect(admin_dsn) as conn:
        rows = conn.execute(histogram_sql(cube)).fetchall()
    return histogram_from_rows(cube, rows).astype(np.float64)


def history(
    config: Config, m: int, x: np.ndarray, wide: bool = False, statements: int = 400
) -> list[HistoryEntry]:
    """``m`` measurements of the vectors of ``statements`` statements of a stream like part 1's
    (seed 11, drawn at random), each with the budget a fresh answer at its statement's accuracy
    spends and noise of that scale around the truth ``x`` (as ``bench.engine_sql_bench`` draws
    its history): a history that answers the stream's statements, as in real use."""
    translator = config.translator()
    pool = []
    for statement in stream(statements, seed=11, wide=wide):
        try:
            translator.translate(statement.dp)
        except ProgramLimitExceeded:  # the wide cube's largest GROUP BYs: refused, never stored
            continue
        pool.append(statement.dp)
    return engine_sql_bench._history(translator, pool, m, x, 12)


def raised_total(config: Config, spent: Fraction) -> float:
    """The total budget the bench's config declares over a history that spent ``spent`` at its
    most-spent cell: that, rounded up to a whole number, plus the configured total, so that the
    stream has at least what a fresh ledger would have (m answers at these accuracies spend far
    more than 1.0: 0.2 at m = 1,000, 1.9 at 10,000, 17.6 at 100,000)."""
    return config.cubes[0].total_budget + math.ceil(float(spent))


async def fill_ledger(
    dsn: str, schema: str, entries: list[HistoryEntry], listed: bool, *, cube: Cube = CUBE
) -> Fraction:
    """``entries`` in a new ledger of ``cube``, as dpproxy writes them, or (``listed``) as
    ledgers before factored vectors held them: every coordinate listed. Returns the most any
    cell has spent after them."""
    budget = CellBudget(cube.qualified_name, total=Fraction(10**9), shape=cube.shape)
    ledger = await PostgresLedgerStore.open(dsn, [cube], schema)
    try:
        if not listed:
            for start in range(0, len(entries), 500):
                part = entries[start : start + 500]
                budget.commit(Charges.of(part))
                batch = [
                    NewMeasurement(uuid.uuid4(), e, 400.0, 0.95, "bench", None, "fresh", 0, 1, 1)
                    for e in part
                ]
                async with ledger.spending(cube) as spend:
                    await spend.append(batch, budget.spent)
            return budget.spent
    finally:
        await ledger.close()
    budget.commit(Charges.of(entries))
    conn = await asyncpg.connect(dsn)
    try:
        table_id = await conn.fetchval(f'SELECT id FROM "{schema}".tables')
        await conn.copy_records_to_table(
            "measurements",
            schema_name=schema,
            columns=[
                "entry_key",
                "table_id",
                "fingerprint",
                "data_version",
                "cells",
                "weights",
                "sensitivity",
                "budget",
                "step",
                "noisy_answer",
            ],  # fmt: skip
            records=[
                (
                    uuid.uuid4(),
                    table_id,
                    cube.fingerprint,
                    1,
                    e.query.cells.tolist(),
                    e.query.weights.tolist(),
                    e.query.sensitivity,
                    str(e.budget),
                    str(e.step),
                    e.noisy_answer,
                )  # fmt: skip
                for e in entries
            ],
        )
    finally:
        await conn.close()
    return budget.spent


async def restart(
    dsn: str, schema: str, cube: Cube
) -> tuple[float, float, float, float, float, int]:
    """Open the ledger and a service on it; time it, then its first decisions (CPU), and
    the ledger's part of it: reading the measurements back (once more, after)."""
    started, cpu = time.perf_counter(), time.process_time()
    ledger = await PostgresLedgerStore.open(dsn, [cube], schema)
    reader = await Reader.connect(dsn)  # measures nothing here: the decisions are planned
    service = await DpService.open_durable([cube], reader, ledger)
    ready_wall, ready_cpu = time.perf_counter() - started, time.process_time() - cpu
    engine = service.engine(cube)
    first: list[float] = []
    for sql in (
        "SELECT COUNT(*) FROM adult WHERE age >= 35 AND sex = 'Female' WITH ACCURACY 200",
        "SELECT race, sex, income, COUNT(*) FROM adult GROUP BY race, sex, income "
        "WITH ACCURACY 300",
    ):
        spec = CONFIG.translator().translate(sql)
        assert spec.accuracy is not None
        cpu = time.process_time()
        engine.plan([QueryRequest(q, spec.accuracy) for q in spec.queries])
        first.append((time.process_time() - cpu) * 1e3)
    size = engine.history_size
    started = time.perf_counter()
    await ledger.load(cube)
    load_wall = time.perf_counter() - started
    await ledger.close()
    await reader.close()
    return ready_wall, ready_cpu, load_wall, first[0], first[1], size


def restarted(
    dsn: str, schema: str, cube: Cube
) -> tuple[float, float, float, float, float, int, float]:
    """:func:`restart` in this (fresh) process, with its peak RSS in MB."""
    figures = asyncio.run(restart(dsn, schema, cube))
    return (*figures, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def restarts(admin_dsn: str, sizes: list[int]) -> None:
    print(
        "| m | stored vectors | ready (s wall) | ready (s CPU) | of which reading the ledger "
        "(s wall) | first count (ms CPU) | first GROUP BY race, sex, income (ms CPU) "
        "| peak RSS (MB) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    # each restart in a process of its own, as dpproxy starts
    fresh = multiprocessing.get_context("spawn")
    x = truth(admin_dsn, CUBE)
    for m in sizes:
        entries = history(CONFIG, m, x)
        for listed in (False, True):
            schema = f"restart_{uuid.uuid4().hex[:8]}"
            spent = asyncio.run(fill_ledger(admin_dsn, schema, entries, listed))
            cube = dataclasses.replace(CUBE, total_budget=raised_total(CONFIG, spent))
            try:
                with fresh.Pool(1) as pool:
                    wall, cpu, load, count, group_by, size, rss = pool.apply(
                        restarted, (admin_dsn, schema, cube)
                    )
            finally:
                with psycopg.connect(admin_dsn, autocommit=True) as conn:
                    conn.execute(
                        pgsql.SQL("DROP SCHEMA {} CASCADE").format(pgsql.Identifier(schema))
                    )
            assert size == m
            form = "cells listed (before)" if listed else "factored"
            print(
                f"| {m:,} | {form} | {wall:.2f} | {cpu:.2f} | {load:.2f} | {count:.1f} "
                f"| {group_by:.1f} "
                f"| {rss:.0f} |"
            )


def machine() -> str:
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    return f"{platform.node()}, {os.cpu_count()} CPUs, {platform.python_version()}; uptime: {load}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--statements", type=int, default=240)
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--data-dir", type=Path, help="keep the embedded server's data here")
    parser.add_argument("--skip-backend", action="store_true", help="end to end only")
    parser.add_argument("--skip-e2e", action="store_true", help="the backend query only")
    parser.add_argument("--no-histogram", action="store_true", help="skip the old whole query")
    parser.add_argument(
        "--restart",
        type=int,
        nargs="*",
        metavar="M",
        help="time a restart from a ledger of M measurements (each as stored now and before)",
    )
    parser.add_argument(
        "--history",
        type=int,
        nargs="+",
        metavar="M",
        help="end to end again on a ledger filled with M measurements first, for each M",
    )
    parser.add_argument(
        "--wide", action="store_true", help="end to end on the 10-dimension cube (4.35M cells)"
    )
    parser.add_argument(
        "--profile", type=Path, help=f"py-spy's collapsed stacks of dpproxy here ({PY_SPY})"
    )
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="dpproxy-sql-") as tmp:
        work = Path(tmp)
        data = args.data_dir or work / "pgdata"
        admin = start_embedded(data)
        load_adult(admin)
        postmaster = int((data / "postmaster.pid").read_text().split()[0])
        print(f"# SQL workload ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n")
        print(machine())
        cube = "the 10-dimension cube" if args.wide else "the demo cube"
        if not args.skip_e2e:
            print(
                f"\n## End to end: {args.statements} dashboard statements through dpproxy ({cube})"
            )
            samples = end_to_end(work, admin, postmaster, args.statements, args.profile, args.wide)
            report_end_to_end(samples)
        for m in args.history or ():
            print(
                f"\n## End to end on a history of {m:,} measurements: {args.statements} "
                f"dashboard statements through dpproxy ({cube})\n"
            )
            profile = args.profile
            if profile is not None and (len(args.history) > 1 or not args.skip_e2e):
                profile = profile.with_name(f"{profile.stem}-m{m}{profile.suffix}")
            samples = end_to_end(work, admin, postmaster, args.statements, profile, args.wide, m=m)
            report_end_to_end(samples)
        if args.restart:
            print("\n## Restart from the durable ledger (the stream's vectors, demo cube)\n")
            restarts(admin, args.restart)
        if not args.skip_backend:
            print(f"\n## The fresh answer's backend query on {args.rows:,} rows\n")
            started = time.perf_counter()
            dsn = synthetic_adult(admin, args.rows)
            print(f"(table ready in {time.perf_counter() - started:.0f} s)\n")
            backend_queries(dsn, args.repeats, not args.no_histogram)
        print(f"\nafter: {machine()}")


if __name__ == "__main__":
    main()
