"""``DP_PROBABILITY(<aggregate> > c)``: which aggregate, and which comparison of its true value.

The call selects the posterior probability that the aggregate's true value satisfies the
comparison (``>``, ``>=``, ``<``, ``<=``, ``BETWEEN L AND U``; the constant may stand on either
side), computed from the aggregate's answer at no extra cost (docs/sql.md). This module only
reads the call; the answer's error law gives the number.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from sqlglot import exp

from sqlmap.cellwise import as_float, constant, position_of
from sqlmap.errors import DatatypeMismatch, UnsupportedQuery

__all__ = ["PROBABILITY_FUNCTION", "Comparison", "probability_call"]

#: The pseudo-function's upper-case name.
PROBABILITY_FUNCTION = "DP_PROBABILITY"

Operator = Literal[">", ">=", "<", "<=", "between"]

_OPERATORS: dict[type[exp.Expr], tuple[Operator, Operator]] = {
    # (the operator as written, the operator with the sides swapped)
    exp.GT: (">", "<"),
    exp.GTE: (">=", "<="),
    exp.LT: ("<", ">"),
    exp.LTE: ("<=", ">="),
}

_FORMS = "DP_PROBABILITY(<aggregate> > c), also >=, <, <=, or BETWEEN L AND U"


@dataclass(frozen=True, slots=True)
class Comparison:
    """``<true value> <operator> value`` (``between``: ``value <= . <= upper``)."""

    operator: Operator
    value: float
    upper: float | None = None

    def arguments(self) -> tuple[Operator, float, float | None]:
        """The arguments of :func:`proxy.engine.posterior.comparison`."""
        return self.operator, self.value, self.upper


def probability_call(call: exp.Anonymous) -> tuple[exp.Expr, Comparison]:
    """The aggregate expression a DP_PROBABILITY call compares, and the comparison.

    >>> from sqlglot import parse_one
    >>> call = parse_one("SELECT DP_PROBABILITY(10 <= COUNT(*)) FROM t").expressions[0]
    >>> aggregate, comparison = probability_call(call)
    >>> aggregate.sql(), comparison
    ('COUNT(*)', Comparison(operator='>=', value=10.0, upper=None))
    """
    args = call.expressions
    if len(args) != 1:
        raise UnsupportedQuery(
            f"{PROBABILITY_FUNCTION} takes one comparison", hint=_FORMS, position=position_of(call)
        )
    test = _unwrapped(args[0])
    if isinstance(test, exp.Between):
        if test.args.get("symmetric"):
            raise UnsupportedQuery(
                "BETWEEN SYMMETRIC is not supported in DP_PROBABILITY",
                hint="write the smaller bound first",
                position=position_of(test),
            )
        low, high = _number(test.args["low"]), _number(test.args["high"])
        return _unwrapped(test.this), Comparison("between", low, high)
    operators = _OPERATORS.get(type(test))
    if operators is None or not isinstance(test, exp.Binary):
        raise UnsupportedQuery(
            f"{PROBABILITY_FUNCTION}({test.sql('postgres')[:60]}) is not a comparison it takes",
            hint=_FORMS,
            position=position_of(test),
        )
    left, right = test.this, test.expression
    if _has_aggregate(left) == _has_aggregate(right):
        raise UnsupportedQuery(
            f"{PROBABILITY_FUNCTION} compares one aggregate expression with a constant",
            hint=_FORMS,
            position=position_of(test),
        )
    if _has_aggregate(left):
        return _unwrapped(left), Comparison(operators[0], _number(right))
    return _unwrapped(right), Comparison(operators[1], _number(left))


def _number(node: exp.Expr) -> float:
    value = constant(node)
    if not isinstance(value, Fraction):
        raise DatatypeMismatch(
            f"DP_PROBABILITY compares with a number, not {node.sql('postgres')[:60]}",
            position=position_of(node),
        )
    return as_float(value, node)


def _unwrapped(node: exp.Expr) -> exp.Expr:
    """Without the parentheses around it: ``(COUNT(*))`` names the select list's ``COUNT(*)``."""
    while isinstance(node, exp.Paren):
        node = node.this
    return node


def _has_aggregate(node: exp.Expr) -> bool:
    return any(isinstance(n, exp.AggFunc) for n in node.walk())
