"""psqlODBC (the Debian package odbc-postgresql) through dpproxy, driven by unixODBC's isql.

With ``UseDeclareFetch=1`` psqlODBC reads every result through a cursor, as Tableau's
PostgreSQL connector does: ``BEGIN; declare "SQL_CUR..." cursor with hold for <query>;
fetch 2048 in "SQL_CUR..."``. Its query log (``CommLog``) shows the driver sent that sequence.
Without psqlODBC or isql this module is skipped, saying why.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import psycopg
import pytest

from tests.e2e.conftest import Proxy

ACCURACY = 200.0
BOUND = 5 * ACCURACY  # P(|noise| > 5 accuracy) is negligible when P(|noise| > accuracy) is 5%
DRIVER = "PostgreSQL Unicode"

pytestmark = [
    pytest.mark.skipif(shutil.which("isql") is None, reason="no isql (apt-get install unixodbc)"),
    pytest.mark.skipif(
        subprocess.run(["odbcinst", "-q", "-d", "-n", DRIVER], capture_output=True).returncode != 0
        if shutil.which("odbcinst")
        else True,
        reason=f"no psqlODBC driver {DRIVER!r} (apt-get install odbc-postgresql)",
    ),
]


def driver_path() -> str:
    """The driver library odbcinst knows under DRIVER."""
    out = subprocess.run(
        ["odbcinst", "-q", "-d", "-n", DRIVER], capture_output=True, text=True, check=True
    ).stdout
    (name,) = [line.split("=", 1)[1] for line in out.splitlines() if line.startswith("Driver=")]
    return name if name.startswith("/") else f"/usr/lib/x86_64-linux-gnu/odbc/{name}"


@pytest.fixture(scope="module")
def truth(adult_dsn: str) -> dict[str, float]:
    with psycopg.connect(adult_dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT sex, COUNT(*) FROM adult GROUP BY sex").fetchall()
    return {str(k): float(v) for k, v in rows}


def isql(proxy: Proxy, tmp_path: Path, statements: list[str]) -> tuple[list[list[str]], str]:
    """Run statements through psqlODBC; the rows printed (header rows included) and its log."""
    logs = tmp_path / "odbc-log"
    logs.mkdir()
    # the driver's settings, with its query log, in an odbcinst.ini of our own
    (tmp_path / "odbcinst.ini").write_text(
        f"[{DRIVER}]\nDriver={driver_path()}\nCommLog=1\nDebug=1\nLogdir={logs}\n"
    )
    ini = tmp_path / "odbc.ini"
    ini.write_text(
        "[dpproxy]\n"
        f"Driver={DRIVER}\nServername={proxy.host}\nPort={proxy.port}\nDatabase=demo\n"
        "Username=analyst\nPassword=analyst\nSSLmode=disable\n"
        # Tableau's connector: every result through a cursor, 2048 rows at a time
        "UseDeclareFetch=1\nFetch=2048\nCommLog=1\nDebug=1\n"
        # Tableau's Initial SQL
        f"ConnSettings=SET dp.accuracy = {ACCURACY:g}\n"
    )
    result = subprocess.run(
        ["isql", "dpproxy", "-b", "-3", "-x0x09", "-c", "-v"],
        input="".join(s + "\n" for s in statements),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "ODBCINI": str(ini), "ODBCSYSINI": str(tmp_path)},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[ISQL]ERROR" not in result.stdout and "ERROR" not in result.stderr, result.stdout
    log = "".join(p.read_text(errors="replace") for p in logs.iterdir())
    rows = [line.split("\t") for line in result.stdout.splitlines() if "\t" in line]
    return rows, log


def test_psqlodbc_reads_a_dp_answer_through_a_cursor_with_hold(
    proxy: Proxy, tmp_path: Path, truth: dict[str, float]
) -> None:
    rows, log = isql(
        proxy,
        tmp_path,
        ['SELECT sex, COUNT(*) AS "n" FROM adult GROUP BY sex ORDER BY "n" DESC'],
    )
    assert rows[0] == ["sex", "n"]
    assert [r[0] for r in rows[1:]] == ["Male", "Female"]
    for sex, n in rows[1:]:
        assert abs(float(n) - truth[sex]) <= BOUND
    # what the driver sent: Tableau's sequence, in one query string
    assert 'BEGIN;declare "SQL_CUR' in log and "cursor with hold for SELECT sex" in log
    assert 'fetch 2048 in "SQL_CUR' in log


def test_psqlodbc_catalog_functions_list_adult_and_its_columns(
    proxy: Proxy, tmp_path: Path
) -> None:
    """isql's ``help`` calls SQLTables and SQLColumns: psqlODBC's own catalog SQL."""
    rows, _ = isql(proxy, tmp_path, ["help", "help adult"])
    tables = [r for r in rows if len(r) > 3 and r[2] == "adult"]
    columns = [r for r in rows if len(r) > 5 and r[2] == "adult" and r[3] != ""]
    assert tables and tables[0][3] == "TABLE"
    assert [c[3] for c in columns if c[3] != "TABLE"][:3] == ["age", "workclass", "fnlwgt"]
    assert len([c for c in columns if c[3] != "TABLE"]) == 15
