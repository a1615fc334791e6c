"""Creates dpproxy's two backend roles on a server it administers (the embedded default).

* ``dpproxy_reader`` may SELECT the protected tables; dpproxy runs only its generated
  histogram SQL under it.
* ``dpproxy_passthrough`` has no rights on protected tables; all other traffic runs under it, so
  PostgreSQL itself refuses whatever the statement inspector might miss.

For a server you run yourself, do the same by hand (docs/deploy.md will show the SQL).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

from sqlmap.cube import Cube

__all__ = ["READER_ROLE", "PASSTHROUGH_ROLE", "BackendRoles", "provision_roles", "dsn_for_role"]

READER_ROLE = "dpproxy_reader"
PASSTHROUGH_ROLE = "dpproxy_passthrough"


@dataclass(frozen=True, slots=True)
class BackendRoles:
    """DSNs for the two roles."""

    reader_dsn: str
    passthrough_dsn: str


def dsn_for_role(dsn: str, role: str) -> str:
    """The same server and database as ``dsn``, logged in as ``role`` (no password: trust auth).

    >>> dsn_for_role("postgresql://postgres:@/postgres?host=/tmp/x", "r")
    'postgresql://r@/postgres?host=/tmp/x'
    """
    parts = urlsplit(dsn)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, f"{role}@{host}", parts.path, parts.query, parts.fragment))


def provision_roles(
    admin_dsn: str, cubes: Iterable[Cube], ledger_schema: str | None = None
) -> BackendRoles:
    """Create (or update) both roles and their grants; idempotent, one transaction.

    With ``ledger_schema``, the reader role writes the ledger: that schema and ``dp`` (the
    analysts' views of it) are created for it, if missing, so it needs no CREATE on the database.
    """
    cubes = list(cubes)
    with psycopg.connect(admin_dsn) as conn:
        database = conn.info.dbname
        for role in (READER_ROLE, PASSTHROUGH_ROLE):
            exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
            if not exists:
                conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
            conn.execute(
                sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(
                    sql.Identifier(database), sql.Identifier(role)
                )
            )
        for cube in cubes:
            table = sql.Identifier(cube.schema, cube.table)
            schema = sql.Identifier(cube.schema)
            # nobody but the reader (and the owner) may read a protected table, whatever PUBLIC had
            conn.execute(sql.SQL("REVOKE ALL ON {} FROM PUBLIC").format(table))
            conn.execute(
                sql.SQL("REVOKE ALL ON {} FROM {}").format(table, sql.Identifier(PASSTHROUGH_ROLE))
            )
            conn.execute(
                sql.SQL("GRANT USAGE ON SCHEMA {} TO {}, {}").format(
                    schema, sql.Identifier(READER_ROLE), sql.Identifier(PASSTHROUGH_ROLE)
                )
            )
            conn.execute(
                sql.SQL("GRANT SELECT ON {} TO {}").format(table, sql.Identifier(READER_ROLE))
            )
        if ledger_schema is not None:
            for owned in (ledger_schema, "dp"):
                conn.execute(
                    sql.SQL("CREATE SCHEMA IF NOT EXISTS {} AUTHORIZATION {}").format(
                        sql.Identifier(owned), sql.Identifier(READER_ROLE)
                    )
                )
    return BackendRoles(
        dsn_for_role(admin_dsn, READER_ROLE), dsn_for_role(admin_dsn, PASSTHROUGH_ROLE)
    )
