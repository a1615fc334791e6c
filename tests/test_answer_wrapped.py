"""DpService.answer_wrapped: a statement's cores answered as one batch, the wrapper run as the
analyst's pass-through role in the analyst database (where the protected tables are empty)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from proxy.config import load_config
from proxy.dp.answering import DpService, WrappedAnswer, described
from proxy.dp.routing import Router
from proxy.errors import BudgetExhausted, DpproxyError
from proxy.storage.provision import BackendRoles, provision_roles
from proxy.storage.reader import Reader
from sqlmap.cube import CategoricalDimension, Cube
from sqlmap.translate import Translator
from sqlmap.vector import LinearQuery

CONFIG = load_config(Path(__file__).parent.parent / "config.yaml")
TRANSLATOR = CONFIG.translator()
ROUTER = Router(TRANSLATOR, CONFIG.cubes)


@pytest.fixture()
def service(
    adult_dsn: str,
) -> Iterator[tuple[asyncio.AbstractEventLoop, DpService, BackendRoles]]:
    roles = provision_roles(adult_dsn, CONFIG.cubes)
    loop = asyncio.new_event_loop()
    reader = loop.run_until_complete(Reader.connect(roles.reader_dsn))
    yield loop, DpService(CONFIG.cubes, reader), roles
    loop.run_until_complete(reader.close())
    loop.close()


def answer(
    service: tuple[asyncio.AbstractEventLoop, DpService, BackendRoles], sql: str
) -> WrappedAnswer:
    loop, dp, _ = service
    (statement,) = ROUTER.route(sql)
    assert statement.wrapped is not None
    specs = [
        TRANSLATOR.translate_parsed(c.select) for c in statement.wrapped.cores if c.rows is None
    ]
    return loop.run_until_complete(dp.answer_wrapped(statement.wrapped, specs, "analyst", sql))


def run_as_analyst(roles: BackendRoles, sql: str) -> list[tuple[object, ...]]:
    with psycopg.connect(roles.analyst_dsn(), autocommit=True) as conn:
        return conn.execute(sql).fetchall()


def test_the_wrapper_runs_under_the_pass_through_role_over_released_rows(
    service: tuple[asyncio.AbstractEventLoop, DpService, BackendRoles],
) -> None:
    answered = answer(
        service,
        "SELECT sex, COUNT(*) AS n, DP_INTERVAL_LOW(COUNT(*)) AS lo FROM adult GROUP BY sex "
        "ORDER BY n DESC LIMIT 1 WITH ACCURACY 100",
    )
    ((result,),) = [answered.results]
    released = {row[0]: row for row in result.rows}
    rows = run_as_analyst(service[2], answered.sql)
    assert rows == [released["Male"]]  # exactly the released values, sorted and cut
    assert len(answered.notices) == 2 and "[sex='Male']" in answered.notices[0]


def test_all_cores_of_a_statement_are_one_batch(
    service: tuple[asyncio.AbstractEventLoop, DpService, BackendRoles],
) -> None:
    answered = answer(
        service,
        "SELECT sex, COUNT(*) / (SELECT COUNT(*) FROM adult) AS share FROM adult GROUP BY sex "
        "WITH ACCURACY 100",
    )
    assert len(answered.results) == 2 and len(answered.replies) == 3
    rows = run_as_analyst(service[2], answered.sql)
    assert sorted(str(r[0]) for r in rows) == ["Female", "Male"]
    assert sum(float(str(r[1])) for r in rows) == pytest.approx(1, abs=0.05)
    # too accurate for the budget: the whole statement is refused, nothing is spent
    with pytest.raises(BudgetExhausted):
        answer(
            service,
            "SELECT COUNT(*) / (SELECT COUNT(*) FROM adult WHERE sex = 'Male') FROM adult "
            "WITH ACCURACY 0.001",
        )
    remaining = [r.budget_remaining for r in answered.replies]
    again = answer(service, "SELECT COUNT(*) / 1 FROM adult WITH ACCURACY 100")
    assert again.replies[0].source == "history"
    assert again.replies[0].budget_remaining <= min(remaining)


def test_listing_declared_values_asks_the_engine_nothing(
    service: tuple[asyncio.AbstractEventLoop, DpService, BackendRoles],
) -> None:
    answered = answer(service, "SELECT DISTINCT race AS r FROM adult ORDER BY r LIMIT 2")
    assert answered.results == () and answered.notices == ()
    assert run_as_analyst(service[2], answered.sql) == [
        ("Amer-Indian-Eskimo",),
        ("Asian-Pac-Islander",),
    ]


def test_described_wrapper_has_the_answer_s_columns_and_no_rows(
    service: tuple[asyncio.AbstractEventLoop, DpService, BackendRoles],
) -> None:
    sql = (
        'SELECT sex AS sex, COUNT(*) AS "COUNT(*)", COUNT(*) / 2 AS half FROM adult '
        "GROUP BY sex ORDER BY 2 DESC LIMIT 50"
    )
    (statement,) = ROUTER.route(sql)
    assert statement.wrapped is not None
    specs = [TRANSLATOR.translate_parsed(c.select) for c in statement.wrapped.cores]
    with psycopg.connect(service[2].analyst_dsn(), autocommit=True) as conn:
        cur = conn.execute(described(statement.wrapped, specs))
        assert [(c.name, c.type_code) for c in cur.description or ()] == [
            ("sex", 25),
            ("COUNT(*)", 701),
            ("half", 701),
        ]
        assert cur.fetchall() == []


def test_cores_on_two_protected_tables_are_refused_before_anything_runs(
    service: tuple[asyncio.AbstractEventLoop, DpService, BackendRoles],
) -> None:
    loop, _, _ = service
    other = Cube("public", "other", (CategoricalDimension("k", ("a", "b")),))
    translator = Translator([*CONFIG.cubes, other])
    dp = DpService([*CONFIG.cubes, other], Unreachable())
    specs = [
        translator.translate("SELECT COUNT(*) FROM adult WITH ACCURACY 100"),
        translator.translate("SELECT COUNT(*) FROM other WITH ACCURACY 100"),
    ]
    with pytest.raises(DpproxyError, match="only one protected table") as info:
        loop.run_until_complete(dp.answer_batch(specs))
    assert info.value.sqlstate == "0A000"


class Unreachable:
    """A measurement source that must not be asked."""

    async def measure(self, cube: Cube, queries: tuple[LinearQuery, ...]) -> list[float]:
        raise AssertionError("measured")
