"""No statement stalls others, no error tells about data, and bad numbers leave the session alive.

Issue 16: each case runs through a real dpproxy in front of the real PostgreSQL.
"""

from __future__ import annotations

import math
import re
import statistics
import time
from dataclasses import replace

import psycopg
import pytest
import yaml

from proxy.config import Config, parse_config
from proxy.wire import BackendMessage, Bind, ErrorResponse, Execute, Parse, Query, Sync
from tests.e2e.conftest import CONFIG, ROOT, Proxy
from tests.e2e.dos_client import ping_while
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
        # a nanosecond: no plan, however fast the engine gets, ends before the loop's next turn
        return with_limits(CONFIG, planning_timeout=1e-9)

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
                    conn.execute("SELECT race, COUNT(*) FROM adult GROUP BY race WITH ACCURACY 100")
                diag = raised.value.diag
                said = " ".join(
                    filter(None, [diag.message_primary, diag.message_detail, diag.message_hint])
                )
                assert "adult" in said and "race" in said
                assert not re.search(r"\d", said), said
                assert conn.execute("SELECT 1").fetchone() == (1,)
            # a query that does not read race does not depend on the broken promise
            assert conn.execute("SELECT COUNT(*) FROM adult WITH ACCURACY 100").fetchone()
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

PINGS = 60  # round trips measured per case, at least
P95_BOUND = 0.050  # seconds: the acceptance bound of issue 16
ATTEMPTS = 3  # other jobs on a busy 2-core machine come in bursts: the best of three counts


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("idle", set()),
        ("largest_group_by", {"160 rows", "57014"}),
        ("parsed_megabyte", {"1 rows"}),
        ("comment_2mb", {"54000"}),
        ("accuracy_1e30", {"22023 at once"}),
        ("pipelined_parses", {"1Z"}),
        ("query_256mib", {"54000"}),
    ],
)
def test_other_sessions_keep_answering(proxy: Proxy, case: str, expected: set[str]) -> None:
    p95s = []
    for _ in range(ATTEMPTS):
        latencies, outcomes = ping_while(proxy.dsn(), None if case == "idle" else case, PINGS)
        assert set(outcomes) <= expected and bool(outcomes) == bool(expected), outcomes
        p95s.append(statistics.quantiles(latencies, n=20)[-1])
        print(
            f"{case}: {len(latencies)} pings, p95 {p95s[-1] * 1000:.1f} ms, "
            f"max {max(latencies) * 1000:.1f} ms, {len(outcomes)} runs"
        )
        if p95s[-1] < P95_BOUND:
            break
    assert min(p95s) < P95_BOUND, p95s
