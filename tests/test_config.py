"""config.yaml validation: every mistake names its key and says what is wrong."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from proxy.config import LimitsConfig, load_config, parse_config
from proxy.errors import ConfigError
from sqlmap.accuracy import AccuracyDefaults
from sqlmap.cube import BinKind, CategoricalDimension, NumericDimension

ROOT = Path(__file__).parent.parent

VALID: dict[str, Any] = {
    "privacy": {"total_budget": 2.0, "default_accuracy": 10, "default_confidence": 0.9},
    "tables": {
        "adult": {
            "dimensions": {
                "age": {"bins": [17, 25, 35], "integer": True},
                "sex": {"values": ["Male", "Female"], "closed": True, "nullable": False},
            }
        }
    },
}


def with_change(path: str, value: Any) -> dict[str, Any]:
    """VALID with the key at dotted ``path`` set to ``value`` (or deleted if value is ...)."""
    data = copy.deepcopy(VALID)
    *parents, last = path.split(".")
    node = data
    for key in parents:
        node = node[key]
    if value is ...:
        del node[last]
    else:
        node[last] = value
    return data


def test_shipped_config_loads() -> None:
    config = load_config(ROOT / "config.yaml")
    (cube,) = config.cubes
    assert cube.qualified_name == "public.adult"
    assert {"age", "sex", "race", "income", "education"} <= {d.name for d in cube.dimensions}
    assert 1_000 <= cube.n_cells <= 20_000
    assert config.privacy.defaults.accuracy is not None


def test_valid_config_values() -> None:
    config = parse_config(VALID)
    (cube,) = config.cubes
    age, sex = cube.dimensions
    assert isinstance(age, NumericDimension) and age.integer
    assert [b.kind for b in age.bins] == [
        BinKind.RANGE,
        BinKind.RANGE,
        BinKind.BELOW,
        BinKind.ABOVE,
        BinKind.NULL,
    ]
    assert (
        isinstance(sex, CategoricalDimension) and [b.kind for b in sex.bins] == [BinKind.VALUE] * 2
    )
    assert cube.n_cells == 5 * 2
    assert cube.total_budget == 2.0
    assert config.privacy.defaults == AccuracyDefaults(10, 0.9)


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (
            "tables.adult.dimensions.age.bins",
            [17, 35, 25],
            "tables.adult.dimensions.age.bins: edges must be strictly increasing (25 after 35)",
        ),
        ("tables.adult.dimensions.age.bins", [17, 17], "edges must be strictly increasing"),
        ("tables.adult.dimensions.age.bins", [17], "needs at least two edges"),
        ("tables.adult.dimensions.age.bins", [17, "x"], "edges must be numbers"),
        (
            "tables.adult.dimensions.age.bins",
            "17, 25",
            "tables.adult.dimensions.age.bins: expected a list",
        ),
        (
            "tables.adult.dimensions.age.bins",
            [17, 25.5],
            "an integer dimension needs integer edges",
        ),
        (
            "tables.adult.dimensions.age.bins",
            [0, float("inf"), 5],
            "edges must be strictly increasing (5 after inf)",
        ),
        (
            "tables.adult.dimensions.sex.values",
            ["Male", "Male"],
            "tables.adult.dimensions.sex.values: duplicate value 'Male'",
        ),
        (
            "tables.adult.dimensions.sex.values",
            [],
            "tables.adult.dimensions.sex.values: values must not be empty",
        ),
        (
            "tables.adult.dimensions.sex.values",
            ["Male", 1],
            "values must be all strings or all numbers",
        ),
        ("tables.adult.dimensions.sex.values", [True], "is neither a string nor a number"),
        (
            "tables.adult.dimensions.sex.closed",
            "yes",
            "tables.adult.dimensions.sex.closed: expected true or false",
        ),
        (
            "tables.adult.dimensions.sex.integer",
            True,
            "only numeric ('bins') dimensions take 'integer'",
        ),
        (
            "tables.adult.dimensions.sex.bins",
            [1, 2],
            "give exactly one of 'bins' (numeric) or 'values' (categorical)",
        ),
        (
            "tables.adult.dimensions.sex.colour",
            1,
            "tables.adult.dimensions.sex: unknown key 'colour'",
        ),
        (
            "tables.adult.dimensions.age",
            [17, 25],
            "tables.adult.dimensions.age: expected a mapping",
        ),
        ("tables.adult.dimensions", {}, "tables.adult.dimensions: expected a non-empty mapping"),
        ("tables.adult.total_budget", -1, "tables.adult.total_budget: must be a positive number"),
        ("tables.adult.owner", "x", "tables.adult: unknown key 'owner'"),
        ("tables", {}, "tables: declare at least one protected table"),
        ("tables", ..., "tables: declare at least one protected table"),
        ("privacy.total_budget", 0, "privacy.total_budget: must be a positive number"),
        ("privacy.total_budget", "lots", "privacy.total_budget: expected a number"),
        (
            "privacy.default_confidence",
            1,
            "privacy.default_confidence: must lie strictly between 0 and 1",
        ),
        ("privacy.default_accuracy", -3, "privacy.default_accuracy: must be a positive number"),
        ("privacy.epsilon", 1, "privacy.epsilon: unknown key"),
        ("listen_port", 1, "listen_port: unknown key"),
        ("limits", [1], "limits: expected a mapping"),
        ("limits", {"max_groups": 5}, "limits.max_groups: unknown key"),
        ("limits", {"max_values": 0}, "limits: max_values must be at least 1"),
        ("limits", {"max_values": 1.5}, "limits.max_values: expected an integer"),
        ("limits", {"max_weight": "big"}, "limits.max_weight: expected a number"),
        (
            "limits",
            {"min_accuracy_ratio": 10, "max_accuracy_ratio": 1},
            "limits: accuracy ratios must satisfy 0 < min <= max",
        ),
        ("limits", {"min_confidence": 1}, "limits: min_confidence must lie strictly between"),
        ("limits", {"planning_timeout": 0}, "limits.planning_timeout: must be a positive number"),
        ("limits", {"max_statement_bytes": 0}, "limits.max_statement_bytes: must be positive"),
        ("limits", {"workers": 0}, "limits.workers: must be between 1 and 64"),
        ("ledger", {"checkpoint_every": 0}, "ledger.checkpoint_every: must be positive"),
        ("ledger", {"checkpoints": 3}, "ledger.checkpoints: expected a string"),
    ],
)
def test_malformed_config_names_key(path: str, value: Any, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(with_change(path, value), source="config.yaml")
    assert str(raised.value).startswith("config.yaml: ")
    assert message in str(raised.value)
    assert raised.value.sqlstate == "F0000"


def test_table_declared_twice() -> None:
    data = copy.deepcopy(VALID)
    data["tables"]["public.adult"] = VALID["tables"]["adult"]
    with pytest.raises(ConfigError, match="tables.public.adult: declared twice"):
        parse_config(data)


def test_bad_table_name() -> None:
    data = copy.deepcopy(VALID)
    data["tables"]["a.b.c"] = VALID["tables"]["adult"]
    with pytest.raises(ConfigError, match="table name must be 'table' or 'schema.table'"):
        parse_config(data)


def test_unreadable_and_invalid_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("tables: [unclosed\n")
    with pytest.raises(ConfigError, match="bad.yaml: not valid YAML"):
        load_config(bad)


def test_round_trip_through_yaml(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(VALID))
    assert load_config(path).cubes == parse_config(VALID).cubes


def test_fingerprint_changes_with_the_cells_only() -> None:
    base = parse_config(VALID).cubes[0]
    assert parse_config(VALID).cubes[0].fingerprint == base.fingerprint
    assert (
        parse_config(with_change("tables.adult.total_budget", 5)).cubes[0].fingerprint
        == base.fingerprint
    )
    for path, value in [
        ("tables.adult.dimensions.age.bins", [17, 25, 36]),
        ("tables.adult.dimensions.age.integer", False),
        ("tables.adult.dimensions.sex.values", ["Female", "Male"]),
        ("tables.adult.dimensions.sex.closed", False),
    ]:
        assert parse_config(with_change(path, value)).cubes[0].fingerprint != base.fingerprint, path


def test_limits_default_and_override() -> None:
    assert parse_config(VALID).limits == LimitsConfig()
    config = parse_config(
        with_change("limits", {"max_values": 50, "planning_timeout": 2.5, "workers": 4})
    )
    assert config.limits.query.max_values == 50 and config.limits.query.max_weight == 1e9
    assert config.limits.planning_timeout == 2.5 and config.limits.workers == 4
    assert config.translator().limits is config.limits.query


def test_ledger_checkpoints_default_off_and_relative_to_the_config() -> None:
    ledger = parse_config(VALID).ledger
    assert ledger.checkpoints is None and ledger.checkpoint_every == 1000
    config = parse_config(
        with_change("ledger", {"checkpoints": "state/checkpoints", "checkpoint_every": 50}),
        source="/etc/dpproxy/config.yaml",
    )
    assert config.ledger.checkpoints == Path("/etc/dpproxy/state/checkpoints")
    assert config.ledger.checkpoint_every == 50
