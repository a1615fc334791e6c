"""config.yaml: the DBA's declaration, loaded once into frozen, validated values."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from types import MappingProxyType
from typing import Final, overload

import yaml
from psycopg.conninfo import conninfo_to_dict

from proxy.auth import Verifier, parse_verifier
from proxy.engine.ledger import UserCaps
from proxy.errors import ConfigError
from proxy.loops import EVENT_LOOPS
from sqlmap.accuracy import AccuracyDefaults
from sqlmap.cube import Cube, cube_from_config
from sqlmap.translate import Translator

__all__ = [
    "PrivacyConfig",
    "ListenConfig",
    "BackendConfig",
    "Config",
    "DEMO_USERS",
    "load_config",
    "parse_config",
]

_TOP_KEYS = {"privacy", "tables", "listen", "backend", "users", "ledger"}
_LEDGER_KEYS = {"dsn", "schema"}
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
_BACKEND_KEYS = {"dsn", "passthrough_dsn"}

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
    """The two PostgreSQL roles dpproxy logs in as.

    Args:
        dsn: the reader role, which may SELECT the protected tables; only dpproxy's generated
            histogram SQL runs under it.
        passthrough_dsn: a role with no rights on protected tables; every other statement runs
            under it, one connection per client session.
        ledger_dsn: where the durable ledger lives (a role that may create ``ledger_schema``);
            None keeps the history in memory only, which only tests that embed dpproxy do.
        ledger_schema: the ledger's schema.
    """

    dsn: str
    passthrough_dsn: str
    ledger_dsn: str | None = None
    ledger_schema: str = "dpproxy"

    def __post_init__(self) -> None:
        for key in ("dsn", "passthrough_dsn", "ledger_dsn"):
            value = getattr(self, key)
            if value is not None:
                _check_dsn(value, f"backend.{key}")

    def __repr__(self) -> str:  # DSNs may hold passwords
        return f"BackendConfig(dsn=..., passthrough_dsn=..., ledger_schema={self.ledger_schema!r})"


@dataclass(frozen=True, slots=True)
class LedgerConfig:
    """Where the durable ledger lives (docs/config.md).

    Args:
        dsn: a role that may create and write ``schema``; None: the embedded server's own, or
            ``backend.dsn``.
        schema: the ledger's schema; analysts' pass-through role must have no rights on it.
    """

    dsn: str | None = None
    schema: str = "dpproxy"

    def __repr__(self) -> str:  # DSNs may hold passwords
        return f"LedgerConfig(dsn={'...' if self.dsn else None}, schema={self.schema!r})"


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

    def translator(self) -> Translator:
        """A translator for the protected tables with the configured defaults."""
        return Translator(self.cubes, self.privacy.defaults)

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
    return Config(
        privacy,
        cubes,
        source,
        _listen(data.get("listen"), base),
        _backend(data.get("backend")),
        users,
        _ledger(data.get("ledger")),
        MappingProxyType(user_budgets),
    )


def _ledger(spec: object) -> LedgerConfig:
    if spec is None:
        return LedgerConfig()
    if not isinstance(spec, Mapping):
        raise ConfigError("ledger: expected a mapping")
    _no_unknown_keys(spec, _LEDGER_KEYS, "ledger.")
    dsn = _text(spec, "dsn", "ledger")
    if dsn is not None:
        _check_dsn(dsn, "ledger.dsn")
    return LedgerConfig(dsn, _text(spec, "schema", "ledger") or "dpproxy")


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
            "backend: give both dsn (the reader role) and passthrough_dsn (the pass-through role)",
            hint="leave out the backend section to run the embedded demo PostgreSQL",
        )
    if dsn == passthrough:
        raise ConfigError(
            "backend.passthrough_dsn: must log in as a different role than backend.dsn"
        )
    return BackendConfig(dsn, passthrough)


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
