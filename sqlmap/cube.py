"""The data cube: how a protected table's rows are discretized into cells.

A cube is the cross product of its dimensions. Each dimension splits one column into bins so that
every possible value, NULL included, falls in exactly one bin:

* a numeric dimension declares bin edges ``[e0, e1, ..., ek]`` (half-open bins ``[e_i, e_i+1)``),
  plus implicit bins ``below`` (< e0) and ``above`` (>= ek) for values outside the edges;
* a categorical dimension declares a list of values (one bin each), plus an implicit bin
  ``other`` for every value not listed;
* every dimension has an implicit ``null`` bin.

Keeping NULL apart from out-of-domain values is what makes ``<>``, ``NOT IN`` and ``IS NULL``
exact under SQL's three-valued logic. A DBA who guarantees (e.g. with CHECK and NOT NULL
constraints) that a column never leaves its declared domain or is never NULL says ``closed: true``
or ``nullable: false``; the implicit bins are then dropped, and the canonical SQL refuses to count
a row that breaks the promise rather than misplace it.

A cube may also declare *measures*: integer columns that may be summed, each clamped to declared
bounds. Vectors over such a cube have coordinates beyond the cell counts: per measure, the
clamped sum of that column in every cell (:attr:`Cube.n_coordinates`).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, TypeAlias

from sqlmap.errors import ConfigError

__all__ = [
    "BinKind",
    "Bin",
    "NumericDimension",
    "CategoricalDimension",
    "Dimension",
    "Measure",
    "Cube",
    "Scalar",
]

Scalar: TypeAlias = str | int | float


class BinKind(Enum):
    """What part of a column's domain a bin holds."""

    RANGE = "range"  # numeric [lo, hi)
    VALUE = "value"  # one declared categorical value
    BELOW = "below"  # numeric, < first edge
    ABOVE = "above"  # numeric, >= last edge
    OTHER = "other"  # categorical, any undeclared value
    NULL = "null"


@dataclass(frozen=True, slots=True)
class Bin:
    """One bin of a dimension: ``lo``/``hi`` bound a range, ``value`` names a declared value."""

    kind: BinKind
    lo: float = -math.inf
    hi: float = math.inf
    value: Scalar | None = None

    @property
    def label(self) -> str:
        """A short human-readable name, used in messages and docs."""
        if self.kind is BinKind.VALUE:
            return repr(self.value)
        if self.kind is BinKind.RANGE:
            return f"[{_fmt(self.lo)}, {_fmt(self.hi)})"
        if self.kind is BinKind.BELOW:
            return f"< {_fmt(self.hi)}"
        if self.kind is BinKind.ABOVE:
            return f">= {_fmt(self.lo)}"
        return self.kind.name


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


@dataclass(frozen=True, slots=True)
class NumericDimension:
    """A numeric column split at ``edges`` into half-open bins.

    ``integer`` declares that the column only holds integers (checked against the backend's
    column type at start-up), which makes ``age <= 24`` mean ``age < 25``.

    >>> d = NumericDimension("age", (17, 25, 35), integer=True)
    >>> [b.label for b in d.bins]
    ['[17, 25)', '[25, 35)', '< 17', '>= 35', 'NULL']
    """

    name: str
    edges: tuple[float, ...]
    integer: bool = False
    nullable: bool = True
    closed: bool = False
    bins: tuple[Bin, ...] = field(init=False, repr=False, compare=False)
    """Declared ranges first, then the implicit bins this dimension keeps."""

    def __post_init__(self) -> None:
        edges = tuple(float(e) for e in self.edges)
        object.__setattr__(self, "edges", edges)
        if len(edges) < 2:
            raise ValueError("needs at least two edges")
        if any(math.isnan(e) for e in edges):
            raise ValueError("edges must be numbers, not NaN")
        for lo, hi in zip(edges, edges[1:]):
            if not lo < hi:
                raise ValueError(f"edges must be strictly increasing ({_fmt(hi)} after {_fmt(lo)})")
        if self.integer and not all(math.isinf(e) or e.is_integer() for e in edges):
            raise ValueError("an integer dimension needs integer edges")
        bins = [Bin(BinKind.RANGE, lo, hi) for lo, hi in zip(self.edges, self.edges[1:])]
        if not self.closed and math.isfinite(self.edges[0]):
            bins.append(Bin(BinKind.BELOW, -math.inf, self.edges[0]))
        if not self.closed and math.isfinite(self.edges[-1]):
            bins.append(Bin(BinKind.ABOVE, self.edges[-1], math.inf))
        if self.nullable:
            bins.append(Bin(BinKind.NULL))
        object.__setattr__(self, "bins", tuple(bins))

    @property
    def size(self) -> int:
        """Number of bins."""
        return len(self.bins)


@dataclass(frozen=True, slots=True)
class CategoricalDimension:
    """A column whose declared values each get a bin; all strings or all numbers.

    >>> d = CategoricalDimension("sex", ("Male", "Female"))
    >>> [b.label for b in d.bins]
    ["'Male'", "'Female'", 'OTHER', 'NULL']
    """

    name: str
    values: tuple[Scalar, ...]
    nullable: bool = True
    closed: bool = False
    bins: tuple[Bin, ...] = field(init=False, repr=False, compare=False)
    """Declared values first, then the implicit bins this dimension keeps."""

    def __post_init__(self) -> None:
        if not self.values:
            raise ValueError("values must not be empty")
        kinds = {self._kind(v) for v in self.values}
        if len(kinds) > 1:
            raise ValueError("values must be all strings or all numbers")
        seen: set[Scalar] = set()
        for v in self.values:
            if v in seen:
                raise ValueError(f"duplicate value {v!r}")
            seen.add(v)
        if kinds == {"number"} and not all(math.isfinite(v) for v in self.values):  # type: ignore[arg-type]
            raise ValueError("numeric values must be finite")
        if kinds == {"text"} and any("\0" in v for v in self.values):  # type: ignore[operator]
            raise ValueError("values may not contain NUL characters")
        bins = [Bin(BinKind.VALUE, value=v) for v in self.values]
        if not self.closed:
            bins.append(Bin(BinKind.OTHER))
        if self.nullable:
            bins.append(Bin(BinKind.NULL))
        object.__setattr__(self, "bins", tuple(bins))

    @staticmethod
    def _kind(value: object) -> str:
        if isinstance(value, str):
            return "text"
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return "number"
        raise ValueError(f"value {value!r} is neither a string nor a number")

    @property
    def numeric(self) -> bool:
        """Whether the declared values are numbers (so SUM and ordering make sense)."""
        return not isinstance(self.values[0], str)

    @property
    def size(self) -> int:
        """Number of bins."""
        return len(self.bins)


Dimension: TypeAlias = NumericDimension | CategoricalDimension


@dataclass(frozen=True, slots=True)
class Measure:
    """An integer column that may be summed: each row adds its value clamped to [lower, upper].

    A NULL adds 0 (``nulls: zero``, the one rule so far), so one row can move its cell's sum by
    any value of :attr:`reach`: the bounds, with 0 added when the column is nullable.

    >>> Measure("hours", 1, 99).reach, Measure("hours", 1, 99, nullable=False).reach
    ((0, 99), (1, 99))
    """

    name: str
    lower: int
    upper: int
    nullable: bool = True

    def __post_init__(self) -> None:
        for bound in (self.lower, self.upper):
            if not isinstance(bound, int) or isinstance(bound, bool):
                raise ValueError("lower and upper must be integers")
        if not self.lower < self.upper:
            raise ValueError(f"lower ({self.lower}) must be below upper ({self.upper})")
        if max(abs(self.lower), abs(self.upper)) > 2**31:
            raise ValueError("bounds must lie within +-2147483648")

    @property
    def reach(self) -> tuple[int, int]:
        """The least and greatest amount one row can add to its cell's sum of this measure."""
        if self.nullable:
            return min(self.lower, 0), max(self.upper, 0)
        return self.lower, self.upper


@dataclass(frozen=True, slots=True)
class Cube:
    """A protected table and its dimensions; cells are numbered row-major in declared order.

    >>> cube = Cube("public", "t", (
    ...     CategoricalDimension("sex", ("M", "F"), nullable=False, closed=True),
    ...     NumericDimension("age", (0, 50, 100), closed=True)))
    >>> cube.shape, cube.n_cells
    ((2, 3), 6)
    """

    schema: str
    table: str
    dimensions: tuple[Dimension, ...]
    total_budget: float = 1.0
    #: at most this many rows, when the DBA declares it public (``public_rows``): counts then
    #: lie in ``[0, public_rows]``; None when the row count is not public
    public_rows: int | None = None
    measures: tuple[Measure, ...] = ()

    def __post_init__(self) -> None:
        if not self.dimensions:
            raise ValueError("a cube needs at least one dimension")
        names = [d.name for d in self.dimensions]
        dupes = {n for n in names if names.count(n) > 1}
        if dupes:
            raise ValueError(f"duplicate dimension {sorted(dupes)[0]!r}")
        measures = [m.name for m in self.measures]
        if len(set(measures)) < len(measures):
            raise ValueError("duplicate measure")
        if not (math.isfinite(self.total_budget) and self.total_budget > 0):
            raise ValueError("total_budget must be a positive number")
        if self.public_rows is not None and self.public_rows < 0:
            raise ValueError("public_rows cannot be negative")

    @property
    def fingerprint(self) -> str:
        """A hash of everything that decides which cell a row falls in (not the budget).

        History vectors are only meaningful over the cube they were computed on, so the ledger
        keys its entries by this.
        """
        layout = [
            {
                "name": d.name,
                "bins": [[b.kind.value, b.lo, b.hi, b.value] for b in d.bins],
                "integer": getattr(d, "integer", None),
            }
            for d in self.dimensions
        ]
        key: list[object] = [self.schema, self.table, layout]
        if self.measures:  # a cube without measures keeps the fingerprint it always had
            key.append([[m.name, m.lower, m.upper, m.nullable] for m in self.measures])
        text = json.dumps(key, sort_keys=True, allow_nan=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @property
    def qualified_name(self) -> str:
        """``schema.table`` as the DBA wrote it (unquoted)."""
        return f"{self.schema}.{self.table}"

    @property
    def shape(self) -> tuple[int, ...]:
        """Bins per dimension."""
        return tuple(d.size for d in self.dimensions)

    @property
    def n_cells(self) -> int:
        """Number of cells (product of the dimensions' bin counts)."""
        return math.prod(self.shape)

    @property
    def n_coordinates(self) -> int:
        """Coordinates of the cube's vectors: every cell's count, then each measure's sums."""
        return self.n_cells * (1 + len(self.measures))

    @property
    def measure_reach(self) -> tuple[tuple[int, int], ...]:
        """Per measure, what one row can add to its cell's sum (a vector's ``measures``)."""
        return tuple(m.reach for m in self.measures)

    def measure(self, name: str) -> int | None:
        """The position of measure ``name`` among the cube's measures, or None."""
        for i, m in enumerate(self.measures):
            if m.name == name:
                return i
        return None

    def dimension(self, name: str) -> Dimension | None:
        """The dimension on column ``name``, or None."""
        for d in self.dimensions:
            if d.name == name:
                return d
        return None

    def axis(self, name: str) -> int:
        """Position of dimension ``name`` among the cube's axes."""
        return [d.name for d in self.dimensions].index(name)


_DIMENSION_KEYS = {"bins", "values", "integer", "nullable", "closed"}


def dimension_from_config(name: str, spec: object, where: str) -> Dimension:
    """Build one dimension from its config mapping; errors name ``where`` (the key path)."""
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{where}: expected a mapping with 'bins' or 'values'")
    unknown = set(spec) - _DIMENSION_KEYS
    if unknown:
        raise ConfigError(
            f"{where}: unknown key {sorted(map(str, unknown))[0]!r}",
            hint=f"allowed keys: {', '.join(sorted(_DIMENSION_KEYS))}",
        )
    has_bins, has_values = "bins" in spec, "values" in spec
    if has_bins == has_values:
        raise ConfigError(
            f"{where}: give exactly one of 'bins' (numeric) or 'values' (categorical)"
        )
    flags = {k: _bool(spec, k, where) for k in ("nullable", "closed") if k in spec}
    try:
        if has_bins:
            edges = _sequence(spec["bins"], f"{where}.bins")
            if not all(_is_number(e) for e in edges):
                raise ValueError("edges must be numbers (use .inf / -.inf for open ends)")
            integer = _bool(spec, "integer", where) if "integer" in spec else False
            return NumericDimension(name, tuple(edges), integer=integer, **flags)
        if "integer" in spec:
            raise ConfigError(f"{where}.integer: only numeric ('bins') dimensions take 'integer'")
        values = _sequence(spec["values"], f"{where}.values")
        return CategoricalDimension(name, tuple(values), **flags)
    except ValueError as e:
        key = "bins" if has_bins else "values"
        raise ConfigError(f"{where}.{key}: {e}") from None


def cube_from_config(qualified_name: str, spec: object, where: str, default_budget: float) -> Cube:
    """Build a cube for the table named ``[schema.]table`` from its config mapping."""
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{where}: expected a mapping with 'dimensions'")
    unknown = set(spec) - {"dimensions", "measures", "total_budget", "public_rows"}
    if unknown:
        raise ConfigError(
            f"{where}: unknown key {sorted(map(str, unknown))[0]!r}",
            hint="allowed keys: dimensions, measures, public_rows, total_budget",
        )
    schema, _, table = qualified_name.rpartition(".")
    if not table or "." in schema:
        raise ConfigError(f"{where}: table name must be 'table' or 'schema.table'")
    dims_spec = spec.get("dimensions")
    if not isinstance(dims_spec, Mapping) or not dims_spec:
        raise ConfigError(
            f"{where}.dimensions: expected a non-empty mapping of column -> bins/values"
        )
    dims = tuple(
        dimension_from_config(str(col), dspec, f"{where}.dimensions.{col}")
        for col, dspec in dims_spec.items()
    )
    budget = spec.get("total_budget", default_budget)
    if not _is_number(budget) or not (math.isfinite(budget) and budget > 0):
        raise ConfigError(f"{where}.total_budget: must be a positive number, got {budget!r}")
    rows = spec.get("public_rows")
    if rows is not None and (not isinstance(rows, int) or isinstance(rows, bool) or rows < 0):
        raise ConfigError(
            f"{where}.public_rows: must be a whole number of rows (0 or more), got {rows!r}",
            hint="declare it only if the table's row count is public; counts then stay in "
            "[0, public_rows]",
        )
    measures_spec = spec.get("measures", {})
    if not isinstance(measures_spec, Mapping):
        raise ConfigError(
            f"{where}.measures: expected a mapping of column -> {{lower: ..., upper: ...}}"
        )
    measures = tuple(
        measure_from_config(str(col), mspec, f"{where}.measures.{col}")
        for col, mspec in measures_spec.items()
    )
    return Cube(schema or "public", table, dims, float(budget), public_rows=rows, measures=measures)


_MEASURE_KEYS = {"lower", "upper", "nulls"}
_NULL_RULES = {"zero": True, "never": False}


def measure_from_config(name: str, spec: object, where: str) -> Measure:
    """Build one measure from its config mapping; errors name ``where`` (the key path).

    >>> measure_from_config("capital_gain", {"lower": 0, "upper": 20000}, "m")
    Measure(name='capital_gain', lower=0, upper=20000, nullable=True)
    """
    if not isinstance(spec, Mapping):
        raise ConfigError(
            f"{where}: expected a mapping with 'lower' and 'upper'",
            hint=f"e.g. {name}: {{lower: 0, upper: 1000}}",
        )
    unknown = set(spec) - _MEASURE_KEYS
    if unknown:
        raise ConfigError(
            f"{where}: unknown key {sorted(map(str, unknown))[0]!r}",
            hint=f"allowed keys: {', '.join(sorted(_MEASURE_KEYS))}",
        )
    for key in ("lower", "upper"):
        if key not in spec:
            raise ConfigError(
                f"{where}: missing '{key}'",
                hint="each row's value is clamped to [lower, upper] before it is summed; "
                "the bounds decide how much noise a sum needs",
            )
        value = spec[key]
        if not _is_number(value) or not float(value).is_integer():
            raise ConfigError(f"{where}.{key}: expected an integer, got {value!r}")
    nulls = spec.get("nulls", "zero")
    if nulls not in _NULL_RULES:
        raise ConfigError(
            f"{where}.nulls: expected 'zero' (a NULL adds 0) or 'never' (the column is NOT "
            f"NULL), got {nulls!r}"
        )
    try:
        return Measure(name, int(spec["lower"]), int(spec["upper"]), _NULL_RULES[nulls])
    except ValueError as e:
        raise ConfigError(f"{where}: {e}") from None


def _sequence(value: object, where: str) -> Sequence[Any]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ConfigError(f"{where}: expected a list")
    return value


def _bool(spec: Mapping[str, object], key: str, where: str) -> bool:
    value = spec[key]
    if not isinstance(value, bool):
        raise ConfigError(f"{where}.{key}: expected true or false, got {value!r}")
    return value


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
