"""Sets up the boundary PostgreSQL enforces between analysts and protected rows.

Two databases on one server (docs/deploy.md):

* the **private** database holds the protected tables. Only ``dpproxy_reader`` (and the DBA)
  may connect to it; dpproxy runs nothing there but the measurement SQL it generates.
* the **analyst** database is where every other statement runs. It holds, per protected table,
  an *empty* table of the same shape (name, columns, types, NOT NULLs, comments) that analysts
  may SELECT, so catalogs and BI tools list it; its catalogs know nothing of the real rows, and
  the statistics that are cluster-wide (``pg_stat_database``, ``pg_stat_io``, the
  ``pg_stat_get_*`` functions, ``pg_tablespace_size``, the WAL position, ...) are revoked from
  PUBLIC there. The ledger lives there too, in a schema analysts have no rights on; its views
  ``dp.budget`` and ``dp.history`` are granted to them.

Each analyst logs in to the analyst database as a role of their own (``dpproxy_pt_<user>``), a
member of the group ``dpproxy_passthrough`` that holds their grants, so analysts cannot signal,
watch or reconfigure each other's sessions. With ``backend.passthrough_secret`` their passwords
are derived from it (`proxy.auth.passthrough_password`) and their SCRAM verifiers
installed here; without it they log in without one (the embedded server's trusted Unix socket).

Everything is idempotent: run it again after adding users or tables.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

import psycopg
from psycopg import sql

from proxy.auth import make_verifier, passthrough_password
from proxy.config import PASSTHROUGH_ROLE_TEMPLATE, dsn_with
from proxy.errors import ConfigError
from sqlmap.cube import Cube

__all__ = [
    "READER_ROLE",
    "PASSTHROUGH_ROLE",
    "ANALYST_DATABASE",
    "STATISTICS_FUNCTIONS_SQL",
    "STATISTICS_VIEWS_SQL",
    "FORBIDDEN_MEMBERSHIPS",
    "SHADOW_SCHEMA",
    "ANALYST_SEARCH_PATH",
    "BackendRoles",
    "provision_roles",
    "dsn_with",
    "dsn_for_role",
]

READER_ROLE: Final = "dpproxy_reader"
#: The group every analyst's pass-through role belongs to; grant it what analysts may read.
PASSTHROUGH_ROLE: Final = "dpproxy_passthrough"
#: The analyst database the embedded server and the tests use.
ANALYST_DATABASE: Final = "demo"

#: Functions in the analyst database that reveal what happens elsewhere in the cluster (counters
#: of every database, table and backend; the default tablespace's size; how much WAL the
#: cluster wrote): revoked from PUBLIC there. ``$1`` is a role that must not execute them.
STATISTICS_FUNCTIONS_SQL: Final = r"""
SELECT p.oid::regprocedure::text FROM pg_proc p
WHERE p.pronamespace = 'pg_catalog'::regnamespace
  AND (p.proname LIKE 'pg\_stat\_%' OR p.proname IN (
       'pg_database_size', 'pg_tablespace_size', 'pg_current_wal_lsn',
       'pg_current_wal_insert_lsn', 'pg_current_wal_flush_lsn', 'pg_last_wal_receive_lsn',
       'pg_last_wal_replay_lsn', 'pg_control_checkpoint', 'pg_control_system',
       'pg_control_init', 'pg_control_recovery'))
  AND has_function_privilege($1, p.oid, 'EXECUTE')
ORDER BY 1
"""

#: The statistics views (``pg_stat_*``, ``pg_statio_*``, ``pg_stats*``) likewise. (The tables
#: ``pg_statistic`` and ``pg_statistic_ext_data`` are the superuser's already.)
STATISTICS_VIEWS_SQL: Final = r"""
SELECT c.oid::regclass::text FROM pg_class c
WHERE c.relnamespace = 'pg_catalog'::regnamespace AND c.relkind = 'v'
  AND (c.relname LIKE 'pg\_stat\_%' OR c.relname LIKE 'pg\_statio\_%'
       OR c.relname LIKE 'pg\_stats%')
  AND has_table_privilege($1, c.oid, 'SELECT')
ORDER BY 1
"""

#: The analyst database's schema of empty look-alikes of the statistics views (``shadows``).
SHADOW_SCHEMA: Final = "dpproxy_catalog"
#: The analysts' roles' search_path in the analyst database: PostgreSQL's default, with the
#: shadows before pg_catalog, so an unqualified ``pg_stat_user_tables`` (Metabase's sync
#: query) is a view of no rows rather than a refusal. ``pg_catalog.pg_stat_user_tables`` stays
#: revoked; a tool that sets its own search_path gets PostgreSQL's 42501 again, nothing more.
ANALYST_SEARCH_PATH: Final = f'"$user", public, {SHADOW_SCHEMA}, pg_catalog'

#: Every column of every statistics view revoked above (whatever analysts may read now), to
#: give each a shadow of the same name and columns. ``anyarray`` (pg_stats' value arrays) is
#: not a type a view of ours may have: those columns are ``text[]``.
_STATISTICS_VIEW_COLUMNS_SQL: Final = r"""
SELECT c.relname, a.attname,
       CASE WHEN a.atttypid = 'anyarray'::regtype THEN 'text[]'
            ELSE format_type(a.atttypid, a.atttypmod) END
FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0
WHERE c.relnamespace = 'pg_catalog'::regnamespace AND c.relkind = 'v'
  AND (c.relname LIKE 'pg\_stat\_%' OR c.relname LIKE 'pg\_statio\_%'
       OR c.relname LIKE 'pg\_stats%')
ORDER BY c.relname, a.attnum
"""

#: Predefined roles a pass-through role must not belong to: they read every table or every
#: statistic, or signal other roles' backends.
FORBIDDEN_MEMBERSHIPS: Final = (
    "pg_read_all_data",
    "pg_write_all_data",
    "pg_read_all_stats",
    "pg_stat_scan_tables",
    "pg_monitor",
    "pg_signal_backend",
    "pg_read_server_files",
    "pg_write_server_files",
    "pg_execute_server_program",
    READER_ROLE,
)

_SHAPE_SQL = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
       col_description(a.attrelid, a.attnum)
FROM pg_attribute a
WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""

_Shape = tuple[tuple[str, str, bool, str | None], ...]


@dataclass(frozen=True, slots=True)
class BackendRoles:
    """What `provision_roles` set up, as DSNs (without passwords: the embedded server's trust).

    Attributes:
        reader_dsn: the reader, in the private database.
        passthrough_dsn: the analyst database, no user (each analyst logs in as their own role).
        ledger_dsn: the reader, in the analyst database (the ledger's home).
        analyst_admin_dsn: the administrator, in the analyst database.
        role_template: the analysts' role names.
    """

    reader_dsn: str
    passthrough_dsn: str
    ledger_dsn: str
    analyst_admin_dsn: str
    role_template: str = PASSTHROUGH_ROLE_TEMPLATE

    def analyst_dsn(self, user: str = "analyst") -> str:
        """Analyst ``user``'s own pass-through role, in the analyst database."""
        return dsn_with(self.passthrough_dsn, user=self.role_template.replace("{user}", user))


def dsn_for_role(dsn: str, role: str) -> str:
    """The same server and database as ``dsn``, logged in as ``role`` (no password: trust auth).

    >>> dsn_for_role("postgresql://postgres:@/postgres?host=/tmp/x", "r")
    'postgresql://r@/postgres?host=%2Ftmp%2Fx'
    """
    return dsn_with(dsn, user=role, password=None)


def provision_roles(
    admin_dsn: str,
    cubes: Iterable[Cube],
    ledger_schema: str | None = None,
    *,
    users: Iterable[str] = ("analyst",),
    analyst_database: str = ANALYST_DATABASE,
    role_template: str = PASSTHROUGH_ROLE_TEMPLATE,
    secret: str | None = None,
) -> BackendRoles:
    """Create (or bring up to date) the roles, the analyst database and the grants.

    Args:
        admin_dsn: a superuser in the private database (the one holding ``cubes``' tables).
        cubes: the protected tables.
        ledger_schema: create it (and ``dp``) in the analyst database for the reader role,
            which then needs no CREATE on that database.
        users: the analysts; each gets a pass-through role.
        role_template: their roles' names, ``{user}`` standing for the analyst.
        analyst_database: created if missing.
        secret: derive the analysts' passwords from it (``backend.passthrough_secret``).

    Raises:
        ConfigError: the analyst database is the private one, or a stand-in table cannot be
            made (its old version holds rows, or a column type is missing there).
    """
    cubes = list(cubes)
    analysts = [role_template.replace("{user}", u) for u in users]
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        private = conn.info.dbname
        if private == analyst_database:
            raise ConfigError(
                f"the analyst database must not be {private}, which holds the protected tables"
            )
        shapes = {}
        with conn.transaction():
            _roles(conn, analysts, secret)
            _private_database(conn, private, cubes, analysts)
            for cube in cubes:
                shapes[cube] = _shape(conn, cube)
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (analyst_database,)
        ).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(analyst_database)))
    analyst_admin = dsn_with(admin_dsn, dbname=analyst_database)
    with psycopg.connect(analyst_admin) as conn:
        _analyst_database(conn, analyst_database, shapes, ledger_schema)
        _shadows(conn, analyst_database, analysts)
    return BackendRoles(
        reader_dsn=dsn_for_role(admin_dsn, READER_ROLE),
        passthrough_dsn=dsn_with(analyst_admin, user=None, password=None),
        ledger_dsn=dsn_for_role(analyst_admin, READER_ROLE),
        analyst_admin_dsn=analyst_admin,
        role_template=role_template,
    )


def _roles(
    conn: psycopg.Connection[tuple[object, ...]], analysts: list[str], secret: str | None
) -> None:
    def exists(role: str) -> bool:
        return (
            conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
            is not None
        )

    limits = sql.SQL("NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS")
    if not exists(READER_ROLE):
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(READER_ROLE)))
    # the group only holds grants: nobody logs in as it (older setups did)
    verb = "ALTER" if exists(PASSTHROUGH_ROLE) else "CREATE"
    conn.execute(
        sql.SQL(verb + " ROLE {} NOLOGIN {}").format(sql.Identifier(PASSTHROUGH_ROLE), limits)
    )
    # PostgreSQL 16 can grant membership without SET ROLE to the group
    no_set = sql.SQL(" WITH INHERIT TRUE, SET FALSE" if conn.info.server_version >= 160000 else "")
    for role in analysts:
        verb = "ALTER" if exists(role) else "CREATE"
        conn.execute(sql.SQL(verb + " ROLE {} LOGIN {}").format(sql.Identifier(role), limits))
        if secret is not None:
            verifier = make_verifier(passthrough_password(secret, role))
            conn.execute(
                sql.SQL("ALTER ROLE {} PASSWORD {}").format(
                    sql.Identifier(role), sql.Literal(verifier)
                )
            )
        conn.execute(
            sql.SQL("GRANT {} TO {}").format(sql.Identifier(PASSTHROUGH_ROLE), sql.Identifier(role))
            + no_set
        )


def _private_database(
    conn: psycopg.Connection[tuple[object, ...]],
    private: str,
    cubes: list[Cube],
    analysts: list[str],
) -> None:
    """Only the reader (and superusers) may connect; only the reader may read the tables."""
    database = sql.Identifier(private)
    outsiders = sql.SQL("PUBLIC, ") + sql.SQL(", ").join(
        sql.Identifier(r) for r in [PASSTHROUGH_ROLE, *analysts]
    )
    conn.execute(sql.SQL("REVOKE ALL ON DATABASE {} FROM {}").format(database, outsiders))
    conn.execute(
        sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(database, sql.Identifier(READER_ROLE))
    )
    for cube in cubes:
        table = sql.Identifier(cube.schema, cube.table)
        conn.execute(sql.SQL("REVOKE ALL ON {} FROM {}").format(table, outsiders))
        conn.execute(
            sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
                sql.Identifier(cube.schema), sql.Identifier(READER_ROLE)
            )
        )
        conn.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(table, sql.Identifier(READER_ROLE)))


def _shape(conn: psycopg.Connection[tuple[object, ...]], cube: Cube) -> tuple[_Shape, str | None]:
    """The table's columns (name, type, NOT NULL, comment) and its comment."""
    name = sql.Identifier(cube.schema, cube.table).as_string(conn)
    columns = tuple(
        (str(n), str(t), bool(nn), None if c is None else str(c))
        for n, t, nn, c in conn.execute(_SHAPE_SQL, (name,)).fetchall()
    )
    comment = conn.execute("SELECT obj_description(%s::regclass, 'pg_class')", (name,)).fetchone()
    return columns, None if comment is None or comment[0] is None else str(comment[0])


def _analyst_database(
    conn: psycopg.Connection[tuple[object, ...]],
    analyst_database: str,
    shapes: dict[Cube, tuple[_Shape, str | None]],
    ledger_schema: str | None,
) -> None:
    group, reader = sql.Identifier(PASSTHROUGH_ROLE), sql.Identifier(READER_ROLE)
    database = sql.Identifier(analyst_database)
    conn.execute(sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(database))
    conn.execute(sql.SQL("GRANT CONNECT, TEMPORARY ON DATABASE {} TO {}").format(database, group))
    conn.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(database, reader))
    conn.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
    for cube, (columns, comment) in shapes.items():
        _stand_in(conn, cube, columns, comment)
    for query, kind, right in (
        (STATISTICS_FUNCTIONS_SQL, "FUNCTION", "EXECUTE"),
        (STATISTICS_VIEWS_SQL, "TABLE", "SELECT"),
    ):
        # without parameters psycopg leaves the query's '%' alone
        for (name,) in conn.execute(query.replace("$1", "'public'")).fetchall():
            conn.execute(sql.SQL(f"REVOKE {right} ON {kind} {name} FROM PUBLIC"))
    if ledger_schema is not None:
        for owned in (ledger_schema, "dp"):
            conn.execute(
                sql.SQL("CREATE SCHEMA IF NOT EXISTS {} AUTHORIZATION {}").format(
                    sql.Identifier(owned), reader
                )
            )


def _shadows(
    conn: psycopg.Connection[tuple[object, ...]], analyst_database: str, analysts: list[str]
) -> None:
    """Empty views named like the statistics views, found first on the analysts' search_path.

    Tools that read statistics while listing tables (Metabase's sync joins
    ``pg_stat_user_tables`` for an estimated row count) then get no rows instead of an error,
    and nothing about any table: the views select no rows from nothing.
    """
    group, schema = sql.Identifier(PASSTHROUGH_ROLE), sql.Identifier(SHADOW_SCHEMA)
    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(schema))
    conn.execute(sql.SQL("REVOKE ALL ON SCHEMA {} FROM PUBLIC").format(schema))
    conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(schema, group))
    conn.execute(
        sql.SQL("COMMENT ON SCHEMA {} IS {}").format(
            schema,
            sql.Literal("dpproxy: statistics views without rows, for analysts' tools"),
        )
    )
    views: dict[str, list[sql.Composable]] = {}
    for view, column, kind in conn.execute(_STATISTICS_VIEW_COLUMNS_SQL).fetchall():
        views.setdefault(str(view), []).append(
            sql.SQL("NULL::{} AS {}").format(sql.SQL(str(kind)), sql.Identifier(str(column)))
        )
    for view, columns in views.items():
        name = sql.Identifier(SHADOW_SCHEMA, view)
        conn.execute(
            sql.SQL("CREATE OR REPLACE VIEW {} AS SELECT {} WHERE false").format(
                name, sql.SQL(", ").join(columns)
            )
        )
        conn.execute(sql.SQL("REVOKE ALL ON {} FROM PUBLIC").format(name))
        conn.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(name, group))
    for role in analysts:
        conn.execute(
            sql.SQL("ALTER ROLE {} IN DATABASE {} SET search_path TO {}").format(
                sql.Identifier(role), sql.Identifier(analyst_database), sql.SQL(ANALYST_SEARCH_PATH)
            )
        )


def _stand_in(
    conn: psycopg.Connection[tuple[object, ...]], cube: Cube, columns: _Shape, comment: str | None
) -> None:
    """The empty table of the protected table's shape, readable by analysts."""
    schema, table = sql.Identifier(cube.schema), sql.Identifier(cube.schema, cube.table)
    group = sql.Identifier(PASSTHROUGH_ROLE)
    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(schema))
    conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(schema, group))
    name = table.as_string(conn)
    if conn.execute("SELECT to_regclass(%s) IS NOT NULL", (name,)).fetchone() == (True,):
        if conn.execute(sql.SQL("SELECT EXISTS (SELECT FROM {})").format(table)).fetchone() != (
            False,
        ):
            raise ConfigError(
                f"analyst database: {cube.qualified_name} holds rows; it must be the empty "
                "stand-in of the protected table",
                hint=f"TRUNCATE {cube.qualified_name} in the analyst database",
            )
        existing = tuple(conn.execute(_SHAPE_SQL, (name,)).fetchall())
        if existing == columns:
            conn.execute(sql.SQL("REVOKE ALL ON {} FROM PUBLIC").format(table))
            conn.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(table, group))
            _comments(conn, table, columns, comment)
            return
        conn.execute(sql.SQL("DROP TABLE {}").format(table))  # the protected table changed
    definition = sql.SQL(", ").join(
        sql.SQL("{} {}{}").format(
            sql.Identifier(n), sql.SQL(t), sql.SQL(" NOT NULL" if not_null else "")
        )
        for n, t, not_null, _ in columns
    )
    try:
        conn.execute(sql.SQL("CREATE TABLE {} ({})").format(table, definition))
    except psycopg.errors.UndefinedObject as e:
        raise ConfigError(
            f"analyst database: cannot create the stand-in of {cube.qualified_name}: {e}",
            hint="create the column's type in the analyst database too",
        ) from None
    conn.execute(sql.SQL("REVOKE ALL ON {} FROM PUBLIC").format(table))
    conn.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(table, group))
    _comments(conn, table, columns, comment)


def _comments(
    conn: psycopg.Connection[tuple[object, ...]],
    table: sql.Identifier,
    columns: _Shape,
    comment: str | None,
) -> None:
    conn.execute(sql.SQL("COMMENT ON TABLE {} IS {}").format(table, sql.Literal(comment)))
    for name, _, _, text in columns:
        column = sql.SQL("{}.{}").format(table, sql.Identifier(name))
        conn.execute(sql.SQL("COMMENT ON COLUMN {} IS {}").format(column, sql.Literal(text)))
