"""Split a statement into DP cores and a wrapper that post-processes their released rows.

A *core* is the part the engine answers: linear aggregates over one protected table, with its
WHERE and GROUP BY, exactly as :class:`~sqlmap.translate.Translator` translates them. The
*wrapper* is the rest of the statement (ORDER BY, LIMIT, HAVING, arithmetic and CASE over the
aggregates, window functions, outer queries, joins with public tables), with each core replaced
by a ``(VALUES ...)`` relation of its noisy rows. The wrapper runs in PostgreSQL under the
analyst's pass-through role, so PostgreSQL's own semantics, types and errors apply, and it can
only ever see released values and the analyst's own SQL.

Which rows a core releases depends only on the query and the cube (every bin of a GROUP BY):
whatever the wrapper does with them is post-processing and costs nothing.

A ratio of two aggregates (``AVG(x)``, ``COUNT(...) / COUNT(...)``, times a constant) is a
value of the core, answered with an interval of its own (:mod:`proxy.engine.ratio`), wherever
it appears: in the select list, HAVING, ORDER BY or a CASE.
"""

from __future__ import annotations

import itertools
import math
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlglot import exp

from sqlmap.accuracy import CLAUSE_KEY, HINT_KEY
from sqlmap.cellwise import position_of
from sqlmap.cube import CategoricalDimension, Cube, Scalar
from sqlmap.errors import UnsupportedQuery
from sqlmap.probability import PROBABILITY_FUNCTION, probability_call

if TYPE_CHECKING:
    from sqlmap.translate import Translator

__all__ = [
    "Core",
    "Wrapped",
    "WrapperColumnType",
    "needs_wrapper",
    "original_position",
    "split",
    "values_relation",
]

#: Clauses that make a SELECT over a protected table more than a core.
_WRAPPER_CLAUSES = ("order", "limit", "offset", "having", "distinct", "windows", "qualify")

_INTERVALS = ("DP_INTERVAL_LOW", "DP_INTERVAL_HIGH", PROBABILITY_FUNCTION)

# Unguessable within a process: the placeholder of a core in the wrapper's text cannot collide
# with anything the analyst wrote.
_TOKEN = secrets.token_hex(8)


class WrapperColumnType:
    """SQL types of a core's relation columns, as the VALUES list casts them."""

    TEXT = "text"
    FLOAT8 = "float8"


@dataclass(frozen=True, slots=True)
class Core:
    """One core: the DP query the engine answers, and the relation the wrapper reads.

    ``select`` is a query :class:`~sqlmap.translate.Translator` accepts, carrying the statement's
    accuracy clause; its output columns are, in order, the relation's ``columns``. A core
    without aggregates (``SELECT DISTINCT dim``, ``GROUP BY dim`` alone) lists the declared
    values, which are public: it has ``rows`` (and their ``types``) and asks the engine nothing.
    """

    select: exp.Select
    columns: tuple[str, ...]
    placeholder: str
    rows: tuple[tuple[Scalar | None, ...], ...] | None = None
    types: tuple[str, ...] = ()

    @property
    def sql(self) -> str:
        """The core as SQL (for logs, the audit and memo keys)."""
        return self.select.sql("postgres")


@dataclass(frozen=True, slots=True)
class Wrapped:
    """A statement split into cores and the wrapper's SQL around them.

    ``template`` is the wrapper with each core's relation as a placeholder; :meth:`render` puts
    the released rows in. ``prefix`` is text kept verbatim before it (``DECLARE c CURSOR FOR``).
    """

    cores: tuple[Core, ...]
    template: str
    prefix: str = ""

    def render(self, relations: Sequence[str]) -> str:
        """The statement to run under the pass-through role, one relation per core."""
        if len(relations) != len(self.cores):
            raise ValueError("one relation per core")
        sql = self.template
        for core, relation in zip(self.cores, relations):
            sql = sql.replace(core.placeholder, relation)
        return self.prefix + sql


def values_relation(rows: Sequence[Sequence[str | float | None]], types: Sequence[str]) -> str:
    """A parenthesised VALUES list of released rows, every value cast to its column's type.

    Strings are written as E'' literals, so they read the same whatever the session's
    ``standard_conforming_strings``.

    >>> values_relation([("Male", 1.5), (None, -2.0)], ["text", "float8"])
    "(VALUES (E'Male'::text, '1.5'::float8), (NULL::text, '-2.0'::float8))"
    """
    if not rows:
        raise ValueError("a core always releases at least one row")
    lines = []
    for row in rows:
        values = []
        for value, sql_type in zip(row, types, strict=True):
            if value is None:
                values.append(f"NULL::{sql_type}")
            elif isinstance(value, str):
                escaped = value.replace("\\", "\\\\").replace("'", "''")
                values.append(f"E'{escaped}'::{sql_type}")
            else:
                if not math.isfinite(value):
                    raise ValueError(f"a released value must be finite, got {value!r}")
                values.append(f"'{float(value)!r}'::{sql_type}")
        lines.append("(" + ", ".join(values) + ")")
    return "(VALUES " + ", ".join(lines) + ")"


_WORD = re.compile(r"""'(?:[^']|'')*'|"(?:[^"]|"")*"|[^\W\d]\w*|\d+(?:\.\d+)?""")


def original_position(rendered: str, position: int, original: str) -> int | None:
    """Where an error PostgreSQL reports in a rendered wrapper points in the analyst's SQL.

    ``position`` is PostgreSQL's (1-based, in characters of ``rendered``). The word there (a
    name, a quoted name, a string or a number) is looked for in ``original``: found exactly
    once (unquoted names compare case-insensitively), that is the position in ``original``;
    otherwise, or if the word is dpproxy's own (a core's relation), None: better no caret
    than a wrong one.

    >>> sql = 'SELECT sex, COUNT(*) FROM adult GROUP BY sex ORDER BY Nope'
    >>> rendered = 'SELECT _dpproxy_1._k1 AS sex FROM (VALUES (1)) AS _dpproxy_1 ORDER BY nope'
    >>> original_position(rendered, rendered.index('nope') + 1, sql) == sql.index('Nope') + 1
    True
    >>> original_position(rendered, rendered.index('_dpproxy_1') + 1, sql) is None
    True
    """
    match = _WORD.match(rendered, max(position - 1, 0))
    if match is None:
        return None
    word = match.group()
    if word[0] in "'\"":
        found = [m.start() for m in re.finditer(re.escape(word), original)]
    else:
        pattern = r"(?<![\w\"])" + re.escape(word) + r"(?![\w\"])"
        found = [m.start() for m in re.finditer(pattern, original, re.IGNORECASE)]
    return found[0] + 1 if len(found) == 1 else None


def needs_wrapper(statement: exp.Expr) -> bool:
    """False for a statement the translator answers whole, as before post-processing existed.

    That is a single SELECT over one table, without clauses the wrapper handles, whose select
    items are group keys, linear aggregates and interval functions.
    """
    if not isinstance(statement, exp.Select):
        return True
    if any(statement.args.get(k) for k in (*_WRAPPER_CLAUSES, "with_", "joins")):
        return True
    source = statement.args.get("from_")
    if source is None or not isinstance(source.this, exp.Table):
        return True
    if any(isinstance(n, (exp.Subquery, exp.Window)) for n in statement.walk()):
        return True
    for item in statement.expressions:
        body = item.unalias() if isinstance(item, exp.Alias) else item
        if not (
            isinstance(body, exp.Column)
            or _interval_call(body)
            or _linear_aggregate(body)
            or _ratio_aggregate(body)
        ):
            return True
    return False


def split(statement: exp.Expr, translator: Translator, prefix: str = "") -> Wrapped | None:
    """Split ``statement`` into cores and a wrapper; None if it reads a protected table otherwise.

    Every mention of one of ``translator``'s protected tables must be the only FROM item of an
    aggregating SELECT (one with an aggregate, a GROUP BY or DISTINCT);
    anything else (a row read, a join with the table, a CTE named like it) is None, which the
    router refuses. The statement's accuracy clause and hint go to every core.

    Raises:
        UnsupportedQuery: a core in a form the wrapper cannot take apart (0A000).
    """
    tables = {table for _, table in translator.cubes}
    tree = statement.copy()
    accuracy = {key: tree.args.get(key) for key in (CLAUSE_KEY, HINT_KEY)}
    for key in accuracy:
        tree.set(key, None)
    if any(_name(cte.alias_or_name) in tables for cte in tree.find_all(exp.CTE)):
        return None
    selects: list[exp.Select] = []
    for table in tree.find_all(exp.Table):
        if _name(table.name) not in tables or table.args.get("catalog") is not None:
            continue
        select = _core_select(table)
        if select is None:
            return None
        if not any(s is select for s in selects):
            selects.append(select)
    if not selects:
        return None
    selects.sort(key=_depth, reverse=True)  # inner cores first: an outer one wraps their result
    cores = []
    for index, select in enumerate(selects, start=1):
        core, wrapper = _rewrite(select, translator, index, accuracy)
        cores.append(core)
        if select is tree:
            tree = wrapper
        else:
            select.replace(wrapper)
    return Wrapped(tuple(cores), tree.sql("postgres"), prefix)


def _name(text: str) -> str:
    return text.lower()


def _depth(node: exp.Expr) -> int:
    depth = 0
    while node.parent is not None:
        node, depth = node.parent, depth + 1
    return depth


def _core_select(table: exp.Table) -> exp.Select | None:
    """The SELECT whose sole FROM item ``table`` is, if that SELECT aggregates."""
    source = table.parent
    select = source.parent if isinstance(source, exp.From) else None
    if not isinstance(select, exp.Select) or select.args.get("joins"):
        return None
    roots = [*select.expressions, select.args.get("having"), select.args.get("order")]
    if _distinct_values(select):
        return select
    if select.args.get("group") is None and not any(_aggregates(r) for r in roots if r is not None):
        return None
    return select


def _aggregates(node: exp.Expr) -> bool:
    """Whether ``node`` aggregates rows in its own scope: not in a subquery, nor as a window."""
    if isinstance(node, (exp.Subquery, exp.Select)):
        return False
    if isinstance(node, exp.Window):
        return any(_aggregates(a) for a in node.this.iter_expressions())
    if isinstance(node, exp.AggFunc):
        return True
    return any(_aggregates(child) for child in node.iter_expressions())


def _distinct_values(select: exp.Select) -> bool:
    """``SELECT DISTINCT`` of plain columns, without GROUP BY: a list of values."""
    distinct = select.args.get("distinct")
    return (
        distinct is not None
        and distinct.args.get("on") is None
        and select.args.get("group") is None
        and all(isinstance(i.unalias(), exp.Column) for i in select.expressions)
    )


def _interval_call(node: exp.Expr) -> bool:
    return isinstance(node, exp.Anonymous) and node.name.upper() in _INTERVALS


def _has_aggregate(node: exp.Expr) -> bool:
    return any(isinstance(n, exp.AggFunc) for n in node.walk())


def _has_column(node: exp.Expr) -> bool:
    return any(isinstance(n, exp.Column) for n in node.walk())


def _linear_aggregate(node: exp.Expr) -> bool:
    """True for what the translator answers as one value: aggregates, + -, constant factors."""
    if isinstance(node, exp.Paren):
        return _linear_aggregate(node.this)
    if isinstance(node, (exp.AggFunc, exp.Filter)):
        return not _is_average(node)
    if isinstance(node, exp.Neg):
        return _linear_aggregate(node.this)
    if isinstance(node, (exp.Add, exp.Sub)):
        sides = (node.this, node.expression)
        return all(_linear_aggregate(s) or _constant(s) for s in sides) and any(
            _linear_aggregate(s) for s in sides
        )
    if isinstance(node, exp.Mul):
        left, right = node.this, node.expression
        return (_linear_aggregate(left) and _constant(right)) or (
            _constant(left) and _linear_aggregate(right)
        )
    return False


def _bare_aggregate(node: exp.Expr) -> bool:
    """One aggregate call (with its FILTER): inside arithmetic, each is a value of its own."""
    if isinstance(node, exp.Paren):
        return _bare_aggregate(node.this)
    return isinstance(node, (exp.AggFunc, exp.Filter)) and not _is_average(node)


def _is_average(node: exp.Expr) -> bool:
    return isinstance(node.this if isinstance(node, exp.Filter) else node, exp.Avg)


def _ratio_aggregate(node: exp.Expr) -> bool:
    """A ratio answered as one value: AVG, or linear aggregates divided, times a constant."""
    if isinstance(node, exp.Paren):
        return _ratio_aggregate(node.this)
    if isinstance(node, (exp.Avg, exp.Filter)):
        return _is_average(node)
    if isinstance(node, exp.Div):
        return _linear_aggregate(node.this) and _linear_aggregate(node.expression)
    if isinstance(node, exp.Mul):
        left, right = node.this, node.expression
        return (_ratio_aggregate(left) and _constant(right)) or (
            _constant(left) and _ratio_aggregate(right)
        )
    return False


def _ident(node: exp.Expr) -> str:
    """A name as PostgreSQL stores it: unquoted names fold to lower case."""
    identifier = node.this if isinstance(node, exp.Column) else node
    if isinstance(identifier, exp.Identifier) and identifier.quoted:
        return str(identifier.this)
    return identifier.name.lower()


def _constant(node: exp.Expr) -> bool:
    return not _has_aggregate(node) and not _has_column(node) and not node.find(exp.Select)


class _CoreBuilder:
    """Collects a core's group keys, aggregates and intervals while rewriting its SELECT."""

    def __init__(self, select: exp.Select, cube: Cube, index: int) -> None:
        self.select = select
        self.cube = cube
        self.alias = f"_dpproxy_{index}"
        table = select.args["from_"].this
        alias = table.args.get("alias")
        self.qualifier = _name(alias.name) if alias is not None else _name(table.name)
        self.keys = self._group_keys()
        self.key_sql = [k.sql("postgres") for k in self.keys]
        self.aggregates: list[exp.Expr] = []
        self.aggregate_names: list[str] = []
        self.intervals: list[exp.Anonymous] = []  # the core's calls, over its aggregates
        self.output_names = {
            _ident(i.args["alias"]) for i in select.expressions if isinstance(i, exp.Alias)
        }

    def _group_keys(self) -> list[exp.Expr]:
        """GROUP BY items, positions and output aliases resolved to expressions."""
        group = self.select.args.get("group")
        items = self.select.expressions
        if group is None:
            return [i.unalias().copy() for i in items] if _distinct_values(self.select) else []
        keys: list[exp.Expr] = []
        for key in group.expressions:
            if isinstance(key, exp.Literal) and not key.is_string:
                index = int(key.this)
                if not 1 <= index <= len(items):
                    raise UnsupportedQuery(
                        f"GROUP BY position {index} is not in the select list",
                        position=position_of(key),
                    )
                key = items[index - 1]
            elif isinstance(key, exp.Column) and key.args.get("table") is None:
                aliased = [
                    i for i in items if isinstance(i, exp.Alias) and _name(i.alias) == key.name
                ]
                if len(aliased) == 1 and not isinstance(aliased[0].unalias(), exp.Column):
                    key = aliased[0]
            key = key.unalias() if isinstance(key, exp.Alias) else key
            if isinstance(key, exp.Cast) and isinstance(key.this, exp.Column):
                key = key.this  # grouped by the dimension, cast by the wrapper
            if all(key != k for k in keys):
                keys.append(key.copy())
        return keys

    def key_column(self, node: exp.Expr) -> exp.Column | None:
        """The relation's column for a group key expression, if ``node`` is one."""
        for i, key in enumerate(self.keys):
            if _same_key(node, key, self.qualifier):
                return exp.column(f"_k{i + 1}", self.alias)
        return None

    def aggregate_column(self, node: exp.Expr, name: str | None = None) -> exp.Column:
        for i, existing in enumerate(self.aggregates):
            if existing == node:
                return exp.column(f"_a{i + 1}", self.alias)
        self.aggregates.append(node.copy())
        self.aggregate_names.append(name or node.sql("postgres"))
        return exp.column(f"_a{len(self.aggregates)}", self.alias)

    def interval_column(self, call: exp.Anonymous) -> exp.Column:
        function = call.name.upper()
        args = call.expressions
        if function == PROBABILITY_FUNCTION:
            args = [probability_call(call)[0]]
        if len(args) != 1 or not (_linear_aggregate(args[0]) or _ratio_aggregate(args[0])):
            raise UnsupportedQuery(
                f"{function} takes one aggregate expression",
                position=position_of(call),
            )
        self.aggregate_column(args[0])
        # the core reports on the aggregate it computes (the comparison names it, verbatim)
        entry = exp.Anonymous(this=function, expressions=[a.copy() for a in call.expressions])
        if entry not in self.intervals:
            self.intervals.append(entry)
        return exp.column(f"_i{self.intervals.index(entry) + 1}", self.alias)

    def replace(self, node: exp.Expr, order_by: bool = False) -> exp.Expr:
        """``node`` with aggregates, intervals and group keys turned into relation columns.

        Rewrites in place: the node returned may be ``node`` itself.
        """
        if isinstance(node, (exp.Subquery, exp.Select)):
            return node  # its own scope
        key = self.key_column(node)
        if key is not None:
            return key
        if _interval_call(node):
            return self.interval_column(node)  # type: ignore[arg-type]
        if isinstance(node, exp.Window):
            return self._window(node)
        if (
            any(node == a for a in self.aggregates)
            or _bare_aggregate(node)
            or _ratio_aggregate(node)
        ):
            return self.aggregate_column(node)
        if isinstance(node, exp.Column) and not _has_aggregate(node):
            if order_by and node.args.get("table") is None and _ident(node) in self.output_names:
                return node  # ORDER BY an output column's name
            raise UnsupportedQuery(
                f"column {node.sql('postgres')} must appear in the GROUP BY clause "
                "or be used in an aggregate function",
                position=position_of(node),
            )
        self._replace_children(node, order_by)
        return node

    def _replace_children(self, node: exp.Expr, order_by: bool = False) -> None:
        """Rewrite ``node``'s children in place (the tree is :func:`split`'s own copy)."""
        for name, value in list(node.args.items()):
            if isinstance(value, exp.Expr):
                node.set(name, self.replace(value, order_by))
            elif isinstance(value, list):
                node.set(
                    name,
                    [self.replace(v, order_by) if isinstance(v, exp.Expr) else v for v in value],
                )

    def _window(self, window: exp.Window) -> exp.Expr:
        """A window function over the released rows: its arguments and frame are rewritten."""
        self._replace_children(window.this)
        for name in ("partition_by", "order"):
            value = window.args.get(name)
            if isinstance(value, list):
                window.set(name, [self.replace(v) for v in value])
            elif isinstance(value, exp.Expr):
                window.set(name, self.replace(value))
        return window

    def domain(self) -> tuple[tuple[tuple[Scalar | None, ...], ...], tuple[str, ...]]:
        """Rows and types of a core without aggregates: its keys' declared values.

        Every combination of the values, plus NULL where a dimension is nullable, whether or
        not rows have them: the list is public, the data's own list is not.
        """
        dims = []
        for key in self.keys:
            dim = self.cube.dimension(key.name.lower()) if isinstance(key, exp.Column) else None
            if not isinstance(dim, CategoricalDimension):
                raise UnsupportedQuery(
                    "a DP query must compute at least one aggregate",
                    detail="without an aggregate the query would return rows of the protected "
                    "table; only the declared values of a dimension can be listed",
                    position=position_of(key),
                )
            dims.append(dim)
        if self.select.args.get("where") is not None:
            raise UnsupportedQuery(
                "a list of a dimension's values cannot be filtered",
                detail="the list is the dimension's declared values, known without the data",
                hint="drop the WHERE clause, or count rows per value with COUNT(*)",
                position=position_of(self.select.args["where"]),
            )
        if not dims:
            raise UnsupportedQuery(
                "a DP query must compute at least one aggregate",
                position=position_of(self.select),
            )
        choices = [(*d.values, *((None,) if d.nullable else ())) for d in dims]
        types = tuple(
            WrapperColumnType.FLOAT8 if d.numeric else WrapperColumnType.TEXT for d in dims
        )
        return tuple(itertools.product(*choices)), types

    def core(self, accuracy: dict[str, exp.Expr | None]) -> exp.Select:
        """The DP query this core asks the engine."""
        items: list[exp.Expr] = [
            exp.alias_(k.copy(), f"_k{i + 1}") for i, k in enumerate(self.keys)
        ]
        items += [
            exp.alias_(a.copy(), name, quoted=True)
            for a, name in zip(self.aggregates, self.aggregate_names)
        ]
        items += [exp.alias_(call.copy(), f"_i{i + 1}") for i, call in enumerate(self.intervals)]
        core = exp.Select(expressions=items)
        core.set("from_", self.select.args["from_"].copy())
        where = self.select.args.get("where")
        if where is not None:
            core.set("where", where.copy())
        if self.keys:
            core.set("group", exp.Group(expressions=[k.copy() for k in self.keys]))
        for key, node in accuracy.items():
            if node is not None:
                core.set(key, node.copy())
        return core

    def columns(self) -> tuple[str, ...]:
        return (
            tuple(f"_k{i + 1}" for i in range(len(self.keys)))
            + tuple(f"_a{i + 1}" for i in range(len(self.aggregates)))
            + tuple(f"_i{i + 1}" for i in range(len(self.intervals)))
        )


def _same_key(node: exp.Expr, key: exp.Expr, qualifier: str) -> bool:
    """Whether ``node`` is the group key ``key``, qualified by the core's table or not."""
    if isinstance(node, exp.Column) and isinstance(key, exp.Column):
        return (
            node.name.lower() == key.name.lower()
            if not node.this.quoted and not key.this.quoted
            else node.name == key.name
        ) and all(
            q.args.get("table") is None or _name(q.args["table"].name) == qualifier
            for q in (node, key)
        )
    return not isinstance(node, exp.Column) and node == key


def _rewrite(
    select: exp.Select,
    translator: Translator,
    index: int,
    accuracy: dict[str, exp.Expr | None],
) -> tuple[Core, exp.Select]:
    """The core of ``select`` and the wrapper SELECT that replaces it.

    The wrapper keeps the select list, ORDER BY, LIMIT/OFFSET, DISTINCT and windows, with every
    aggregate and group key read from the core's relation; HAVING becomes its WHERE (the
    relation has one row per group) and WHERE and GROUP BY stay in the core. A division, a CASE
    or any function of aggregates is computed here from the noisy values: this is the place
    where an interval for a ratio would be derived from the two aggregates' intervals.
    """
    builder = _CoreBuilder(select, translator.cube_for(select.args["from_"].this), index)
    items = []
    for item in select.expressions:
        body = item.unalias() if isinstance(item, exp.Alias) else item
        if isinstance(body, exp.Star):
            raise UnsupportedQuery(
                "SELECT * would return rows of the protected table", position=position_of(item)
            )
        core_value = _linear_aggregate(body) or _ratio_aggregate(body)
        if core_value and not isinstance(item, exp.Alias):
            builder.aggregate_column(body, _figure_name(item))
        elif core_value:
            builder.aggregate_column(body, item.alias)
        new = builder.replace(body)
        name = item.alias if isinstance(item, exp.Alias) else _figure_name(item)
        quoted = isinstance(item, exp.Alias) and item.args["alias"].quoted
        if isinstance(item, exp.Alias) or _figure_name(new) != name:
            items.append(exp.alias_(new, name, quoted=quoted or not isinstance(item, exp.Alias)))
        else:
            items.append(new)
    wrapper = exp.Select(expressions=items)
    relation = exp.Table(
        this=exp.to_identifier(f"{_TOKEN}_{index}", quoted=True),
        alias=exp.TableAlias(this=exp.to_identifier(builder.alias)),
    )
    wrapper.set("from_", exp.From(this=relation))
    having = select.args.get("having")
    if having is not None:
        wrapper.set("where", exp.Where(this=builder.replace(having.this)))
    order = select.args.get("order")
    if order is not None:
        wrapper.set("order", builder.replace(order, order_by=True))
    for key in ("distinct", "windows"):
        value = select.args.get(key)
        if isinstance(value, list):
            wrapper.set(key, [builder.replace(v) for v in value])
        elif value is not None:
            wrapper.set(key, builder.replace(value))
    for key in ("limit", "offset", "locks"):
        value = select.args.get(key)
        if value is not None:
            wrapper.set(key, value.copy() if isinstance(value, exp.Expr) else value)
    # the relation's columns are known only now that every expression was rewritten
    relation.args["alias"].set("columns", [exp.to_identifier(c) for c in builder.columns()])
    placeholder = f'"{_TOKEN}_{index}"'
    if not builder.aggregates:
        rows, types = builder.domain()
        return Core(builder.core(accuracy), builder.columns(), placeholder, rows, types), wrapper
    return Core(builder.core(accuracy), builder.columns(), placeholder), wrapper


def _figure_name(item: exp.Expr) -> str:
    """The column name PostgreSQL gives a select-list item (its FigureColname rules)."""
    if isinstance(item, exp.Alias):
        return item.alias
    node = item
    while isinstance(node, (exp.Paren, exp.Filter, exp.Cast, exp.Window)):
        node = node.this
    if isinstance(node, exp.Column):
        return node.name if node.this.quoted else node.name.lower()
    if isinstance(node, exp.Case):
        return "case"
    if isinstance(node, exp.Anonymous):
        return node.name.lower()
    if isinstance(node, exp.Func) and not isinstance(node, exp.Binary):
        return node.sql_name().lower()
    return "?column?"
