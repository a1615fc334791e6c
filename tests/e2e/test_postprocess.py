"""Post-processing around DP answers, end to end: what BI tools send, through real drivers.

The SQL is what the tools generate (Superset's Explore, Big Number, filter values and SQL Lab;
Metabase's breakout questions; Grafana's builder; Tableau's psqlODBC cursor sequence), checked
against the true answers computed directly in PostgreSQL. Values are DP estimates: each is
checked against the truth with a bound of several times the requested accuracy, which a
correct interval misses with negligible probability.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import asyncpg
import psycopg
import pytest
from psycopg import errors

from tests.e2e.conftest import Proxy

EPS = 200.0
BOUND = 5 * EPS  # P(|noise| > 5 eps) is negligible when P(|noise| > eps) is 5%


@pytest.fixture(scope="module")
def truth(adult_dsn: str) -> dict[str, float]:
    """True counts, from the private table itself."""
    with psycopg.connect(adult_dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT 'all', COUNT(*) FROM adult UNION ALL "
            "SELECT sex, COUNT(*) FROM adult GROUP BY sex UNION ALL "
            "SELECT 'rich ' || sex, COUNT(*) FROM adult WHERE income = '>50K' GROUP BY sex"
        ).fetchall()
    return {str(k): float(v) for k, v in rows}


@pytest.fixture()
def conn(proxy: Proxy) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    with psycopg.connect(
        proxy.dsn(), autocommit=True, connect_timeout=10, options="-c dp.accuracy=200"
    ) as c:
        yield c


def close(value: object, true: float) -> bool:
    return isinstance(value, float) and abs(value - true) <= BOUND


def test_superset_explore_bar_chart(
    conn: psycopg.Connection[tuple[object, ...]], truth: dict[str, float]
) -> None:
    notices: list[str] = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
    cur = conn.execute(
        'SELECT sex AS sex, COUNT(*) AS "COUNT(*)" FROM public.adult GROUP BY sex '
        'ORDER BY "COUNT(*)" DESC LIMIT 10000'
    )
    assert [c.name for c in cur.description or ()] == ["sex", "COUNT(*)"]
    rows = cur.fetchall()
    assert [r[0] for r in rows] == ["Male", "Female"]
    assert all(close(n, truth[str(sex)]) for sex, n in rows)
    # one summary for the statement; per row after SET dp.notices = rows
    assert len(notices) == 1 and notices[0].startswith("dp: 2 values from public.adult, each")
    notices.clear()
    conn.execute("SET dp.notices = rows")
    try:
        conn.execute(
            'SELECT sex AS sex, COUNT(*) AS "COUNT(*)" FROM public.adult GROUP BY sex '
            'ORDER BY "COUNT(*)" DESC LIMIT 10000'
        )
    finally:
        conn.execute("RESET dp.notices")
    assert len(notices) == 2 and "[sex='Male']" in notices[0]


def test_superset_big_number_filter_and_filter_values(
    conn: psycopg.Connection[tuple[object, ...]], truth: dict[str, float]
) -> None:
    (total,) = conn.execute(
        'SELECT COUNT(*) AS "COUNT(*)" FROM public.adult LIMIT 50000'
    ).fetchall()
    assert close(total[0], truth["all"])
    rich = conn.execute(
        'SELECT sex AS sex, COUNT(*) AS "COUNT(*)" FROM public.adult '
        "WHERE income IN ('>50K') GROUP BY sex ORDER BY \"COUNT(*)\" DESC LIMIT 10000"
    ).fetchall()
    assert {str(s): n for s, n in rich}.keys() == {"Male", "Female"}
    assert all(close(n, truth[f"rich {s}"]) for s, n in rich)
    values = conn.execute(
        "SELECT DISTINCT income AS column_values FROM public.adult LIMIT 10000"
    ).fetchall()
    assert sorted(v for (v,) in values) == ["<=50K", ">50K"]  # the declared values


def test_superset_sql_lab_states_accuracy_in_a_comment(
    proxy: Proxy, truth: dict[str, float]
) -> None:
    notices: list[str] = []
    with psycopg.connect(proxy.dsn(), autocommit=True) as conn:  # no session accuracy
        conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        rows = conn.execute(
            "SELECT sex, COUNT(*) AS n /* dp: accuracy=150 confidence=0.9 */\n"
            "FROM adult GROUP BY sex\nLIMIT 1001"
        ).fetchall()
    assert len(rows) == 2 and all(close(n, truth[str(s)]) for s, n in rows)
    assert all("confidence 0.9" in n for n in notices)


def test_having_ratios_case_and_share_of_the_total(
    conn: psycopg.Connection[tuple[object, ...]], truth: dict[str, float]
) -> None:
    rows = conn.execute(
        "SELECT sex, COUNT(*) AS n, "
        "COUNT(*) FILTER (WHERE income = '>50K') / COUNT(*) AS rich_share, "
        "CASE WHEN COUNT(*) > 15000 THEN 'large' ELSE 'small' END AS size, "
        "round((COUNT(*) * 100.0 / SUM(COUNT(*)) OVER ())::numeric, 1) AS pct "
        "FROM adult GROUP BY sex HAVING COUNT(*) > 1000 ORDER BY pct DESC"
    ).fetchall()
    assert [(r[0], r[3]) for r in rows] == [("Male", "large"), ("Female", "small")]
    male = rows[0]
    # the session's accuracy (±200) says nothing useful about a ratio (docs/sql.md, "Accuracy on
    # a ratio"): its probes put it within 0.1 of the truth in 120 seeded draws, 7 past 0.05, so
    # only the ratio's range is checked here (tests/test_ratios.py checks ratios' intervals)
    assert 0 <= float(str(male[2])) <= 1
    assert abs(float(str(male[4])) - 100 * truth["Male"] / truth["all"]) < 5
    assert float(str(rows[0][4])) + float(str(rows[1][4])) == pytest.approx(100, abs=0.2)


def test_intervals_follow_their_rows(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    rows = conn.execute(
        "SELECT sex, COUNT(*) AS n, DP_INTERVAL_LOW(COUNT(*)) AS lo, "
        "DP_INTERVAL_HIGH(COUNT(*)) AS hi FROM adult GROUP BY sex ORDER BY n LIMIT 1"
    ).fetchall()
    ((sex, n, lo, hi),) = rows
    assert sex == "Female" and isinstance(n, float) and isinstance(lo, float)
    assert isinstance(hi, float) and lo < n < hi and hi - lo == pytest.approx(2 * EPS)


def test_subquery_cte_and_join_with_a_public_table(
    conn: psycopg.Connection[tuple[object, ...]], truth: dict[str, float]
) -> None:
    conn.execute("CREATE TEMP TABLE sex_labels (sex text, label text)")
    conn.execute("INSERT INTO sex_labels VALUES ('Male', 'men'), ('Female', 'women')")
    rows = conn.execute(
        "WITH by_sex AS (SELECT sex, COUNT(*) AS n FROM adult GROUP BY sex) "
        "SELECT l.label, b.n FROM by_sex b JOIN sex_labels l ON l.sex = b.sex ORDER BY l.label"
    ).fetchall()
    assert [r[0] for r in rows] == ["men", "women"]
    assert close(rows[0][1], truth["Male"])
    # Tableau's custom SQL and Superset's virtual datasets wrap the query in FROM
    (outer,) = conn.execute(
        "SELECT SUM(t.n) AS total FROM (SELECT sex, COUNT(*) AS n FROM adult GROUP BY sex) t"
    ).fetchall()
    assert close(outer[0], truth["all"])


def test_postgres_errors_in_the_wrapper_reach_the_client(
    conn: psycopg.Connection[tuple[object, ...]],
) -> None:
    with pytest.raises(errors.DivisionByZero):
        conn.execute("SELECT COUNT(*) / 0 FROM adult")
    with pytest.raises(errors.InvalidRowCountInLimitClause):
        conn.execute("SELECT COUNT(*) FROM adult LIMIT -1")
    with pytest.raises(errors.FeatureNotSupported, match="column n must appear"):
        conn.execute("SELECT sex, COUNT(*) AS n FROM adult GROUP BY sex HAVING n > 1")
    assert conn.execute("SELECT 1").fetchone() == (1,)


def test_row_reads_stay_refused(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    for sql in (
        "SELECT * FROM adult ORDER BY 1 LIMIT 5",
        "SELECT a.age FROM adult a JOIN (SELECT COUNT(*) AS n FROM adult) c ON true",
        "WITH adult AS (SELECT 1) SELECT COUNT(*) FROM adult",
    ):
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute(sql)
    with pytest.raises(errors.FeatureNotSupported):
        conn.execute("SELECT age, COUNT(*) FROM adult ORDER BY 2")


def test_tableau_cursor_sequence(
    conn: psycopg.Connection[tuple[object, ...]], truth: dict[str, float]
) -> None:
    cur = conn.cursor()
    cur.execute("BEGIN")
    cur.execute(
        'declare "SQL_CUR0x7f0" cursor with hold for '
        "SELECT sex, COUNT(*) AS n FROM adult GROUP BY sex ORDER BY sex"
    )
    cur.execute('fetch 2048 in "SQL_CUR0x7f0"')
    rows = cur.fetchall()
    cur.execute('close "SQL_CUR0x7f0"')
    cur.execute("COMMIT")
    assert [r[0] for r in rows] == ["Female", "Male"]
    assert close(rows[1][1], truth["Male"])


def test_psycopg_named_cursor(
    conn: psycopg.Connection[tuple[object, ...]], truth: dict[str, float]
) -> None:
    with conn.transaction():
        with conn.cursor(name="chunks") as cur:
            cur.itersize = 1
            cur.execute("SELECT education, COUNT(*) AS n FROM adult GROUP BY 1 ORDER BY 1")
            first = cur.fetchmany(3)
            rest = cur.fetchall()
    assert len(first) == 3 and len(first) + len(rest) == 16


def test_asyncpg_extended_protocol(proxy: Proxy, truth: dict[str, float]) -> None:
    async def run() -> list[asyncpg.Record]:
        conn = await asyncpg.connect(**proxy.kwargs, server_settings={"dp.accuracy": "200"})
        try:
            statement = await conn.prepare(
                'SELECT sex, COUNT(*) AS "COUNT(*)" FROM adult GROUP BY sex '
                'ORDER BY "COUNT(*)" DESC LIMIT 50'
            )
            assert [a.name for a in statement.get_attributes()] == ["sex", "COUNT(*)"]
            return list(await statement.fetch())
        finally:
            await conn.close()

    rows = asyncio.run(run())
    assert [r["sex"] for r in rows] == ["Male", "Female"]
    assert close(rows[0]["COUNT(*)"], truth["Male"])


#: SQL in the shape the tools generate, with the rows expected (sex values, in order).
TOOL_SHAPES = {
    "metabase breakout": (
        'SELECT "public"."adult"."sex" AS "sex", count(*) AS "count" FROM "public"."adult" '
        'GROUP BY "public"."adult"."sex" ORDER BY "public"."adult"."sex" ASC',
        ["Female", "Male"],
    ),
    "metabase nested question": (
        'SELECT "source"."sex" AS "sex", "source"."count" AS "count" FROM (SELECT '
        '"public"."adult"."sex" AS "sex", count(*) AS "count" FROM "public"."adult" '
        'GROUP BY "public"."adult"."sex") AS "source" ORDER BY "source"."count" DESC '
        "LIMIT 1048575",
        ["Male", "Female"],
    ),
    "grafana builder": (
        'SELECT sex AS "metric", COUNT(*) AS "value" FROM adult GROUP BY 1 ORDER BY 1 LIMIT 50',
        ["Female", "Male"],
    ),
}


@pytest.mark.parametrize("driver", ["psycopg", "asyncpg"])
@pytest.mark.parametrize("shape", list(TOOL_SHAPES))
def test_tool_shapes(proxy: Proxy, truth: dict[str, float], shape: str, driver: str) -> None:
    sql, order = TOOL_SHAPES[shape]
    if driver == "psycopg":
        with psycopg.connect(proxy.dsn(), autocommit=True, options="-c dp.accuracy=200") as c:
            rows = [tuple(r) for r in c.execute(sql).fetchall()]
    else:

        async def run() -> list[tuple[object, ...]]:
            conn = await asyncpg.connect(**proxy.kwargs, server_settings={"dp.accuracy": "200"})
            try:
                return [tuple(r) for r in await conn.fetch(sql)]
            finally:
                await conn.close()

        rows = asyncio.run(run())
    assert [r[0] for r in rows] == order
    assert all(close(n, truth[str(s)]) for s, n in rows)


def test_asyncpg_cursor_fetches_a_wrapper_portal_in_chunks(proxy: Proxy) -> None:
    """asyncpg's cursors Execute the portal with a row limit: PortalSuspended, from PostgreSQL."""

    async def run() -> list[list[object]]:
        conn = await asyncpg.connect(**proxy.kwargs, server_settings={"dp.accuracy": "200"})
        try:
            async with conn.transaction():
                cursor = await conn.cursor(
                    "SELECT education, COUNT(*) AS n FROM adult GROUP BY 1 ORDER BY 1"
                )
                return [[r["education"] for r in await cursor.fetch(5)] for _ in range(4)]
        finally:
            await conn.close()

    chunks = asyncio.run(run())
    assert [len(c) for c in chunks] == [5, 5, 5, 1]
    assert chunks[0][0] == "10th"


def test_parameters_in_a_dp_query_with_post_processing(
    conn: psycopg.Connection[tuple[object, ...]], truth: dict[str, float]
) -> None:
    """Metabase's filtered breakout: the filter's value a parameter, ORDER BY around it."""
    sql = (
        'SELECT "public"."adult"."sex" AS "sex", count(*) AS "count" FROM "public"."adult" '
        'WHERE "public"."adult"."income" = %s GROUP BY "public"."adult"."sex" '
        'ORDER BY "count" DESC LIMIT %s'
    )
    for prepare in (False, True):
        rows = conn.execute(sql, (">50K", 10), prepare=prepare).fetchall()
        assert [r[0] for r in rows] == ["Male", "Female"]
        assert close(rows[0][1], truth["rich Male"]) and close(rows[1][1], truth["rich Female"])
    # the same statement with other values: other cores, not the first ones' answers
    rows = conn.execute(sql, ("<=50K", 1), prepare=True).fetchall()
    assert len(rows) == 1 and rows[0][0] == "Male"
    assert close(rows[0][1], truth["Male"] - truth["rich Male"])


def test_asyncpg_parameters_with_post_processing(proxy: Proxy, truth: dict[str, float]) -> None:
    async def run() -> tuple[list[asyncpg.Record], list[str]]:
        conn = await asyncpg.connect(**proxy.kwargs, server_settings={"dp.accuracy": "200"})
        try:
            statement = await conn.prepare(
                "SELECT sex, COUNT(*) AS n FROM adult WHERE income = $1 GROUP BY sex "
                "HAVING COUNT(*) > 0 ORDER BY n DESC"
            )
            types = [t.name for t in statement.get_parameters()]
            return list(await statement.fetch(">50K")), types
        finally:
            await conn.close()

    rows, types = asyncio.run(run())
    assert types == ["text"]
    assert [r["sex"] for r in rows] == ["Male", "Female"]
    assert close(rows[0]["n"], truth["rich Male"])


def test_a_post_processing_parameter_in_binary_without_a_type_is_refused(proxy: Proxy) -> None:
    async def run() -> None:
        conn = await asyncpg.connect(**proxy.kwargs, server_settings={"dp.accuracy": "200"})
        try:
            # asyncpg sends the LIMIT's value in binary, typed as PostgreSQL described it
            await conn.fetch("SELECT sex, COUNT(*) AS n FROM adult GROUP BY sex LIMIT $1", 1)
        finally:
            await conn.close()

    with pytest.raises(asyncpg.FeatureNotSupportedError, match=r"parameter \$1"):
        asyncio.run(run())


@pytest.mark.parametrize("prepare", [False, True], ids=["simple", "extended"])
def test_errors_in_the_post_processing_point_into_the_analysts_sql(
    conn: psycopg.Connection[tuple[object, ...]], prepare: bool
) -> None:
    """PostgreSQL's position counts in the wrapper it ran; psql's caret needs the analyst's."""
    sql = "SELECT sex, COUNT(*) AS n FROM adult GROUP BY sex HAVING COUNT(*) > 'many'"
    with pytest.raises(errors.InvalidTextRepresentation) as raised:
        conn.execute(sql, prepare=prepare)
    assert raised.value.diag.statement_position == str(sql.index("'many'") + 1)
    sql = "SELECT sex, COUNT(*) AS n FROM adult GROUP BY sex ORDER BY nope(sex)"
    with pytest.raises(errors.UndefinedFunction) as raised:
        conn.execute(sql, prepare=prepare)
    assert raised.value.diag.statement_position == str(sql.index("nope") + 1)
    # a word the statement holds twice: no position rather than a wrong one
    sql = (
        "SELECT sex, COUNT(*) AS n FROM adult GROUP BY sex "
        "HAVING sex <> 'many' AND COUNT(*) > 'many'"
    )
    with pytest.raises(errors.InvalidTextRepresentation) as raised:
        conn.execute(sql, prepare=prepare)
    assert raised.value.diag.statement_position is None


def test_error_positions_count_in_the_whole_query_string(
    conn: psycopg.Connection[tuple[object, ...]],
) -> None:
    sql = "SELECT 1; SELECT sex, COUNT(*) AS n FROM adult GROUP BY sex ORDER BY nope(sex)"
    with pytest.raises(errors.UndefinedFunction) as raised:
        conn.execute(sql)
    assert raised.value.diag.statement_position == str(sql.index("nope") + 1)


def test_width_bucket_on_declared_edges(
    conn: psycopg.Connection[tuple[object, ...]], adult_dsn: str
) -> None:
    """A histogram as tools write it: buckets whose edges are the dimension's, decided per cell."""
    sql = (
        "SELECT width_bucket(age, 25, 65, 4) AS bucket, COUNT(*) AS n FROM adult "
        "GROUP BY 1 ORDER BY 1"
    )
    with psycopg.connect(adult_dsn, autocommit=True) as private:
        truth = dict(private.execute(sql).fetchall())  # PostgreSQL's own width_bucket
    rows = conn.execute(sql).fetchall()
    assert [int(b) for b, _ in rows] == sorted(truth) == [0, 1, 2, 3, 4, 5]
    for bucket, n in rows:
        assert close(n, truth[int(bucket)])
    # edges inside a declared bin cannot be decided per cell
    with pytest.raises(errors.FeatureNotSupported, match="splits the bin"):
        conn.execute("SELECT width_bucket(age, 15, 95, 8), COUNT(*) FROM adult GROUP BY 1")
