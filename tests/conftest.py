"""One real PostgreSQL per test session, and the Adult demo table in it.

Which server: ``DPPROXY_TEST_DSN`` if set; else a testcontainers PostgreSQL if
``DPPROXY_TEST_DOCKER=1`` and a Docker engine answers; else the embedded server (pgserver),
started in a temporary directory.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from proxy.config import load_config
from proxy.demo import load_adult
from proxy.embedded import start_embedded
from proxy.storage.provision import BackendRoles, provision_roles

ROOT = Path(__file__).parent.parent


def _docker_dsn() -> Iterator[str] | None:
    try:
        import docker  # testcontainers' client

        docker.from_env().ping()
    except Exception:  # no engine reachable: fall back to the embedded server
        return None
    from testcontainers.postgres import PostgresContainer

    def run() -> Iterator[str]:
        with PostgresContainer("postgres:16") as pg:
            yield pg.get_connection_url(driver=None)

    return run()


@pytest.fixture(scope="session")
def pg_dsn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A DSN for a live PostgreSQL superuser connection."""
    dsn = os.environ.get("DPPROXY_TEST_DSN")
    if dsn:
        yield dsn
        return
    if os.environ.get("DPPROXY_TEST_DOCKER") == "1":
        container = _docker_dsn()
        if container is not None:
            yield from container
            return
    yield start_embedded(Path(tmp_path_factory.mktemp("pgdata")))


@pytest.fixture(scope="session")
def adult_dsn(pg_dsn: str) -> str:
    """The same server, with the Adult demo table loaded as public.adult."""
    load_adult(pg_dsn)
    return pg_dsn


@pytest.fixture(scope="session")
def roles(adult_dsn: str) -> BackendRoles:
    """dpproxy's reader and pass-through roles on that server, for the demo config's tables."""
    return provision_roles(adult_dsn, load_config(ROOT / "config.yaml").cubes)


@pytest.fixture()
def ledger_schema(pg_dsn: str) -> Iterator[str]:
    """A fresh schema name for one test's durable ledger, dropped afterwards."""
    name = f"ledger_{uuid.uuid4().hex[:8]}"
    yield name
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
