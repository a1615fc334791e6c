"""config.yaml: the DBA's declaration, loaded once into frozen, validated values."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from types import MappingProxyType
from typing import Final, overload
from urllib.parse import quote, urlencode

import yaml
from psycopg.conninfo import conninfo_to_dict

from proxy.auth import Verifier, parse_verifier
from proxy.engine.budget import UserCaps
from proxy.errors import ConfigError
from proxy.server.loops import EVENT_LOOPS
from sqlmap.accuracy import AccuracyDefaults
from sqlmap.cube import Cube, cube_from_config
from sqlmap.translate import QueryLimits, Translator

__all__ = [
    "PrivacyConfig",
    "LimitsConfig",
    "ListenConfig",
    "BackendConfig",
    "PASSTHROUGH_ROLE_TEMPLATE",
    "Config",
    "DEMO_USERS",
    "dsn_with",
    "load_config",
    "parse_config",
]

_TOP_KEYS = {"privacy", "tables", "listen", "backend", "users", "ledger", "limits"}
_LEDGER_KEYS = {"dsn", "schema", "checkpoints", "checkpoint_every"}
_PRIVACY_KEYS = {"total_budget", "default_accuracy", "default_confidence", "user_budget"}
_USER_KEYS = {"verifier", "user_budget"}
_LISTEN_KEYS = {
    "host",
    "port",
    "database",
    "tls_cert",
    "tls_key",
    "max_connections",
    "shutdown_timeout",
    "event_loop",
}
_BACKEND_KEYS = {"dsn", "passthrough_dsn", "passthrough_role", "passthrough_secret"}

#: The analysts' pass-through role names (``backend.passthrough_role``), one role per analyst.
PASSTHROUGH_ROLE_TEMPLATE: Final = "dpproxy_pt_{user}"

#: The demo account ``analyst`` / ``analyst`` (its SCRAM-SHA-256 verifier), used when the config
#: has no ``users`` section.
DEMO_USERS: Final[Mapping[str, Verifier]] = MappingProxyType(
    {
        "analyst": parse_verifier(
            "SCRAM-SHA-256$4096:WsCKTFISJuTDwA2aG58WNg==$bm8zpvzottdOybWi5RKTWQxoRVcMjkuWTa12osNxrio="
            ":CYff2FTqmz3kGpKL6n/1dEdocEZUTot1PjQZUovf1+k="
        )
    }
)


@dataclass(frozen=True, slots=True)
class PrivacyConfig:
    """Budget and accuracy defaults (documented in docs/config.md)."""

    total_budget: float = 1.0
    default_accuracy: float | None = None
    default_confidence: float = 0.95
    user_budget: float | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.total_budget) and self.total_budget > 0):
            raise ConfigError(
                f"privacy.total_budget: must be a positive number, got {self.total_budget!r}"
            )
        _check_user_budget(self.user_budget, "privacy.user_budget")
        if self.default_accuracy is not None and not (
            math.isfinite(self.default_accuracy) and self.default_accuracy > 0
        ):
            raise ConfigError(
                "privacy.default_accuracy: must be a positive number, "
                f"got {self.default_accuracy!r}"
            )
        if not 0 < self.default_confidence < 1:
            raise ConfigError(
                "privacy.default_confidence: must lie strictly between 0 and 1, "
                f"got {self.default_confidence!r}"
            )

    @property
    def defaults(self) -> AccuracyDefaults:
        """What a query asks for without a (complete) WITH ACCURACY clause."""
        return AccuracyDefaults(self.default_accuracy, self.default_confidence)


@dataclass(frozen=True, slots=True)
class ListenConfig:
    """Where and how dpproxy accepts clients (documented in docs/config.md)."""

    host: str = "127.0.0.1"
    port: int = 6432
    database: str = "demo"
    tls_cert: Path | None = None
    tls_key: Path | None = None
    max_connections: int = 100
    shutdown_timeout: float = 10.0
    event_loop: str = "auto"

    def __post_init__(self) -> None:
        if not self.host:
            raise ConfigError("listen.host: must not be empty")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"listen.port: must be 0 to 65535, got {self.port}")
        if not self.database or "\x00" in self.database:
            raise ConfigError("listen.database: must be a non-empty name")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("listen.tls_cert, listen.tls_key: give both or neither")
        if self.max_connections < 1:
            raise ConfigError(
                f"listen.max_connections: must be positive, got {self.max_connections}"
            )
        if not (math.isfinite(self.shutdown_timeout) and self.shutdown_timeout >= 0):
            raise ConfigError(
                "listen.shutdown_timeout: must be a non-negative number, "
                f"got {self.shutdown_timeout}"
            )
        if self.event_loop not in EVENT_LOOPS:
            raise ConfigError(
                f"listen.event_loop: must be one of {', '.join(EVENT_LOOPS)}, "
                f"got {self.event_loop!r}"
            )


@dataclass(frozen=True, slots=True)
class BackendConfig:
    """Where dpproxy logs in: the reader in the private database, analysts in the analyst one.

    Args:
        dsn: the reader role, in the database that holds the protected tables (the *private*
            database); only the measurement SQL dpproxy generates runs under it.
        passthrough_dsn: the *analyst* database, where every other statement runs, one backend
            session per client session, each logged in as its analyst's own role
            (``passthrough_role``); no user or password of its own.
        ledger_dsn: where the durable ledger lives (a role that may create ``ledger_schema``);
            None keeps the history in memory only, which only tests that embed dpproxy do.
        ledger_schema: the ledger's schema.
        passthrough_role: the analysts' role names, ``{user}`` standing for the analyst.
        passthrough_secret: the key their passwords are derived from (`proxy.server.upstream`); None
            logs in without a password (the embedded server's trusted Unix socket).
    """

    dsn: str
    passthrough_dsn: str
    ledger_dsn: str | None = None
    ledger_schema: str = "dpproxy"
    passthrough_role: str = PASSTHROUGH_ROLE_TEMPLATE
    passthrough_secret: str | None = None

    def __post_init__(self) -> None:
        for key in ("dsn", "passthrough_dsn", "ledger_dsn"):
            value = getattr(self, key)
            if value is not None:
                _check_dsn(value, f"backend.{key}")
        info = conninfo_to_dict(self.passthrough_dsn)
        if info.get("user") or info.get("password"):
            raise ConfigError(
                "backend.passthrough_dsn: give no user or password; each analyst logs in as a "
                "role of their own (backend.passthrough_role)",
                hint="e.g. postgresql://db:5432/analytics_dp",
            )
        if not info.get("dbname"):
            raise ConfigError("backend.passthrough_dsn: name the analyst database")
        if info["dbname"] == conninfo_to_dict(self.dsn).get("dbname"):
            raise ConfigError(
                "backend.passthrough_dsn: must name another database than backend.dsn",
                detail="protected tables live in a database analysts' roles cannot connect to",
            )
        if self.passthrough_role.count("{user}") != 1:
            raise ConfigError(
                "backend.passthrough_role: must contain {user} once, "
                f"got {self.passthrough_role!r}"
            )

    @property
    def analyst_database(self) -> str:
        """The database analysts' sessions connect to."""
        return str(conninfo_to_dict(self.passthrough_dsn)["dbname"])

    @property
    def reader_in_analyst_database(self) -> str:
        """The reader role's DSN in the analyst database: the ledger's default home."""
        return dsn_with(self.dsn, dbname=self.analyst_database)

    def role_for(self, user: str) -> str:
        """The pass-through role of analyst ``user``."""
        return self.passthrough_role.replace("{user}", user)

    def __repr__(self) -> str:  # DSNs may hold passwords
        return f"BackendConfig(dsn=..., passthrough_dsn=..., ledger_schema={self.ledger_schema!r})"


@dataclass(frozen=True, slots=True)
class LedgerConfig:
    """Where the durable ledger lives (docs/config.md).

    Args:
        dsn: a role that may create and write ``schema``; None: the reader role, in the
            analyst database (where analysts read the ``dp`` views).
        schema: the ledger's schema; analysts' pass-through roles have no rights on it.
        checkpoints: a directory for each table's factorization checkpoint, which a restart
            takes rather than factoring the ledger's history again; None: none kept.
        checkpoint_every: ledger rows after which a table's checkpoint is written again.
    """

    dsn: str | None = None
    schema: str = "dpproxy"
    checkpoints: Path | None = None
    checkpoint_every: int = 1000

    def __post_init__(self) -> None:
        if self.checkpoint_every < 1:
            raise ConfigError(
                f"ledger.checkpoint_every: must be positive, got {self.checkpoint_every}"
            )

    def __repr__(self) -> str:  # DSNs may hold passwords
        return (
            f"LedgerConfig(dsn={'...' if self.dsn else None}, schema={self.schema!r}, "
            f"checkpoints={self.checkpoints!r}, checkpoint_every={self.checkpoint_every})"
        )


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    """What one statement may cost, so that none stalls the others (docs/config.md, "Limits").

    Args:
        query: what one DP query may ask for (values, weights, accuracy, confidence).
        planning_timeout: seconds the engine may plan one statement; then 57014.
        max_statement_bytes: the longest Query or Parse message; longer ones get 54000.
        max_pipeline_messages: client messages a session buffers before it stops reading.
        max_pipeline_bytes: client bytes a session buffers before it stops reading.
        workers: threads that plan, translate and build results off the event loop.
    """

    query: QueryLimits = QueryLimits()
    planning_timeout: float = 10.0
    max_statement_bytes: int = 1 << 20
    max_pipeline_messages: int = 1000
    max_pipeline_bytes: int = 1 << 22
    workers: int = 2

    def __post_init__(self) -> None:
        if not (math.isfinite(self.planning_timeout) and self.planning_timeout > 0):
            raise ConfigError(
                f"limits.planning_timeout: must be a positive number, got {self.planning_timeout}"
            )
        for key in ("max_statement_bytes", "max_pipeline_messages", "max_pipeline_bytes"):
            if getattr(self, key) < 1:
                raise ConfigError(f"limits.{key}: must be positive, got {getattr(self, key)}")
        if not 1 <= self.workers <= 64:
            raise ConfigError(f"limits.workers: must be between 1 and 64, got {self.workers}")


@dataclass(frozen=True, slots=True)
class Config:
    """The whole configuration.

    ``backend`` None means: start the embedded PostgreSQL with the Adult demo table.
    """

    privacy: PrivacyConfig
    cubes: tuple[Cube, ...]
    source: str = "<config>"
    listen: ListenConfig = ListenConfig()
    backend: BackendConfig | None = None
    users: Mapping[str, Verifier] = field(default_factory=lambda: DEMO_USERS)
    ledger: LedgerConfig = LedgerConfig()
    user_budgets: Mapping[str, float] = field(default_factory=dict)
    limits: LimitsConfig = LimitsConfig()

    def translator(self) -> Translator:
        """A translator for the protected tables with the configured defaults and limits."""
        return Translator(self.cubes, self.privacy.defaults, self.limits.query)

    def caps(self) -> UserCaps:
        """Per-user budgets: ``users.<name>.user_budget``, else ``privacy.user_budget``."""
        default = self.privacy.user_budget
        return UserCaps(
            None if default is None else Fraction(default),
            {name: Fraction(b) for name, b in self.user_budgets.items()},
        )


def load_config(path: str | Path) -> Config:
    """Read and validate a config file; errors start with the file name."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    return parse_config(data, source=str(path))


def parse_config(data: object, source: str = "<config>") -> Config:
    """Validate an already-parsed config mapping."""
    try:
        return _parse(data, source)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e.message}", detail=e.detail, hint=e.hint) from None


def _parse(data: object, source: str) -> Config:
    if not isinstance(data, Mapping):
        raise ConfigError("expected a mapping at the top level")
    _no_unknown_keys(data, _TOP_KEYS, "")
    privacy_spec = data.get("privacy") or {}
    if not isinstance(privacy_spec, Mapping):
        raise ConfigError("privacy: expected a mapping")
    _no_unknown_keys(privacy_spec, _PRIVACY_KEYS, "privacy.")
    privacy = PrivacyConfig(
        total_budget=_number(privacy_spec, "total_budget", "privacy", default=1.0),
        default_accuracy=_number(privacy_spec, "default_accuracy", "privacy"),
        default_confidence=_number(privacy_spec, "default_confidence", "privacy", default=0.95),
        user_budget=_number(privacy_spec, "user_budget", "privacy"),
    )
    tables = data.get("tables")
    if not isinstance(tables, Mapping) or not tables:
        raise ConfigError("tables: declare at least one protected table")
    cubes = tuple(
        cube_from_config(str(name), spec, f"tables.{name}", privacy.total_budget)
        for name, spec in tables.items()
    )
    seen: set[tuple[str, str]] = set()
    for cube in cubes:
        if (cube.schema, cube.table) in seen:
            raise ConfigError(f"tables.{cube.qualified_name}: declared twice")
        seen.add((cube.schema, cube.table))
    base = Path(source).parent if source != "<config>" else Path.cwd()
    users, user_budgets = _users(data["users"]) if "users" in data else (DEMO_USERS, {})
    backend = _backend(data.get("backend"))
    _check_role_names(backend, users)
    return Config(
        privacy,
        cubes,
        source,
        _listen(data.get("listen"), base),
        backend,
        users,
        _ledger(data.get("ledger"), base),
        MappingProxyType(user_budgets),
        _limits(data.get("limits")),
    )


_QUERY_LIMIT_KEYS = {
    "max_values",
    "max_weight",
    "min_accuracy_ratio",
    "max_accuracy_ratio",
    "min_confidence",
}
_SERVER_LIMIT_KEYS = {
    "planning_timeout",
    "max_statement_bytes",
    "max_pipeline_messages",
    "max_pipeline_bytes",
    "workers",
}


def _limits(spec: object) -> LimitsConfig:
    if spec is None:
        return LimitsConfig()
    if not isinstance(spec, Mapping):
        raise ConfigError("limits: expected a mapping")
    _no_unknown_keys(spec, _QUERY_LIMIT_KEYS | _SERVER_LIMIT_KEYS, "limits.")
    defaults = LimitsConfig()
    query = defaults.query
    try:
        query = QueryLimits(
            max_values=_integer(spec, "max_values", "limits", query.max_values),
            max_weight=_number(spec, "max_weight", "limits", query.max_weight),
            min_accuracy_ratio=_number(
                spec, "min_accuracy_ratio", "limits", query.min_accuracy_ratio
            ),
            max_accuracy_ratio=_number(
                spec, "max_accuracy_ratio", "limits", query.max_accuracy_ratio
            ),
            min_confidence=_number(spec, "min_confidence", "limits", query.min_confidence),
        )
    except ValueError as e:
        raise ConfigError(f"limits: {e}") from None
    return LimitsConfig(
        query,
        planning_timeout=_number(spec, "planning_timeout", "limits", defaults.planning_timeout),
        max_statement_bytes=_integer(
            spec, "max_statement_bytes", "limits", defaults.max_statement_bytes
        ),
        max_pipeline_messages=_integer(
            spec, "max_pipeline_messages", "limits", defaults.max_pipeline_messages
        ),
        max_pipeline_bytes=_integer(
            spec, "max_pipeline_bytes", "limits", defaults.max_pipeline_bytes
        ),
        workers=_integer(spec, "workers", "limits", defaults.workers),
    )


def _ledger(spec: object, base: Path) -> LedgerConfig:
    if spec is None:
        return LedgerConfig()
    if not isinstance(spec, Mapping):
        raise ConfigError("ledger: expected a mapping")
    _no_unknown_keys(spec, _LEDGER_KEYS, "ledger.")
    dsn = _text(spec, "dsn", "ledger")
    if dsn is not None:
        _check_dsn(dsn, "ledger.dsn")
    checkpoints = _text(spec, "checkpoints", "ledger")
    return LedgerConfig(
        dsn,
        _text(spec, "schema", "ledger") or "dpproxy",
        None if checkpoints is None else base / checkpoints,
        _integer(spec, "checkpoint_every", "ledger", LedgerConfig().checkpoint_every),
    )


def dsn_with(dsn: str, **changes: str | None) -> str:
    """``dsn`` with some parameters replaced (None removes one), as a URI (asyncpg reads no other).

    >>> dsn_with("host=/tmp/x user=postgres password=pw dbname=postgres", user="r", password=None)
    'postgresql://r@/postgres?host=%2Ftmp%2Fx'
    >>> dsn_with("postgresql://u:p%40ss@db:5433/a?sslmode=require", dbname="b")
    'postgresql://u:p%40ss@db:5433/b?sslmode=require'
    """
    params = {k: v for k, v in {**conninfo_to_dict(dsn), **changes}.items() if v is not None}
    user, password = params.pop("user", None), params.pop("password", None)
    host, port, dbname = params.pop("host", ""), params.pop("port", None), params.pop("dbname", "")
    login = ""
    if user is not None:
        login = (
            quote(str(user), safe="")
            + ("" if password is None else ":" + quote(str(password), safe=""))
            + "@"
        )
    address = ""
    if host and not str(host).startswith("/") and "," not in str(host):
        address = str(host) + ("" if port is None else f":{port}")
    else:
        if host:
            params["host"] = host
        if port is not None:
            params["port"] = port
    query = urlencode({k: str(v) for k, v in params.items()})
    return f"postgresql://{login}{address}/{quote(str(dbname), safe='')}" + (
        f"?{query}" if query else ""
    )


def _check_dsn(value: str, where: str) -> None:
    try:
        conninfo_to_dict(value)
    except Exception as e:  # psycopg's ProgrammingError: the message says what is wrong
        raise ConfigError(f"{where}: not a PostgreSQL connection string: {e}") from None


def _listen(spec: object, base: Path) -> ListenConfig:
    if spec is None:
        return ListenConfig()
    if not isinstance(spec, Mapping):
        raise ConfigError("listen: expected a mapping")
    _no_unknown_keys(spec, _LISTEN_KEYS, "listen.")
    defaults = ListenConfig()

    def path(key: str) -> Path | None:
        value = _text(spec, key, "listen")
        return None if value is None else base / value

    return ListenConfig(
        host=_text(spec, "host", "listen") or defaults.host,
        port=_integer(spec, "port", "listen", defaults.port),
        database=_text(spec, "database", "listen") or defaults.database,
        tls_cert=path("tls_cert"),
        tls_key=path("tls_key"),
        max_connections=_integer(spec, "max_connections", "listen", defaults.max_connections),
        shutdown_timeout=_number(
            spec, "shutdown_timeout", "listen", default=defaults.shutdown_timeout
        ),
        event_loop=_text(spec, "event_loop", "listen") or defaults.event_loop,
    )


def _backend(spec: object) -> BackendConfig | None:
    if spec is None:
        return None
    if not isinstance(spec, Mapping):
        raise ConfigError("backend: expected a mapping")
    _no_unknown_keys(spec, _BACKEND_KEYS, "backend.")
    dsn, passthrough = _text(spec, "dsn", "backend"), _text(spec, "passthrough_dsn", "backend")
    if dsn is None or passthrough is None:
        raise ConfigError(
            "backend: give both dsn (the reader role) and passthrough_dsn (the analyst database)",
            hint="leave out the backend section to run the embedded demo PostgreSQL",
        )
    return BackendConfig(
        dsn,
        passthrough,
        passthrough_role=_text(spec, "passthrough_role", "backend") or PASSTHROUGH_ROLE_TEMPLATE,
        passthrough_secret=_text(spec, "passthrough_secret", "backend"),
    )


def _check_role_names(backend: BackendConfig | None, users: Mapping[str, Verifier]) -> None:
    """Every analyst's role name fits PostgreSQL's 63 bytes (longer names are cut short)."""
    template = backend.passthrough_role if backend else PASSTHROUGH_ROLE_TEMPLATE
    for user in users:
        role = template.replace("{user}", user)
        if len(role.encode()) > 63:
            raise ConfigError(
                f"users.{user}: the pass-through role name {role!r} is longer than 63 bytes",
                hint="shorten the user name or backend.passthrough_role",
            )


def _users(spec: object) -> tuple[Mapping[str, Verifier], dict[str, float]]:
    """Verifiers, and the user budgets of users given as ``{verifier: ..., user_budget: ...}``."""
    if not isinstance(spec, Mapping) or not spec:
        raise ConfigError("users: expected a mapping of user name to SCRAM-SHA-256 verifier")
    users, budgets = {}, {}
    for name, value in spec.items():
        if not isinstance(name, str) or not name or "\x00" in name:
            raise ConfigError(f"users: {name!r} is not a user name")
        where = f"users.{name}"
        if isinstance(value, Mapping):
            _no_unknown_keys(value, _USER_KEYS, where + ".")
            budget = _number(value, "user_budget", where)
            _check_user_budget(budget, where + ".user_budget")
            if budget is not None:
                budgets[name] = budget
            where, value = where + ".verifier", value.get("verifier")
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a verifier string")
        try:
            users[name] = parse_verifier(value)
        except ValueError as e:
            raise ConfigError(
                f"{where}: {e}",
                hint="`dpproxy passwd` prints a verifier; never put a plain password here",
            ) from None
    return MappingProxyType(users), budgets


def _check_user_budget(value: float | None, where: str) -> None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{where}: must be a positive number, got {value!r}")


def _text(spec: Mapping[object, object], key: str, where: str) -> str | None:
    value = spec.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ConfigError(f"{where}.{key}: expected a string, got {value!r}")
    return value


def _integer(spec: Mapping[object, object], key: str, where: str, default: int) -> int:
    value = spec.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}.{key}: expected an integer, got {value!r}")
    return value


def _no_unknown_keys(spec: Mapping[object, object], allowed: set[str], prefix: str) -> None:
    unknown = sorted(str(k) for k in spec if k not in allowed)
    if unknown:
        raise ConfigError(
            f"{prefix}{unknown[0]}: unknown key", hint=f"allowed keys: {', '.join(sorted(allowed))}"
        )


@overload
def _number(spec: Mapping[object, object], key: str, where: str, default: float) -> float: ...
@overload
def _number(
    spec: Mapping[object, object], key: str, where: str, default: None = None
) -> float | None: ...
def _number(
    spec: Mapping[object, object], key: str, where: str, default: float | None = None
) -> float | None:
    """The number at ``key``, or ``default`` when the key is absent."""
    value = spec.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}.{key}: expected a number, got {value!r}")
    return float(value)
