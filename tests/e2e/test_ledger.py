"""The durable ledger behind a running dpproxy: restarts keep history; analysts cannot read it."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from proxy.cli import main
from proxy.config import BackendConfig

from .conftest import CONFIG, start_proxy, stop_proxy

SQL = "SELECT COUNT(*) FROM adult WHERE income = '>50K' WITH ACCURACY 60"


@pytest.fixture()
def durable(backend: BackendConfig, adult_dsn: str) -> Iterator[BackendConfig]:
    schema = f"ledger_{uuid.uuid4().hex[:8]}"
    yield dataclasses.replace(backend, ledger_dsn=adult_dsn, ledger_schema=schema)
    with psycopg.connect(adult_dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def ask(dsn: str, sql: str) -> tuple[float, str]:
    notices: list[str] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        row = conn.execute(sql).fetchone()
    assert row is not None and len(notices) == 1
    return float(row[0]), notices[0]


def test_answers_stay_free_across_a_restart(durable: BackendConfig) -> None:
    proxy, thread = start_proxy(CONFIG, durable)
    try:
        estimate, notice = ask(proxy.dsn(), SQL)
        assert "source fresh" in notice
    finally:
        stop_proxy(proxy, thread)
    proxy, thread = start_proxy(CONFIG, durable)  # a new process would load the same ledger
    try:
        again, notice = ask(proxy.dsn(), SQL)
        assert "source history" in notice and "budget charged 0," in notice
        assert again == pytest.approx(estimate, rel=1e-9)
    finally:
        stop_proxy(proxy, thread)


def test_analysts_cannot_read_or_write_the_ledger(durable: BackendConfig) -> None:
    proxy, thread = start_proxy(CONFIG, durable)
    try:
        ask(proxy.dsn(), SQL)
        schema = durable.ledger_schema
        for sql in (
            f"SELECT * FROM {schema}.measurements",
            f"SELECT count(*) FROM {schema}.answers",
            f"DELETE FROM {schema}.measurements",
            f"UPDATE {schema}.tables SET carried = '0'",
        ):
            with psycopg.connect(proxy.dsn(), autocommit=True) as conn:
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(sql)
    finally:
        stop_proxy(proxy, thread)


def test_ledger_command(
    durable: BackendConfig, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    proxy, thread = start_proxy(CONFIG, durable)
    try:
        ask(proxy.dsn(), SQL)
        ask(proxy.dsn(), SQL)
    finally:
        stop_proxy(proxy, thread)
    config = tmp_path / "config.yaml"
    config.write_text(
        (Path(CONFIG.source).read_text()) + f"\nledger:\n  schema: {durable.ledger_schema}\n"
    )
    dsn = durable.ledger_dsn
    assert dsn is not None
    assert main(["--config", str(config), "ledger", "--dsn", dsn, "status"]) == 0
    out = capsys.readouterr().out
    assert (
        "public.adult: spent" in out and "answers fresh 1, combined 0, history 1, refused 0" in out
    )
    assert main(["--config", str(config), "ledger", "--dsn", dsn, "history", "--limit", "5"]) == 0
    assert SQL in capsys.readouterr().out
    assert main(["--config", str(config), "ledger", "--dsn", dsn, "mark-changed", "adult"]) == 0
    assert "data version 2" in capsys.readouterr().out
