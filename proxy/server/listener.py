"""The listening server: accepts clients, runs one `Session` each, and shuts down in stages.

`open_server` checks the backend before it listens (the reader sees every dimension's column;
no analyst's pass-through role can reach protected rows or their statistics: `check_boundary`),
and `run` is what ``dpproxy serve`` does: start the embedded PostgreSQL when the config names no
backend, listen (on uvloop unless ``listen.event_loop`` says otherwise: `proxy.server.loops`),
print how to connect, and on SIGINT/SIGTERM stop listening, close idle sessions (57P01), give busy
ones ``listen.shutdown_timeout`` seconds to finish, then cancel them; a second signal cancels at
once.

Over ~400 lines because the start-up checks (`check_boundary`, `check_ledger_home`) stand
beside the start-up they guard: they log in as an analyst's pass-through role, which is the
server's business, not storage's.
"""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import hashlib
import logging
import os
import signal
import socket
import ssl
import sys
from pathlib import Path
from typing import Final

import asyncpg

from proxy.config import DEMO_USERS, BackendConfig, Config
from proxy.dp.answering import DpService
from proxy.dp.memo import DpMemo
from proxy.dp.routing import Router
from proxy.errors import ConfigError, ConnectionFailure
from proxy.logs import event
from proxy.server.address import UpstreamAddress
from proxy.server.connection import Connection
from proxy.server.context import SessionContext
from proxy.server.loops import loop_factory, loop_name
from proxy.server.session import Session
from proxy.storage.factorization_checkpoints import FactorizationCheckpoints
from proxy.storage.postgres_ledger import PostgresLedgerStore
from proxy.storage.provision import (
    FORBIDDEN_MEMBERSHIPS,
    PASSTHROUGH_ROLE,
    SHADOW_SCHEMA,
    STATISTICS_FUNCTIONS_SQL,
    STATISTICS_VIEWS_SQL,
)
from proxy.storage.reader import Reader
from proxy.workers import Workers
from sqlmap.canonical import quote_ident

__all__ = [
    "Server",
    "open_server",
    "embedded_backend",
    "check_boundary",
    "check_ledger_home",
    "run",
    "DATA_DIR_ENV",
]

#: Environment variable naming the embedded PostgreSQL's data directory.
DATA_DIR_ENV: Final = "DPPROXY_DATA_DIR"
_DEFAULT_DATA_DIR: Final = Path(".dpproxy/pgdata")


class Server:
    """A listening dpproxy: its sessions, its reader pool, and its shutdown."""

    def __init__(
        self, ctx: SessionContext, reader: Reader, ledger: PostgresLedgerStore | None = None
    ) -> None:
        self.ctx = ctx
        self.reader = reader
        self.ledger = ledger
        self._listener: asyncio.Server | None = None
        self._tasks: dict[asyncio.Task[None], Session] = {}
        self._closed = asyncio.Event()

    async def start(self, host: str, port: int) -> None:
        """Listen on host:port (port 0: any free port)."""
        loop = asyncio.get_running_loop()
        try:
            self._listener = await loop.create_server(
                lambda: Connection(self._accept), host, port, reuse_address=True
            )
        except OSError as e:
            raise ConfigError(
                f"listen: cannot listen on {host}:{port}: {e.strerror or e}",
                hint="another server may hold that port: choose one with --port or listen.port",
            ) from None
        event("listening", host=host, port=self.port, event_loop=loop_name(loop))

    @property
    def port(self) -> int:
        """The port listened on."""
        assert self._listener is not None
        return int(self._listener.sockets[0].getsockname()[1])

    def _accept(self, conn: Connection) -> None:
        sock = conn.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        session = Session(self.ctx, conn)
        task = asyncio.get_running_loop().create_task(session.run())
        self._tasks[task] = session
        task.add_done_callback(self._tasks.pop)

    @property
    def sessions(self) -> list[Session]:
        """The sessions open now."""
        return list(self._tasks.values())

    async def shutdown(self, timeout: float) -> None:
        """Stop listening, close idle sessions, wait up to ``timeout`` s, then cancel the rest."""
        if self.ctx.shutting_down:
            await self._closed.wait()
            return
        self.ctx.shutting_down = True
        event("shutdown", sessions=len(self._tasks), timeout=timeout)
        if self._listener is not None:
            self._listener.close()
        for session in self.sessions:
            session.request_shutdown()
        if self._tasks:
            _, pending = await asyncio.wait(list(self._tasks), timeout=timeout)
            if pending:
                event("shutdown_cancel", logging.WARNING, sessions=len(pending))
                self.force()
                await asyncio.wait(pending, timeout=5)
        await self.ctx.service.close()  # (its checkpoints: the next start's factorizations)
        await self.reader.close()
        if self.ledger is not None:
            await self.ledger.close()
        self.ctx.service.workers.close()  # an abandoned plan must not hold the process open
        event("stopped")
        self._closed.set()

    def force(self) -> None:
        """Cancel every session now (the second signal)."""
        for task in list(self._tasks):
            task.cancel()


def _tls_context(config: Config) -> ssl.SSLContext | None:
    listen = config.listen
    if listen.tls_cert is None or listen.tls_key is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(listen.tls_cert, listen.tls_key)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(
            f"{config.source}: listen.tls_cert: cannot load the certificate and key: {e}"
        ) from None
    return context


async def check_boundary(config: Config, backend: BackendConfig) -> None:
    """Refuse to start if the pass-through path could see protected rows or their statistics.

    Checks, as the first analyst's role in the analyst database, every analyst's role: it exists
    and may log in, holds no attribute or membership that reads every table or statistic or
    signals other roles, cannot connect to the private database, and can neither read a
    statistics view nor run a statistics function there; that the statistics views' shadows
    it reads show no rows; and every protected table's stand-in exists and is empty.

    Raises:
        ConfigError: any of these fails.
        ConnectionFailure: the backend cannot be reached.
    """
    try:
        reader = await asyncpg.connect(backend.dsn)
    except (OSError, asyncpg.PostgresError) as e:
        raise ConnectionFailure(f"backend.dsn: cannot connect: {e}") from None
    try:
        private = str(await reader.fetchval("SELECT current_database()"))
    finally:
        await reader.close()
    roles = {user: backend.role_for(user) for user in config.users}
    first = UpstreamAddress.from_dsn(
        backend.passthrough_dsn, backend.passthrough_role, backend.passthrough_secret
    ).for_user(next(iter(config.users)))
    try:
        conn = await asyncpg.connect(
            backend.passthrough_dsn, user=first.user, password=first.password
        )
    except (OSError, asyncpg.PostgresError) as e:
        raise ConnectionFailure(
            f"backend.passthrough_dsn: cannot connect as {first.user}: {e}",
            hint="run `dpproxy provision` to create the analysts' roles",
        ) from None
    where = "backend.passthrough_dsn"
    try:
        if await conn.fetchval("SELECT current_database()") == private:
            raise ConfigError(f"{where}: names {private}, the database of the protected tables")
        for user, role in roles.items():
            attributes = await conn.fetchrow(
                "SELECT rolcanlogin, rolsuper OR rolcreaterole OR rolbypassrls OR rolreplication "
                "FROM pg_roles WHERE rolname = $1",
                role,
            )
            if attributes is None or not attributes[0]:
                raise ConfigError(
                    f"{where}: user {user}'s role {role} does not exist or cannot log in",
                    hint="run `dpproxy provision` after adding users",
                )
            if attributes[1]:
                raise ConfigError(
                    f"{where}: role {role} is a superuser or may create roles, bypass row "
                    "security or replicate, and could read protected rows"
                )
            member = await conn.fetchval(
                "SELECT min(r.rolname) FROM pg_roles r WHERE r.rolname <> $1 "
                "AND (r.rolname = ANY($2::text[]) OR r.rolname = ANY($3::text[])) "
                "AND pg_has_role($1, r.oid, 'MEMBER')",
                role,
                list(FORBIDDEN_MEMBERSHIPS),
                list(roles.values()),
            )
            if member is not None:
                raise ConfigError(
                    f"{where}: role {role} is a member of {member}",
                    detail="it could read protected rows or statistics, or other analysts' "
                    "sessions",
                    hint=f"REVOKE {quote_ident(member)} FROM {quote_ident(role)}",
                )
            if await conn.fetchval(
                "SELECT has_database_privilege($1, $2, 'CONNECT')", role, private
            ):
                raise ConfigError(
                    f"{where}: role {role} may connect to {private}, "
                    "the database of the protected tables",
                    hint=f"REVOKE CONNECT ON DATABASE {quote_ident(private)} FROM PUBLIC, "
                    f"{quote_ident(role)}",
                )
            for query, kind in ((STATISTICS_FUNCTIONS_SQL, "run"), (STATISTICS_VIEWS_SQL, "read")):
                leaks = await conn.fetch(query, role)
                if leaks:
                    raise ConfigError(
                        f"{where}: role {role} may {kind} {leaks[0][0]} "
                        f"({len(leaks)} statistics {'functions' if kind == 'run' else 'views'})",
                        detail="they show counts and sizes of tables in every database",
                        hint="run `dpproxy provision`, which revokes them from PUBLIC",
                    )
        shadows = await conn.fetch(
            "SELECT format('%I.%I', $1::text, c.relname) FROM pg_class c "
            "WHERE c.relnamespace = to_regnamespace($1) AND has_table_privilege(c.oid, 'SELECT')",
            SHADOW_SCHEMA,
        )
        for (shadow,) in shadows:
            # the analysts' search_path finds these before pg_catalog's statistics views
            if await conn.fetchval(f"SELECT EXISTS (SELECT FROM {shadow})"):
                raise ConfigError(
                    f"{where}: {shadow} shows rows; the statistics views' shadows must be empty",
                    hint="run `dpproxy provision`, which recreates them",
                )
        for cube in config.cubes:
            name = f"{quote_ident(cube.schema)}.{quote_ident(cube.table)}"
            if not await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", name):
                raise ConfigError(
                    f"{where}: the analyst database has no stand-in for {cube.qualified_name}",
                    hint="run `dpproxy provision`",
                )
            try:
                rows = await conn.fetchval(f"SELECT EXISTS (SELECT FROM {name})")
            except asyncpg.InsufficientPrivilegeError:
                rows = False  # invisible to analysts: harmless, though BI tools miss it
            if rows:
                raise ConfigError(
                    f"{where}: the stand-in of {cube.qualified_name} in the analyst database "
                    "holds rows; it must be empty"
                )
    finally:
        await conn.close()


async def check_ledger_home(backend: BackendConfig) -> None:
    """Refuse to start a fresh ledger while an older one sits in the private database.

    The ledger's default home moved there to the analyst database; starting afresh would
    forget the budget already spent.
    """
    if backend.ledger_dsn is None:
        return
    # the catalog, not to_regclass: the reader may lack USAGE on an old ledger's schema
    found = (
        "SELECT current_database(), EXISTS (SELECT FROM pg_class c JOIN pg_namespace n "
        "ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = 'tables')"
    )
    try:
        private, old = await _fetch_row(backend.dsn, found, backend.ledger_schema)
        home, new = await _fetch_row(backend.ledger_dsn, found, backend.ledger_schema)
    except (OSError, asyncpg.PostgresError) as e:
        raise ConnectionFailure(f"ledger: cannot connect: {e}") from None
    if old and not new and private != home:
        raise ConfigError(
            f"ledger: {private} holds a ledger ({backend.ledger_schema}) and {home}, where the "
            "ledger now lives, has none; starting afresh would forget the budget spent",
            hint=f"move it: pg_dump -n {backend.ledger_schema} {private} | psql {home} "
            f"(then drop it from {private}), or set ledger.dsn to {private}",
        )


async def _fetch_row(dsn: str, query: str, *args: object) -> asyncpg.Record:
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetchrow(query, *args)
    finally:
        await conn.close()


async def open_server(
    config: Config, backend: BackendConfig, host: str | None = None, port: int | None = None
) -> Server:
    """Check the backend, then listen; the caller owns the returned server."""
    tls = _tls_context(config)
    await check_boundary(config, backend)
    await check_ledger_home(backend)
    try:
        reader = await Reader.connect(backend.dsn)
    except (OSError, asyncpg.PostgresError) as e:
        raise ConnectionFailure(f"backend.dsn: cannot connect: {e}") from None
    ledger: PostgresLedgerStore | None = None
    try:
        for cube in config.cubes:
            await reader.check_columns(cube)
        router = Router(config.translator(), config.cubes)
        workers = Workers(config.limits.workers)
        timeout = config.limits.planning_timeout
        if backend.ledger_dsn is None:
            service = DpService(
                config.cubes,
                reader,
                caps=config.caps(),
                workers=workers,
                planning_timeout=timeout,
            )
        else:
            ledger = await PostgresLedgerStore.open(
                backend.ledger_dsn, config.cubes, backend.ledger_schema, PASSTHROUGH_ROLE
            )
            checkpoints = config.ledger.checkpoints
            service = await DpService.open_durable(
                config.cubes,
                reader,
                ledger,
                caps=config.caps(),
                workers=workers,
                planning_timeout=timeout,
                checkpoints=None if checkpoints is None else FactorizationCheckpoints(checkpoints),
                checkpoint_every=config.ledger.checkpoint_every,
            )
            for cube in config.cubes:
                event(
                    "ledger_loaded",
                    schema=backend.ledger_schema,
                    table=cube.qualified_name,
                    entries=service.engine(cube).history_size,
                    spent=float(service.engine(cube).budget.spent),
                )
        ctx = SessionContext(
            router=router,
            translator=config.translator(),
            service=service,
            memo=DpMemo(router, service),
            defaults=config.privacy.defaults,
            upstream=UpstreamAddress.from_dsn(
                backend.passthrough_dsn, backend.passthrough_role, backend.passthrough_secret
            ),
            users=config.users,
            database=config.listen.database,
            max_connections=config.listen.max_connections,
            limits=config.limits,
            tls=tls,
            mock_secret=hashlib.sha256(
                "\n".join(sorted(map(str, config.users.values()))).encode()
            ).digest(),
        )
        server = Server(ctx, reader, ledger)
        await server.start(host or config.listen.host, config.listen.port if port is None else port)
    except BaseException:
        await reader.close()
        if ledger is not None:
            await ledger.close()
        raise
    return server


def embedded_backend(config: Config) -> BackendConfig:
    """Start the embedded PostgreSQL, load the Adult demo table, and set up the boundary.

    The tables stay in the server's ``postgres`` database; analysts' sessions and the ledger
    go to a database named like ``listen.database`` (`proxy.storage.provision`).
    """
    from proxy.demo import load_adult
    from proxy.embedded import start_embedded
    from proxy.storage.provision import provision_roles

    data_dir = Path(os.environ.get(DATA_DIR_ENV) or _DEFAULT_DATA_DIR)
    event("embedded_postgres", data_dir=str(data_dir))
    admin = start_embedded(data_dir)
    if any(c.qualified_name == "public.adult" for c in config.cubes):
        load_adult(admin)
    roles = provision_roles(
        admin,
        config.cubes,
        config.ledger.schema,
        users=config.users,
        analyst_database=config.listen.database,
    )
    return BackendConfig(
        roles.reader_dsn,
        roles.passthrough_dsn,
        config.ledger.dsn or roles.ledger_dsn,
        config.ledger.schema,
    )


def _connect_hint(config: Config, server: Server, host: str) -> str:
    where = f"{host}:{server.port}/{config.listen.database}"
    if config.users is DEMO_USERS:
        return f'dpproxy is ready: psql "postgresql://analyst:analyst@{where}"'
    return f"dpproxy is ready: postgresql://<user>@{where}"


async def _serve(config: Config, backend: BackendConfig, host: str, port: int) -> None:
    server = await open_server(config, backend, host, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        if stop.is_set():
            event("shutdown_forced", signal=signal.Signals(signum).name)
            server.force()
        else:
            event("signal", signal=signal.Signals(signum).name)
            stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    print(_connect_hint(config, server, host), flush=True)
    await stop.wait()
    await server.shutdown(config.listen.shutdown_timeout)


#: glibc's mallopt parameters (malloc.h), and the values the server sets
_M_TRIM_THRESHOLD: Final = -1
_M_MMAP_THRESHOLD: Final = -3
_MMAP_THRESHOLD: Final = 4 * 2**20
_TRIM_THRESHOLD: Final = 64 * 2**20


def return_freed_memory() -> bool:
    """Have glibc map each block over 4 MB on its own, given back to the OS when freed.

    A plan's temporaries (numpy arrays of megabytes, in the worker threads) are freed when it
    ends, but glibc raises its threshold to the size of each large block freed (up to 32 MB)
    and keeps later blocks below it in the threads' arenas, where fragmentation holds them:
    the server's RSS grew from 0.7 to 2.8 GB over 240 statements on a history of 100,000
    rows. Setting the threshold stops that raising, and the trim threshold's too: that one is
    set high (64 MB), so that smaller blocks are reused rather than given back and faulted in
    again at every statement. False where the C library is not glibc (nothing is changed).
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(
        mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD) and mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
    )


def run(config: Config, host: str | None = None, port: int | None = None) -> int:
    """``dpproxy serve``: run until SIGINT/SIGTERM; the exit status."""
    return_freed_memory()
    if config.backend is None:
        backend = embedded_backend(config)
    else:
        backend = dataclasses.replace(
            config.backend,
            ledger_dsn=config.ledger.dsn or config.backend.reader_in_analyst_database,
            ledger_schema=config.ledger.schema,
        )
        if config.users is DEMO_USERS:
            event(
                "demo_account",
                logging.WARNING,
                message="no users section: the demo account analyst/analyst is enabled",
            )
    with asyncio.Runner(loop_factory=loop_factory(config.listen.event_loop)) as runner:
        runner.run(
            _serve(
                config,
                backend,
                host or config.listen.host,
                config.listen.port if port is None else port,
            )
        )
    print("dpproxy stopped", file=sys.stderr)
    return 0
