"""``$n`` parameters of a DP query: their types, and their values bound in as literals.

A DP query prepared with placeholders (``... WHERE age >= $1``) is translated only at Bind, once
the values are known: each value replaces its placeholder as a constant, so the translator sees
exactly the query it would have seen with the constant written in. A placeholder compared with a
dimension takes that dimension's type (bigint for integer dimensions, double precision for other
numeric ones, text for text ones), as PostgreSQL infers an unknown parameter's type from context.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from decimal import Decimal

from sqlglot import exp

from proxy.errors import InvalidParameterValue, ProtocolViolation
from proxy.wire.types import Oid, Value, decode_value
from sqlmap.cube import CategoricalDimension, Cube, NumericDimension

__all__ = ["placeholders", "parameter_types", "bind"]

_INT2 = 21
_UNKNOWN = 705
# Types whose text format is just the string (character types, name, unknown).
_STRING_TYPES = frozenset({0, _UNKNOWN, 18, 19, 25, 1042, 1043})


def placeholders(tree: exp.Expr) -> list[exp.Parameter]:
    """The ``$n`` nodes of a parsed statement, in tree order."""
    return [node for node in tree.walk() if isinstance(node, exp.Parameter)]


def _number(node: exp.Parameter) -> int:
    inner = node.this
    text = inner.name if isinstance(inner, exp.Expr) else str(inner)
    if not text.isdigit() or int(text) < 1:
        raise ProtocolViolation(f"invalid parameter reference ${text}")
    return int(text)


def _context_type(node: exp.Parameter, cube: Cube) -> int | None:
    """The type a placeholder takes from the dimension it is compared with, if any."""
    parent = node.parent
    column: exp.Expr | None = None
    if isinstance(parent, (exp.In, exp.Between)):
        column = parent.this
    elif isinstance(parent, exp.Binary):
        column = parent.right if parent.left is node else parent.left
    if not isinstance(column, exp.Column):
        return None
    dim = cube.dimension(column.name.lower()) or cube.dimension(column.name)
    if isinstance(dim, NumericDimension):
        return int(Oid.INT8 if dim.integer else Oid.FLOAT8)
    if isinstance(dim, CategoricalDimension):
        return int(Oid.FLOAT8 if dim.numeric else Oid.TEXT)
    return None


def parameter_types(tree: exp.Expr, cube: Cube, declared: Sequence[int]) -> tuple[int, ...]:
    """The type OID of each parameter ``$1..$n``: declared in Parse, else inferred, else text.

    >>> from sqlmap.translate import Translator
    >>> from sqlmap.cube import cube_from_config
    >>> cube = cube_from_config("t", {"dimensions": {"age": {"bins": [0, 10], "integer": True},
    ...     "sex": {"values": ["M", "F"]}}}, "t", 1.0)
    >>> tree = Translator.parse("SELECT COUNT(*) FROM t WHERE age >= $1 AND sex IN ($2)")
    >>> parameter_types(tree, cube, [])
    (20, 25)
    """
    nodes = placeholders(tree)
    count = max([_number(n) for n in nodes] + [len(declared)], default=0)
    types = [declared[i] if i < len(declared) else 0 for i in range(count)]
    for node in nodes:
        index = _number(node) - 1
        if types[index] == 0:
            types[index] = _context_type(node, cube) or 0
    return tuple(int(t or Oid.TEXT) for t in types)


def _decode(data: bytes, oid: int, format_code: int) -> Value:
    if oid == _INT2:  # int2 is not a DP result type, but clients send small integers as int2
        if format_code == 1:
            if len(data) != 2:
                raise InvalidParameterValue("incorrect binary data format in bind parameter")
            return int(struct.unpack("!h", data)[0])
        oid = Oid.INT8
    elif oid in _STRING_TYPES:
        oid = Oid.TEXT
    value = decode_value(data, oid, format_code)
    assert value is not None
    return value


def _literal(value: Value | None, number: int) -> exp.Expr:
    if value is None:
        return exp.Null()
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, (float, Decimal)) and not math.isfinite(value):
        # no bin holds NaN or Infinity, and no weight may be one
        raise InvalidParameterValue(
            f"parameter ${number} is {value}: NaN and Infinity are not allowed in DP queries"
        )
    if isinstance(value, (int, float, Decimal)):
        return exp.Literal.number(str(value))
    return exp.Literal.string(value)


def bind(
    tree: exp.Expr,
    types: Sequence[int],
    values: Sequence[bytes | None],
    formats: Sequence[int],
) -> exp.Expr:
    """A copy of ``tree`` with every ``$n`` replaced by its value as a constant.

    Args:
        tree: the parsed DP query.
        types: each parameter's type OID (from `parameter_types`).
        values: the Bind message's values (None is NULL).
        formats: each value's format code (0 text, 1 binary).

    Raises:
        ProtocolViolation: the number of values differs from the number of parameters.
        InvalidParameterValue: a value is not valid for its type.

    >>> from sqlmap.translate import Translator
    >>> tree = Translator.parse("SELECT COUNT(*) FROM t WHERE age >= $1 AND sex = $2")
    >>> bind(tree, [20, 25], [b"25", b"M"], [0, 0]).sql()
    "SELECT COUNT(*) FROM t WHERE age >= 25 AND sex = 'M'"
    """
    if len(values) != len(types):
        raise ProtocolViolation(
            f"bind message supplies {len(values)} parameters, "
            f"but prepared statement requires {len(types)}"
        )
    decoded = [
        None if v is None else _decode(v, types[i], formats[i]) for i, v in enumerate(values)
    ]

    def replace(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Parameter):
            number = _number(node)
            return _literal(decoded[number - 1], number)
        return node

    return tree.copy().transform(replace)
