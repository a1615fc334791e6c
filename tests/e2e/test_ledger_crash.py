"""SIGKILL a ``dpproxy serve`` process at random moments while a client spends budget through it.

A client streams budget-spending DP queries (each SQL text distinct) and records every answer it
receives; the server is killed with SIGKILL at seeded random moments and restarted on the same
ledger, at least 50 times. Afterwards, every fresh or combined answer the client received must
match a measurement stored in the ledger (written before release), and the per-cell spend
recomputed from the stored measurements must stay within the table's total.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from fractions import Fraction
from pathlib import Path
from typing import Any

import psycopg
import pytest

from .test_ledger_concurrency import (
    Outcome,
    ServeProcess,
    adult_cube,
    recomputed_spend,
    write_config,
)

KILLS = 50
AGES = [(17, 25), (25, 35), (35, 45), (45, 55), (55, 65), (65, 91)]
SEXES = ["Male", "Female"]
EDUCATION = ["HS-grad", "Some-college", "Bachelors", "Masters", "11th", "Assoc-voc"]


def condition(rng: random.Random) -> str:
    lo, hi = rng.choice(AGES)
    return (
        f"age >= {lo} AND age < {hi} AND sex = '{rng.choice(SEXES)}' "
        f"AND education = '{rng.choice(EDUCATION)}'"
    )


class Client(threading.Thread):
    """Streams distinct DP queries to whatever port the server listens on; records answers."""

    def __init__(self, server: ServeProcess, seed: int) -> None:
        super().__init__(name="crash-client", daemon=True)
        self.server = server
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.received: list[Outcome] = []
        self.errors: Counter[str] = Counter()
        self.sent = 0

    def run(self) -> None:
        notices: list[str] = []
        while not self.stop.is_set():
            try:
                with psycopg.connect(self.server.dsn, autocommit=True) as conn:
                    conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
                    while not self.stop.is_set():
                        self.sent += 1
                        # a distinct SQL text per query: each answer names its own measurement
                        accuracy = 20 + self.sent / 1000
                        sql = (
                            f"SELECT COUNT(*) FROM adult WHERE {condition(self.rng)} "
                            f"WITH ACCURACY {accuracy:.3f} CONFIDENCE 0.9"
                        )
                        notices.clear()
                        try:
                            row = conn.execute(sql).fetchone()
                        except psycopg.errors.ConfigurationLimitExceeded:  # 53400
                            self.errors["53400"] += 1
                            continue
                        assert row is not None and len(notices) == 1
                        self.received.append(Outcome(sql, float(row[0]), notices[0]))
            except psycopg.OperationalError:  # killed (or not up yet)
                self.errors["connection"] += 1
                time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # 50 restarts; each takes seconds on a busy machine
def test_no_answer_outlives_its_measurement(
    adult_dsn: str, ledger_schema: str, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "config.yaml", adult_dsn, ledger_schema, 0.5)
    cube = adult_cube(config)
    server = ServeProcess(config, tmp_path / "dpproxy.log")
    rng = random.Random(1729)
    client = Client(server, seed=42)
    started = time.monotonic()
    try:
        server.start()
        port = server.port
        client.start()
        for _ in range(KILLS):
            time.sleep(rng.uniform(0.05, 1.2))
            server.kill()
            server.start(port=port)
        time.sleep(0.5)
        client.stop.set()
        client.join(30)
        assert not client.is_alive()
        server.stop()

        fresh = Counter(o.sql for o in client.received if o.source in {"fresh", "combined"})
        with psycopg.connect(adult_dsn, autocommit=True) as conn:
            stored: Counter[Any] = Counter(
                dict(
                    conn.execute(
                        f'SELECT sql_text, count(*) FROM "{ledger_schema}".measurements '
                        "GROUP BY sql_text"
                    ).fetchall()
                )
            )
        missing = {sql: n for sql, n in fresh.items() if stored[sql] < n}
        assert not missing, missing
        assert sum(fresh.values()) >= KILLS  # the test did exercise spending
        spent, n = recomputed_spend(adult_dsn, ledger_schema, cube)
        assert spent <= Fraction(cube.total_budget)
        print(
            f"{KILLS} kills in {time.monotonic() - started:.0f} s; sent {client.sent}, "
            f"received {len(client.received)} ({sum(fresh.values())} fresh/combined), "
            f"{n} measurements stored, errors {dict(client.errors)}, spent {float(spent):.4f}"
        )
    except BaseException:
        print(f"---- dpproxy log ----\n{server.log()[-5000:]}")
        raise
    finally:
        client.stop.set()
        server.stop()
