"""Where a session's pass-through connection logs in, and how it opens the socket."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
from dataclasses import dataclass
from typing import Final

from psycopg.conninfo import conninfo_to_dict

from proxy.auth import passthrough_password
from proxy.errors import ConnectionFailure
from proxy.server.connection import Connection

__all__ = ["UpstreamAddress", "CONNECT_TIMEOUT"]

#: Seconds to open the backend's socket, and (in `proxy.server.upstream`) to log in.
CONNECT_TIMEOUT: Final = 10.0


@dataclass(frozen=True, slots=True)
class UpstreamAddress:
    """Where the pass-through role logs in, read from a libpq connection string or URI.

    ``host`` starting with ``/`` is a Unix-socket directory, as in libpq. With ``role_template``,
    each analyst logs in as a role of their own (`for_user`), with the password derived from
    ``secret`` (none without it).
    """

    host: str
    port: int
    user: str
    password: str | None
    database: str
    sslmode: str = "prefer"
    role_template: str | None = None
    secret: str | None = None

    def for_user(self, user: str) -> UpstreamAddress:
        """The address analyst ``user``'s session logs in at: their own role."""
        if self.role_template is None:
            return self
        role = self.role_template.replace("{user}", user)
        password = None if self.secret is None else passthrough_password(self.secret, role)
        return dataclasses.replace(self, user=role, password=password)

    def __repr__(self) -> str:  # no password in logs
        return f"UpstreamAddress({self.user}@{self.host}:{self.port}/{self.database})"

    @classmethod
    def from_dsn(
        cls, dsn: str, role_template: str | None = None, secret: str | None = None
    ) -> UpstreamAddress:
        """Read a DSN, filling gaps from PG* environment variables as libpq does.

        >>> UpstreamAddress.from_dsn("postgresql://u:pw@/db?host=/tmp/s")
        UpstreamAddress(u@/tmp/s:5432/db)
        """
        info = conninfo_to_dict(dsn)
        host = str(info.get("host") or os.environ.get("PGHOST") or "/var/run/postgresql").split(
            ","
        )[0]
        port = int(str(info.get("port") or os.environ.get("PGPORT") or 5432).split(",")[0])
        user = str(info.get("user") or os.environ.get("PGUSER") or "postgres")
        password = info.get("password") or os.environ.get("PGPASSWORD")
        database = str(info.get("dbname") or os.environ.get("PGDATABASE") or user)
        sslmode = str(info.get("sslmode") or os.environ.get("PGSSLMODE") or "prefer")
        return cls(
            host,
            port,
            user,
            None if password is None else str(password),
            database,
            sslmode,
            role_template,
            secret,
        )

    @property
    def is_unix(self) -> bool:
        """The host is a socket directory."""
        return self.host.startswith("/")

    async def open(self) -> Connection:
        """Open a plain connection (TLS, if any, is negotiated afterwards)."""
        loop = asyncio.get_running_loop()
        try:
            if self.is_unix:
                path = os.path.join(self.host, f".s.PGSQL.{self.port}")
                _, conn = await asyncio.wait_for(
                    loop.create_unix_connection(Connection, path), CONNECT_TIMEOUT
                )
            else:
                _, conn = await asyncio.wait_for(
                    loop.create_connection(Connection, self.host, self.port), CONNECT_TIMEOUT
                )
        except (TimeoutError, OSError) as e:
            raise ConnectionFailure(f"cannot reach the PostgreSQL backend: {e}") from None
        sock = conn.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn
