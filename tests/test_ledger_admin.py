"""The DBA's ledger commands against a real ledger: status, mark-changed, rekey, history, export."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from proxy.cli import main
from proxy.config import load_config
from proxy.dp.answering import DpService
from proxy.errors import ConfigError
from proxy.storage import ledger_admin
from proxy.storage.postgres_ledger import PostgresLedgerStore
from proxy.storage.provision import BackendRoles
from proxy.storage.reader import Reader
from sqlmap.cube import CategoricalDimension, Cube
from sqlmap.translate import Translator

CONFIG = load_config(Path(__file__).parent.parent / "config.yaml")
(CUBE,) = CONFIG.cubes
SQL = "SELECT COUNT(*) FROM adult WHERE sex = 'Female' WITH ACCURACY 40"


async def ask(
    dsn: str, roles: BackendRoles, ledger_schema: str, cube: Cube, sql: str
) -> tuple[str, DpService]:
    ledger = await PostgresLedgerStore.open(dsn, [cube], ledger_schema)
    reader = await Reader.connect(roles.reader_dsn)
    try:
        service = await DpService.open_durable([cube], reader, ledger)
        result = await service.answer(
            Translator([cube], CONFIG.privacy.defaults).translate(sql), "analyst", sql
        )
        return result.replies[0].source, service
    finally:
        await ledger.close()
        await reader.close()


def test_status_mark_changed_history_export(
    pg_dsn: str, roles: BackendRoles, ledger_schema: str
) -> None:
    async def run() -> None:
        source, service = await ask(pg_dsn, roles, ledger_schema, CUBE, SQL)
        assert source == "fresh"
        spent = service.engine(CUBE).budget.spent
        assert (await ask(pg_dsn, roles, ledger_schema, CUBE, SQL))[0] == "history"

        (before,) = await ledger_admin.status(pg_dsn, [CUBE], ledger_schema)
        assert (before.spent, before.fresh, before.history, before.data_version) == (spent, 1, 1, 1)
        assert before.remaining == before.total - spent

        assert await ledger_admin.mark_changed(pg_dsn, CUBE.qualified_name, ledger_schema) == 2
        source, service = await ask(pg_dsn, roles, ledger_schema, CUBE, SQL)
        assert source == "fresh"  # the old answer describes old data: not reused
        assert service.engine(CUBE).budget.spent == 2 * spent  # but its budget stays spent

        rows = await ledger_admin.history(pg_dsn, ledger_schema, limit=10)
        assert [r["source"] for r in rows] == ["fresh", "history", "fresh"]
        assert rows[0]["user_name"] == "analyst" and rows[0]["sql_text"] == SQL
        lines = [json.loads(line) async for line in ledger_admin.export(pg_dsn, ledger_schema)]
        assert [line["kind"] for line in lines].count("measurement") == 2
        assert [line["kind"] for line in lines].count("answer") == 3

    asyncio.run(run())


def test_rekey_carries_the_spent_budget(
    pg_dsn: str, roles: BackendRoles, ledger_schema: str
) -> None:
    narrower = Cube(
        CUBE.schema,
        CUBE.table,
        (CategoricalDimension("sex", ("Male", "Female"), closed=True, nullable=False),),
        1.0,
    )

    async def run() -> None:
        _, service = await ask(pg_dsn, roles, ledger_schema, CUBE, SQL)
        spent = service.engine(CUBE).budget.spent
        with pytest.raises(
            ConfigError, match="the cube differs from the one its ledger was written for"
        ):
            await PostgresLedgerStore.open(pg_dsn, [narrower], ledger_schema)
        assert await ledger_admin.rekey(pg_dsn, narrower, ledger_schema) == spent
        with pytest.raises(ConfigError, match="nothing to rekey"):
            await ledger_admin.rekey(pg_dsn, narrower, ledger_schema)
        source, service = await ask(pg_dsn, roles, ledger_schema, narrower, SQL)
        assert source == "fresh"
        assert service.engine(narrower).budget.spent > spent  # carried, plus the new answer
        (state,) = await ledger_admin.status(pg_dsn, [narrower], ledger_schema)
        assert state.spent == service.engine(narrower).budget.spent

    asyncio.run(run())


def test_cli_history_prints_budgets_as_decimals(
    pg_dsn: str,
    roles: BackendRoles,
    ledger_schema: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    asyncio.run(ask(pg_dsn, roles, ledger_schema, CUBE, SQL))
    config = tmp_path / "config.yaml"
    config.write_text(Path(CONFIG.source).read_text() + f"ledger:\n  schema: {ledger_schema}\n")
    # --config after the command, as for serve's --host and --port
    assert main(["ledger", "--config", str(config), "--dsn", pg_dsn, "history"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    budget = line.split(" budget ")[1].split()[0]
    assert "/" not in budget and 0 < float(budget) < 1, line
    assert line.endswith(f"fresh budget {budget} user analyst: {SQL}")
