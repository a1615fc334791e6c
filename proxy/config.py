"""config.yaml: the DBA's declaration, loaded once into frozen, validated values."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import overload
from pathlib import Path

import yaml

from proxy.errors import ConfigError
from sqlmap.accuracy import AccuracyDefaults
from sqlmap.cube import Cube, cube_from_config
from sqlmap.translate import Translator

__all__ = ["PrivacyConfig", "Config", "load_config", "parse_config"]

_TOP_KEYS = {"privacy", "tables"}
_PRIVACY_KEYS = {"total_budget", "default_accuracy", "default_confidence"}


@dataclass(frozen=True, slots=True)
class PrivacyConfig:
    """Budget and accuracy defaults (documented in docs/config.md)."""

    total_budget: float = 1.0
    default_accuracy: float | None = None
    default_confidence: float = 0.95

    def __post_init__(self) -> None:
        if not (math.isfinite(self.total_budget) and self.total_budget > 0):
            raise ConfigError(f"privacy.total_budget: must be a positive number, got {self.total_budget!r}")
        if self.default_accuracy is not None and not (
            math.isfinite(self.default_accuracy) and self.default_accuracy > 0
        ):
            raise ConfigError(f"privacy.default_accuracy: must be a positive number, got {self.default_accuracy!r}")
        if not 0 < self.default_confidence < 1:
            raise ConfigError(
                f"privacy.default_confidence: must lie strictly between 0 and 1, got {self.default_confidence!r}"
            )

    @property
    def defaults(self) -> AccuracyDefaults:
        """What a query asks for without a (complete) WITH ACCURACY clause."""
        return AccuracyDefaults(self.default_accuracy, self.default_confidence)


@dataclass(frozen=True, slots=True)
class Config:
    """The whole configuration."""

    privacy: PrivacyConfig
    cubes: tuple[Cube, ...]
    source: str = "<config>"

    def translator(self) -> Translator:
        """A translator for the protected tables with the configured defaults."""
        return Translator(self.cubes, self.privacy.defaults)


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
    return Config(privacy, cubes, source)


def _no_unknown_keys(spec: Mapping[object, object], allowed: set[str], prefix: str) -> None:
    unknown = sorted(str(k) for k in spec if k not in allowed)
    if unknown:
        raise ConfigError(f"{prefix}{unknown[0]}: unknown key", hint=f"allowed keys: {', '.join(sorted(allowed))}")


@overload
def _number(spec: Mapping[object, object], key: str, where: str, default: float) -> float: ...
@overload
def _number(spec: Mapping[object, object], key: str, where: str, default: None = None) -> float | None: ...
def _number(spec: Mapping[object, object], key: str, where: str, default: float | None = None) -> float | None:
    """The number at ``key``, or ``default`` when the key is absent."""
    value = spec.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}.{key}: expected a number, got {value!r}")
    return float(value)
