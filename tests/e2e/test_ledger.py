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
from proxy.storage.provision import BackendRoles

from .conftest import CONFIG, start_proxy, stop_proxy

SQL = "SELECT COUNT(*) FROM adult WHERE income = '>50K' WITH ACCURACY 60"


@pytest.fixture()
def durable(backend: BackendConfig, roles: BackendRoles) -> Iterator[BackendConfig]:
    """A fresh ledger in the analyst database, where analysts read the dp views."""
    schema = f"ledger_{uuid.uuid4().hex[:8]}"
    yield dataclasses.replace(backend, ledger_dsn=roles.analyst_admin_dsn, ledger_schema=schema)
    with psycopg.connect(roles.analyst_admin_dsn, autocommit=True) as conn:
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


def test_budget_and_history_relations(durable: BackendConfig) -> None:
    proxy, thread = start_proxy(CONFIG, durable)
    try:
        _, notice = ask(proxy.dsn(), SQL)
        charged = float(notice.split("budget charged ")[1].split(",")[0])
        with psycopg.connect(proxy.dsn(), autocommit=True) as conn:
            with pytest.raises(psycopg.errors.ConfigurationLimitExceeded):
                conn.execute(SQL.replace("ACCURACY 60", "ACCURACY 0.001"))
            # simple protocol, then extended with a parameter: both reach the views
            (budget,) = conn.execute(
                "SELECT table_name, total, spent, remaining, fresh, combined, history, refused "
                "FROM dp.budget",
                prepare=False,
            ).fetchall()
            assert budget[0] == "public.adult" and budget[1] == 1.0
            assert budget[2] == pytest.approx(charged, rel=1e-5)
            assert budget[3] == pytest.approx(1.0 - charged, rel=1e-5)
            assert budget[4:] == (1, 0, 0, 1)
            rows = conn.execute(
                "SELECT user_name, source, sql_text, budget, half_width, confidence, reusable, "
                "noisy_answer "
                "FROM dp.history WHERE table_name = %s",
                ("public.adult",),
            ).fetchall()
            assert len(rows) == 1
            user, source, sql, alpha, half_width, confidence, reusable, noisy = rows[0]
            assert (user, source, sql, reusable) == ("analyst", "fresh", SQL, True)
            assert alpha == pytest.approx(charged, rel=1e-5)
            assert half_width <= 60 and confidence >= 0.95
            # the pass-through role may only read them (PostgreSQL may complain first that
            # the views are not updatable; either way nothing changes)
            for privilege in ("UPDATE", "DELETE", "INSERT", "TRUNCATE"):
                for view in ("dp.budget", "dp.history"):
                    assert not conn.execute(
                        "SELECT has_table_privilege(%s, %s)", (view, privilege)
                    ).fetchone()[0]
            for statement in (
                "UPDATE dp.history SET noisy_answer = 0",
                "DELETE FROM dp.history",
                "INSERT INTO dp.budget (table_name) VALUES ('x')",
                "CREATE VIEW dp.mine AS SELECT 1",
            ):
                with pytest.raises(psycopg.errors.Error):
                    conn.execute(statement)
            assert conn.execute(
                "SELECT count(*), max(noisy_answer) FROM dp.history"
            ).fetchone() == (
                1,
                noisy,
            )
    finally:
        stop_proxy(proxy, thread)


def test_user_budget(durable: BackendConfig) -> None:
    capped = dataclasses.replace(
        CONFIG, privacy=dataclasses.replace(CONFIG.privacy, user_budget=0.02)
    )
    proxy, thread = start_proxy(capped, durable)
    try:
        with psycopg.connect(proxy.dsn(), autocommit=True) as conn:
            with pytest.raises(psycopg.errors.ConfigurationLimitExceeded) as refused:
                conn.execute(SQL)  # ln(20)/60 = 0.05 > 0.02
            assert 'budget of user "analyst" on table "public.adult"' in str(refused.value)
            assert conn.execute(SQL.replace("ACCURACY 60", "ACCURACY 200")).fetchone()
            assert conn.execute("SELECT refused, fresh FROM dp.budget").fetchone() == (1, 1)
    finally:
        stop_proxy(proxy, thread)
