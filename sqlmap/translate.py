"""Translate one SQL query into linear query vectors over a protected table's cube.

The output, an :class:`AnswerSpec`, says which table is queried, how accurate the answer must be,
and, for every output row and column, the vector q and offset c such that the answer is q.x + c.
Its set of rows depends only on the query and the cube, never on data: a GROUP BY returns every
bin of the grouped dimensions, empty or not.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from fractions import Fraction

import numpy as np
import numpy.typing as npt
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokenizer_core import Token

from sqlmap.accuracy import AccuracyDefaults, AccuracyRequest, DPPostgres
from sqlmap.cellwise import (
    CellEvaluator,
    as_float,
    constant,
    position_of,
    refuse_division,
    width_bucket_case,
)
from sqlmap.cube import Bin, BinKind, CategoricalDimension, Cube, Dimension, Scalar
from sqlmap.errors import (
    DatatypeMismatch,
    InvalidParameterValue,
    NumericValueOutOfRange,
    ProgramLimitExceeded,
    SqlSyntaxError,
    UndefinedColumn,
    UndefinedTable,
    UnsupportedQuery,
)
from sqlmap.probability import PROBABILITY_FUNCTION, Comparison, probability_call
from sqlmap.vector import LinearQuery

__all__ = [
    "Translator",
    "QueryLimits",
    "AnswerSpec",
    "AnswerRow",
    "OutputColumn",
    "OutputKind",
    "GroupValue",
]

_DIALECT = DPPostgres()

Floats = npt.NDArray[np.float64]

#: Clauses of a SELECT that dpproxy refuses, with the words its error uses for them.
_REFUSED_CLAUSES = {
    "with_": "WITH (common table expressions)",
    "distinct": "SELECT DISTINCT",
    "into": "SELECT INTO",
    "laterals": "LATERAL",
    "joins": "joins",
    "having": "HAVING",
    "qualify": "QUALIFY",
    "windows": "WINDOW",
    "order": "ORDER BY",
    "sort": "ORDER BY",
    "limit": "LIMIT",
    "offset": "OFFSET",
    "locks": "FOR UPDATE/SHARE",
    "sample": "TABLESAMPLE",
    "pivots": "PIVOT",
    "connect": "CONNECT BY",
    "prewhere": "PREWHERE",
    "cluster": "CLUSTER BY",
    "distribute": "DISTRIBUTE BY",
    "settings": "SETTINGS",
    "options": "OPTIONS",
    "for_": "FOR",
}

SUPPORTED_FORMS = (
    "dpproxy answers SELECT <aggregates> FROM <protected table> [WHERE ...] [GROUP BY dims] "
    "with COUNT(*), COUNT(dim), SUM(...) and FILTER (WHERE ...), combined linearly, "
    "and their ratios (AVG(x), COUNT(...) / COUNT(...))"
)


@dataclass(frozen=True, slots=True)
class QueryLimits:
    """What one DP query may ask for (config.yaml's ``limits``), checked before the engine plans.

    Accuracies are judged against the query's largest weight (one row's largest effect on an
    answer): an interval a billion rows wide says nothing, and one a millionth of a row wide
    costs more budget than any table has; both are refused up front.

    Args:
        max_values: values (groups times aggregates) one statement may ask for.
        max_weight: largest absolute weight a query may give a row.
        min_accuracy_ratio: smallest accuracy, as a multiple of the largest weight.
        max_accuracy_ratio: largest accuracy, as a multiple of the largest weight.
        min_confidence: smallest confidence accepted.
    """

    max_values: int = 500
    max_weight: float = 1e9
    min_accuracy_ratio: float = 1e-6
    max_accuracy_ratio: float = 1e9
    min_confidence: float = 0.5

    def __post_init__(self) -> None:
        if self.max_values < 1:
            raise ValueError("max_values must be at least 1")
        if not 0 < self.max_weight < math.inf:
            raise ValueError("max_weight must be a positive number")
        if not 0 < self.min_accuracy_ratio <= self.max_accuracy_ratio < math.inf:
            raise ValueError("accuracy ratios must satisfy 0 < min <= max")
        if not 0 < self.min_confidence < 1:
            raise ValueError("min_confidence must lie strictly between 0 and 1")

    def check_batch(self, rows: int, aggregates: int, node: exp.Expr) -> None:
        """Refuse a statement asking for more values than ``max_values`` (54000)."""
        if rows * aggregates > self.max_values:
            raise ProgramLimitExceeded(
                f"the query asks for {rows * aggregates} values "
                f"({rows} groups x {aggregates} aggregates), "
                f"more than the limit of {self.max_values}",
                hint="group by fewer dimensions or split the query "
                "(the DBA sets limits.max_values)",
                position=position_of(node),
            )

    def check_weights(self, weights: Floats, node: exp.Expr) -> float:
        """The largest absolute weight of an aggregate, refused if absurd.

        Raises:
            NumericValueOutOfRange: a weight overflowed a double (22003).
            InvalidParameterValue: a weight is over ``max_weight`` (22023).
        """
        if not np.all(np.isfinite(weights)):
            raise NumericValueOutOfRange(
                "value out of range: overflow",
                detail=f"a weight of {node.sql('postgres')[:60]} does not fit a double",
                position=position_of(node),
            )
        largest = float(np.max(np.abs(weights), initial=0.0))
        if largest > self.max_weight:
            raise InvalidParameterValue(
                f"weight {largest:g} in {node.sql('postgres')[:60]} is over the limit of "
                f"{self.max_weight:g}",
                hint="scale the aggregate down (the DBA sets limits.max_weight)",
                position=position_of(node),
            )
        return largest

    def check_accuracy(self, accuracy: AccuracyRequest, largest_weight: float) -> None:
        """Refuse an absurd accuracy or confidence for weights up to ``largest_weight`` (22023)."""
        if accuracy.confidence < self.min_confidence:
            raise InvalidParameterValue(
                f"confidence {accuracy.confidence:g} is below the limit of {self.min_confidence:g}",
                hint="an interval that misses the truth that often says nothing "
                "(the DBA sets limits.min_confidence)",
            )
        scale = largest_weight if largest_weight > 0 else 1.0
        low, high = self.min_accuracy_ratio * scale, self.max_accuracy_ratio * scale
        if not low <= accuracy.eps <= high:
            raise InvalidParameterValue(
                f"accuracy {accuracy.eps:g} is outside [{low:g}, {high:g}] for this query",
                detail=f"the accuracy may range from {self.min_accuracy_ratio:g} to "
                f"{self.max_accuracy_ratio:g} times the query's largest weight ({scale:g})",
                hint="the DBA sets limits.min_accuracy_ratio and limits.max_accuracy_ratio",
            )


@dataclass(frozen=True, slots=True)
class GroupValue:
    """One GROUP BY key: a declared value, or the NULL / undeclared-values bin (value None)."""

    kind: BinKind
    value: Scalar | None

    @staticmethod
    def of(b: Bin) -> GroupValue:
        """The key that a GROUP BY over a categorical bin reports."""
        return GroupValue(b.kind, b.value if b.kind is BinKind.VALUE else None)

    @property
    def label(self) -> str:
        """How messages show the key: the value, NULL, or (other values)."""
        if self.kind is BinKind.VALUE:
            return repr(self.value)
        return "NULL" if self.kind is BinKind.NULL else "(other values)"


class OutputKind(Enum):
    """What a result column holds."""

    GROUP_KEY = "group key"
    AGGREGATE = "aggregate"
    INTERVAL_LOW = "interval low"  # DP_INTERVAL_LOW(<aggregate>)
    INTERVAL_HIGH = "interval high"  # DP_INTERVAL_HIGH(<aggregate>)
    PROBABILITY = "probability"  # DP_PROBABILITY(<aggregate> > c)
    RATIO = "ratio"  # AVG(x), COUNT(...) / COUNT(...): two linear queries, one interval


#: The pseudo-functions that report on an aggregate's answer, by their upper-case names.
_INTERVAL_FUNCTIONS = {
    "DP_INTERVAL_LOW": OutputKind.INTERVAL_LOW,
    "DP_INTERVAL_HIGH": OutputKind.INTERVAL_HIGH,
    PROBABILITY_FUNCTION: OutputKind.PROBABILITY,
}


@dataclass(frozen=True, slots=True)
class OutputColumn:
    """A result column.

    ``dimension`` names a GROUP BY key (its dimension, or the SQL of a grouped expression such
    as a CASE over dimensions); ``aggregate`` is, for an interval or probability column,
    the index (among the aggregate columns, i.e. into :attr:`AnswerRow.queries`) of the
    aggregate whose interval it reports; ``comparison`` is what a probability column tests.
    ``ratio`` is, for a ratio column and an interval of one, the index into
    :attr:`AnswerRow.ratios`.
    """

    name: str
    sql: str
    kind: OutputKind = OutputKind.AGGREGATE
    dimension: str | None = None
    aggregate: int | None = None
    text: bool = False  # a group key of type text
    comparison: Comparison | None = None
    ratio: int | None = None


@dataclass(frozen=True, slots=True)
class AnswerRow:
    """One output row: its GROUP BY keys and one query per aggregate column.

    Keys follow GROUP BY order (one per grouped dimension); queries follow column order, and so
    do ratios: (numerator, denominator) per ratio column.
    """

    keys: tuple[GroupValue, ...]
    queries: tuple[LinearQuery, ...]
    ratios: tuple[tuple[LinearQuery, LinearQuery], ...] = ()


@dataclass(frozen=True, slots=True)
class AnswerSpec:
    """Everything needed to answer a query, computed from the SQL and the cube alone."""

    cube: Cube
    accuracy: AccuracyRequest | None
    columns: tuple[OutputColumn, ...]
    group_dims: tuple[str, ...]
    rows: tuple[AnswerRow, ...]
    #: things the analyst should know though the query is answered (a closed dimension
    #: compared with a value it does not declare, ...), sent as NOTICEs
    warnings: tuple[str, ...] = ()

    @property
    def queries(self) -> tuple[LinearQuery, ...]:
        """All queries, row by row (the batch the engine decides at once)."""
        return tuple(q for row in self.rows for q in row.queries)


class Translator:
    """Turns SQL into :class:`AnswerSpec` for a fixed set of protected tables.

    Args:
        cubes: the protected tables' cubes.
        defaults: what a query asks for without (a complete) ``WITH ACCURACY`` clause.
        limits: what one query may ask for.
    """

    def __init__(
        self,
        cubes: Iterable[Cube],
        defaults: AccuracyDefaults | None = None,
        limits: QueryLimits | None = None,
    ) -> None:
        self.cubes = {(c.schema, c.table): c for c in cubes}
        self.defaults = defaults or AccuracyDefaults()
        self.limits = limits or QueryLimits()

    def translate(self, sql: str, defaults: AccuracyDefaults | None = None) -> AnswerSpec:
        """Translate one SQL query; raise a :class:`sqlmap.errors.DpproxyError` if it cannot be.

        ``defaults`` (e.g. a session's settings) replace the translator's own.
        """
        return self.translate_parsed(self.parse(sql), defaults)

    def translate_parsed(
        self, statement: exp.Expr, defaults: AccuracyDefaults | None = None
    ) -> AnswerSpec:
        """Translate a statement that :meth:`parse` returned."""
        accuracy = (defaults or self.defaults).resolve(statement)
        # overflows become infinities here and are refused, with their node, by QueryLimits
        with np.errstate(over="ignore", invalid="ignore"):
            return _Query(self, statement).spec(accuracy)

    @staticmethod
    def parse(sql: str, tokens: list[Token] | None = None) -> exp.Expr:
        """Parse exactly one statement (with its accuracy clause attached).

        ``tokens``: ``sql``'s own, when the caller has them already (tokenizing is half the
        cost of parsing).
        """
        try:
            parsed = _DIALECT.parse(sql) if tokens is None else _DIALECT.parser().parse(tokens, sql)
            statements = [s for s in parsed if s is not None]
        except ParseError as e:
            raise _syntax_error(e, sql) from None
        except TokenError as e:
            raise SqlSyntaxError(f"syntax error: {e}") from None
        if not statements:
            raise SqlSyntaxError("empty query")
        if len(statements) > 1:
            raise UnsupportedQuery(
                "multiple statements in one DP query are not supported",
                hint="send each query on its own",
                position=position_of(statements[1]),
            )
        return statements[0]

    def cube_for(self, table: exp.Table) -> Cube:
        """The cube of a FROM table, or UndefinedTable naming the protected ones."""
        if table.args.get("catalog") is not None:
            raise UnsupportedQuery(
                "database-qualified table names are not supported", position=position_of(table)
            )
        schema = _ident(table.args["db"]) if table.args.get("db") is not None else None
        name = _ident(table.this)
        matches = [c for (s, t), c in self.cubes.items() if t == name and schema in (None, s)]
        if len(matches) != 1:
            protected = ", ".join(sorted(c.qualified_name for c in self.cubes.values()))
            raise UndefinedTable(
                f"{table.sql('postgres')} is not a protected table"
                if not matches
                else f"{name} is ambiguous: qualify it with its schema",
                hint=f"protected tables: {protected}",
                position=position_of(table),
            )
        return matches[0]


def _ident(node: exp.Expr) -> str:
    """An identifier as PostgreSQL stores it: unquoted names fold to lower case."""
    if isinstance(node, exp.Identifier):
        return str(node.this) if node.quoted else str(node.this).lower()
    return node.name.lower()


def _syntax_error(e: ParseError, sql: str) -> SqlSyntaxError:
    first = e.errors[0] if e.errors else {}
    line, col = first.get("line"), first.get("col")
    position = None
    if isinstance(line, int) and isinstance(col, int):
        lines = sql.split("\n")
        position = sum(len(s) + 1 for s in lines[: line - 1]) + max(col - 1, 0)
    description = first.get("description") or str(e).split("\n")[0]
    return SqlSyntaxError(f"syntax error: {description}", position=position)


class _Query:
    """The translation of one parsed SELECT against one cube."""

    def __init__(self, translator: Translator, statement: exp.Expr) -> None:
        self.statement = _require_select(statement)
        table = self.statement.args["from_"].this
        self.cube = translator.cube_for(table)
        self.limits = translator.limits
        alias = table.args.get("alias")
        if alias is not None and alias.args.get("columns"):
            raise UnsupportedQuery(
                "column aliases on the table are not supported", position=position_of(alias)
            )
        self.qualifiers = {_ident(alias.this)} if alias is not None else {self.cube.table}
        self.evaluator = CellEvaluator(self.cube, self.resolve, self.measure)

    def resolve(self, column: exp.Column) -> Dimension:
        """The dimension a column reference names."""
        name = self._column_name(column)
        dim = self.cube.dimension(name)
        if dim is None:
            dims = ", ".join(d.name for d in self.cube.dimensions)
            measure = self.cube.measure(name) is not None
            raise UndefinedColumn(
                f"{name} is a measure of {self.cube.qualified_name}: it can be summed, "
                "not compared or grouped"
                if measure
                else f"{name} is not a dimension of {self.cube.qualified_name}",
                detail=f"queries may only use its declared dimensions: {dims}",
                hint=None
                if measure
                else "the DBA declares a column in config.yaml as a dimension to filter or "
                f"group by it, or as a measure with clamp bounds to sum it "
                f"(measures: {{{name}: {{lower: ..., upper: ...}}}})",
                position=position_of(column),
            )
        return dim

    def measure(self, column: exp.Column) -> int | None:
        """The position of the measure a column names (in a SUM argument), or None."""
        return self.cube.measure(self._column_name(column))

    def _column_name(self, column: exp.Column) -> str:
        """The column a reference names, checked against the FROM table."""
        if column.args.get("catalog") is not None or (
            column.args.get("db") is not None and _ident(column.args["db"]) != self.cube.schema
        ):
            raise UndefinedColumn(
                f"{column.sql('postgres')} does not name a column of {self.cube.qualified_name}",
                position=position_of(column),
            )
        if (
            column.args.get("table") is not None
            and _ident(column.args["table"]) not in self.qualifiers
        ):
            raise UndefinedColumn(
                f"missing FROM-clause entry for table {column.args['table'].name}",
                position=position_of(column),
            )
        if isinstance(column.this, exp.Star):
            raise UnsupportedQuery(
                f"{column.sql('postgres')} would return rows of the protected table",
                hint=SUPPORTED_FORMS,
                position=position_of(column),
            )
        return _ident(column.this)

    # -- the parts of the answer -----------------------------------------------------------

    def spec(self, accuracy: AccuracyRequest | None) -> AnswerSpec:
        where = self.statement.args.get("where")
        rows_mask = (
            self.evaluator.truth(where).true
            if where is not None
            else np.ones((1,) * len(self.cube.shape), dtype=bool)
        )
        group_keys = self._group_keys()
        columns: list[OutputColumn] = []
        aggregates: list[tuple[Floats, float]] = []
        aggregate_bodies: list[exp.Expr] = []
        ratios: list[tuple[tuple[Floats, float], tuple[Floats, float]]] = []
        ratio_bodies: list[exp.Expr] = []
        largest = 0.0  # the largest absolute weight of any aggregate
        for item in self.statement.expressions:
            name, body = _output_name(item), item.unalias() if isinstance(item, exp.Alias) else item
            interval = _interval_kind(body)
            parts = self._ratio(body) if interval is None else None
            if interval is not None:
                columns.append(OutputColumn(name, body.sql("postgres"), interval))
            elif parts is not None:
                masked = []
                for weights, offset in parts:
                    weights = self._kinds_axis(weights * rows_mask)
                    self.limits.check_weights(self._effects(weights), body)
                    masked.append((weights, as_float(offset, body)))
                ratios.append((masked[0], masked[1]))
                columns.append(
                    OutputColumn(
                        name, body.sql("postgres"), OutputKind.RATIO, ratio=len(ratio_bodies)
                    )
                )
                ratio_bodies.append(body)
            elif _has_aggregate(body):
                weights, offset = self._linear(body)
                weights = self._kinds_axis(weights * rows_mask)
                largest = max(largest, self.limits.check_weights(self._effects(weights), body))
                aggregates.append((weights, as_float(offset, body)))
                aggregate_bodies.append(body)
                columns.append(OutputColumn(name, body.sql("postgres")))
            else:
                columns.append(self._non_aggregate(item, name, body, group_keys))
        columns = [
            self._link_interval(c, item, aggregate_bodies, ratio_bodies)
            for c, item in zip(columns, self.statement.expressions)
        ]
        if not aggregates and not ratios:
            raise UnsupportedQuery(
                "a DP query must compute at least one aggregate",
                detail="without an aggregate the query would return rows of the protected table",
                hint=SUPPORTED_FORMS,
                position=position_of(self.statement),
            )
        if accuracy is not None:
            self.limits.check_accuracy(accuracy, largest)
        groups = math.prod(len(k.labels) for k in group_keys)
        self.limits.check_batch(groups, len(aggregates) + 2 * len(ratios), self.statement)
        rows = self._rows(group_keys, aggregates, ratios)
        return AnswerSpec(
            self.cube,
            accuracy,
            tuple(columns),
            tuple(k.name for k in group_keys),
            rows,
            tuple(self.evaluator.warnings),
        )

    def _kinds_axis(self, weights: Floats) -> Floats:
        """Weights with a full kind axis; the cube's axes stay broadcast (never made dense)."""
        return np.broadcast_to(weights, (1 + len(self.cube.measures), *weights.shape[1:]))

    def _effects(self, weights: Floats) -> Floats:
        """Per cell, a bound on how much one row moves the aggregate.

        A count moves it by its weight, a measure's sum by its weight times the measure's
        largest magnitude.
        """
        scale = [1.0] + [float(max(-lo, hi)) for lo, hi in self.cube.measure_reach]
        effects: Floats = np.einsum("k...,k->...", np.abs(weights), np.asarray(scale))
        return effects

    @staticmethod
    def _link_interval(
        column: OutputColumn,
        item: exp.Expr,
        aggregate_bodies: list[exp.Expr],
        ratio_bodies: list[exp.Expr],
    ) -> OutputColumn:
        """Point an interval or probability column at the aggregate column it reports on."""
        if column.kind not in (
            OutputKind.INTERVAL_LOW,
            OutputKind.INTERVAL_HIGH,
            OutputKind.PROBABILITY,
        ):
            return column
        call = item.unalias() if isinstance(item, exp.Alias) else item
        args = call.expressions
        words = call.name.upper()
        comparison = None
        if column.kind is OutputKind.PROBABILITY:
            aggregate, comparison = probability_call(call)  # type: ignore[arg-type]
            args = [aggregate]
        if len(args) != 1:
            raise UnsupportedQuery(
                f"{words} takes one aggregate expression", position=position_of(call)
            )
        for index, body in enumerate(aggregate_bodies):
            if body == args[0]:
                return OutputColumn(
                    column.name, column.sql, column.kind, aggregate=index, comparison=comparison
                )
        for index, body in enumerate(ratio_bodies):
            if body == args[0] and column.kind is OutputKind.PROBABILITY:
                raise UnsupportedQuery(
                    f"{words} of a ratio is not supported",
                    hint="ask for the ratio's interval: DP_INTERVAL_LOW/HIGH(<ratio>)",
                    position=position_of(call),
                )
            if body == args[0]:
                return OutputColumn(column.name, column.sql, column.kind, ratio=index)
        raise UnsupportedQuery(
            f"{call.sql('postgres')} needs its aggregate in the select list too",
            hint=f"e.g. SELECT {args[0].sql('postgres')}, {call.sql('postgres')} FROM ...",
            position=position_of(call),
        )

    def _non_aggregate(
        self, item: exp.Expr, name: str, body: exp.Expr, group_keys: list[_GroupKey]
    ) -> OutputColumn:
        for key in group_keys:
            if key.node is not None and key.node == body:
                return OutputColumn(
                    name, body.sql("postgres"), OutputKind.GROUP_KEY, key.name, text=key.text
                )
        if isinstance(body, exp.Column):
            dim = self.resolve(body)
            if any(k.name == dim.name and k.node is None for k in group_keys):
                return OutputColumn(
                    name,
                    body.sql("postgres"),
                    OutputKind.GROUP_KEY,
                    dimension=dim.name,
                    text=isinstance(dim, CategoricalDimension) and not dim.numeric,
                )
            raise UnsupportedQuery(
                f"column {dim.name} must appear in the GROUP BY clause or be used in an aggregate",
                position=position_of(item),
            )
        if isinstance(body, exp.Star):
            raise UnsupportedQuery(
                "SELECT * would return rows of the protected table",
                hint=SUPPORTED_FORMS,
                position=position_of(item),
            )
        _refuse_row_level(body)
        raise UnsupportedQuery(
            f"output column {body.sql('postgres')} is neither a GROUP BY dimension "
            "nor an aggregate",
            hint=SUPPORTED_FORMS,
            position=position_of(item),
        )

    def _group_keys(self) -> list[_GroupKey]:
        group = self.statement.args.get("group")
        if group is None:
            return []
        keys: list[_GroupKey] = []
        for node in group.expressions:
            key = self._group_key(node)
            if all(k.name != key.name for k in keys):
                keys.append(key)
        return keys

    def _group_key(self, key: exp.Expr) -> _GroupKey:
        items = self.statement.expressions
        if isinstance(key, exp.Literal) and not key.is_string:  # GROUP BY 1: an output column
            index = int(key.this)
            if not 1 <= index <= len(items):
                raise UnsupportedQuery(
                    f"GROUP BY position {index} is not in the select list",
                    position=position_of(key),
                )
            key = items[index - 1].unalias()
        elif isinstance(key, exp.Column) and key.args.get("table") is None:
            name = _ident(key.this)
            aliased = [
                i.unalias()
                for i in items
                if isinstance(i, exp.Alias) and _ident(i.args["alias"]) == name
            ]
            if self.cube.dimension(name) is None and len(aliased) == 1:
                key = aliased[0]
        if isinstance(key, (exp.Rollup, exp.Cube, exp.GroupingSets)):
            words = {exp.Rollup: "ROLLUP", exp.Cube: "CUBE", exp.GroupingSets: "GROUPING SETS"}[
                type(key)
            ]
            raise UnsupportedQuery(f"GROUP BY {words} is not supported", position=position_of(key))
        if isinstance(key, exp.Case):
            return self._case_key(key)
        if isinstance(key, exp.WidthBucket):
            return self._case_key(width_bucket_case(key), key)
        if not isinstance(key, exp.Column):
            raise UnsupportedQuery(
                f"GROUP BY {key.sql('postgres')}: only dimension columns, and CASE and "
                "width_bucket over dimensions, can be grouped",
                position=position_of(key),
            )
        dim = self.resolve(key)
        if not isinstance(dim, CategoricalDimension):
            raise UnsupportedQuery(
                f"GROUP BY {dim.name}: a binned dimension has no single value per group",
                hint=f"declare {dim.name} with 'values:' to group by it, "
                "group by a CASE over its bins, or filter on its bins",
                position=position_of(key),
            )
        cells = np.arange(dim.size).reshape(
            [-1 if axis == self.cube.axis(dim.name) else 1 for axis in range(len(self.cube.shape))]
        )
        labels = tuple(GroupValue.of(b) for b in dim.bins)
        return _GroupKey(dim.name, labels, cells, not dim.numeric)

    def _case_key(self, node: exp.Case, written: exp.Expr | None = None) -> _GroupKey:
        """A CASE over dimensions as a group key: its value in every cell, decided per cell.

        Its groups are the values some cell of the cube can take, in the order the CASE lists
        them: known from the cube alone. ``written`` is the key as the query wrote it, if the
        CASE stands for it (width_bucket).
        """
        ndim = len(self.cube.shape)
        subject = node.this
        labels: list[GroupValue] = []
        kinds: set[bool] = set()

        def label(value_node: exp.Expr | None) -> int:
            value = constant(value_node) if value_node is not None else None
            if value is None:
                group = GroupValue(BinKind.NULL, None)
            else:
                kinds.add(isinstance(value, str))
                group = GroupValue(BinKind.VALUE, value if isinstance(value, str) else float(value))
            if group not in labels:
                labels.append(group)
            return labels.index(group)

        cells: npt.NDArray[np.intp] = np.full((1,) * ndim, -1)
        for branch in node.args.get("ifs") or []:
            condition = (
                branch.this
                if subject is None
                else exp.EQ(this=subject.copy(), expression=branch.this.copy())
            )
            true = self.evaluator.truth(condition).true
            cells = np.where((cells < 0) & true, label(branch.args["true"]), cells)
        cells = np.where(cells < 0, label(node.args.get("default")), cells)
        if len(kinds) > 1:
            raise DatatypeMismatch(
                "CASE types text and numeric cannot be matched", position=position_of(node)
            )
        used = [i for i in range(len(labels)) if np.any(cells == i)]
        renumber = np.zeros(len(labels), dtype=np.intp)
        renumber[used] = np.arange(len(used))
        written = node if written is None else written
        return _GroupKey(
            written.sql("postgres"),
            tuple(labels[i] for i in used),
            renumber[cells],
            kinds == {True},
            written,
        )

    def _rows(
        self,
        group_keys: list[_GroupKey],
        aggregates: list[tuple[Floats, float]],
        ratios: list[tuple[tuple[Floats, float], tuple[Floats, float]]],
    ) -> tuple[AnswerRow, ...]:
        """One row per combination of the keys' groups, empty or not."""
        shape = self.cube.shape
        measures = self.cube.measure_reach
        rows = []
        for combo in itertools.product(*(range(len(k.labels)) for k in group_keys)):
            mask = np.ones((1,) * len(shape), dtype=bool)
            for key, group in zip(group_keys, combo):
                mask = mask & (key.cells == group)
            queries = tuple(
                LinearQuery.from_tensor(shape, np.where(mask, weights, 0.0), offset, measures)
                for weights, offset in aggregates
            )
            parts = tuple(
                (
                    LinearQuery.from_tensor(
                        shape, np.where(mask, numerator[0], 0.0), numerator[1], measures
                    ),
                    LinearQuery.from_tensor(
                        shape, np.where(mask, denominator[0], 0.0), denominator[1], measures
                    ),
                )
                for numerator, denominator in ratios
            )
            keys = tuple(k.labels[g] for k, g in zip(group_keys, combo))
            rows.append(AnswerRow(keys, queries, parts))
        return tuple(rows)

    def _ratio(
        self, node: exp.Expr
    ) -> tuple[tuple[Floats, Fraction], tuple[Floats, Fraction]] | None:
        """The (numerator, denominator) of a ratio select item; None if it is not one.

        A ratio is ``AVG(x)`` (``SUM(x) / COUNT(x)``), or ``A / B`` of linear aggregates, either
        possibly times a constant.
        """
        if isinstance(node, exp.Paren):
            return self._ratio(node.this)
        average = node.this if isinstance(node, exp.Filter) else node
        if isinstance(average, exp.Avg):
            if isinstance(average.this, exp.Distinct):
                raise UnsupportedQuery(
                    "AVG(DISTINCT ...) is not supported", position=position_of(average)
                )
            parts: list[exp.Expr] = [
                exp.Sum(this=average.this.copy()),
                exp.Count(this=average.this.copy()),
            ]
            if isinstance(node, exp.Filter):
                parts = [exp.Filter(this=p, expression=node.expression.copy()) for p in parts]
            return (self._aggregate(parts[0]), Fraction(0)), (
                self._aggregate(parts[1]),
                Fraction(0),
            )
        if (
            isinstance(node, exp.Div)
            and _has_aggregate(node.this)
            and _has_aggregate(node.expression)
        ):
            return self._linear(node.this), self._linear(node.expression)
        if isinstance(node, exp.Mul):
            for inner, factor_node in ((node.this, node.expression), (node.expression, node.this)):
                factor = None if _has_aggregate(factor_node) else constant(factor_node)
                ratio = self._ratio(inner) if isinstance(factor, Fraction) else None
                if ratio is not None and isinstance(factor, Fraction):
                    (weights, offset), denominator = ratio
                    scaled = weights * as_float(factor, factor_node), offset * factor
                    return scaled, denominator
        return None

    def _linear(self, node: exp.Expr) -> tuple[Floats, Fraction]:
        """An output expression as (per-coordinate weights, constant offset).

        Weights have a leading axis of coordinate kinds (the count, then each measure's sum)
        before the cube's axes (broadcastable).
        """
        zero = np.zeros((1,) * (1 + len(self.cube.shape)))
        if isinstance(node, exp.Paren):
            return self._linear(node.this)
        if not _has_aggregate(node):
            _refuse_row_level(node)
            value = constant(node)
            if not isinstance(value, Fraction):
                raise UnsupportedQuery(
                    f"expected a number, got {node.sql('postgres')}", position=position_of(node)
                )
            return zero, value
        if isinstance(node, (exp.Filter, exp.Count, exp.Sum)) or isinstance(node, exp.AggFunc):
            return self._aggregate(node), Fraction(0)
        if isinstance(node, exp.Neg):
            weights, offset = self._linear(node.this)
            return -weights, -offset
        if isinstance(node, (exp.Add, exp.Sub)):
            (lw, lo), (rw, ro) = self._linear(node.this), self._linear(node.expression)
            return (lw + rw, lo + ro) if isinstance(node, exp.Add) else (lw - rw, lo - ro)
        if isinstance(node, exp.Mul):
            left, right = node.this, node.expression
            if _has_aggregate(left) and _has_aggregate(right):
                raise UnsupportedQuery(
                    f"product of two aggregates is not linear: {node.sql('postgres')}",
                    position=position_of(node),
                )
            factor_node, agg_node = (left, right) if _has_aggregate(right) else (right, left)
            factor = constant(factor_node)
            if not isinstance(factor, Fraction):
                raise UnsupportedQuery(
                    f"expected a numeric factor, got {factor_node.sql('postgres')}",
                    position=position_of(factor_node),
                )
            weights, offset = self._linear(agg_node)
            return weights * as_float(factor, factor_node), offset * factor
        if isinstance(node, exp.Div) and _has_aggregate(node.expression):
            raise UnsupportedQuery(
                f"a ratio of aggregates inside another expression: {node.sql('postgres')}",
                hint="ask for the ratio as a select item of its own (COUNT(...) / COUNT(...), "
                "AVG(x), 100.0 * COUNT(...) / COUNT(...)): it gets its own interval",
                position=position_of(node),
            )
        refuse_division(node)
        raise UnsupportedQuery(
            f"unsupported expression around an aggregate: {node.sql('postgres')}",
            hint="combine aggregates with + - and constant factors",
            position=position_of(node),
        )

    def _aggregate(self, node: exp.Expr) -> Floats:
        """Per-cell weight of one aggregate (with its FILTER)."""
        mask: npt.NDArray[np.bool_] | None = None
        if isinstance(node, exp.Filter):
            mask = self.evaluator.truth(node.expression).true
            node = node.this
        if isinstance(node, exp.Count):
            arg = node.this
            if isinstance(arg, exp.Distinct) or node.args.get("distinct"):
                raise UnsupportedQuery(
                    "COUNT(DISTINCT ...) is not supported",
                    detail="distinct counts are not linear in the cell counts",
                    position=position_of(node),
                )
            _refuse_nested_aggregate(arg)
            weights = self._kinds(
                np.ones((1,) * len(self.cube.shape))
                if arg is None or isinstance(arg, exp.Star)
                else self.evaluator.not_null(arg).astype(np.float64)
            )
        elif isinstance(node, exp.Sum):
            arg = node.this
            if isinstance(arg, exp.Distinct):
                raise UnsupportedQuery(
                    "SUM(DISTINCT ...) is not supported", position=position_of(node)
                )
            _refuse_nested_aggregate(arg)
            if isinstance(arg, exp.Null):
                raise DatatypeMismatch("SUM(NULL) has no type to sum", position=position_of(node))
            values = self.evaluator.values(arg)
            # SUM skips NULLs (Values keep 0 there, for the measures too)
            weights = self._kinds(np.where(values.null, 0.0, values.value), values.measures)
        else:
            name = node.sql_name() if isinstance(node, exp.Func) else type(node).__name__
            hint = (
                "ask for AVG(x) as a select item of its own: it is answered as a ratio "
                "with its own interval"
                if isinstance(node, exp.Avg)
                else "only COUNT and SUM are linear in the cell counts"
            )
            raise UnsupportedQuery(
                f"aggregate {name} is not supported", hint=hint, position=position_of(node)
            )
        return weights if mask is None else weights * mask

    def _kinds(self, count: Floats, measures: Mapping[int, Floats] | None = None) -> Floats:
        """Per-cell weights of the count and of each measure's sum, stacked on a leading axis."""
        measures = measures or {}
        kinds = [count] + [measures.get(m, np.zeros(1)) for m in range(len(self.cube.measures))]
        return np.stack(np.broadcast_arrays(*(np.asarray(k, dtype=np.float64) for k in kinds)))


@dataclass(frozen=True, slots=True, eq=False)
class _GroupKey:
    """A GROUP BY key: its groups, and in every cell (broadcastable) the index of its group.

    ``node`` is the grouped expression, None for a dimension column.
    """

    name: str
    labels: tuple[GroupValue, ...]
    cells: npt.NDArray[np.intp]
    text: bool
    node: exp.Expr | None = None


def _require_select(statement: exp.Expr) -> exp.Select:
    if isinstance(statement, (exp.Union, exp.Intersect, exp.Except)):
        kind = type(statement).__name__.upper()
        raise UnsupportedQuery(
            f"{kind} is not supported in a DP query",
            hint=SUPPORTED_FORMS,
            position=position_of(statement),
        )
    if not isinstance(statement, exp.Select):
        raise UnsupportedQuery(
            f"{statement.key.upper()} statements are not DP queries",
            hint=SUPPORTED_FORMS,
            position=position_of(statement),
        )
    for key, words in _REFUSED_CLAUSES.items():
        if statement.args.get(key):
            raise UnsupportedQuery(
                f"{words} is not supported in a DP query",
                hint=SUPPORTED_FORMS,
                position=position_of(statement.args[key]),
            )
    for node in statement.walk():
        if node is not statement and isinstance(node, (exp.Select, exp.Subquery)):
            raise UnsupportedQuery(
                "subqueries are not supported in a DP query",
                hint=SUPPORTED_FORMS,
                position=position_of(node),
            )
        if isinstance(node, exp.Window):
            raise UnsupportedQuery(
                "window functions are not supported in a DP query",
                hint=SUPPORTED_FORMS,
                position=position_of(node),
            )
    source = statement.args.get("from_")
    if source is None:
        raise UnsupportedQuery("a DP query needs FROM <protected table>", hint=SUPPORTED_FORMS)
    if not isinstance(source.this, exp.Table) or not isinstance(source.this.this, exp.Identifier):
        what = (
            "subqueries"
            if isinstance(source.this, exp.Subquery)
            else f"FROM {source.this.sql('postgres')}"
        )
        raise UnsupportedQuery(
            f"{what} are not supported in a DP query"
            if what == "subqueries"
            else f"{what} is not supported in a DP query",
            hint=SUPPORTED_FORMS,
            position=position_of(source),
        )
    return statement


def _interval_kind(node: exp.Expr) -> OutputKind | None:
    if isinstance(node, exp.Anonymous):
        return _INTERVAL_FUNCTIONS.get(node.name.upper())
    return None


def _has_aggregate(node: exp.Expr) -> bool:
    return any(isinstance(n, exp.AggFunc) for n in node.walk())


def _refuse_nested_aggregate(node: exp.Expr | None) -> None:
    if node is not None and _has_aggregate(node):
        raise UnsupportedQuery(
            "aggregate function calls cannot be nested", position=position_of(node)
        )


def _refuse_row_level(node: exp.Expr) -> None:
    """Columns outside an aggregate would make the value differ per row."""
    column = node.find(exp.Column)
    if column is not None:
        raise UnsupportedQuery(
            f"{column.sql('postgres')} outside an aggregate must be a GROUP BY dimension "
            "on its own",
            hint=SUPPORTED_FORMS,
            position=position_of(column),
        )


def _output_name(item: exp.Expr) -> str:
    """The column name PostgreSQL gives a select-list item (its FigureColname rules)."""
    if isinstance(item, exp.Alias):
        return _ident(item.args["alias"])
    node = item
    while isinstance(node, (exp.Paren, exp.Filter)):
        node = node.this
    if isinstance(node, exp.Column):
        return _ident(node.this)
    if isinstance(node, exp.Case):
        return "case"
    if isinstance(node, exp.Func) and not isinstance(node, exp.Binary):
        name = node.sql_name() if not isinstance(node, exp.Anonymous) else node.name
        return name.lower()
    return "?column?"
