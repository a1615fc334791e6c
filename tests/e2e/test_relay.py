"""The pass-through fast relay, on both event loops: how client bytes arrive must not matter.

A Query that arrives alone in one read goes straight to the backend (`Session._relay_whole`);
split, pipelined or mixed with other messages, it goes through the buffer (`Session._pump`) or
the session's task. Either way each statement is routed first, and replies come back whole and
in order.
"""

from __future__ import annotations

import time

import pytest

from proxy.config import Config
from proxy.wire import CommandComplete, DataRow, ErrorResponse, Query, ReadyForQuery, Terminate
from tests.e2e.conftest import CONFIG, Proxy, with_listen
from tests.e2e.rawclient import RawClient, kinds

DP = "SELECT COUNT(*) FROM adult WITH ACCURACY 100"


@pytest.fixture(params=["asyncio", "uvloop"])
def proxy_config(request: pytest.FixtureRequest) -> Config:
    return with_listen(CONFIG, event_loop=request.param)


def values(messages: list[object]) -> list[tuple[bytes | None, ...]]:
    return [m.values for m in messages if isinstance(m, DataRow)]


def test_listening_event_names_the_loop(proxy: Proxy, proxy_config: Config) -> None:
    assert f"event_loop={proxy_config.listen.event_loop}" in proxy.log.getvalue()


def test_one_query_per_read(proxy: Proxy) -> None:
    client = RawClient.connect(proxy.port)
    for i in range(200):
        client.send(Query(f"SELECT {i}, 'x' || {i}"))
        reply = client.until_ready()
        assert kinds(reply) == "TDCZ"
        assert values(reply) == [(str(i).encode(), f"x{i}".encode())]


def test_a_query_split_across_reads(proxy: Proxy) -> None:
    client = RawClient.connect(proxy.port)
    frame = Query("SELECT 'split', 42").encode()
    for cut in (1, 4, 5, 6, len(frame) - 1):
        client.send_bytes(frame[:cut])
        time.sleep(0.05)
        client.send_bytes(frame[cut:])
        assert values(client.until_ready()) == [(b"split", b"42")]


def test_queries_and_other_messages_in_one_read(proxy: Proxy) -> None:
    client = RawClient.connect(proxy.port)
    client.send(Query("SELECT 1"), Query(DP), Query("SELECT 3"), Query("SELECT * FROM adult"))
    assert values(client.until_ready()) == [(b"1",)]
    assert len(values(client.until_ready())) == 1  # the DP answer, from the session's task
    assert values(client.until_ready()) == [(b"3",)]
    refused = client.until_ready()
    assert kinds(refused) == "EZ" and refused[0].sqlstate == "42501"  # type: ignore[union-attr]
    client.send(Query("SELECT 5"))
    assert values(client.until_ready()) == [(b"5",)]
    client.send(Query("SELECT 6"), Terminate())
    assert values(client.until_ready()) == [(b"6",)]
    assert client.closed()


def test_a_whole_read_that_is_not_plainly_pass_through(proxy: Proxy) -> None:
    client = RawClient.connect(proxy.port)
    for sql in ("SELECT * FROM adult", "SET ROLE dpproxy_reader", "DO $$ BEGIN END $$"):
        client.send(Query(sql))
        reply = client.until_ready()
        assert isinstance(reply[0], ErrorResponse) and reply[0].sqlstate == "42501", reply
    client.send(Query(DP))
    reply = client.until_ready()
    assert len(values(reply)) == 1 and isinstance(reply[-1], ReadyForQuery)
    client.send(Query("SELECT 7"))
    assert values(client.until_ready()) == [(b"7",)]


def test_transaction_status_follows_the_relayed_queries(proxy: Proxy) -> None:
    client = RawClient.connect(proxy.port)
    for sql, status in [("BEGIN", "T"), ("SELECT 1/0", "E"), ("ROLLBACK", "I")]:
        client.send(Query(sql))
        reply = client.until_ready()
        assert isinstance(reply[-1], ReadyForQuery) and reply[-1].status == status, reply


def test_large_result_in_many_reads(proxy: Proxy) -> None:
    client = RawClient.connect(proxy.port)
    client.send(Query("SELECT g, repeat('y', 100) FROM generate_series(1, 30000) g"))
    reply = client.until_ready()
    rows = values(reply)
    assert len(rows) == 30_000 and rows[-1] == (b"30000", b"y" * 100)
    assert isinstance(reply[-2], CommandComplete) and reply[-2].tag == "SELECT 30000"
