"""The server's config keys (listen, backend, users), their docs, and the deployment files."""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path

import pytest
import yaml

from proxy.auth import make_verifier
from proxy.config import DEMO_USERS, ListenConfig, load_config, parse_config
from proxy.errors import ConfigError
from tests.test_config import VALID

ROOT = Path(__file__).parent.parent


def test_defaults() -> None:
    config = parse_config(VALID)
    assert config.listen == ListenConfig("127.0.0.1", 6432, "demo")
    assert config.backend is None and config.users is DEMO_USERS


def test_server_keys() -> None:
    verifier = make_verifier("pw")
    config = parse_config(
        {
            **VALID,
            "listen": {
                "host": "0.0.0.0",
                "port": 7000,
                "database": "analytics",
                "tls_cert": "c.pem",
                "tls_key": "k.pem",
                "max_connections": 5,
                "shutdown_timeout": 1.5,
            },
            "backend": {
                "dsn": "postgresql://r:secret@db/x",
                "passthrough_dsn": "host=db dbname=y",
                "passthrough_secret": "secret",
            },
            "users": {"alice": verifier},
        },
        source="/etc/dpproxy/config.yaml",
    )
    assert config.listen.port == 7000 and config.listen.tls_cert == Path("/etc/dpproxy/c.pem")
    assert config.backend is not None and config.backend.passthrough_dsn == "host=db dbname=y"
    assert config.backend.role_for("alice") == "dpproxy_pt_alice"
    assert config.backend.analyst_database == "y"
    assert config.backend.reader_in_analyst_database == "postgresql://r:secret@db/y"
    assert str(config.users["alice"]) == verifier
    assert "secret" not in repr(config.backend)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"listen": {"port": 70000}}, "listen.port: must be 0 to 65535"),
        ({"listen": {"prot": 1}}, "listen.prot: unknown key"),
        ({"listen": {"tls_cert": "c.pem"}}, "give both or neither"),
        ({"listen": {"max_connections": 0}}, "listen.max_connections: must be positive"),
        ({"backend": {"dsn": "postgresql://a@h/d"}}, "backend: give both dsn"),
        (
            {"backend": {"dsn": "x=", "passthrough_dsn": "host=h"}},
            "backend.dsn: not a PostgreSQL connection string",
        ),
        (
            {"backend": {"dsn": "host=h dbname=d", "passthrough_dsn": "host=h dbname=d"}},
            "backend.passthrough_dsn: must name another database than backend.dsn",
        ),
        (
            {"backend": {"dsn": "host=h dbname=d", "passthrough_dsn": "host=h user=p dbname=a"}},
            "backend.passthrough_dsn: give no user or password",
        ),
        (
            {"backend": {"dsn": "host=h dbname=d", "passthrough_dsn": "host=h"}},
            "backend.passthrough_dsn: name the analyst database",
        ),
        (
            {
                "backend": {
                    "dsn": "host=h dbname=d",
                    "passthrough_dsn": "host=h dbname=a",
                    "passthrough_role": "analysts",
                }
            },
            "backend.passthrough_role: must contain {user} once",
        ),
        (
            {"users": {"a" * 60: make_verifier("pw")}},
            "is longer than 63 bytes",
        ),
        ({"users": {"analyst": "analyst"}}, "users.analyst: not a SCRAM-SHA-256 verifier"),
        ({"users": []}, "users: expected a mapping"),
        ({"users": {"bob": {"user_budget": 1}}}, "users.bob.verifier: expected a verifier"),
        ({"users": {"bob": {"budget": 1}}}, "users.bob.budget: unknown key"),
        (
            {"users": {"bob": {"verifier": "x", "user_budget": 0}}},
            "users.bob.user_budget: must be a positive number",
        ),
        (
            {"privacy": {"user_budget": "half"}},
            "privacy.user_budget: expected a number",
        ),
        (
            {"privacy": {"user_budget": float("nan")}},
            "privacy.user_budget: must be a positive number",
        ),
    ],
)
def test_mistakes_name_their_key(change: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_config({**VALID, **change})


def test_user_budgets() -> None:
    verifier = make_verifier("pw")
    config = parse_config(
        {
            **VALID,
            "privacy": {"user_budget": 0.25},
            "users": {"alice": verifier, "dba": {"verifier": verifier, "user_budget": 1}},
        }
    )
    assert str(config.users["dba"]) == verifier
    caps = config.caps()
    assert (caps.cap("alice"), caps.cap("dba")) == (Fraction(1, 4), Fraction(1))
    assert parse_config(VALID).caps().cap("alice") is None


def test_every_key_is_documented_with_a_default() -> None:
    docs = (ROOT / "docs" / "config.md").read_text()
    for section, keys in {
        "listen": ["host", "port", "database", "tls_cert", "max_connections", "shutdown_timeout"],
        "backend": ["dsn", "passthrough_dsn", "passthrough_role", "passthrough_secret"],
        "privacy": ["user_budget"],
        "users": ["user_budget"],
    }.items():
        assert f"## `{section}`" in docs
        for key in keys:
            assert f"| `{key}`" in docs, key
    assert "## `users`" in docs and "Default" in docs
    example = (ROOT / "config.yaml").read_text()
    for key in (
        "listen:",
        "backend:",
        "users:",
        "max_connections",
        "shutdown_timeout",
        "passthrough_dsn",
    ):
        assert key in example


def test_the_shipped_demo_verifier_is_analyst() -> None:
    from scramp import ScramClient

    from proxy.auth import ScramExchange

    client = ScramClient(["SCRAM-SHA-256"], "analyst", "analyst")
    server = ScramExchange("analyst", DEMO_USERS["analyst"], b"k")
    client.set_server_first(server.first(client.get_client_first().encode()).decode())
    client.set_server_final(server.final(client.get_client_final().encode()).decode())


def test_docker_files_agree() -> None:
    docker = load_config(ROOT / "docker" / "config.yaml")
    shipped = load_config(ROOT / "config.yaml")
    assert docker.cubes == shipped.cubes and docker.privacy == shipped.privacy
    assert docker.backend is not None and docker.listen.host == "0.0.0.0"
    assert docker.backend.passthrough_secret  # the analysts' roles need passwords over TCP
    roles = (ROOT / "docker" / "initdb" / "01-roles.sql").read_text()
    user, password = re.match(r"postgresql://(\w+):([^@]+)@", docker.backend.dsn).groups()  # type: ignore[union-attr]
    assert f"CREATE ROLE {user} LOGIN PASSWORD '{password}'" in roles
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert {"postgres", "provision", "dpproxy"} <= set(compose["services"])
    assert "6432:6432" in compose["services"]["dpproxy"]["ports"][0]
