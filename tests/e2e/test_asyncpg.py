"""asyncpg through dpproxy: prepared statements (Parse/Describe/Flush), binary results."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import pytest

from tests.e2e.conftest import Proxy

DP = "SELECT COUNT(*) FROM adult WHERE age >= 25 WITH ACCURACY 100"


def run(proxy: Proxy, body: Callable[[Any], Awaitable[Any]], timeout: float = 60) -> Any:
    async def main() -> Any:
        conn = await asyncpg.connect(**proxy.kwargs, timeout=10)
        try:
            return await asyncio.wait_for(body(conn), timeout)
        finally:
            await conn.close(timeout=10)

    return asyncio.run(main())


def test_dp_query_binary_float8(proxy: Proxy) -> None:
    notices: list[str] = []

    async def body(conn: Any) -> Any:
        conn.add_log_listener(lambda c, m: notices.append(m.message))
        return await conn.fetchval(DP)

    value = run(proxy, body)
    assert isinstance(value, float) and 15_000 < value < 35_000
    assert notices and "source fresh" in notices[0]


def test_group_by_with_interval_and_text_keys(proxy: Proxy) -> None:
    async def body(conn: Any) -> Any:
        return await conn.fetch(
            "SELECT race, COUNT(*) AS n FROM adult GROUP BY race WITH ACCURACY 300"
        )

    rows = run(proxy, body)
    assert [r["race"] for r in rows][:2] == ["White", "Black"]
    assert all(isinstance(r["n"], float) for r in rows)


def test_prepared_statement_reused_and_parameterized(proxy: Proxy) -> None:
    async def body(conn: Any) -> Any:
        stmt = await conn.prepare(
            "SELECT COUNT(*) FROM adult WHERE age >= $1 AND sex = $2 WITH ACCURACY 100"
        )
        types = [t.name for t in stmt.get_parameters()]
        first = await stmt.fetchval(25, "Male")
        second = await stmt.fetchval(25, "Male")
        columns = [(a.name, a.type.name) for a in stmt.get_attributes()]
        return types, first, second, columns

    types, first, second, columns = run(proxy, body)
    assert types == ["int8", "text"]
    assert columns == [("count", "float8")]
    assert first == pytest.approx(second)  # the second answer comes from history


def test_catalog_queries_and_mixed_session(proxy: Proxy) -> None:
    async def body(conn: Any) -> Any:
        tables = await conn.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1"
        )
        n = await conn.fetchval(DP)
        version = await conn.fetchval("SELECT current_setting('server_version_num')::int")
        return tables, n, version

    tables, n, version = run(proxy, body)
    assert "adult" in [t["tablename"] for t in tables]
    assert n > 0 and version >= 100000


@pytest.mark.parametrize(
    ("sql", "error"),
    [
        ("SELECT * FROM adult", asyncpg.InsufficientPrivilegeError),
        ("SELECT sum(age) FROM adult JOIN adult b USING (age)", asyncpg.InsufficientPrivilegeError),
        (
            "SELECT COUNT(*) FROM adult WITH ACCURACY 0.0001",
            asyncpg.ConfigurationLimitExceededError,
        ),
        ("SELECT COUNT(*) FROM adult WHERE age >= 30", asyncpg.FeatureNotSupportedError),
    ],
)
def test_refusals(proxy: Proxy, sql: str, error: type[Exception]) -> None:
    async def body(conn: Any) -> Any:
        with pytest.raises(error):
            await conn.fetch(sql)
        return await conn.fetchval("SELECT 1")

    assert run(proxy, body) == 1


def test_dp_setting_and_transaction(proxy: Proxy) -> None:
    async def body(conn: Any) -> Any:
        await conn.execute("SET dp.accuracy = 150")
        shown = await conn.fetchval("SHOW dp.accuracy")
        async with conn.transaction():
            await conn.execute("CREATE TEMP TABLE notes (t text)")
            await conn.execute("INSERT INTO notes VALUES ($1)", "x")
            n = await conn.fetchval("SELECT COUNT(*) FROM adult")
        return shown, n, await conn.fetchval("SELECT count(*) FROM notes")

    shown, n, notes = run(proxy, body)
    assert shown == "150" and n > 0 and notes == 1


def test_cursor_fetches_a_dp_portal_in_pieces(proxy: Proxy) -> None:
    async def body(conn: Any) -> Any:
        async with conn.transaction():
            cursor = await conn.cursor(
                "SELECT education, COUNT(*) FROM adult GROUP BY education WITH ACCURACY 500"
            )
            first = await cursor.fetch(5)
            rest = await cursor.fetch(100)
        return first, rest

    first, rest = run(proxy, body)
    assert len(first) == 5 and len(rest) == 11


def test_interval_columns(proxy: Proxy) -> None:
    async def body(conn: Any) -> Any:
        stmt = await conn.prepare(
            "SELECT sex, COUNT(*) AS n, DP_INTERVAL_LOW(COUNT(*)) AS lo, "
            "DP_INTERVAL_HIGH(COUNT(*)) AS hi FROM adult GROUP BY sex WITH ACCURACY 100"
        )
        return [(a.name, a.type.name) for a in stmt.get_attributes()], await stmt.fetch()

    columns, rows = run(proxy, body)
    assert columns == [("sex", "text"), ("n", "float8"), ("lo", "float8"), ("hi", "float8")]
    for row in rows:
        assert row["lo"] < row["n"] < row["hi"] and row["hi"] - row["lo"] == pytest.approx(
            200, rel=0.01
        )
