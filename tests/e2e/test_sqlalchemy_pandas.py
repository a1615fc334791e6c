"""SQLAlchemy and pandas through dpproxy: the Python stack Superset is built on.

SQLAlchemy's PostgreSQL dialect sends its own start-up queries and lists tables and columns
through the catalogs; pandas' ``read_sql(..., chunksize=n)`` on a connection with
``stream_results`` reads through a server-side cursor (psycopg's ``DECLARE`` and ``FETCH FORWARD
n`` in a transaction), as SQLAlchemy applications stream large results.
"""

from __future__ import annotations

from collections.abc import Iterator

import pandas as pd
import psycopg
import pytest
import sqlalchemy as sa

from tests.e2e.conftest import Proxy

EPS = 200.0
BOUND = 5 * EPS  # P(|noise| > 5 eps) is negligible when P(|noise| > eps) is 5%


@pytest.fixture(scope="module")
def truth(adult_dsn: str) -> dict[str, int]:
    """True counts per education, from the private table itself."""
    with psycopg.connect(adult_dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT education, COUNT(*) FROM adult GROUP BY 1").fetchall()
    return {str(k): int(v) for k, v in rows}


@pytest.fixture()
def engine(proxy: Proxy) -> Iterator[sa.Engine]:
    url = proxy.dsn().replace("postgresql://", "postgresql+psycopg://", 1)
    engine = sa.create_engine(url, connect_args={"options": "-c dp.accuracy=200"})
    yield engine
    engine.dispose()


def test_the_dialect_lists_adult_and_its_columns(engine: sa.Engine) -> None:
    inspector = sa.inspect(engine)
    assert "adult" in inspector.get_table_names(schema="public")
    columns = {c["name"]: c["type"] for c in inspector.get_columns("adult", schema="public")}
    assert len(columns) == 15
    assert isinstance(columns["age"], sa.Integer) and isinstance(columns["sex"], sa.String)


def test_read_sql_answers_a_group_by(engine: sa.Engine, truth: dict[str, int]) -> None:
    frame = pd.read_sql(
        "SELECT education, COUNT(*) AS n FROM adult GROUP BY education ORDER BY n DESC", engine
    )
    assert list(frame.columns) == ["education", "n"]
    assert set(frame["education"]) == set(truth) and frame["n"].is_monotonic_decreasing
    for education, n in zip(frame["education"], frame["n"]):
        assert abs(n - truth[education]) <= BOUND


def test_read_sql_in_chunks_streams_through_a_server_side_cursor(
    engine: sa.Engine, truth: dict[str, int]
) -> None:
    sql = sa.text("SELECT education, COUNT(*) AS n FROM adult GROUP BY 1 ORDER BY 1")
    cursors: list[object] = []
    sa.event.listen(engine, "before_cursor_execute", lambda _c, cursor, *_: cursors.append(cursor))
    with engine.connect().execution_options(stream_results=True, max_row_buffer=5) as conn:
        chunks = list(pd.read_sql(sql, conn, chunksize=5))
    assert any(isinstance(c, psycopg.ServerCursor) for c in cursors)
    assert [len(c) for c in chunks] == [5, 5, 5, 1]
    frame = pd.concat(chunks)
    assert list(frame["education"]) == sorted(truth)
    assert all(abs(n - truth[e]) <= BOUND for e, n in zip(frame["education"], frame["n"]))
