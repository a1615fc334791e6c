"""``RESET ALL`` and ``DISCARD ALL`` reset the session's dp.* settings to their startup values.

Poolers and tools reset a session so before they hand it to the next user; PostgreSQL then
resets its own settings, and dpproxy the dp.* ones, once the backend has run the statement.
"""

from __future__ import annotations

import psycopg
import pytest

from tests.e2e.conftest import Proxy


def _settings(conn: psycopg.Connection[tuple[object, ...]]) -> tuple[object, ...]:
    return tuple(
        (conn.execute(f"SHOW dp.{name}").fetchone() or (None,))[0]
        for name in ("accuracy", "confidence", "notices")
    )


@pytest.mark.parametrize("statement", ["RESET ALL", "DISCARD ALL", "discard all;"])
@pytest.mark.parametrize("prepare", [False, True], ids=["simple", "extended"])
def test_reset_all_and_discard_all_reset_dp_settings(
    proxy: Proxy, statement: str, prepare: bool
) -> None:
    with psycopg.connect(proxy.dsn(), autocommit=True, options="-c dp.accuracy=200") as conn:
        start = _settings(conn)
        conn.execute("SET dp.accuracy = 5")
        conn.execute("SET dp.confidence = 0.8")
        conn.execute("SET dp.notices = rows")
        conn.execute("SET statement_timeout = '7s'")
        assert _settings(conn) != start
        conn.execute(statement, prepare=prepare)
        assert _settings(conn) == start and start[0] == "200"
        assert conn.execute("SHOW statement_timeout").fetchone() == ("0",)  # PostgreSQL's too


def test_a_refused_discard_all_keeps_the_settings(proxy: Proxy) -> None:
    with psycopg.connect(proxy.dsn(), autocommit=True) as conn:
        conn.execute("SET dp.accuracy = 7")
        conn.execute("BEGIN")
        with pytest.raises(psycopg.errors.ActiveSqlTransaction):
            conn.execute("DISCARD ALL")  # not inside a transaction block
        conn.execute("ROLLBACK")
        assert conn.execute("SHOW dp.accuracy").fetchone() == ("7",)
        with pytest.raises(psycopg.errors.ActiveSqlTransaction):
            conn.execute("BEGIN; DISCARD ALL")  # one query string, two statements
        conn.execute("ROLLBACK")
        assert conn.execute("SHOW dp.accuracy").fetchone() == ("7",)
