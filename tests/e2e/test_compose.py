"""A rehearsal of docker-compose.yml without a Docker engine.

The compose file's parts that can go wrong are ours: the roles its PostgreSQL creates at init
(docker/initdb), the `provision --load-demo` step, and docker/config.yaml, whose backend DSNs make
the reader role write the ledger. This runs the same steps, in the same order, against a fresh
PostgreSQL cluster of its own, with the compose hostnames replaced by that cluster's socket.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest

from proxy.cli import main
from proxy.config import BackendConfig, load_config
from proxy.embedded import start_embedded
from proxy.provision import dsn_for_role

from .conftest import ROOT, start_proxy, stop_proxy

COMPOSE_CONFIG = ROOT / "docker" / "config.yaml"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A fresh cluster, initialized as the postgres image's entrypoint would."""
    admin = start_embedded(Path(tmp_path_factory.mktemp("compose-pgdata")))
    with psycopg.connect(admin, autocommit=True) as conn:
        for script in sorted((ROOT / "docker" / "initdb").glob("*.sql")):
            conn.execute(script.read_text())
    yield admin


def test_compose_deployment_serves_dp_answers(
    cluster: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config = load_config(COMPOSE_CONFIG)
    assert config.backend is not None
    # the `provision` service
    assert (
        main(["--config", str(COMPOSE_CONFIG), "provision", "--load-demo", "--dsn", cluster]) == 0
    )
    assert "adult: 32561 rows" in capsys.readouterr().out
    # the `dpproxy` service: its roles, on this cluster's socket (trust auth: no passwords)
    reader, passthrough = (
        dsn_for_role(cluster, urlsplit(dsn).username or "")
        for dsn in (config.backend.dsn, config.backend.passthrough_dsn)
    )
    backend = BackendConfig(reader, passthrough, ledger_dsn=reader, ledger_schema="dpproxy")
    proxy, thread = start_proxy(dataclasses.replace(config, backend=backend), backend)
    try:
        with psycopg.connect(proxy.dsn(), autocommit=True) as conn:
            count = conn.execute("SELECT COUNT(*) FROM adult WITH ACCURACY 200").fetchone()
            assert count is not None and abs(count[0] - 32561) < 2000
            assert conn.execute("SELECT fresh FROM dp.budget").fetchone() == (1,)
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("SELECT age FROM adult LIMIT 1")
    finally:
        stop_proxy(proxy, thread)
