"""Row-level SQL expressions evaluated exactly on every cell of a cube.

A predicate or value can stand in for the SQL only if it is the same for every row that can fall
in a cell; the evaluator proves that bin by bin and refuses (with the usable constants) when it
cannot. Predicates follow SQL's three-valued logic: a :class:`Truth` keeps the cells where the
predicate is TRUE and where it is FALSE; the rest are UNKNOWN (NULL comparisons), which WHERE,
FILTER and CASE all treat as not true.

Arrays are kept in broadcastable form (length 1 on every axis but the ones they depend on), so
evaluating a predicate costs in proportion to its dimensions' bins, not the whole cube.
"""

from __future__ import annotations

import decimal
import difflib
import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlglot import exp

from sqlmap.cube import Bin, BinKind, CategoricalDimension, Cube, Dimension, NumericDimension
from sqlmap.errors import (
    DatatypeMismatch,
    InvalidParameterValue,
    NumericValueOutOfRange,
    UnsupportedQuery,
)

__all__ = [
    "Truth",
    "Values",
    "CellEvaluator",
    "position_of",
    "constant",
    "refuse_division",
    "as_float",
    "width_bucket_case",
]

Bools = npt.NDArray[np.bool_]
Floats = npt.NDArray[np.float64]
Number = Fraction
ColumnResolver = Callable[[exp.Column], Dimension]
#: The position of the measure a column names among the cube's measures, or None.
MeasureResolver = Callable[[exp.Column], int | None]


def position_of(node: exp.Expr | list[exp.Expr]) -> int | None:
    """The 0-based offset of the first token of ``node`` (or nodes) in the SQL text, if known."""
    nodes = node if isinstance(node, list) else [node]
    starts = [n.meta["start"] for root in nodes for n in root.walk() if "start" in n.meta]
    return min(starts) if starts else None


@dataclass(frozen=True, slots=True)
class Truth:
    """Where a predicate is TRUE and where it is FALSE; elsewhere it is UNKNOWN."""

    true: Bools
    false: Bools

    @staticmethod
    def const(value: bool | None, ndim: int) -> Truth:
        """A constant TRUE, FALSE or (None) UNKNOWN."""
        shape = (1,) * ndim
        return Truth(np.full(shape, value is True), np.full(shape, value is False))

    def __and__(self, other: Truth) -> Truth:
        return Truth(self.true & other.true, self.false | other.false)

    def __or__(self, other: Truth) -> Truth:
        return Truth(self.true | other.true, self.false & other.false)

    def __invert__(self) -> Truth:
        return Truth(self.false, self.true)


@dataclass(frozen=True, slots=True)
class Values:
    """A numeric value per cell; ``null`` marks cells where the SQL value is NULL.

    A value may also be linear in the rows' measures: in each cell, a row's value is
    ``value + sum_m measures[m] * v_m`` where ``v_m`` is the row's clamped value of measure
    ``m`` (its sum over the cell's rows is a coordinate of the vector).
    """

    value: Floats
    null: Bools
    measures: Mapping[int, Floats] = field(default_factory=dict)

    @staticmethod
    def const(value: float | None, ndim: int) -> Values:
        """A constant number, or (None) NULL."""
        shape = (1,) * ndim
        return Values(
            np.full(shape, 0.0 if value is None else value), np.full(shape, value is None)
        )

    def combine(self, other: Values, op: Callable[[Floats, Floats], Floats]) -> Values:
        """``op`` (+ or -) applied cellwise; NULL if either side is NULL, as in SQL arithmetic."""
        null = self.null | other.null
        measures = {
            m: np.where(
                null,
                0.0,
                op(self.measures.get(m, np.zeros(1)), other.measures.get(m, np.zeros(1))),
            )
            for m in {*self.measures, *other.measures}
        }
        return Values(np.where(null, 0.0, op(self.value, other.value)), null, measures)

    def times(self, other: Values) -> Values:
        """The cellwise product; one side at most may depend on a measure (else not linear)."""
        null = self.null | other.null
        scaled, factor = (self, other) if not other.measures else (other, self)
        measures = {m: np.where(null, 0.0, w * factor.value) for m, w in scaled.measures.items()}
        return Values(np.where(null, 0.0, self.value * other.value), null, measures)


def refuse_division(node: exp.Expr) -> None:
    """Refuse ``/`` and ``%``: PostgreSQL truncates integer division, which is not linear."""
    if isinstance(node, (exp.Div, exp.IntDiv, exp.Mod)):
        raise UnsupportedQuery(
            f"division is not supported: {node.sql('postgres')}",
            hint="multiply by a decimal constant instead "
            "(PostgreSQL divides integers with truncation)",
            position=position_of(node),
        )


def as_float(value: Number, node: exp.Expr) -> float:
    """An exact constant as a double, or 22003 where PostgreSQL's float8 would overflow too.

    >>> from sqlglot import parse_one
    >>> as_float(Fraction(3, 2), parse_one("1.5"))
    1.5
    >>> as_float(Fraction(10) ** 400, parse_one("1e400"))
    Traceback (most recent call last):
    ...
    sqlmap.errors.NumericValueOutOfRange: value out of range: overflow
    DETAIL: 1e400 does not fit a double precision number
    """
    try:
        result = float(value)
    except OverflowError:
        result = math.inf
    if not math.isfinite(result):
        raise NumericValueOutOfRange(
            "value out of range: overflow",
            detail=f"{node.sql('postgres')[:60]} does not fit a double precision number",
            position=position_of(node),
        )
    return result


def constant(node: exp.Expr) -> Number | str | None:
    """Fold a constant expression: a number (as an exact Fraction), a string, or None for NULL.

    Raises UnsupportedQuery if ``node`` is not built from literals with + - * and parentheses.

    >>> from sqlglot import parse_one
    >>> constant(parse_one("-(2 * 1.5) + 10"))
    Fraction(7, 1)
    """
    if isinstance(node, exp.Paren):
        return constant(node.this)
    if isinstance(node, exp.Null):
        return None
    if isinstance(node, exp.Literal):
        return node.this if node.is_string else Fraction(node.this)
    if isinstance(node, exp.RawString):  # a dollar-quoted string: $$Female$$, $t$Female$t$
        return str(node.this)
    if isinstance(node, exp.Neg):
        inner = constant(node.this)
        if isinstance(inner, str):
            raise DatatypeMismatch("cannot negate a string", position=position_of(node))
        return None if inner is None else -inner
    ops: dict[type[exp.Expr], Callable[[Number, Number], Number]] = {
        exp.Add: operator.add,
        exp.Sub: operator.sub,
        exp.Mul: operator.mul,
    }
    op = ops.get(type(node))
    if op is not None:
        left, right = constant(node.this), constant(node.expression)
        if isinstance(left, str) or isinstance(right, str):
            raise DatatypeMismatch("arithmetic on a string", position=position_of(node))
        return None if left is None or right is None else op(left, right)
    raise UnsupportedQuery(
        f"expected a constant, got {node.sql('postgres')}", position=position_of(node)
    )


#: width_bucket's bucket count at most: each bucket is a branch decided on every bin.
MAX_BUCKETS = 1000


def width_bucket_case(node: exp.WidthBucket) -> exp.Case:
    """``width_bucket(x, low, high, count)`` as the CASE over ``x`` it equals, bucket by bucket.

    As PostgreSQL: bucket ``i`` holds ``[low + (i - 1) w, low + i w)`` with ``w = (high - low) /
    count``, 0 what is below ``low``, ``count + 1`` what is at or above ``high``, NULL NULL (and
    mirrored when ``low > high``). As a group key it is then decided per cell, as any CASE.

    >>> from sqlglot import parse_one
    >>> print(width_bucket_case(parse_one("width_bucket(age, 25, 65, 2)")).sql(pretty=True))
    CASE
      WHEN age IS NULL
      THEN NULL
      WHEN age < 25
      THEN 0
      WHEN age < 45
      THEN 1
      WHEN age < 65
      THEN 2
      ELSE 3
    END
    """
    subject = node.this
    bounds = [node.args.get(k) for k in ("min_value", "max_value", "num_buckets")]
    if any(b is None for b in bounds):
        raise UnsupportedQuery("width_bucket takes (operand, low, high, count)")
    values = [constant(b) for b in bounds if b is not None]
    if any(isinstance(v, str) for v in values):
        raise DatatypeMismatch("width_bucket's bounds and count are numbers")
    numbers = [v for v in values if isinstance(v, Fraction)]
    if len(numbers) < 3:
        return exp.Case(ifs=[], default=exp.Null())  # NULL everywhere, as PostgreSQL
    low, high, count = numbers
    if count.denominator != 1 or count <= 0:
        raise InvalidParameterValue("count must be greater than zero", position=position_of(node))
    if low == high:
        raise InvalidParameterValue(
            "lower bound cannot equal upper bound", position=position_of(node)
        )
    if count > MAX_BUCKETS:
        raise UnsupportedQuery(
            f"width_bucket with {count} buckets: at most {MAX_BUCKETS} can be grouped",
            position=position_of(node),
        )
    n = int(count)
    below, op = (exp.LT, exp.LT) if low < high else (exp.GT, exp.GT)
    ifs = [exp.If(this=exp.Is(this=subject.copy(), expression=exp.Null()), true=exp.Null())]
    ifs.append(exp.If(this=below(this=subject.copy(), expression=_number(low)), true=_number(0)))
    for i in range(1, n + 1):
        edge = low + (high - low) * i / n
        ifs.append(exp.If(this=op(this=subject.copy(), expression=_number(edge)), true=_number(i)))
    return exp.Case(ifs=ifs, default=_number(n + 1))


def _number(value: Number | int) -> exp.Expr:
    """An exact literal when the number has one in decimal, else the nearest double."""
    value = Fraction(value)
    rest = value.denominator
    for factor in (2, 5):
        while rest % factor == 0:
            rest //= factor
    if rest != 1:
        text = repr(float(abs(value)))
    else:
        with decimal.localcontext(prec=200):
            text = format(Decimal(abs(value.numerator)) / Decimal(value.denominator), "f")
    literal = exp.Literal.number(text)
    return exp.Neg(this=literal) if value < 0 else literal


_FLIP: dict[type[exp.Expr], type[exp.Expr]] = {
    exp.LT: exp.GT,
    exp.LTE: exp.GTE,
    exp.GT: exp.LT,
    exp.GTE: exp.LTE,
    exp.EQ: exp.EQ,
    exp.NEQ: exp.NEQ,
}
_SYMBOL: dict[type[exp.Expr], str] = {
    exp.LT: "<",
    exp.LTE: "<=",
    exp.GT: ">",
    exp.GTE: ">=",
    exp.EQ: "=",
    exp.NEQ: "<>",
}


class CellEvaluator:
    """Evaluates WHERE/FILTER predicates and SUM arguments of one query over one cube."""

    def __init__(
        self, cube: Cube, resolve: ColumnResolver, measure: MeasureResolver | None = None
    ) -> None:
        self.cube = cube
        self.resolve = resolve
        self.measure = measure
        self.ndim = len(cube.dimensions)
        #: what the analyst should know about the query though it is answered (typos, ...)
        self.warnings: list[str] = []

    # -- predicates ------------------------------------------------------------------------

    def truth(self, node: exp.Expr) -> Truth:
        """The three-valued truth of a predicate on every cell."""
        rule = _TRUTH_RULES.get(type(node))
        if rule is not None:
            return rule(self, node)
        raise UnsupportedQuery(
            f"unsupported condition: {node.sql('postgres')}",
            hint="conditions compare a dimension with constants: = <> < <= > >= IN BETWEEN "
            "IS [NOT] NULL, combined with AND, OR, NOT",
            position=position_of(node),
        )

    def _is_null(self, node: exp.Is) -> Truth:
        if not isinstance(node.expression, exp.Null):
            raise UnsupportedQuery(
                f"unsupported IS test: {node.sql('postgres')}",
                hint="only IS NULL and IS NOT NULL are supported",
                position=position_of(node),
            )
        subject = node.this
        if isinstance(subject, exp.Column):
            null = self._per_bin(self.resolve(subject), lambda b: b.kind is BinKind.NULL)
        else:
            null = np.full((1,) * self.ndim, constant(subject) is None)
        truth = Truth(null, ~null)
        return ~truth if node.args.get("negate") else truth

    def _in(self, node: exp.In) -> Truth:
        if node.args.get("query") is not None or node.args.get("unnest") is not None:
            raise UnsupportedQuery("subqueries are not supported", position=position_of(node))
        result = Truth.const(False, self.ndim)
        for item in node.expressions:
            result = result | self._compare(exp.EQ, node.this, item, node)
        return result

    def _compare(
        self, op: type[exp.Expr], left: exp.Expr, right: exp.Expr, node: exp.Expr
    ) -> Truth:
        """``left op right`` where one side is a dimension column and the other a constant."""
        if not isinstance(left, exp.Column) and isinstance(right, exp.Column):
            left, right, op = right, left, _FLIP[op]
        if not isinstance(left, exp.Column):
            return self._constant_compare(op, constant(left), constant(right), node)
        if isinstance(right, exp.Column):
            raise UnsupportedQuery(
                f"comparing two columns is not supported: {node.sql('postgres')}",
                hint="compare a dimension with a constant",
                position=position_of(node),
            )
        dim = self.resolve(left)
        value = constant(right)
        if value is None:  # col op NULL is UNKNOWN for every row
            return Truth.const(None, self.ndim)
        where = f"{dim.name} {_SYMBOL[op]} {right.sql('postgres')}"
        rule = _bin_rule(dim, op, value, where, position_of(right))
        if isinstance(dim, CategoricalDimension) and dim.closed and op in (exp.EQ, exp.NEQ):
            self._warn_if_undeclared(dim, value)
        true = self._per_bin(dim, lambda b: rule(b) is True)
        false = self._per_bin(dim, lambda b: rule(b) is False)
        return Truth(true, false)

    def _warn_if_undeclared(self, dim: CategoricalDimension, value: Number | str) -> None:
        """A closed dimension compared with a value it does not declare: most likely a typo.

        The query is answered as written (no row holds the value), with a warning naming the
        closest declared values.
        """
        if _is_declared(dim, Fraction(value) if dim.numeric else value):
            return
        shown = str(value) if isinstance(value, str) else _fmt_edge(float(value))
        names = [str(v) for v in dim.values]
        close = difflib.get_close_matches(shown, names, n=3, cutoff=0.5)
        suggestion = (
            f"did you mean {' or '.join(repr(c) for c in close)}?"
            if close
            else f"it declares {', '.join(repr(n) for n in names[:10])}"
            + (", ..." if len(names) > 10 else "")
        )
        warning = (
            f"{shown!r} is not a declared value of {dim.name}, which is closed: "
            f"no row holds it; {suggestion}"
        )
        if warning not in self.warnings:
            self.warnings.append(warning)

    def _constant_compare(
        self,
        op: type[exp.Expr],
        left: Number | str | None,
        right: Number | str | None,
        node: exp.Expr,
    ) -> Truth:
        if left is None or right is None:
            return Truth.const(None, self.ndim)
        if isinstance(left, str) != isinstance(right, str):
            raise DatatypeMismatch(
                f"cannot compare a string with a number: {node.sql('postgres')}",
                position=position_of(node),
            )
        return Truth.const(bool(_OPS[op](left, right)), self.ndim)

    def _per_bin(
        self, dim: Dimension, f: Callable[[Bin], Any], dtype: type = bool
    ) -> npt.NDArray[Any]:
        """``f`` of each bin of ``dim``, as an array shaped to broadcast along its axis."""
        shape = [1] * self.ndim
        shape[self.cube.axis(dim.name)] = dim.size
        return np.array([f(b) for b in dim.bins], dtype=dtype).reshape(shape)

    # -- values ----------------------------------------------------------------------------

    def values(self, node: exp.Expr) -> Values:
        """A numeric row-level expression (a SUM argument) on every cell."""
        if isinstance(node, exp.Paren):
            return self.values(node.this)
        if isinstance(node, (exp.Literal, exp.Null, exp.Neg)) and not node.find(exp.Column):
            value = constant(node)
            if isinstance(value, str):
                raise DatatypeMismatch(
                    f"cannot sum the string {value!r}", position=position_of(node)
                )
            return Values.const(None if value is None else as_float(value, node), self.ndim)
        if isinstance(node, exp.Neg):
            return Values.const(0.0, self.ndim).combine(self.values(node.this), np.subtract)
        arith: dict[type[exp.Expr], Callable[[Floats, Floats], Floats]] = {
            exp.Add: np.add,
            exp.Sub: np.subtract,
        }
        if type(node) in arith:
            return self.values(node.this).combine(self.values(node.expression), arith[type(node)])
        if isinstance(node, exp.Mul):
            left, right = self.values(node.this), self.values(node.expression)
            if left.measures and right.measures:
                raise UnsupportedQuery(
                    f"product of two measures is not linear: {node.sql('postgres')}",
                    hint="multiply a measure by constants or dimensions only",
                    position=position_of(node),
                )
            return left.times(right)
        if isinstance(node, exp.Column):
            index = self.measure(node) if self.measure is not None else None
            if index is not None:
                ones = np.ones((1,) * self.ndim)
                return Values(0.0 * ones, ones == 0, {index: ones})
            return self._column_values(node)
        if isinstance(node, exp.Case):
            return self._case(node)
        refuse_division(node)
        raise UnsupportedQuery(
            f"unsupported expression in an aggregate: {node.sql('postgres')}",
            hint="aggregate arguments are constants, numeric dimensions, + - *, and CASE WHEN",
            position=position_of(node),
        )

    def _column_values(self, node: exp.Column) -> Values:
        dim = self.resolve(node)
        if isinstance(dim, NumericDimension):
            raise UnsupportedQuery(
                f"the value of {dim.name} is only known to within its bins",
                hint=f"to sum {dim.name}, the DBA declares it a measure with clamp bounds "
                f"(measures: {{{dim.name}: {{lower: ..., upper: ...}}}} in config.yaml)",
                position=position_of(node),
            )
        if not dim.numeric:
            raise DatatypeMismatch(
                f"{dim.name} holds text, not numbers", position=position_of(node)
            )
        if not dim.closed:
            raise UnsupportedQuery(
                f"the value of {dim.name} is unknown for rows outside its declared values",
                hint=f"declare {dim.name} 'closed: true' if it only ever holds the listed values",
                position=position_of(node),
            )
        value = self._per_bin(
            dim, lambda b: float(b.value or 0) if b.kind is BinKind.VALUE else 0.0, np.float64
        )
        null = self._per_bin(dim, lambda b: b.kind is BinKind.NULL)
        return Values(value, null)

    def _case(self, node: exp.Case) -> Values:
        """First branch whose condition is TRUE wins; no match and no ELSE gives NULL."""
        default = node.args.get("default")
        result = self.values(default) if default is not None else Values.const(None, self.ndim)
        subject = node.this
        for branch in reversed(node.args["ifs"]):
            cond = branch.this
            if subject is not None:  # simple CASE x WHEN v: x = v
                # of copies: the parsed tree is shared by sessions translating in other threads
                cond = exp.EQ(this=subject.copy(), expression=cond.copy())
            taken = self.truth(cond).true
            then = self.values(branch.args["true"])
            zero = np.zeros(1)
            result = Values(
                np.where(taken, then.value, result.value),
                np.where(taken, then.null, result.null),
                {
                    m: np.where(taken, then.measures.get(m, zero), result.measures.get(m, zero))
                    for m in {*then.measures, *result.measures}
                },
            )
        return result

    def not_null(self, node: exp.Expr) -> Bools:
        """Where a COUNT(expr) argument is non-NULL: a dimension column or a constant.

        A measure that is not also a dimension has a value in every row: a NULL is read as 0
        (``nulls: zero``) or never occurs (``nulls: never``), so ``AVG(measure)`` averages
        every row.
        """
        if isinstance(node, exp.Column):
            index = self.measure(node) if self.measure is not None else None
            if index is not None and self.cube.dimension(self.cube.measures[index].name) is None:
                return np.ones((1,) * self.ndim, dtype=bool)
            return self._per_bin(self.resolve(node), lambda b: b.kind is not BinKind.NULL)
        try:
            value = constant(node)
        except UnsupportedQuery:
            raise UnsupportedQuery(
                f"COUNT of an expression is not supported: {node.sql('postgres')}",
                hint="use COUNT(*), COUNT(dimension) or COUNT(*) FILTER (WHERE ...)",
                position=position_of(node),
            ) from None
        return np.full((1,) * self.ndim, value is not None)


def _between(evaluator: CellEvaluator, node: exp.Expr) -> Truth:
    low = evaluator._compare(exp.GTE, node.this, node.args["low"], node)
    return low & evaluator._compare(exp.LTE, node.this, node.args["high"], node)


def _comparison(evaluator: CellEvaluator, node: exp.Expr) -> Truth:
    return evaluator._compare(type(node), node.this, node.expression, node)


#: How each kind of predicate node is decided on every cell (``CellEvaluator.truth``).
_TRUTH_RULES: dict[type[exp.Expr], Callable[[CellEvaluator, Any], Truth]] = {
    exp.Paren: lambda e, n: e.truth(n.this),
    exp.Where: lambda e, n: e.truth(n.this),
    exp.And: lambda e, n: e.truth(n.this) & e.truth(n.expression),
    exp.Or: lambda e, n: e.truth(n.this) | e.truth(n.expression),
    exp.Not: lambda e, n: ~e.truth(n.this),
    exp.Boolean: lambda e, n: Truth.const(bool(n.this), e.ndim),
    exp.Null: lambda e, n: Truth.const(None, e.ndim),
    exp.Is: lambda e, n: e._is_null(n),
    exp.In: lambda e, n: e._in(n),
    exp.Between: _between,
    **{kind: _comparison for kind in (exp.LT, exp.LTE, exp.GT, exp.GTE, exp.EQ, exp.NEQ)},
}

_OPS: dict[type[exp.Expr], Callable[[Any, Any], bool]] = {
    exp.LT: operator.lt,
    exp.LTE: operator.le,
    exp.GT: operator.gt,
    exp.GTE: operator.ge,
    exp.EQ: operator.eq,
    exp.NEQ: operator.ne,
}

BinRule = Callable[[Bin], bool | None]


def _bin_rule(
    dim: Dimension, op: type[exp.Expr], value: Number | str, where: str, position: int | None
) -> BinRule:
    """A function telling, per bin, whether ``dim op value`` is TRUE, FALSE or (None) NULL.

    Raises when the comparison is neither true for all nor false for all rows of some bin.
    """
    if isinstance(dim, NumericDimension):
        return _numeric_rule(dim, op, _as_number(dim, value, where, position), where, position)
    return _categorical_rule(dim, op, value, where, position)


def _as_number(dim: Dimension, value: Number | str, where: str, position: int | None) -> Number:
    if isinstance(value, Fraction):
        return value
    try:  # PostgreSQL reads a quoted literal as the column's type
        return Fraction(value.strip())
    except (ValueError, ZeroDivisionError):
        raise DatatypeMismatch(
            f"{dim.name} is numeric, but {value!r} is not a number", position=position
        ) from None


def _numeric_rule(
    dim: NumericDimension, op: type[exp.Expr], c: Number, where: str, position: int | None
) -> BinRule:
    def rule(b: Bin) -> bool | None:
        if b.kind is BinKind.NULL:
            return None
        lo = Fraction(b.lo) if math.isfinite(b.lo) else None
        hi = Fraction(b.hi) if math.isfinite(b.hi) else None
        outcome = _range_outcome(op, c, lo, hi, dim.integer)
        if outcome is None:
            raise _inside_bin(dim, where, b, position)
        return outcome

    return rule


def _range_outcome(
    op: type[exp.Expr], c: Number, lo: Number | None, hi: Number | None, integer: bool
) -> bool | None:
    """``v op c`` for every v in the bin [lo, hi): True/False if the same for all, else None.

    ``None`` bounds are infinite. An integer column's bin holds only the integers lo .. hi-1,
    which is what makes ``age <= 24`` select the whole bin [17, 25).

    >>> _range_outcome(exp.LTE, Fraction(24), Fraction(17), Fraction(25), integer=True)
    True
    >>> _range_outcome(exp.LTE, Fraction(24), Fraction(17), Fraction(25), integer=False) is None
    True
    """
    if integer:
        low, high = lo, (None if hi is None else hi - 1)  # the bin is the closed range [low, high]
        if op in (exp.EQ, exp.NEQ):
            if (
                c.denominator != 1
                or (low is not None and c < low)
                or (high is not None and c > high)
            ):
                return op is exp.NEQ
            return (op is exp.EQ) if low == high else None
        compare = _OPS[op]
        # a monotone test holds for the whole bin iff it holds at the end hardest to satisfy,
        # and fails for the whole bin iff it fails at the easiest end; an infinite end decides
        # nothing
        hardest, easiest = (high, low) if op in (exp.LT, exp.LTE) else (low, high)
        if hardest is not None and compare(hardest, c):
            return True
        if easiest is not None and not compare(easiest, c):
            return False
        return None
    if op in (exp.EQ, exp.NEQ):  # a real bin holds more than one value: only "outside" decides
        return (
            (op is exp.NEQ) if (lo is not None and c < lo) or (hi is not None and c >= hi) else None
        )
    below_all = hi is not None and hi <= c  # every v < c
    if op in (exp.LT, exp.LTE):
        return (
            True
            if below_all
            else (False if lo is not None and (lo >= c if op is exp.LT else lo > c) else None)
        )
    above_all = lo is not None and (lo > c if op is exp.GT else lo >= c)
    return True if above_all else (False if below_all else None)


def _inside_bin(
    dim: NumericDimension, where: str, b: Bin, position: int | None
) -> UnsupportedQuery:
    edges = ", ".join(_fmt_edge(e) for e in dim.edges if math.isfinite(e))
    near = [e for e in (b.lo, b.hi) if math.isfinite(e)]
    if dim.integer:
        near_text = " or ".join(
            f"{dim.name} < {_fmt_edge(e)} (= {dim.name} <= {_fmt_edge(e - 1)})" for e in near
        )
    else:
        near_text = " or ".join(f"{dim.name} < {_fmt_edge(e)}" for e in near)
    return UnsupportedQuery(
        f"condition {where} splits the bin {b.label} of {dim.name}",
        detail="dpproxy only knows how many rows fall in each bin, not where inside it",
        hint=f"{dim.name} is binned at {edges}; conditions must select whole bins, "
        f"e.g. {near_text}",
        position=position,
    )


def _fmt_edge(e: float) -> str:
    return str(int(e)) if float(e).is_integer() else repr(e)


def _categorical_rule(
    dim: CategoricalDimension,
    op: type[exp.Expr],
    value: Number | str,
    where: str,
    position: int | None,
) -> BinRule:
    if dim.numeric:
        c: Number | str = _as_number(dim, value, where, position)
    elif isinstance(value, str):
        c = value
    else:
        raise DatatypeMismatch(
            f"{dim.name} holds text; compare it with a quoted string, not {where.split(' ', 2)[2]}",
            position=position,
        )
    if op not in (exp.EQ, exp.NEQ) and not dim.numeric:
        raise UnsupportedQuery(
            f"ordering comparison on the text dimension {dim.name}: {where}",
            detail="the order of strings depends on the database collation",
            hint=f"use = , <> or IN with the declared values of {dim.name}",
            position=position,
        )
    compare = _OPS[op]
    declared = _is_declared(dim, c)

    def rule(b: Bin) -> bool | None:
        if b.kind is BinKind.NULL:
            return None
        if b.kind is BinKind.VALUE:
            v = Fraction(b.value) if dim.numeric else b.value  # type: ignore[arg-type]
            return bool(compare(v, c))
        # OTHER: every undeclared value; decided only by = / <> with a declared value
        if op in (exp.EQ, exp.NEQ) and declared:
            return op is exp.NEQ
        raise _undeclared(dim, where, c, op, position)

    return rule


def _is_declared(dim: CategoricalDimension, value: Number | str) -> bool:
    """Whether ``value`` (a Fraction for a numeric dimension) is one of ``dim``'s values."""
    return value in {Fraction(v) if dim.numeric else v for v in dim.values}


def _undeclared(
    dim: CategoricalDimension, where: str, c: Number | str, op: type[exp.Expr], position: int | None
) -> UnsupportedQuery:
    listed = ", ".join(repr(v) for v in dim.values)
    if op in (exp.EQ, exp.NEQ):
        return UnsupportedQuery(
            f"{c if isinstance(c, str) else _fmt_edge(float(c))!r} "
            f"is not a declared value of {dim.name}",
            detail=f"{dim.name} declares: {listed}; other values share one bin",
            hint=f"compare {dim.name} with declared values only",
            position=position,
        )
    return UnsupportedQuery(
        f"condition {where} is undetermined for values of {dim.name} outside its declared list",
        hint=f"use = or IN, or declare {dim.name} 'closed: true' if it only holds: {listed}",
        position=position,
    )
