"""bench/sql_workload's end to end at scale (``--history``), run for real on a small scale.

The bench starts its own embedded PostgreSQL, fills a ledger, starts ``dpproxy serve`` on it and
streams statements through it: a minute or so, hence ``slow``. Its pre-filled history is checked
on the tests' PostgreSQL.
"""

from __future__ import annotations

import asyncio
import dataclasses
from fractions import Fraction
from pathlib import Path

import pytest

from bench import sql_workload
from proxy.dp.answering import DpService
from proxy.storage.postgres_ledger import PostgresLedgerStore
from proxy.storage.reader import Reader


@pytest.mark.slow
@pytest.mark.parametrize("wide", [False, True], ids=["demo", "wide"])
def test_history_runs_the_stream_on_a_filled_ledger(
    wide: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--skip-e2e", "--skip-backend", "--statements", "8", "--history", "30", "60"]
    argv += ["--data-dir", str(tmp_path / "pgdata"), *(["--wide"] if wide else [])]
    sql_workload.main(argv)
    out = capsys.readouterr().out
    for m in (30, 60):
        assert f"## End to end on a history of {m} measurements" in out
        assert f"(ledger filled with {m} measurements in" in out
    assert out.count("at the most-spent cell: total_budget raised to") == 2
    assert "## End to end: " not in out  # --skip-e2e: no run on an empty ledger
    assert out.count("(server listening after") == 2
    assert out.count("| all | ") == 2
    assert out.count("Targets (DP / plain, median of ratios): every statement") == 2


def test_a_filled_ledger_answers_the_statements_it_holds_from_history(
    adult_dsn: str, ledger_schema: str
) -> None:
    """The pre-filled history spends what fresh answers at the statements' accuracies spend,
    around the table's true answers: a service on it answers the statements it holds from
    history, close to the truth, and the bench's total leaves the configured budget free."""
    config, cube = sql_workload.CONFIG, sql_workload.CUBE
    x = sql_workload.truth(adult_dsn, cube)
    entries = sql_workload.history(config, 1500, x, statements=60)
    spent = asyncio.run(sql_workload.fill_ledger(adult_dsn, ledger_schema, entries, False))
    total = sql_workload.raised_total(config, spent)
    assert spent > 100 * len(entries) * Fraction(1, 10**6)  # not the old 1e-6 per row
    assert total - float(spent) >= cube.total_budget
    held = {e.query.key for e in entries}
    translator = config.translator()
    statements = {s.sql: s for s in sql_workload.stream(60, seed=11)}.values()

    async def answer() -> int:
        ledger = await PostgresLedgerStore.open(
            adult_dsn, [dataclasses.replace(cube, total_budget=total)], ledger_schema
        )
        reader = await Reader.connect(adult_dsn)
        try:
            service = await DpService.open_durable([cube], reader, ledger)
            engine = service.engine(cube)
            assert engine.history_size == len(entries)
            assert engine.budget.spent == spent
            answered = 0
            for statement in statements:
                spec = translator.translate(statement.dp)
                if any(q.without_offset().key not in held for q in spec.queries):
                    continue
                result = await service.answer(spec, unbiased=True)  # intervals unclipped
                assert {r.source for r in result.replies} == {"history"}, statement.sql
                for query, reply in zip(spec.queries, result.replies):
                    # noise around the truth: 4 half-widths out is a chance of ~1e-5
                    assert abs(reply.estimate - query.evaluate(x)) <= 2 * (reply.high - reply.low)
                answered += 1
            return answered
        finally:
            await reader.close()
            await ledger.close()

    assert asyncio.run(answer()) >= 8  # of 10 whose vectors all drew rows
