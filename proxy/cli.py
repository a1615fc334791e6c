"""The ``dpproxy`` command line: maps flags and environment onto the config and runs a command."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import getpass
import os
import sys
from collections.abc import Sequence
from fractions import Fraction

import asyncpg

from proxy.auth import make_verifier
from proxy.config import PASSTHROUGH_ROLE_TEMPLATE, Config, load_config
from proxy.engine.budget import format_budget
from proxy.errors import ConfigError, DpproxyError
from proxy.server.loops import EVENT_LOOPS
from sqlmap.canonical import COLUMN_TYPES_SQL, check_column_types
from sqlmap.cube import Cube
from sqlmap.translate import AnswerSpec, OutputKind

__all__ = ["main"]

DEFAULT_CONFIG = "config.yaml"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dpproxy",
        description="A PostgreSQL proxy that answers aggregate queries under differential privacy.",
    )
    config_help = "path to config.yaml (default: $DPPROXY_CONFIG or ./config.yaml)"
    parser.add_argument(
        "--config", default=os.environ.get("DPPROXY_CONFIG", DEFAULT_CONFIG), help=config_help
    )
    # `--config` also after the command, like --host and --port; SUPPRESS keeps an absent one
    # from overwriting the value given before the command
    after = argparse.ArgumentParser(add_help=False)
    after.add_argument("--config", default=argparse.SUPPRESS, help=config_help)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    command = functools.partial(commands.add_parser, parents=[after])
    check = command(
        "check", help="validate config.yaml; with --dsn, also against the backend's columns"
    )
    check.add_argument("--dsn", help="PostgreSQL DSN of the role that reads the protected tables")
    translate = command("translate", help="show the query vectors dpproxy derives from a SQL query")
    translate.add_argument(
        "sql", help='the query, e.g. "SELECT COUNT(*) FROM adult WHERE age < 25"'
    )
    serve = command(
        "serve",
        help="run the PostgreSQL wire-protocol server (embedded demo PostgreSQL without a backend)",
    )
    serve.add_argument("--host", help="address to listen on (default: listen.host, 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to listen on (default: listen.port, 6432)")
    serve.add_argument(
        "--loop",
        choices=EVENT_LOOPS,
        help="event loop: uvloop if installed (auto), asyncio or uvloop "
        "(default: listen.event_loop, auto)",
    )
    serve.add_argument(
        "--log-level",
        default=os.environ.get("DPPROXY_LOG_LEVEL", "INFO"),
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="log level (default: INFO)",
    )
    provision = command(
        "provision",
        help="set up the roles, the analyst database and the grants on a server you administer",
    )
    provision.add_argument(
        "--dsn",
        required=True,
        help="a superuser DSN, in the database that holds the protected tables",
    )
    provision.add_argument(
        "--load-demo", action="store_true", help="load the Adult demo table first"
    )
    passwd = command(
        "passwd",
        help="print the SCRAM-SHA-256 verifier of a password, for config.yaml's users section",
    )
    passwd.add_argument("user", nargs="?", help="print a `user: verifier` line for this user")
    ledger = command("ledger", help="inspect, export or maintain the privacy ledger")
    ledger.add_argument(
        "--dsn",
        help="the ledger's DSN (default: ledger.dsn, else backend.dsn in the analyst database, "
        "else the embedded)",
    )
    actions = ledger.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("status", help="budget spent and answers given, per protected table")
    recent = actions.add_parser("history", help="the most recent answers")
    recent.add_argument("--limit", type=int, default=50)
    actions.add_parser("export", help="every table, measurement and answer as JSON lines")
    changed = actions.add_parser(
        "mark-changed", help="the table's data changed: stop reusing earlier answers"
    )
    changed.add_argument("table", help="schema.table, as in config.yaml")
    rekey = actions.add_parser(
        "rekey", help="start a new history for a table whose cube changed, keeping its spending"
    )
    rekey.add_argument("table", help="schema.table, as in config.yaml")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dpproxy`` console script; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "passwd":
            return _passwd(args.user)
        config = load_config(args.config)
        if args.command == "check":
            return _check(config, args.dsn)
        if args.command == "serve":
            return _serve(config, args)
        if args.command == "provision":
            return _provision(config, args.dsn, args.load_demo)
        if args.command == "ledger":
            return asyncio.run(_ledger(config, args))
        return _translate(config, args.sql)
    except DpproxyError as e:
        print(f"dpproxy: {e.sqlstate}: {e}", file=sys.stderr)
        return 1


async def _ledger(config: Config, args: argparse.Namespace) -> int:
    from proxy.storage import ledger_admin

    dsn = (
        args.dsn
        or config.ledger.dsn
        or (config.backend.reader_in_analyst_database if config.backend else None)
    )
    if dsn is None:
        from proxy.server.listener import embedded_backend

        dsn = embedded_backend(config).ledger_dsn
    assert dsn is not None
    schema = config.ledger.schema
    if args.action == "status":
        for t in await ledger_admin.status(dsn, config.cubes, schema):
            print(
                f"{t.table}: spent {format_budget(t.spent, up=True)} of "
                f"{format_budget(t.total, up=False)}, "
                f"remaining {format_budget(t.remaining, up=False)}; "
                f"answers fresh {t.fresh}, combined {t.combined}, history {t.history}, "
                f"refused {t.refused}; data version {t.data_version}, cube {t.fingerprint}"
            )
    elif args.action == "history":
        for row in await ledger_admin.history(dsn, schema, args.limit):
            print(
                f"{row['created_at']:%Y-%m-%d %H:%M:%S} {row['table']} {row['source']} "
                f"budget {format_budget(Fraction(str(row['budget'])), up=True)} "
                f"user {row['user_name']}: {row['sql_text']}"
            )
    elif args.action == "export":
        async for line in ledger_admin.export(dsn, schema):
            print(line)
    elif args.action == "mark-changed":
        version = await ledger_admin.mark_changed(
            dsn, _cube(config, args.table).qualified_name, schema
        )
        print(f"{args.table}: data version {version}; earlier answers are no longer reused")
    else:
        carried = await ledger_admin.rekey(dsn, _cube(config, args.table), schema)
        print(
            f"{args.table}: new history; every cell starts at the spent "
            f"{format_budget(carried, up=True)}"
        )
    return 0


def _cube(config: Config, name: str) -> Cube:
    for cube in config.cubes:
        if name in (cube.qualified_name, cube.table):
            return cube
    raise ConfigError(f"{name} is not a protected table of {config.source}")


def _check(config: Config, dsn: str | None) -> int:
    for cube in config.cubes:
        dims = ", ".join(f"{d.name} ({d.size})" for d in cube.dimensions)
        sums = ", ".join(f"{m.name} [{m.lower}, {m.upper}]" for m in cube.measures)
        print(
            f"{cube.qualified_name}: {cube.n_cells} cells = {dims}; "
            + (f"measures {sums}; " if sums else "")
            + f"total budget {cube.total_budget}"
        )
    if dsn:
        asyncio.run(_check_backend(config, dsn))
        print(f"{config.source}: every dimension and measure matches its column in the backend")
    return 0


async def _check_backend(config: Config, dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        for cube in config.cubes:
            rows = await conn.fetch(COLUMN_TYPES_SQL, cube.schema, cube.table)
            check_column_types(cube, {r[0]: r[1] for r in rows})
    finally:
        await conn.close()


def _serve(config: Config, args: argparse.Namespace) -> int:
    from proxy import logs
    from proxy.server.listener import run

    logs.setup(args.log_level)
    if args.loop is not None:
        config = dataclasses.replace(
            config, listen=dataclasses.replace(config.listen, event_loop=args.loop)
        )
    try:
        return run(config, args.host, args.port)
    except asyncpg.PostgresError as e:
        # a right or an object the backend's roles lack, met while starting: one line, no
        # traceback, and where to fix it
        hint = (
            "run `dpproxy provision --dsn <superuser DSN>` on that server (docs/deploy.md), "
            "which creates the roles, the analyst database and the ledger schema with the "
            "rights dpproxy needs"
        )
        print(f"dpproxy: {e.sqlstate}: backend: {e}\nHINT: {hint}", file=sys.stderr)
        return 1


def _provision(config: Config, dsn: str, load_demo: bool) -> int:
    import psycopg

    from proxy.demo import load_adult
    from proxy.storage.provision import PASSTHROUGH_ROLE, READER_ROLE, provision_roles

    backend = config.backend
    try:
        if load_demo:
            print(f"adult: {load_adult(dsn)} rows")
        # without a ledger DSN of its own, the reader role writes the ledger
        provision_roles(
            dsn,
            config.cubes,
            config.ledger.schema if config.ledger.dsn is None else None,
            users=config.users,
            analyst_database=backend.analyst_database if backend else config.listen.database,
            role_template=backend.passthrough_role if backend else PASSTHROUGH_ROLE_TEMPLATE,
            secret=backend.passthrough_secret if backend else None,
        )
    except psycopg.Error as e:
        print(f"dpproxy: {e.sqlstate or '08006'}: {e}", file=sys.stderr)
        return 1
    tables = ", ".join(c.qualified_name for c in config.cubes)
    print(
        f"{READER_ROLE} may read {tables}; the analysts' roles (members of {PASSTHROUGH_ROLE}) "
        "see empty tables of the same shape in the analyst database"
    )
    return 0


def _passwd(user: str | None) -> int:
    if sys.stdin.isatty():
        password = getpass.getpass("Password: ")
        if getpass.getpass("Again: ") != password:
            print("dpproxy: the passwords differ", file=sys.stderr)
            return 1
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        print("dpproxy: empty password", file=sys.stderr)
        return 1
    verifier = make_verifier(password)
    print(f'{user}: "{verifier}"' if user else verifier)
    return 0


def _translate(config: Config, sql: str) -> int:
    spec = config.translator().translate(sql)
    print(describe(spec))
    return 0


def describe(spec: AnswerSpec) -> str:
    """A readable account of a translation: what is measured, over which cells."""
    lines = [f"table: {spec.cube.qualified_name} ({spec.cube.n_cells} cells)"]
    if spec.accuracy is None:
        lines.append("accuracy: none given (add WITH ACCURACY <eps> CONFIDENCE <c>)")
    else:
        lines.append(
            f"accuracy: +-{spec.accuracy.eps:g} at confidence {spec.accuracy.confidence:g}"
        )
    aggregates = [c for c in spec.columns if c.kind is OutputKind.AGGREGATE]
    ratios = [c for c in spec.columns if c.kind is OutputKind.RATIO]
    lines.append(
        f"rows: {len(spec.rows)}"
        + (f" (GROUP BY {', '.join(spec.group_dims)})" if spec.group_dims else "")
    )
    for row in spec.rows:
        keys = ", ".join(k.label for k in row.keys)
        prefix = f"  [{keys}] " if keys else "  "
        for column, q in zip(aggregates, row.queries):
            lines.append(
                f"{prefix}{column.name} = {column.sql}: {q.cell_sensitivities()[0].size} cells, "
                f"sensitivity {q.sensitivity:g}, offset {q.offset:g}"
            )
        for column, (n, d) in zip(ratios, row.ratios):
            lines.append(
                f"{prefix}{column.name} = {column.sql}: ratio of {n.cells.size} cells "
                f"(sensitivity {n.sensitivity:g}) over {d.cells.size} cells "
                f"(sensitivity {d.sensitivity:g}), answered in rounds"
            )
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
