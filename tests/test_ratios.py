"""Ratios and AVG end to end below the wire: translator, ratio rounds, engine, real backend."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from proxy.config import load_config
from proxy.dp.answering import DpResult, DpService
from proxy.engine.history import InMemoryHistoryStore
from proxy.storage.provision import provision_roles
from proxy.storage.reader import Reader

CONFIG = load_config(Path(__file__).parent.parent / "config.yaml")
TRANSLATOR = CONFIG.translator()


@pytest.fixture()
def run(adult_dsn: str) -> Iterator[tuple[asyncio.AbstractEventLoop, DpService]]:
    roles = provision_roles(adult_dsn, CONFIG.cubes)
    loop = asyncio.new_event_loop()
    reader = loop.run_until_complete(Reader.connect(roles.reader_dsn))
    yield loop, DpService(CONFIG.cubes, InMemoryHistoryStore(), reader)
    loop.run_until_complete(reader.close())
    loop.close()


def answer(run: tuple[asyncio.AbstractEventLoop, DpService], sql: str) -> DpResult:
    loop, service = run
    return loop.run_until_complete(service.answer(TRANSLATOR.translate(sql)))


def truth(dsn: str, sql: str) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(sql).fetchall()


def test_percentage_with_its_interval(
    run: tuple[asyncio.AbstractEventLoop, DpService], adult_dsn: str
) -> None:
    result = answer(
        run,
        "SELECT 100.0 * COUNT(*) FILTER (WHERE income = '>50K') / COUNT(*) AS pct, "
        "DP_INTERVAL_LOW(100.0 * COUNT(*) FILTER (WHERE income = '>50K') / COUNT(*)), "
        "DP_INTERVAL_HIGH(100.0 * COUNT(*) FILTER (WHERE income = '>50K') / COUNT(*)) "
        "FROM adult WITH ACCURACY 1 CONFIDENCE 0.95",
    )
    ((pct, low, high),) = result.rows
    ((expected,),) = truth(
        adult_dsn, "SELECT 100.0 * COUNT(*) FILTER (WHERE income = '>50K') / COUNT(*) FROM adult"
    )
    print(result.rows, expected, result.notices, result.replies)
    assert isinstance(pct, float) and isinstance(low, float) and isinstance(high, float)
    assert low <= pct <= high and high - low <= 2.0 + 1e-9
    assert low <= float(expected) <= high
