"""A rehearsal of docker-compose.yml without a Docker engine.

The compose file's parts that can go wrong are ours: the role its PostgreSQL creates at init
(docker/initdb), the `provision --load-demo` step, and docker/config.yaml, whose passwords the
reader and the analysts' roles log in with. This runs the same steps, in the same order, against
a fresh PostgreSQL cluster of its own that, like the postgres image, asks those roles for their
passwords (SCRAM), with the compose hostname replaced by that cluster's socket.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from proxy.cli import main
from proxy.config import dsn_with, load_config
from proxy.embedded import start_embedded

from .conftest import ROOT, start_proxy, stop_proxy

COMPOSE_CONFIG = ROOT / "docker" / "config.yaml"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A fresh cluster, initialized as the postgres image's entrypoint would."""
    data = Path(tmp_path_factory.mktemp("compose-pgdata"))
    admin = start_embedded(data)
    with psycopg.connect(admin, autocommit=True) as conn:
        for script in sorted((ROOT / "docker" / "initdb").glob("*.sql")):
            conn.execute(script.read_text())
        # dpproxy's roles must give their passwords, as over the image's TCP (scram-sha-256)
        hba = data / "pg_hba.conf"
        hba.write_text(
            "local all dpproxy_reader,dpproxy_pt_analyst scram-sha-256\n" + hba.read_text()
        )
        conn.execute("SELECT pg_reload_conf()")
    yield admin


def test_compose_deployment_serves_dp_answers(
    cluster: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config = load_config(COMPOSE_CONFIG)
    assert config.backend is not None
    # the `provision` service, twice (it runs on every `docker compose up`)
    for _ in range(2):
        assert (
            main(["--config", str(COMPOSE_CONFIG), "provision", "--load-demo", "--dsn", cluster])
            == 0
        )
    assert "adult: 32561 rows" in capsys.readouterr().out
    # the `dpproxy` service, with the compose DSNs on this cluster's socket
    socket = conninfo_to_dict(cluster)["host"]
    backend = dataclasses.replace(
        config.backend,
        dsn=dsn_with(config.backend.dsn, host=socket, port=None),
        passthrough_dsn=dsn_with(config.backend.passthrough_dsn, host=socket, port=None),
    )
    backend = dataclasses.replace(backend, ledger_dsn=backend.reader_in_analyst_database)
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(dsn_with(backend.passthrough_dsn, user="dpproxy_pt_analyst"))
    proxy, thread = start_proxy(dataclasses.replace(config, backend=backend), backend)
    try:
        with psycopg.connect(proxy.dsn(), autocommit=True) as conn:
            count = conn.execute("SELECT COUNT(*) FROM adult WITH ACCURACY 200").fetchone()
            assert count is not None and abs(count[0] - 32561) < 2000
            assert conn.execute("SELECT fresh FROM dp.budget").fetchone() == (1,)
            assert conn.execute("SELECT current_user, current_database()").fetchone() == (
                "dpproxy_pt_analyst",
                "demo",
            )
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("SELECT age FROM adult LIMIT 1")
    finally:
        stop_proxy(proxy, thread)
