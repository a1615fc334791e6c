"""No statement stalls others, no error tells about data, and bad numbers leave the session alive.

Issue 16: each case runs through a real dpproxy in front of the real PostgreSQL.
"""

from __future__ import annotations

import math
import re
import statistics
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import replace

import psycopg
import pytest
import yaml

from proxy.config import Config, parse_config
from proxy.wire import BackendMessage, Bind, ErrorResponse, Execute, Parse, Query, Sync
from tests.e2e.conftest import CONFIG, ROOT, Proxy
from tests.e2e.rawclient import RawClient, kinds


def connect(proxy: Proxy) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(proxy.dsn(), autocommit=True, connect_timeout=10)


def sqlstate_of(
    conn: psycopg.Connection[tuple[object, ...]],
    sql: str,
    params: tuple[object, ...] | None = None,
    prepare: bool = False,
) -> str:
    """The SQLSTATE the statement fails with; the same connection must then answer SELECT 1."""
    with pytest.raises(psycopg.Error) as raised:
        conn.execute(sql, params, prepare=prepare)
    assert conn.execute("SELECT 1").fetchone() == (1,)
    assert raised.value.sqlstate is not None
    return raised.value.sqlstate


@pytest.mark.parametrize("prepare", [False, True], ids=["simple", "extended"])
@pytest.mark.parametrize(
    ("sql", "sqlstate"),
    [
        ("SELECT SUM(CASE WHEN sex='Male' THEN 1e400 ELSE 0 END) FROM adult", "22003"),
        ("SELECT COUNT(*) + 1e400 FROM adult", "22003"),
        ("SELECT 1e300*1e300*COUNT(*) FROM adult", "22003"),
        ("SELECT SUM(CASE WHEN sex='Male' THEN 1e308 ELSE 0 END) FROM adult", "22023"),
        ("SELECT COUNT(*) FROM adult WITH ACCURACY 1e400", "22023"),
        ("SELECT COUNT(*) FROM adult WITH ACCURACY 0", "22023"),
        ("SELECT COUNT(*) FROM adult WITH ACCURACY -1", "22023"),
        ("SELECT COUNT(*) FROM adult WITH ACCURACY 100 CONFIDENCE 1", "22023"),
        ("SELECT COUNT(*) FROM adult WITH ACCURACY 100 CONFIDENCE 1e-300", "22023"),
    ],
)
def test_numeric_edge_cases_leave_the_session_alive(
    proxy: Proxy, sql: str, sqlstate: str, prepare: bool
) -> None:
    with connect(proxy) as conn:
        assert sqlstate_of(conn, sql, prepare=prepare) == sqlstate


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 1e308])
@pytest.mark.parametrize("placeholder", ["%t", "%b"], ids=["text", "binary"])
def test_nan_infinity_and_huge_parameters(proxy: Proxy, value: float, placeholder: str) -> None:
    with connect(proxy) as conn:
        weighted = f"SELECT SUM(CASE WHEN sex = 'Male' THEN {placeholder} ELSE 0 END) FROM adult"
        assert sqlstate_of(conn, weighted, (value,)) == "22023"
        if not math.isfinite(value):  # (no one is 1e308 years old: a valid query)
            compared = f"SELECT COUNT(*) FROM adult WHERE age >= {placeholder}"
            assert sqlstate_of(conn, compared, (value,)) == "22023"


def test_absurd_accuracy_is_refused_at_once(proxy: Proxy) -> None:
    with connect(proxy) as conn:
        started = time.monotonic()
        assert sqlstate_of(conn, "SELECT COUNT(*) FROM adult WITH ACCURACY 1e30") == "22023"
        assert (
            sqlstate_of(
                conn,
                "SELECT sex, COUNT(*) FROM adult GROUP BY sex WITH ACCURACY 1e30 CONFIDENCE 0.99",
            )
            == "22023"
        )
        conn.execute("SET dp.accuracy = 1e30")
        assert sqlstate_of(conn, "SELECT COUNT(*) FROM adult") == "22023"
        assert time.monotonic() - started < 5  # refused before the engine plans anything


def test_batch_over_the_limit_is_refused_with_a_hint(proxy: Proxy) -> None:
    sql = (
        "SELECT sex, race, income, education, COUNT(*), COUNT(*) FILTER (WHERE age < 25), "
        "COUNT(*) FILTER (WHERE age >= 65), COUNT(*) FILTER (WHERE hours_per_week < 35) "
        "FROM adult GROUP BY sex, race, income, education"
    )
    with connect(proxy) as conn:
        with pytest.raises(psycopg.errors.ProgramLimitExceeded) as raised:
            conn.execute(sql)
        assert (
            raised.value.diag.message_hint and "limits.max_values" in raised.value.diag.message_hint
        )
        assert conn.execute("SELECT 1").fetchone() == (1,)


def with_limits(config: Config, **changes: object) -> Config:
    return replace(config, limits=replace(config.limits, **changes))


class TestPlanningTimeLimit:
    @pytest.fixture()
    def proxy_config(self) -> Config:
        return with_limits(CONFIG, planning_timeout=0.001)

    def test_expiry_cancels_the_statement_not_the_session(self, proxy: Proxy) -> None:
        with connect(proxy) as conn:
            with pytest.raises(psycopg.errors.QueryCanceled) as raised:
                conn.execute("SELECT sex, race, COUNT(*) FROM adult GROUP BY sex, race")
            assert "planning time limit" in str(raised.value)
            assert conn.execute("SELECT 1").fetchone() == (1,)
            assert sqlstate_of(conn, "SELECT COUNT(*) FROM adult", prepare=True) == "57014"


class TestDomainViolation:
    """A closed dimension that does not cover the data: race declared with two of its values."""

    @pytest.fixture()
    def proxy_config(self) -> Config:
        data = yaml.safe_load((ROOT / "config.yaml").read_text())
        data["tables"]["adult"]["dimensions"]["race"]["values"] = ["White", "Black"]
        config = parse_config(data, str(ROOT / "config.yaml"))
        return replace(config, listen=CONFIG.listen)

    def test_error_has_no_count_and_the_log_has_it(self, proxy: Proxy, adult_dsn: str) -> None:
        with connect(proxy) as conn:
            for _ in range(2):
                with pytest.raises(psycopg.errors.CheckViolation) as raised:
                    conn.execute("SELECT COUNT(*) FROM adult WITH ACCURACY 100")
                diag = raised.value.diag
                said = " ".join(
                    filter(None, [diag.message_primary, diag.message_detail, diag.message_hint])
                )
                assert "adult" in said and "race" in said
                assert not re.search(r"\d", said), said
                assert conn.execute("SELECT 1").fetchone() == (1,)
        with psycopg.connect(adult_dsn) as admin:
            (outside,) = admin.execute(
                "SELECT count(*) FROM adult WHERE race NOT IN ('White', 'Black')"
            ).fetchone() or (0,)
        assert outside > 0 and f"rows={outside}" in proxy.log.getvalue()


def error_code(messages: list[BackendMessage]) -> str:
    errors = [m for m in messages if isinstance(m, ErrorResponse)]
    assert len(errors) == 1, messages
    return errors[0].sqlstate


def test_statement_over_the_size_limit_is_refused_and_the_session_goes_on(proxy: Proxy) -> None:
    client = RawClient.connect(proxy.port)
    comment = "/*" + "x" * (2 << 20) + "*/ SELECT COUNT(*) FROM adult"
    client.send(Query(comment))
    replies = client.until_ready()
    assert kinds(replies) == "EZ" and error_code(replies) == "54000"
    client.send(Query("SELECT 1"))
    assert kinds(client.until_ready()) == "TDCZ"
    # in the extended protocol: an error, the rest of the batch skipped until Sync
    client.send(Parse("", comment), Bind("", ""), Execute(""), Sync())
    replies = client.until_ready()
    assert kinds(replies) == "EZ" and error_code(replies) == "54000"
    client.send(Parse("", "SELECT 1"), Bind("", ""), Execute(""), Sync())
    assert kinds(client.until_ready()) == "12DCZ"


def test_pipelined_messages_without_sync_are_answered_as_they_go(proxy: Proxy) -> None:
    """10,000 Parse messages and no Sync: the proxy keeps at most a bounded batch of them.

    Past ``limits.max_pipeline_messages`` it hands the backend's replies to the client, so
    ParseComplete arrives before any Sync; without backpressure nothing would arrive.
    """
    count, limit = 10_000, CONFIG.limits.max_pipeline_messages
    client = RawClient.connect(proxy.port)
    client.send(*[Parse("", "SELECT 1")] * count)
    early = [client.read() for _ in range(count - limit)]
    assert kinds(early) == "1" * (count - limit)
    client.send(Sync())
    rest = client.until_ready()
    assert kinds(rest) == "1" * limit + "Z"


# -- another session's pass-through latency while one session misbehaves ----------------------

#: The largest GROUP BY the default limits allow: every categorical dimension (2 * 5 * 2 * 16
#: = 320 groups) times three aggregates = 960 values, under limits.max_values (1000).
LARGEST_GROUP_BY = (
    "SELECT sex, race, income, education, COUNT(*), COUNT(*) FILTER (WHERE age < 25), "
    "COUNT(*) FILTER (WHERE hours_per_week >= 41) FROM adult "
    "GROUP BY sex, race, income, education WITH ACCURACY 400"
)
PINGS = 60  # round trips measured per case, at least
P95_BOUND = 0.050  # seconds: the acceptance bound of issue 16


def largest_group_by(proxy: Proxy) -> str:
    with connect(proxy) as conn:
        try:
            rows = conn.execute(LARGEST_GROUP_BY).fetchall()
        except psycopg.errors.QueryCanceled:  # over the planning time limit on a slow machine
            return "57014"
        assert len(rows) == 320
        return "rows"


def allowed_comment(proxy: Proxy) -> str:
    """A statement just under the size limit that must be parsed (it names the table)."""
    with connect(proxy) as conn:
        padding = "adult " * ((CONFIG.limits.max_statement_bytes - 200) // 6)
        sql = f"/* {padding} */ SELECT COUNT(*) FROM adult WITH ACCURACY 100"
        return "rows" if conn.execute(sql).fetchall() else "none"


def two_megabyte_comment(proxy: Proxy) -> str:
    client = RawClient.connect(proxy.port)
    client.send(Query("/*" + "adult " * ((2 << 20) // 6) + "*/ SELECT COUNT(*) FROM adult"))
    replies = client.until_ready()
    client.close()
    return error_code(replies)


def absurd_accuracy(proxy: Proxy) -> str:
    with connect(proxy) as conn:
        return sqlstate_of(conn, "SELECT COUNT(*) FROM adult GROUP BY sex WITH ACCURACY 1e30")


def pipelined_parses(proxy: Proxy) -> str:
    client = RawClient.connect(proxy.port)
    client.send(*[Parse("", "SELECT COUNT(*) FROM adult WITH ACCURACY 100")] * 10_000, Sync())
    replies = client.until_ready()
    client.close()
    return kinds(replies[-2:])


def huge_query(proxy: Proxy) -> str:
    """A Query message of 256 MiB, streamed in 1 MiB chunks."""
    size, chunk = 256 << 20, b"x" * (1 << 20)
    client = RawClient.connect(proxy.port)
    client.send_bytes(b"Q" + struct.pack("!i", size + 4 + 1))
    for _ in range(size // len(chunk)):
        client.send_bytes(chunk)
    client.send_bytes(b"\x00")
    replies = client.until_ready()
    client.close()
    return error_code(replies)


def ping_while(proxy: Proxy, action: Callable[[Proxy], str]) -> tuple[list[float], list[str]]:
    """Round trips of SELECT 1 on another session, for as long as ``action`` runs.

    The action runs again and again until ``PINGS`` round trips have been measured, then
    finishes its current run while the pings go on.
    """
    outcomes: list[str] = []
    failures: list[BaseException] = []
    enough = threading.Event()

    def repeat() -> None:
        try:
            while not enough.is_set():
                outcomes.append(action(proxy))
        except BaseException as e:  # reported below
            failures.append(e)

    latencies = []
    with connect(proxy) as conn:
        conn.execute("SELECT 1")
        worker = threading.Thread(target=repeat, daemon=True)
        worker.start()
        try:
            while worker.is_alive():
                started = time.perf_counter()
                assert conn.execute("SELECT 1").fetchone() == (1,)
                latencies.append(time.perf_counter() - started)
                if len(latencies) >= PINGS:
                    enough.set()
                time.sleep(0.005)
        finally:
            enough.set()
            worker.join(120)
    if failures:
        raise failures[0]
    return latencies, outcomes


@pytest.mark.parametrize(
    ("action", "expected"),
    [
        (largest_group_by, {"rows", "57014"}),
        (allowed_comment, {"rows"}),
        (two_megabyte_comment, {"54000"}),
        (absurd_accuracy, {"22023"}),
        (pipelined_parses, {"1Z"}),
        (huge_query, {"54000"}),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_other_sessions_keep_answering(
    proxy: Proxy, action: Callable[[Proxy], str], expected: set[str]
) -> None:
    latencies, outcomes = ping_while(proxy, action)
    assert set(outcomes) <= expected, outcomes
    p95 = statistics.quantiles(latencies, n=20)[-1]
    print(
        f"{action.__name__}: {len(latencies)} pings, p95 {p95 * 1000:.1f} ms, "
        f"max {max(latencies) * 1000:.1f} ms, {len(outcomes)} runs"
    )
    assert p95 < P95_BOUND, sorted(latencies)[-10:]
