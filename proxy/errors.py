"""Every error dpproxy can report, each knowing its PostgreSQL SQLSTATE.

Errors are raised deep in pure code (sqlmap, the engine) and rendered once, at the edge, as an
ErrorResponse. The base class and sqlmap's errors live in :mod:`sqlmap.errors` (sqlmap must not
import the server) and are re-exported here; the server's own errors follow. Each subclass fixes
its ``sqlstate`` as a class attribute, and no two classes share one, so a SQLSTATE seen by a
client names exactly one class.
"""

from __future__ import annotations

from sqlmap.errors import (
    ConfigError,
    DatatypeMismatch,
    DomainViolation,
    DpproxyError,
    InvalidParameterValue,
    NumericValueOutOfRange,
    ProgramLimitExceeded,
    SqlSyntaxError,
    UndefinedColumn,
    UndefinedTable,
    UnsupportedQuery,
)

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


class InsufficientPrivilege(DpproxyError):
    """The statement would read protected rows other than through a DP aggregate."""

    sqlstate = "42501"  # insufficient_privilege


class UnknownSetting(DpproxyError):
    """SET/SHOW of a ``dp.*`` setting that does not exist."""

    sqlstate = "42704"  # undefined_object


class BudgetExhausted(DpproxyError):
    """Answering would spend more privacy budget than the DBA allows."""

    sqlstate = "53400"  # configuration_limit_exceeded


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
