"""Every error dpproxy can report, each knowing its PostgreSQL SQLSTATE.

Errors are raised deep in pure code (sqlmap, the engine) and rendered once, at the edge, as an
ErrorResponse. Each subclass fixes its ``sqlstate`` as a class attribute, and no two classes
share one, so a SQLSTATE seen by a client names exactly one class here.
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
    "InsufficientPrivilege",
    "UnknownSetting",
    "BudgetExhausted",
    "DomainViolation",
    "NumericValueOutOfRange",
    "ProgramLimitExceeded",
    "ProtocolViolation",
    "InvalidAuthorization",
    "InvalidPassword",
    "UndefinedDatabase",
    "ConnectionFailure",
    "AdminShutdown",
    "QueryCanceled",
    "InFailedTransaction",
    "DuplicatePreparedStatement",
    "DuplicateCursor",
    "UndefinedPreparedStatement",
    "UndefinedCursor",
    "TooManyConnections",
    "error_fields",
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


class InsufficientPrivilege(DpproxyError):
    """The statement would read protected rows other than through a DP aggregate."""

    sqlstate = "42501"  # insufficient_privilege


class UnknownSetting(DpproxyError):
    """SET/SHOW of a ``dp.*`` setting that does not exist."""

    sqlstate = "42704"  # undefined_object


class BudgetExhausted(DpproxyError):
    """Answering would spend more privacy budget than the DBA allows."""

    sqlstate = "53400"  # configuration_limit_exceeded


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
            detail="a dimension declared 'closed: true' or 'nullable: false' "
            f"({', '.join(promised)}) holds other values",
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


class ProtocolViolation(DpproxyError):
    """A client sent bytes that are not a valid frontend message."""

    sqlstate = "08P01"  # protocol_violation


class InvalidAuthorization(DpproxyError):
    """The startup packet names no user, or asks for something dpproxy does not allow."""

    sqlstate = "28000"  # invalid_authorization_specification


class InvalidPassword(DpproxyError):
    """Authentication failed; the same message for an unknown user and a wrong password."""

    sqlstate = "28P01"  # invalid_password


class UndefinedDatabase(DpproxyError):
    """The client asked for a database name dpproxy does not serve."""

    sqlstate = "3D000"  # invalid_catalog_name


class ConnectionFailure(DpproxyError):
    """The PostgreSQL backend could not be reached or broke off the connection."""

    sqlstate = "08006"  # connection_failure


class AdminShutdown(DpproxyError):
    """dpproxy is shutting down and closes the session."""

    sqlstate = "57P01"  # admin_shutdown


class QueryCanceled(DpproxyError):
    """A CancelRequest, or the planning time limit, stopped the statement."""

    sqlstate = "57014"  # query_canceled


class InFailedTransaction(DpproxyError):
    """The transaction failed earlier; only ROLLBACK (or COMMIT) is accepted until it ends."""

    sqlstate = "25P02"  # in_failed_sql_transaction


class DuplicatePreparedStatement(DpproxyError):
    """Parse names a prepared statement that already exists."""

    sqlstate = "42P05"  # duplicate_prepared_statement


class DuplicateCursor(DpproxyError):
    """Bind names a portal that already exists."""

    sqlstate = "42P03"  # duplicate_cursor


class UndefinedPreparedStatement(DpproxyError):
    """Bind or Describe names a prepared statement that does not exist."""

    sqlstate = "26000"  # invalid_sql_statement_name


class UndefinedCursor(DpproxyError):
    """Execute or Describe names a portal that does not exist."""

    sqlstate = "34000"  # invalid_cursor_name


class TooManyConnections(DpproxyError):
    """dpproxy already serves as many sessions as it is configured for."""

    sqlstate = "53300"  # too_many_connections


def error_fields(error: DpproxyError, severity: str = "ERROR") -> dict[str, str]:
    """Render an error as PostgreSQL ErrorResponse/NoticeResponse fields, keyed by field code.

    >>> fields = error_fields(SqlSyntaxError("bad", position=4))
    >>> fields["C"], fields["P"], fields["S"]
    ('42601', '5', 'ERROR')
    """
    fields = {"S": severity, "V": severity, "C": error.sqlstate, "M": error.message}
    if error.detail:
        fields["D"] = error.detail
    if error.hint:
        fields["H"] = error.hint
    if error.position is not None:
        fields["P"] = str(error.position + 1)
    return fields
