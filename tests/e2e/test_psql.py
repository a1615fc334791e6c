"""psql, the Debian client, through dpproxy: DP queries, meta-commands, refusals."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.e2e.conftest import Proxy

PSQL = "/usr/bin/psql"
pytestmark = pytest.mark.skipif(not os.path.exists(PSQL), reason=f"{PSQL} is not installed")


def psql(
    proxy: Proxy, *commands: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    args = [PSQL, proxy.dsn(), "-X", "-v", "ON_ERROR_STOP=0"]
    for command in commands:
        args += ["-c", command]
    return subprocess.run(
        args,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PGCONNECT_TIMEOUT": "10", **(env or {})},
    )


def test_dp_query_with_notice(proxy: Proxy) -> None:
    result = psql(proxy, "SELECT COUNT(*) FROM adult WITH ACCURACY 100")
    assert result.returncode == 0, result.stderr
    assert "count" in result.stdout and "(1 row)" in result.stdout
    assert "NOTICE:  dp: count = " in result.stderr and "source fresh" in result.stderr


def test_group_by(proxy: Proxy) -> None:
    result = psql(proxy, "SELECT sex, COUNT(*) AS n FROM adult GROUP BY sex WITH ACCURACY 200")
    assert result.returncode == 0, result.stderr
    assert " Male " in result.stdout and " Female " in result.stdout and "(2 rows)" in result.stdout


def test_meta_commands(proxy: Proxy) -> None:
    result = psql(proxy, r"\dt", r"\d adult", r"\l")
    assert result.returncode == 0, result.stderr
    assert "public | adult | table" in result.stdout
    assert 'Table "public.adult"' in result.stdout and "hours_per_week" in result.stdout
    assert "List of databases" in result.stdout


def test_refusal_names_the_table_and_points_at_it(proxy: Proxy) -> None:
    result = psql(proxy, "SELECT age FROM adult WHERE sex = 'Male'")
    assert "ERROR:  permission denied: adult is a protected table" in result.stderr
    assert "HINT:  dpproxy answers SELECT <aggregates>" in result.stderr
    assert "^" in result.stderr  # the caret under the table name


def test_multi_statement_mixes_routes_in_order(proxy: Proxy) -> None:
    result = psql(
        proxy,
        "SELECT 'first' AS a; SELECT COUNT(*) AS dp FROM adult WITH ACCURACY 100; "
        "SET dp.accuracy = 150; SHOW dp.accuracy; SELECT 'last' AS z",
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout  # psql prints only the last result of a multi-statement -c
    assert " last" in out
    assert "NOTICE:  dp: dp = " in result.stderr


def test_startup_options_set_accuracy(proxy: Proxy) -> None:
    result = psql(
        proxy,
        "SHOW dp.accuracy",
        "SELECT COUNT(*) FROM adult",
        env={"PGOPTIONS": "-c dp.accuracy=123"},
    )
    assert result.returncode == 0, result.stderr
    assert " 123" in result.stdout
    assert "in [" in result.stderr


def test_failed_transaction_refuses_dp_with_25p02(proxy: Proxy) -> None:
    result = psql(
        proxy,
        "BEGIN; SELECT 1/0",
        "SELECT COUNT(*) FROM adult WITH ACCURACY 100",
        "ROLLBACK",
        "SELECT COUNT(*) FROM adult WITH ACCURACY 100",
    )
    assert "division by zero" in result.stderr
    assert "current transaction is aborted" in result.stderr
    assert result.stdout.count("(1 row)") == 1


def test_copy_from_stdin_to_an_open_table(proxy: Proxy, tmp_path: Path) -> None:
    data = tmp_path / "rows.tsv"
    data.write_text("1\tx\n2\ty\n")
    result = psql(
        proxy,
        "CREATE TEMP TABLE psql_copy (a int, b text)",
        rf"\copy psql_copy FROM '{data}'",
        "SELECT count(*) FROM psql_copy",
    )
    assert result.returncode == 0, result.stderr
    assert "COPY 2" in result.stdout and " 2\n" in result.stdout


def test_explain_previews_the_cost_and_spends_nothing(proxy: Proxy) -> None:
    query = "SELECT race, COUNT(*) FROM adult WHERE age < 25 GROUP BY race WITH ACCURACY 137"
    before = psql(proxy, "\\pset tuples_only on", f"EXPLAIN {query}")
    assert before.returncode == 0, before.stderr
    plan = [line.strip() for line in before.stdout.splitlines() if line.strip()]
    assert plan[0] == "DP plan for public.adult (EXPLAIN spends nothing)"
    assert len(plan) == 1 + 5 + 1
    assert all(": fresh (a measurement of budget" in p for p in plan[1:6])
    assert "count [race=" in plan[1] and "±137 at confidence 0.95" in plan[1]
    assert plan[-1].startswith("Budget: charges up to ")
    # asked for real, it is answered as previewed (fresh: EXPLAIN measured nothing); then
    # EXPLAIN says history answers it
    after = psql(proxy, query, "\\pset tuples_only on", f"EXPLAIN {query}")
    assert after.returncode == 0, after.stderr
    assert "(fresh 5)" in after.stderr
    assert after.stdout.count(": history (free)") == 5


def test_explain_analyze_of_a_dp_query_stays_refused(proxy: Proxy) -> None:
    result = psql(proxy, "EXPLAIN ANALYZE SELECT COUNT(*) FROM adult")
    assert "ERROR:  permission denied: adult is a protected table" in result.stderr
