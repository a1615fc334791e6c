"""psycopg 3 (libpq) through dpproxy: simple and extended protocol, prepared, binary."""

from __future__ import annotations

import time

import psycopg
import pytest
from psycopg import errors

from tests.e2e.conftest import Proxy

DP = "SELECT COUNT(*) FROM adult WHERE age >= 25 WITH ACCURACY 100"
GROUPED = (
    "SELECT sex, COUNT(*) AS n, SUM(CASE WHEN income = '>50K' THEN 1 ELSE 0 END) "
    "FROM adult GROUP BY sex WITH ACCURACY 200"
)


def connect(proxy: Proxy, **kwargs: object) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(proxy.dsn(), autocommit=True, connect_timeout=10, **kwargs)  # type: ignore[arg-type]


def test_simple_protocol_dp_query_and_notice(proxy: Proxy) -> None:
    notices: list[str] = []
    with connect(proxy) as conn:
        conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        cur = conn.cursor()
        cur.execute(DP)  # no parameters: one round trip, text results
        (value,) = cur.fetchone() or ()
        assert cur.description is not None and cur.description[0].name == "count"
    assert isinstance(value, float) and 15_000 < value < 35_000
    assert len(notices) == 1 and "source fresh" in notices[0] and "remaining" in notices[0]


def test_several_statements_in_one_query_string(proxy: Proxy) -> None:
    with connect(proxy) as conn:
        cur = conn.execute("SELECT 1; SELECT COUNT(*) FROM adult WITH ACCURACY 100; SELECT 'x'")
        assert cur.fetchall() == [(1,)]
        assert cur.nextset() and cur.fetchone() is not None
        assert cur.nextset() and cur.fetchall() == [("x",)]


def test_parameterized_dp_query(proxy: Proxy) -> None:
    with connect(proxy) as conn:
        rows = conn.execute(
            "SELECT COUNT(*) FROM adult WHERE age >= %s AND sex = %s WITH ACCURACY 100",
            (25, "Female"),
        ).fetchall()
    assert len(rows) == 1 and 5_000 < rows[0][0] < 15_000


def test_after_the_prepare_threshold_and_binary(proxy: Proxy) -> None:
    with connect(proxy, prepare_threshold=2) as conn:
        values = [conn.execute(GROUPED).fetchall() for _ in range(4)]
        binary = conn.cursor(binary=True).execute(GROUPED).fetchall()
        catalog = [
            conn.execute("SELECT relname FROM pg_class WHERE relname = %s", ("adult",)).fetchone()
            for _ in range(4)
        ]
    assert all(len(rows) == 2 and rows[0][0] == "Male" for rows in values)
    assert values[-2] == values[-1] == binary  # answers from history: the same estimates
    assert catalog == [("adult",)] * 4


def test_catalog_query(proxy: Proxy) -> None:
    with connect(proxy) as conn:
        columns = conn.execute(
            "SELECT attname FROM pg_attribute "
            "WHERE attrelid = 'public.adult'::regclass AND attnum > 0 ORDER BY attnum"
        ).fetchall()
    assert columns[0] == ("age",) and len(columns) == 15


@pytest.mark.parametrize(
    ("sql", "error"),
    [
        ("SELECT * FROM adult", errors.InsufficientPrivilege),
        (
            "SELECT COUNT(*) FROM adult WHERE age >= 30 WITH ACCURACY 100",
            errors.FeatureNotSupported,
        ),
        ("SELECT COUNT(*) FROM adult WITH ACCURACY 0.0001", errors.ConfigurationLimitExceeded),
        ("SELECT COUNT(*) FROM adult WHERE nope = 1 WITH ACCURACY 100", errors.UndefinedColumn),
        ("SELECT COUNT(* FROM adult", errors.SyntaxError),
        ("SET dp.accuracy = -1", errors.InvalidParameterValue),
        ("SHOW dp.nonsense", errors.UndefinedObject),
    ],
)
@pytest.mark.parametrize("prepared", [False, True])
def test_refusals_carry_their_sqlstate(
    proxy: Proxy, sql: str, error: type[Exception], prepared: bool
) -> None:
    with connect(proxy) as conn:
        with pytest.raises(error):
            conn.execute(sql, prepare=prepared)
        assert conn.execute("SELECT 1").fetchone() == (1,)  # the session goes on


def test_settings_in_the_extended_protocol(proxy: Proxy) -> None:
    with connect(proxy) as conn:
        conn.execute("SET dp.accuracy = 321", prepare=True)
        assert conn.execute("SHOW dp.accuracy", prepare=True).fetchone() == ("321",)
        conn.execute("SELECT COUNT(*) FROM adult").fetchone()  # uses the session's accuracy


def test_a_typo_in_a_closed_dimension_value_is_answered_with_a_warning(proxy: Proxy) -> None:
    notices: list[str] = []
    with connect(proxy) as conn:
        conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        row = conn.execute(
            "SELECT COUNT(*) FROM adult WHERE sex = 'Femal' WITH ACCURACY 100"
        ).fetchone()
    assert row == (0.0,)
    assert notices[0] == (
        "dp: warning: 'Femal' is not a declared value of sex, which is closed: no row holds it; "
        "did you mean 'Female'?"
    )


def test_notices_one_per_statement_or_per_row(proxy: Proxy) -> None:
    notices: list[str] = []
    sql = "SELECT education, COUNT(*) FROM adult GROUP BY education WITH ACCURACY 300"
    with connect(proxy) as conn:
        conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        assert conn.execute("SHOW dp.notices").fetchone() == ("summary",)
        assert len(conn.execute(sql).fetchall()) == 16
        (summary,) = notices
        assert summary.startswith("dp: 16 values from public.adult, each within")
        assert "remaining" in summary and "for the most-charged cell" in summary
        notices.clear()
        conn.execute("SET dp.notices = rows")
        conn.execute(sql).fetchall()
        assert len(notices) == 16 and all("[education=" in n for n in notices)
        with pytest.raises(errors.InvalidParameterValue):
            conn.execute("SET dp.notices = loud")


def test_reset_returns_to_the_value_given_at_connection(proxy: Proxy) -> None:
    with psycopg.connect(proxy.dsn(options="-c%20dp.accuracy%3D77"), autocommit=True) as conn:
        assert conn.execute("SHOW dp.accuracy").fetchone() == ("77",)
        conn.execute("SET dp.accuracy = 5")
        conn.execute("RESET dp.accuracy")
        assert conn.execute("SHOW dp.accuracy").fetchone() == ("77",)
        conn.execute("SET dp.accuracy = 5")
        conn.execute("SET dp.accuracy TO DEFAULT")
        assert conn.execute("SHOW dp.accuracy").fetchone() == ("77",)
        conn.execute("RESET dp.confidence")  # none given at connection: the config's default
        assert conn.execute("SHOW dp.confidence").fetchone() == ("0.95",)


def test_a_normal_disconnect_is_logged(proxy: Proxy) -> None:
    closed = "event=session_closed user=analyst"
    before = proxy.log.getvalue().count(closed)
    with psycopg.connect(proxy.dsn(), autocommit=True) as conn:
        conn.execute("SELECT 1")
    # the proxy logs after the client's Terminate; give its loop a moment
    deadline = time.monotonic() + 10
    while proxy.log.getvalue().count(closed) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proxy.log.getvalue().count(closed) == before + 1, proxy.log.getvalue()[-2000:]


def test_transactions_report_status(proxy: Proxy) -> None:
    with psycopg.connect(
        proxy.dsn(), connect_timeout=10
    ) as conn:  # not autocommit: BEGIN implicitly
        conn.execute("CREATE TEMP TABLE t (x int)")
        conn.execute("INSERT INTO t VALUES (1)")
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        conn.execute(DP)
        with pytest.raises(errors.ConfigurationLimitExceeded):
            conn.execute("SELECT COUNT(*) FROM adult WITH ACCURACY 0.0001")
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
        with pytest.raises(errors.InFailedSqlTransaction):
            conn.execute(DP)
        conn.rollback()
        assert conn.execute("SELECT 2").fetchone() == (2,)


def test_cancel_a_running_statement(proxy: Proxy) -> None:
    import threading

    with connect(proxy) as conn:
        # cancel_safe: the blocking cancel() holds the GIL in libpq, which would stall the
        # in-process proxy that has to answer it
        timer = threading.Timer(0.5, conn.cancel_safe)
        timer.start()
        with pytest.raises(errors.QueryCanceled):
            conn.execute("SELECT pg_sleep(20)")
        timer.join()
        assert conn.execute("SELECT 3").fetchone() == (3,)


def test_explain_without_parameters(proxy: Proxy) -> None:
    with connect(proxy) as conn:
        plan = conn.execute("EXPLAIN SELECT COUNT(*) FROM adult WITH ACCURACY 333").fetchall()
        assert plan[0] == ("DP plan for public.adult (EXPLAIN spends nothing)",)
        with pytest.raises(errors.FeatureNotSupported):  # the extended protocol: no preview
            conn.execute("EXPLAIN SELECT COUNT(*) FROM adult WITH ACCURACY 333", prepare=True)
