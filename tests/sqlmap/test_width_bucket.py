"""`width_bucket_case` is PostgreSQL's width_bucket, value by value."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from sqlglot import exp, parse_one

from sqlmap.cellwise import constant, width_bucket_case
from sqlmap.errors import InvalidParameterValue, UnsupportedQuery


def postgres(x: float, low: float, high: float, count: int) -> int:
    """PostgreSQL's width_bucket_float8, as its documentation states it."""
    if low < high:
        if x < low:
            return 0
        if x >= high:
            return count + 1
        return math.floor((x - low) / (high - low) * count) + 1
    if x > low:
        return 0
    if x <= high:
        return count + 1
    return math.floor((low - x) / (low - high) * count) + 1


def evaluate(case: exp.Case, x: Fraction) -> object:
    ops = {exp.LT: lambda a, b: a < b, exp.GT: lambda a, b: a > b}
    for branch in case.args["ifs"]:
        condition = branch.this
        if isinstance(condition, exp.Is):
            continue  # x is not NULL here
        if ops[type(condition)](x, constant(condition.expression)):
            return constant(branch.args["true"])
    return constant(case.args["default"])


@pytest.mark.parametrize(
    ("low", "high", "count"), [(25, 65, 4), (0, 100, 3), (65, 25, 4), (-10, 10, 7), (0, 1, 10)]
)
def test_the_case_gives_postgresql_s_bucket(low: int, high: int, count: int) -> None:
    case = width_bucket_case(parse_one(f"width_bucket(x, {low}, {high}, {count})"))
    for step in range(-300, 1300):
        x = Fraction(step, 10)
        assert evaluate(case, x) == postgres(float(x), low, high, count), x


@pytest.mark.parametrize(
    ("sql", "error"),
    [
        ("width_bucket(x, 1, 1, 3)", InvalidParameterValue),
        ("width_bucket(x, 0, 10, 0)", InvalidParameterValue),
        ("width_bucket(x, 0, 10, 2.5)", InvalidParameterValue),
        ("width_bucket(x, 0, 10, 100000)", UnsupportedQuery),
    ],
)
def test_postgresql_s_errors(sql: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        width_bucket_case(parse_one(sql))  # type: ignore[arg-type]
