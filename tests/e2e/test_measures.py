"""SUM of a measure through a running dpproxy and psycopg: answered within the asked accuracy,
charged by the measure's bound, recorded in the durable ledger, and free again after a restart."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from fractions import Fraction

import psycopg
import pytest

from proxy.config import BackendConfig
from proxy.engine.budget import CellBudget, cell_charges, float_up
from proxy.storage.postgres_ledger import stored_query
from proxy.storage.provision import BackendRoles

from .conftest import CONFIG, start_proxy, stop_proxy

SQL = (
    "SELECT sex, SUM(capital_gain), DP_INTERVAL_LOW(SUM(capital_gain)), "
    "DP_INTERVAL_HIGH(SUM(capital_gain)) FROM adult GROUP BY sex "
    "WITH ACCURACY 400000 CONFIDENCE 0.95"
)
CUBE = CONFIG.cubes[0]


@pytest.fixture()
def durable(backend: BackendConfig, roles: BackendRoles) -> Iterator[BackendConfig]:
    schema = f"ledger_{uuid.uuid4().hex[:8]}"
    yield dataclasses.replace(backend, ledger_dsn=roles.analyst_admin_dsn, ledger_schema=schema)
    with psycopg.connect(roles.analyst_admin_dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def ask(dsn: str) -> tuple[list[tuple[str, float, float, float]], list[str]]:
    notices: list[str] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        rows = conn.execute(SQL).fetchall()
    return [(r[0], float(r[1]), float(r[2]), float(r[3])) for r in rows], notices


def test_sum_of_a_measure_by_group(durable: BackendConfig, roles: BackendRoles) -> None:
    proxy, thread = start_proxy(CONFIG, durable)
    try:
        rows, notices = ask(proxy.dsn())
    finally:
        stop_proxy(proxy, thread)
    with psycopg.connect(roles.reader_dsn, autocommit=True) as conn:
        truth = dict(
            conn.execute(
                "SELECT sex, sum(least(greatest(capital_gain, 0), 20000)) FROM adult GROUP BY sex"
            ).fetchall()
        )
    with psycopg.connect(roles.analyst_admin_dsn, autocommit=True) as conn:
        schema = durable.ledger_schema
        stored = conn.execute(
            "SELECT t.n_cells, t.measures, t.shape, m.axes, m.core_index, m.core_weights, "
            "m.budget, m.sensitivity "
            f'FROM "{schema}".measurements m JOIN "{schema}".tables t ON t.id = m.table_id '
            "ORDER BY m.id"
        ).fetchall()
        (most_spent,) = conn.execute(f'SELECT most_spent FROM "{schema}".tables').fetchone()
        # what analysts see of the vectors (the ledger is in the analyst database)
        shown = conn.execute(
            "SELECT n_cells, core_shape, core_index, core_weights, cells FROM dp.history "
            "JOIN dp.history_vectors USING (id) ORDER BY id"
        ).fetchall()
        (budget_spent,) = conn.execute("SELECT spent FROM dp.budget").fetchone()
    assert [r[0] for r in rows] == ["Male", "Female"]
    for sex, estimate, low, high in rows:
        assert high - low == pytest.approx(800000)  # +-400000 in the measure's units
        assert low <= estimate <= high
        # the truth is in the interval at 0.95; ten half-widths away would be a broken engine
        assert abs(estimate - float(truth[sex])) < 4_000_000
    assert len(notices) == 1 and "(fresh 2)" in notices[0], notices
    charged = float(notices[0].split("budget charged ")[1].split(" ")[0])
    assert charged > 0
    # the ledger: two vectors over capital_gain's sums by sex, sensitivity its upper bound, and
    # the most a cell spent what their charges add up to
    assert len(stored) == 2
    recomputed = CellBudget("check", total=Fraction(10**9), shape=CUBE.shape)
    for n_cells, measures, shape, axes, index, weights, budget, sensitivity in stored:
        query = stored_query(
            n_cells, measures, shape, axes=axes, core_index=index, core_weights=weights
        )
        assert query.measures == CUBE.measure_reach and sensitivity == 20000
        assert query.axes == ([d.name for d in CUBE.dimensions].index("sex"),)
        assert not query.core[0].any()  # sums of a measure, no counts
        recomputed.commit(cell_charges(query, Fraction(budget)))
    per_cell = recomputed.per_cell()
    assert len(per_cell) == CUBE.n_cells  # Male and Female together: every cell, once
    assert most_spent == float_up(recomputed.spent) == budget_spent
    # kinds (the count, 4 measures' sums) by sex; capital_gain's sum (kind 1) of one sex: the
    # sums of half the cube's 11,520 cells
    assert shown == [(5760, [5, 2], [2 + sex], [1.0], None) for sex in (0, 1)], shown
    assert float(recomputed.spent) == pytest.approx(charged, rel=1e-5)

    proxy, thread = start_proxy(CONFIG, durable)  # a restart reads the vectors back
    try:
        again, notices = ask(proxy.dsn())
    finally:
        stop_proxy(proxy, thread)
    assert len(notices) == 1 and "(history 2)" in notices[0], notices
    for (_, a, _, _), (_, b, _, _) in zip(rows, again, strict=True):
        assert a == pytest.approx(b, rel=1e-9)
