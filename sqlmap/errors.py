"""The errors sqlmap raises, each knowing its PostgreSQL SQLSTATE: the bottom of the stack.

sqlmap is pure (SQL text and a cube in, query vectors out) and must not import the server, so
the base class and the errors of translation and configuration live here; ``proxy.errors``
re-exports them and adds the server's own (authentication, protocol, budget, ...). Every class
fixes its ``sqlstate`` as a class attribute, and no two classes share one, so a SQLSTATE seen by
a client names exactly one class. The server renders them once, at the edge, as ErrorResponse.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

__all__ = [
    "DpproxyError",
    "ConfigError",
    "SqlSyntaxError",
    "UnsupportedQuery",
    "UndefinedTable",
    "UndefinedColumn",
    "DatatypeMismatch",
    "InvalidParameterValue",
    "DomainViolation",
    "NumericValueOutOfRange",
    "ProgramLimitExceeded",
]


class DpproxyError(Exception):
    """Base of all errors that reach an analyst or a DBA.

    Args:
        message: the primary, one-line message (PostgreSQL's ``M`` field).
        detail: optional secondary text (``D``).
        hint: optional advice on what to do instead (``H``).
        position: optional 0-based character offset into the query text (rendered 1-based
            in the ``P`` field so psql draws its caret).
    """

    sqlstate: ClassVar[str] = "XX000"
    _registry: ClassVar[dict[str, type[DpproxyError]]] = {}

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        taken = DpproxyError._registry.get(cls.sqlstate)
        if taken is not None:
            raise TypeError(f"{cls.__name__} reuses SQLSTATE {cls.sqlstate} of {taken.__name__}")
        DpproxyError._registry[cls.sqlstate] = cls

    def __init__(
        self,
        message: str,
        *,
        detail: str | None = None,
        hint: str | None = None,
        position: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail
        self.hint = hint
        self.position = position

    def __str__(self) -> str:
        parts = [self.message]
        if self.detail:
            parts.append(f"DETAIL: {self.detail}")
        if self.hint:
            parts.append(f"HINT: {self.hint}")
        return "\n".join(parts)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.sqlstate}: {self.message!r})"


class ConfigError(DpproxyError):
    """config.yaml is malformed; the message names the file, key and reason."""

    sqlstate = "F0000"  # config_file_error


class SqlSyntaxError(DpproxyError):
    """The SQL text (or its accuracy clause) does not parse."""

    sqlstate = "42601"  # syntax_error


class UnsupportedQuery(DpproxyError):
    """The SQL parses but is not a query dpproxy can answer under differential privacy."""

    sqlstate = "0A000"  # feature_not_supported


class UndefinedTable(DpproxyError):
    """The query names a table that is not declared as protected."""

    sqlstate = "42P01"  # undefined_table


class UndefinedColumn(DpproxyError):
    """The query names a column that is not a dimension of the protected table."""

    sqlstate = "42703"  # undefined_column


class DatatypeMismatch(DpproxyError):
    """A literal cannot be compared with a dimension (e.g. a string against numeric bins)."""

    sqlstate = "42804"  # datatype_mismatch


class InvalidParameterValue(DpproxyError):
    """A value is out of range, e.g. accuracy <= 0 or confidence outside (0, 1)."""

    sqlstate = "22023"  # invalid_parameter_value


class DomainViolation(DpproxyError):
    """The backend holds a value the cube declares impossible (a closed or non-null dimension).

    The message names the table and what the DBA must fix, never how many rows break the
    promise: that count would be an exact answer about protected rows, free and repeatable.
    ``rows`` is for the DBA's log only.

    >>> e = DomainViolation("public.t", ("a", "b"), rows=271)
    >>> any(c.isdigit() for c in str(e)), e.rows
    (False, 271)
    """

    sqlstate = "23514"  # check_violation

    def __init__(self, table: str, promised: Sequence[str], rows: int) -> None:
        super().__init__(
            f"rows of {table} lie outside the domain that config.yaml declares",
            detail="a dimension declared 'closed: true' or 'nullable: false', or a measure "
            f"declared 'nulls: never' ({', '.join(promised)}), holds other values",
            hint="the DBA must fix the data or the dimension's declaration "
            "(dpproxy's log has the details)",
        )
        self.table = table
        self.rows = rows


class NumericValueOutOfRange(DpproxyError):
    """A constant or weight of the query does not fit a double precision number."""

    sqlstate = "22003"  # numeric_value_out_of_range


class ProgramLimitExceeded(DpproxyError):
    """A statement is larger than a configured limit (``limits`` in config.yaml)."""

    sqlstate = "54000"  # program_limit_exceeded
