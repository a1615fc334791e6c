"""The server side of the protocol, byte by byte: start-up, encryption requests, the extended
protocol's ordering and error handling, cancel, shutdown."""

from __future__ import annotations

import socket
import struct
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import psycopg
import pytest

from proxy.config import BackendConfig, Config
from proxy.dp.answering import DpService
from proxy.dp.memo import DpMemo
from proxy.storage.reader import Reader
from proxy.wire import (
    Bind,
    CancelRequest,
    CommandComplete,
    DataRow,
    Describe,
    ErrorResponse,
    Execute,
    Flush,
    GSSENCRequest,
    NegotiateProtocolVersion,
    NoticeResponse,
    ParameterDescription,
    Parse,
    Query,
    ReadyForQuery,
    RowDescription,
    SSLRequest,
    StartupMessage,
    Sync,
    Target,
    TransactionStatus,
)
from sqlmap.cube import Cube
from sqlmap.vector import LinearQuery
from tests.e2e.conftest import CONFIG, Proxy, start_proxy, stop_proxy, with_listen
from tests.e2e.rawclient import RawClient, kinds

DP = "SELECT COUNT(*) FROM adult WITH ACCURACY 100"
GROUPED = "SELECT sex, COUNT(*) FROM adult GROUP BY sex WITH ACCURACY 200"


def fatal(client: RawClient) -> ErrorResponse:
    message = client.read()
    assert isinstance(message, ErrorResponse) and message.fields["S"] == "FATAL", message
    assert client.closed()
    return message


# -- start-up ---------------------------------------------------------------------------------


def test_ssl_and_gssenc_refused_without_certificate(proxy: Proxy) -> None:
    client = RawClient.open(proxy.port)
    client.send_bytes(GSSENCRequest().encode())
    assert client.read_byte() == b"N"
    client.send_bytes(SSLRequest().encode())
    assert client.read_byte() == b"N"
    client.startup()
    client.authenticate("analyst", "analyst")
    messages = client.until_ready()
    names = {m.name for m in messages if hasattr(m, "name") and hasattr(m, "value")}
    assert {
        "client_encoding",
        "DateStyle",
        "standard_conforming_strings",
        "server_version",
    } <= names
    assert "K" in kinds(messages)
    assert messages[-1] == ReadyForQuery(TransactionStatus.IDLE)


def test_bytes_after_ssl_request_are_refused(proxy: Proxy) -> None:
    client = RawClient.open(proxy.port)
    client.send_bytes(SSLRequest().encode() + StartupMessage({"user": "analyst"}).encode())
    # the answer to SSLRequest is N (no certificate); then the pipelined bytes are refused
    assert client.read_byte() in (b"N", b"E")


def test_startup_packet_size_is_capped(proxy: Proxy) -> None:
    client = RawClient.open(proxy.port)
    client.send_bytes(struct.pack("!ii", 20_000, 3 << 16) + b"x" * 100)
    assert fatal(client).sqlstate == "08P01"


def test_negotiate_protocol_version(proxy: Proxy) -> None:
    client = RawClient.open(proxy.port)
    client.startup(params={"_pq_.compression": "on"}, minor=2)
    first = client.read()
    assert first == NegotiateProtocolVersion(3 << 16, ("_pq_.compression",))
    client.close()


@pytest.mark.parametrize(("user", "password"), [("analyst", "wrong"), ("mallory", "analyst")])
def test_wrong_password_and_unknown_user_look_the_same(
    proxy: Proxy, user: str, password: str
) -> None:
    client = RawClient.open(proxy.port)
    client.startup(user)
    with pytest.raises(PermissionError, match=f'password authentication failed for user "{user}"'):
        client.authenticate(user, password)


def test_no_user_and_wrong_database(proxy: Proxy) -> None:
    client = RawClient.open(proxy.port)
    client.send_bytes(StartupMessage({"database": "demo"}).encode())
    assert fatal(client).sqlstate == "28000"
    with pytest.raises(psycopg.OperationalError, match='database "other" does not exist'):
        psycopg.connect(proxy.dsn(database="other"), connect_timeout=10)


def test_unknown_message_type_is_fatal_and_others_carry_on(proxy: Proxy) -> None:
    other = RawClient.connect(proxy.port)
    client = RawClient.connect(proxy.port)
    client.send_bytes(b"?\x00\x00\x00\x04")
    assert fatal(client).sqlstate == "08P01"
    other.send(Query("SELECT 7"))
    assert any(isinstance(m, DataRow) and m.values == (b"7",) for m in other.until_ready())


@pytest.fixture()
def tls_config(tmp_path: Path) -> Config:
    cert, key = tmp_path / "server.crt", tmp_path / "server.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return with_listen(CONFIG, tls_cert=cert, tls_key=key)


def test_tls_when_a_certificate_is_configured(tls_config: Config, backend: BackendConfig) -> None:
    running, thread = start_proxy(tls_config, backend)
    try:
        with psycopg.connect(running.dsn(sslmode="require"), connect_timeout=10) as conn:
            assert conn.info.pgconn.ssl_in_use
            assert conn.execute(DP).fetchone() is not None
        client = RawClient.open(running.port)
        client.send_bytes(
            SSLRequest().encode() + b"junk"
        )  # plaintext smuggled before the handshake
        reply = client.read_byte()
        assert reply == b"E"  # FATAL: received unencrypted data after SSL request
    finally:
        stop_proxy(running, thread)


# -- extended protocol ------------------------------------------------------------------------


def test_mixed_batch_replies_in_order(proxy: Proxy) -> None:
    client = RawClient.connect(proxy.port)
    client.send(
        Parse("dp", DP),
        Parse("pt", "SELECT 42 AS answer"),
        Bind("a", "pt"),
        Bind("b", "dp"),
        Execute("a"),
        Execute("b"),
        Describe(Target.STATEMENT, "dp"),
        Describe(Target.PORTAL, "a"),
        Sync(),
    )
    messages = client.until_ready()
    sequence = kinds([m for m in messages if not isinstance(m, NoticeResponse)])
    assert sequence == "1122" + "DC" + "DC" + "tT" + "T" + "Z", sequence
    rows = [m for m in messages if isinstance(m, DataRow)]
    assert rows[0].values == (b"42",)
    assert float(rows[1].values[0] or b"0") > 0
    describe = [m for m in messages if isinstance(m, RowDescription)]
    assert describe[0].fields[0].name == "count" and describe[0].fields[0].type_oid == 701
    assert describe[1].fields[0].name == "answer"


def test_parse_describe_flush_without_sync(proxy: Proxy) -> None:
    client = RawClient.connect(proxy.port)
    client.send(Parse("s", GROUPED), Describe(Target.STATEMENT, "s"), Flush())
    parse_complete, parameters, rows = client.read(), client.read(), client.read()
    assert kinds([parse_complete, parameters, rows]) == "1tT"
    assert isinstance(parameters, ParameterDescription) and parameters.type_oids == ()
    assert isinstance(rows, RowDescription) and [f.type_oid for f in rows.fields] == [25, 701]
    client.send(Parse("p", "SELECT $1::int + 1"), Describe(Target.STATEMENT, "p"), Flush())
    assert kinds([client.read(), client.read(), client.read()]) == "1tT"
    client.send(Bind("", "s", result_formats=(1,)), Execute(""), Sync())
    messages = [m for m in client.until_ready() if not isinstance(m, NoticeResponse)]
    assert kinds(messages) == "2DDCZ"
    (value,) = struct.unpack("!d", messages[1].values[1] or b"")  # type: ignore[union-attr]
    assert value > 10_000 and messages[1].values[0] == b"Male"  # type: ignore[union-attr]


def test_row_limit_suspends_a_dp_portal(proxy: Proxy) -> None:
    client = RawClient.connect(proxy.port)
    client.send(
        Parse("", GROUPED), Bind("", ""), Execute("", 1), Execute("", 1), Execute("", 1), Sync()
    )
    messages = [m for m in client.until_ready() if not isinstance(m, NoticeResponse)]
    assert kinds(messages) == "12DsDCCZ"
    assert messages[-2] == CommandComplete("SELECT 0")


def test_error_discards_until_sync(proxy: Proxy) -> None:
    client = RawClient.connect(proxy.port)
    client.send(
        Parse("", "SELECT 1/(random() * 0)::int"),
        Bind("", ""),
        Execute(""),
        Parse("x", DP),
        Bind("", "x"),
        Execute(""),
        Sync(),
    )
    messages = client.until_ready()
    assert kinds(messages) == "12EZ", kinds(messages)  # the DP query after the error never ran
    assert isinstance(messages[2], ErrorResponse) and messages[2].sqlstate == "22012"
    client.send(
        Parse("y", "SELECT * FROM adult"), Parse("", "SELECT 2"), Bind("", ""), Execute(""), Sync()
    )
    messages = client.until_ready()
    assert kinds(messages) == "EZ" and messages[0].sqlstate == "42501"  # type: ignore[union-attr]
    client.send(Parse("x", DP), Sync())  # x failed above: the name is free
    assert kinds(client.until_ready()) == "1Z"


def test_local_error_rolls_back_the_batch(proxy: Proxy) -> None:
    client = RawClient.connect(proxy.port)
    client.send(Query("CREATE TEMP TABLE t (x int)"))
    client.until_ready()
    client.send(
        Parse("", "INSERT INTO t VALUES (1)"),
        Bind("", ""),
        Execute(""),
        Parse("", "SELECT COUNT(*) FROM adult WITH ACCURACY 0.0001"),
        Bind("", ""),
        Execute(""),
        Sync(),
    )
    messages = client.until_ready()
    assert kinds(messages) == "12C12EZ" and messages[-2].sqlstate == "53400"  # type: ignore[union-attr]
    client.send(Query("SELECT count(*) FROM t"))
    rows = [m for m in client.until_ready() if isinstance(m, DataRow)]
    assert rows[0].values == (b"0",)  # the INSERT was rolled back with the batch, as in PostgreSQL


def test_dp_statement_parameters_are_checked(proxy: Proxy) -> None:
    client = RawClient.connect(proxy.port)
    client.send(
        Parse("s", "SELECT COUNT(*) FROM adult WHERE age >= $1 WITH ACCURACY 100"),
        Bind("", "s"),
        Sync(),
    )
    messages = client.until_ready()
    assert kinds(messages) == "1EZ" and messages[1].sqlstate == "08P01"  # type: ignore[union-attr]
    client.send(Bind("", "s", (0,), (b"abc",)), Sync())
    messages = client.until_ready()
    assert kinds(messages) == "EZ" and messages[0].sqlstate == "22023"  # type: ignore[union-attr]


def test_function_call_is_refused(proxy: Proxy) -> None:
    client = RawClient.connect(proxy.port)
    client.send_bytes(b"F" + _function_call())
    messages = client.until_ready()
    assert kinds(messages) == "EZ" and messages[0].sqlstate == "0A000"  # type: ignore[union-attr]


def _function_call() -> bytes:
    payload = struct.pack("!Ihhh", 2274, 0, 0, 0)  # pg_stat_get_live_tuples, no args, text result
    return struct.pack("!i", len(payload) + 4) + payload


# -- cancel and shutdown ----------------------------------------------------------------------


class SlowReader(Reader):
    """The real reader, one second slower (so that a cancel can catch it)."""

    async def measure(self, cube: Cube, queries: Sequence[LinearQuery]) -> list[float]:
        import asyncio

        await asyncio.sleep(1.0)
        return await super().measure(cube, queries)


def test_cancel_a_dp_answer(proxy: Proxy) -> None:
    service = DpService(CONFIG.cubes, SlowReader(proxy.server.reader._pool))
    proxy.server.ctx.service = service
    proxy.server.ctx.memo = DpMemo(proxy.server.ctx.router, service)
    client = RawClient.connect(proxy.port)
    session = next(iter(proxy.server.ctx.sessions.values()))
    assert session.key is not None
    client.send(Query(DP))
    time.sleep(0.3)
    canceller = RawClient.open(proxy.port)
    canceller.send_bytes(CancelRequest(session.key.process_id, session.key.secret_key).encode())
    assert canceller.closed()
    messages = client.until_ready()
    assert kinds(messages) == "EZ" and messages[0].sqlstate == "57014"  # type: ignore[union-attr]
    client.send(Query("SELECT 1"))
    assert "D" in kinds(client.until_ready())


def test_cancel_with_a_wrong_key_does_nothing(proxy: Proxy) -> None:
    client = RawClient.connect(proxy.port)
    session = next(iter(proxy.server.ctx.sessions.values()))
    assert session.key is not None
    client.send(Query("SELECT pg_sleep(0.5)"))
    canceller = RawClient.open(proxy.port)
    canceller.send_bytes(CancelRequest(session.key.process_id, b"\x00\x00\x00\x00").encode())
    assert canceller.closed()
    assert "D" in kinds(client.until_ready())


def test_shutdown_closes_idle_sessions_with_57p01(proxy: Proxy) -> None:
    port = proxy.port
    idle = RawClient.connect(proxy.port)
    busy = RawClient.connect(proxy.port)
    busy.send(Query("SELECT pg_sleep(1)"))
    time.sleep(0.2)
    done = threading.Thread(target=lambda: proxy.call(proxy.server.shutdown(10)))
    done.start()
    assert fatal(idle).sqlstate == "57P01"
    messages = busy.until_ready()  # the running statement finishes first
    assert "D" in kinds(messages)
    assert fatal(busy).sqlstate == "57P01"
    done.join(15)
    with pytest.raises(OSError):  # no longer listening
        socket.create_connection(("127.0.0.1", port), timeout=2)
    with pytest.raises(RuntimeError):  # the worker pool is closed: no thread keeps the process
        proxy.call(proxy.server.ctx.service.workers.run(lambda: None))


def test_too_many_connections(proxy: Proxy) -> None:
    proxy.server.ctx.max_connections = 1
    first = RawClient.connect(proxy.port)
    second = RawClient.open(proxy.port)
    second.startup()
    assert fatal(second).sqlstate == "53300"
    first.send(Query("SELECT 1"))
    assert "D" in kinds(first.until_ready())


def test_backend_error_answering_sync_ends_the_error_state(proxy: Proxy) -> None:
    client = RawClient.connect(proxy.port)
    client.send(Describe(Target.STATEMENT, "no_such_statement"), Sync(), Query("SELECT 5"))
    messages = client.until_ready()
    assert kinds(messages) == "EZ" and messages[0].sqlstate == "26000"  # type: ignore[union-attr]
    assert any(isinstance(m, DataRow) and m.values == (b"5",) for m in client.until_ready())


def test_client_gone_mid_query_frees_its_session(proxy: Proxy) -> None:
    client = RawClient.connect(proxy.port)
    client.send(Query("SELECT pg_sleep(0.3)"))
    client.close()
    deadline = time.monotonic() + 5
    while proxy.server.sessions and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not proxy.server.sessions
    with psycopg.connect(proxy.dsn(), connect_timeout=10) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_backend_session_killed(proxy: Proxy, adult_dsn: str) -> None:
    with psycopg.connect(
        proxy.dsn(application_name="victim"), autocommit=True, connect_timeout=10
    ) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        with psycopg.connect(adult_dsn, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = 'victim'"
            )
        time.sleep(0.2)
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
    with psycopg.connect(proxy.dsn(), connect_timeout=10) as other:
        assert other.execute("SELECT 2").fetchone() == (2,)


def test_pipelined_queries_and_large_results(proxy: Proxy) -> None:
    client = RawClient.connect(proxy.port)
    client.send(
        *[Query(f"SELECT {i}") for i in range(50)],
        Query("SELECT repeat('x', 1000000)"),
        Query("SELECT g FROM generate_series(1, 20000) g"),
    )
    for i in range(50):
        rows = [m for m in client.until_ready() if isinstance(m, DataRow)]
        assert rows[0].values == (str(i).encode(),)
    big = [m for m in client.until_ready() if isinstance(m, DataRow)]
    assert len(big[0].values[0] or b"") == 1_000_000
    many = [m for m in client.until_ready() if isinstance(m, DataRow)]
    assert len(many) == 20_000


def test_deallocate_frees_dp_statement_names(proxy: Proxy) -> None:
    client = RawClient.connect(proxy.port)
    client.send(Parse("s", DP), Parse("t", "SELECT 1"), Sync())
    assert kinds(client.until_ready()) == "11Z"
    client.send(Parse("s", DP), Sync())
    messages = client.until_ready()
    assert kinds(messages) == "EZ" and messages[0].sqlstate == "42P05"  # type: ignore[union-attr]
    client.send(Query("DEALLOCATE ALL"))
    client.until_ready()
    client.send(Parse("s", DP), Parse("t", "SELECT 2"), Sync())
    assert kinds(client.until_ready()) == "11Z"
