"""A service restarted beside its checkpoints takes them, and answers as before it stopped.

With the real PostgreSQL ledger: the service writes a table's checkpoint every
``checkpoint_every`` new rows and at :meth:`DpService.close`; the next start finds the ledger's
rows up to the checkpoint's last id are the ones it covers and restores the engine's
factorization (``engine.restart``), answering bitwise as the closed one would. An unreadable
checkpoint is logged and the history factored.

The demo cube's history is small: the fronts are forced (``_FRONTS_RANK`` = 0), as the wide
cube's 10,000 answers have them.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from proxy.dp.answering import DpService
from proxy.storage.factorization_checkpoints import FactorizationCheckpoints
from proxy.storage.postgres_ledger import PostgresLedgerStore
from proxy.storage.provision import BackendRoles
from proxy.storage.reader import Reader
from tests.test_durable_service import CUBE, TRANSLATOR

STATEMENTS = [
    "SELECT sex, COUNT(*) FROM adult GROUP BY sex WITH ACCURACY 30",
    "SELECT race, COUNT(*) FROM adult WHERE age >= 45 GROUP BY race WITH ACCURACY 40",
    "SELECT income, SUM(hours_per_week) FROM adult GROUP BY income WITH ACCURACY 5000",
    "SELECT COUNT(*) FROM adult WHERE education = 'Bachelors' WITH ACCURACY 20",
    "SELECT sex, race, COUNT(*) FROM adult GROUP BY sex, race WITH ACCURACY 60",
]
AGAIN = "SELECT COUNT(*) FROM adult WHERE sex = 'Male' WITH ACCURACY 100"  # from history


@pytest.fixture(autouse=True)
def _fronts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("proxy.engine.estimator._FRONTS_RANK", 0)  # (see the module's doc)


Opened = tuple[DpService, PostgresLedgerStore, Reader]


@pytest.fixture
def open_service(
    pg_dsn: str, roles: BackendRoles, ledger_schema: str
) -> Callable[[FactorizationCheckpoints | None], Awaitable[Opened]]:
    """Opens a service on the test's ledger, as a restart would, with these checkpoints."""

    async def open_(checkpoints: FactorizationCheckpoints | None) -> Opened:
        ledger = await PostgresLedgerStore.open(pg_dsn, [CUBE], ledger_schema)
        reader = await Reader.connect(roles.reader_dsn)
        service = await DpService.open_durable(
            [CUBE], reader, ledger, checkpoints=checkpoints, checkpoint_every=8
        )
        return service, ledger, reader

    return open_


def test_a_restart_takes_the_checkpoint_written_at_close_and_answers_as_before(
    open_service: Callable[[FactorizationCheckpoints | None], Awaitable[Opened]],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    checkpoints = FactorizationCheckpoints(tmp_path / "checkpoints")
    path = checkpoints.path(CUBE.qualified_name)

    async def run() -> None:
        service, ledger, reader = await open_service(checkpoints)
        engine = service.engine(CUBE)
        assert engine.restart == "factored 0 rows"
        for sql in STATEMENTS:
            await service.answer(TRANSLATOR.translate(sql), user="analyst", sql=sql)
        await asyncio.gather(*service._writing.values())
        assert engine.history_size > 8
        assert 8 <= service._checkpointed[CUBE.qualified_name] and path.exists()  # every 8 rows
        await service.close()  # the checkpoint written every 8 rows, and now the rest
        assert service._checkpointed[CUBE.qualified_name] == engine.history_size
        before = await service.answer(TRANSLATOR.translate(AGAIN), user="analyst", sql=AGAIN)
        rows = engine.history_size
        await ledger.close()
        await reader.close()

        service, ledger, reader = await open_service(checkpoints)
        engine = service.engine(CUBE)
        assert engine.restart == f"restored {rows} rows' factorization, folded 0 after it"
        after = await service.answer(TRANSLATOR.translate(AGAIN), user="analyst", sql=AGAIN)
        assert {r.source for r in after.replies} == {"history"}
        assert [(r.estimate, r.low, r.high) for r in after.replies] == [
            (r.estimate, r.low, r.high) for r in before.replies
        ]
        await service.close()
        await ledger.close()
        await reader.close()

        path.write_bytes(path.read_bytes()[:1000])  # torn: the next start factors, and says so
        with caplog.at_level(logging.INFO):
            service, ledger, reader = await open_service(checkpoints)
        assert service.engine(CUBE).restart == f"factored {rows} rows"
        assert any("unreadable" in str(r.__dict__.get("fields")) for r in caplog.records)
        await asyncio.gather(*service._writing.values())  # a restart that factored writes one
        assert service._checkpointed[CUBE.qualified_name] == rows
        await ledger.close()
        await reader.close()

    asyncio.run(run())
    assert path.stat().st_size > 0


def test_a_restart_without_checkpoints_says_so(
    open_service: Callable[[FactorizationCheckpoints | None], Awaitable[Opened]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The DBA of a slow restart learns from the log which setting would shorten it."""

    async def run() -> None:
        with caplog.at_level(logging.INFO):
            service, ledger, reader = await open_service(None)
        assert not service._writing
        await service.close()
        await ledger.close()
        await reader.close()

    asyncio.run(run())
    restarts = [r.__dict__.get("fields") for r in caplog.records if "engine_restarted" in r.msg]
    assert restarts and "ledger.checkpoints is not set" in str(restarts[0])


def test_a_checkpoint_that_cannot_be_written_is_logged_and_serving_goes_on(
    open_service: Callable[[FactorizationCheckpoints | None], Awaitable[Opened]],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    occupied = tmp_path / "checkpoints"
    occupied.write_text("a file where the directory should be")
    rows: list[int] = []

    async def run() -> None:
        service, ledger, reader = await open_service(FactorizationCheckpoints(occupied))
        with caplog.at_level(logging.INFO):
            for sql in STATEMENTS:
                await service.answer(TRANSLATOR.translate(sql), user="analyst", sql=sql)
            await asyncio.gather(*service._writing.values())
            await service.close()
        again = await service.answer(TRANSLATOR.translate(AGAIN), user="analyst", sql=AGAIN)
        assert again.replies
        rows.append(service.engine(CUBE).history_size)
        await ledger.close()
        await reader.close()

    asyncio.run(run())
    failed = [r.__dict__.get("fields") for r in caplog.records if r.msg == "checkpoint_failed"]
    assert failed and occupied.is_file()
    # tried at once, then again only every 8 rows (each try holds the engine), and at close
    assert len(failed) <= 1 + rows[0] // 8 + 1 < len(STATEMENTS) + 1


def test_of_two_services_on_one_directory_one_writes_until_it_closes(
    open_service: Callable[[FactorizationCheckpoints | None], Awaitable[Opened]],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two proxies started from one config on a host: the second leaves the writes to the first."""
    directory = tmp_path / "checkpoints"
    path = FactorizationCheckpoints(directory).path(CUBE.qualified_name)

    def tighter(accuracy: int) -> str:  # than before: its 10 values measure
        return f"SELECT sex, race, COUNT(*) FROM adult GROUP BY sex, race WITH ACCURACY {accuracy}"

    async def run() -> None:
        first, first_ledger, first_reader = await open_service(FactorizationCheckpoints(directory))
        for sql in STATEMENTS:
            await first.answer(TRANSLATOR.translate(sql), user="analyst", sql=sql)
        await asyncio.gather(*first._writing.values())
        second, second_ledger, second_reader = await open_service(
            FactorizationCheckpoints(directory)
        )
        assert second.engine(CUBE).restart.startswith("restored")  # the first's checkpoint
        written = path.stat().st_mtime_ns
        with caplog.at_level(logging.INFO):
            for sql in (tighter(50), tighter(40)):
                await second.answer(TRANSLATOR.translate(sql), user="analyst", sql=sql)
                await asyncio.gather(*second._writing.values())
        skipped = [r.__dict__["fields"] for r in caplog.records if r.msg == "checkpoint_skipped"]
        assert len(skipped) == 1 and f"process {os.getpid()} writes" in str(skipped[0])
        assert path.stat().st_mtime_ns == written
        await first.close()  # lets go of the directory
        written = path.stat().st_mtime_ns
        covered = second._checkpointed[CUBE.qualified_name]
        for sql in (tighter(30), tighter(24)):
            await second.answer(TRANSLATOR.translate(sql), user="analyst", sql=sql)
        await asyncio.gather(*second._writing.values())
        assert second._checkpointed[CUBE.qualified_name] > covered
        assert path.stat().st_mtime_ns > written
        await second.close()
        for closing in (first_ledger, first_reader, second_ledger, second_reader):
            await closing.close()

    asyncio.run(run())
